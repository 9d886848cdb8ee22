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
  which ``datasets>=4`` refuses to run, so CoNLL-2003 is read from the hub's
  automatic parquet export of the same data, pinned to one commit of its
  ``refs/convert/parquet`` branch (:data:`CONLL_PARQUET_COMMIT`); a hub without
  that commit gets the branch's current head instead, with a one-line warning;
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

import logging
import random
import re
from collections.abc import Iterable
from pathlib import Path

from ..errors import PapaInputError
from .task_files import iter_lines, load_local
from .task_specs import (
    SPLITS,
    HubUnavailableError,
    SentenceExamples,
    TaskSpec,
    TokenExamples,
    task_spec,
)

__all__ = [
    "load_task",
    "unlabeled_texts",
    "load_wikitext",
]

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
    spec = task_spec(name)
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r} for task {name!r}; expected one of {list(SPLITS)}")
    _check_limit(limit)
    if spec.loader is not None:
        examples = spec.loader(split)
    elif data_dir is None:
        examples = _load_from_hub(spec, split)
    else:
        examples = load_local(spec, split, Path(data_dir))
    if len(examples) == 0:
        what = "training" if split == "train" else "validation"
        raise PapaInputError(f"{examples.source}: the {what} set of {name} is empty: the file has no examples")
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
        raw_lines = (line for _, line in iter_lines(path))
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
# Hugging Face hub
# --------------------------------------------------------------------------------------

_PARQUET_BRANCH = "refs/convert/parquet"  # where the hub keeps every dataset's automatic parquet export
#: The commit of ``eriktks/conll2003``'s ``refs/convert/parquet`` branch that CoNLL-2003 is loaded from, so its bytes
#: cannot drift. Taken from public code that pins the same export (written offline: not checked against the hub here).
CONLL_PARQUET_COMMIT = "ce85b39f9dd99f552d0739d456814e95fb6a39b0"
_PARQUET_COMMITS = {"eriktks/conll2003": CONLL_PARQUET_COMMIT}  # hub dataset -> pinned export commit

_logger = logging.getLogger(__name__)


def _one_line(err: BaseException) -> str:
    """``'Type: message'`` with the message's line breaks and runs of spaces collapsed (hub errors span lines)."""
    return f"{type(err).__name__}: {' '.join(str(err).split())}"


def _hub_load_dataset(
    path: str, config: str | None, split: str, revision: str | None = None, fallback_revision: str | None = None
):
    """``datasets.load_dataset(path, config, split=split, revision=revision)`` with one-line errors.

    When the hub answers that ``revision`` does not exist (an export rebuilt since the pin, a mirror without it),
    ``fallback_revision``, if given, is loaded instead and a one-line warning says so. Any other failure, or a
    failed fallback, raises :class:`HubUnavailableError` naming what was tried.
    """
    where = f"{path}" + (f"/{config}" if config else "") + f":{split}"
    try:
        import datasets
    except ImportError as err:  # pragma: no cover - datasets is a dependency
        raise HubUnavailableError(
            f"loading {where} from the Hugging Face hub needs the 'datasets' package; "
            "install it or pass a local data_dir (--data-dir)"
        ) from err
    extra = {} if revision is None else {"revision": revision}
    try:
        return datasets.load_dataset(path, config, split=split, **extra)
    except Exception as err:  # noqa: BLE001 - re-raised below with advice
        first = err
    tried = _one_line(first) if revision is None else f"revision {revision}: {_one_line(first)}"
    if fallback_revision is not None and "revision" in f"{type(first).__name__} {first}".lower():
        try:
            dataset = datasets.load_dataset(path, config, split=split, revision=fallback_revision)
        except Exception as err:  # noqa: BLE001 - re-raised below with advice
            tried += f"; then revision {fallback_revision}: {_one_line(err)}"
            first = err
        else:
            _logger.warning("%s: pinned revision %s not on the hub; loaded %s instead (its data may differ)",
                            where, revision, fallback_revision)
            return dataset
    raise HubUnavailableError(
        f"could not load {where} from the Hugging Face hub ({tried}). Without network access, point "
        "data_dir (CLI: --data-dir) at a local copy of the data files instead."
    ) from first


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
        pinned = _PARQUET_COMMITS.get(spec.hub_dataset)  # the parquet export: CoNLL-2003's main holds a script
        dataset = _hub_load_dataset(spec.hub_dataset, None, hub_split, revision=pinned or _PARQUET_BRANCH,
                                    fallback_revision=_PARQUET_BRANCH if pinned else None)
        column = "pos_tags" if spec.name == "pos" else "ner_tags"
        hub_names = _class_names(dataset, column)
        remap = None
        if hub_names is not None and tuple(hub_names) != spec.label_names:
            unknown = [tag for tag in hub_names if tag not in spec.label_names]
            if unknown:
                raise PapaInputError(f"{source}: hub {column} has unexpected tags {unknown}")
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
        raise PapaInputError(f"{source}: hub label names {hub_names} differ from {list(spec.label_names)}")
    labels = [int(label) for label in dataset["label"]]
    bad = [label for label in labels if not 0 <= label < spec.num_labels]
    if bad:
        raise PapaInputError(f"{source}: {len(bad)} examples have labels outside 0..{spec.num_labels - 1}")
    return SentenceExamples(
        texts=list(dataset[first]),
        pairs=list(dataset[second]) if second else None,
        labels=labels,
        source=source,
    )


