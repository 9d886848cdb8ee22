"""The built book works offline: charts render in headless Chromium with the network off, and fit the page.

Once per session, every chapter of ``_toc.yml`` is executed with papermill at the smoke profile
(``PAPA_BROWSER_PROFILE=local`` for the published profile) and the book is built from the executed
notebooks (plus a page with every kind of math); it is served on 127.0.0.1 and every chapter page is
opened in headless Chromium (Debian's ``chromium``) with every other host unreachable.  Chromium is
driven through the DevTools protocol with the small stdlib websocket client below (no extra
dependency).  Checks, per page: every chapter has at least one chart; each altair container
(``papa_lib.book.charts``) holds a non-empty SVG with the model/data/profile caption, and is no wider
than the content column it sits in at the book's default width (a 1280 px window), nor is any table a cell
prints (it would scroll its last columns out of sight); tooltips work;
nothing raises or logs a console error; nothing is fetched from outside the book (the Colab badge is
inlined by ``papa_book.offline_badge``); no local asset is missing.  A screenshot of the first
chapter is kept in ``$PAPA_TEST_ARTIFACTS`` (default: the session's pytest tmp dir; its path is
printed).

The tests of ``papa_lib.book.charts`` output and of the built HTML need no browser; those that do
are marked ``browser`` and skip when no Chromium binary is found.
"""

from __future__ import annotations

import base64
import functools
import http.server
import json
import os
import re
import shutil
import socket
import struct
import subprocess
import tempfile
import threading
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
from papa_book import build, chapters, page_check, sphinx_hooks

from conftest import JUPYTEXT_HEADER, copy_favicon
from papa_lib.book import charts

REPO = Path(__file__).resolve().parents[1]
BUNDLE = charts.BUNDLE_FILENAME
# Resources a reader's browser may fetch from the internet: none. Charts use the bundled vega, equations the
# bundled MathJax 2 (_static/mathjax, copied by papa_lib.book from jupyter-server-mathjax), and the Colab badge
# image is inlined (papa_book.offline_badge).
ALLOWED_EXTERNAL: tuple[str, ...] = ()
MATHJAX_SCRIPT = "_static/mathjax/MathJax.js"
# A page with every kind of math the chapters use, added to the minimal test build (intro has none).
MATH_PAGE = JUPYTEXT_HEADER + """
# Math check

Inline $A^h = \\operatorname{softmax}(Q K^\\top / \\sqrt{d'})$ and a price of 5 dollars, not math.

$$
C^h = \\frac{1}{|D|} \\sum_{i=1}^{|D|} A_i^h
$$

\\begin{align}
B_i^h &= \\lambda^h A_i^h + (1 - \\lambda^h) C^h
\\end{align}
"""


def _find_chromium() -> str | None:
    if Path("/usr/bin/chromium").is_file():
        return "/usr/bin/chromium"
    for name in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable"):
        if found := shutil.which(name):
            return found
    return None


CHROMIUM = _find_chromium()
needs_chromium = pytest.mark.skipif(CHROMIUM is None, reason="no chromium binary (/usr/bin/chromium or on PATH)")


# ---------------------------------------------------------------------------------------------
# papa_lib.book.charts output (no browser)
# ---------------------------------------------------------------------------------------------


@pytest.fixture(autouse=True)
def _restore_altair_state():
    """charts.setup() switches altair's global renderer and theme; put them back afterwards."""
    import altair as alt

    renderer, theme = alt.renderers.active, alt.theme.active
    yield
    alt.renderers.enable(renderer)
    alt.theme.enable(theme)


def _heads_chart():
    import altair as alt
    import pandas as pd

    data = pd.DataFrame({"model": ["a</script><script>alert(1)</script>", "b"], "heads": [144, 384]})
    return (
        alt.Chart(data)
        .mark_bar()
        .encode(x="heads:Q", y="model:N", tooltip=["model", "heads"])
        .properties(title=charts.chart_title("T", model="m", data="d", profile="smoke"))
    )


def test_offline_renderer_emits_self_contained_html():
    import altair as alt

    assert charts.setup(offline=True) == charts.OFFLINE_RENDERER
    assert alt.renderers.active == charts.OFFLINE_RENDERER
    bundle = _heads_chart()._repr_mimebundle_()
    bundle = bundle[0] if isinstance(bundle, tuple) else bundle
    # no PNG/SVG fallback; the vega-lite mimetype renders the chart in JupyterLab, VS Code and papermill outputs
    assert set(bundle) == {"text/html", charts.VEGALITE_MIMETYPE, "text/plain"}
    html = bundle["text/html"]
    assert "cdn.jsdelivr" not in html and "unpkg" not in html and "requirejs" not in html
    assert not re.search(r"<script[^>]*\bsrc\s*=", html), "the chart snippet must not load scripts"
    assert not re.search(r"""(?:src|href)\s*=\s*["']?https?:""", html)
    assert "window.vegaEmbed(el, spec, opt)" in html and f'class="{charts.CHART_CLASS}"' in html
    # the data cannot close the script element early
    assert html.count("</script>") == 1 and "alert(1)" in html
    # the inlined spec is the chart's spec
    spec_json = re.search(r"var spec = (\{.*?\});\n", html).group(1)
    assert json.loads(spec_json)["title"]["subtitle"] == "model: m, data: d, profile: smoke"


def test_every_chart_gets_its_own_container():
    charts.setup(offline=True)
    chart = _heads_chart()
    ids = set()
    for _ in range(3):
        bundle = chart._repr_mimebundle_()
        bundle = bundle[0] if isinstance(bundle, tuple) else bundle
        ids.add(re.search(r'<div id="([^"]+)"', bundle["text/html"]).group(1))
    assert len(ids) == 3


def test_setup_uses_default_renderer_in_colab(monkeypatch):
    import sys
    import types

    import altair as alt

    monkeypatch.setitem(sys.modules, "google.colab", types.ModuleType("google.colab"))
    try:
        assert charts.setup() == "default" and alt.renderers.active == "default"
    finally:
        charts.setup(offline=True)


def test_label_names_model_data_and_profile():
    assert charts.label("bert-base-uncased", "SST-2 dev", "paper") == (
        "model: bert-base-uncased, data: SST-2 dev, profile: paper"
    )
    with pytest.raises(ValueError, match="'data' is empty"):
        charts.label("m", "", "smoke")
    with pytest.raises(ValueError, match="'profile' is empty"):
        charts.label("m", "d", None)


def test_bundle_defines_global_vega_embed():
    code = charts.bundle_javascript()
    assert len(code) > 300_000
    assert "window.vegaEmbed=" in code.replace(" ", "")
    assert code.rstrip().endswith("})();"), "the bundle is wrapped so its top-level names stay private"
    assert "cdn.jsdelivr" not in code


# ---------------------------------------------------------------------------------------------
# The built book (no browser)
# ---------------------------------------------------------------------------------------------


#: The profile the browser tests execute the chapters at: ``smoke`` (seconds per chapter, the default) or ``local``
#: (the committed results and the embedded MiniLM, as the published book; minutes).
BROWSER_PROFILE = os.environ.get("PAPA_BROWSER_PROFILE", "smoke")
#: Chapters that have no chart (none: every chapter draws at least one figure at every profile).
CHARTLESS_CHAPTERS: set[str] = {"gridfile"}  # the grid-file reference is a table


def executed_book(root: Path, notebooks: list[Path], extra_pages: dict[str, str] | None = None) -> Path:
    """Lay out a book in ``root`` from executed chapter notebooks (papermill outputs), built without executing them
    again: the repository's ``_config.yml`` with ``execute_notebooks: "off"`` and the notebooks admitted as sources,
    its ``_toc.yml`` (plus ``extra_pages``: name -> MyST text) and links to ``papa_lib`` and ``book/_ext``.
    Returns ``root``."""
    import yaml

    config = yaml.safe_load((REPO / "_config.yml").read_text(encoding="utf-8"))
    config["execute"]["execute_notebooks"] = "off"
    config["exclude_patterns"] = [p for p in config["exclude_patterns"] if "ipynb" not in p] + ["_runs", "_runs/**"]
    (root / "_config.yml").write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf-8")
    (root / "papa_lib").symlink_to(REPO / "papa_lib", target_is_directory=True)
    (root / "book").mkdir(exist_ok=True)
    (root / "book" / "_ext").symlink_to(REPO / "book" / "_ext", target_is_directory=True)  # the Sphinx extension
    copy_favicon(config, root)
    if (REPO / "book" / "_static").is_dir():
        shutil.copytree(REPO / "book" / "_static", root / "book" / "_static", dirs_exist_ok=True)
    import nbformat

    stems = {n.stem for n in notebooks}
    for notebook in notebooks:  # built from the executed twins: links to a chapter's .md lead to its .ipynb here
        executed = nbformat.read(notebook, as_version=4)
        for cell in executed.cells:
            if cell.cell_type == "markdown":
                cell.source = re.sub(r"\]\((\w+)\.md(#[^)]*)?\)",
                                     lambda m: f"]({m[1]}.ipynb{m[2] or ''})" if m[1] in stems else m[0],
                                     cell.source)
        nbformat.write(executed, root / "book" / notebook.name)
    toc = yaml.safe_load((REPO / "_toc.yml").read_text(encoding="utf-8"))
    for name, text in (extra_pages or {}).items():
        (root / "book" / f"{name}.md").write_text(text, encoding="utf-8")
        # _toc.yml groups the chapters in parts (chapters, appendix): an extra page joins the first part
        (toc["parts"][0] if "parts" in toc else toc)["chapters"].append({"file": f"book/{name}"})
    (root / "_toc.yml").write_text(yaml.safe_dump(toc, sort_keys=False), encoding="utf-8")
    return root


@pytest.fixture(scope="session")
def built_book(tmp_path_factory) -> Path:
    """Execute every chapter of ``_toc.yml`` at :data:`BROWSER_PROFILE` (papermill, as ``papa reproduce`` does) and
    build the book from the executed notebooks (plus a page with every kind of math); return its HTML dir."""
    root = tmp_path_factory.mktemp("book")
    runs = root / "_runs"
    parameters = {"results_dir": str(runs / "results")} if BROWSER_PROFILE == "smoke" else {}
    notebooks = build.run_chapters(BROWSER_PROFILE, runs, parameters=parameters, resume=False, root=REPO)
    executed_book(root, notebooks, {"math_check": MATH_PAGE})
    return build.build_book(root, warnings_as_errors=True)


def _chapter_pages(html_dir: Path) -> list[Path]:
    pages = sorted((html_dir / "book").glob("*.html"))
    assert pages, f"no chapter pages under {html_dir / 'book'}"
    return pages


@pytest.mark.slow
def test_built_pages_load_the_local_vega_bundle(built_book):
    bundle = built_book / "_static" / BUNDLE
    assert bundle.is_file() and "window.vegaEmbed" in bundle.read_text(encoding="utf-8")
    for page in _chapter_pages(built_book):
        html = page.read_text(encoding="utf-8")
        sources = re.findall(r"<script[^>]*\bsrc=\"([^\"]+)\"", html)
        assert any(src.split("?")[0].endswith(f"_static/{BUNDLE}") for src in sources), page.name
        external = [s for s in sources if re.match(r"(https?:)?//", s)]
        assert all(s.startswith(ALLOWED_EXTERNAL) for s in external), f"{page.name}: external scripts {external}"
        assert "vega@" not in html and "vega-embed@" not in html and "vega-lite@" not in html
        # Sphinx 7.4 duplicates late inline scripts; papa_lib.book removes the copies
        assert html.count("const THEBE_JS_URL") <= 1, f"{page.name}: duplicated thebe config script"
        badges = re.findall(r'<img[^>]*alt="Open In Colab"[^>]*>', html)
        if page.stem != "math_check":
            assert badges, f"{page.name}: no Colab badge"
        for badge in badges:
            assert 'src="data:image/svg+xml' in badge, f"{page.name}: the Colab badge is not inlined: {badge[:200]}"
    intro = (built_book / "book" / "intro.html").read_text(encoding="utf-8")
    assert intro.count(f'class="{charts.CHART_CLASS}"') >= 1
    assert chapters.colab_url("book/intro.md", REPO / "_config.yml") in intro  # badge and launch button
    repository = chapters.load_config(REPO / "_config.yml")["repository"]["url"]
    assert f'href="{repository}"' in intro, "the GitHub button must point at repository.url"


@pytest.mark.slow
def test_built_pages_show_no_raw_output_and_no_broken_link(built_book):
    """Every executed page, as built: no object repr, warning, machine path, traceback, raw index or identifier,
    NaN, template grammar or over-long number in its article (papa_book.page_check), and no internal link
    that leads nowhere (build_book also fails on one)."""
    problems = {}
    for page in _chapter_pages(built_book):
        text = page.read_text(encoding="utf-8")
        article = re.search(r"<article\b.*?</article>", text, re.DOTALL)
        found = page_check.html_problems(article.group(0) if article else text)
        if found:
            problems[page.name] = found[:8]
    assert not problems, json.dumps(problems, indent=1, ensure_ascii=False)
    assert page_check.broken_links(built_book) == []
    css = built_book / "_static" / sphinx_hooks.STYLE_FILENAME
    assert css.is_file() and "pre-wrap" in css.read_text(encoding="utf-8")  # printed notices wrap


def _math_pages(html_dir: Path) -> list[Path]:
    return [page for page in _chapter_pages(html_dir) if 'class="math' in page.read_text(encoding="utf-8")]


@pytest.mark.slow
def test_math_pages_load_the_bundled_mathjax(built_book):
    static = built_book / "_static" / "mathjax"
    for part in ("MathJax.js", "config/TeX-AMS-MML_HTMLorMML-full.js", "extensions/tex2jax.js",
                 "fonts/HTML-CSS/STIX-Web/woff/STIXMathJax_Main-Regular.woff"):
        assert (static / part).is_file(), f"{part} was not copied into _static/mathjax"
    assert not (static / "localization" / "fr").exists(), "unused MathJax parts should not be copied"
    pages = _math_pages(built_book)
    assert pages, "no page of the test build has math"
    for page in pages:
        html = page.read_text(encoding="utf-8")
        sources = re.findall(r"<script[^>]*\bsrc=\"([^\"]+)\"", html)
        assert any(src.split("?")[0].endswith(MATHJAX_SCRIPT) for src in sources), f"{page.name}: {sources}"
        assert "cdn.jsdelivr" not in html and "mathjax@" not in html, page.name
        assert 'type="text/x-mathjax-config"' in html, f"{page.name}: no MathJax 2 configuration"
        assert "window.MathJax =" not in html, f"{page.name}: a MathJax 3 configuration would confuse MathJax 2"


def test_copy_mathjax_copies_what_pages_load_and_skips_the_rest(tmp_path):
    source = tmp_path / "static"
    for part in ("MathJax.js", "config/TeX-AMS-MML_HTMLorMML-full.js", "localization/en/en.js",
                 "localization/fr/fr.js", "extensions/a11y/mathmaps/en.js", "jax/output/SVG/fonts/a.js"):
        (source / part).parent.mkdir(parents=True, exist_ok=True)
        (source / part).write_text(part, encoding="utf-8")
    target = tmp_path / "out"
    assert sphinx_hooks.copy_mathjax(target, source) == 3
    copied = sorted(p.relative_to(target).as_posix() for p in target.rglob("*") if p.is_file())
    assert copied == ["MathJax.js", "config/TeX-AMS-MML_HTMLorMML-full.js", "localization/en/en.js"]
    assert sphinx_hooks.copy_mathjax(target, source) == 0  # incremental: nothing changed
    with pytest.raises(FileNotFoundError, match="jupyter-server-mathjax"):
        sphinx_hooks.copy_mathjax(target, tmp_path / "nowhere")


def test_offline_mathjax_hook_falls_back_to_the_cdn_with_a_warning(tmp_path, monkeypatch, caplog):
    from types import SimpleNamespace

    config = SimpleNamespace(mathjax_path="mathjax/MathJax.js", mathjax3_config={"options": {}})
    app = SimpleNamespace(builder=SimpleNamespace(format="html"), config=config, outdir=str(tmp_path))
    monkeypatch.setattr(sphinx_hooks, "mathjax_source", lambda: None)
    sphinx_hooks._install_offline_mathjax(app)
    assert config.mathjax_path == sphinx_hooks.MATHJAX_CDN_FALLBACK and config.mathjax3_config is None
    assert "jupyter-server-mathjax" in caplog.text
    # a CDN path in the config is left alone
    config.mathjax_path = "https://example.org/MathJax.js"
    sphinx_hooks._install_offline_mathjax(app)
    assert config.mathjax_path == "https://example.org/MathJax.js"


# ---------------------------------------------------------------------------------------------
# Headless Chromium through the DevTools protocol (stdlib websocket client)
# ---------------------------------------------------------------------------------------------


class _WebSocket:
    """Minimal RFC 6455 client: text frames, masking, fragmentation, ping/pong."""

    def __init__(self, url: str, timeout: float = 30.0):
        parts = urllib.parse.urlsplit(url)
        self.sock = socket.create_connection((parts.hostname, parts.port), timeout=timeout)
        key = base64.b64encode(os.urandom(16)).decode()
        request = (
            f"GET {parts.path} HTTP/1.1\r\nHost: {parts.hostname}:{parts.port}\r\nUpgrade: websocket\r\n"
            f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n"
        )
        self.sock.sendall(request.encode())
        self._buffer = b""
        while b"\r\n\r\n" not in self._buffer:
            chunk = self.sock.recv(65536)
            if not chunk:
                raise ConnectionError("DevTools closed the websocket handshake")
            self._buffer += chunk
        head, self._buffer = self._buffer.split(b"\r\n\r\n", 1)
        if b" 101 " not in head.split(b"\r\n", 1)[0]:
            raise ConnectionError(f"websocket handshake refused: {head[:200]!r}")

    def _read(self, n: int) -> bytes:
        while len(self._buffer) < n:
            chunk = self.sock.recv(max(65536, n - len(self._buffer)))
            if not chunk:
                raise ConnectionError("DevTools closed the websocket")
            self._buffer += chunk
        data, self._buffer = self._buffer[:n], self._buffer[n:]
        return data

    def _send_frame(self, opcode: int, payload: bytes) -> None:
        header = bytearray([0x80 | opcode])
        n = len(payload)
        if n < 126:
            header.append(0x80 | n)
        elif n < 1 << 16:
            header += bytes([0x80 | 126]) + struct.pack(">H", n)
        else:
            header += bytes([0x80 | 127]) + struct.pack(">Q", n)
        mask = os.urandom(4)
        masked = (int.from_bytes(payload, "big") ^ int.from_bytes((mask * (n // 4 + 1))[:n], "big")).to_bytes(n, "big")
        self.sock.sendall(bytes(header) + mask + masked)

    def send(self, text: str) -> None:
        self._send_frame(0x1, text.encode("utf-8"))

    def recv(self) -> str:
        message = b""
        while True:
            first, second = self._read(2)
            length = second & 0x7F
            if length == 126:
                length = struct.unpack(">H", self._read(2))[0]
            elif length == 127:
                length = struct.unpack(">Q", self._read(8))[0]
            mask = self._read(4) if second & 0x80 else None
            data = self._read(length)
            if mask:
                data = bytes(b ^ mask[i % 4] for i, b in enumerate(data))
            opcode = first & 0x0F
            if opcode == 0x8:
                raise ConnectionError("DevTools closed the websocket")
            if opcode == 0x9:
                self._send_frame(0xA, data)
                continue
            if opcode in (0x0, 0x1, 0x2):
                message += data
                if first & 0x80:
                    return message.decode("utf-8")

    def close(self) -> None:
        try:
            self._send_frame(0x8, b"")
        except OSError:
            pass
        self.sock.close()


class _DevTools:
    """Calls DevTools methods on one page target and keeps the events it receives."""

    def __init__(self, ws: _WebSocket):
        self.ws = ws
        self.events: list[dict] = []
        self._next_id = 0

    def _receive(self, deadline: float) -> dict:
        self.ws.sock.settimeout(max(0.05, deadline - time.monotonic()))
        message = json.loads(self.ws.recv())
        if "method" in message:
            self.events.append(message)
        return message

    def call(self, method: str, timeout: float = 30.0, **params) -> dict:
        self._next_id += 1
        call_id = self._next_id
        self.ws.send(json.dumps({"id": call_id, "method": method, "params": params}))
        deadline = time.monotonic() + timeout
        while True:
            message = self._receive(deadline)
            if message.get("id") == call_id:
                if "error" in message:
                    raise RuntimeError(f"DevTools {method} failed: {message['error']}")
                return message.get("result", {})

    def wait_for(self, method: str, timeout: float = 30.0) -> dict:
        deadline = time.monotonic() + timeout
        while True:
            for event in self.events:
                if event["method"] == method:
                    self.events.remove(event)
                    return event
            if time.monotonic() > deadline:
                raise TimeoutError(f"no {method} event within {timeout} s")
            try:
                self._receive(deadline)
            except TimeoutError:
                pass

    def evaluate(self, expression: str):
        result = self.call("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in result:
            raise RuntimeError(f"page script failed: {result['exceptionDetails']}")
        return result["result"].get("value")

    def drain(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            try:
                self._receive(deadline)
            except TimeoutError:
                break


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):  # keep pytest output clean
        pass


@pytest.fixture(scope="session")
def book_server(built_book):
    """Serve the built HTML on 127.0.0.1 (a free port); yield the base URL."""
    handler = functools.partial(_QuietHandler, directory=str(built_book))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


@pytest.fixture(scope="session")
def chromium():
    """Start headless Chromium with the network off; yield a DevTools client on its page."""
    if CHROMIUM is None:
        pytest.skip("no chromium binary")
    profile_dir = Path(tempfile.mkdtemp(prefix="papa-chromium-"))
    log = (profile_dir / "chromium.log").open("wb")
    command = [
        CHROMIUM,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        f"--user-data-dir={profile_dir}",
        # network off: every name fails to resolve, any proxied request goes to a closed port
        "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1",
        "--proxy-server=127.0.0.1:9",
        "--proxy-bypass-list=127.0.0.1",
        "--window-size=1280,2000",
        "--remote-debugging-address=127.0.0.1",
        "--remote-debugging-port=0",
        "about:blank",
    ]
    process = subprocess.Popen(command, stdout=log, stderr=log, stdin=subprocess.DEVNULL)
    ws = None
    try:
        port_file = profile_dir / "DevToolsActivePort"
        deadline = time.monotonic() + 30
        while not (port_file.is_file() and port_file.read_text().strip()):
            if process.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"chromium did not start: {(profile_dir / 'chromium.log').read_text()[-3000:]}")
            time.sleep(0.1)
        port = int(port_file.read_text().split()[0])
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        targets = json.loads(opener.open(f"http://127.0.0.1:{port}/json/list", timeout=10).read())
        page = next(t for t in targets if t.get("type") == "page")
        ws = _WebSocket(page["webSocketDebuggerUrl"])
        devtools = _DevTools(ws)
        for domain in ("Page", "Runtime", "Log", "Network"):
            devtools.call(f"{domain}.enable")
        yield devtools
    finally:
        if ws is not None:
            ws.close()
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
        log.close()
        shutil.rmtree(profile_dir, ignore_errors=True)


CHART_STATE_JS = f"""
(() => {{
  const boxes = Array.from(document.querySelectorAll('.{charts.CHART_CLASS}'));
  return {{
    vegaEmbed: typeof window.vegaEmbed,
    charts: boxes.map((box) => {{
      const svg = box.querySelector('svg');
      const canvas = box.querySelector('canvas');
      const drawn = (svg || canvas || box).getBoundingClientRect();
      const column = (box.closest('.cell_output, .output, article') || box.parentElement).getBoundingClientRect();
      return {{
        id: box.id,
        width: Math.round(drawn.width),
        left: Math.round(drawn.left),
        right: Math.round(drawn.right),
        column_left: Math.round(column.left),
        column_right: Math.round(column.right),
        column_width: Math.round(column.width),
        embedded: box.classList.contains('vega-embed'),
        marks: svg ? svg.querySelectorAll('path, rect, line, text').length : 0,
        canvas: canvas ? canvas.width * canvas.height : 0,
        text: svg ? Array.from(svg.querySelectorAll('text')).map((t) => t.textContent).join(' | ') : '',
        message: svg ? '' : box.textContent.slice(0, 300),
      }};
    }}),
    tables: Array.from(document.querySelectorAll('.cell_output .output.text_html'))
      .filter((box) => box.querySelector('table'))
      .map((box) => ({{
        width: box.clientWidth,
        scroll: box.scrollWidth,
        text: box.querySelector('table').innerText.replace(/\\s+/g, ' ').slice(0, 80),
      }})),
  }};
}})()
"""


def _problems(events: list[dict], base_url: str) -> list[str]:
    """Console errors, exceptions and failed requests recorded while a page was open."""
    urls = {
        e["params"]["requestId"]: (e["params"]["request"]["url"], e["params"].get("type", ""))
        for e in events
        if e["method"] == "Network.requestWillBeSent"
    }
    problems = []
    for event in events:
        method, params = event["method"], event.get("params", {})
        if method == "Runtime.exceptionThrown":
            details = params["exceptionDetails"]
            text = details.get("exception", {}).get("description") or details.get("text")
            problems.append(f"uncaught exception: {text} ({details.get('url', '')}:{details.get('lineNumber')})")
        elif method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
            args = " ".join(str(a.get("value", a.get("description", ""))) for a in params.get("args", []))
            problems.append(f"console.{params['type']}: {args}")
        elif method == "Log.entryAdded" and params["entry"]["level"] == "error":
            entry = params["entry"]
            if entry.get("source") == "network" and entry.get("url", "").startswith(ALLOWED_EXTERNAL):
                continue
            problems.append(f"console {entry.get('source')} error: {entry.get('text')} {entry.get('url', '')}")
        elif method == "Network.loadingFailed":
            url, kind = urls.get(params["requestId"], ("?", params.get("type", "")))
            if url.startswith(base_url) or not url.startswith(ALLOWED_EXTERNAL):
                problems.append(f"failed to load {kind} {url}: {params.get('errorText')}")
        elif method == "Network.responseReceived":
            response = params["response"]
            if response["url"].startswith(base_url) and response["status"] >= 400:
                problems.append(f"HTTP {response['status']} for {response['url']}")
    return problems


def _open(chromium: _DevTools, url: str, timeout: float = 30.0) -> dict:
    """Load ``url``, wait until every chart container has rendered (or failed), return its state."""
    chromium.events.clear()
    chromium.call("Page.navigate", url=url)
    chromium.wait_for("Page.loadEventFired", timeout=timeout)
    deadline = time.monotonic() + 15
    while True:
        state = chromium.evaluate(CHART_STATE_JS)
        done = all(c["marks"] or c["canvas"] or c["message"] for c in state["charts"])
        if done or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    chromium.drain(0.5)  # late console messages
    return state


@pytest.mark.slow
@pytest.mark.browser
@needs_chromium
def test_chapter_pages_render_their_charts_offline(built_book, book_server, chromium):
    toc_stems = {path.stem for path in chapters.toc_chapters(REPO)}
    pages = _chapter_pages(built_book)
    assert toc_stems <= {page.stem for page in pages}, "a chapter of _toc.yml has no page"
    for page in pages:
        url = f"{book_server}/{page.relative_to(built_book).as_posix()}"
        state = _open(chromium, url)
        problems = _problems(chromium.events, book_server)
        assert not problems, f"{page.name}: " + "\n".join(problems)
        assert state["vegaEmbed"] == "function", f"{page.name}: the offline vega bundle did not load"
        html = page.read_text(encoding="utf-8")
        assert len(state["charts"]) == html.count(f'class="{charts.CHART_CLASS}"'), page.name
        if page.stem in toc_stems - CHARTLESS_CHAPTERS:
            assert state["charts"], f"{page.name}: no chart on the page"
        for chart in state["charts"]:
            assert chart["embedded"] and (chart["marks"] > 0 or chart["canvas"] > 0), (
                f"{page.name}: chart {chart['id']} did not render: {chart['message']}"
            )
            for word in ("model:", "data:", "profile:"):
                assert word in chart["text"], f"{page.name}: chart {chart['id']} does not say its {word[:-1]}"
            assert chart["width"] <= chart["column_width"] + 1 and chart["right"] <= chart["column_right"] + 1, (
                f"{page.name}: chart {chart['id']} ({chart['text'][:60]!r}) is {chart['width']} px wide, wider than "
                f"its {chart['column_width']} px column (right edge {chart['right']} > {chart['column_right']})"
            )
        for table in state["tables"]:  # a table wider than its box hides its last columns behind a scroll bar
            assert table["scroll"] <= table["width"] + 1, (
                f"{page.name}: table {table['text']!r} is {table['scroll']} px wide in a {table['width']} px column"
            )


@pytest.mark.slow
@pytest.mark.browser
@needs_chromium
def test_intro_chart_is_interactive_and_screenshot_is_kept(built_book, book_server, chromium, tmp_path_factory):
    state = _open(chromium, f"{book_server}/book/intro.html")
    assert state["charts"], "intro.html has no chart"
    # the heads chart (the schematic of PAPA comes first on the page)
    first = next((c for c in state["charts"] if "Attention heads PAPA can replace" in c["text"]), None)
    assert first is not None, [c["text"][:80] for c in state["charts"]]
    assert f"profile: {BROWSER_PROFILE}" in first["text"]
    bars = chromium.evaluate(
        f"""(() => {{
        const bars = document.querySelectorAll('#{first['id']} .mark-rect path');
        bars[0].scrollIntoView({{block: 'center'}});
        const box = bars[0].getBoundingClientRect();
        return {{count: bars.length, x: box.x + box.width / 2, y: box.y + box.height / 2}};
    }})()"""
    )
    assert bars["count"] == 8  # the seven paper models + the embedded MiniLM
    chromium.call("Input.dispatchMouseEvent", type="mouseMoved", x=bars["x"], y=bars["y"])
    deadline = time.monotonic() + 5
    tooltip = ""
    while time.monotonic() < deadline and "heads in total" not in tooltip:
        tooltip = chromium.evaluate(
            "(() => { const t = document.querySelector('#vg-tooltip-element.visible');"
            " return t ? t.textContent : ''; })()"
        )
        time.sleep(0.1)
    assert "heads in total" in tooltip, f"no tooltip over the first bar (got {tooltip!r})"

    chromium.evaluate(f"document.getElementById('{first['id']}').scrollIntoView({{block: 'center'}})")
    time.sleep(0.3)
    shot = chromium.call("Page.captureScreenshot", format="png")  # the 1280x2000 viewport
    out_dir = Path(os.environ.get("PAPA_TEST_ARTIFACTS") or tmp_path_factory.mktemp("artifacts"))
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "book-intro.png"
    path.write_bytes(base64.b64decode(shot["data"]))
    print(f"screenshot of the built intro page: {path}")
    assert path.stat().st_size > 20_000 and path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


MATH_STATE_JS = """
(() => {
  const hub = window.MathJax && window.MathJax.Hub;
  if (!hub || !window.MathJax.isReady) { return null; }
  return new Promise((resolve) => hub.Queue(() => {
    const html = window.MathJax.OutputJax && window.MathJax.OutputJax['HTML-CSS'];
    // MyST's math elements, without the copies of headings in the (possibly hidden) navigation
    const sources = Array.from(document.querySelectorAll('.math.notranslate')).filter((e) => !e.closest('nav'));
    const typeset = sources.filter((e) => e.querySelector('.MathJax, .MathJax_Display'));
    const slash = String.fromCharCode(92);
    resolve({
      sources: sources.length,
      typeset: typeset.length,
      visible: typeset.filter(
        (e) => e.querySelector('.MathJax, .MathJax_Display').getBoundingClientRect().width > 0).length,
      errors: document.querySelectorAll('.MathJax_Error, .merror, .noError, [data-mjx-error]').length,
      raw: sources.filter((e) => e.textContent.includes(slash + '(') || e.textContent.includes(slash + '[')).length,
      font: html ? html.fontInUse : null,
    });
  }));
})()
"""


@pytest.mark.slow
@pytest.mark.browser
@needs_chromium
def test_equations_typeset_offline(built_book, book_server, chromium):
    """MathJax 2 from _static/mathjax typesets every equation with its web fonts while the network is off."""
    pages = _math_pages(built_book)
    assert pages
    for page in pages:
        url = f"{book_server}/{page.relative_to(built_book).as_posix()}"
        _open(chromium, url)
        deadline = time.monotonic() + 30
        state = None
        while state is None and time.monotonic() < deadline:
            state = chromium.evaluate(MATH_STATE_JS)
            if state is None:
                time.sleep(0.2)
        assert state is not None, f"{page.name}: MathJax did not start (offline)"
        chromium.drain(0.5)
        problems = _problems(chromium.events, book_server)
        assert not problems, f"{page.name}: " + "\n".join(problems)
        assert state["sources"] > 0, f"{page.name}: {state}"
        assert state["typeset"] == state["sources"] == state["visible"], f"{page.name}: {state}"
        assert state["errors"] == 0 and state["raw"] == 0, f"{page.name}: {state}"
        assert state["font"] == "STIX-Web", f"{page.name}: MathJax fell back to {state['font']!r} fonts"
        requested = [e["params"]["request"]["url"] for e in chromium.events
                     if e["method"] == "Network.requestWillBeSent"]
        assert not [u for u in requested if not u.startswith((book_server, "data:", *ALLOWED_EXTERNAL))], requested
