"""The norm chapter's figures and tables for norm-aware PAPA (book/norms.md, second half), one call each, from the
norm-aware grid's records and PAPA's own (:func:`papa_lib.book.norms_pages.norm_aware_results`).

* :func:`missing_runs`: the compared settings that still lack seeds;
* :func:`distance_chart`, :func:`distance_values`, :func:`changed_head_chart`: how far norm-weighted constant matrices
  are from plain ones (total variation per head);
* :func:`matrix_chart`, :func:`matrix_verdicts`, :func:`matrix_values`: every head constant, norm-weighted vs plain;
* :func:`order_chart`, :func:`order_table`, :func:`order_values`: label-free head orders vs PAPA's λ;
* :func:`head_scores`, :func:`agreement_table`, :func:`rank_chart`, :func:`agreement_values`: do the label-free scores
  rank heads as λ does.

Figures are labelled from the records they plot (:func:`papa_lib.book.charts.records_title`) and fit the book's
content column.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import pandas as pd

from . import charts, figures, norms_pages, prose
from .display import markdown as _markdown
from .tables import plural, task_name

__all__ = ["ORDER_NAMES", "agreement_table", "agreement_values", "changed_head_chart", "distance_chart",
           "distance_values", "head_scores", "matrix_chart", "matrix_values", "matrix_verdicts", "missing_runs",
           "order_chart", "order_table", "order_values"]

MATRIX_NAMES = {"original": "original attention", "average": "plain averages C (PAPA)",
                "norm_average": "norm-weighted N"}
#: The orders' short names in tables and the chapter's text.
SHORT_NAMES = {"lambda": "λ", "attention_variance": "attention variance", "norm_variance": "norm-weighted variance"}


def _short(text: str) -> str:
    """A column or cell naming orders (``"attention_variance - lambda"``, ``"lambda = norm_variance"``) in the orders'
    short names (``"attention variance − λ"``)."""
    return " ".join(SHORT_NAMES.get(word, "−" if word == "-" else word) for word in str(text).split(" "))


ORDER_NAMES = {"lambda": "λ (PAPA, learned with labels)", "attention_variance": "attention variance (label-free)",
               "norm_variance": "norm-weighted variance (label-free)"}


#: Axis labels of the paper's fractions (1, 1/2, 1/8, 1/16, 0) on a quantitative axis.
FRACTION_LABELS = ("datum.value == 0.0625 ? '1/16' : datum.value == 0.125 ? '1/8' : "
                   "datum.value == 0.5 ? '1/2' : datum.value == 1 ? '1' : datum.value == 0 ? '0' : datum.label")


def _both(norm_frame: pd.DataFrame, frame: pd.DataFrame) -> pd.DataFrame:
    frames = [f for f in (norm_frame, frame) if f is not None and len(f)]
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def missing_runs(norm_frame, frame, tasks, ranking_tasks, seeds) -> Any:
    """The compared settings that lack seeds (:func:`papa_lib.book.norms_pages.missing_norm_runs`), or "None"."""
    missing = norms_pages.missing_norm_runs(norm_frame, frame, tasks, ranking_tasks, seeds)
    if missing.empty:
        return _markdown("None: every compared setting has all its seeds.")
    return missing.style.set_caption(f"{len(missing)} settings lack seeds (the grids may still be running); the "
                                     "figures below show what exists.")


def _matrices(folder, task):
    plain = norms_pages.find_constant_matrices(folder, task, "average")
    weighted = norms_pages.find_constant_matrices(folder, task, "norm_average")
    return (plain, weighted) if plain is not None and weighted is not None else (None, None)


def _distance(folder, task):
    from ..analysis import norm_rankings

    plain, weighted = _matrices(folder, task)
    if plain is None:
        return None, None, None
    return plain, weighted, norm_rankings.matrix_total_variation(weighted, plain)


def _no_matrices(setup, folder, task) -> Any:
    return _markdown(f"The {task} matrices are not in `{os.path.relpath(folder, setup.root)}/matrices` yet.")


def _matrix_label(setup, norm_frame, task: str, plain) -> dict:
    from .records import describe

    who = describe(norm_frame, model=setup.model_label, profile=setup.profile)
    return {"model": who["model"], "profile": who["profile"],
            "data": f"{task_name(task)} training text, {plain.metadata.get('num_examples')} examples (stored matrices)"}


def distance_chart(setup, norm_frame, folder, task: str) -> Any:
    """Per head, the total-variation distance between the norm-weighted and the plain constant matrix
    (:func:`papa_lib.analysis.norm_rankings.matrix_total_variation`)."""
    import altair as alt

    plain, _, tv = _distance(folder, task)
    if tv is None:
        return _no_matrices(setup, folder, task)
    return alt.Chart(tv).mark_rect().encode(
        x=alt.X("head:O"), y=alt.Y("layer:O"),
        color=alt.Color("total_variation:Q", title="TV distance",
                        scale=alt.Scale(scheme="oranges", domain=[0, 1])),
        tooltip=["layer:O", "head:O", alt.Tooltip("total_variation:Q", format=".3f")],
    ).properties(width=420, height=alt.Step(26), title=charts.chart_title(
        f"Norm-weighted vs plain constant matrices ({task_name(task)} training text)",
        **_matrix_label(setup, norm_frame, task, plain)))


@prose.values("dist_heads", "dist_mean", "dist_median", "dist_worst_head", "dist_worst")
def distance_values(folder, task: str) -> dict[str, str]:
    """The distance's numbers for the chapter's text (glued with myst-nb): mean and median over the heads, and the
    most changed head ("layer L, head H") with its distance; "not measured" where the matrices are not saved."""
    _, _, tv = _distance(folder, task)
    if tv is None:
        return prose.not_measured(distance_values)
    worst = tv.loc[tv["total_variation"].idxmax()]
    return {"dist_heads": str(len(tv)), "dist_mean": prose.number(tv["total_variation"].mean(), ".3f"),
            "dist_median": prose.number(tv["total_variation"].median(), ".3f"),
            "dist_worst_head": f"layer {int(worst['layer'])}, head {int(worst['head'])}",
            "dist_worst": prose.number(worst["total_variation"], ".3f")}


def changed_head_chart(setup, norm_frame, folder, task: str, min_share: float = 0.05) -> Any:
    """The most changed head's two constant matrices, over the positions that are real in at least ``min_share``
    of the averaged inputs."""
    import altair as alt
    import torch

    plain, weighted, tv = _distance(folder, task)
    if tv is None:
        return _no_matrices(setup, folder, task)
    worst = tv.loc[tv["total_variation"].idxmax()]
    layer, head = int(worst["layer"]), int(worst["head"])
    threshold = min_share * plain.metadata.get("num_examples", 1)
    used = torch.nonzero(torch.diagonal(plain.counts) >= threshold).flatten().tolist()
    cells = []
    for name, constants in (("plain average C", plain), ("norm-weighted N", weighted)):
        block = constants.matrices[layer, head][used][:, used].numpy()
        cells += [{"matrix": name, "query": q, "key": k, "weight": float(block[a, b])}
                  for a, q in enumerate(used) for b, k in enumerate(used)]
    return alt.Chart(pd.DataFrame(cells)).mark_rect().encode(
        x=alt.X("key:O", title="key position", axis=alt.Axis(labelFontSize=7)),
        y=alt.Y("query:O", title="query position", axis=alt.Axis(labelFontSize=7)),
        color=alt.Color("weight:Q", scale=alt.Scale(scheme="blues", type="sqrt")),
        tooltip=["matrix:N", "query:O", "key:O", alt.Tooltip("weight:Q", format=".3f")],
    ).properties(width=220, height=220).facet(
        column=alt.Column("matrix:N", title=None, sort=["plain average C", "norm-weighted N"])).properties(
        title=charts.chart_title(f"Layer {layer}, head {head}, {task_name(task)} training text",
                                 **_matrix_label(setup, norm_frame, task, plain)))


def matrix_chart(norm_frame, frame, tasks: Sequence[str]) -> Any:
    """Every head constant: validation score (mean, 95% interval) with norm-weighted vs plain matrices, and the
    original model, one row per task (:func:`papa_lib.book.norms_pages.matrix_comparison`)."""
    import altair as alt

    table = norms_pages.matrix_comparison(norm_frame, frame, tasks)
    if table.empty:
        return _markdown("No runs to compare yet.")
    table = table.assign(matrices=table["matrix_type"].map(MATRIX_NAMES))
    points = alt.Chart().encode(
        y=alt.Y("matrices:N", sort=list(MATRIX_NAMES.values()), title=None),
        color=alt.Color("matrices:N", sort=list(MATRIX_NAMES.values()), legend=None))
    layers = alt.layer(
        points.mark_point(filled=True, size=80).encode(
            x=alt.X("mean:Q", title="validation score", scale=alt.Scale(zero=False)),
            tooltip=["task:N", "matrices:N", alt.Tooltip("mean:Q", format=".3f"),
                     alt.Tooltip("ci_low:Q", format=".3f"), alt.Tooltip("ci_high:Q", format=".3f"), "n:Q"]),
        points.mark_errorbar().encode(x=alt.X("ci_low:Q", title="validation score"), x2="ci_high:Q"),
        data=table)
    return layers.properties(width=360, height=alt.Step(22)).facet(
        row=alt.Row("task:N", title=None, sort=list(tasks))).resolve_scale(x="independent").properties(
        title=charts.records_title("Every head constant: norm-weighted vs plain matrices",
                                   _both(norm_frame, frame)))


def matrix_verdicts(norm_frame, frame, tasks: Sequence[str]) -> pd.DataFrame:
    """Per task: plain and norm-weighted scores (mean ± CI), their difference, a verdict from the intervals, and
    the share of the loss (original - plain) that the norm-weighted matrices recover."""
    table = norms_pages.matrix_comparison(norm_frame, frame, tasks)
    rows = []
    for task in tasks:
        part = table[table["task"] == task].set_index("matrix_type") if not table.empty else table
        if table.empty or not {"average", "norm_average"} <= set(part.index):
            rows.append({"task": task, "verdict": "not run yet"})
            continue
        plain, weighted = part.loc["average"], part.loc["norm_average"]
        if weighted["ci_low"] > plain["ci_high"]:
            word = "norm-weighted better"
        elif plain["ci_low"] > weighted["ci_high"]:
            word = "plain average better"
        else:
            word = "intervals overlap"
        row = {"task": task,
               "plain average C": figures.format_mean_ci(plain["mean"], plain["ci_low"], plain["ci_high"],
                                                         int(plain["n"]), 3),
               "norm-weighted N": figures.format_mean_ci(weighted["mean"], weighted["ci_low"], weighted["ci_high"],
                                                         int(weighted["n"]), 3),
               "N - C": weighted["mean"] - plain["mean"], "verdict": word}
        if "original" in part.index:
            gap = part.loc["original", "mean"] - plain["mean"]
            row["share of the loss recovered"] = (f"{(weighted['mean'] - plain['mean']) / gap:.0%}" if gap > 0
                                                  else "no loss to recover (plain ≥ original)")
        rows.append(row)
    return pd.DataFrame(rows).set_index("task")


@prose.values("mat_tasks", "mat_higher", "mat_lower", "mat_same", "mat_mean_difference", "mat_verdicts")
def matrix_values(norm_frame, frame, tasks: Sequence[str]) -> dict[str, str]:
    """:func:`matrix_verdicts`' numbers for the chapter's text (glued with myst-nb): on how many tasks with both matrix
    types the norm-weighted ones score higher, lower and the same, the mean difference N - C, and each verdict of the
    table with its count; "not measured" where no task has both."""
    table = matrix_verdicts(norm_frame, frame, tasks)
    if "N - C" not in table or table["N - C"].isna().all():
        return prose.not_measured(matrix_values)
    done = table.dropna(subset=["N - C"])
    better, worse = int((done["N - C"] > 0).sum()), int((done["N - C"] < 0).sum())
    return {"mat_tasks": plural(len(done), "task"), "mat_higher": str(better), "mat_lower": str(worse),
            "mat_same": str(len(done) - better - worse),
            "mat_mean_difference": prose.number(done["N - C"].mean(), "+.3f"),
            "mat_verdicts": ", ".join(f"{v} x{c}" for v, c in done["verdict"].value_counts().items())}


def _curves(norm_frame, frame, tasks):
    curves = norms_pages.label_free_comparison(norm_frame, frame, tasks)
    if curves.empty:
        return curves
    return curves.assign(**{"order name": curves["order"].map(ORDER_NAMES),
                            "fraction label": curves["fraction"].map(figures.fraction_label)})


def order_chart(norm_frame, frame, tasks: Sequence[str]) -> Any:
    """Score vs fraction of input-dependent heads per task, one line per head order (λ and the label-free scores;
    plain averages), with 95% intervals."""
    import altair as alt

    curves = _curves(norm_frame, frame, tasks)
    if curves.empty:
        return _markdown("No runs to compare yet.")
    pick = alt.selection_point(fields=["order name"], bind="legend")
    base = alt.Chart().encode(
        # 1 -> 0 from left to right, as in Fig. 2 and Fig. 5
        x=alt.X("fraction:Q", scale=alt.Scale(type="symlog", constant=0.05, reverse=True),
                title="fraction of input-dependent heads",
                axis=alt.Axis(values=[0, 0.0625, 0.125, 0.5, 1], labelExpr=FRACTION_LABELS)),
        color=alt.Color("order name:N", title="head order", sort=list(ORDER_NAMES.values()),
                        legend=alt.Legend(labelLimit=320, orient="bottom", direction="vertical")),
        opacity=alt.condition(pick, alt.value(1.0), alt.value(0.15)))
    lines = base.mark_line(point=True).encode(
        y=alt.Y("mean:Q", title="validation score", scale=alt.Scale(zero=False)),
        tooltip=["task:N", "order name:N", "fraction label:N", alt.Tooltip("mean:Q", format=".3f"),
                 alt.Tooltip("ci_low:Q", format=".3f"), alt.Tooltip("ci_high:Q", format=".3f"), "n:Q", "source:N"])
    bars = base.mark_errorbar().encode(y=alt.Y("ci_low:Q", title="validation score"), y2="ci_high:Q")
    columns = min(2, curves["task"].nunique())
    return alt.layer(lines, bars, data=curves).add_params(pick).properties(
        width=charts.panel_width(columns, axis=70), height=220).facet(
        facet=alt.Facet("task:N", title=None, sort=list(tasks)), columns=columns).resolve_scale(
        y="independent").properties(title=charts.records_title("Which heads to replace: λ vs label-free scores",
                                                               _both(norm_frame, frame)))


def _order_wide(norm_frame, frame, tasks):
    curves = _curves(norm_frame, frame, tasks)
    inner = curves[curves["fraction"].between(0, 1, inclusive="neither")] if not curves.empty else curves
    if inner.empty:
        return None, 0
    wide = inner.pivot_table(index=["task", "fraction"], columns="order", values="mean")
    incomplete = int(wide.isna().any(axis=1).sum())
    wide = wide.dropna()  # compare only where every order has been run
    scores = wide.copy()
    wide["best"] = [" = ".join(o for o in scores.columns if abs(row[o] - row.max()) < 1e-9)
                    for _, row in scores.iterrows()]
    for order in ("attention_variance", "norm_variance"):
        if order in wide and "lambda" in wide:
            wide[f"{order} - lambda"] = wide[order] - wide["lambda"]
    return wide, incomplete


def order_table(norm_frame, frame, tasks: Sequence[str]) -> Any:
    """Per (task, intermediate fraction) where every order ran: each order's score, the best, and each
    label-free order minus λ."""
    wide, _ = _order_wide(norm_frame, frame, tasks)
    if wide is None:
        return _markdown("No intermediate fractions to compare yet.")
    shown = wide.round(3).rename(columns=_short).rename_axis(columns="order")
    shown["best"] = shown["best"].map(_short)
    return shown


@prose.values("ord_incomplete", "ord_comparisons", "ord_wins", "ord_attention_mean", "ord_attention_min",
              "ord_attention_max", "ord_norm_mean", "ord_norm_min", "ord_norm_max")
def order_values(norm_frame, frame, tasks: Sequence[str]) -> dict[str, str]:
    """:func:`order_table`'s numbers for the chapter's text (glued with myst-nb): how many (task, fraction) points
    lack an order, over how many points every order ran, how often each order is best ("order xN", "=" for ties),
    and the mean and range of each label-free order's score minus λ's; "not measured" where there is none."""
    wide, incomplete = _order_wide(norm_frame, frame, tasks)
    out = prose.not_measured(order_values)
    if wide is None:
        return out
    out |= {"ord_incomplete": str(incomplete), "ord_comparisons": str(len(wide)),
            "ord_wins": ", ".join(f"{_short(o)} x{c}" for o, c in wide["best"].value_counts().items())}
    for order, short in (("attention_variance", "attention"), ("norm_variance", "norm")):
        column = wide[f"{order} - lambda"] if f"{order} - lambda" in wide else pd.Series(dtype=float)
        out |= {f"ord_{short}_{stat}": prose.number(getattr(column, stat)(), "+.3f") for stat in ("mean", "min", "max")}
    return out


def head_scores(setup, model, tokenizer, folder, tasks: Sequence[str], recompute: bool) -> pd.DataFrame | None:
    """Per head and task: the two label-free scores and λ (:func:`papa_lib.book.norms_pages.head_score_table`),
    recomputed and saved to ``<folder>/analysis/head_scores.csv`` when ``recompute``, else read from it (None when
    there is no such file)."""
    from ..analysis import norm_rankings

    path = folder / "analysis" / "head_scores.csv"
    if recompute:
        spec = norm_rankings.norm_aware_grid(setup.grid())
        if setup.data_dir is not None:
            spec["data_dir"] = str(setup.data_dir)
        lambdas = (folder if setup.profile == "smoke" else setup.results_dir) / "lambdas"
        table = norms_pages.head_score_table(model, tokenizer, spec, tasks, lambdas_dir=lambdas)
        path.parent.mkdir(parents=True, exist_ok=True)
        table.to_csv(path, index=False)
    return pd.read_csv(path) if path.exists() else None


def agreement_table(scores: pd.DataFrame | None) -> Any:
    """Spearman rho between every pair of head scores per task (:func:`papa_lib.book.norms_pages.score_agreement`)."""
    if scores is None:
        return _markdown("No head scores saved yet.")
    agreement = norms_pages.score_agreement(scores).round(3)
    return agreement.assign(first=agreement["first"].map(_short), second=agreement["second"].map(_short))


def rank_chart(scores: pd.DataFrame | None, norm_frame: pd.DataFrame) -> Any:
    """Per task and label-free score: each head's rank by λ against its rank by the score (labelled from the
    norm-aware records of the same tasks, whose training subsets the scores are computed on)."""
    import altair as alt

    from ..analysis import norm_rankings

    if scores is None:
        return _markdown("")
    ranks = scores.copy()
    for column in ("lambda", *norm_rankings.NORM_AWARE_ORDERS):
        ranks[f"{column} rank"] = ranks.groupby("task")[column].rank()
    ranks = ranks.melt(id_vars=["task", "layer", "head", "lambda rank"],
                       value_vars=[f"{o} rank" for o in norm_rankings.NORM_AWARE_ORDERS], var_name="score",
                       value_name="label-free rank").dropna()
    if ranks.empty:
        return _markdown("No learned λ found for these tasks yet; only the label-free scores are saved.")
    columns = max(1, ranks["task"].nunique())
    return alt.Chart(ranks).mark_circle(size=45, opacity=0.7).encode(
        x=alt.X("lambda rank:Q", title="rank by λ (1 = replaced first)"),
        y=alt.Y("label-free rank:Q", title="rank by the label-free score"),
        color=alt.Color("layer:O", scale=alt.Scale(scheme="viridis"), legend=alt.Legend(orient="bottom")),
        tooltip=["task:N", "layer:O", "head:O", "score:N", "lambda rank:Q", "label-free rank:Q"],
    ).properties(width=charts.panel_width(columns, axis=90), height=200).facet(
        row=alt.Row("score:N", title=None), column=alt.Column("task:N", title=None)).properties(
        title=charts.records_title("Head ranks: λ vs label-free scores",
                                   norm_frame[norm_frame["task"].isin(set(scores["task"]))]))


@prose.values("agr_rho")
def agreement_values(scores: pd.DataFrame | None) -> dict[str, str]:
    """λ against each label-free score, per task, for the chapter's text (glued with myst-nb): Spearman's ρ with its
    95% interval, "task: λ vs score ρ = r [low, high]" joined by "; "; "not measured" where no λ is saved."""
    if scores is None:
        return prose.not_measured(agreement_values)
    agreement = norms_pages.score_agreement(scores)
    lam = agreement[agreement["first"] == "lambda"].dropna(subset=["spearman_rho"])
    if lam.empty:
        return prose.not_measured(agreement_values)
    return {"agr_rho": "; ".join(f"{task_name(r.task)}: λ vs {_short(r.second)} ρ = {r.spearman_rho:.2f} "
                                 f"[{r.ci_low:.2f}, {r.ci_high:.2f}]" for r in lam.itertuples())}
