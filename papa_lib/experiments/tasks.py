"""Downstream tasks of PAPA: task specifications and data loading (metrics: :mod:`papa_lib.experiments.metrics`).

PAPA (Hassid et al., 2022) probes pretrained encoders on six English tasks
(Sec. 4.1): four GLUE text-classification tasks -- CoLA, SST-2, MRPC and MNLI
-- and two CoNLL-2003 structured-prediction tasks -- named entity recognition
(NER) and part-of-speech tagging (POS).  Results are reported on the
validation split of each task; for MNLI this is the *mismatched* validation
split (Sec. 4.1, footnote 11).  The metrics are (footnote 10): accuracy for
SST-2 and MNLI, F1 for MRPC, NER and POS, and Matthews correlation (MCC) for
CoLA.  The probing-classifier hyperparameters are those of App. B, Table 3,
including the MLM row used for the language-modelling probe on WikiText-103
(Sec. 5.5, Fig. 6a).

Constant attention matrices are built from the task's *unlabelled* training
set (Sec. 3.1, Sec. 4.1); :func:`unlabeled_texts` returns that split.

Data come from one of two places:

* the Hugging Face hub (``data_dir=None``), through
  :func:`datasets.load_dataset` -- ``nyu-mll/glue`` for the GLUE tasks,
  ``eriktks/conll2003`` for CoNLL-2003 and ``Salesforce/wikitext`` for
  WikiText.  ``eriktks/conll2003`` is the canonical ``conll2003`` dataset
  moved under its author's name.  Its main branch still holds a loading script,
  which ``datasets>=4`` refuses to run, so the loader falls back to the
  hub's automatic parquet export (``revision="refs/convert/parquet"``) of the
  same data when that happens;
* a local folder laid out like ``/work/shared/data`` (``data_dir=...``)
  holding the standard distribution files::

      glue/SST-2/{train,dev}.tsv          header "sentence<TAB>label"
      glue/CoLA/{train,dev}.tsv           no header: source, label, mark, sentence
      glue/MRPC/{train,dev}.tsv           header "Quality #1 ID #2 ID #1 String #2 String"
                                          (or GLUE style sentence1/sentence2/label)
      glue/MNLI/{train,dev_mismatched}.tsv  GLUE layout (sentence1, sentence2, gold_label)
      glue/MNLI-sample/{train,dev}.tsv    header "index sentence1 sentence2 gold_label"
      conll2003/{eng.train,eng.testa}     "word POS chunk NER", IOB1 or IOB2 tags
      wikitext-2/wiki.{valid,test}.tokens

  A small sample of that layout ships with the package (``papa_lib/samples``,
  :mod:`papa_lib.experiments.sample_data`); examples read from it name it as
  ``papa_lib/samples/<file> (packaged sample)`` in their ``source``.

Label ids follow the hub's ``ClassLabel`` order, so a model trained on local
files and one trained on hub data agree on what each id means.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Sequence

from ..core.registry import Registry
from . import sample_data

__all__ = [
    "TaskSpec",
    "TASKS",
    "MLM_HPARAMS",
    "NER_TAG_NAMES",
    "POS_TAG_NAMES",
    "SentenceExamples",
    "TokenExamples",
    "HubUnavailableError",
    "load_task",
    "unlabeled_texts",
    "load_wikitext",
    "convert_iob1_to_iob2",
]

# --------------------------------------------------------------------------------------
# Task specifications (Sec. 4.1, App. B Table 3)
# --------------------------------------------------------------------------------------

#: NER tag inventory of the hub's ``eriktks/conll2003`` (IOB2), in its id order.
NER_TAG_NAMES: tuple[str, ...] = (
    "O", "B-PER", "I-PER", "B-ORG", "I-ORG", "B-LOC", "I-LOC", "B-MISC", "I-MISC",
)

#: The 47 Penn-Treebank-style POS tags of CoNLL-2003, in the hub's id order.
POS_TAG_NAMES: tuple[str, ...] = (
    '"', "''", "#", "$", "(", ")", ",", ".", ":", "``", "CC", "CD", "DT", "EX", "FW",
    "IN", "JJ", "JJR", "JJS", "LS", "MD", "NN", "NNP", "NNPS", "NNS", "NN|SYM", "PDT",
    "POS", "PRP", "PRP$", "RB", "RBR", "RBS", "RP", "SYM", "TO", "UH", "VB", "VBD",
    "VBG", "VBN", "VBP", "VBZ", "WDT", "WP", "WP$", "WRB",
)

_NER_ENTITY_TYPES = frozenset(tag[2:] for tag in NER_TAG_NAMES if tag != "O")


@dataclass(frozen=True)
class TaskSpec:
    """Everything PAPA needs to know about one downstream task.

    Attributes:
        name: short task name (``'cola'``, ``'sst2'``, ``'mrpc'``, ``'mnli'``, ``'ner'``, ``'pos'``).
        kind: ``'sentence'`` (one label per example) or ``'token'`` (one label per word).
        is_pair: whether an example is a pair of texts (MRPC, MNLI).
        metric: the metric the paper reports (footnote 10): ``'matthews_corrcoef'`` (CoLA),
            ``'accuracy'`` (SST-2, MNLI), ``'f1'`` (MRPC, F1 of the positive class
            'equivalent') or ``'seqeval_f1'`` (NER entity-level F1; POS: seqeval's F1 over the
            POS tags, as the authors' code reports it; see :mod:`papa_lib.experiments.metrics`).
        label_names: class (or tag) names; the index of a name is its label id.
        learning_rate, batch_size, epochs, max_length: probing-classifier hyperparameters
            (App. B, Table 3).
        validation_split: human-readable description of the split results are reported on.
        hub_dataset, hub_config, hub_validation_split: where :func:`load_task` finds the
            data on the Hugging Face hub.
        loader: for a task of your own (:mod:`papa_lib.experiments.custom`), ``loader(split)``
            returns its examples and :func:`load_task` calls it instead of reading the hub or
            ``data_dir``.
        provenance: for such a task, what its records must name (files, columns, delimiter).
    """

    name: str
    kind: str
    is_pair: bool
    metric: str
    label_names: tuple[str, ...]
    learning_rate: float
    batch_size: int
    epochs: int
    max_length: int
    validation_split: str
    hub_dataset: str = ""
    hub_config: str | None = None
    hub_validation_split: str = "validation"
    loader: Callable[[str], "SentenceExamples | TokenExamples"] | None = field(default=None, compare=False, repr=False)
    provenance: dict | None = field(default=None, compare=False)

    @property
    def num_labels(self) -> int:
        """Number of classes (sentence tasks) or tags (token tasks)."""
        return len(self.label_names)


TASKS: Registry = Registry("task", {
    "cola": TaskSpec(
        name="cola", kind="sentence", is_pair=False, metric="matthews_corrcoef",
        label_names=("unacceptable", "acceptable"),
        learning_rate=2e-5, batch_size=16, epochs=15, max_length=64,
        validation_split="GLUE validation", hub_dataset="nyu-mll/glue", hub_config="cola",
    ),
    "sst2": TaskSpec(
        name="sst2", kind="sentence", is_pair=False, metric="accuracy",
        label_names=("negative", "positive"),
        learning_rate=1e-4, batch_size=32, epochs=4, max_length=64,
        validation_split="GLUE validation", hub_dataset="nyu-mll/glue", hub_config="sst2",
    ),
    "mrpc": TaskSpec(
        name="mrpc", kind="sentence", is_pair=True, metric="f1",
        label_names=("not_equivalent", "equivalent"),
        learning_rate=2e-5, batch_size=16, epochs=15, max_length=128,
        validation_split="GLUE validation", hub_dataset="nyu-mll/glue", hub_config="mrpc",
    ),
    "mnli": TaskSpec(
        name="mnli", kind="sentence", is_pair=True, metric="accuracy",
        label_names=("entailment", "neutral", "contradiction"),
        learning_rate=2e-4, batch_size=8, epochs=4, max_length=256,
        validation_split="MNLI validation_mismatched", hub_dataset="nyu-mll/glue",
        hub_config="mnli", hub_validation_split="validation_mismatched",
    ),
    "ner": TaskSpec(
        name="ner", kind="token", is_pair=False, metric="seqeval_f1",
        label_names=NER_TAG_NAMES,
        learning_rate=1e-4, batch_size=8, epochs=4, max_length=128,
        validation_split="CoNLL-2003 validation (eng.testa)", hub_dataset="eriktks/conll2003",
    ),
    "pos": TaskSpec(
        name="pos", kind="token", is_pair=False, metric="seqeval_f1",
        label_names=POS_TAG_NAMES,
        learning_rate=5e-4, batch_size=8, epochs=4, max_length=128,
        validation_split="CoNLL-2003 validation (eng.testa)", hub_dataset="eriktks/conll2003",
    ),
})

#: Hyperparameters of the masked-language-modelling probe (App. B, Table 3, "MLM" row).
MLM_HPARAMS: dict[str, float | int] = dict(learning_rate=5e-4, batch_size=8, epochs=2, max_length=128)

_SPLITS = ("train", "validation")




def _task_spec(name: str) -> TaskSpec:
    try:
        return TASKS[name]
    except (KeyError, TypeError):
        raise ValueError(f"unknown task {name!r}; expected one of {sorted(TASKS)}") from None


# --------------------------------------------------------------------------------------
# Example containers
# --------------------------------------------------------------------------------------


@dataclass
class SentenceExamples:
    """Sentence(-pair) classification data.

    Attributes:
        texts: first (or only) text of each example.
        pairs: second text of each example for pair tasks (MRPC, MNLI), else ``None``.
        labels: label id of each example (index into the task's ``label_names``).
        source: where the data came from, e.g. ``'/data/glue/SST-2/train.tsv'`` or
            ``'hub:nyu-mll/glue/sst2:train'``, plus a note when subsampled.
    """

    texts: list[str]
    pairs: list[str] | None
    labels: list[int]
    source: str

    def __len__(self) -> int:
        return len(self.texts)


@dataclass
class TokenExamples:
    """Token classification (NER / POS) data: one list of words and tag ids per sentence.

    Attributes:
        words: the words of each sentence.
        tags: tag id of each word (index into ``tag_names``).
        tag_names: the tag inventory (``NER_TAG_NAMES`` or ``POS_TAG_NAMES``).
        source: where the data came from (file path or ``'hub:...'``), plus a note when subsampled.
    """

    words: list[list[str]]
    tags: list[list[int]]
    tag_names: tuple[str, ...]
    source: str

    def __len__(self) -> int:
        return len(self.words)


class HubUnavailableError(RuntimeError):
    """The Hugging Face hub could not provide a dataset (typically: no network)."""


# --------------------------------------------------------------------------------------
# Public loading API
# --------------------------------------------------------------------------------------


def load_task(
    name: str,
    split: str,
    data_dir: str | Path | None = None,
    limit: int | None = None,
    seed: int = 0,
) -> SentenceExamples | TokenExamples:
    """Load one split of a PAPA downstream task.

    Args:
        name: task name, a key of :data:`TASKS`.
        split: ``'train'`` or ``'validation'``.  ``'validation'`` is the split the paper
            reports: GLUE validation, MNLI *validation_mismatched*, CoNLL-2003 ``eng.testa``.
            A local ``glue/MNLI-sample`` folder has no mismatched split; its ``dev.tsv`` is
            used instead and ``source`` says so.
        data_dir: ``None`` to download from the Hugging Face hub, or a folder laid out like
            ``/work/shared/data`` (see the module docstring).
        limit: keep at most this many examples, drawn without replacement.  The draw is a
            seeded shuffle of the example indices of which the first ``limit`` are kept, so
            it is deterministic given ``seed`` and a smaller limit gives a subset of a larger
            one.  The kept examples stay in file order.
        seed: seed of the subsample.

    Returns:
        :class:`SentenceExamples` for GLUE tasks, :class:`TokenExamples` for NER and POS.

    Raises:
        ValueError: unknown task/split, bad ``limit``, or a malformed data row (the message
            names the file and 1-based line number).
        FileNotFoundError: the expected file is missing under ``data_dir``.
        HubUnavailableError: the hub could not be reached (pass ``data_dir`` instead).

    A task with its own ``loader`` (a registered custom task) ignores ``data_dir``.  An empty
    split raises ``ValueError`` naming its file, before anything is computed on it.
    """
    spec = _task_spec(name)
    if split not in _SPLITS:
        raise ValueError(f"unknown split {split!r} for task {name!r}; expected one of {list(_SPLITS)}")
    _check_limit(limit)
    if spec.loader is not None:
        examples = spec.loader(split)
    elif data_dir is None:
        examples = _load_from_hub(spec, split)
    else:
        examples = _load_local(spec, split, Path(data_dir))
    if len(examples) == 0:
        what = "training" if split == "train" else "validation"
        raise ValueError(f"{examples.source}: the {what} set of {name} is empty: the file has no examples")
    return _subsample(examples, limit, seed)


def unlabeled_texts(
    name: str,
    data_dir: str | Path | None = None,
    limit: int | None = None,
    seed: int = 0,
) -> SentenceExamples | TokenExamples:
    """The task's training split, for building PAPA's constant attention matrices.

    PAPA averages attention matrices over the task's training set *without using its
    labels* (Sec. 3.1, Sec. 4.1).  This is a thin alias of
    ``load_task(name, 'train', data_dir, limit, seed)``; the returned labels/tags are
    present only because the files contain them, and callers building constant matrices
    must ignore them.
    """
    return load_task(name, "train", data_dir=data_dir, limit=limit, seed=seed)


_WIKITEXT_FILES = {"train": "wiki.train.tokens", "validation": "wiki.valid.tokens", "test": "wiki.test.tokens"}
_WIKITEXT_NAMES = ("wikitext-103", "wikitext-2")
_HEADING_RE = re.compile(r"^(= )+.*( =)+$")


def load_wikitext(
    split: str = "validation",
    data_dir: str | Path | None = None,
    name: str = "wikitext-103",
) -> list[str]:
    """Article text lines of WikiText, the corpus of the MLM probe (Sec. 5.5, Fig. 6a).

    Section headings (``' = Title = '``, ``' = = Section = = '``) and blank lines are
    dropped; the remaining lines are returned stripped of surrounding whitespace.

    Args:
        split: ``'validation'``, ``'test'`` or ``'train'``.
        data_dir: ``None`` loads ``Salesforce/wikitext`` config ``'<name>-raw-v1'`` from the
            hub.  Otherwise reads ``data_dir/<name>/wiki.{train,valid,test}.tokens``; when
            ``data_dir/wikitext-103`` does not exist, ``data_dir/wikitext-2`` is read instead
            (WikiText-103 is usually not available offline; the validation/test articles of
            the two corpora differ, so treat local results as a stand-in).  Local
            ``.tokens`` files are the tokenised variant (rare words as ``<unk>``), the hub
            config is the raw one.
        name: ``'wikitext-103'`` (the paper's corpus) or ``'wikitext-2'``.
    """
    if split not in _WIKITEXT_FILES:
        raise ValueError(f"unknown WikiText split {split!r}; expected one of {list(_WIKITEXT_FILES)}")
    if name not in _WIKITEXT_NAMES:
        raise ValueError(f"unknown WikiText corpus {name!r}; expected one of {list(_WIKITEXT_NAMES)}")
    if data_dir is None:
        dataset = _hub_load_dataset("Salesforce/wikitext", f"{name}-raw-v1", split)
        raw_lines: Iterable[str] = dataset["text"]
    else:
        root = Path(data_dir)
        folder = root / name
        if not folder.is_dir() and name == "wikitext-103":
            folder = root / "wikitext-2"
        path = folder / _WIKITEXT_FILES[split]
        if not path.is_file():
            raise FileNotFoundError(
                f"WikiText file not found: {path} (expected {root}/{name}/{_WIKITEXT_FILES[split]}"
                + (" or the wikitext-2 folder" if name == "wikitext-103" else "") + ")"
            )
        raw_lines = (line for _, line in _iter_lines(path))
    lines = []
    for line in raw_lines:
        text = line.strip()
        if text and not _HEADING_RE.match(text):
            lines.append(text)
    return lines


# --------------------------------------------------------------------------------------
# Subsampling
# --------------------------------------------------------------------------------------


def _check_limit(limit: int | None) -> None:
    if limit is None:
        return
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
        raise ValueError(f"limit must be a positive integer or None, got {limit!r}")


def _subsample(examples, limit: int | None, seed: int):
    n = len(examples)
    if limit is None or limit >= n:
        return examples
    order = list(range(n))
    random.Random(seed).shuffle(order)
    keep = sorted(order[:limit])
    note = f" [subsample of {limit}/{n}, seed {seed}]"
    if isinstance(examples, SentenceExamples):
        return SentenceExamples(
            texts=[examples.texts[i] for i in keep],
            pairs=None if examples.pairs is None else [examples.pairs[i] for i in keep],
            labels=[examples.labels[i] for i in keep],
            source=examples.source + note,
        )
    return TokenExamples(
        words=[examples.words[i] for i in keep],
        tags=[examples.tags[i] for i in keep],
        tag_names=examples.tag_names,
        source=examples.source + note,
    )


# --------------------------------------------------------------------------------------
# Local files
# --------------------------------------------------------------------------------------

_GLUE_FOLDERS = {"cola": "CoLA", "sst2": "SST-2", "mrpc": "MRPC"}
_GLUE_FILES = {"train": "train.tsv", "validation": "dev.tsv"}


def _load_local(spec: TaskSpec, split: str, data_dir: Path) -> SentenceExamples | TokenExamples:
    examples = _read_local(spec, split, data_dir)
    prefix = str(data_dir)
    if sample_data.is_sample(data_dir) and examples.source.startswith(prefix):
        # records name the packaged sample, not where it happens to be installed
        relative, space, note = examples.source[len(prefix):].lstrip("/").partition(" ")
        examples.source = sample_data.describe(data_dir / relative) + space + note
    return examples


def _read_local(spec: TaskSpec, split: str, data_dir: Path) -> SentenceExamples | TokenExamples:
    if not data_dir.is_dir():
        raise FileNotFoundError(f"data directory not found: {data_dir}")
    if spec.kind == "token":
        path = data_dir / "conll2003" / ("eng.train" if split == "train" else "eng.testa")
        _require_file(path, spec)
        return _read_conll(path, spec)
    if spec.name == "mnli":
        return _read_mnli_local(data_dir, split, spec)
    path = data_dir / "glue" / _GLUE_FOLDERS[spec.name] / _GLUE_FILES[split]
    _require_file(path, spec)
    if spec.name == "sst2":
        return _read_sst2(path, spec)
    if spec.name == "cola":
        return _read_cola(path, spec)
    return _read_mrpc(path, spec)


def _require_file(path: Path, spec: TaskSpec) -> None:
    if not path.is_file():
        raise FileNotFoundError(f"{spec.name}: data file not found: {path}")


def _iter_lines(path: Path) -> Iterator[tuple[int, str]]:
    """Yield (1-based line number, line without its end-of-line) for a UTF-8 file.

    A leading byte-order mark is dropped; only ``\\n`` ends a line (``\\r`` before it is
    removed), so stray carriage returns or Unicode line separators inside a field do not
    split rows.
    """
    with open(path, encoding="utf-8-sig", newline="\n") as handle:
        for lineno, line in enumerate(handle, start=1):
            yield lineno, line.rstrip("\n").rstrip("\r")


def _iter_tsv_rows(path: Path, has_header: bool) -> Iterator[tuple[int, list[str], list[str] | None]]:
    """Yield (line number, fields, header fields) for each data row of a TSV file.

    Fields are split on tabs only; there is no quoting (GLUE files are written that way).
    Empty lines are skipped.  With a header, every row must have as many fields as it.
    """
    header: list[str] | None = None
    for lineno, line in _iter_lines(path):
        if line == "":
            continue
        fields = line.split("\t")
        if has_header and header is None:
            header = [field.strip() for field in fields]
            continue
        if header is not None and len(fields) != len(header):
            raise ValueError(
                f"{path}:{lineno}: expected {len(header)} tab-separated fields "
                f"(as in the header), found {len(fields)}"
            )
        yield lineno, fields, header
    if has_header and header is None:
        raise ValueError(f"{path}: file is empty (expected a header row)")


def _column(header: list[str], candidates: Sequence[str], path: Path) -> int:
    lowered = [name.lower() for name in header]
    for candidate in candidates:
        if candidate.lower() in lowered:
            return lowered.index(candidate.lower())
    raise ValueError(f"{path}:1: header {header} has none of the columns {list(candidates)}")


def _int_label(text: str, spec: TaskSpec, path: Path, lineno: int) -> int:
    value = text.strip()
    try:
        label = int(value)
    except ValueError:
        raise ValueError(f"{path}:{lineno}: label {text!r} is not an integer") from None
    if not 0 <= label < spec.num_labels:
        raise ValueError(
            f"{path}:{lineno}: label {label} out of range for {spec.name} "
            f"(expected 0..{spec.num_labels - 1})"
        )
    return label


def _read_sst2(path: Path, spec: TaskSpec) -> SentenceExamples:
    texts, labels = [], []
    text_col = label_col = None
    for lineno, fields, header in _iter_tsv_rows(path, has_header=True):
        if text_col is None:
            text_col = _column(header, ["sentence"], path)
            label_col = _column(header, ["label"], path)
        texts.append(fields[text_col])
        labels.append(_int_label(fields[label_col], spec, path, lineno))
    return SentenceExamples(texts=texts, pairs=None, labels=labels, source=str(path))


def _read_cola(path: Path, spec: TaskSpec) -> SentenceExamples:
    texts, labels = [], []
    for lineno, fields, _ in _iter_tsv_rows(path, has_header=False):
        if len(fields) != 4:
            raise ValueError(
                f"{path}:{lineno}: expected 4 tab-separated fields "
                f"(source, label, original mark, sentence), found {len(fields)}"
            )
        labels.append(_int_label(fields[1], spec, path, lineno))
        texts.append(fields[3])
    return SentenceExamples(texts=texts, pairs=None, labels=labels, source=str(path))


def _read_mrpc(path: Path, spec: TaskSpec) -> SentenceExamples:
    texts, pairs, labels = [], [], []
    cols = None
    for lineno, fields, header in _iter_tsv_rows(path, has_header=True):
        if cols is None:
            cols = (
                _column(header, ["#1 String", "sentence1"], path),
                _column(header, ["#2 String", "sentence2"], path),
                _column(header, ["Quality", "label"], path),
            )
        texts.append(fields[cols[0]])
        pairs.append(fields[cols[1]])
        labels.append(_int_label(fields[cols[2]], spec, path, lineno))
    return SentenceExamples(texts=texts, pairs=pairs, labels=labels, source=str(path))


def _read_mnli_local(data_dir: Path, split: str, spec: TaskSpec) -> SentenceExamples:
    full = data_dir / "glue" / "MNLI" / ("train.tsv" if split == "train" else "dev_mismatched.tsv")
    sample = data_dir / "glue" / "MNLI-sample" / _GLUE_FILES[split]
    if full.is_file():
        examples = _read_mnli_tsv(full, spec)
    elif sample.is_file():
        examples = _read_mnli_tsv(sample, spec)
        what = "training data" if split == "train" else "dev data, NOT the mismatched validation split"
        examples.source = f"{sample} (MNLI-sample: a sample of MNLI {what})"
    else:
        raise FileNotFoundError(f"mnli: data file not found: neither {full} nor {sample} exists")
    return examples


def _read_mnli_tsv(path: Path, spec: TaskSpec) -> SentenceExamples:
    texts, pairs, labels = [], [], []
    cols = None
    for lineno, fields, header in _iter_tsv_rows(path, has_header=True):
        if cols is None:
            cols = (
                _column(header, ["sentence1", "premise"], path),
                _column(header, ["sentence2", "hypothesis"], path),
                _column(header, ["gold_label"], path),
            )
        gold = fields[cols[2]].strip()
        if gold not in spec.label_names:
            raise ValueError(
                f"{path}:{lineno}: unknown gold_label {gold!r}; expected one of {list(spec.label_names)}"
            )
        texts.append(fields[cols[0]])
        pairs.append(fields[cols[1]])
        labels.append(spec.label_names.index(gold))
    return SentenceExamples(texts=texts, pairs=pairs, labels=labels, source=str(path))


def _check_ner_tag(tag: str, path: Path, lineno: int) -> None:
    if tag == "O":
        return
    if len(tag) > 2 and tag[:2] in ("B-", "I-") and tag[2:] in _NER_ENTITY_TYPES:
        return
    raise ValueError(
        f"{path}:{lineno}: unknown NER tag {tag!r}; expected O or B-/I- with one of "
        f"{sorted(_NER_ENTITY_TYPES)}"
    )


def _read_conll(path: Path, spec: TaskSpec) -> TokenExamples:
    """Parse a CoNLL-2003 file (``word POS chunk NER`` per line) into sentences.

    Blank lines and ``-DOCSTART-`` lines (wherever they occur) end a sentence.  NER tags
    are converted to IOB2 sentence by sentence (IOB2 input is unchanged by the conversion).
    """
    pos_ids = {tag: i for i, tag in enumerate(POS_TAG_NAMES)}
    ner_ids = {tag: i for i, tag in enumerate(NER_TAG_NAMES)}
    words: list[list[str]] = []
    tags: list[list[int]] = []
    cur_words: list[str] = []
    cur_pos: list[int] = []
    cur_ner: list[str] = []

    def finish_sentence() -> None:
        if cur_words:
            words.append(list(cur_words))
            if spec.name == "pos":
                tags.append(list(cur_pos))
            else:
                tags.append([ner_ids[tag] for tag in convert_iob1_to_iob2(cur_ner)])
        cur_words.clear()
        cur_pos.clear()
        cur_ner.clear()

    for lineno, line in _iter_lines(path):
        fields = line.split()
        if not fields:
            finish_sentence()
            continue
        if fields[0] == "-DOCSTART-":
            finish_sentence()
            continue
        if len(fields) != 4:
            raise ValueError(
                f"{path}:{lineno}: expected 4 space-separated fields (word POS chunk NER), "
                f"found {len(fields)}"
            )
        word, pos, _chunk, ner = fields
        if pos not in pos_ids:
            raise ValueError(f"{path}:{lineno}: unknown POS tag {pos!r} (not one of the 47 CoNLL-2003 tags)")
        _check_ner_tag(ner, path, lineno)
        cur_words.append(word)
        cur_pos.append(pos_ids[pos])
        cur_ner.append(ner)
    finish_sentence()
    return TokenExamples(words=words, tags=tags, tag_names=spec.label_names, source=str(path))


# --------------------------------------------------------------------------------------
# Hugging Face hub
# --------------------------------------------------------------------------------------

_PARQUET_REVISION = "refs/convert/parquet"


def _hub_load_dataset(path: str, config: str | None, split: str, parquet_fallback: bool = False):
    """``datasets.load_dataset(path, config, split=split)`` with clear errors.

    With ``parquet_fallback``, a repository that only offers a loading script (refused by
    ``datasets>=4``) is read from the hub's automatic parquet export instead.
    """
    where = f"{path}" + (f"/{config}" if config else "") + f":{split}"
    try:
        import datasets
    except ImportError as err:  # pragma: no cover - datasets is a dependency
        raise HubUnavailableError(
            f"loading {where} from the Hugging Face hub needs the 'datasets' package; "
            "install it or pass a local data_dir (--data-dir)"
        ) from err
    attempts: list[dict[str, Any]] = [{}]
    if parquet_fallback:
        attempts.append({"revision": _PARQUET_REVISION})
    last_error: Exception | None = None
    for attempt, extra in enumerate(attempts):
        try:
            return datasets.load_dataset(path, config, split=split, **extra)
        except Exception as err:  # noqa: BLE001 - re-raised below with advice
            last_error = err
            if "script" in str(err).lower() and attempt + 1 < len(attempts):
                continue  # loading scripts unsupported: try the parquet export
            break
    raise HubUnavailableError(
        f"could not load {where} from the Hugging Face hub "
        f"({type(last_error).__name__}: {last_error}). Without network access, point "
        "data_dir (CLI: --data-dir) at a local copy of the data files instead."
    ) from last_error


def _class_names(dataset, column: str) -> list[str] | None:
    """The ``ClassLabel`` names of a (sequence) column, or None when not recorded."""
    features = getattr(dataset, "features", None) or {}
    feature = features.get(column)
    inner = getattr(feature, "feature", feature)  # Sequence(ClassLabel) or List(ClassLabel)
    names = getattr(inner, "names", None)
    return list(names) if names else None


def _load_from_hub(spec: TaskSpec, split: str) -> SentenceExamples | TokenExamples:
    hub_split = spec.hub_validation_split if split == "validation" else "train"
    source = f"hub:{spec.hub_dataset}" + (f"/{spec.hub_config}" if spec.hub_config else "") + f":{hub_split}"
    if spec.kind == "token":
        dataset = _hub_load_dataset(spec.hub_dataset, None, hub_split, parquet_fallback=True)
        column = "pos_tags" if spec.name == "pos" else "ner_tags"
        hub_names = _class_names(dataset, column)
        remap = None
        if hub_names is not None and tuple(hub_names) != spec.label_names:
            unknown = [tag for tag in hub_names if tag not in spec.label_names]
            if unknown:
                raise ValueError(f"{source}: hub {column} has unexpected tags {unknown}")
            remap = [spec.label_names.index(tag) for tag in hub_names]
        words, tags = [], []
        for row in dataset:
            ids = [int(t) for t in row[column]]
            if remap is not None:
                ids = [remap[t] for t in ids]
            if row["tokens"]:
                words.append(list(row["tokens"]))
                tags.append(ids)
        return TokenExamples(words=words, tags=tags, tag_names=spec.label_names, source=source)

    dataset = _hub_load_dataset(spec.hub_dataset, spec.hub_config, hub_split)
    first, second = {
        "cola": ("sentence", None),
        "sst2": ("sentence", None),
        "mrpc": ("sentence1", "sentence2"),
        "mnli": ("premise", "hypothesis"),
    }[spec.name]
    hub_names = _class_names(dataset, "label")
    if hub_names is not None and tuple(hub_names) != spec.label_names:
        raise ValueError(f"{source}: hub label names {hub_names} differ from {list(spec.label_names)}")
    labels = [int(label) for label in dataset["label"]]
    bad = [label for label in labels if not 0 <= label < spec.num_labels]
    if bad:
        raise ValueError(f"{source}: {len(bad)} examples have labels outside 0..{spec.num_labels - 1}")
    return SentenceExamples(
        texts=list(dataset[first]),
        pairs=list(dataset[second]) if second else None,
        labels=labels,
        source=source,
    )


# --------------------------------------------------------------------------------------
# Tag schemes
# --------------------------------------------------------------------------------------


def convert_iob1_to_iob2(tags: list[str]) -> list[str]:
    """Convert one sentence's tags from IOB1 to IOB2.

    In IOB1 (the original CoNLL-2003 files) an entity starts with ``I-X`` unless it directly
    follows another entity of the same type, when it starts with ``B-X``.  In IOB2 every
    entity starts with ``B-X``.  So an ``I-X`` becomes ``B-X`` when it is the first tag or
    follows ``O`` or a tag of a different type.  IOB2 input is returned unchanged.
    """
    converted: list[str] = []
    previous = "O"
    for position, tag in enumerate(tags):
        if tag != "O" and (len(tag) < 3 or tag[:2] not in ("B-", "I-")):
            raise ValueError(f"tag {tag!r} at position {position} is not 'O', 'B-TYPE' or 'I-TYPE'")
        if tag.startswith("I-") and (previous == "O" or previous[2:] != tag[2:]):
            converted.append("B-" + tag[2:])
        else:
            converted.append(tag)
        previous = tag
    return converted
