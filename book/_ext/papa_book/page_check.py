"""What a reader must never see on an executed page, and links that lead nowhere.

:func:`text_problems` finds, in the visible text of a page or of one notebook output: object reprs
(``<… object at 0x…>``, ``<IPython.core.display.Markdown object>``), warnings, machine paths (``/tmp/``, ``.venv``,
home folders), tracebacks, ``NaN`` where a word belongs, template grammar (``task(s)``), raw head names
(``head 2.4``: write "layer 2, head 4") and numbers with more digits than a reader can compare (more than four
significant figures; tables show three). Code cells' sources are the author's code and are not scanned.
:func:`chart_problems` finds raw identifiers (``ci_low``, ``best_data_free_score``) used as an axis,
legend or column title of a vega-lite chart: an explicit title, or a field without a title (vega-lite then shows
the field's name). :func:`html_problems` applies both to a built HTML page (plus raw identifiers as table column
headers and raw integer DataFrame indexes), :func:`notebook_problems` to an executed notebook.

:func:`broken_links` lists the internal links of a built HTML folder whose target file does not exist;
:func:`papa_book.build.build_book` fails on any.
"""

from __future__ import annotations

import html as html_lib
import json
import re
from collections.abc import Iterable
from pathlib import Path
from urllib.parse import unquote, urlsplit

__all__ = ["broken_links", "chart_problems", "html_problems", "notebook_problems", "text_problems"]

#: (name, pattern) of what must not appear in the visible text of a page.
TEXT_PATTERNS: list[tuple[str, re.Pattern]] = [
    ("object repr", re.compile(r"<[\w.]+ object at 0x[0-9a-fA-F]+>|<IPython\.core\.display\.\w+ object>")),
    ("warning", re.compile(r"\b[A-Z]\w*Warning\b(?::|\s*\()")),
    ("machine path", re.compile(r"(?<![\w.])/tmp/|\w/\.venv/|(?<![\w.])/root/|(?<![\w.])/home/")),
    ("traceback", re.compile(r"Traceback \(most recent call last\)")),
    ("NaN", re.compile(r"(?<![\w\"'])(?:NaN|nan)(?![\w\"'])")),
    ("template grammar", re.compile(r"\w\((?:s|es)\)")),
    ("raw head name", re.compile(r"\b[Hh]ead \d+\.\d+\b")),
    ("too many digits", re.compile(r"(?<![\w.])[-−]?\d+\.\d+(?![\w.])")),
]
#: Significant figures a number in a page's text may show (a printed check: ``score -4.093``); tables show three.
MAX_SIGNIFICANT = 4
#: A raw identifier: snake_case, as a column or axis title.
IDENTIFIER = re.compile(r"^[a-z][a-z0-9]*(?:_[a-z0-9]+)+$")
_SPEC = re.compile(r"var spec = (\{.*?\});\n\s*var opt", re.DOTALL)
_TAGS = re.compile(r"<[^>]+>")
_INJECTED = re.compile(r'<div class="cell tag_injected-parameters[^"]*">.*?</pre>', re.DOTALL)
_INVISIBLE = re.compile(r"<(script|style|head)\b.*?</\1>", re.DOTALL | re.IGNORECASE)
#: A code cell's source (folded or shown): the author's code, not text the page says to its reader.
_CELL_INPUT = re.compile(r'<div class="cell_input[^"]*">.*?</pre>', re.DOTALL)
_CHANNELS = ("x", "y", "x2", "y2", "color", "fill", "stroke", "size", "shape", "opacity", "theta", "row", "column",
             "facet", "xOffset", "yOffset")


def _significant(number: str) -> int:
    """Significant figures of a decimal number as written (trailing zeros count: ``0.002000`` has 4)."""
    digits = re.sub(r"\D", "", number).lstrip("0")
    return len(digits)


def text_problems(text: str) -> list[str]:
    """``'<what>: <excerpt>'`` for each forbidden pattern found in ``text`` (visible text, not markup)."""
    found = []
    for name, pattern in TEXT_PATTERNS:
        for match in pattern.finditer(text):
            if name == "too many digits" and _significant(match.group(0)) <= MAX_SIGNIFICANT:
                continue
            start, end = max(0, match.start() - 40), match.end() + 40
            excerpt = " ".join(text[start:end].split())
            found.append(f"{name}: …{excerpt}…")
    return found


def _walk(spec):
    """Every dict inside a vega-lite spec."""
    if isinstance(spec, dict):
        yield spec
        for value in spec.values():
            yield from _walk(value)
    elif isinstance(spec, list):
        for value in spec:
            yield from _walk(value)


def _title_texts(node) -> list[str]:
    title = node.get("title")
    if isinstance(title, dict):
        title = [title.get("text", ""), title.get("subtitle", "")]
    titles = title if isinstance(title, list) else [title]
    out = []
    for item in titles:
        out += item if isinstance(item, list) else [item]
    return [t for t in out if isinstance(t, str)]


def chart_problems(spec: dict) -> list[str]:
    """Raw identifiers used as an axis, legend or header title in a vega-lite ``spec``, and what
    :func:`text_problems` finds in its titles (``head 2.4``, over-long numbers, ``task(s)``)."""
    found = []
    for node in _walk(spec):
        texts = _title_texts(node)
        if texts:
            found += [f"chart title: {p}" for p in text_problems(" ".join(texts))]
        encoding = node.get("encoding")
        if not isinstance(encoding, dict):
            continue
        for channel, definition in encoding.items():
            if channel not in _CHANNELS or not isinstance(definition, dict):
                continue
            if "title" in definition:
                title = definition["title"]
                titles = title if isinstance(title, list) else [title]
                bad = [t for t in titles if isinstance(t, str) and IDENTIFIER.match(t)]
            else:
                field = definition.get("field")
                hidden = any(definition.get(key) is None and key in definition for key in ("axis", "legend"))
                bad = [field] if isinstance(field, str) and IDENTIFIER.match(field) and not hidden else []
            found += [f"raw identifier as the {channel} title: {t}" for t in bad]
    return found


def _visible_text(page: str) -> str:
    return html_lib.unescape(_TAGS.sub(" ", _INVISIBLE.sub(" ", _CELL_INPUT.sub(" ", page))))


def html_problems(page: str) -> list[str]:
    """Everything :func:`text_problems` and :func:`chart_problems` find in one HTML page or output, plus raw
    identifiers as table headers, a raw integer index (a first body row headed ``0``) and a Markdown table left
    as text."""
    page = _INJECTED.sub(" ", page)  # papermill's injected-parameters cell is a run's, not the book's
    found = text_problems(_visible_text(page))
    for spec_text in _SPEC.findall(page):
        try:
            found += chart_problems(json.loads(spec_text))
        except json.JSONDecodeError:
            found.append("chart: its spec is not valid JSON")
    for header in re.findall(r"<th\b[^>]*>\s*([^<]*?)\s*</th>", page):
        if IDENTIFIER.match(header):
            found.append(f"raw identifier as a table header: {header}")
    if re.search(r"<tbody>\s*<tr>\s*<th\b[^>]*>\s*0\s*</th>", page):
        found.append("raw DataFrame index (rows numbered from 0)")
    if re.search(r"<p>\s*\|[^<]*\|\s*\n?\s*\|\s*(?:-|—|–|:)", page):
        found.append("a Markdown table printed as text (its pipes in a paragraph, not a <table>)")
    return found


def notebook_problems(path: str | Path) -> list[str]:
    """:func:`html_problems` / :func:`text_problems` over every output of an executed notebook (its HTML when it has
    one, else its markdown or plain text; stream and error outputs as text)."""
    import nbformat

    notebook = nbformat.read(str(path), as_version=4)
    found = []
    for index, cell in enumerate(notebook.cells):
        for output in cell.get("outputs", []):
            kind = output.get("output_type")
            if kind == "stream":
                problems = text_problems(output.get("text", ""))
            elif kind == "error":
                problems = [f"error output: {output.get('ename')}: {output.get('evalue')}"]
            else:
                data = output.get("data", {})
                if "text/html" in data:
                    problems = html_problems(data["text/html"])
                else:
                    problems = text_problems(data.get("text/markdown", data.get("text/plain", "")))
            found += [f"cell {index}: {p}" for p in problems]
    return found


def _links(page: str) -> Iterable[str]:
    pattern = r"""<(?:a|link)\b[^>]*\bhref=["']([^"']+)["']|<(?:img|script)\b[^>]*\bsrc=["']([^"']+)["']"""
    for match in re.finditer(pattern, page, re.IGNORECASE):
        yield match.group(1) or match.group(2)


def broken_links(html_dir: str | Path) -> list[str]:
    """``'<page>: <link>'`` for every link, image or script of a built HTML folder that points inside the folder at
    a file that does not exist (external ``http(s)``/``mailto``/``data`` links, pure ``#anchors`` and the theme's
    templates under ``_static/`` are skipped)."""
    root = Path(html_dir).resolve()
    broken = []
    for page in sorted(root.rglob("*.html")):
        if page.relative_to(root).parts[0] in ("_static", "_sources", "_images"):
            continue  # theme templates and copied assets, not pages of the book
        text = page.read_text(encoding="utf-8", errors="replace")
        for link in _links(text):
            parts = urlsplit(html_lib.unescape(link))
            if parts.scheme or parts.netloc or not parts.path or "{{" in link:
                continue
            target = (page.parent / unquote(parts.path)).resolve()
            if target.is_dir():
                target = target / "index.html"
            if not target.exists():
                broken.append(f"{page.relative_to(root).as_posix()}: {link}")
    return broken
