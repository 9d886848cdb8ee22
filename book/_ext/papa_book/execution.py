"""What an executed page depends on besides its own cells, and what every build reports about its pages.

MyST-NB executes a chapter when Sphinx reads it, and Sphinx reads only the pages whose source changed since the
last build (its saved environment is the book's execution cache; with ``execute_notebooks: cache`` there is a
jupyter-cache as well, keyed on the cells' code). Neither knows that a page's output also depends on the library
it imports and on the committed results it reads, nor that a page failed last time. So the book's Sphinx extension
(:mod:`papa_book.sphinx_hooks`) uses this module to

* re-execute every page when :func:`fingerprint` (papa_lib's files, the book's ``data/`` folder) changed since the
  last build, and point a jupyter-cache at a folder named after the fingerprint,
* re-execute every page whose execution failed in an earlier build, and
* write :data:`REPORT_NAME` next to the build output at the end of every build: each page's execution status as
  the built HTML shows it (including pages this build did not re-execute). :func:`failed_pages` reads it;
  :func:`papa_book.build.build_book` fails when any page failed.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import os
from pathlib import Path

__all__ = ["REPORT_NAME", "failed_pages", "fingerprint", "read_report", "write_report"]

#: The execution report, written into the build folder (``_build/``), next to ``html/``.
REPORT_NAME = "papa-execution.json"
#: Files larger than this count by size and modification time only (ignored feature caches can be gigabytes).
LARGE_FILE_BYTES = 8 * 1024 * 1024
_SKIPPED_PARTS = {"__pycache__", ".ipynb_checkpoints", ".pytest_cache"}


def _files(folder: Path):
    """Every file under ``folder`` (sorted; no byte-code, no hidden folders), with its path relative to ``folder``."""
    for path in sorted(folder.rglob("*")):
        relative = path.relative_to(folder)
        if any(part in _SKIPPED_PARTS or part.startswith(".") for part in relative.parts):
            continue
        if path.is_file() and path.suffix not in (".pyc", ".pyo"):
            yield relative.as_posix(), path


def _package_dir() -> Path:
    """The folder of the ``papa_lib`` package the kernels import (this checkout's, or the installed one)."""
    import papa_lib

    return Path(papa_lib.__file__).resolve().parent


def fingerprint(root: str | os.PathLike | None = None, package: str | os.PathLike | None = None) -> str:
    """16 hex digits of what the chapters' outputs depend on besides their cells: every file of the ``papa_lib``
    package (``package``, default the one this module belongs to: code and packaged data) and of ``root/data``
    (committed results and the paper's numbers; ``root`` default: none). Contents are hashed, except files over
    :data:`LARGE_FILE_BYTES`, which count by size and modification time.
    """
    digest = hashlib.sha256()
    folders = [("papa_lib", Path(package) if package is not None else _package_dir())]
    if root is not None:
        folders.append(("data", Path(root) / "data"))
    for name, folder in folders:
        if not folder.is_dir():
            continue
        for relative, path in _files(folder):
            stat = path.stat()
            digest.update(f"{name}/{relative}\0{stat.st_size}\0".encode())
            if stat.st_size > LARGE_FILE_BYTES:
                digest.update(str(stat.st_mtime_ns).encode("ascii"))
            else:
                digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def write_report(build_dir: str | os.PathLike, pages: dict[str, dict | None], library: str) -> Path:
    """Write :data:`REPORT_NAME` into ``build_dir``: per page (docname) MyST-NB's execution data (None when the page
    was not executed), and the library fingerprint. Returns the report's path."""
    report = {"fingerprint": library, "pages": {}}
    for docname, data in sorted(pages.items()):
        if data is None:
            report["pages"][docname] = {"executed": False}
            continue
        mtime = data.get("mtime")
        report["pages"][docname] = {
            "executed": True,
            "succeeded": bool(data.get("succeeded")),
            "error": data.get("error"),
            "method": data.get("method"),
            "runtime_s": round(float(data["runtime"]), 1) if data.get("runtime") is not None else None,
            "executed_at": _dt.datetime.fromtimestamp(mtime, _dt.timezone.utc).isoformat() if mtime else None,
        }
    path = Path(build_dir) / REPORT_NAME
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    return path


def read_report(build_dir: str | os.PathLike) -> dict | None:
    """The report of the last build in ``build_dir``, or None when there is none."""
    path = Path(build_dir) / REPORT_NAME
    if not path.is_file():
        return None
    try:
        report = json.loads(path.read_text(encoding="utf-8"))
    except ValueError as exc:
        raise ValueError(f"{path}: not a valid execution report: {exc}") from None
    if not isinstance(report, dict) or not isinstance(report.get("pages"), dict):
        raise ValueError(f"{path}: not a valid execution report (no 'pages' mapping)")
    return report


def failed_pages(report: dict) -> dict[str, str]:
    """``{docname: error}`` of the pages whose execution failed, in a report from :func:`read_report`."""
    return {doc: str(page.get("error") or "error") for doc, page in report["pages"].items()
            if page.get("executed") and not page.get("succeeded")}
