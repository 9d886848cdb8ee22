"""The real-text sample shipped inside the package, and the ``local`` profile's fallback to it.

``papa_lib/samples/`` is a tiny data folder laid out like ``../shared/data`` (its ``README.md`` gives the source,
licence and the recipe of every file): 512 SST-2 training and 256 validation sentences, and the first articles of
WikiText-2's validation and test token files, about 190 KB in all. The chapters that compute live at the ``local``
profile read only these files. When their data folder does not hold them — a fresh machine without
``../shared/data``, where the hub is no way out either — :func:`data_or_sample` hands back the sample instead and
prints one line saying so (:func:`papa_lib.book.profiles.resolve` calls it). The readers name sample files as
``papa_lib/samples/<file> (packaged sample)`` (:func:`describe`), so records and figure subtitles say which data
they used.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

__all__ = ["SAMPLE_DIR", "SAMPLE_FILES", "SAMPLE_LABEL", "data_or_sample", "describe", "is_sample", "missing_files",
           "sample_dir"]

#: Where the sample lies: ``papa_lib/samples`` (package data).
SAMPLE_DIR = Path(__file__).resolve().parents[1] / "samples"
#: Its data files, relative to a data folder: what the live chapters read at the ``local`` profile.
SAMPLE_FILES = (
    "glue/SST-2/train.tsv",
    "glue/SST-2/dev.tsv",
    "wikitext-2/wiki.valid.tokens",
    "wikitext-2/wiki.test.tokens",
)
#: How figures and records name it.
SAMPLE_LABEL = "packaged sample"
#: What it holds, in words (for the fallback notice).
SAMPLE_CONTENTS = "512 + 256 SST-2 sentences, 5 + 3 WikiText-2 articles"


def missing_files(folder: str | os.PathLike | None) -> list[str]:
    """The files of :data:`SAMPLE_FILES` that ``folder`` lacks (all of them when it is None or not a folder)."""
    if folder is None or not Path(folder).is_dir():
        return list(SAMPLE_FILES)
    return [name for name in SAMPLE_FILES if not (Path(folder) / name).is_file()]


def sample_dir() -> Path:
    """The packaged sample folder; FileNotFoundError (naming a missing file) when the installation lacks it."""
    missing = missing_files(SAMPLE_DIR)
    if missing:
        raise FileNotFoundError(
            f"the packaged data sample is incomplete: {SAMPLE_DIR / missing[0]} is missing "
            "(reinstall papa_lib; its package data must include papa_lib/samples)"
        )
    return SAMPLE_DIR


def is_sample(path: str | os.PathLike | None) -> bool:
    """Whether ``path`` is the packaged sample folder or lies inside it."""
    if path is None:
        return False
    try:
        Path(path).resolve().relative_to(SAMPLE_DIR)
    except ValueError:
        return False
    return True


def describe(path: str | os.PathLike) -> str:
    """``path`` as records show it: ``papa_lib/samples/<file> (packaged sample)`` inside the sample (the same on
    every machine, whether the package is installed or checked out), else ``str(path)``."""
    if not is_sample(path):
        return str(path)
    relative = Path(path).resolve().relative_to(SAMPLE_DIR).as_posix()
    return "papa_lib/samples" + ("" if relative == "." else f"/{relative}") + f" ({SAMPLE_LABEL})"


def data_or_sample(data_dir: str | os.PathLike | None, shown: str | None = None, stream=None) -> Path:
    """The folder the ``local`` profile reads: ``data_dir`` when it holds every file of :data:`SAMPLE_FILES`,
    otherwise the packaged sample, with a one-line notice on ``stream`` (default stderr) naming what was missing.

    ``shown`` is how the notice names ``data_dir`` (default: the path itself). The hub is never tried.
    """
    missing = missing_files(data_dir)
    if not missing:
        return Path(data_dir)
    sample = sample_dir()
    where = shown or str(data_dir)
    if data_dir is None:
        why = "no data folder given"
    elif not Path(data_dir).is_dir():
        why = f"{where} does not exist"
    else:
        why = f"{where} has no {missing[0]}"
    print(f"papa: {why}; using the {SAMPLE_LABEL} papa_lib/samples ({SAMPLE_CONTENTS}) instead",
          file=stream if stream is not None else sys.stderr)
    return sample
