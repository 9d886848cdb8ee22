"""The alternative-matrices chapter's figures and tables (book/alternatives.md; paper Sec. 5.2, Tables 1 and 4).

* :func:`head_weights`: the weights each kind of constant head gives one input, computed by the override seam;
* :func:`table1`, :func:`table1_chart`: Table 1, ours beside the paper's (:func:`papa_lib.book.paper.captioned`);
* :func:`verdicts`, :func:`verdict_text`: does the average beat the data-free matrices (claim C4, as the claims
  engine decides it), task by task;
* :func:`premise_use`, :func:`premise_table`, :func:`premise_use_values`: on MNLI, the pair probe beside a probe
  that sees the hypothesis only (``data/results/mnli-hypothesis-only``), which bounds how far any constant matrix
  can fall below the original.

Figures are labelled from the records they plot (:func:`papa_lib.book.charts.records_title`) and fit the book's
content column.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from . import charts, figures, paper, prose
from .display import markdown as _markdown
from .records import describe, diagnostic_records, ours_label
from .tables import MISSING, interval_below, task_name

__all__ = ["head_weights", "premise_table", "premise_use", "premise_use_values", "table1", "table1_chart",
           "verdict_text", "verdicts"]

#: The diagnostic run beside a profile's results folder: MNLI's hypothesis column alone, original model.
HYPOTHESIS_ONLY_FOLDER = "mnli-hypothesis-only"

#: Whose data each kind of matrix needs (Table 1's first column), in legend order.
CONSTRUCTIONS = ["attention", "data-free", "labeled", "unlabeled"]


def _demo_matrices(setup, frame: pd.DataFrame, tasks: Sequence[str], lengths: dict):
    """The first task's stored average matrices for this model (``None`` when the grid saved none yet)."""
    from ..core.models import model_id

    model, _ = setup.encoder()
    for task in tasks:
        constants = figures.stored_matrices(setup.results_dir, task, lengths[task], model=model_id(model))
        if constants is not None:
            return task, constants
    return None, None


def head_weights(setup, frame: pd.DataFrame, tasks: Sequence[str], lengths: dict, real_tokens: int = 12) -> Any:
    """Heat maps of the weights that identity, Toeplitz, zeros and two average heads give one App. A input
    (``real_tokens`` - 1 tokens from position 0, padding, the final separator at L-1), computed with
    :meth:`papa_lib.core.override.AttentionOverride.head_weights`. The average heads are the stored matrices' most
    "diagonal" head and the head with most weight on L-1; without stored matrices only the data-free ones are drawn.
    """
    import altair as alt
    import torch

    from ..core.models import num_layers_and_heads
    from ..core.override import AttentionOverride

    model, _ = setup.encoder()
    _, heads = num_layers_and_heads(model)
    task, constants = _demo_matrices(setup, frame, tasks, lengths)
    length = constants.max_length if constants is not None else 16
    n_real = min(real_tokens, length // 2)
    real = torch.zeros(1, length, dtype=torch.bool)
    real[0, : n_real - 1] = True
    real[0, -1] = True
    positions = [p for p in range(length) if real[0, p]]
    names = {p: ("L-1" if p == length - 1 else str(p)) for p in positions}
    data_free = AttentionOverride(model, None, {(0, 0): "identity", (0, 1): "toeplitz", (0, 2): "zeros"})
    panels = [(label, 0, head, data_free) for head, label in enumerate(["identity", "Toeplitz", "zeros"])]
    if constants is not None:
        diagonal = figures.diagonal_mass(constants).sort_values("mass").iloc[-1]
        final = figures.column_mass(constants, length - 1).sort_values("mass").iloc[-1]
        for label, row in [("average: most diagonal", diagonal), ("average: most on L-1", final)]:
            layer, head = int(row["layer"]), int(row["head"])
            state = AttentionOverride(model, constants, {(layer, head): "constant"})
            panels.append((f"{label}: layer {layer}, head {head}", layer, head, state))
    cells = []
    for label, layer, head, state in panels:
        dummy = torch.full((1, heads, length, length), 1.0 / length)  # the model's own A, unused here
        with torch.no_grad():
            weights = state.head_weights(layer, dummy, real)[0, head]
        cells += [{"matrix": label, "query": names[q], "key": names[k], "weight": float(weights[q, k])}
                  for q in positions for k in positions]
    order = [names[p] for p in positions]
    ticks = order[:-1][::4] + order[-1:]  # every 4th real token and L-1: labels that never collide
    if constants is not None:
        count = constants.metadata.get("num_examples", 0)
        data = f"average matrices from {task_name(task)} text ({count:,} examples), L = {length}"
    else:
        data = f"data-free matrices only (no stored average matrices yet), L = {length}"
    described = describe(frame, model=setup.model_label, profile=setup.profile)
    cells = pd.DataFrame(cells)

    def row(labels):  # one row of panels, so no empty grid cell draws a stray axis
        return alt.Chart(cells[cells.matrix.isin(labels)]).mark_rect().encode(
            x=alt.X("key:O", sort=order, title="key position", axis=alt.Axis(labelAngle=0, values=ticks)),
            y=alt.Y("query:O", sort=order, title="query position", axis=alt.Axis(values=ticks)),
            color=alt.Color("weight:Q", scale=alt.Scale(scheme="blues", domain=[0, 1]), title="weight"),
            tooltip=["matrix:N", "query:N", "key:N", alt.Tooltip("weight:Q", format=".3f")],
        ).properties(width=125, height=125).facet(  # three panels and the legend fit the page column
            # long panel names ("average: most diagonal: layer 1, head 1") on several lines: no header widens it
            facet=alt.Facet("matrix:N", sort=labels, title=None,
                            header=alt.Header(labelExpr="split(datum.label, ': ')")), columns=len(labels))

    labels = [p[0] for p in panels]
    rows = [row(labels[:3])] + ([row(labels[3:])] if labels[3:] else [])  # data-free, then average heads
    return alt.vconcat(*rows).properties(title=charts.chart_title(
        f"The weights each kind of head uses on one input ({n_real} real tokens)",
        model=described["model"], data=data, profile=described["profile"]))


def table1(frame: pd.DataFrame, tasks: Sequence[str]) -> Any:
    """Our Table 1 (every head replaced, per matrix type and task, ``mean ± CI`` cells; ``—`` not run yet), with a
    caption naming the model, data and profile of the records. Rows are labelled as the chapter names the matrix
    types (one level per model when the records hold several); in HTML each cell's interval sits under its mean."""
    table = figures.matrix_type_table(frame, tasks=tasks)
    labels = [figures.MATRIX_TYPE_LABELS.get(m, m) for m in table.index.levels[-1]] \
        if table.index.nlevels > 1 else None
    table.index = table.index.set_levels(labels, level=-1) if labels else \
        table.index.map(lambda m: figures.MATRIX_TYPE_LABELS.get(m, m))
    who = describe(frame)
    return table.style.format(interval_below, na_rep=MISSING).set_caption(
        f"Ours — model: {who['model']}, data: {who['data']}, profile: {who['profile']}")


def table1_chart(frame: pd.DataFrame, tasks: Sequence[str], columns: int = 2) -> Any:
    """Table 1 as a chart: per task, every matrix type's score — ours as filled circles with their 95% intervals (one
    shape per model when the records hold several), the paper's RoBERTa-base as open diamonds
    (:func:`papa_lib.book.figures.with_paper`)."""
    import altair as alt

    ours = figures.matrix_type_summary(frame, tasks=tasks)
    label = ours_label(frame)
    both = figures.with_paper(ours, paper.table_long("table1"), "matrix_type", label)
    both["construction"] = both["matrix_type"].map(figures.CONSTRUCTION)
    both["matrix"] = both["matrix_type"].map(figures.MATRIX_TYPE_LABELS)
    rows = [figures.MATRIX_TYPE_LABELS[m] for m in figures.TABLE1_ORDER]
    pick = alt.selection_point(fields=["construction"], bind="legend")
    encode = dict(
        y=alt.Y("matrix:N", sort=rows, title=None, axis=alt.Axis(labelLimit=150)),
        color=alt.Color("construction:N", sort=CONSTRUCTIONS, title="matrix needs",
                        legend=alt.Legend(orient="bottom")),
        opacity=alt.condition(pick, alt.value(1.0), alt.value(0.15)),
    )
    tooltip = ["source:N", "model:N", "task:N", alt.Tooltip("matrix:N", title="matrix type"),
               alt.Tooltip("mean:Q", title="score", format=".3f"),
               alt.Tooltip("ci_low:Q", title="95% CI low", format=".3f"),
               alt.Tooltip("ci_high:Q", title="95% CI high", format=".3f"), alt.Tooltip("n:Q", title="seeds")]
    is_ours = alt.datum.source == label
    several = ours["model"].nunique() > 1 if len(ours) else False
    shape = {"shape": alt.Shape("model:N", title="ours: model",  # a column beside "matrix needs": both fit
                                legend=alt.Legend(orient="bottom", direction="vertical"))} if several else {}
    layers = [
        alt.Chart().transform_filter(is_ours).mark_rule(strokeWidth=2).encode(x="ci_low:Q", x2="ci_high:Q",
                                                                              **encode),
        alt.Chart().transform_filter(is_ours).mark_point(filled=True, size=70)
        .encode(x=alt.X("mean:Q", title="validation score"), tooltip=tooltip, **encode, **shape).add_params(pick),
        alt.Chart().transform_filter(~is_ours).mark_point(shape="diamond", size=80, filled=False, strokeWidth=2)
        .encode(x="mean:Q", tooltip=tooltip, **encode),
    ]
    order = [t for t in figures.PAPER_TASK_ORDER if t in set(both.task)]
    width = charts.panel_width(columns, axis=175)
    title = ("Table 1 as a chart: score with every head replaced (filled: ours; open diamonds: the paper's "
             "RoBERTa-base)")
    return (
        alt.layer(*layers, data=both)
        .properties(width=width, height=150)
        .facet(facet=alt.Facet("task:N", sort=order, title=None), columns=columns)
        .resolve_scale(x="independent")
        .properties(title=charts.records_title(title, frame))
    )


def verdicts(frame: pd.DataFrame, tasks: Sequence[str]) -> pd.DataFrame:
    """C4 task by task as the claims engine computes it (:func:`papa_lib.book.claims.data_free_margins`): per (model,
    task) the best data-free matrix, the average minus it with its seed-paired 95% interval (one cell), the task's
    verdict and whether the task enters C4. The labeled matrices' gaps are in :func:`verdict_text`."""
    from . import claims

    shown = frame[frame["task"].isin(tasks)]
    parts = [claims.data_free_margins(records).assign(model=model)
             for model, records in shown.groupby("model", sort=False)]
    if not parts or all(p.empty for p in parts):
        return pd.DataFrame()
    table = pd.concat(parts, ignore_index=True)
    return pd.DataFrame({
        "model": table["model"], "task": table["task"],
        "best data-free": table["best data-free"].map(lambda m: figures.MATRIX_TYPE_LABELS.get(m, m)),
        "average − best data-free [95% interval]": [
            f"{r.value:+.3f} [{r.low:.3f}, {r.high:.3f}]" for r in table.rename(columns={
                "average minus best data-free": "value", "ci_low": "low", "ci_high": "high"}).itertuples()],
        "verdict": table["verdict"],
        "enters C4": table["enters C4"].map({True: "yes", False: "no"}),
    }).set_index(["model", "task"])


def verdict_text(frame: pd.DataFrame, tasks: Sequence[str]) -> Any:
    """C4 in one sentence per model: the claims engine's row (:func:`papa_lib.book.claims.verdict_sentence`, the
    intro's verdict), then, per model that ran them, the gaps to the labeled matrices (means, descriptive)."""
    from . import claims

    shown = frame[frame["task"].isin(tasks)]
    if shown.empty:
        return _markdown("No records for these tasks yet, so the comparison cannot be made.")
    table = claims.claims_table(shown)
    rows = table[table["claim"] == "C4"]
    text = "\n\n".join(f"- {claims.verdict_sentence('C4', table, r.model)}" for r in rows.itertuples())
    labeled = figures.average_vs_data_free(figures.matrix_type_summary(shown, tasks=tasks))
    for model, gaps in (labeled.groupby("model", sort=False) if not labeled.empty else []):
        parts = []
        for column, name in [("minus_trainable_toeplitz", "Toeplitz-initialised"),
                             ("minus_trainable_average", "average-initialised")]:
            known = gaps.dropna(subset=[column])
            if len(known):
                parts.append(f"the {name} ones " + ", ".join(f"{r.task}: {getattr(r, column):+.3f}"
                                                           for r in known.itertuples()))
        if parts:
            text += (f"\n\nAgainst the labeled matrices, {model}'s average minus the trainable matrices (means over "
                     f"seeds; not one of the book's claims): {'; '.join(parts)}.")
    return _markdown(text)


def premise_use(frame: pd.DataFrame, results_dir: str | Path, folder: str | Path | None = None) -> pd.DataFrame:
    """MNLI's original probe on premise and hypothesis, the same probe on the hypothesis alone (records of the
    ``mnli-hypothesis-only`` run beside ``results_dir``, or ``folder``), every all-constant row of Table 1
    (:func:`papa_lib.book.figures.matrix_type_summary`, for the model of the hypothesis-only run) and the majority
    class: mean ± half-width of the 95% interval over seeds. Empty when either run is missing. If the pair adds little
    to the hypothesis alone, the probe uses little of the premise-hypothesis relation that attention across the two
    sentences would carry, and the all-constant rows have little room to differ."""
    from ..experiments.results import summarize

    hypothesis = diagnostic_records(results_dir, HYPOTHESIS_ONLY_FOLDER if folder is None else Path(folder).absolute())
    if hypothesis.empty or frame.empty:
        return pd.DataFrame()
    hypothesis = hypothesis[hypothesis["matrix_type"] == "original"]
    mnli = frame[(frame["task"] == "mnli") & frame["model"].isin(set(hypothesis["model"]))]
    pair = figures.matrix_type_summary(mnli, tasks=["mnli"])
    if not (pair["matrix_type"] == "original").any():
        return pd.DataFrame()
    pair = pair.assign(probe=[f"pair: every head {figures.MATRIX_TYPE_LABELS.get(kind, kind)}"
                              if kind != "original" else "pair: original" for kind in pair["matrix_type"]])
    alone = summarize(hypothesis, ["matrix_type"]).assign(probe="hypothesis alone: original")
    rows = pd.concat([pair[pair["matrix_type"] == "original"], alone, pair[pair["matrix_type"] != "original"]])
    table = pd.DataFrame({"probe": rows["probe"], "seeds": rows["n"], "accuracy": rows["mean"],
                          "ci_low": rows["ci_low"], "ci_high": rows["ci_high"],
                          "shown": [figures.format_mean_ci(m, lo, hi, n, digits=3)
                                    for m, lo, hi, n in zip(rows["mean"], rows["ci_low"], rows["ci_high"], rows["n"])]})
    baseline = mnli["majority_baseline"].dropna() if "majority_baseline" in mnli else pd.Series(dtype=float)
    if len(baseline):
        value = float(baseline.iloc[0])
        table.loc[len(table)] = {"probe": "majority class", "seeds": 0, "accuracy": value, "ci_low": value,
                                 "ci_high": value, "shown": f"{value:.3f}"}
    return table.reset_index(drop=True).set_index("probe").round(3)


def premise_table(table: pd.DataFrame) -> pd.DataFrame:
    """:func:`premise_use` as the chapter shows it: per probe the seeds and one "mean ± half-width" cell (the
    majority class has no seeds); the full table keeps the interval's ends for the text's numbers."""
    if table.empty:
        return table
    return pd.DataFrame({"seeds": [MISSING if probe == "majority class" else str(int(n))
                                   for probe, n in zip(table.index, table["seeds"])],
                         "accuracy, mean ± 95% half-width": table["shown"]}, index=table.index)


@prose.values("pu_gap", "pu_pair", "pu_alone", "pu_const_min", "pu_const_max", "pu_below", "pu_kinds",
              "pu_spread", "pu_widest", "pu_spread_vs_widest")
def premise_use_values(table: pd.DataFrame) -> dict[str, str]:
    """:func:`premise_use`'s numbers for the chapter's text (glued with myst-nb): what the premise adds to the original
    probe, the range of the pair probe with every head constant, how many constant kinds land below the
    hypothesis-only probe, and the span of their means against the widest interval's half-width ("less than" or
    "not less than"); "not measured" where there is no hypothesis-only run."""
    out = prose.not_measured(premise_use_values)
    if table.empty:
        return out
    pair, alone = table.loc["pair: original"], table.loc["hypothesis alone: original"]
    out |= {"pu_gap": prose.number(pair.accuracy - alone.accuracy, "+.3f"), "pu_pair": pair.shown,
            "pu_alone": alone.shown}
    constants = table[table.index.str.startswith("pair: every head")]
    if not constants.empty:
        spread = constants.accuracy.max() - constants.accuracy.min()
        widest = float(((constants.ci_high - constants.ci_low) / 2).max())
        out |= {"pu_const_min": prose.number(constants.accuracy.min(), ".3f"),
                "pu_const_max": prose.number(constants.accuracy.max(), ".3f"),
                "pu_below": str(int((constants.accuracy < alone.accuracy).sum())), "pu_kinds": str(len(constants)),
                "pu_spread": prose.number(spread, ".3f"), "pu_widest": prose.number(widest, ".3f"),
                "pu_spread_vs_widest": "less than" if spread < widest else "not less than"}
    return out
