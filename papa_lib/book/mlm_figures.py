"""The MLM chapter's figures and tables (book/mlm.md; paper Sec. 5.5, Fig. 6), one call each.

:func:`plan` resolves what the chapter runs (models, MLM results folder, sizes); :class:`Plan` runs what is missing
and reads the records. The figures (:func:`lambda_chart`, :func:`fig6`, :func:`drop_map`) and tables
(:func:`masked_targets`, :func:`fig6_coverage`, :func:`beside_paper`, :func:`reference_scores`) are built from those
records (:mod:`papa_lib.book.mlm_pages`) and labelled from them; :func:`minilm_values` reads the committed MiniLM run.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from . import charts, figures, mlm_pages, prose
from .display import markdown as _markdown
from .records import describe
from .tables import plural

__all__ = ["Plan", "beside_paper", "corpus_label", "drop_map", "fig6", "fig6_coverage", "lambda_chart",
           "lambda_spread", "masked_targets", "minilm_values", "plan", "reference_scores"]


@dataclass
class Plan:
    """What the MLM chapter runs at a profile: ``models`` (``None`` = the profile's model), the MLM results
    ``folder``, the MLM ``sizes`` and a ``label`` naming the models."""

    setup: Any
    models: list
    folder: Path
    sizes: dict
    label: str
    run: bool = False
    data: str = field(default="")

    def table(self) -> pd.DataFrame:
        """The run's settings: profile, models, data, results folders, sizes and whether missing runs are run."""
        setup = self.setup
        from .provenance import shown_path

        values = [setup.profile, self.label, shown_path(setup.data_dir, setup) if setup.data_dir else "dataset hub",
                  os.path.relpath(self.folder, setup.root), os.path.relpath(setup.results_dir, setup.root),
                  ", ".join(f"{k}={v}" for k, v in self.sizes.items()),
                  "run what is missing" if self.run else "read stored results"]
        index = ["profile", "models", "data", "MLM results", "MNLI results", "MLM sizes", "mode"]
        return pd.DataFrame({"value": values}, index=index)

    def tokenizer(self):
        """The tokenizer of the first model (the smoke profile's tiny BERT at ``smoke``)."""
        if self.setup.profile == "smoke":
            return self.setup.encoder()[1]
        from transformers import AutoTokenizer

        from ..core.models import resolve_model_path

        return AutoTokenizer.from_pretrained(resolve_model_path(self.models[0])[0])

    def run_missing(self, seeds: int, tasks: Sequence[str]) -> None:
        """Run (resume) the MLM curve and the task curves of Fig. 6b for every model, when :attr:`run` is set."""
        if not self.run:
            return
        for name in self.models:
            mlm_pages.run_profile_mlm_curve(self.setup, model_name=name, seeds=range(seeds),
                                            results_dir=self.folder, **self.sizes)
            for task in tasks:
                mlm_pages.run_mnli_curve(self.setup, model_name=name, task=task)

    def results(self) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
        """``(mlm_frame, grid_frame, lambdas)``: the MLM records, the grid's records (Fig. 6b) and the learned λ,
        restricted to the chapter's models at the paper profile."""
        mlm_frame = mlm_pages.load_mlm_results(self.folder)
        grid_frame = self.setup.results(run_missing=False)
        lambdas = mlm_pages.load_mlm_lambdas(self.folder)
        if self.setup.profile == "paper":
            mlm_frame = mlm_frame[mlm_frame["model"].isin(self.models)]
            grid_frame = grid_frame[grid_frame["model"].isin(self.models)]
            lambdas = lambdas[lambdas["model"].isin(self.models)]
        return mlm_frame, grid_frame, lambdas


def plan(setup, model_name: str | None = None, results_dir: str | None = None, run: bool = False,
         **sizes) -> Plan:
    """The chapter's models (the profile's, or Fig. 6's four BASE models at ``paper``), MLM results folder
    (:data:`papa_lib.book.mlm_pages.MLM_RESULT_FOLDERS`) and sizes (the profile's, overridden by ``sizes`` that
    are not None)."""
    every = setup.profile == "paper" and model_name is None
    models = list(mlm_pages.FIG6_MODELS) if every else [model_name]
    folder = Path(results_dir or mlm_pages.MLM_RESULT_FOLDERS[setup.profile])
    folder = folder if folder.is_absolute() else setup.root / folder
    chosen = dict(mlm_pages.MLM_PROFILE_SETTINGS[setup.profile])
    chosen.update({k: v for k, v in sizes.items() if v is not None})
    label = "BERT-, RoBERTa-, DeBERTa- and ELECTRA-base" if every else setup.model_label
    return Plan(setup, models, folder, chosen, label, run)


def corpus_label(corpus: dict, profile: str) -> str:
    """A short name of the MLM corpus for figure subtitles, e.g. ``WikiText-2 (wiki.valid.tokens → …)``."""
    name, splits = corpus["corpus"].split(":", 1)
    name = name.replace("local-", "").replace("hub-", "").replace("wikitext", "WikiText")
    text = f"{name} ({splits.replace('->', ' → ')})"
    return f"generated text as {text}" if profile == "smoke" else text


def records_corpus_label(frame: pd.DataFrame, fallback: str, profile: str | None = None) -> str:
    """The MLM data of committed records, from their ``data_source`` (e.g. ``WikiText-2 (wiki.valid.tokens →
    wiki.test.tokens)``; the packaged sample says so), or ``fallback`` (the live corpus) when there are none."""
    import re

    from .records import data_label

    if frame is None or "data_source" not in frame.columns or frame["data_source"].dropna().empty:
        return fallback
    labels = []
    for source in dict.fromkeys(frame["data_source"].dropna().astype(str)):
        if profile == "smoke":
            labels.append(data_label([source], "smoke"))
            continue
        folder = source.split(" (")[0]
        name = data_label([folder]).split(": ", 1)[-1]
        if "packaged sample" in source or "papa_lib/samples" in source:
            name = f"{name} (packaged sample)"
        splits = re.search(r"probe: ([^,)]+), score: ([^,)]+)", source)
        labels.append(f"{name} ({splits.group(1)} → {splits.group(2)})" if splits else name)
    return "; ".join(dict.fromkeys(labels))


def masked_targets(masked, tokenizer, sequence: int = 0, rows: int = 12) -> tuple[pd.DataFrame, pd.DataFrame]:
    """``(counts, targets)``: how many targets got each corruption, and the targets of one sequence (position, the
    original token, what the model sees, the corruption)."""
    from ..analysis import mlm_probe

    names = {mlm_probe.KIND_MASK: "[MASK]", mlm_probe.KIND_RANDOM: "random token",
             mlm_probe.KIND_UNCHANGED: "unchanged"}
    row, col = masked.selected.nonzero(as_tuple=True)
    targets = pd.DataFrame({
        "sequence": row.numpy(), "position": col.numpy(),
        "original": tokenizer.convert_ids_to_tokens(masked.original_ids[row, col].tolist()),
        "model sees": tokenizer.convert_ids_to_tokens(masked.inputs["input_ids"][row, col].tolist()),
        "corruption": [names[int(k)] for k in masked.kinds[row, col]],
    })
    counts = targets["corruption"].value_counts().rename("targets").to_frame()
    return counts, targets[targets["sequence"] == sequence].head(rows)


def _constant_from(group: pd.DataFrame) -> list:
    """Per head of one model's λ: the largest paper fraction at which the λ order replaces it (NaN: never)."""
    import torch

    from ..experiments import selection

    grid = group.pivot(index="layer", columns="head", values="lambda").sort_index()
    matrix = torch.tensor(grid.to_numpy(), dtype=torch.float32)
    layers, heads = matrix.shape
    found = {}
    for fraction in sorted(selection.PAPER_FRACTIONS):  # 0 first, 1 last
        for head in selection.heads_to_replace("lambda", fraction, layers, heads, lambdas=matrix):
            found[head] = fraction
    return [found.get((int(layer), int(head)), np.nan) for layer, head in zip(group["layer"], group["head"])]


def _first_seed(lambdas: pd.DataFrame) -> pd.DataFrame:
    first = lambdas[lambdas["seed"] == lambdas.groupby("model")["seed"].transform("min")].copy()
    parts = [group.assign(constant_from=_constant_from(group)) for _, group in first.groupby("model")]
    heads = pd.concat(parts, ignore_index=True)
    heads["model"] = heads["model"].map(mlm_pages.short_model_name)
    heads["constant when fraction ≤"] = [figures.fraction_label(f) if not np.isnan(f) else "never"
                                        for f in heads["constant_from"]]
    return heads


def lambda_spread(lambdas: pd.DataFrame) -> Any:
    """Lowest, median and highest λ per model (first seed)."""
    if lambdas.empty:
        return None
    return _first_seed(lambdas).groupby("model")["lambda"].agg(["min", "median", "max"]).round(3)


def lambda_chart(lambdas: pd.DataFrame, label: dict) -> Any:
    """λ per head for the first seed of each model; a menu picks a fraction and outlines (red) the heads still
    input-dependent at it."""
    import altair as alt

    if lambdas.empty:
        return _markdown("No learned λ for MLM yet.")
    heads = _first_seed(lambdas)
    choice = alt.param(name="fraction", value=0.5, bind=alt.binding_select(
        options=[0.5, 0.125, 0.0625, 0.0], labels=["1/2", "1/8", "1/16", "0"], name="input-dependent fraction: "))
    step = alt.Step(min(22, max(8, 380 // (int(heads["head"].max()) + 1))))
    return alt.Chart(heads).mark_rect().encode(
        x=alt.X("head:O", title="head"), y=alt.Y("layer:O", title="layer"),
        color=alt.Color("lambda:Q", title="λ", scale=alt.Scale(scheme="viridis")),
        stroke=alt.condition("isValid(datum.constant_from) && datum.constant_from >= fraction",
                             alt.value(None), alt.value("#d62728")),
        strokeWidth=alt.value(2),
        tooltip=["model:N", "seed:Q", "layer:O", "head:O", alt.Tooltip("lambda:Q", title="λ", format=".3f"),
                 alt.Tooltip("constant when fraction ≤:N")],
    ).add_params(choice).properties(width=step, height=step).facet(row=alt.Row("model:N", title=None)).properties(
        title=charts.chart_title("λ per head, learned with the MLM probe (red outline: still input-dependent)",
                                 **label))


def _panels(mlm_frame: pd.DataFrame, grid_frame: pd.DataFrame, tasks: Sequence[str]) -> pd.DataFrame:
    mlm_curves = mlm_pages.mlm_curves(mlm_frame)
    task_curves = figures.fraction_curves(grid_frame, tasks=tasks)
    mlm_panel = mlm_curves.assign(panel="6a · MLM: negative log perplexity",
                                  interval="95% CI over evaluation sequences")
    task_panel = task_curves.assign(
        objective=task_curves["model"].map(mlm_pages.pretraining_objective),
        panel=[f"6b · {t.upper()}: {m}" for t, m in zip(task_curves["task"], task_curves["metric"])],
        interval="95% CI over probe seeds")
    columns = ["panel", "model", "objective", "fraction", "fraction_label", "mean", "ci_low", "ci_high", "n",
               "interval"]
    panels = pd.concat([mlm_panel[columns], task_panel[columns]], ignore_index=True)
    panels["model"] = panels["model"].map(mlm_pages.short_model_name)
    return panels


def fig6_coverage(plan: Plan, mlm_frame: pd.DataFrame, grid_frame: pd.DataFrame,
                  tasks: Sequence[str]) -> pd.DataFrame:
    """Per model and panel: how many fractions (MLM) or declared runs (tasks) are in the tables, which fractions
    are missing and which seeds were found (the local grid may still be running)."""
    order = charts.FRACTION_ORDER
    mlm_curves = mlm_pages.mlm_curves(mlm_frame)
    task_curves = figures.fraction_curves(grid_frame, tasks=tasks)
    rows = []
    for name, group in mlm_curves.groupby("model"):
        seeds = sorted({s for text in group["seeds"] for s in text.split(", ")})
        missing = [f for f in order if f not in set(group["fraction_label"])]
        rows.append((mlm_pages.short_model_name(name), "mlm", f"{len(group)}/5 fractions",
                     ", ".join(missing) or "—", ", ".join(seeds)))
    if mlm_curves.empty:
        rows.append((plan.label, "mlm", "0/5 fractions", ", ".join(order), ""))
    spec = plan.setup.grid()
    for name in plan.models if plan.setup.profile == "paper" else [None]:
        for task in tasks:
            done = figures.grid_coverage(grid_frame, mlm_pages.mnli_curve_spec(spec, task=task), model=name).iloc[0]
            present = task_curves[task_curves["task"] == task]
            task_rows = grid_frame[grid_frame["task"] == task]
            if name is not None:
                present, task_rows = present[present["model"] == name], task_rows[task_rows["model"] == name]
            missing = [f for f in order if f not in set(present["fraction_label"])]
            seeds = sorted(task_rows["seed"].dropna().astype(int).unique())
            found = ", ".join(sorted(task_rows["model"].unique()))
            who = mlm_pages.short_model_name(name) if name else (found or plan.label)
            rows.append((who, task, f"{done['done']}/{done['expected']} runs", ", ".join(missing) or "—",
                         ", ".join(map(str, seeds))))
    return pd.DataFrame(rows, columns=["model", "task", "done", "missing fractions", "seeds"])


def fig6(mlm_frame: pd.DataFrame, grid_frame: pd.DataFrame, tasks: Sequence[str], mlm_data: str,
         profile: str) -> Any:
    """Fig. 6: one panel per task (MLM, then the downstream tasks), score vs fraction of input-dependent heads,
    a model picked in the legend; labelled from the records of both tables."""
    import altair as alt

    panels = _panels(mlm_frame, grid_frame, tasks)
    if panels.empty:
        return _markdown("No MLM or task results for this profile yet: nothing to plot.")
    pick = alt.selection_point(fields=["model"], bind="legend")
    base = alt.Chart().encode(
        x=alt.X("fraction_label:O", sort=charts.FRACTION_ORDER, title="fraction of input-dependent heads",
                axis=alt.Axis(labelAngle=0)),
        color=alt.Color("model:N", title="model (click to pick)", legend=alt.Legend(orient="bottom")),
        opacity=alt.condition(pick, alt.value(1.0), alt.value(0.15)),
    )
    tooltip = ["model:N", alt.Tooltip("objective:N", title="pretraining"), alt.Tooltip("panel:N", title="task"),
               alt.Tooltip("fraction_label:N", title="input-dependent heads"),
               alt.Tooltip("mean:Q", title="score", format=".3f"),
               alt.Tooltip("ci_low:Q", title="CI low", format=".3f"),
               alt.Tooltip("ci_high:Q", title="CI high", format=".3f"), alt.Tooltip("n:Q", title="seeds"),
               "interval:N"]
    line = base.mark_line(point=True).encode(
        y=alt.Y("mean:Q", title="score (higher is better)", scale=alt.Scale(zero=False)), tooltip=tooltip,
    ).add_params(pick)
    bars = base.mark_errorbar(ticks={"size": 10}).encode(y=alt.Y("ci_low:Q", title="score (higher is better)"),
                                                         y2="ci_high:Q", tooltip=tooltip)
    columns = min(2, panels["panel"].nunique())
    mlm_who = describe(mlm_frame, profile=profile)
    task_who = describe(grid_frame, profile=profile)
    models = ", ".join(dict.fromkeys(m for m in (mlm_who["model"], task_who["model"]) if m))
    data = f"MLM: {mlm_data}; {', '.join(t.upper() for t in tasks)}: {task_who['data'] or 'no records'}"
    return alt.layer(line, bars, data=panels).properties(width=charts.panel_width(columns, axis=80),
                                                         height=220).facet(
        facet=alt.Facet("panel:N", title=None, sort="ascending",
                        header=alt.Header(labelFontSize=13, labelFontWeight="bold")),
        columns=columns,
    ).resolve_scale(y="independent").properties(title=charts.chart_title(
        "Fig. 6 (ours): MLM (a) and the downstream task (b) vs the fraction of input-dependent heads",
        model=models or "no records", data=data, profile=mlm_who["profile"] or profile))


def _paper_and_ours(mlm_frame: pd.DataFrame):
    ref = mlm_pages.paper_mlm_reference()
    ours = mlm_pages.mlm_drops(mlm_pages.mlm_curves(mlm_frame))
    return ref, ours


def beside_paper(mlm_frame: pd.DataFrame, mlm_data: str, profile: str) -> pd.DataFrame:
    """Sec. 5.5's numbers: the paper's original score and drop per group of models, and ours (original, drop to
    the all-constant model, largest drop below fraction 1)."""
    ref, ours = _paper_and_ours(mlm_frame)
    number = lambda v: f"{v:.2f}" if pd.notna(v) else "—"  # noqa: E731
    theirs = pd.DataFrame({
        "source": ref["source"], "model": ref["model"], "pretraining": ref["objective"], "data": ref["data"],
        "original score": [f"{'≈ ' if a else ''}{v:.2f}" for v, a in zip(ref["original"], ref["approximate"])],
        "drop": [f"{lo:.2f}" if lo == hi else f"{lo:.1f}–{hi:.1f}" for lo, hi in zip(ref["drop_low"],
                                                                                  ref["drop_high"])],
        "largest drop": "—"})
    mine = pd.DataFrame({
        "source": f"ours ({profile} profile)", "model": ours["model"].map(mlm_pages.short_model_name),
        "pretraining": ours["objective"], "data": mlm_data, "original score": ours["original"].map(number),
        "drop": ours["drop"].map(number), "largest drop": ours["largest_drop"].map(number)})
    return pd.concat([theirs, mine], ignore_index=True)


def reference_scores(mlm_frame: pd.DataFrame) -> Any:
    """The pretrained MLM heads' own scores (original attention), or a sentence when no model has one."""
    heads = mlm_pages.mlm_reference_scores(mlm_frame)
    if heads.empty:
        return _markdown("No model of this profile has a pretrained MLM head to score.")
    return heads.assign(model=heads["model"].map(mlm_pages.short_model_name)).round(3)


def drop_map(mlm_frame: pd.DataFrame, mlm_data: str, profile: str, models_label: str) -> Any:
    """Original MLM score (y) against its drop with every head constant (x): the paper's BASE models (a segment
    where it gives a range) and ours."""
    import altair as alt

    ref, ours = _paper_and_ours(mlm_frame)
    theirs = pd.DataFrame({"source": "paper (Hassid et al. 2022, Sec. 5.5)", "model": ref["model"],
                           "pretraining": ref["objective"], "original": ref["original"],
                           "drop_low": ref["drop_low"], "drop_high": ref["drop_high"], "data": ref["data"]})
    mine = pd.DataFrame({"source": f"ours ({profile})", "model": ours["model"].map(mlm_pages.short_model_name),
                         "pretraining": ours["objective"], "original": ours["original"], "drop_low": ours["drop"],
                         "drop_high": ours["drop"], "data": mlm_data}).dropna(subset=["original", "drop_low"])
    points = pd.concat([theirs, mine], ignore_index=True)
    points["drop"] = [f"{lo:.2f}" if lo == hi else f"{lo:.2f} to {hi:.2f}"
                      for lo, hi in zip(points["drop_low"], points["drop_high"])]
    encode = dict(
        y=alt.Y("original:Q", title="score with every head input-dependent", scale=alt.Scale(zero=False)),
        color=alt.Color("source:N", title=None,
                        legend=alt.Legend(orient="bottom", direction="vertical", labelLimit=400)),
        tooltip=["source:N", "model:N", "pretraining:N", "data:N",
                 alt.Tooltip("original:Q", title="original score", format=".2f"), "drop:N"])
    segments = alt.Chart(points).mark_rule(strokeWidth=4).encode(
        x=alt.X("drop_low:Q", title="drop in score, every head input-dependent → every head constant"),
        x2="drop_high:Q", **encode)
    dots = alt.Chart(points).mark_point(size=120, filled=True).encode(
        x="drop_low:Q", shape=alt.Shape("pretraining:N", title="pretraining", legend=alt.Legend(
            orient="bottom", direction="vertical", labelLimit=400)), **encode)
    labels = alt.Chart(points).transform_calculate(middle="(datum.drop_low + datum.drop_high) / 2").mark_text(
        align="center", dy=-12).encode(x="middle:Q", y="original:Q", text="model:N")
    zero = alt.Chart(pd.DataFrame({"x": [0.0]})).mark_rule(strokeDash=[4, 4], color="gray").encode(x="x:Q")
    who = describe(mlm_frame, model=models_label, profile=profile)
    return (zero + segments + dots + labels).properties(width=420, height=300, title=charts.chart_title(
        "Original MLM score vs its drop: the paper's BASE models and ours",
        model=f"paper: BASE models; ours: {who['model']}",
        data=f"paper: WikiText-103 validation; ours: {mlm_data}", profile=who["profile"]))


@prose.values("mlm_original", "mlm_ci_low", "mlm_ci_high", "mlm_accuracy", "mlm_direction", "mlm_high", "mlm_low",
              "mlm_fractions", "mlm_change_min", "mlm_change_max", "mlm_accuracy_min", "mlm_accuracy_max",
              "mlm_overlap", "mlm_loss_original", "mlm_loss_min", "mlm_loss_max", "mlm_loss_direction",
              "mlm_flat_spread", "mlm_where", "mlm_train_size", "mlm_eval_size", "mlm_seeds", "mlm_lambda_min",
              "mlm_lambda_max")
def minilm_values(root: Path) -> dict[str, str]:
    """The numbers the chapter states about the committed MiniLM run, every one read from ``data/results/mlm`` and
    glued into the text with myst-nb: the original score (interval, masked-token accuracy); with half of the heads
    constant or more, whether the score "rises", "falls" or "moves both ways" and by how much; whether the intervals
    "overlap" or "do not overlap"; the probe's final training loss and whether it "improves with" the score (lower
    loss where the score is higher, at every fraction below 1) or "does not improve with" it; how far the points
    below 1/2 spread and so whether the change happens "between 1 and 1/2"
    (spread under a tenth of the largest change) or "also below 1/2"; the run's sizes, seeds and learned λ range.
    "not measured" throughout when the run is not there."""
    out = prose.not_measured(minilm_values)
    folder = Path(root) / mlm_pages.MLM_RESULT_FOLDERS["local"]
    committed = mlm_pages.load_mlm_results(folder)
    curves = mlm_pages.mlm_curves(committed)
    minilm = curves[curves["model"] == "all-MiniLM-L6-v2"].set_index("fraction_label")
    if minilm.empty or "1" not in minilm.index or len(minilm) < 2:
        return out
    original, replaced = minilm.loc["1"], minilm.drop(index="1")
    raw = committed[(committed["model"] == "all-MiniLM-L6-v2") & (committed["matrix_type"] == "average")]
    loss = raw.groupby("fraction")["final_train_loss"].mean()
    below = loss.drop(index=1.0)
    gains = -replaced["drop"]  # score with constant heads minus the original score
    overlap = bool(((replaced["ci_high"] >= original["ci_low"])
                    & (replaced["ci_low"] <= original["ci_high"])).any())
    same_way = ((below < loss.loc[1.0]).all() and (gains > 0).all()) or (
        (below > loss.loc[1.0]).all() and (gains < 0).all())
    spread = replaced["mean"].max() - replaced["mean"].min()
    lambdas = mlm_pages.load_mlm_lambdas(folder)
    lambdas = lambdas[lambdas["model"] == "all-MiniLM-L6-v2"]["lambda"]
    return {
        "mlm_original": prose.number(original["mean"], ".2f"), "mlm_ci_low": prose.number(original["ci_low"], ".2f"),
        "mlm_ci_high": prose.number(original["ci_high"], ".2f"),
        "mlm_accuracy": prose.number(original["masked_accuracy"], ".1%"),
        "mlm_direction": "rises" if (gains > 0).all() else "falls" if (gains < 0).all() else "moves both ways",
        "mlm_high": prose.number(replaced["mean"].max(), ".2f"), "mlm_low": prose.number(replaced["mean"].min(), ".2f"),
        "mlm_fractions": ", ".join(replaced.index), "mlm_change_min": prose.number(gains.min(), "+.2f"),
        "mlm_change_max": prose.number(gains.max(), "+.2f"),
        "mlm_accuracy_min": prose.number(replaced["masked_accuracy"].min(), ".1%"),
        "mlm_accuracy_max": prose.number(replaced["masked_accuracy"].max(), ".1%"),
        "mlm_overlap": "overlap" if overlap else "do not overlap",
        "mlm_loss_original": prose.number(loss.loc[1.0], ".2f"), "mlm_loss_min": prose.number(below.min(), ".2f"),
        "mlm_loss_max": prose.number(below.max(), ".2f"),
        "mlm_loss_direction": "improves with" if same_way else "does not improve with",
        "mlm_flat_spread": prose.number(spread, ".3f"),
        "mlm_where": "between 1 and 1/2" if spread < 0.1 * abs(gains).max() else "also below 1/2",
        "mlm_train_size": str(int(raw["train_size"].iloc[0])), "mlm_eval_size": str(int(raw["eval_size"].iloc[0])),
        "mlm_seeds": plural(len(str(original["seeds"]).split(",")), "seed") + f" ({original['seeds']})",
        "mlm_lambda_min": prose.number(lambdas.min(), ".3f"), "mlm_lambda_max": prose.number(lambdas.max(), ".3f")}
