"""The norm chapter's figures and tables for Kobayashi et al. (2020)'s analyses (book/norms.md, first half), one call
each, from the tables of :func:`papa_lib.book.norms_pages.read_analyses`.

* :func:`decomposition_values`, :func:`sentence_chart`: the exactness check and one sentence, weight vs norm;
* :func:`analysis_label`: the model, data and profile of the saved analyses (their ``metadata.json``);
* :func:`cv_chart`, :func:`cv_values` (Sec. 4.1); :func:`shares_chart`, :func:`special_table`, :func:`special_values`
  (Sec. 4.2, Fig. 3); :func:`token_heads_chart`, :func:`evidence_table`, :func:`observations_chart` (Fig. 4);
  :func:`frequency_chart`, :func:`types_chart` (Sec. 4.3, Fig. 5); :func:`weight_norm_figure`,
  :func:`frequency_figure`: the paper's own Fig. 4/Fig. 5 correlations (re-exported by ``norms_pages``);
* :func:`comparison`: each finding for BERT-base, the number that tests it here, and a verdict by a stated rule;
  :func:`comparison_verdicts`: the claims engine's sentences of the three it decides (C8a-c).

The ``*_values`` functions return the formatted numbers the chapter's text glues in (:mod:`papa_lib.book.prose`).

The norm-aware PAPA half of the chapter is :mod:`papa_lib.book.norm_papa_figures`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pandas as pd

from . import charts, prose
from .display import markdown as _markdown
from .records import source_kind

__all__ = ["analysis_label", "comparison", "comparison_verdicts", "cv_chart", "cv_values", "decomposition_values",
           "evidence_table", "frequency_chart", "frequency_figure", "observations_chart", "sentence_chart",
           "shares_chart", "special_table", "special_values", "token_heads_chart", "types_chart", "weight_norm_figure"]

METHODS = ["weight", "norm", "norm_heads_summed"]
#: How the charts' legends name them (Kobayashi's measures).
METHOD_LABELS = {"weight": "weight α", "norm": "norm ‖αf(x)‖", "norm_heads_summed": "norm of the heads' sum ‖Σ αf(x)‖"}


@prose.values("dec_positions", "dec_layers", "dec_max_abs", "dec_max_rel")
def decomposition_values(check: pd.DataFrame) -> dict[str, str]:
    """The numbers the chapter's text states about :func:`papa_lib.analysis.norms.decomposition_check` (glued into
    the prose with myst-nb): positions, layers, the largest gap, absolute and relative."""
    return {"dec_positions": str(int(check["n_positions"].iloc[0])), "dec_layers": str(len(check)),
            "dec_max_abs": f"{check['max_abs_error'].max():.1e}",
            "dec_max_rel": f"{check['relative_error'].max():.1e}"}


def sentence_chart(shares: pd.DataFrame, sentence: str, label: Mapping[str, str]) -> Any:
    """Each token's share of one sentence's attention, by weight and by norm, for the layer picked in the menu
    (:func:`papa_lib.book.norms_pages.sentence_shares`)."""
    import altair as alt

    shares = shares.assign(label=shares["position"].astype(str).str.zfill(2) + " " + shares["token"])
    layers = sorted(shares["layer"].unique().tolist())
    pick = alt.param(name="layer", value=int(max(layers)) // 2, bind=alt.binding_select(options=layers,
                                                                                        name="layer "))
    return alt.Chart(shares).mark_bar().encode(
        x=alt.X("label:N", sort=None, title="token (position)"),
        xOffset=alt.XOffset("method:N", sort=["weight", "norm"]),
        y=alt.Y("share:Q", title="share of the attention"),
        color=alt.Color("method:N", sort=["weight", "norm"], title="measured by",
                        legend=alt.Legend(orient="bottom")),
        tooltip=["layer:O", "token:N", "category:N", "method:N", alt.Tooltip("share:Q", format=".3f")],
    ).add_params(pick).transform_filter(alt.datum.layer == pick).properties(
        width=480, title=charts.chart_title(f"Weight vs norm, one sentence: \u201c{sentence}\u201d", **label))


def analysis_label(tables: Mapping, profile: str) -> dict[str, str]:
    """``{"model", "data", "profile"}`` of the saved analyses, from their metadata (model, corpus, size)."""
    meta = tables["metadata"]
    kind = source_kind(meta.get("data", ""), profile)
    data = f"{kind}: WikiText-2 validation, {meta.get('n_sequences')} paragraph pairs"
    return {"model": str(meta.get("model", "")), "data": data, "profile": profile}


def cv_chart(tables: Mapping, label: Mapping[str, str]) -> Any:
    """The coefficient of variation of ||f(x)|| per head (Kobayashi Sec. 4.1)."""
    import altair as alt

    cv = tables["fx_norm_variation"]
    return alt.Chart(cv).mark_rect().encode(
        x=alt.X("head:O", title="head"), y=alt.Y("layer:O", title="layer"),
        color=alt.Color("cv:Q", title="CV of ||f(x)||", scale=alt.Scale(scheme="viridis")),
        tooltip=["layer:O", "head:O", alt.Tooltip("cv:Q", format=".3f"),
                 alt.Tooltip("cv_ci_low:Q", format=".3f", title="95% CI low"),
                 alt.Tooltip("cv_ci_high:Q", format=".3f", title="95% CI high"),
                 alt.Tooltip("mean_fx_norm:Q", format=".2f", title="mean ||f(x)||")],
    ).properties(width=420, height=alt.Step(26), title=charts.chart_title(
        "Coefficient of variation of ||f(x)|| per head", **label))


@prose.values("cv_heads", "cv_min", "cv_max", "cv_median", "cv_excluding_zero", "cv_top_layer", "cv_top_median",
              "cv_low_layer", "cv_low_median")
def cv_values(tables: Mapping) -> dict[str, str]:
    """The CV's numbers for the chapter's text (glued with myst-nb): its range and median over the heads, how many
    heads' 95% intervals exclude zero, and the layers with the highest and the lowest median CV."""
    cv = tables["fx_norm_variation"]
    by_layer = cv.groupby("layer")["cv"].median()
    return {"cv_heads": str(len(cv)), "cv_min": prose.number(cv["cv"].min(), ".2f"),
            "cv_max": prose.number(cv["cv"].max(), ".2f"), "cv_median": prose.number(cv["cv"].median(), ".2f"),
            "cv_excluding_zero": str(int((cv["cv_ci_low"] > 0).sum())), "cv_top_layer": str(int(by_layer.idxmax())),
            "cv_top_median": prose.number(by_layer.max(), ".2f"), "cv_low_layer": str(int(by_layer.idxmin())),
            "cv_low_median": prose.number(by_layer.min(), ".2f")}


def shares_chart(tables: Mapping, label: Mapping[str, str]) -> Any:
    """Share of attention per token category and layer, by weight, by norm and by the norm of the heads' sum
    (Kobayashi Fig. 3); two panels per row, each with its own scale."""
    import altair as alt

    from ..analysis import norm_statistics

    pick = alt.selection_point(fields=["method"], bind="legend")
    base = alt.Chart().encode(
        x=alt.X("layer:O", title="layer"),
        color=alt.Color("method:N", title="measured by", sort=METHODS,
                        legend=alt.Legend(orient="bottom", labelLimit=300, labelExpr=" : ".join(
                            [f"datum.label == '{m}' ? \"{text}\"" for m, text in METHOD_LABELS.items()]
                            + ["datum.label"]))),
        opacity=alt.condition(pick, alt.value(1.0), alt.value(0.15)),
    )
    lines = base.mark_line(point=True).encode(
        y=alt.Y("share:Q", title="share of attention"),
        tooltip=["layer:O", "category:N", "method:N", alt.Tooltip("share:Q", format=".3f"),
                 alt.Tooltip("ci_low:Q", format=".3f", title="95% CI low"),
                 alt.Tooltip("ci_high:Q", format=".3f", title="95% CI high")])
    bands = base.mark_errorbar().encode(y=alt.Y("ci_low:Q", title="share of attention"), y2="ci_high:Q")
    return alt.layer(lines, bands, data=tables["attention_share"]).add_params(pick).properties(
        width=charts.panel_width(2, axis=70), height=170,
    ).facet(facet=alt.Facet("category:N", sort=list(norm_statistics.CATEGORY_NAMES), title=None), columns=2,
            ).resolve_scale(y="independent").properties(title=charts.chart_title(
                "Share of attention per token category", **label))


def special_table(tables: Mapping) -> pd.DataFrame:
    """Per special category ([CLS], [SEP], punctuation): the layer that gives it most weight, its weight- and
    norm-based shares there, their ratio, and both shares averaged over layers."""
    share = tables["attention_share"]
    wide = share.pivot_table(index=["category", "layer"], columns="method", values="share").reset_index()
    rows = []
    for category in ("cls", "sep", "punctuation"):
        part = wide[wide["category"] == category]
        top = part.loc[part["weight"].idxmax()]
        rows.append({"category": category, "layer with most weight": int(top["layer"]),
                     "weight-based share": top["weight"], "norm-based share": top["norm"],
                     "norm / weight": top["norm"] / top["weight"],
                     "mean weight share (all layers)": part["weight"].mean(),
                     "mean norm share (all layers)": part["norm"].mean()})
    return pd.DataFrame(rows).set_index("category")


@prose.values("sp_sink", "sp_sink_weight", "sp_sink_layer", "sp_sink_norm", "sp_sink_kept", "sp_reduction",
              "sp_sep_weight", "sp_cls_weight", "sp_punct_weight", "sp_punct_norm")
def special_values(tables: Mapping) -> dict[str, str]:
    """:func:`special_table`'s numbers for the chapter's text (glued with myst-nb): the special category that draws
    the most weight ("[CLS]", "[SEP]" or "punctuation"), its weight share in its top layer, its norm-based share
    there, the share of its weight the norms keep and the reduction ("a factor N smaller" where the norms shrink it,
    else "no reduction"); [SEP]'s and [CLS]'s largest weight shares, punctuation's mean shares by weight and by norm."""
    special = special_table(tables)
    sink = special["weight-based share"].idxmax()
    ratio = special.loc[sink, "norm / weight"]
    return {"sp_sink": f"[{sink.upper()}]" if sink in ("cls", "sep") else str(sink),
            "sp_sink_weight": prose.number(special.loc[sink, "weight-based share"], ".0%"),
            "sp_sink_layer": str(special.loc[sink, "layer with most weight"]),
            "sp_sink_norm": prose.number(special.loc[sink, "norm-based share"], ".1%"),
            "sp_sink_kept": prose.number(ratio, ".0%"),
            "sp_reduction": f"a factor {1 / ratio:.0f} smaller" if ratio < 1 else "no reduction",
            "sp_sep_weight": prose.number(special.loc["sep", "weight-based share"], ".1%"),
            "sp_cls_weight": prose.number(special.loc["cls", "weight-based share"], ".0%"),
            "sp_punct_weight": prose.number(special.loc["punctuation", "mean weight share (all layers)"], ".1%"),
            "sp_punct_norm": prose.number(special.loc["punctuation", "mean norm share (all layers)"], ".1%")}


def _token_heads(tables: Mapping) -> pd.DataFrame:
    parts = []
    for token in ("cls", "sep"):
        table = tables[f"{token}_correlation"].rename(columns={f"mean_alpha_to_{token}": "mean_alpha",
                                                               f"mean_fx_norm_{token}": "mean_fx_norm"})
        parts.append(table.assign(token=f"[{token.upper()}]"))
    heads = pd.concat(parts, ignore_index=True)
    return heads.assign(head_id="layer " + heads["layer"].astype(str) + ", head " + heads["head"].astype(str))


def token_heads_chart(tables: Mapping, label: Mapping[str, str]) -> Any:
    """Per head: the mean weight it gives [CLS] / [SEP] against the mean length of what it reads there."""
    import altair as alt

    pick = alt.selection_point(fields=["layer"], bind="legend")
    return alt.Chart(_token_heads(tables)).mark_circle(size=60).encode(
        x=alt.X("mean_alpha:Q", title="mean weight given to the token", scale=alt.Scale(type="sqrt")),
        y=alt.Y("mean_fx_norm:Q", title="mean ||f(token)||"),
        # a categorical palette with no pale colour, and full-size opaque legend symbols: readable on white
        color=alt.Color("layer:O", scale=alt.Scale(scheme="tableau10"), title="layer",
                        legend=alt.Legend(orient="bottom", symbolOpacity=1, symbolSize=90, symbolType="circle")),
        opacity=alt.condition(pick, alt.value(0.9), alt.value(0.1)),
        tooltip=["token:N", alt.Tooltip("head_id:N", title="head"), alt.Tooltip("mean_alpha:Q", format=".3f"),
                 alt.Tooltip("mean_fx_norm:Q", format=".2f"),
                 alt.Tooltip("spearman_rho:Q", format=".2f", title="within-head rho")],
    ).add_params(pick).properties(width=charts.panel_width(2, axis=70), height=240).facet(
        column=alt.Column("token:N", title=None)).resolve_scale(x="independent", y="independent").properties(
        title=charts.chart_title("Heads that attend to a token vs the length of what they read there", **label))


def evidence_table(tables: Mapping) -> pd.DataFrame:
    """For [CLS] and [SEP]: the across-heads correlation with its interval, and the within-head correlations
    (median, how many heads significantly negative / positive / undefined)."""
    from ..analysis import norm_statistics

    rows = []
    for token in ("cls", "sep"):
        across = norm_statistics.head_level_correlation(tables[f"{token}_correlation"], token)
        within = tables[f"{token}_correlation"]
        defined = within.dropna(subset=["spearman_rho"])
        rows.append({
            "token": f"[{token.upper()}]", "across heads: rho": across["spearman_rho"],
            "95% CI low": across["ci_low"], "95% CI high": across["ci_high"], "heads": across["n_heads"],
            "within heads: median rho": defined["spearman_rho"].median(),
            "heads with rho < 0 (CI below 0)": int((defined["spearman_ci_high"] < 0).sum()),
            "heads with rho > 0 (CI above 0)": int((defined["spearman_ci_low"] > 0).sum()),
            "heads where rho is undefined": int(within["spearman_rho"].isna().sum()),
            "occurrences": int(within["n_observations"].iloc[0]),
        })
    return pd.DataFrame(rows).set_index("token").round(3)


def observations_chart(tables: Mapping, label: Mapping[str, str], top: int = 6) -> Any:
    """One point per occurrence of [CLS] / [SEP] for a head picked in the menu (the ``top`` heads that give each
    token most weight): the weight the sequence's queries give it against ||f(token)||."""
    import altair as alt

    parts = []
    for token in ("cls", "sep"):
        obs = tables[f"{token}_observations"].rename(columns={f"alpha_to_{token}": "alpha",
                                                              f"fx_norm_{token}": "fx_norm"})
        chosen = tables[f"{token}_correlation"].nlargest(top, f"mean_alpha_to_{token}")[["layer", "head"]]
        obs = obs.merge(chosen, on=["layer", "head"])
        parts.append(obs.assign(head_id=f"[{token.upper()}] layer " + obs["layer"].astype(str) + ", head "
                                + obs["head"].astype(str)))
    observations = pd.concat(parts, ignore_index=True)
    options = sorted(observations["head_id"].unique().tolist())
    pick = alt.param(name="head_pick", value=options[0],
                     bind=alt.binding_select(options=options, name="token and head "))
    return alt.Chart(observations).mark_circle(size=30, opacity=0.6).encode(
        x=alt.X("alpha:Q", title="mean weight the sequence's queries give this occurrence",
                scale=alt.Scale(zero=False)),
        y=alt.Y("fx_norm:Q", title="||f(token)||", scale=alt.Scale(zero=False)),
        tooltip=[alt.Tooltip("head_id:N", title="head"), alt.Tooltip("alpha:Q", format=".3f"),
                 alt.Tooltip("fx_norm:Q", format=".2f")],
    ).add_params(pick).transform_filter(alt.datum.head_id == pick).properties(
        width=420, height=280, title=charts.chart_title("Weight vs norm, one occurrence per point", **label))


def frequency_chart(tables: Mapping, label: Mapping[str, str]) -> Any:
    """Per layer: Spearman rho between a type's frequency rank and its mean ||f(x)||, for types seen at least
    1, 5 and 25 times, with intervals (Kobayashi Sec. 4.3)."""
    import altair as alt

    title = "Spearman rho (frequency rank vs ||f(x)||)"
    base = alt.Chart(tables["frequency_correlation"]).encode(
        x=alt.X("layer:O", title="layer"), xOffset="min_count:O",
        color=alt.Color("min_count:O", title="types seen at least"))
    points = base.mark_point(filled=True, size=60).encode(
        y=alt.Y("spearman_rho:Q", title=title),
        tooltip=["layer:O", "min_count:O", "n_token_types:Q", alt.Tooltip("spearman_rho:Q", format=".3f"),
                 alt.Tooltip("ci_low:Q", format=".3f"), alt.Tooltip("ci_high:Q", format=".3f")])
    bars = base.mark_errorbar().encode(y=alt.Y("ci_low:Q", title=title), y2="ci_high:Q")
    zero = alt.Chart(pd.DataFrame({"zero": [0.0]})).mark_rule(color="#888").encode(y="zero:Q")
    return alt.layer(points, bars, zero).properties(width=420, height=260, title=charts.chart_title(
        "Do frequent tokens have shorter f(x)?", **label))


def types_chart(tables: Mapping, label: Mapping[str, str], min_count: int = 10) -> Any:
    """Token types seen at least ``min_count`` times: frequency rank (log) against mean ||f(x)||, for the layer
    picked in the menu."""
    import altair as alt

    types = tables["token_frequency"]
    types = types[types["count"] >= min_count]
    layers = sorted(types["layer"].unique().tolist())
    pick = alt.param(name="freq_layer", value=int(max(layers)), bind=alt.binding_select(options=layers,
                                                                                        name="layer "))
    return alt.Chart(types).mark_circle(size=22, opacity=0.5).encode(
        x=alt.X("frequency_rank:Q", scale=alt.Scale(type="log"), title="frequency rank (1 = most frequent)",
                axis=alt.Axis(values=[10 ** k for k in range(7)], format="~s", labelOverlap="greedy")),
        y=alt.Y("mean_fx_norm:Q", title="mean ||f(x)|| (over heads and occurrences)"),
        tooltip=["token:N", "count:Q", "frequency_rank:Q", alt.Tooltip("mean_fx_norm:Q", format=".2f")],
    ).add_params(pick).transform_filter(alt.datum.layer == pick).properties(
        width=420, height=280, title=charts.chart_title(f"Token types seen at least {min_count} times", **label))


def _engine_rows(tables: Mapping, model_label: str) -> pd.DataFrame:
    """The claims engine's C8 rows for this run (:func:`papa_lib.book.claims.norm_claims_from`)."""
    from . import claims

    return pd.DataFrame(claims.norm_claims_from(tables.get("kobayashi_findings"), model_label))


def comparison(tables: Mapping, model_label: str, profile: str) -> pd.DataFrame:
    """Each of Kobayashi's findings for BERT-base and the numbers that bear on it here. Three are claims the book
    tests (C8a [SEP], C8b [CLS], C8c frequency): their verdict and rule are the claims engine's rows (the intro's),
    decided on the pooled ρ the paper computes, with the per-head / per-layer numbers beside it as evidence. The other
    findings are shown, not decided (verdict "—": not one of the book's claims)."""
    from . import claims

    cv, special, evidence = tables["fx_norm_variation"], special_table(tables), evidence_table(tables)
    freq = tables["frequency_correlation"]
    sink = special["weight-based share"].idxmax()
    sep, cls = evidence.loc["[SEP]"], evidence.loc["[CLS]"]
    all_types = freq[freq["min_count"] == freq["min_count"].min()]
    frequent = freq[freq["min_count"] == freq["min_count"].max()]
    positive_all, positive_frequent = int((all_types["ci_low"] > 0).sum()), int((frequent["ci_low"] > 0).sum())
    layers = int(all_types["layer"].nunique())
    punct = (special.loc["punctuation", "mean norm share (all layers)"]
             / special.loc["punctuation", "mean weight share (all layers)"])
    neg, pos = "heads with rho < 0 (CI below 0)", "heads with rho > 0 (CI above 0)"
    engine = _engine_rows(tables, model_label).set_index("claim")
    shown_only = ("—", "not one of the book's claims: shown, not decided")

    def across(row):
        return f"across heads rho = {row['across heads: rho']:.2f} [{row['95% CI low']:.2f}, {row['95% CI high']:.2f}]"

    def claim(claim_id, evidence_text):
        row = engine.loc[claim_id]
        return (f"pooled rho = {claims.ours_text(row)}; {evidence_text}", f"{row.verdict} ({claim_id})", row.rule)

    rows = [
        ("||f(x)|| varies within heads (Sec. 4.1)",
         f"CV median {cv['cv'].median():.2f}, range {cv['cv'].min():.2f}-{cv['cv'].max():.2f}", *shown_only),
        ("special tokens get large weights but small norm-based attention (Sec. 4.2)",
         f"{sink}: {special.loc[sink, 'weight-based share']:.0%} by weight -> "
         f"{special.loc[sink, 'norm-based share']:.1%} by norm", *shown_only),
        ("... and [SEP] is the token that draws the weight (Sec. 4.2)",
         f"[SEP] at most {special.loc['sep', 'weight-based share']:.1%} of the weight; [CLS] up to "
         f"{special.loc['cls', 'weight-based share']:.0%}", *shown_only),
        ("punctuation, too, is turned down by the norms (Sec. 4.2)", f"norm / weight share of punctuation = "
         f"{punct:.2f}", *shown_only),
        ("more weight on [SEP] goes with a shorter f([SEP]) (Sec. 4.2, Fig. 4)",
         *claim("C8a", f"{across(sep)}; within heads {int(sep[neg])} negative, {int(sep[pos])} positive "
                       f"(of {int(sep['heads'])})")),
        ("(not in the paper) the same for [CLS]",
         *claim("C8b", f"{across(cls)}; within heads {int(cls[neg])} negative, {int(cls[pos])} positive, "
                       f"{int(cls['heads where rho is undefined'])} undefined")),
        ("frequent tokens have shorter f(x) (Sec. 4.3)",
         *claim("C8c", f"per layer: rho CI above 0 in {positive_all}/{layers} layers (all types), "
                       f"{positive_frequent}/{layers} (types seen >= {int(frequent['min_count'].iloc[0])} times)")),
    ]
    return pd.DataFrame(rows, columns=["finding for BERT-base (Kobayashi et al.)", f"{model_label} ({profile})",
                                       "verdict", "rule"])


def comparison_verdicts(tables: Mapping, model_label: str) -> Any:
    """The three findings the book tests (C8a-c) in the claims engine's sentences
    (:func:`papa_lib.book.claims.verdict_sentence`), one paragraph each: the engine's rows, nothing decided here."""
    from . import claims

    engine = _engine_rows(tables, model_label)
    return _markdown("\n\n".join(f"- {claims.verdict_sentence(c, engine)}" for c in engine["claim"]))


def _chart_title(text: str, title: Mapping | None):
    return text if title is None else charts.chart_title(text, **title)


def frequency_figure(tables: Mapping, title: Mapping | None = None):
    """Kobayashi's Fig. 5 on this run: each token type of the sample at its corpus-wide frequency rank (log scale)
    against its mean ``||f(x)||`` over occurrences, heads and layers; the title gives the occurrence-level rho.

    ``tables``: :func:`papa_lib.book.norms_pages.read_analyses` (or ``run_analyses``) output; ``title``:
    ``model=``, ``data=``, ``profile=`` for :func:`papa_lib.book.charts.chart_title` (None: a plain title).  Returns an
    altair chart.
    """
    import altair as alt

    found = tables["kobayashi_findings"].set_index("finding").loc["frequency_rank_vs_norm"]
    text = (f"Frequent tokens, shorter f(x)? Spearman rho over {int(found['n_seen']):,} occurrences = "
            f"{found['spearman_rho']:.2f} [{found['ci_low']:.2f}, {found['ci_high']:.2f}]")
    return alt.Chart(tables["corpus_frequency"]).mark_circle(opacity=0.45).encode(
        x=alt.X("corpus_rank:Q", scale=alt.Scale(type="log"), title="frequency rank in the corpus (1 = most frequent)"),
        y=alt.Y("mean_fx_norm:Q", title="mean ||f(x)|| (occurrences, heads, layers)"),
        size=alt.Size("sample_count:Q", title="occurrences analysed", scale=alt.Scale(type="log")),
        tooltip=["token:N", "corpus_count:Q", "corpus_rank:Q", "sample_count:Q",
                 alt.Tooltip("mean_fx_norm:Q", format=".2f")],
    ).properties(width=400, height=300, title=_chart_title(text, title))


def weight_norm_figure(tables: Mapping, token: str = "sep", title: Mapping | None = None):
    """Kobayashi's Fig. 4 on this run: a sample of the pooled (query, [SEP]) pairs (``token="cls"``: [CLS]), the weight
    alpha against ``||f(x)||``, coloured by layer; the title gives the pooled rho.  Arguments as
    :func:`frequency_figure`."""
    import altair as alt

    if token not in ("sep", "cls"):
        raise ValueError(f"token must be 'sep' or 'cls', got {token!r}")
    found = tables["kobayashi_findings"].set_index("finding").loc[f"{token}_weight_vs_norm"]
    name = f"[{token.upper()}]"
    text = (f"Weight vs norm of {name}: Spearman rho over {int(found['n_seen']):,} pairs = {found['spearman_rho']:.2f} "
            f"[{found['ci_low']:.2f}, {found['ci_high']:.2f}]")
    return alt.Chart(tables[f"{token}_pairs"]).mark_circle(size=8, opacity=0.3).encode(
        x=alt.X("alpha:Q", title=f"attention weight alpha to {name}"),
        y=alt.Y("fx_norm:Q", title=f"||f({name})||"),
        # faint points (thousands overlap), but a palette with no pale colour and opaque, full-size legend symbols
        color=alt.Color("layer:O", title="layer", scale=alt.Scale(scheme="tableau10"),
                        legend=alt.Legend(symbolOpacity=1, symbolSize=90, symbolType="circle")),
        tooltip=["layer:O", "head:O", alt.Tooltip("alpha:Q", format=".3f"), alt.Tooltip("fx_norm:Q", format=".2f")],
    ).properties(width=400, height=300, title=_chart_title(text, title))
