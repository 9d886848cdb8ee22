"""The "Masked-language modelling" chapter's plumbing (book/mlm.md; paper Sec. 5.5, Fig. 6).

Reading the results (the book's chapter on Sec. 5.5)
    :func:`load_mlm_results` reads a profile's MLM store (:data:`MLM_RESULT_FOLDERS`), :func:`mlm_curves` turns it
    into Fig. 6a's points, :func:`mlm_drops` into the two numbers Sec. 5.5 discusses (the score with every head
    input-dependent, and how much it loses with every head constant), and :func:`paper_mlm_reference` gives the
    paper's values of those numbers. :func:`run_profile_mlm_curve` runs a curve at a profile's size
    (:data:`MLM_PROFILE_SETTINGS`); :func:`run_mnli_curve` runs Fig. 6b's MNLI curve, which is the ``fig2`` block of
    the profile's grid restricted to MNLI (:func:`mnli_curve_spec`), so its runs are Fig. 2's runs.

It also names the models of Fig. 6 and how each was pretrained (:data:`FIG6_MODELS`,
:data:`PRETRAINING_OBJECTIVES`). The experiment itself is :mod:`papa_lib.analysis.mlm`.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from ..analysis.mlm import lambda_file, run_mlm_curve
from ..experiments.results import ResultsStore
from ..experiments.selection import PAPER_FRACTIONS
from .paper import headline

__all__ = [
    "MLM_RESULT_FOLDERS",
    "MLM_PROFILE_SETTINGS",
    "FIG6_MODELS",
    "PRETRAINING_OBJECTIVES",
    "pretraining_objective",
    "short_model_name",
    "load_mlm_results",
    "load_mlm_lambdas",
    "mlm_curves",
    "mlm_drops",
    "mlm_reference_scores",
    "paper_mlm_reference",
    "mnli_curve_spec",
    "run_profile_mlm_curve",
    "run_mnli_curve",
]

#: Where each profile keeps its MLM results store (relative to the repository root).
MLM_RESULT_FOLDERS = {"smoke": "runs/smoke/mlm", "local": "data/results/mlm", "paper": "data/results/paper/mlm"}

#: :func:`run_mlm_curve` sizes per profile. ``local`` is the committed all-MiniLM-L6-v2 run (CPU): the first 1200
#: WikiText-2 validation sequences train the probe, the first 300 test sequences score it. ``paper`` keeps the
#: defaults (WikiText-103 train, :data:`papa_lib.analysis.mlm_probe.HUB_TRAIN_SEQUENCES_DEFAULT` sequences; the whole
#: validation split).
#: ``smoke`` is a few short sequences of generated text and one epoch (seconds).
MLM_PROFILE_SETTINGS = {
    "smoke": {"max_length": 32, "train_sequences": 24, "eval_sequences": 12, "epochs": 1},
    "local": {"max_length": 128, "train_sequences": 1200, "eval_sequences": 300},
    "paper": {"max_length": 128, "train_sequences": None, "eval_sequences": None},
}

#: The models of Fig. 6 (Sec. 5.5): three MLM-pretrained BASE models and ELECTRA-base's discriminator.
FIG6_MODELS = ("bert-base-uncased", "roberta-base", "microsoft/deberta-base", "google/electra-base-discriminator")

#: How each model the book runs was pretrained (what its weights were last trained to do).
PRETRAINING_OBJECTIVES = {
    "bert-base-uncased": "MLM (+ next-sentence prediction)",
    "bert-large-uncased": "MLM (+ next-sentence prediction)",
    "roberta-base": "MLM",
    "roberta-large": "MLM",
    "microsoft/deberta-base": "MLM",
    "microsoft/deberta-large": "MLM",
    "google/electra-base-discriminator": "replaced-token detection",
    "all-MiniLM-L6-v2": "distilled, then contrastive sentence pairs",
}

_SHORT_NAMES = {
    "bert-base-uncased": "BERT-base",
    "bert-large-uncased": "BERT-large",
    "roberta-base": "RoBERTa-base",
    "roberta-large": "RoBERTa-large",
    "microsoft/deberta-base": "DeBERTa-base",
    "microsoft/deberta-large": "DeBERTa-large",
    "google/electra-base-discriminator": "ELECTRA-base",
}

_CURVE_COLUMNS = ["model", "objective", "fraction", "fraction_label", "mean", "ci_low", "ci_high", "n", "seeds",
                  "masked_accuracy", "num_replaced_heads", "drop"]
_DROP_COLUMNS = ["model", "objective", "original", "all_constant", "drop", "largest_drop", "fractions", "missing"]
_REFERENCE_COLUMNS = ["model", "objective", "value", "ci_low", "ci_high", "eval_size"]


def pretraining_objective(model: str) -> str:
    """The pretraining objective of a model id (:data:`PRETRAINING_OBJECTIVES`; ``'unknown'`` when not listed)."""
    name = str(model)
    if name in PRETRAINING_OBJECTIVES:
        return PRETRAINING_OBJECTIVES[name]
    if name.startswith("tiny-random"):
        return "none (random weights)"
    if "electra" in name.lower() and "discriminator" in name.lower():
        return "replaced-token detection"
    return "unknown"


def short_model_name(model: str) -> str:
    """The paper's name of a hub model (``'roberta-base'`` -> ``'RoBERTa-base'``); other ids are returned unchanged."""
    return _SHORT_NAMES.get(str(model), str(model))


def _fraction_label(fraction: float) -> str:
    from fractions import Fraction

    return str(Fraction(float(fraction)).limit_denominator(1024))


def load_mlm_results(results_dir: str | Path) -> pd.DataFrame:
    """The MLM rows (task ``'mlm'``) of the results store in ``results_dir``.

    A folder without a ``results.csv`` (nothing run yet) gives an empty frame with the store's columns, so a chapter
    can show what is missing instead of failing; the folder is not created.
    """
    from ..experiments.results import RECORD_FIELDS, RESULTS_FILENAME

    root = Path(results_dir)
    if root.exists() and not root.is_dir():
        raise NotADirectoryError(f"MLM results folder {root} is not a directory")
    if not (root / RESULTS_FILENAME).is_file():
        return pd.DataFrame({column: pd.Series(dtype="object") for column in RECORD_FIELDS})
    frame = ResultsStore(root).frame()
    return frame[frame["task"] == "mlm"].reset_index(drop=True)


def load_mlm_lambdas(results_dir: str | Path) -> pd.DataFrame:
    """The λ^h learned for MLM (``results_dir/mlm_lambdas.json``) in long form.

    Columns: model, seed, corpus, layer, head, lambda (one row per head and stored entry). Empty when the file does
    not exist.

    Raises:
        ValueError: the file is not valid JSON or an entry lacks its λ matrix (the message names the file).
    """
    columns = ["model", "seed", "corpus", "layer", "head", "lambda"]
    path = lambda_file(Path(results_dir))
    if not path.is_file():
        return pd.DataFrame({c: pd.Series(dtype="float64" if c == "lambda" else "object") for c in columns})
    try:
        stored = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as error:
        raise ValueError(f"{path}:{error.lineno}: invalid JSON: {error.msg}") from error
    if not isinstance(stored, dict):
        raise ValueError(f"{path}: expected a JSON object of λ entries")
    rows = []
    for key, entry in stored.items():
        matrix = entry.get("lambdas") if isinstance(entry, dict) else None
        if not isinstance(matrix, list) or not matrix or not all(isinstance(r, list) for r in matrix):
            raise ValueError(f"{path}: entry {key!r} has no [layers][heads] 'lambdas' matrix")
        for layer, values in enumerate(matrix):
            for head, value in enumerate(values):
                rows.append((entry.get("model"), entry.get("seed"), entry.get("corpus"), layer, head, float(value)))
    return pd.DataFrame(rows, columns=columns)


def _require(frame: pd.DataFrame, columns: Sequence[str], what: str) -> None:
    missing = [c for c in columns if c not in frame.columns]
    if missing:
        raise ValueError(f"{what}: the frame lacks column(s) {', '.join(missing)} (have {list(frame.columns)})")


def _empty_frame(columns: Sequence[str], numeric: Sequence[str]) -> pd.DataFrame:
    return pd.DataFrame({c: pd.Series(dtype="float64" if c in numeric else "object") for c in columns})


def mlm_curves(frame: pd.DataFrame) -> pd.DataFrame:
    """Fig. 6a: per (model, fraction of input-dependent heads) the mean negative log perplexity over probe seeds.

    Uses the rows of :func:`run_mlm_curve`'s curve (task ``'mlm'``, matrix type ``'average'``, order ``'lambda'``,
    every fraction including 1 and 0). ``ci_low``/``ci_high`` are the 95% interval over *evaluation sequences*
    (averaged over seeds when there are several: every seed scores the same masked tokens, so this is the
    uncertainty that comes from the evaluation text). ``drop`` = score at fraction 1 minus this score, in the same
    units (positive: worse than the original model; NaN without a fraction-1 row). Columns: model, objective,
    fraction, fraction_label, mean, ci_low, ci_high, n (seeds), seeds, masked_accuracy, num_replaced_heads, drop;
    sorted by model and decreasing fraction. Partial tables give partial curves, an empty table an empty frame.
    """
    _require(frame, ["model", "task", "matrix_type", "selection_order", "fraction", "seed", "value"], "mlm_curves")
    numeric = ["fraction", "mean", "ci_low", "ci_high", "n", "masked_accuracy", "num_replaced_heads", "drop"]
    rows = frame[(frame["task"] == "mlm") & (frame["matrix_type"] == "average")
                 & (frame["selection_order"] == "lambda")]
    if rows.empty:
        return _empty_frame(_CURVE_COLUMNS, numeric)
    rows = rows.copy()
    rows["fraction"] = pd.to_numeric(rows["fraction"], errors="raise").astype(float)
    for column in ("value", "ci_low", "ci_high", "masked_accuracy", "num_replaced_heads"):
        rows[column] = pd.to_numeric(rows[column], errors="coerce") if column in rows else np.nan
    out = []
    for (model, fraction), group in rows.groupby(["model", "fraction"], sort=False):
        values = group["value"].dropna()
        low = group["ci_low"].fillna(group["value"]).mean()
        high = group["ci_high"].fillna(group["value"]).mean()
        out.append({
            "model": model, "objective": pretraining_objective(model), "fraction": float(fraction),
            "fraction_label": _fraction_label(fraction), "mean": float(values.mean()) if len(values) else np.nan,
            "ci_low": float(low), "ci_high": float(high), "n": int(len(values)),
            "seeds": ", ".join(str(int(s)) for s in sorted(group["seed"].dropna().astype(int).unique())),
            "masked_accuracy": float(group["masked_accuracy"].mean()),
            "num_replaced_heads": float(group["num_replaced_heads"].mean()),
        })
    curves = pd.DataFrame(out)
    originals = curves[np.isclose(curves["fraction"], 1.0)].set_index("model")["mean"]
    curves["drop"] = curves["model"].map(originals) - curves["mean"]
    curves = curves.sort_values(["model", "fraction"], ascending=[True, False], kind="stable").reset_index(drop=True)
    return curves[_CURVE_COLUMNS]


def mlm_drops(curves: pd.DataFrame, fractions: Sequence[float] = PAPER_FRACTIONS) -> pd.DataFrame:
    """Sec. 5.5's two numbers per model, from :func:`mlm_curves`: the original score and how much it loses.

    Columns: model, objective, ``original`` (every head input-dependent), ``all_constant`` (every head constant),
    ``drop`` = original - all_constant, ``largest_drop`` = original - the lowest score at any fraction below 1
    (the paper speaks of "the drop when gradually removing heads"), ``fractions`` (how many of ``fractions`` have a
    point) and ``missing`` (their labels, comma-separated; empty when complete). Missing points give NaN.
    """
    _require(curves, ["model", "fraction", "mean"], "mlm_drops")
    numeric = ["original", "all_constant", "drop", "largest_drop", "fractions"]
    if curves.empty:
        return _empty_frame(_DROP_COLUMNS, numeric)
    out = []
    for model, group in curves.groupby("model", sort=True):
        fraction = group["fraction"].astype(float).to_numpy()
        scores = group["mean"].astype(float).to_numpy()
        original = scores[np.isclose(fraction, 1.0)]
        constant = scores[np.isclose(fraction, 0.0)]
        below = scores[fraction < 1.0 - 1e-9]
        original = float(original[0]) if len(original) else np.nan
        present = [f for f in fractions if np.isclose(fraction, float(f)).any()]
        out.append({
            "model": model, "objective": pretraining_objective(model), "original": original,
            "all_constant": float(constant[0]) if len(constant) else np.nan,
            "drop": original - float(constant[0]) if len(constant) else np.nan,
            "largest_drop": original - float(np.nanmin(below)) if len(below) else np.nan,
            "fractions": len(present),
            "missing": ", ".join(_fraction_label(f) for f in fractions if f not in present),
        })
    return pd.DataFrame(out)[_DROP_COLUMNS]


def mlm_reference_scores(frame: pd.DataFrame) -> pd.DataFrame:
    """The pretrained MLM heads' own scores (``matrix_type='pretrained_head'`` rows; original attention).

    Columns: model, objective, value, ci_low, ci_high, eval_size. Empty when no model had a pretrained head.
    """
    _require(frame, ["model", "task", "matrix_type", "value"], "mlm_reference_scores")
    rows = frame[(frame["task"] == "mlm") & (frame["matrix_type"] == "pretrained_head")].copy()
    if rows.empty:
        return _empty_frame(_REFERENCE_COLUMNS, ["value", "ci_low", "ci_high", "eval_size"])
    rows["objective"] = rows["model"].map(pretraining_objective)
    for column in _REFERENCE_COLUMNS:
        if column not in rows:
            rows[column] = np.nan
    return rows[_REFERENCE_COLUMNS].sort_values("model", kind="stable").reset_index(drop=True)


def paper_mlm_reference() -> pd.DataFrame:
    """The paper's Sec. 5.5 numbers (``papa_lib.book.paper.headline``), one row per group of models.

    Columns: model, objective, original (score with every head input-dependent), approximate (the paper says
    "around"), drop_low, drop_high (the drop when heads are removed; equal for a single value), data, source.
    """
    data = "WikiText-103 validation"
    return pd.DataFrame([
        {"model": "ELECTRA-base", "objective": PRETRAINING_OBJECTIVES["google/electra-base-discriminator"],
         "original": headline("electra_mlm_original"), "approximate": False,
         "drop_low": headline("electra_mlm_drop"), "drop_high": headline("electra_mlm_drop"),
         "data": data, "source": "Hassid et al. 2022, Sec. 5.5 / Fig. 6a"},
        {"model": "BERT-, RoBERTa-, DeBERTa-base", "objective": "MLM",
         "original": headline("mlm_models_mlm_original"), "approximate": True,
         "drop_low": headline("mlm_models_mlm_drop_low"), "drop_high": headline("mlm_models_mlm_drop_high"),
         "data": data, "source": "Hassid et al. 2022, Sec. 5.5 / Fig. 6a"},
    ])


def mnli_curve_spec(grid: dict, block: str = "fig2", task: str = "mnli") -> dict:
    """Fig. 6b's runs: a copy of a profile's grid keeping only ``block`` (Fig. 2's), restricted to ``task``.

    The runs are identical to (and share their run ids with) the Fig. 2 runs of that task.

    Raises:
        ValueError: the grid has no such block, or the block does not list ``task``.
    """
    from dataclasses import replace

    if not isinstance(grid, dict) or "blocks" not in grid:
        raise ValueError("mnli_curve_spec: grid must be a mapping with 'blocks' (papa_lib.experiments.grid.load_grid)")
    names = [getattr(b, "name", None) for b in grid["blocks"]]
    chosen = [b for b in grid["blocks"] if getattr(b, "name", None) == block]
    if not chosen:
        raise ValueError(f"mnli_curve_spec: the grid has no block {block!r} (blocks: {names})")
    chosen = [replace(b, tasks=[task]) for b in chosen if task in b.tasks]
    if not chosen:
        raise ValueError(f"mnli_curve_spec: block {block!r} does not run task {task!r}")
    spec = {k: v for k, v in grid.items() if k != "blocks"}
    spec["blocks"] = chosen
    return spec


def _profile_model_name(setup, model_name: str | None) -> str | None:
    name = model_name if model_name is not None else setup.model_name
    if setup.profile == "smoke" and model_name is not None:
        raise ValueError(f"the smoke profile runs its tiny random BERT only, not {model_name!r}")
    if setup.profile == "paper" and name is None:
        raise ValueError(f"the paper profile needs a hub model name (e.g. one of {', '.join(FIG6_MODELS)})")
    return name


def run_profile_mlm_curve(
    setup, model_name: str | None = None, seeds: Sequence[int] = (0,), results_dir: str | Path | None = None,
    progress: bool = False, **sizes,
) -> pd.DataFrame:
    """Run (or resume) :func:`run_mlm_curve` at a profile's size (:data:`MLM_PROFILE_SETTINGS`).

    ``setup`` is a :class:`papa_lib.book.profiles.Setup`. The model is the smoke profile's tiny random BERT, or
    ``model_name`` (default ``setup.model_name``; ``None`` at ``local`` = the embedded MiniLM) loaded with its MLM
    head (``load_encoder(..., with_mlm_head=True)``) on ``setup.device``. ``results_dir`` defaults to the profile's
    :data:`MLM_RESULT_FOLDERS` entry under ``setup.root``. ``sizes`` override the profile's settings (``max_length``,
    ``train_sequences``, ``eval_sequences``, ``epochs``, ``batch_size``, ``lr``); ``None`` values are ignored.
    With the local defaults the run ids are those of the committed run, so nothing is recomputed.
    """
    allowed = {"max_length", "train_sequences", "eval_sequences", "epochs", "batch_size", "lr"}
    unknown = set(sizes) - allowed
    if unknown:
        raise ValueError(f"run_profile_mlm_curve: unknown size setting(s) {sorted(unknown)}; "
                         f"allowed: {sorted(allowed)}")
    if setup.profile not in MLM_PROFILE_SETTINGS:
        raise ValueError(f"unknown profile {setup.profile!r}; choose one of {sorted(MLM_PROFILE_SETTINGS)}")
    settings = dict(MLM_PROFILE_SETTINGS[setup.profile])
    settings.update({k: v for k, v in sizes.items() if v is not None})
    name = _profile_model_name(setup, model_name)
    folder = Path(results_dir) if results_dir is not None else setup.root / MLM_RESULT_FOLDERS[setup.profile]
    if not folder.is_absolute():
        folder = setup.root / folder
    if setup.profile == "smoke":
        model, tokenizer = setup.encoder()
    else:
        from ..core.models import load_encoder

        model, tokenizer = load_encoder(name, with_mlm_head=True, device=setup.device)
    try:
        return run_mlm_curve(model, tokenizer, data_dir=setup.data_dir, seeds=list(seeds), device=setup.device,
                             results_dir=folder, progress=progress, **settings)
    finally:
        if setup.profile != "smoke":
            del model
            if torch.cuda.is_available():
                torch.cuda.empty_cache()


def run_mnli_curve(setup, model_name: str | None = None, progress: bool = False, task: str = "mnli"):
    """Run what a profile's grid lacks of Fig. 6b's MNLI curve (:func:`mnli_curve_spec`) for one model.

    ``task`` picks another task of the ``fig2`` block instead of MNLI (the paper shows MNLI only).

    Smoke uses the profile's tiny random BERT; otherwise ``model_name`` (default ``setup.model_name``) is loaded by
    :func:`papa_lib.experiments.grid.run_grid` as a bare encoder. Results go to ``setup.results_dir`` with the same run
    ids as the Fig. 2 runs, so finished runs are skipped. Returns the
    :class:`papa_lib.experiments.results.ResultsStore`.
    """
    from ..experiments.grid import run_grid

    name = _profile_model_name(setup, model_name)
    spec = mnli_curve_spec(setup.grid(), task=task)
    overrides = {"data_dir": str(setup.data_dir) if setup.data_dir else None, "device": setup.device}
    if setup.profile == "smoke":
        model, tokenizer = setup.encoder()
    else:
        model = tokenizer = None
        overrides["model"] = name
    return run_grid(spec, setup.results_dir, model=model, tokenizer=tokenizer, progress=progress, overrides=overrides)
