"""The probing chapter's figures and tables (book/probing.md; paper Sec. 3.3, 4.2, Fig. 2-3), one call each.

* :func:`probe_sizes`, :func:`pooling_at_start`: the two probes of Sec. 3.3 for a model, and the pooling weights of a
  fresh sentence probe on one App. A input;
* :func:`fig2`, :func:`relative_drops`, :func:`fig3`: the figures, from a results table
  (:func:`papa_lib.book.figures.fraction_curves`, :func:`papa_lib.book.figures.all_constant_drop`), every model of
  the records (the chapter adds the other committed local models, :func:`papa_lib.book.records.with_models`);
  :func:`models_side_by_side` and :func:`pair_text` (together :func:`two_models`): Fig. 3's numbers per task where
  two models have them, and what such a pair can tell, with C3's verdict from the claims engine — nothing when the
  records hold one model;
* :func:`against_majority`: every task's original probe against its validation set's majority-class baseline, and
  the probes that predict a single class (guide: a score is only as good as its probe), per model when the records
  hold several; :func:`majority_view`: that table as the page shows it; :func:`more_seeds`,
  :func:`more_seeds_values`: the same check on a diagnostic run with more seeds (``data/results/mrpc-original-seeds``);
* :func:`headline`, :func:`headline_text`, :func:`training_note`: Sec. 4.2's three claims, ours beside the paper's,
  and how far to trust the comparison — every number read from the records.

Figures name the model, data and profile of the records they plot (:func:`papa_lib.book.charts.records_title`) and
fit the book's content column (:data:`papa_lib.book.charts.CONTENT_WIDTH`).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from . import charts, figures, paper, prose
from .display import markdown as _markdown
from .records import describe, diagnostic_records
from .tables import METRIC_NAMES, MISSING

__all__ = ["MORE_SEEDS_FOLDERS", "against_majority", "fig2", "fig3", "headline", "headline_text",
           "majority_view", "models_side_by_side", "more_seeds", "more_seeds_values", "pair_text", "pooling_at_start",
           "probe_sizes", "relative_drops", "training_note", "two_models"]

#: Diagnostic runs beside a profile's results folder that repeat a task's original probe with more seeds.
MORE_SEEDS_FOLDERS = ("mrpc-original-seeds",)


def _parameters(module) -> int:
    return sum(p.numel() for p in module.parameters())


def probe_sizes(model, length: int = 64, token_labels: int = 9) -> pd.DataFrame:
    """The sentence and token probes (:func:`papa_lib.experiments.probes.make_probe`) for ``model``: their position
    weights, MLP input and parameters, next to the frozen backbone's parameters."""
    from ..core.models import num_layers_and_heads
    from ..experiments import probes

    layers, _ = num_layers_and_heads(model)
    hidden = model.config.hidden_size
    sentence = probes.make_probe("sentence", layers + 1, length, hidden, num_labels=2)
    token = probes.make_probe("token", layers + 1, None, hidden, num_labels=token_labels)
    return pd.DataFrame({
        "probe": ["sentence (e.g. SST-2)", f"token (e.g. NER, {token_labels} tags)"],
        "position weights w": [_parameters(sentence) - _parameters(sentence.mlp), 0],
        "MLP input": [(layers + 1) * hidden] * 2,
        "MLP parameters": [_parameters(sentence.mlp), _parameters(token.mlp)],
        "frozen backbone parameters": [_parameters(model)] * 2,
    }).set_index("probe")


def pooling_at_start(model, length: int = 64, real_words: int = 3, shown: int = 8) -> pd.DataFrame:
    """The first layer's pooling weights of a fresh sentence probe on one input of the App. A layout: ``[CLS]``,
    ``real_words`` words, padding, and the final ``[SEP]`` at L-1. The first ``shown`` - 1 positions and L-1 are
    shown: equal weights on the real tokens, exactly 0 on the padding."""
    import torch

    from ..core.models import num_layers_and_heads
    from ..experiments import probes

    layers, _ = num_layers_and_heads(model)
    probe = probes.make_probe("sentence", layers + 1, length, model.config.hidden_size, num_labels=2)
    mask = torch.zeros(1, length, dtype=torch.long)
    mask[0, : real_words + 1] = 1
    mask[0, -1] = 1  # final [SEP] at position L-1 (App. A)
    weights = probe.pooling_weights(mask)[0, 0]
    keep = list(range(shown - 1)) + [length - 1]
    return pd.DataFrame({"attention_mask": mask[0, keep].tolist(), "pooling weight (layer 0)": weights[keep].tolist()},
                        index=pd.Index([str(p) if p < length - 1 else "L-1" for p in keep], name="position")).T


def _legend_pick(field: str):
    import altair as alt

    pick = alt.selection_point(fields=[field], bind="legend")
    return pick, alt.condition(pick, alt.value(1.0), alt.value(0.15))


def fig2(frame: pd.DataFrame, tasks: Sequence[str] | None = None, columns: int = 2) -> Any:
    """Fig. 2: per task, the mean validation score and its 95% interval over seeds vs the fraction of
    input-dependent heads (λ order), one panel per task, ``columns`` panels per row (each with its own y scale)."""
    import altair as alt

    curves = figures.fraction_curves(frame, tasks=tasks)
    if curves.empty:
        return _markdown("No Fig. 2 runs in the results table yet.")
    pick, opacity = _legend_pick("model")
    base = alt.Chart().encode(
        x=alt.X("fraction_label:O", sort=charts.FRACTION_ORDER, scale=alt.Scale(domain=charts.FRACTION_ORDER),
                title="fraction of input-dependent heads", axis=alt.Axis(labelAngle=0)),
        color=alt.Color("model:N", title="model (click to pick)", legend=alt.Legend(orient="bottom")),
        opacity=opacity,
    )
    tooltip = ["task:N", "model:N", alt.Tooltip("fraction_label:N", title="input-dependent heads"), "metric:N",
               alt.Tooltip("mean:Q", format=".3f"), alt.Tooltip("ci_low:Q", title="95% CI low", format=".3f"),
               alt.Tooltip("ci_high:Q", title="95% CI high", format=".3f"), alt.Tooltip("n:Q", title="seeds"),
               alt.Tooltip("relative_drop:Q", title="relative drop", format=".1%")]
    line = base.mark_line().encode(y=alt.Y("mean:Q", title="validation score", scale=alt.Scale(zero=False)))
    band = base.mark_rule(strokeWidth=2).encode(y=alt.Y("ci_low:Q", title="validation score"), y2="ci_high:Q")
    points = base.mark_point(filled=True, size=60).encode(y="mean:Q", tooltip=tooltip).add_params(pick)
    order = list(tasks) if tasks is not None else list(dict.fromkeys(curves["task"]))
    width = charts.panel_width(columns, axis=75)
    return (
        alt.layer(line, band, points, data=curves)
        .properties(width=width, height=150)
        .facet(facet=alt.Facet("task:N", sort=order, title=None), columns=columns)
        .resolve_scale(y="independent")
        .properties(title=charts.records_title(
            "Fig. 2: probing score vs fraction of input-dependent heads", frame))
    )


def relative_drops(frame: pd.DataFrame, tasks: Sequence[str] | None = None) -> Any:
    """Every task on one scale: the relative drop (s_orig - s) / |s_orig| vs the fraction of input-dependent heads,
    with the paper's average and largest drop with every head constant as dashed lines (Sec. 4.2); with several
    models, each model's lines have their own dash pattern."""
    import altair as alt

    curves = figures.fraction_curves(frame, tasks=tasks)
    relative = curves.dropna(subset=["relative_drop"])
    if relative.empty:
        return _markdown("No relative drops yet: they need the original model's rows and at least one "
                         "replaced variant.")
    paper_mean = paper.headline("mean_relative_drop_all_constant")
    paper_max = paper.headline("max_relative_drop_all_constant")
    pick, opacity = _legend_pick("task")
    order = list(tasks) if tasks is not None else list(dict.fromkeys(relative["task"]))
    dash = ({"strokeDash": alt.StrokeDash("model:N", title="model", legend=alt.Legend(orient="bottom", labelLimit=300))}
            if relative["model"].nunique() > 1 else {})  # several models: one dash pattern each
    lines = alt.Chart(relative).mark_line(point=True).encode(
        **dash,
        x=alt.X("fraction_label:O", sort=charts.FRACTION_ORDER, scale=alt.Scale(domain=charts.FRACTION_ORDER),
                title="fraction of input-dependent heads", axis=alt.Axis(labelAngle=0)),
        y=alt.Y("relative_drop:Q", title="relative drop from the original", axis=alt.Axis(format="%")),
        color=alt.Color("task:N", sort=order, title="task"),
        detail="model:N",
        opacity=opacity,
        tooltip=["task:N", "model:N", alt.Tooltip("fraction_label:N", title="input-dependent heads"),
                 alt.Tooltip("mean:Q", title="score", format=".3f"),
                 alt.Tooltip("relative_drop:Q", title="relative drop", format=".1%")],
    ).add_params(pick)
    references = pd.DataFrame({"relative_drop": [paper_mean, paper_max],
                               "label": [f"paper: {paper_mean:.0%} average", f"paper: at most {paper_max:.0%}"]})
    rules = alt.Chart(references).mark_rule(strokeDash=[4, 4], color="#777").encode(y="relative_drop:Q")
    labels = alt.Chart(references).mark_text(align="left", dx=4, dy=-6, color="#555").encode(
        y="relative_drop:Q", x=alt.value(0), text="label:N")
    return (rules + labels + lines).properties(
        width=440, height=260,
        title=charts.records_title("Relative drop vs fraction of input-dependent heads", frame))


def _shared_tasks(per_task: pd.DataFrame) -> list[str]:
    """The tasks every model of ``per_task`` has a row for (in the paper's order)."""
    if per_task.empty:
        return []
    models = per_task["model"].nunique()
    counts = per_task.groupby("task")["model"].nunique()
    return figures._ordered_tasks([t for t, n in counts.items() if n == models])


def fig3(frame: pd.DataFrame, tasks: Sequence[str] | None = None) -> Any:
    """Fig. 3: original score vs relative drop with every head constant; small points per (model, task), a large
    diamond per model (its mean over tasks). With several models each diamond averages only the tasks every model
    has, so the diamonds compare like with like (the tooltip names them)."""
    import altair as alt

    drops = figures.all_constant_drop(frame, tasks=tasks)
    if drops.per_task.empty:
        return _markdown("No (original, all-constant) pairs in the results table yet.")
    pick, opacity = _legend_pick("task")
    order = list(tasks) if tasks is not None else None
    tasks_layer = alt.Chart(drops.per_task).mark_point(filled=True, size=80).encode(
        x=alt.X("relative_drop:Q", title="relative drop, every head constant", axis=alt.Axis(format="%")),
        y=alt.Y("original:Q", title="original score"),
        color=alt.Color("task:N", sort=order, title="task"),
        shape=alt.Shape("model:N", title="model", legend=alt.Legend(orient="bottom", labelLimit=300)),
        opacity=opacity,
        tooltip=["model:N", "task:N", "metric:N", alt.Tooltip("original:Q", title="original", format=".3f"),
                 alt.Tooltip("replaced:Q", title="every head constant", format=".3f"),
                 alt.Tooltip("relative_drop:Q", title="relative drop", format=".1%")],
    ).add_params(pick)
    shared = _shared_tasks(drops.per_task)
    averaged = figures.all_constant_drop(frame, tasks=shared).per_model() if shared else drops.per_model()
    averaged["over"] = ", ".join(shared) if shared else "each model's own tasks"
    models_layer = alt.Chart(averaged).mark_point(shape="diamond", size=260, filled=True, color="black").encode(
        # the same axis titles as the points': a layer without one adds its field's name to the shared axis
        x=alt.X("relative_drop:Q", title="relative drop, every head constant"),
        y=alt.Y("original:Q", title="original score"),
        tooltip=["model:N", alt.Tooltip("original:Q", title="original, mean over tasks", format=".3f"),
                 alt.Tooltip("relative_drop:Q", title="relative drop, mean over tasks", format=".1%"),
                 alt.Tooltip("over:N", title="tasks averaged")],
    )
    return (tasks_layer + models_layer).properties(
        width=440, height=280,
        title=charts.records_title("Fig. 3: original score vs relative drop with every head constant", frame))


def models_side_by_side(frame: pd.DataFrame, tasks: Sequence[str] | None = None) -> pd.DataFrame | None:
    """Fig. 3's numbers for the tasks where at least two models have both an original and an all-constant result:
    per (task, model) the original score and the all-constant score (mean over seeds with its 95% Student-t
    interval, :func:`papa_lib.book.figures.fraction_curves`) and the relative drop. ``None`` when no task has two
    models, so a page shows nothing rather than an empty table."""
    curves = figures.fraction_curves(frame, tasks=tasks)
    if curves.empty:
        return None
    ends = curves[curves["fraction"].isin([0.0, 1.0])]
    pairs = ends.groupby(["model", "task"])["fraction"].nunique()
    complete = pairs[pairs == 2].reset_index()
    per_task = complete.groupby("task")["model"].nunique()
    shared = figures._ordered_tasks([t for t, n in per_task.items() if n >= 2])
    if not shared:
        return None
    rows = []
    for task in shared:
        for model in complete[complete["task"] == task]["model"]:
            mine = ends[(ends["task"] == task) & (ends["model"] == model)].set_index("fraction")
            cell = {f: figures.format_mean_ci(mine.loc[f, "mean"], mine.loc[f, "ci_low"], mine.loc[f, "ci_high"],
                                              int(mine.loc[f, "n"]), digits=3) for f in (1.0, 0.0)}
            drop = mine.loc[0.0, "relative_drop"]
            metric = mine.loc[1.0, "metric"]
            rows.append({"task": task, "model": model, "metric": METRIC_NAMES.get(metric, metric),
                         "original": cell[1.0],
                         "every head constant": cell[0.0],
                         "relative drop": "—" if pd.isna(drop) else f"{drop:.1%}"})
    return pd.DataFrame(rows).set_index(["task", "model"])


def pair_text(frame: pd.DataFrame, table: pd.DataFrame | None) -> Any:
    """What two models' records can and cannot tell about the paper's "better models lose more" (Sec. 4.2, Fig. 3),
    with C3's verdict as the claims engine decides it (:func:`papa_lib.book.claims.verdict_sentence` of ``table``'s
    row). ``None`` when the records hold fewer than two models or the table has no C3 row across them."""
    from . import claims

    models = list(dict.fromkeys(frame["model"].dropna().astype(str))) if len(frame) else []
    if len(models) < 2 or table is None:
        return None
    rows = table[(table["claim"] == "C3") & table["model"].astype(str).str.contains(" vs ")]
    if rows.empty:
        return None
    caveat = claims.pair_caveat(models, long=True)
    verdicts = " ".join(claims.verdict_sentence("C3", rows, m) for m in rows["model"])
    return _markdown(f"{caveat}\n\n{verdicts}" if caveat else verdicts)


def two_models(frame: pd.DataFrame, tasks: Sequence[str] | None, table: pd.DataFrame | None) -> list:
    """What the probing chapter shows beside Fig. 3 when two models share a task: a line that says what follows,
    :func:`models_side_by_side` and :func:`pair_text`. An empty list otherwise (``display(*two_models(...))`` then
    shows nothing: no heading without content)."""
    side = models_side_by_side(frame, tasks)
    if side is None:
        return []
    shown = [_markdown("Where two models have both ends of the curve for a task, their numbers side by side "
                       "(mean over seeds and its 95% Student-t interval):"), side]
    text = pair_text(frame, table)
    return shown + ([text] if text is not None else [])


def _variant_name(row) -> str:
    """A run's variant as tables name it: the matrix type's label (``Toeplitz``), its order and fraction, its source."""
    from ..experiments.matrices import matrix_label

    name = matrix_label(row["matrix_type"]).split(" (")[0]  # "Original", "Average", "Toeplitz"
    if row.get("selection_order") not in (None, "none") and not pd.isna(row.get("selection_order")):
        name += f" {row['selection_order']} {figures.fraction_label(float(row['fraction']))}"
    if isinstance(row.get("matrices_from"), str) and row["matrices_from"] != row["task"]:
        name += f" from {row['matrices_from']}"
    return name


def _majority_row(task: str, mine: pd.DataFrame) -> dict:
    """One task's row of :func:`against_majority` from its records ``mine``."""
    from ..experiments.results import mean_ci

    original = mine[mine["matrix_type"] == "original"]["value"].dropna()
    baseline = mine["majority_baseline"].dropna() if "majority_baseline" in mine else pd.Series(dtype=float)
    flagged = mine["single_class"].map(lambda v: str(v).strip().lower() in ("true", "1", "1.0")) \
        if "single_class" in mine else pd.Series(False, index=mine.index)  # bools, or their text from a CSV
    single = mine[flagged]
    mean, low, high = mean_ci(original) if len(original) else (float("nan"),) * 3
    base = float(baseline.iloc[0]) if len(baseline) else float("nan")
    if pd.isna(base) or not len(original):
        verdict = "—"
    elif len(original) < 2:
        verdict = "one seed: no interval"
    else:  # the claims engine's inclusion rule (Student-t interval over seeds above the baseline), not a copy of it
        from . import claims

        verdict = "clearly above" if task in claims.informative_tasks(mine)[0] else "not clearly above"
    seeds: dict[str, set[int]] = {}
    for _, r in single.iterrows():
        seeds.setdefault(_variant_name(r), set()).add(int(r["seed"]))
    names = [f"{name} (seed{'s' * (len(s) > 1)} {', '.join(map(str, sorted(s)))})" for name, s in sorted(seeds.items())]
    return {"task": task, "metric": mine["metric"].iloc[0], "seeds": len(original),
            "original": figures.format_mean_ci(mean, low, high, len(original), digits=3),
            "95% CI": "—" if len(original) < 2 else f"[{figures.fixed(low)}, {figures.fixed(high)}]",
            "majority baseline": "—" if pd.isna(base) else f"{base:.3f}", "verdict": verdict,
            "single-class probes": f"{len(single)} of {len(mine)}" + (": " + ", ".join(names) if names else ""),
            **_accuracy_columns(mine)}


def _majority_table(rows: list[dict]) -> pd.DataFrame:
    table = pd.DataFrame(rows)
    for column in ("original accuracy", "majority accuracy"):
        if column in table:
            table[column] = table[column].fillna("—")  # tasks whose records carry no accuracy
    return table.set_index("task") if rows else pd.DataFrame()


def against_majority(frame: pd.DataFrame, tasks: Sequence[str] | None = None) -> pd.DataFrame:
    """Per task: the original probe's mean score with its 95% Student-t interval over seeds, the metric of always
    predicting the validation set's most frequent class (records' ``majority_baseline``), whether the interval lies
    above it (*clearly above*: its low end is higher), and the runs whose validation predictions were all one class
    (records' ``single_class``), any variant. Where records carry the plain accuracy (``accuracy``, or
    ``token_accuracy`` for NER and POS) and the majority class's share (``majority_accuracy``), two more columns set the
    original's accuracy against it: for F1 and MCC, a probe can learn the task while its metric stays near guessing.
    Records of several models give one row per (model, task)."""
    several = "model" in frame and frame["model"].nunique() > 1
    groups = frame.groupby("model", sort=False) if several else [(None, frame)]
    rows = [({"model": model} if several else {}) | _majority_row(task, mine[mine["task"] == task])
            for model, mine in groups for task in figures._ordered_tasks(mine["task"].unique())
            if tasks is None or task in tasks]
    table = _majority_table(rows)
    return table.set_index("model", append=True).swaplevel() if several and rows else table


def majority_view(table: pd.DataFrame) -> tuple[pd.DataFrame, Any]:
    """:func:`against_majority` (or :func:`more_seeds`) as the chapter shows it, narrow enough for the page: metrics
    by name, the original's score as "mean ± half-width" (the interval's ends stay in ``table`` for the text), the
    original's plain accuracy beside the majority class's share in one cell, and single-class probes counted, with
    the runs they name in a note under the table."""
    if table.empty:
        return table, _markdown("")
    shown = table.drop(columns=["95% CI"], errors="ignore").copy()
    shown["metric"] = shown["metric"].map(lambda m: METRIC_NAMES.get(m, m))
    if {"original accuracy", "majority accuracy"} <= set(shown.columns):  # one column: the page has no room for two
        pair = [f"{o} vs {m}" if o != MISSING else MISSING
                for o, m in zip(shown.pop("original accuracy"), shown.pop("majority accuracy"))]
        shown.insert(len(shown.columns) - ("in the grid" in shown) - ("run" in shown),
                     "accuracy: original vs majority class", pair)
    counts = shown["single-class probes"].str.partition(": ")
    shown["single-class probes"] = counts[0]
    named = [f"{' '.join(map(str, key)) if isinstance(key, tuple) else key}: {names}"
             for key, names in zip(shown.index, counts[2]) if names]
    note = ("Single-class probes (validation predictions all one class), by variant and seed: "
            + "; ".join(named) + ".") if named else ""
    return shown, _markdown(note)


def more_seeds(frame: pd.DataFrame, results_dir: str | Path, folders: Sequence[str] = MORE_SEEDS_FOLDERS
               ) -> pd.DataFrame:
    """:func:`against_majority` for diagnostic runs beside ``results_dir`` (``folders``) that repeat a task's original
    probe with more seeds than the grid had, for the tasks and models of ``frame``, with how many of its runs the grid
    holds too (column "in the grid": same run id, and whether the score is the same). A t-interval over three seeds is
    mean ± 4.30 sd/√3: too wide to resolve a small gap over the majority class that more seeds can resolve."""
    rows = []
    for folder in folders:
        extra = diagnostic_records(results_dir, folder)
        if frame.empty or extra.empty:
            continue
        extra = extra[extra["model"].isin(set(frame["model"])) & extra["task"].isin(set(frame["task"]))]
        for task in figures._ordered_tasks(extra["task"].unique()):
            mine = extra[extra["task"] == task]
            rows.append(_majority_row(task, mine) | {"run": folder, "in the grid": _shared_runs(mine, frame)})
    return _majority_table(rows)


def _shared_runs(extra: pd.DataFrame, frame: pd.DataFrame) -> str:
    """How many of a diagnostic's runs the grid's records hold too (same run id) and whether their scores are equal:
    "8 of 8, same scores", "2 of 8, scores differ" or "none"."""
    grid = frame.drop_duplicates("run_id").set_index("run_id")["value"]
    shared = extra[extra["run_id"].isin(grid.index)]
    if shared.empty:
        return "none"
    same = bool((shared.set_index("run_id")["value"] == grid.loc[shared["run_id"]]).all())
    return f"{len(shared)} of {len(extra)}, {'same scores' if same else 'scores differ'}"


@prose.values("ms_task", "ms_grid_seeds", "ms_grid_score", "ms_grid_verdict", "ms_grid_majority", "ms_seeds",
              "ms_run", "ms_score", "ms_ci", "ms_verdict", "ms_majority", "ms_shared")
def more_seeds_values(grid: pd.DataFrame, more: pd.DataFrame) -> dict[str, str]:
    """:func:`more_seeds`'s numbers for the chapter's text (glued with myst-nb), beside the grid's own row of the same
    task (:func:`against_majority`): seeds, score, interval, the majority baseline and the verdict against it
    ("clearly above" or not), for the first task of the diagnostic runs (the local run has one, MRPC); "not
    measured" where there is no such run."""
    out = prose.not_measured(more_seeds_values)
    if more.empty:
        return out
    task, row = next(iter(more.iterrows()))
    out |= {"ms_task": str(task), "ms_seeds": str(row.seeds), "ms_run": str(row.run), "ms_score": str(row.original),
            "ms_ci": str(row["95% CI"]), "ms_verdict": str(row.verdict), "ms_majority": str(row["majority baseline"]),
            "ms_shared": str(row["in the grid"])}
    if task in grid.index:
        mine = grid.loc[task]
        out |= {"ms_grid_seeds": str(mine.seeds), "ms_grid_score": str(mine.original),
                "ms_grid_verdict": str(mine.verdict), "ms_grid_majority": str(mine["majority baseline"])}
    return out


def _accuracy_columns(mine: pd.DataFrame) -> dict:
    """The original probe's accuracy (mean and interval over seeds) and the majority class's, if records carry them."""
    from ..experiments.results import mean_ci

    column = next((c for c in ("accuracy", "token_accuracy") if c in mine and mine[c].notna().any()), None)
    original = mine[mine["matrix_type"] == "original"]
    values = original[column].dropna() if column else pd.Series(dtype=float)
    share = original["majority_accuracy"].dropna() if "majority_accuracy" in original else pd.Series(dtype=float)
    if not len(values) or not len(share):
        return {}
    mean, low, high = mean_ci(values)
    return {"original accuracy": figures.format_mean_ci(mean, low, high, len(values), digits=3),
            "majority accuracy": f"{float(share.iloc[0]):.3f}"}


HEADLINE_CLAIMS = ("C1a", "C1b", "C2")


def _headline_claims(frame: pd.DataFrame, tasks: Sequence[str] | None) -> pd.DataFrame:
    """The engine's rows of Sec. 4.2's claims (:func:`papa_lib.book.claims.claims_table`) for these records."""
    from . import claims

    shown = frame[frame["task"].isin(tasks)] if tasks is not None else frame
    table = claims.claims_table(shown) if len(shown) else pd.DataFrame(columns=claims.COLUMNS)
    return table[table["claim"].isin(HEADLINE_CLAIMS)]


def headline(frame: pd.DataFrame, tasks: Sequence[str] | None = None) -> pd.DataFrame:
    """Sec. 4.2's claims (C1a, C1b, C2) as the claims engine decides them, the same rows as the intro's table and
    ``claims.csv``: model, the paper's value, ours with its 95% interval, the tasks, the verdict, and ours with its
    verdict with every task included ("same" where that changes nothing; :mod:`papa_lib.book.claims`). Each claim's
    statistic, the same for every model, is in :func:`headline_text`'s sentences, not repeated on every row."""
    from . import claims

    table = _headline_claims(frame, tasks)
    every = ["same" if (all_in := claims.every_task_text(r)) is None else
             f"{all_in}, {r.verdict_all_tasks}" if pd.notna(r.ours_all_tasks) else r.verdict_all_tasks
             for _, r in table.iterrows()]
    return pd.DataFrame({"claim": table["claim"], "model": table["model"], "paper": table["paper"],
                         "ours [95% interval]": [claims.ours_text(r) for _, r in table.iterrows()],
                         "tasks": table["tasks"], "verdict": table["verdict"],
                         "with every task": every}).set_index("claim")


def headline_text(frame: pd.DataFrame, tasks: Sequence[str] | None = None) -> Any:
    """Sec. 4.2's claims in sentences: each is :func:`papa_lib.book.claims.verdict_sentence` of the engine's row
    (the same verdict as the intro's table), for the records' model(s)."""
    from . import claims

    table = _headline_claims(frame, tasks)
    if table.empty or not table["ours"].notna().any():
        return _markdown("There are no all-constant results in the table yet, so the headline numbers cannot "
                         "be checked.")
    who = describe(frame)
    sentences = [claims.verdict_sentence(row.claim, table, row.model) for row in table.itertuples()]
    return _markdown(f"Records: {who['model']} ({who['data']}, profile {who['profile']}).\n\n"
                     + "\n\n".join(f"- {s}" for s in sentences))


def training_note(setup, spec, model) -> Any:
    """How this run's probes were trained (model size, training sets, seeds from the grid file), against the
    paper's six models, full training sets and three seeds."""
    from ..core.models import num_layers_and_heads
    from .profiles import training_description

    layers, heads = num_layers_and_heads(model)
    how = (training_description(spec) if spec.get("blocks") else
           "(the grid file, which fixes training-set sizes and seeds, is not available here)")
    text = (f"This run probes **{setup.model_label}** ({layers} layers x {heads} heads, hidden size "
            f"{model.config.hidden_size}, {_parameters(model):,} parameters) {how}. ")
    if setup.profile == "smoke":
        text += ("The smoke profile's tiny random model on generated data only shows that the pipeline runs; its "
                 "numbers mean nothing. ")
    text += "The `paper` profile (chapter *Reproducing at scale*) is the like-for-like check."
    return _markdown(text)
