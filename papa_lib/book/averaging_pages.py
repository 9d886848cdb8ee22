"""The averaging chapter's figures and tables (book/averaging.md; paper Sec. 3.1 Eq. 2, Sec. 5.1, Fig. 4).

* :func:`counts_chart`: how many inputs each entry of C is averaged over (the pad-aware mean of Eq. 2);
* :func:`stored_constants`, :func:`corpus_label`: the matrices the probing runs used (when the results folder has
  them) and the words that name a set of matrices; :func:`other_models_constants`: the other committed models' ones;
* :func:`gallery`, :func:`representative_heads`: every head's constant matrix, and three picked by statistics;
* :func:`pattern_table`, :func:`pattern_scatter`, :func:`sensitivity_chart`, :func:`patterns_text`: the Sec. 5.1
  patterns counted by :func:`papa_lib.analysis.patterns.pattern_summary`, against the paper's shares.

``label`` is the ``{"model", "data", "profile"}`` of the matrices shown, named in every subtitle.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pandas as pd

from . import charts, paper, prose
from .records import source_kind
from .tables import task_name

__all__ = ["corpus_label", "counts_chart", "gallery", "other_models_constants", "pattern_scatter", "pattern_table",
           "patterns_values", "representative_heads", "sensitivity_chart", "stored_constants"]


def counts_chart(counts, label: Mapping[str, str]) -> Any:
    """The matrix N_qk of how many inputs each entry of C is averaged over, with the numbers written in."""
    import altair as alt

    frame = pd.DataFrame([(q, k, int(counts[q, k])) for q in range(counts.shape[0]) for k in range(counts.shape[1])],
                         columns=["query", "key", "inputs"])
    base = alt.Chart(frame).encode(x=alt.X("key:O", title="key position"),
                                   y=alt.Y("query:O", title="query position"))
    heat = base.mark_rect().encode(
        color=alt.Color("inputs:Q", title="inputs N_qk", scale=alt.Scale(scheme="greens", domainMin=0)),
        tooltip=["query:O", "key:O", alt.Tooltip("inputs:Q", title="inputs averaged")])
    return (heat + base.mark_text(fontSize=11).encode(text="inputs:Q")).properties(
        width=alt.Step(30), height=alt.Step(30), title=charts.chart_title(
            f"How many inputs each entry of C is averaged over (L = {counts.shape[0]})", **label))


def _most_examples(results_dir, task: str, max_length: int, model: str | None = None):
    """Of the constant matrices of ``task`` at L = ``max_length`` in ``results_dir`` (its grid's ``matrices/`` cache,
    else its compact ``shown/`` copy), those averaged over the most examples (of ``model`` when given), or ``None``."""
    from .figures import load_matrices, matrix_files

    found = None
    for path in matrix_files(results_dir, task, max_length):
        candidate = load_matrices(path)
        if (model is not None and candidate.metadata.get("model") != model) or candidate.max_length != max_length:
            continue
        if found is None or candidate.metadata.get("num_examples", 0) > found.metadata.get("num_examples", 0):
            found = candidate
    return found


def stored_constants(setup, model, task: str, max_length: int):
    """The constant matrices of ``task`` at L = ``max_length`` for this model in the results folder
    (``<results>/matrices/<task>-L<L>-*.safetensors``, else the committed compact copy under ``<results>/shown``;
    the most examples first), or ``None``."""
    from ..core.models import model_id

    return _most_examples(setup.results_dir, task, max_length, model_id(model))


def other_models_constants(setup, task: str, max_length: int) -> dict[str, Any]:
    """Under the ``local`` profile: model name -> the constant matrices of ``task`` at L = ``max_length`` that another
    committed local results folder holds (its grid's ``matrices/`` cache or its compact ``shown/`` copy; the most
    examples first; one model per folder). Other profiles, or folders without such matrices: left out."""
    from pathlib import Path

    from .claims import LOCAL_FOLDERS

    if getattr(setup, "profile", None) != "local" or setup.results_dir is None:
        return {}
    own = Path(setup.results_dir).resolve()
    folders = [Path(setup.root) / "data" / "results" / name for name in LOCAL_FOLDERS]
    found = [_most_examples(folder, task, max_length) for folder in folders if folder.resolve() != own]
    return {str(constants.metadata.get("model")): constants for constants in found if constants is not None}


def corpus_label(constants, task: str) -> str:
    """Which text a set of matrices averages, from its own metadata: task, number of sentences, kind of data."""
    kind = source_kind(constants.metadata.get("source", ""))
    return f"{task_name(task)} train, {constants.metadata.get('num_examples', 0):,} sentences ({kind})"


def _positions(length: int, shown: int) -> tuple[list[int], list[str]]:
    from ..analysis import patterns

    positions = list(range(min(shown, length - 1))) + [length - 1]
    names = {0: "[CLS]", length - 1: "[SEP]"}
    labels = [f"{text} {names[p]}" if p in names else text
              for p, text in zip(positions, patterns.position_labels(positions, length=length))]
    return positions, labels


def gallery(constants, label: Mapping[str, str], shown_positions: int = 32) -> Any:
    """Every head's constant matrix, picked in two menus; the first ``shown_positions`` positions and L-1."""
    import altair as alt

    from ..analysis import patterns

    layers, heads, length, _ = constants.matrices.shape
    positions, labels = _positions(length, shown_positions)
    keys = [{"layer": layer, "head": head} for layer in range(layers) for head in range(heads)]
    packed = patterns.packed_heatmaps(constants.matrices.reshape(-1, length, length), keys, labels=labels,
                                      positions=positions)
    layer = alt.param(name="layer_choice", value=0, bind=alt.binding_select(options=list(range(layers)),
                                                                            name="layer "))
    head = alt.param(name="head_choice", value=0, bind=alt.binding_select(options=list(range(heads)),
                                                                          name="head "))
    return charts.heatmap_chart(
        packed, {"layer": layer, "head": head}, cell=min(12, 400 // len(positions)),
        value_title="mean attention",
        title=charts.chart_title("Constant matrix C of the chosen head (Eq. 2; cf. Fig. 4)", **label))


def pattern_table(summary: pd.DataFrame, label: Mapping[str, str], live_summary: pd.DataFrame | None = None,
                  live_examples: int | None = None, others: Mapping[str, Any] | None = None,
                  task: str = "sst2") -> Any:
    """Share of diagonal and of [CLS]/[SEP] heads: the paper's (RoBERTa-base, SST-2), ours, ours on the live
    average when the shown matrices are the stored ones, and, by the same rules, the matrices of ``task`` of every
    other model in ``others`` (model -> constant matrices, :func:`other_models_constants`)."""
    from ..analysis import patterns

    columns = {"paper: RoBERTa-base, SST-2 (Sec. 5.1)":
               [paper.headline("diagonal_pattern_share"), paper.headline("cls_sep_mass_share")],
               f"ours: {label['model']}, {label['data']}":
               [summary["diagonal"].mean(), summary["cls_sep"].mean()]}
    if live_summary is not None:
        columns[f"ours, live average of {live_examples} sentences"] = [live_summary["diagonal"].mean(),
                                                                       live_summary["cls_sep"].mean()]
    for model, constants in (others or {}).items():
        other = patterns.pattern_summary(constants)
        columns[f"ours: {model}, {corpus_label(constants, task)}"] = [other["diagonal"].mean(),
                                                                     other["cls_sep"].mean()]
    table = pd.DataFrame(columns, index=["diagonal heads", "[CLS]/[SEP] heads"]).rename_axis(columns="share of heads")
    return table.style.format("{:.0%}")


def pattern_scatter(summary: pd.DataFrame, label: Mapping[str, str]) -> Any:
    """One point per head: how often its favourite word key is on the diagonal band (x) against its mass on
    [CLS]/[SEP] (y), with the two thresholds as dashed lines."""
    import altair as alt

    from ..analysis import patterns

    points = summary.assign(kind=summary["diagonal"].map({True: "diagonal", False: "not diagonal"})
                            + summary["cls_sep"].map({True: " + [CLS]/[SEP]", False: ""}))
    scatter = alt.Chart(points).mark_circle(size=70, opacity=0.8).encode(
        x=alt.X("diagonal_rows:Q", title="word rows whose favourite key is on |q-k|<=1",
                scale=alt.Scale(domain=[0, 1])),
        y=alt.Y("special_mass:Q", title="mass on [CLS] + [SEP]", scale=alt.Scale(domain=[0, 1])),
        color=alt.Color("kind:N", title="head", legend=alt.Legend(orient="bottom", labelLimit=300)),
        tooltip=["layer:O", "head:O", alt.Tooltip("diagonal_rows:Q", format=".2f"),
                 alt.Tooltip("diagonal_mass:Q", format=".2f", title="mass on the band"),
                 alt.Tooltip("special_mass:Q", format=".2f")],
    )
    rules = alt.Chart(pd.DataFrame({"x": [patterns.DIAGONAL_THRESHOLD], "y": [patterns.SPECIAL_THRESHOLD]}))
    return (scatter + rules.mark_rule(strokeDash=[4, 4], color="gray").encode(x="x:Q")
            + rules.mark_rule(strokeDash=[4, 4], color="gray").encode(y="y:Q")).properties(
        width=420, height=320, title=charts.chart_title("Sec. 5.1 patterns, one point per head", **label))


def representative_heads(constants, summary: pd.DataFrame, label: Mapping[str, str],
                         shown_positions: int = 32) -> Any:
    """Three heads picked by the statistics (cf. Fig. 4): the most diagonal, the most [CLS]/[SEP], and the head
    with the least mass on either pattern."""
    from ..analysis import patterns

    length = constants.max_length
    positions, labels = _positions(length, shown_positions)
    both = summary["diagonal_mass"] + summary["special_mass"]
    picks = {"most diagonal": summary.sort_values(["diagonal_rows", "diagonal_mass"]).iloc[-1],
             "most [CLS]/[SEP]": summary.sort_values("special_mass").iloc[-1],
             "most spread": summary.loc[both.idxmin()]}
    titles = [f"{name}: layer {int(row.layer)}, head {int(row['head'])}" for name, row in picks.items()]
    lines = [[f"{name}:", f"layer {int(row.layer)}, head {int(row['head'])}"] for name, row in picks.items()]
    packed = patterns.packed_heatmaps([constants.matrices[int(r.layer), int(r["head"])] for r in picks.values()],
                                      [{"pick": title} for title in titles], labels=labels, positions=positions)
    return charts.heatmap_chart(
        packed, {}, facet="pick", facet_values=titles, facet_titles=lines, columns=3, shared_rows=True,
        cell=min(5, 150 // len(positions)), value_title="mean attention",
        title=charts.chart_title("Three representative constant matrices (cf. Fig. 4)", **label))


def sensitivity_chart(summary: pd.DataFrame, label: Mapping[str, str]) -> Any:
    """Both shares recomputed over a range of thresholds (:func:`papa_lib.analysis.patterns.pattern_shares`), with
    a second rule for the diagonal; the grey line is the paper's share."""
    import altair as alt

    from ..analysis import patterns

    shares = patterns.pattern_shares(summary)
    shares["paper"] = shares["pattern"].map({"diagonal": paper.headline("diagonal_pattern_share"),
                                             "[CLS]/[SEP]": paper.headline("cls_sep_mass_share")})
    lines = alt.Chart().mark_line(point=True).encode(
        x=alt.X("threshold:Q", title="threshold t"),
        y=alt.Y("share:Q", title="share of heads", axis=alt.Axis(format="%"), scale=alt.Scale(domain=[0, 1])),
        color=alt.Color("criterion:N", title="rule",
                        legend=alt.Legend(orient="bottom", direction="vertical", labelLimit=400)),
        tooltip=["criterion:N", "threshold:Q", alt.Tooltip("share:Q", format=".0%"), "heads:Q"],
    )
    paper_line = alt.Chart().mark_rule(color="gray", strokeDash=[2, 2]).encode(
        y="paper:Q", tooltip=[alt.Tooltip("paper:Q", title="paper (RoBERTa-base, SST-2)", format=".0%")])
    return alt.layer(lines, paper_line, data=shares).properties(width=240, height=220).facet(
        column=alt.Column("pattern:N", title=None)).properties(title=charts.chart_title(
            "Share of heads with each pattern, by threshold", **label))


@prose.values("pat_model", "pat_heads", "pat_diagonal", "pat_special", "pat_paper_diagonal", "pat_paper_special",
              "pat_diagonal_min", "pat_diagonal_max", "pat_special_min", "pat_special_max")
def patterns_values(summary: pd.DataFrame, model_label: str) -> dict[str, str]:
    """The numbers the chapter's text states about the two patterns (glued into the prose with myst-nb): the shares
    with the default rules, the paper's, and their range over the thresholds tried."""
    from ..analysis import patterns

    spread = patterns.pattern_shares(summary).groupby("pattern")["share"].agg(["min", "max"])
    return {"pat_model": model_label, "pat_heads": str(len(summary)),
            "pat_diagonal": f"{summary['diagonal'].mean():.0%}", "pat_special": f"{summary['cls_sep'].mean():.0%}",
            "pat_paper_diagonal": f"{paper.headline('diagonal_pattern_share'):.0%}",
            "pat_paper_special": f"{paper.headline('cls_sep_mass_share'):.0%}",
            "pat_diagonal_min": f"{spread.loc['diagonal', 'min']:.0%}",
            "pat_diagonal_max": f"{spread.loc['diagonal', 'max']:.0%}",
            "pat_special_min": f"{spread.loc['[CLS]/[SEP]', 'min']:.0%}",
            "pat_special_max": f"{spread.loc['[CLS]/[SEP]', 'max']:.0%}"}
