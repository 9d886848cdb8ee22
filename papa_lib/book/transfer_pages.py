"""The MNLI-transfer chapter's figures and tables (book/transfer.md; paper Sec. 5.3, Tables 2 and 5).

* :func:`table2`: our Table 2 (every head constant, matrices built on the task's own text or on MNLI's);
* :func:`changes_chart`, :func:`changes_text`: the change of score when the matrices come from MNLI (MNLI-built minus
  per-task, the claims engine's sign), ours beside the paper's RoBERTa-base, against the seed noise of our per-task
  score, and claim C5's verdict as the claims engine decides it;
* :func:`layout_overview`, :func:`layout_chart`, :func:`layout_values`: where the MNLI pair layout moves the weight
  (position L/2, the middle separator), read from the constant matrices the grid stored.

Every number comes from the records or the stored matrices; figures fit the book's content column.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pandas as pd

from . import charts, figures, paper, prose
from .display import markdown as _markdown
from .records import describe, ours_label
from .tables import MISSING, interval_below, plural, task_name

__all__ = ["changes_chart", "changes_text", "layout_chart", "layout_overview", "layout_values", "table2"]


def table2(frame: pd.DataFrame, tasks: Sequence[str]) -> Any:
    """Our Table 2: rows ``per-task`` and ``mnli``, ``mean ± CI`` cells (``—``: not run yet; in HTML the interval
    under its mean, :func:`papa_lib.book.tables.interval_below`), captioned with the records' model, data and
    profile."""
    who = describe(frame)
    return figures.transfer_table(frame, tasks=tasks).style.format(interval_below, na_rep=MISSING).set_caption(
        f"Ours — model: {who['model']}, data: {who['data']}, profile: {who['profile']}")


def _paper_changes() -> pd.DataFrame:
    reported = paper.table("table2").set_index("matrices_from")
    change = (reported.loc["mnli"] - reported.loc["per-task"]).rename("difference").reset_index()
    change = change.rename(columns={"index": "task"})
    return change.assign(per_task=reported.loc["per-task"].values, mnli=reported.loc["mnli"].values,
                         source=f"paper: {paper.table('table2').attrs['model']} (Table 2)")


def changes_chart(frame: pd.DataFrame, tasks: Sequence[str]) -> Any:
    """Per task, MNLI-built score minus per-task score: ours (filled circles) and the paper's (open diamonds); a grey
    bar spans ± the half-width of our per-task score's 95% interval over seeds (changes inside it are seed noise)."""
    import altair as alt

    measured = figures.transfer_differences(frame, tasks=tasks).dropna(subset=["difference"])
    label = ours_label(frame)
    theirs = _paper_changes()
    points = pd.concat([measured.assign(source=label)[["source", "task", "difference", "per_task", "mnli"]],
                        theirs[["source", "task", "difference", "per_task", "mnli"]]], ignore_index=True)
    noise = measured.dropna(subset=["per_task_ci_half_width"]).assign(
        low=lambda t: -t.per_task_ci_half_width, high=lambda t: t.per_task_ci_half_width)
    order = [t for t in figures.PAPER_TASK_ORDER if t in set(points.task)]
    pick = alt.selection_point(fields=["source"], bind="legend")
    y = alt.Y("task:N", sort=order, title=None)
    band = alt.Chart(noise).mark_bar(color="#ddd", height=14).encode(
        x=alt.X("low:Q", title="MNLI-built score − per-task score"), x2="high:Q", y=y,
        tooltip=["task:N", alt.Tooltip("per_task_ci_half_width:Q", title="per-task 95% CI ±", format=".3f")])
    zero = alt.Chart(pd.DataFrame({"x": [0.0]})).mark_rule(color="#777").encode(x="x:Q")
    encoding = dict(
        x="difference:Q", y=y,
        color=alt.Color("source:N", title="source", sort=[label, theirs.source.iloc[0]],
                        legend=alt.Legend(orient="bottom", labelLimit=500, direction="vertical")),
        opacity=alt.condition(pick, alt.value(1.0), alt.value(0.15)),
        tooltip=["source:N", "task:N", alt.Tooltip("per_task:Q", title="per-task", format=".3f"),
                 alt.Tooltip("mnli:Q", title="MNLI-built", format=".3f"),
                 alt.Tooltip("difference:Q", title="change", format="+.3f")],
    )
    is_ours = alt.datum.source == label
    marks = alt.layer(
        alt.Chart(points).transform_filter(~is_ours).mark_point(shape="diamond", size=120, strokeWidth=2)
        .encode(**encoding),
        alt.Chart(points).transform_filter(is_ours).mark_point(filled=True, size=90).encode(**encoding)
        .add_params(pick),
    )
    return (band + zero + marks).properties(width=440, height=alt.Step(30), title=charts.records_title(
        "Table 2 as a chart: change of score when the constants come from MNLI text", frame))


def changes_text(frame: pd.DataFrame, tasks: Sequence[str]) -> Any:
    """The changes in words: our range and largest change, the paper's largest, and in how many tasks the change
    lies within the per-task score's 95% interval across seeds."""
    measured = figures.transfer_differences(frame, tasks=tasks).dropna(subset=["difference"])
    paper_gap = _paper_changes().difference.abs().max()
    if measured.empty:
        return _markdown("No task has both per-task and MNLI-built results in the table yet; the chart shows the "
                         f"paper's changes only (largest: {paper_gap:.2f}).")
    who = describe(frame)
    worst = measured.loc[measured.difference.abs().idxmax()]
    text = (f"In our numbers ({who['model']}, {who['data']}, profile {who['profile']}), swapping the task's own "
            f"text for MNLI's changes the score by between {measured.difference.min():+.3f} and "
            f"{measured.difference.max():+.3f} (largest change: {worst.task}, {worst.difference:+.3f}); the paper's "
            f"largest change on RoBERTa-base is {paper_gap:.2f}.")
    inside = measured.dropna(subset=["within_ci"])
    if not inside.empty:
        text += (f" In {int(inside.within_ci.astype(bool).sum())} of {plural(len(inside), 'task', number=False)} "
                 "the change lies within the 95% interval of the per-task score across seeds.")
    from . import claims

    table = claims.claims_table(frame)  # every task's records: the inclusion rule is the engine's, as in claims.csv
    for row in table[table["claim"] == "C5"].itertuples():
        text += f"\n\n{claims.verdict_sentence('C5', table, row.model)}"
    return _markdown(text)


def _layout_pairs(setup, tasks: Sequence[str], lengths: dict) -> list[dict]:
    """Tasks that have both their own and MNLI-built matrices stored at their L, with the statistics at L/2."""
    from ..core.models import model_id

    model, _ = setup.encoder()
    found = []
    for task in tasks:
        if task == "mnli":
            continue
        own = figures.stored_matrices(setup.results_dir, task, lengths[task], model=model_id(model))
        mnli = figures.stored_matrices(setup.results_dir, "mnli", lengths[task], model=model_id(model))
        if own is None or mnli is None:
            continue
        middle = lengths[task] // 2
        found.append({"task": task, "L": lengths[task], "middle": middle, "own": own, "mnli": mnli,
                      "real": figures.position_coverage(own, middle),
                      "real_mnli": figures.position_coverage(mnli, middle)})
    return found


def _no_matrices(setup) -> Any:
    import os

    folder = os.path.relpath(setup.results_dir / "matrices", setup.root)
    return _markdown(f"No task has both its own and MNLI-built constant matrices stored yet (looked in `{folder}` "
                     "and its committed compact copies under `shown/`).")


def layout_overview(setup, tasks: Sequence[str], lengths: dict) -> Any:
    """Per single-text task with both sets of matrices: how often position L/2 is a real token of the task's
    inputs, and the mean weight the heads put there under each set."""
    pairs = _layout_pairs(setup, tasks, lengths)
    if not pairs:
        return _no_matrices(setup)
    rows = [{"task": p["task"], "L": p["L"], "L/2 real in (task inputs)": f"{p['real']:.0%}",
             "mean weight on L/2, task-built": figures.column_mass(p["own"], p["middle"])["mass"].mean(),
             "mean weight on L/2, MNLI-built": figures.column_mass(p["mnli"], p["middle"])["mass"].mean()}
            for p in pairs]
    return pd.DataFrame(rows).set_index("task")


def _layout_heads(setup, tasks, lengths):
    pairs = _layout_pairs(setup, tasks, lengths)
    if not pairs:
        return None, None
    best = max(pairs, key=lambda p: p["real"])  # the task whose inputs reach L/2 most often
    heads = figures.column_mass(best["own"], best["middle"]).merge(
        figures.column_mass(best["mnli"], best["middle"]), on=["layer", "head"], suffixes=("_own", "_mnli"))
    return best, heads


def layout_chart(setup, frame: pd.DataFrame, tasks: Sequence[str], lengths: dict) -> Any:
    """For the task whose inputs reach L/2 most often: every head's weight on position L/2 under its own matrices
    (x) and the MNLI-built ones (y); heads above the diagonal send more weight there under MNLI's."""
    import altair as alt

    best, heads = _layout_heads(setup, tasks, lengths)
    if best is None:  # layout_overview has said that there are no matrices: say nothing twice
        return None
    task, middle = best["task"], best["middle"]
    top = max(heads[["mass_own", "mass_mnli"]].max().max(), 1e-3)
    diagonal = alt.Chart(pd.DataFrame({"x": [0, top], "y": [0, top]})).mark_line(
        color="#999", strokeDash=[4, 4]).encode(x="x:Q", y="y:Q")
    pick = alt.selection_point(fields=["layer"], bind="legend")
    scatter = alt.Chart(heads).mark_point(filled=True, size=60).encode(
        x=alt.X("mass_own:Q", title=f"weight on position {middle}, built on {task_name(task)} text"),
        y=alt.Y("mass_mnli:Q", title=f"weight on position {middle}, built on MNLI text"),
        color=alt.Color("layer:O", title="layer", scale=alt.Scale(scheme="tableau10"),
                        legend=alt.Legend(symbolOpacity=1, symbolSize=80, symbolType="circle")),
        opacity=alt.condition(pick, alt.value(1.0), alt.value(0.15)),
        tooltip=["layer:O", "head:O", alt.Tooltip("mass_own:Q", title=f"{task}-built", format=".3f"),
                 alt.Tooltip("mass_mnli:Q", title="MNLI-built", format=".3f")],
    ).add_params(pick)
    who = describe(frame, model=setup.model_label, profile=setup.profile)
    title = (f"Weight on key position L/2 = {middle} per head, {task_name(task)} at L = {best['L']} (real in "
             f"{best['real']:.0%} of {task_name(task)} inputs, {best['real_mnli']:.0%} of MNLI inputs)")
    data = (f"stored matrices of {task_name(task)} ({best['own'].metadata.get('num_examples', 0):,} examples) and MNLI "
            f"({best['mnli'].metadata.get('num_examples', 0):,} examples)")
    return (diagonal + scatter).properties(width=420, height=320, title=charts.chart_title(
        title, model=who["model"], data=data, profile=who["profile"]))


@prose.values("lay_gained", "lay_heads", "lay_middle", "lay_task", "lay_mass_mnli", "lay_mass_own", "lay_real",
              "lay_masked")
def layout_values(setup, tasks: Sequence[str], lengths: dict) -> dict[str, str]:
    """The numbers the chapter states about the MNLI layout (glued with myst-nb): how many heads put more weight on
    position L/2 when built on MNLI than on the task's own text, their mean weights, and the share of the task's
    training inputs where that position is a real token (and the share where it is padding); "not measured" where
    no pair of matrices is saved."""
    best, heads = _layout_heads(setup, tasks, lengths)
    out = prose.not_measured(layout_values)
    if best is None:
        return out
    share = float(best["real"])
    return {"lay_gained": str(int((heads.mass_mnli > heads.mass_own).sum())), "lay_heads": str(len(heads)),
            "lay_middle": str(best["middle"]), "lay_task": str(best["task"]),
            "lay_mass_mnli": prose.number(heads.mass_mnli.mean(), ".3f"),
            "lay_mass_own": prose.number(heads.mass_own.mean(), ".3f"),
            "lay_real": prose.number(share, ".0%"), "lay_masked": prose.number(1 - share, ".0%")}
