"""The paper's metrics (Sec. 4.1, footnote 10): MCC for CoLA, accuracy for SST-2 and MNLI, F1 for MRPC, NER and POS.

NER is entity-level F1 (seqeval). POS is seqeval's F1 over the POS tag sequences, which is what the authors' released
code reports for it (the token-classification script scores every tagging task with seqeval). seqeval reads a tag
like ``NNP`` as prefix ``N`` and type ``NP``, so this number is close to, but not the same as, token accuracy;
records keep token accuracy beside it. MCC, F1 and accuracy come from scikit-learn; seqeval scores the tag
sequences."""

from __future__ import annotations

import operator
from typing import Any

from .task_specs import task_spec

__all__ = ["compute_metric"]


def _as_int(value: Any, what: str) -> int:
    try:
        return operator.index(value)
    except TypeError:
        raise ValueError(f"{what}: expected an integer label id, got {value!r}") from None


def _as_tag_names(sequences: Any, names: tuple[str, ...], what: str) -> list[list[str]]:
    result = []
    for i, sequence in enumerate(sequences):
        if isinstance(sequence, (str, bytes)):
            raise ValueError(f"{what}[{i}]: expected a list of tags, got a string")
        row = []
        for tag in sequence:
            if isinstance(tag, str):
                row.append(tag)
            else:
                tag_id = _as_int(tag, f"{what}[{i}]")
                if not 0 <= tag_id < len(names):
                    raise ValueError(f"{what}[{i}]: tag id {tag_id} out of range 0..{len(names) - 1}")
                row.append(names[tag_id])
        result.append(row)
    return result


def compute_metric(task: str, predictions: Any, references: Any, *, ner_mode: str = "conlleval") -> float:
    """The paper's metric for ``task`` (Sec. 4.1, footnote 10), as a float in [0, 1] (MCC: [-1, 1]).

    Args:
        task: task name, a key of :data:`papa_lib.experiments.task_specs.TASKS`.
        predictions, references: for sentence tasks, sequences of integer label ids; for
            ``'ner'``/``'pos'``, sequences of sentences, each a sequence of tag ids or tag
            names (``'B-PER'``, ``'NNP'``), sentence lengths matching.
        ner_mode: how NER entities are read by ``seqeval``.  ``'conlleval'`` (default) is
            seqeval's default mode, which reproduces the official ``conlleval`` script (and
            the Hugging Face ``seqeval`` metric): an ``I-X`` after ``O`` or another type still
            opens an entity.  ``'strict'`` uses ``mode='strict', scheme=IOB2``, where such
            ill-formed entities count as wrong.  On well-formed IOB2 the two agree.

    Metrics:
        * cola: Matthews correlation coefficient (0.0 when undefined).
        * sst2, mnli: accuracy.
        * mrpc: F1 of the positive class (label 1, 'equivalent').
        * ner: entity-level micro F1 (seqeval) over IOB2 tags.
        * pos: seqeval's micro F1 over the POS tags, as the authors' released code computes it (footnote 10: "F1
          score for MRPC, NER and POS"); records keep token accuracy as a second column.
    """
    spec = task_spec(task)
    predictions = list(predictions)
    references = list(references)
    if len(predictions) != len(references):
        raise ValueError(
            f"{task}: {len(predictions)} predictions but {len(references)} references"
        )
    if not references:
        raise ValueError(f"{task}: cannot compute a metric on zero examples")

    if spec.kind == "sentence":
        preds = [_as_int(p, f"{task} predictions") for p in predictions]
        refs = [_as_int(r, f"{task} references") for r in references]
        from sklearn import metrics as sk

        if spec.metric == "accuracy":
            return float(sk.accuracy_score(refs, preds))
        if spec.metric == "matthews_corrcoef":  # 0.0 where undefined (a constant prediction or reference)
            return float(sk.matthews_corrcoef(refs, preds))
        if spec.metric == "f1":  # of the positive class (label 1); 0.0 with no true positive
            return float(sk.f1_score(refs, preds, pos_label=1, average="binary", zero_division=0.0))
        raise AssertionError(f"unhandled metric {spec.metric}")  # pragma: no cover

    pred_tags = _as_tag_names(predictions, spec.label_names, f"{task} predictions")
    ref_tags = _as_tag_names(references, spec.label_names, f"{task} references")
    for i, (p, r) in enumerate(zip(pred_tags, ref_tags)):
        if len(p) != len(r):
            raise ValueError(f"{task}: sentence {i} has {len(p)} predicted tags but {len(r)} reference tags")
    if spec.name == "pos":
        return pos_f1(pred_tags, ref_tags)
    from seqeval.metrics import f1_score

    if ner_mode == "conlleval":
        return float(f1_score(ref_tags, pred_tags, zero_division=0))
    if ner_mode == "strict":
        from seqeval.scheme import IOB2

        return float(f1_score(ref_tags, pred_tags, mode="strict", scheme=IOB2, zero_division=0))
    raise ValueError(f"unknown ner_mode {ner_mode!r}; expected 'conlleval' or 'strict'")


def pos_f1(predictions: list[list[str]], references: list[list[str]]) -> float:
    """seqeval's micro F1 over POS tag sequences (footnote 10; the authors' code scores POS this way)."""
    import warnings

    from seqeval.metrics import f1_score

    if not any(references):
        raise ValueError("pos: cannot compute F1 on zero tokens")
    with warnings.catch_warnings():  # seqeval warns that POS tags are not IOB tags; that is expected here
        warnings.simplefilter("ignore")
        return float(f1_score(references, predictions, zero_division=0))
