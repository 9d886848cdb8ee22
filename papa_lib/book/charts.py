"""Interactive altair charts that work in an offline Jupyter Book.

Every figure of the PAPA book (Hassid et al. 2022, Figs. 2-6 and the norm-analysis plots of
Kobayashi et al. 2020) is an altair chart.  As shipped, altair's HTML output loads vega,
vega-lite and vega-embed from a CDN, which neither the build machines nor a reader without
network can reach.  This module registers an altair renderer, ``papa_offline``, whose output
is a small ``text/html`` snippet: a ``<div>`` plus an inline script that calls the global
``vegaEmbed`` function with the chart's spec inlined as JSON.  The global comes from a
self-contained JavaScript bundle (``vl_convert.javascript_bundle()``) that the book's Sphinx
extension (``papa_book.sphinx_hooks``, in ``book/_ext``) writes to ``_static/papa-vega-bundle.js`` and adds
to every page.  No PNG/SVG fallback is emitted: the charts stay interactive (tooltips).

Typical use, once at the top of a chapter::

    from papa_lib.book import charts
    charts.setup()                     # offline renderer, except in Google Colab
    chart.properties(title=charts.chart_title("Fig. 2a", model=..., data=..., profile=...))

Every figure must say which model, data and profile produced it: use :func:`label` (or
:func:`chart_title`, which puts it in the subtitle).
"""

from __future__ import annotations

import hashlib
import html
import itertools
import json
import math
import sys
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from ..experiments.selection import PAPER_FRACTIONS
from .figures import fraction_label
from .tables import readable

if TYPE_CHECKING:
    import pandas as pd

__all__ = [
    "BUNDLE_FILENAME",
    "CONTENT_WIDTH",
    "FRACTION_ORDER",
    "OFFLINE_RENDERER",
    "THEME_NAME",
    "bundle_javascript",
    "chart_title",
    "heatmap_chart",
    "in_colab",
    "label",
    "offline_html",
    "panel_width",
    "readable_titles",
    "records_title",
    "setup",
    "task_names",
]

#: Name of the altair renderer registered by :func:`setup`.
OFFLINE_RENDERER = "papa_offline"
#: Name of the altair theme registered by :func:`setup`.
THEME_NAME = "papa"
#: File name of the vega-embed bundle inside the book's ``_static`` folder.
BUNDLE_FILENAME = "papa-vega-bundle.js"
#: The vega-lite mimetype the offline renderer adds beside its HTML: the one JupyterLab 4 and VS Code render
#: (nbformat requires the ``+json`` form for a JSON value; altair 6's own ``…v6.json`` fails notebook validation).
VEGALITE_MIMETYPE = "application/vnd.vegalite.v5+json"
#: CSS class of every chart container written by the offline renderer.
CHART_CLASS = "papa-vega-chart"

# Options handed to vegaEmbed: SVG output (crisp, and checkable in the DOM), no action menu
# (its "open in editor" link points to the network).
DEFAULT_EMBED_OPTIONS: dict[str, Any] = {"renderer": "svg", "actions": False}

_chart_counter = itertools.count(1)

#: Width in pixels that a whole chart (axes, legends and titles included) may take: the content column of the
#: book's pages is about 676 px wide in a 1280 px window (sphinx-book-theme), minus a margin. The browser test
#: checks every chart against its container.
CONTENT_WIDTH = 620
#: The paper's fractions of input-dependent heads (:data:`papa_lib.experiments.selection.PAPER_FRACTIONS`), as axis
#: labels (Fig. 2, 5, 6): ``["1", "1/2", "1/8", "1/16", "0"]``.
FRACTION_ORDER = [fraction_label(f) for f in PAPER_FRACTIONS]
#: Longest line of a title and of a subtitle, in characters; longer ones are wrapped so that no title widens a
#: chart (sized for a wide fallback font such as DejaVu Sans: about 9 px per bold 15 px character, 7 px at 12 px).
TITLE_CHARACTERS = 62
SUBTITLE_CHARACTERS = 82


def in_colab() -> bool:
    """Return True when running inside Google Colab (its ``google.colab`` module is loaded)."""
    return "google.colab" in sys.modules


def label(model: Any, data: Any, profile: Any) -> str:
    """Return the caption ``"model: …, data: …, profile: …"`` that every figure carries.

    ``model`` may be a hub id, a local path or a model object name; ``data`` names the
    dataset/split (or the local directory) and ``profile`` is the run profile
    (``smoke``, ``local`` or ``paper``).  Raises ValueError when one of them is empty,
    because a figure that does not say what produced it is not allowed in the book.
    """
    parts = {"model": model, "data": data, "profile": profile}
    for name, value in parts.items():
        if value is None or not str(value).strip():
            raise ValueError(
                f"charts.label(): {name!r} is empty; every figure must name the model, "
                f"data and profile that produced it (got {parts!r})"
            )
    return ", ".join(f"{name}: {str(value).strip()}" for name, value in parts.items())


def _wrap(text: str, width: int = TITLE_CHARACTERS) -> str | list[str]:
    """``text`` as one line, or as lines of at most ``width`` characters (broken at spaces) when longer; a label's
    ``model:``, ``data:`` and ``profile:`` stay on the line of the word that follows them."""
    import re
    import textwrap

    bound = re.sub(r"\b(model|data|profile): ", "\\1:\u00a0", str(text))
    lines = textwrap.wrap(bound, width=width, break_long_words=False, break_on_hyphens=False)
    lines = [line.replace("\u00a0", " ") for line in lines] or [str(text)]
    return lines[0] if len(lines) == 1 else lines


def chart_title(text: str, *, model: Any, data: Any, profile: Any) -> Any:
    """Return an ``altair.TitleParams`` with ``text`` as title and :func:`label` as subtitle (wrapped into lines of
    at most :data:`TITLE_CHARACTERS` and :data:`SUBTITLE_CHARACTERS` characters, so that a title never widens its
    chart)."""
    import altair as alt

    if not str(text).strip():
        raise ValueError("charts.chart_title(): the title text is empty")
    subtitle = label(model, data, profile)
    return alt.TitleParams(text=_wrap(text), subtitle=_wrap(subtitle, SUBTITLE_CHARACTERS), anchor="start")


def records_title(text: str, frame: Any, **fallback: Any) -> Any:
    """:func:`chart_title` with model, data and profile read from the records a figure plots
    (:func:`papa_lib.book.records.describe`: the frame's ``model``, ``data_source`` and ``profile`` columns);
    ``fallback`` (``model=``, ``data=``, ``profile=``) only fills what the records do not say, and what neither
    says reads "no records"."""
    from .records import describe

    described = describe(frame, **fallback)
    return chart_title(text, **{key: value or "no records" for key, value in described.items()})


def panel_width(columns: int, axis: int = 55, legend: int = 0, total: int = CONTENT_WIDTH) -> int:
    """Width of each of ``columns`` side-by-side panels so that the whole chart fits ``total`` pixels: every panel
    also needs ``axis`` pixels for its own y axis, and a legend to the right takes ``legend``."""
    if columns < 1:
        raise ValueError(f"panel_width: columns must be at least 1, got {columns}")
    return max(60, int((total - legend - columns * axis) // columns))


def _script_json(value: Any) -> str:
    """Serialise ``value`` as JSON that is safe inside an HTML ``<script>`` element."""
    text = json.dumps(value, sort_keys=True, separators=(",", ":"), allow_nan=False)
    # '<' only ever appears inside JSON strings, where \u003c is an equivalent escape; this
    # keeps "</script>" and "<!--" in chart titles or data from ending the script early.
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def offline_html(spec: dict, embed_options: dict | None = None, element_id: str | None = None) -> str:
    """Return the HTML snippet that renders the vega-lite ``spec`` with the bundled vegaEmbed.

    The snippet never references a network resource: it expects ``window.vegaEmbed`` from
    ``_static/papa-vega-bundle.js`` (added to every page of the book).  If the bundle is not
    there (e.g. a plain local Jupyter session), the container shows a short explanation
    instead of a chart and the error is logged to the browser console.
    """
    if not isinstance(spec, dict):
        raise ValueError(f"offline_html(): spec must be a vega-lite dict, got {type(spec).__name__}")
    options = {**DEFAULT_EMBED_OPTIONS, **(embed_options or {})}
    spec_json = _script_json(spec)
    if element_id is None:
        digest = hashlib.sha1(spec_json.encode("utf-8")).hexdigest()[:10]
        element_id = f"papa-vega-{digest}-{next(_chart_counter)}"
    element_id_html = html.escape(element_id, quote=True)
    return (
        f'<div id="{element_id_html}" class="{CHART_CLASS}"></div>\n'
        '<script type="text/javascript">\n'
        "(function () {\n"
        f"  var el = document.getElementById({json.dumps(element_id)});\n"
        f"  var spec = {spec_json};\n"
        f"  var opt = {_script_json(options)};\n"
        "  function fail(err) {\n"
        "    el.textContent = 'Chart not rendered: ' + err + '.';\n"
        "    console.error('papa_lib.book.charts:', err);\n"
        "  }\n"
        "  function draw() {\n"
        "    if (typeof window.vegaEmbed !== 'function') {\n"
        f"      fail('the offline vega bundle (_static/{BUNDLE_FILENAME}) is not loaded; build the '\n"
        "        + 'book, or call papa_lib.book.charts.setup(offline=False) in a live notebook');\n"
        "      return;\n"
        "    }\n"
        "    window.vegaEmbed(el, spec, opt).catch(fail);\n"
        "  }\n"
        "  if (typeof window.vegaEmbed === 'function' || document.readyState === 'complete') { draw(); }\n"
        "  else { window.addEventListener('load', draw); }\n"
        "})();\n"
        "</script>"
    )


_CHANNELS = ("x", "y", "x2", "y2", "color", "fill", "stroke", "size", "shape", "opacity", "theta", "row", "column",
             "facet", "xOffset", "yOffset")
#: Folder every rendered chart is also exported to as SVG and PDF (:func:`setup`'s ``export_to``), or None.
_EXPORT: dict[str, Any] = {"folder": None, "count": 0}


#: Fields that hold the ends of an interval: charts draw them without a title of their own.
INTERVAL_FIELDS = ("ci_low", "ci_high", "low", "high")


def readable_titles(spec: Any) -> Any:
    """``spec`` with a readable title on every encoding whose field is a raw identifier and that has no title (vega-lite
    would show the field's name), and raw identifiers in explicit titles turned into words (in place; returned)."""
    if isinstance(spec, list):
        for item in spec:
            readable_titles(item)
        return spec
    if not isinstance(spec, dict):
        return spec
    encoding = spec.get("encoding")
    if isinstance(encoding, dict):
        for channel, definition in encoding.items():
            if channel not in _CHANNELS or not isinstance(definition, dict):
                continue
            if "title" in definition:
                if isinstance(definition["title"], str):
                    definition["title"] = readable(definition["title"])
            elif definition.get("field") in INTERVAL_FIELDS or channel in ("x2", "y2"):
                # an interval's ends: no title of their own, so the axis keeps the title of the value they bound
                # (vega-lite would otherwise join "ci_low, ci_high, validation score")
                definition["title"] = None
            elif isinstance(definition.get("field"), str) and readable(definition["field"]) != definition["field"]:
                definition["title"] = readable(definition["field"])
    for key, value in spec.items():
        if key != "data" and key != "datasets" and isinstance(value, dict | list):
            readable_titles(value)
    return spec


def task_names(spec: Any) -> Any:
    """``spec`` with the records' task ids (``sst2``) replaced by the book's names (``SST-2``;
    :data:`papa_lib.book.tables.TASK_NAMES`) wherever a chart shows them: the ``task`` field of its data rows, and the
    sort orders and scale domains of encodings and facets on ``task`` (in place; returned)."""
    from .tables import task_name

    def rename(values: Any) -> Any:
        return [task_name(v) if isinstance(v, str) else v for v in values] if isinstance(values, list) else values

    def rows(values: Any) -> None:
        for row in values if isinstance(values, list) else []:
            if isinstance(row, dict) and isinstance(row.get("task"), str):
                row["task"] = task_name(row["task"])

    def walk(node: Any) -> None:
        if isinstance(node, list):
            for item in node:
                walk(item)
            return
        if not isinstance(node, dict):
            return
        if node.get("field") == "task":
            if "sort" in node:
                node["sort"] = rename(node["sort"])
            if isinstance(node.get("scale"), dict) and "domain" in node["scale"]:
                node["scale"]["domain"] = rename(node["scale"]["domain"])
        for key, value in node.items():
            if key == "datasets" and isinstance(value, dict):
                for values in value.values():
                    rows(values)
            elif key == "data" and isinstance(value, dict):
                rows(value.get("values"))
            elif isinstance(value, dict | list):
                walk(value)

    walk(spec)
    return spec


def _export(spec: dict) -> None:
    """Write ``spec`` as SVG and PDF into the export folder (numbered in the order the page draws them)."""
    import re
    from pathlib import Path

    import vl_convert

    folder = Path(_EXPORT["folder"])
    folder.mkdir(parents=True, exist_ok=True)
    _EXPORT["count"] += 1
    title = spec.get("title", "")
    title = title.get("text", "") if isinstance(title, dict) else title
    title = " ".join(title) if isinstance(title, list) else str(title)
    slug = re.sub(r"[^a-z0-9]+", "-", title.lower()).strip("-")[:60] or "figure"
    stem = folder / f"{_EXPORT['count']:02d}-{slug}"
    stem.with_suffix(".svg").write_text(vl_convert.vegalite_to_svg(spec), encoding="utf-8")
    stem.with_suffix(".pdf").write_bytes(vl_convert.vegalite_to_pdf(spec))


def _offline_renderer(spec: dict, **metadata: Any) -> dict[str, Any]:
    """altair renderer: a ``text/html`` bundle for the book, the vega-lite mimetype (so the chart also renders in
    JupyterLab, VS Code and papermill's output notebooks, which do not load the book's bundle) and a
    ``text/plain`` stand-in. Raw field names become readable titles (:func:`readable_titles`), task ids the book's
    task names (:func:`task_names`); with an export folder
    set (:func:`setup`), the chart is also written there as SVG and PDF."""
    import copy

    embed_options = metadata.pop("embed_options", None)
    spec = task_names(readable_titles(copy.deepcopy(spec)))
    if _EXPORT["folder"]:
        _export(spec)
    return {
        "text/html": offline_html(spec, embed_options=embed_options),
        VEGALITE_MIMETYPE: spec,
        "text/plain": f"<papa_lib chart: {spec.get('$schema', 'vega-lite spec')}>",
    }


def _papa_theme() -> dict[str, Any]:
    """The book's altair theme: a width that fits the page column with a legend, readable fonts."""
    font = "system-ui, -apple-system, 'Segoe UI', Roboto, 'Helvetica Neue', Arial, sans-serif"
    return {
        "config": {
            "view": {"continuousWidth": 440, "continuousHeight": 300, "stroke": None},
            "font": font,
            "title": {"fontSize": 15, "subtitleFontSize": 12, "subtitleColor": "#555", "anchor": "start"},
            # overlapping tick labels are dropped (greedy), on band (ordinal) axes too
            "axis": {"labelFontSize": 12, "titleFontSize": 13, "labelOverlap": "greedy", "labelSeparation": 3},
            "legend": {"labelFontSize": 12, "titleFontSize": 13},
        }
    }


def _register_theme(alt: Any) -> None:
    """Register and enable the book theme with whichever theme API this altair has."""
    if hasattr(alt, "theme") and hasattr(alt.theme, "register"):  # altair >= 5.5
        if THEME_NAME not in alt.theme.names():
            alt.theme.register(THEME_NAME, enable=False)(_papa_theme)
        alt.theme.enable(THEME_NAME)
    else:  # pragma: no cover - older altair
        alt.themes.register(THEME_NAME, _papa_theme)
        alt.themes.enable(THEME_NAME)


def _quiet_progress_fallback() -> None:
    """Keep tqdm's "IProgress not found" warning (with its site-packages path) off the pages: in a kernel without
    ipywidgets, ``tqdm.auto`` falls back to text bars and says so once, on first import; the chapters draw no
    progress bars (they pass ``progress=False``), so the note is noise. Only that warning is ignored."""
    import warnings

    from tqdm import TqdmWarning  # a dependency of the library

    warnings.filterwarnings("ignore", message="IProgress not found", category=TqdmWarning)


def setup(offline: bool | None = None, theme: bool = True, export_to: Any = None) -> str:
    """Configure altair for the book; call once at the top of a chapter.

    ``offline=None`` means offline everywhere except Google Colab, where altair's default
    renderer works.  ``offline=True`` enables the ``papa_offline`` renderer (interactive
    ``text/html`` that uses the bundled vegaEmbed, no CDN, no PNG/SVG fallback);
    ``offline=False`` enables altair's ``default`` renderer (e.g. for JupyterLab).
    ``theme=True`` also enables the book's altair theme. ``export_to`` (a folder; default: the environment variable
    ``PAPA_FIGURES_DIR``) also writes every chart the offline renderer draws there as SVG and PDF, for papers.
    Tables shown as DataFrames get readable headers, three significant figures and words for missing values
    (:func:`papa_lib.book.tables.install`). Returns the renderer name enabled.
    """
    import os

    import altair as alt

    from . import tables

    folder = export_to if export_to is not None else os.environ.get("PAPA_FIGURES_DIR") or None
    _EXPORT.update(folder=folder, count=0)
    tables.install()
    _quiet_progress_fallback()

    if offline is None:
        offline = not in_colab()
    if OFFLINE_RENDERER not in alt.renderers.names():
        alt.renderers.register(OFFLINE_RENDERER, _offline_renderer)
    name = OFFLINE_RENDERER if offline else "default"
    alt.renderers.enable(name)
    if theme:
        _register_theme(alt)
    return name


def bundle_javascript(vl_version: str | None = None) -> str:
    """Return the self-contained vega + vega-lite + vega-embed bundle for the book's pages.

    Built with ``vl_convert.javascript_bundle()``; its default snippet assigns ``vegaEmbed``,
    ``vegaLite`` and ``vega`` to ``window``.  The bundle is wrapped in a function so that its
    top-level ``const`` declarations cannot clash with other scripts on the page.
    ``vl_version`` defaults to the vega-lite version of the installed altair (``"6.4"``...)
    when vl-convert ships it, else vl-convert's latest.
    """
    try:
        import vl_convert
    except ImportError as exc:
        raise ImportError(
            "vl-convert-python is needed to bundle vega/vega-lite/vega-embed for the offline book "
            "charts: pip install 'papa_lib[book]'"
        ) from exc

    if vl_version is None:
        try:
            import altair as alt

            major_minor = ".".join(alt.SCHEMA_VERSION.lstrip("v").split(".")[:2])
            if major_minor in vl_convert.get_vegalite_versions():
                vl_version = major_minor
        except ImportError:  # pragma: no cover - altair is a book dependency
            pass
    code = vl_convert.javascript_bundle(vl_version=vl_version)
    header = (
        f"/* PAPA book offline chart bundle: vega {vl_convert.get_vega_version()}, "
        f"vega-lite {vl_version or 'latest'}, vega-embed {vl_convert.get_vega_embed_version()}; "
        "generated by papa_lib.book.charts.bundle_javascript() with vl-convert. */\n"
    )
    return header + "(function () {\n" + code + "\n})();\n"


def heatmap_chart(packed: pd.DataFrame, selectors: Mapping[str, Any], *, facet: str | None = None,
                  facet_values: Sequence[Any] | None = None,
                  facet_titles: Sequence[str | Sequence[str]] | None = None, columns: int | None = None,
                  scale: int = 1000, cell: int = 12, value_title: str = "attention",
                  color_type: str = "sqrt", title: Any = None, shared_rows: bool = False) -> Any:
    """Heat maps of the matrices of ``packed`` (:func:`papa_lib.analysis.patterns.packed_heatmaps`) picked by altair
    parameters.

    ``selectors`` maps a key field to an ``alt.param`` (bound to a dropdown or slider): only rows whose field equals
    the parameter's value are drawn. With ``facet``, one heat map per value of that field, side by side (``columns``
    per row; one shared colour scale). ``shared_rows=True`` says every facet has the same query positions: only the
    first panel of a row draws the query axis, the axis titles are short and the colour legend sits below, so more
    panels fit the page column. A facet title given as a list is drawn one line per item. The matrices are unpacked
    in the browser (flatten + window), so the page carries only the packed integers. Returns an altair chart with
    the parameters attached at the top level.
    """
    import altair as alt

    if "labels" not in packed.columns or "cells" not in packed.columns:
        raise ValueError("heatmap_chart needs a packed_heatmaps() frame (columns 'labels' and 'cells')")
    for field in selectors:
        if field not in packed.columns:
            raise ValueError(f"selector field {field!r} is not a column of the packed frame")
    if facet is not None and facet not in packed.columns:
        raise ValueError(f"facet field {facet!r} is not a column of the packed frame")
    condition = " && ".join(f"datum[{_js(field)}] == {param.name}" for field, param in selectors.items()) or "true"
    group = list(selectors) + ([facet] if facet else [])
    size = max(len(labels) for labels in packed["labels"])
    # Key labels tilted by label_angle lie cell * sin(angle) apart, enough for 9 px text from 11 px cells on; the
    # browser's overlap test compares upright boxes, so it would hide every other label there, the final [SEP] too.
    label_angle, label_size = -60, 9
    crowded = cell * math.sin(math.radians(-label_angle)) < label_size

    def one(value=None, subtitle=None, query_axis=True):
        base = alt.Chart(packed).transform_filter(condition)
        if facet is not None:
            base = base.transform_filter(f"datum[{_js(facet)}] == {_js(value)}")
        chart = (
            base.transform_flatten(["cells"], as_=["cell"])
            .transform_window(index="row_number()", groupby=group)
            .transform_calculate(
                q="floor((datum.index - 1) / length(datum.labels))",
                k="(datum.index - 1) % length(datum.labels)",
            )
            .transform_calculate(
                query="datum.labels[datum.q]", key="datum.labels[datum.k]", weight=f"datum.cell / {scale}"
            )
            .mark_rect()
            .encode(
                x=alt.X("key:O", title="key position" if shared_rows else "key position (attended to)",
                        axis=alt.Axis(labelAngle=label_angle, labelFontSize=label_size, labelOverlap=crowded)),
                y=alt.Y("query:O", title=(None if not query_axis else "query position" if shared_rows
                                          else "query position (attending)"),
                        axis=alt.Axis(labelFontSize=label_size) if query_axis else None),
                color=alt.Color("weight:Q", title=value_title, scale=alt.Scale(type=color_type, scheme="blues"),
                                legend=alt.Legend(orient="bottom") if shared_rows else alt.Legend()),
                tooltip=[
                    alt.Tooltip("query:N", title="query"),
                    alt.Tooltip("key:N", title="key"),
                    alt.Tooltip("weight:Q", title=value_title, format=".3f"),
                ],
            )
            .properties(width=cell * size, height=cell * size)
        )
        if subtitle is not None:
            text = list(map(str, subtitle)) if isinstance(subtitle, (list, tuple)) else str(subtitle)
            chart = chart.properties(title=alt.TitleParams(text, fontSize=12, anchor="start"))
        return chart

    if facet is None:
        chart = one()
    else:
        values = list(facet_values) if facet_values is not None else list(dict.fromkeys(packed[facet]))
        titles = list(facet_titles) if facet_titles is not None else [str(v) for v in values]
        if columns is not None and (isinstance(columns, bool) or not isinstance(columns, int) or columns < 1):
            raise ValueError(f"columns must be a positive integer, got {columns!r}")
        per_row = columns or len(values)
        panels = [one(v, t, query_axis=not shared_rows or i % per_row == 0)
                  for i, (v, t) in enumerate(zip(values, titles))]
        rows = [alt.hconcat(*panels[i : i + per_row]) for i in range(0, len(panels), per_row)]
        chart = (rows[0] if len(rows) == 1 else alt.vconcat(*rows)).resolve_scale(color="shared")
    if selectors:
        chart = chart.add_params(*selectors.values())
    if title is not None:
        chart = chart.properties(title=title)
    return chart


def _js(value: Any) -> str:
    """A Python value as a vega expression literal."""
    return json.dumps(value.item() if hasattr(value, "item") and not isinstance(value, (str, bytes)) else value)
