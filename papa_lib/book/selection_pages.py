"""The head-selection chapter's figures and tables (book/selection.md; paper Sec. 3.2 Eq. 3, Sec. 5.4, Fig. 5).

* :func:`lambda_maps`, :func:`lambda_table`, :func:`lambda_values`: the learned λ of a results folder
  (:func:`papa_lib.analysis.patterns.read_lambda_files`) and the replacement order they imply;
* :func:`fig5`, :func:`fig5_missing`, :func:`order_ranking`, :func:`order_text`: the five head-selection orders on
  MNLI (:func:`papa_lib.analysis.patterns.order_curves`, :func:`papa_lib.analysis.patterns.compare_orders`).

Figures are labelled from the records they plot and fit the book's content column.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pandas as pd

from . import charts, prose
from .display import markdown as _markdown
from .records import describe
from .tables import task_name

__all__ = ["ORDER_NAMES", "fig5", "fig5_missing", "lambda_maps", "lambda_table", "lambda_values",
           "order_ranking", "order_text"]

#: The orders of Fig. 5 as the chapter names them.
ORDER_NAMES = {"lambda": "λ (smallest first)", "reversed": "reversed λ", "first_to_last": "first layer → last",
               "last_to_first": "last layer → first", "random": "random"}
_FRACTION_LABELS = {1.0: "1", 0.5: "1/2", 0.125: "1/8", 0.0625: "1/16", 0.0: "0"}
_KEPT = {1.0: "1 (replaced first)", 0.5: "1/2", 0.125: "1/8", 0.0625: "1/16"}


def _lambdas(setup, others: Mapping[Path, pd.DataFrame] | None = None) -> pd.DataFrame:
    """The λ files of the profile's results folder and, with ``others`` (folder -> records,
    :func:`papa_lib.book.records.other_local_models`), those of the other models' folders, one row per head; ``run``
    names the file as a reader picks it (with its model first when there are several models)."""
    from ..analysis import patterns

    folders = [(setup.model_label, setup.results_dir)] + [
        (str(records["model"].iloc[0]), folder) for folder, records in (others or {}).items() if len(records)]
    parts = []
    for model, folder in folders:
        part = patterns.lambda_frame(patterns.read_lambda_files(Path(folder) / "lambdas"))
        if len(part):
            parts.append(part.assign(model=model))
    if not parts:
        return pd.DataFrame()
    lambdas = pd.concat(parts, ignore_index=True)
    # a λ file as the reader picks it: its task, where its constant matrices came from when not the task itself,
    # and the start of the file's key (one file per seed, or one per task with a grid's lambda_seed; the file does
    # not record which seed)
    prefix = lambdas["model"] + ": " if lambdas["model"].nunique() > 1 else ""
    lambdas["run"] = prefix + pd.Series(
        [f"{task_name(task)}{'' if source == task else ', C from ' + task_name(source)} (λ file {key[:6]})"
         for task, source, key in zip(lambdas["task"], lambdas["matrices_from"], lambdas["key"])])
    lambdas["survives_to"] = lambdas["kept_until"].map(_KEPT)
    return lambdas


def _preferred(lambdas: pd.DataFrame) -> str:
    """The λ file shown first: the first model's MNLI file when there is one."""
    own = lambdas[lambdas["model"] == lambdas["model"].iloc[0]]
    mnli = own[own["task"] == "mnli"]
    return sorted((mnli if len(mnli) else own)["run"].unique())[0]


def _no_lambdas(setup) -> Any:
    where = os.path.relpath(setup.results_dir / "lambdas", setup.root)
    return _markdown(f"No learned λ in `{where}` yet: they appear when the grid's λ-ordered runs have been run "
                     "(blocks `fig2` and `fig5` of its grid.yaml).")


def lambda_maps(setup, frame: pd.DataFrame, others: Mapping[Path, pd.DataFrame] | None = None) -> Any:
    """Two maps per λ file, picked in a menu: λ per head, and down to which fraction of input-dependent heads each
    head survives in the λ order (the paper's fractions 1, 1/2, 1/8, 1/16, 0). ``others``: the other models' records
    by folder (:func:`papa_lib.book.records.other_local_models`), whose λ files join the menu."""
    import altair as alt

    lambdas = _lambdas(setup, others)
    if lambdas.empty:
        return _no_lambdas(setup)
    runs = sorted(lambdas["run"].unique())
    choice = alt.param(name="run_choice", value=_preferred(lambdas),
                       bind=alt.binding_select(options=runs, name="λ of "))
    base = alt.Chart(lambdas).transform_filter("datum.run == run_choice").encode(
        x=alt.X("head:O", title="head"), y=alt.Y("layer:O", title="layer"),
        tooltip=["layer:O", "head:O", alt.Tooltip("lambda:Q", title="λ", format=".3f"),
                 alt.Tooltip("rank:Q", title="replaced as number (0 = first)"),
                 alt.Tooltip("survives_to:N", title="input-dependent down to")],
    )
    step = alt.Step(min(24, max(8, 360 // max(1, int(lambdas["head"].max()) + 1))))
    lambda_map = base.mark_rect().encode(
        color=alt.Color("lambda:Q", title="λ", scale=alt.Scale(scheme="blueorange", domainMid=0.5))
    ).properties(width=step, height=step, title="learned λ (0.5 at the start)")
    survival = base.mark_rect().encode(
        color=alt.Color("survives_to:O", title="kept down to", sort=list(_KEPT.values()),
                        scale=alt.Scale(scheme="purples"))
    ).properties(width=step, height=step, title="order implied (λ order)")
    described = describe(frame, model=setup.model_label, data=setup.data_label, profile=setup.profile)
    described["model"] = ", ".join(lambdas["model"].unique())  # the models whose λ files are in the menu
    return alt.vconcat(lambda_map, survival).resolve_scale(color="independent").add_params(choice).properties(
        title=charts.chart_title("λ per head and the replacement order it implies (Sec. 3.2)", **described))


def lambda_table(setup, others: Mapping[Path, pd.DataFrame] | None = None) -> Any:
    """Per model and task (of every model in ``others`` too): how many λ files, heads per file, the lowest and
    highest λ over its files, and the spread of λ over a file's heads (standard deviation, mean over the files)."""
    lambdas = _lambdas(setup, others)
    if lambdas.empty:
        return None
    per_file = lambdas.groupby(["model", "task", "run"]).agg(heads=("lambda", "size"), lowest=("lambda", "min"),
                                                           highest=("lambda", "max"), spread=("lambda", "std"))
    table = per_file.groupby(["model", "task"], sort=False).agg(
        files=("heads", "size"), heads=("heads", "first"), lowest=("lowest", "min"), highest=("highest", "max"),
        spread=("spread", "mean")).rename(columns={"files": "λ files", "heads": "heads per file"})
    return table.style.format({"lowest": "{:.3g}", "highest": "{:.3g}", "spread": "{:.3g}"})


@prose.values("lam_run", "lam_min", "lam_max", "lam_first", "lam_kept_layers")
def lambda_values(setup) -> dict[str, str]:
    """The numbers the chapter states about the first λ file (MNLI's when there is one), glued with myst-nb: its run,
    the range of its values, its first three heads to go, and the layers whose heads stay input-dependent down to
    1/8 (heads per layer in brackets); "not measured" where there is no λ file."""
    lambdas = _lambdas(setup)
    out = prose.not_measured(lambda_values)
    if lambdas.empty:
        return out
    run = _preferred(lambdas)
    chosen = lambdas[lambdas["run"] == run]
    layers = int(chosen["layer"].max()) + 1
    kept = chosen[chosen["kept_until"] <= 0.125].groupby("layer").size().reindex(range(layers), fill_value=0)
    first = chosen.nsmallest(3, "lambda")
    return {"lam_run": str(run), "lam_min": prose.number(chosen["lambda"].min(), ".3g"),
            "lam_max": prose.number(chosen["lambda"].max(), ".3g"),
            "lam_first": ", ".join(f"layer {int(r.layer)} head {int(r['head'])} (λ = {r['lambda']:.3g})"
                                   for _, r in first.iterrows()),
            "lam_kept_layers": ", ".join(f"{layer} ({count})" for layer, count in kept.items() if count) or "none"}


def _summary(frame: pd.DataFrame, task: str = "mnli") -> tuple[pd.DataFrame, pd.DataFrame]:
    from ..analysis import patterns
    from ..experiments import results

    curves = patterns.order_curves(frame, task=task)
    return curves, results.summarize(curves, ["selection_order", "fraction"])


def fig5_missing(frame: pd.DataFrame, spec: dict) -> Any:
    """The (order, fraction) points the grid's ``fig5`` block declares that are not in the table yet (or nothing)."""
    _, summary = _summary(frame)
    block = next((b for b in spec.get("blocks", []) if getattr(b, "name", None) == "fig5"), None)
    if block is None:
        return _markdown("")
    declared = [(o, float(f)) for o in block.orders for f in block.fractions]
    have = {(r.selection_order, float(r.fraction)) for r in summary.itertuples() if r.n > 0}
    missing = [(o, f) for o, f in declared if (o, f) not in have]
    if not missing:
        return _markdown("")
    points = ", ".join(f"{ORDER_NAMES.get(o, o)} at {_FRACTION_LABELS.get(f, f)}" for o, f in missing)
    return _markdown(f"**Partial results:** {len(missing)} of the {len(declared)} (order, fraction) points of "
                     f"Fig. 5 are not in the results table yet: {points}. The figure shows what is there.")


def fig5(frame: pd.DataFrame) -> Any:
    """Fig. 5: MNLI score (mean and 95% interval over seeds) vs the fraction of input-dependent heads, one line per
    head-selection order; click an order in the legend to pick it out."""
    import altair as alt

    curves, summary = _summary(frame)
    if summary.empty:
        return _markdown("No MNLI runs in the results table yet, so there is no Fig. 5 to draw.")
    plot = summary.assign(order=summary["selection_order"].map(ORDER_NAMES).fillna(summary["selection_order"]),
                          heads=summary["fraction"].map(_FRACTION_LABELS))
    metric = curves["metric"].dropna().iloc[0] if curves["metric"].notna().any() else "score"
    pick = alt.selection_point(fields=["order"], bind="legend")
    base = alt.Chart(plot).encode(
        x=alt.X("heads:O", sort=charts.FRACTION_ORDER, title="fraction of input-dependent heads",
                axis=alt.Axis(labelAngle=0)),
        color=alt.Color("order:N", title="order (click to pick)", sort=list(ORDER_NAMES.values())),
        opacity=alt.condition(pick, alt.value(1.0), alt.value(0.15)),
    )
    lines = base.mark_line(point=True).encode(
        y=alt.Y("mean:Q", title=f"MNLI {metric}", scale=alt.Scale(zero=False)),
        tooltip=["order:N", "heads:N", alt.Tooltip("mean:Q", format=".3f"),
                 alt.Tooltip("ci_low:Q", title="95% CI low", format=".3f"),
                 alt.Tooltip("ci_high:Q", title="95% CI high", format=".3f"), alt.Tooltip("n:Q", title="seeds")],
    )
    bars = base.mark_errorbar().encode(y="ci_low:Q", y2="ci_high:Q")
    mnli = frame[frame["task"] == "mnli"]
    return (bars + lines).add_params(pick).properties(width=420, height=300, title=charts.records_title(
        "Head-selection orders on MNLI (Fig. 5; mean and 95% CI over seeds)", mnli))


def order_ranking(frame: pd.DataFrame) -> Any:
    """Per intermediate fraction (and their mean): the best and worst order, the ranks of λ and reversed, and λ's
    margin over the best other order (:func:`papa_lib.analysis.patterns.compare_orders`)."""
    from ..analysis import patterns

    ranking = patterns.compare_orders(_summary(frame)[1])
    if ranking.empty:
        return _markdown("Not enough orders at any intermediate fraction yet to compare them.")
    shown = ranking.assign(fraction=ranking["fraction"].map(lambda f: _FRACTION_LABELS.get(f, f)),
                           best=ranking["best"].map(ORDER_NAMES), worst=ranking["worst"].map(ORDER_NAMES))
    shown = shown.rename(columns={"lambda_best": "λ best (by mean)", "reversed_worst": "reversed worst (by mean)"})
    return shown.set_index("fraction").style.format({"margin": "{:+.3f}"}, na_rep="–")


def order_text(frame: pd.DataFrame) -> Any:
    """The paper's two Sec. 5.4 claims (C6a: λ best at every fraction; C6b: reversed worst at every fraction) as the
    claims engine decides them (:func:`papa_lib.book.claims.verdict_sentence`; the intro's rows): per fraction a
    seed-paired difference with its Student-t 95% interval, the declared rule over the three fractions."""
    from . import claims

    mnli = frame[frame["task"] == "mnli"]
    if mnli.empty:
        return _markdown("")
    table = claims.claims_table(frame)
    rows = table[table["claim"].isin(["C6a", "C6b"])]
    return _markdown("\n\n".join(f"- {claims.verdict_sentence(r.claim, table, r.model)}" for r in rows.itertuples())
                     + "\n\nThe ranking table above compares means only; the verdicts use the intervals.")
