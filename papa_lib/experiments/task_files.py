"""Task data from a local folder laid out like ``/work/shared/data`` (the layout: :mod:`papa_lib.experiments.tasks`):
the GLUE TSV readers, MNLI's full and sample files, CoNLL-2003 with IOB1 or IOB2 tags; a bad line is named with its
file and line."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path

from ..errors import PapaInputError
from . import sample_data
from .task_specs import (
    NER_ENTITY_TYPES,
    NER_TAG_NAMES,
    POS_TAG_NAMES,
    SentenceExamples,
    TaskSpec,
    TokenExamples,
    convert_iob1_to_iob2,
)

# --------------------------------------------------------------------------------------
# Local files
# --------------------------------------------------------------------------------------

_GLUE_FOLDERS = {"cola": "CoLA", "sst2": "SST-2", "mrpc": "MRPC"}
_GLUE_FILES = {"train": "train.tsv", "validation": "dev.tsv"}


def load_local(spec: TaskSpec, split: str, data_dir: Path) -> SentenceExamples | TokenExamples:
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


def iter_lines(path: Path) -> Iterator[tuple[int, str]]:
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
    for lineno, line in iter_lines(path):
        if line == "":
            continue
        fields = line.split("\t")
        if has_header and header is None:
            header = [field.strip() for field in fields]
            continue
        if header is not None and len(fields) != len(header):
            raise PapaInputError(
                f"{path}:{lineno}: expected {len(header)} tab-separated fields "
                f"(as in the header), found {len(fields)}"
            )
        yield lineno, fields, header
    if has_header and header is None:
        raise PapaInputError(f"{path}: file is empty (expected a header row)")


def _column(header: list[str], candidates: Sequence[str], path: Path) -> int:
    lowered = [name.lower() for name in header]
    for candidate in candidates:
        if candidate.lower() in lowered:
            return lowered.index(candidate.lower())
    raise PapaInputError(f"{path}:1: header {header} has none of the columns {list(candidates)}")


def _headed_rows(path: Path, *columns: Sequence[str]) -> Iterator[tuple[int, list[str], list[int]]]:
    """Yield (line number, fields, the index of each of ``columns``) for each data row of a TSV file with a header;
    each of ``columns`` lists the names one column may have (:func:`_column`), looked up in the header once."""
    found = None
    for lineno, fields, header in _iter_tsv_rows(path, has_header=True):
        if found is None:
            found = [_column(header, names, path) for names in columns]
        yield lineno, fields, found


def _int_label(text: str, spec: TaskSpec, path: Path, lineno: int) -> int:
    value = text.strip()
    try:
        label = int(value)
    except ValueError:
        raise PapaInputError(f"{path}:{lineno}: label {text!r} is not an integer") from None
    if not 0 <= label < spec.num_labels:
        raise PapaInputError(
            f"{path}:{lineno}: label {label} out of range for {spec.name} "
            f"(expected 0..{spec.num_labels - 1})"
        )
    return label


def _read_sst2(path: Path, spec: TaskSpec) -> SentenceExamples:
    texts, labels = [], []
    for lineno, fields, (text_col, label_col) in _headed_rows(path, ["sentence"], ["label"]):
        texts.append(fields[text_col])
        labels.append(_int_label(fields[label_col], spec, path, lineno))
    return SentenceExamples(texts=texts, pairs=None, labels=labels, source=str(path))


def _read_cola(path: Path, spec: TaskSpec) -> SentenceExamples:
    texts, labels = [], []
    for lineno, fields, _ in _iter_tsv_rows(path, has_header=False):
        if len(fields) != 4:
            raise PapaInputError(
                f"{path}:{lineno}: expected 4 tab-separated fields "
                f"(source, label, original mark, sentence), found {len(fields)}"
            )
        labels.append(_int_label(fields[1], spec, path, lineno))
        texts.append(fields[3])
    return SentenceExamples(texts=texts, pairs=None, labels=labels, source=str(path))


def _read_mrpc(path: Path, spec: TaskSpec) -> SentenceExamples:
    texts, pairs, labels = [], [], []
    columns = (["#1 String", "sentence1"], ["#2 String", "sentence2"], ["Quality", "label"])
    for lineno, fields, cols in _headed_rows(path, *columns):
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
    columns = (["sentence1", "premise"], ["sentence2", "hypothesis"], ["gold_label"])
    for lineno, fields, cols in _headed_rows(path, *columns):
        gold = fields[cols[2]].strip()
        if gold not in spec.label_names:
            raise PapaInputError(
                f"{path}:{lineno}: unknown gold_label {gold!r}; expected one of {list(spec.label_names)}"
            )
        texts.append(fields[cols[0]])
        pairs.append(fields[cols[1]])
        labels.append(spec.label_names.index(gold))
    return SentenceExamples(texts=texts, pairs=pairs, labels=labels, source=str(path))


def _check_ner_tag(tag: str, path: Path, lineno: int) -> None:
    if tag == "O":
        return
    if len(tag) > 2 and tag[:2] in ("B-", "I-") and tag[2:] in NER_ENTITY_TYPES:
        return
    raise PapaInputError(
        f"{path}:{lineno}: unknown NER tag {tag!r}; expected O or B-/I- with one of "
        f"{sorted(NER_ENTITY_TYPES)}"
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

    for lineno, line in iter_lines(path):
        fields = line.split()
        if not fields or fields[0] == "-DOCSTART-":
            finish_sentence()
            continue
        if len(fields) != 4:
            raise PapaInputError(
                f"{path}:{lineno}: expected 4 space-separated fields (word POS chunk NER), "
                f"found {len(fields)}"
            )
        word, pos, _chunk, ner = fields
        if pos not in pos_ids:
            raise PapaInputError(f"{path}:{lineno}: unknown POS tag {pos!r} (not one of the 47 CoNLL-2003 tags)")
        _check_ner_tag(ner, path, lineno)
        cur_words.append(word)
        cur_pos.append(pos_ids[pos])
        cur_ner.append(ner)
    finish_sentence()
    return TokenExamples(words=words, tags=tags, tag_names=spec.label_names, source=str(path))
