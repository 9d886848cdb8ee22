"""The Sphinx side of the book (``papa_book`` is the extension named in ``_config.yml``): the offline vega bundle
every chart page loads, MathJax served from the book itself (no CDN), one copy of each page script, and honest
execution: pages re-execute when papa_lib or ``data/`` changed or when they failed last time, and every build writes
its pages' execution status (:mod:`papa_book.execution`).

:func:`setup` is what Sphinx calls; the chapters and their twins live in :mod:`papa_book.chapters`, the build
and the command line in :mod:`papa_book.build`.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from . import execution
from .build import BUILD_ENV_FLAG, with_pythonpath
from .chapters import repository_version

#: The intro's claims table (a cell tagged claims-table) keeps its statement in this column; the style sheet widens it.
STATEMENT_COLUMN = 3

# --------------------------------------------------------------------------------------------
# Sphinx extension: the offline vega bundle
# --------------------------------------------------------------------------------------------


def _write_vega_bundle(app: Any) -> None:
    """``builder-inited``: write ``_static/papa-vega-bundle.js`` and add it to every page."""
    if getattr(app.builder, "format", None) != "html":
        return
    from papa_lib.book import charts

    static_dir = Path(app.outdir) / "_static"
    static_dir.mkdir(parents=True, exist_ok=True)
    target = static_dir / charts.BUNDLE_FILENAME
    code = charts.bundle_javascript()
    if not target.is_file() or target.read_text(encoding="utf-8") != code:
        target.write_text(code, encoding="utf-8")
    # A classic (blocking) script in <head>: window.vegaEmbed exists before any chart cell runs.
    app.add_js_file(charts.BUNDLE_FILENAME)
    css = static_dir / STYLE_FILENAME
    if not css.is_file() or css.read_text(encoding="utf-8") != BOOK_CSS:
        css.write_text(BOOK_CSS, encoding="utf-8")
    app.add_css_file(STYLE_FILENAME)


#: The book's own style sheet (written into ``_static`` next to the vega bundle).
STYLE_FILENAME = "papa-book.css"
#: Printed output wraps instead of running past the column's right edge (a long notice stays readable). Tables
#: printed by cells are set at 0.8 em with narrow padding, so that a table of both models (a model column beside
#: the task) fits the page column instead of hiding its last columns behind a scroll bar (checked in headless
#: Chromium by tests/test_book_browser.py); a table still too wide scrolls inside its own box instead of widening
#: the page. The intro's claims table (its cell tagged ``claims-table``) gives the statement column room, so that
#: its rows stay a few lines tall.
BOOK_CSS = """/* papa_lib.book: printed output wraps; tables fit the column, or scroll inside their own box */
div.cell_output .output pre, div.cell_output .output.stream pre, div.cell_output .output.stderr pre {
  white-space: pre-wrap;
  overflow-wrap: anywhere;
}
div.cell_output .output.text_html { overflow-x: auto; max-width: 100%; }
div.cell_output table { font-size: 0.8em; }
div.cell_output table td, div.cell_output table th { white-space: normal; padding: 0.2em 0.45em; }
div.papa-provenance p { margin: 0.25em 0; }
""" + f"div.tag_claims-table table td:nth-child({STATEMENT_COLUMN}) {{ min-width: 16em; }}\n"


#: Where the offline MathJax goes inside the book's ``_static`` folder; ``mathjax_path`` in ``_config.yml`` points
#: here (``mathjax/MathJax.js``).
MATHJAX_FOLDER = "mathjax"
#: The same MathJax version on a CDN: the fallback (with a build warning) when ``jupyter-server-mathjax`` is missing.
MATHJAX_CDN_FALLBACK = "https://cdn.jsdelivr.net/npm/mathjax@2.7.9/MathJax.js"
#: Parts of the MathJax 2 distribution the book's pages never load (other languages, speech maps for the
#: accessibility explorer, the SVG output's fonts); left out to keep the built book small.
_MATHJAX_SKIP = ("localization/", "extensions/a11y/mathmaps/", "jax/output/SVG/", "LICENSE")


def mathjax_source() -> Path | None:
    """The MathJax 2 files shipped by the ``jupyter-server-mathjax`` package (its ``static`` folder), or None.

    The package is located without importing it (its ``__init__`` imports jupyter-server, which the book does not
    need), so ``pip install --no-deps jupyter-server-mathjax`` is enough.
    """
    import importlib.util

    spec = importlib.util.find_spec("jupyter_server_mathjax")
    for location in (spec.submodule_search_locations or []) if spec is not None else []:
        static = Path(location) / "static"
        if (static / "MathJax.js").is_file():
            return static
    return None


def copy_mathjax(target: str | os.PathLike, source: str | os.PathLike | None = None) -> int:
    """Copy the MathJax 2 files the book needs into ``target``; return how many files were (re)written.

    Copies everything under ``source`` (default :func:`mathjax_source`) except :data:`_MATHJAX_SKIP`, but keeps the
    English localization; files already present with the same size are left alone (incremental builds).
    """
    import shutil

    source = Path(source) if source is not None else mathjax_source()
    if source is None or not (source / "MathJax.js").is_file():
        raise FileNotFoundError(
            "MathJax 2 not found: install the package that ships it, `pip install jupyter-server-mathjax` "
            "(part of papa_lib[book])"
        )
    target = Path(target)
    written = 0
    for path in sorted(source.rglob("*")):
        relative = path.relative_to(source).as_posix()
        skipped = relative.startswith(_MATHJAX_SKIP) and not relative.startswith("localization/en/")
        if not path.is_file() or skipped:
            continue
        destination = target / relative
        if destination.is_file() and destination.stat().st_size == path.stat().st_size:
            continue
        destination.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, destination)
        written += 1
    return written


def _install_offline_mathjax(app: Any) -> None:
    """``builder-inited`` (after MyST's own MathJax set-up): serve MathJax 2 from the book itself.

    When ``mathjax_path`` points inside the book (``mathjax/MathJax.js``, relative to ``_static``), copy the files
    there. MyST configures MathJax 3 (``mathjax3_config``, which also makes Sphinx load MathJax deferred); for the
    bundled MathJax 2 that configuration is dropped — ``mathjax2_config`` in ``_config.yml`` carries the same
    settings (only the MyST math elements are typeset). Without the package the build warns and falls back to the
    same MathJax version on a CDN.
    """
    if getattr(app.builder, "format", None) != "html":
        return
    path = str(getattr(app.config, "mathjax_path", "") or "")
    if "://" in path or not path.startswith(MATHJAX_FOLDER + "/"):
        return
    app.config.mathjax3_config = None
    source = mathjax_source()
    if source is None:
        from sphinx.util import logging as sphinx_logging

        sphinx_logging.getLogger(__name__).warning(
            "jupyter-server-mathjax is not installed, so equations load MathJax from %s (needs a network); "
            "pip install jupyter-server-mathjax (part of papa_lib[book])", MATHJAX_CDN_FALLBACK,
        )
        app.config.mathjax_path = MATHJAX_CDN_FALLBACK
        return
    copy_mathjax(Path(app.outdir) / "_static" / MATHJAX_FOLDER, source)


def _dedupe_page_scripts(app: Any, pagename: str, templatename: str, context: dict, doctree: Any) -> None:
    """``html-page-context``: drop repeated ``<script>`` entries from the page.

    Sphinx 7.4 lists an inline script added after the builder started twice (once as
    ``None``, once as ``""``); sphinx-thebe's ``const THEBE_JS_URL = ...`` then throws
    "Identifier 'THEBE_JS_URL' has already been declared" in the browser console.
    """
    scripts = context.get("script_files")
    if not isinstance(scripts, list):
        return
    seen: set = set()
    unique = []
    for script in scripts:
        attributes = getattr(script, "attributes", {}) or {}
        key = (
            getattr(script, "filename", script) or "",
            getattr(script, "priority", None),
            tuple(sorted((str(k), str(v)) for k, v in attributes.items())),
        )
        if key not in seen:
            seen.add(key)
            unique.append(script)
    scripts[:] = unique


# --------------------------------------------------------------------------------------------
# Sphinx extension: re-execute what is stale or failed, report every page's execution
# --------------------------------------------------------------------------------------------


def _note_fingerprint(app: Any, config: Any) -> None:
    """``config-inited``: fingerprint papa_lib and ``data/`` once per build; a jupyter-cache (``execute_notebooks:
    cache``) then lives in a folder named after it, so that no cached output of older library code is reused."""
    app.papa_fingerprint = execution.fingerprint(Path(app.confdir))
    if str(getattr(config, "nb_execution_mode", "")) == "cache":
        base = Path(str(config.nb_execution_cache_path or Path(app.outdir).parent / ".jupyter_cache"))
        config.nb_execution_cache_path = str(base / f"papa-{app.papa_fingerprint}")


def _launch_at_version(app: Any, config: Any) -> None:
    """``config-inited``: the header's Colab launch button opens the chapter at the book's ``repository.version``,
    the tag or commit the page's Colab badge and install cell use (Jupyter Book would take ``repository.branch``)."""
    path = Path(app.confdir) / "_config.yml"
    options = getattr(config, "html_theme_options", None)
    if path.is_file() and isinstance(options, dict) and "repository_branch" in options:
        options["repository_branch"] = repository_version(path)


def _stale_pages(app: Any, env: Any, added: set, changed: set, removed: set) -> list[str]:
    """``env-get-outdated``: the pages to read (and so execute) again although their source did not change.

    Every page when papa_lib or ``data/`` changed since the environment was saved; otherwise the pages whose
    execution failed in an earlier build (Sphinx would keep their failed output and report success).
    """
    from sphinx.util import logging as sphinx_logging

    log = sphinx_logging.getLogger(__name__)
    previous = getattr(env, "papa_fingerprint", None)
    env.papa_fingerprint = app.papa_fingerprint
    if previous != app.papa_fingerprint:  # also when the saved environment predates the fingerprint
        if env.all_docs:
            log.info("papa: papa_lib or data/ changed since the last build: every page executes again")
        return sorted(env.found_docs)
    metadata = getattr(env, "nb_metadata", None) or {}
    failed = sorted(doc for doc, data in metadata.items()
                    if isinstance(data, dict) and (data.get("exec_data") or {}).get("succeeded") is False)
    if failed:
        log.info("papa: executing again the pages that failed last time: %s", ", ".join(failed))
    return failed


def _write_execution_report(app: Any, exception: Exception | None) -> None:
    """``build-finished``: write the execution status of every page next to the output (``_build/``)."""
    env = getattr(app, "env", None)
    if env is None:
        return
    metadata = getattr(env, "nb_metadata", None) or {}
    pages = {doc: ((metadata.get(doc) or {}).get("exec_data") or None) for doc in env.found_docs}
    execution.write_report(Path(app.outdir).parent, pages, getattr(app, "papa_fingerprint", ""))


def setup(app: Any) -> dict[str, Any]:
    """Sphinx extension entry point (``sphinx.local_extensions: {papa_book: ./book/_ext}``).

    Writes the offline vega bundle into the HTML output and adds it to every page, copies MathJax 2 into the
    output so that equations render offline (:func:`_install_offline_mathjax`), removes
    duplicated page scripts (see :func:`_dedupe_page_scripts`), re-executes stale and failed pages
    (:func:`_stale_pages`), writes the execution report (:func:`_write_execution_report`), and puts
    the book root first on PYTHONPATH so that the kernels executing the chapters import this
    checkout's ``papa_lib`` even when it is not pip-installed.
    """
    root = Path(app.confdir).resolve()
    os.environ.update({k: v for k, v in with_pythonpath(os.environ, root).items() if k == "PYTHONPATH"})
    os.environ[BUILD_ENV_FLAG] = "1"
    app.connect("builder-inited", _write_vega_bundle)
    app.connect("builder-inited", _install_offline_mathjax, priority=800)  # after MyST's override (500)
    app.connect("html-page-context", _dedupe_page_scripts, priority=900)
    app.connect("config-inited", _note_fingerprint)
    app.connect("config-inited", _launch_at_version)
    app.connect("env-get-outdated", _stale_pages)
    app.connect("build-finished", _write_execution_report)
    return {"version": "1.0", "parallel_read_safe": True, "parallel_write_safe": True}
