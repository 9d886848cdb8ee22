"""The real-text sample shipped inside the package, and the ``local`` profile's fallback to it.

``papa_lib/samples/sample.jsonl`` holds, in a format of our own (its ``README.md`` gives the source, licence, format
and the recipe of every part): 512 SST-2 training and 256 validation sentences, and the first articles of
WikiText-2's validation and test token files, about 200 KB in all. The readers of this package read data folders
laid out like ``../shared/data``, so on first use :func:`sample_dir` writes the sample out in that layout
(:data:`SAMPLE_FILES`) into a cache folder (:func:`papa_lib.core.packaged.cache_root`: ``$PAPA_CACHE_DIR``, else
``$XDG_CACHE_HOME/papa_lib`` or ``~/.cache/papa_lib``; one folder per version of the sample, published with one
rename as the packaged models are, reused afterwards).

The chapters that compute live at the ``local`` profile read only these files. When their data folder does not
hold them — a fresh machine without ``../shared/data``, where the hub is no way out either — :func:`data_or_sample`
hands back the sample instead and prints one line saying so (:func:`papa_lib.book.profiles.resolve` calls it; so
does the ``papa`` command, for the tasks of :data:`SAMPLE_TASKS`, when no data folder is given and
``../shared/data`` is absent, or a grid file's ``data_dir`` lacks their files). The
readers name sample files as ``papa_lib/samples/<file> (packaged sample)`` (:func:`describe`), the same on every
machine, so records and figure subtitles say which data they used.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

from ..core.artefacts import checksum
from ..core.packaged import cache_root, publish
from ..errors import PapaInputError

__all__ = ["SAMPLE_PACK", "SAMPLE_FILES", "SAMPLE_LABEL", "SAMPLE_CONTENTS", "SAMPLE_TASKS", "data_or_sample",
           "describe", "is_sample", "missing_files", "read_pack", "sample_dir", "sample_reason"]

#: The packaged sample (package data): sections, each a JSON object naming a file, then its rows or lines.
SAMPLE_PACK = Path(__file__).resolve().parents[1] / "samples" / "sample.jsonl"
#: The files it unpacks to, relative to a data folder: what the live chapters read at the ``local`` profile.
SAMPLE_FILES = (
    "glue/SST-2/train.tsv",
    "glue/SST-2/dev.tsv",
    "wikitext-2/wiki.valid.tokens",
    "wikitext-2/wiki.test.tokens",
)
#: The paper's tasks the sample holds, with the files each reads (the ``papa`` command falls back to the sample for
#: these alone).
SAMPLE_TASKS = {"sst2": ("glue/SST-2/train.tsv", "glue/SST-2/dev.tsv")}
#: How figures and records name it.
SAMPLE_LABEL = "packaged sample"
#: What it holds, in words (for the fallback notice).
SAMPLE_CONTENTS = "512 + 256 SST-2 sentences, 5 + 3 WikiText-2 articles"


def missing_files(folder: str | os.PathLike | None, needed=SAMPLE_FILES) -> list[str]:
    """The files of ``needed`` (default :data:`SAMPLE_FILES`) that ``folder`` lacks (all of them when it is None or
    not a folder)."""
    if folder is None or not Path(folder).is_dir():
        return list(needed)
    return [name for name in needed if not (Path(folder) / name).is_file()]


def read_pack(pack: str | os.PathLike | None = None) -> dict[str, str]:
    """The text of every file in the pack, by its path in a data folder.

    A section starts with ``{"file": NAME, "columns": [...], "rows": N}`` (a TSV file: a header, then N JSON arrays
    of cells) or ``{"file": NAME, "lines": N}`` (a text file: N JSON strings, one per line). Errors name the pack's
    line."""
    pack = Path(pack) if pack is not None else SAMPLE_PACK
    if not pack.is_file():
        raise FileNotFoundError(f"the packaged data sample is missing: {pack} "
                                "(reinstall papa_lib; its package data must include papa_lib/samples)")
    files: dict[str, list[str]] = {}
    current, left = None, 0
    with open(pack, encoding="utf-8") as handle:
        for number, raw in enumerate(handle, 1):
            try:
                item = json.loads(raw)
            except json.JSONDecodeError as error:
                raise PapaInputError(f"not a JSON value: {error.msg} ({pack}:{number})") from None
            if left == 0:
                if not isinstance(item, dict) or "file" not in item:
                    raise PapaInputError(f"expected a section header {{\"file\": ...}} ({pack}:{number})")
                current = files.setdefault(item["file"], [])
                if "columns" in item:
                    current.append("\t".join(item["columns"]))
                    left = int(item["rows"])
                else:
                    left = int(item["lines"])
                continue
            if isinstance(item, list):
                current.append("\t".join(str(cell) for cell in item))
            elif isinstance(item, str):
                current.append(item)
            else:
                raise PapaInputError(f"expected a row (JSON array) or a line (JSON string) ({pack}:{number})")
            left -= 1
    if left:
        raise PapaInputError(f"the pack ends {left} rows early ({pack})")
    return {name: "".join(line + "\n" for line in lines) for name, lines in files.items()}


def _unpacked_dir(pack: Path) -> Path:
    """Where ``pack`` unpacks to: one folder per content (a changed sample never reuses an old folder)."""
    digest = checksum(pack)[:12] if pack.is_file() else "missing"
    return cache_root() / f"sample-{digest}"


def sample_dir() -> Path:
    """The packaged sample as a data folder (unpacked on first use); FileNotFoundError naming what is missing when
    the installation lacks part of it."""
    target = _unpacked_dir(SAMPLE_PACK)
    if not missing_files(target):
        return target
    texts = read_pack(SAMPLE_PACK)
    lacking = [name for name in SAMPLE_FILES if name not in texts]
    if lacking:
        raise FileNotFoundError(f"the packaged data sample is incomplete: {SAMPLE_PACK} has no {lacking[0]} "
                                "(reinstall papa_lib; its package data must include papa_lib/samples)")
    target.parent.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=".sample-", dir=target.parent))
    try:
        unpacked = scratch / "sample"
        for name, text in texts.items():
            (unpacked / name).parent.mkdir(parents=True, exist_ok=True)
            (unpacked / name).write_text(text, encoding="utf-8")
        # another process may have unpacked it first (kept), or left a partial folder (replaced)
        publish(unpacked, target, checksum(SAMPLE_PACK), lambda folder: not missing_files(folder))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return target


def is_sample(path: str | os.PathLike | None) -> bool:
    """Whether ``path`` is the unpacked sample folder or lies inside it."""
    if path is None:
        return False
    try:
        Path(path).resolve().relative_to(_unpacked_dir(SAMPLE_PACK).resolve())
    except ValueError:
        return False
    return True


def describe(path: str | os.PathLike) -> str:
    """``path`` as records show it: ``papa_lib/samples/<file> (packaged sample)`` inside the sample (the same on
    every machine, wherever it was unpacked), else ``str(path)``."""
    if not is_sample(path):
        return str(path)
    relative = Path(path).resolve().relative_to(_unpacked_dir(SAMPLE_PACK).resolve()).as_posix()
    return "papa_lib/samples" + ("" if relative == "." else f"/{relative}") + f" ({SAMPLE_LABEL})"


def data_or_sample(data_dir: str | os.PathLike | None, shown: str | None = None, stream=None,
                   needed=SAMPLE_FILES) -> Path:
    """The folder the ``local`` profile reads: ``data_dir`` when it holds every file of ``needed`` (default
    :data:`SAMPLE_FILES`; the ``papa`` command passes the files of its tasks, :data:`SAMPLE_TASKS`), otherwise the
    packaged sample, with a one-line notice on ``stream`` (default stderr) naming what was missing.

    ``shown`` is how the notice names ``data_dir`` (default: the path itself). The hub is never tried.
    """
    why = sample_reason(data_dir, shown, needed)
    if why is None:
        return Path(data_dir)
    sample = sample_dir()
    print(f"papa: {why}; using the {SAMPLE_LABEL} papa_lib/samples ({SAMPLE_CONTENTS}) instead",
          file=stream if stream is not None else sys.stderr)
    return sample


def sample_reason(data_dir: str | os.PathLike | None, shown: str | None = None, needed=SAMPLE_FILES) -> str | None:
    """Why ``data_dir`` gives way to the packaged sample (``"../shared/data does not exist"``, ``"<folder> has no
    glue/SST-2/train.tsv"``), or ``None`` when it holds every file of ``needed``; ``shown`` names the folder."""
    missing = missing_files(data_dir, needed)
    if not missing:
        return None
    where = shown or str(data_dir)
    if data_dir is None:
        return "no data folder given"
    if not Path(data_dir).is_dir():
        return f"{where} does not exist"
    return f"{where} has no {missing[0]}"
