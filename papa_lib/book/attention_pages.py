"""The attention chapter's tables and figures (book/attention.md; paper Sec. 2, Eq. 1): the App. A layout of one
sentence, one head's matrices on different sentences, and every head's input variability
(:func:`papa_lib.analysis.patterns.input_variability`).

The figures are computed live on a few sentences (:func:`papa_lib.book.inputs.sentences`); ``label`` is the
``{"model", "data", "profile"}`` of that run, named in every subtitle.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pandas as pd

from . import charts, prose

__all__ = ["first_tokens", "head_gallery", "variability", "variability_chart", "variability_values"]


def first_tokens(tokenizer, batch, index: int = 0, per_row: int = 8) -> Any:
    """The real tokens of one encoded sentence and their positions: ``[CLS]`` at 0, the words, ``[SEP]`` at L-1.

    A Styler without a header: a "position" line above a "token" line, ``per_row`` positions to a pair of lines,
    so that a long sentence wraps onto the page instead of scrolling its final ``[SEP]`` out of sight. Its ``data``
    holds the lines (index "position" / "token", repeated)."""
    if isinstance(per_row, bool) or not isinstance(per_row, int) or per_row < 1:
        raise ValueError(f"per_row must be a positive integer, got {per_row!r}")
    tokens = tokenizer.convert_ids_to_tokens(batch["input_ids"][index].tolist())
    real = batch["attention_mask"][index].nonzero().flatten().tolist()
    lines, labels = [], []
    for start in range(0, len(real), per_row):
        chunk = real[start : start + per_row]
        blank = [""] * (per_row - len(chunk))
        lines += [[str(p) for p in chunk] + blank, [tokens[p] for p in chunk] + blank]
        labels += ["position", "token"]
    return pd.DataFrame(lines, index=pd.Index(labels)).style.hide(axis="columns")


def variability(attentions, mask) -> pd.DataFrame:
    """Every head's input variability over the sentences (layer, head, variability)."""
    from ..analysis import patterns

    values = patterns.input_variability(attentions, mask)  # [layers, heads]
    layers, heads = values.shape
    return pd.DataFrame([{"layer": layer, "head": head, "variability": float(values[layer, head])}
                         for layer in range(layers) for head in range(heads)])


def head_gallery(attentions, batch, tokenizer, texts, label: Mapping[str, str], shown: int = 3,
                 max_tokens: int = 14) -> Any:
    """One head's attention matrix on ``shown`` different (short) sentences, the head picked in two menus; it opens
    on the head whose matrices vary most across the sentences."""
    import altair as alt

    from ..analysis import patterns

    mask = batch["attention_mask"]
    _, layers, heads, length, _ = attentions.shape
    lengths = mask.sum(1).tolist()
    picked = [i for i, n in enumerate(lengths) if n <= max_tokens][:shown]
    if len(picked) < shown:  # not enough short sentences: take the shortest ones
        picked = sorted(range(len(texts)), key=lambda i: lengths[i])[:shown]
    start = variability(attentions, mask)["variability"].idxmax()
    matrices, keys, names, positions = [], [], [], []
    for number, i in enumerate(picked):
        real = mask[i].nonzero().flatten().tolist()
        words = tokenizer.convert_ids_to_tokens(batch["input_ids"][i].tolist())
        labels = patterns.position_labels(real, [words[p] for p in real], length=length)
        for layer in range(layers):
            for head in range(heads):
                matrices.append(attentions[i, layer, head])
                keys.append({"layer": layer, "head": head, "sentence": f"sentence {number + 1}"})
                names.append(labels)
                positions.append(real)
    packed = patterns.packed_heatmaps(matrices, keys, labels=names, positions=positions)
    layer_choice = alt.param(name="layer_choice", value=int(start // heads),
                             bind=alt.binding_select(options=list(range(layers)), name="layer "))
    head_choice = alt.param(name="head_choice", value=int(start % heads),
                            bind=alt.binding_select(options=list(range(heads)), name="head "))
    titles = [f"{n + 1}: {texts[i][:28]}{'…' if len(texts[i]) > 28 else ''}" for n, i in enumerate(picked)]
    cell = max(6, min(11, 200 // max(len(p) for p in positions)))
    return charts.heatmap_chart(
        packed, {"layer": layer_choice, "head": head_choice}, facet="sentence", facet_titles=titles,
        columns=2, cell=cell,
        title=charts.chart_title("One head's attention matrix on different sentences (Eq. 1)", **label))


def variability_chart(frame: pd.DataFrame, label: Mapping[str, str], sentences: int) -> Any:
    """A layer x head map of the input variability (:func:`variability`)."""
    import altair as alt

    step = alt.Step(min(28, max(10, 400 // (int(frame["head"].max()) + 1))))
    return alt.Chart(frame).mark_rect().encode(
        x=alt.X("head:O", title="head"), y=alt.Y("layer:O", title="layer"),
        color=alt.Color("variability:Q", title="input variability",
                        scale=alt.Scale(scheme="oranges", domainMin=0)),
        tooltip=["layer:O", "head:O", alt.Tooltip("variability:Q", format=".3f")],
    ).properties(width=step, height=step, title=charts.chart_title(
        f"Input variability of every head over {sentences} sentences", **label))


@prose.values("var_sentences", "var_low_head", "var_low", "var_high_head", "var_high", "var_median",
              "var_first_layer", "var_last_layer", "var_last_layer_index")
def variability_values(frame: pd.DataFrame, sentences: int) -> dict[str, str]:
    """The numbers the chapter's text states about input variability (glued into the prose with myst-nb): the least
    and most input-dependent heads, the median, and the mean by layer at both ends."""
    ranked = frame.sort_values("variability")
    low, high = ranked.iloc[0], ranked.iloc[-1]
    by_layer = frame.groupby("layer")["variability"].mean()
    return {"var_sentences": str(sentences),
            "var_low_head": f"layer {int(low.layer)}, head {int(low['head'])}", "var_low": f"{low.variability:.3f}",
            "var_high_head": f"layer {int(high.layer)}, head {int(high['head'])}",
            "var_high": f"{high.variability:.3f}", "var_median": f"{frame.variability.median():.3f}",
            "var_first_layer": f"{by_layer.iloc[0]:.3f}", "var_last_layer": f"{by_layer.iloc[-1]:.3f}",
            "var_last_layer_index": str(int(by_layer.index[-1]))}
