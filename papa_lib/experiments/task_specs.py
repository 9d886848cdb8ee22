"""The tasks' specifications (Sec. 4.1, App. B Table 3), the example containers loaders return, and the CoNLL tag
schemes. Loading is :mod:`papa_lib.experiments.tasks` and, for local files,
:mod:`papa_lib.experiments.task_files`."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from ..core.registry import Registry
from ..errors import PapaError, PapaInputError

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

NER_ENTITY_TYPES = frozenset(tag[2:] for tag in NER_TAG_NAMES if tag != "O")


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
    loader: Callable[[str], SentenceExamples | TokenExamples] | None = field(default=None, compare=False, repr=False)
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

SPLITS = ("train", "validation")




def task_spec(name: str) -> TaskSpec:
    try:
        return TASKS[name]
    except (KeyError, TypeError):
        raise PapaInputError(f"unknown task {name!r}; expected one of {sorted(TASKS)}") from None


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


class HubUnavailableError(PapaError, RuntimeError):
    """The Hugging Face hub could not provide a dataset (typically: no network)."""


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
