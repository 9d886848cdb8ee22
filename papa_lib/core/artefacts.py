"""Cached artefacts that heal themselves: written atomically, checked when read, set aside and recomputed if damaged.

Constant matrices and learned λ (both ``.safetensors``), feature folders and learning curves are written through
:func:`write_atomic`: into a temporary file in the same folder, flushed to disk, then moved over the final name with
``os.replace``, so a crash or a full disk leaves the old file or none, never a torn one. Beside each file it keeps a
one-line checksum file ``<name>.sha256`` (``<sha256> <size>``).

:func:`read_or_heal` reads one back: a size or checksum that disagrees with the ``.sha256`` file, or a read that
fails, sets the file aside as ``<name>.damaged`` (with its checksum file) and prints a one-line notice naming it; the
caller then recomputes the artefact. Files without a checksum file (written before this module, or by hand) are
checked by reading them.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

__all__ = ["DAMAGED_SUFFIX", "checksum", "notice", "read_or_heal", "remove", "set_aside", "write_atomic"]

T = TypeVar("T")

#: Suffix of an artefact set aside as damaged (``matrices/x.safetensors.damaged``).
DAMAGED_SUFFIX = ".damaged"
_SUM_SUFFIX = ".sha256"


def checksum(path: str | Path) -> str:
    """SHA-256 of a file's bytes (hex)."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _sum_path(path: Path) -> Path:
    return path.with_name(path.name + _SUM_SUFFIX)


def write_atomic(path: str | Path, write: Callable[[Path], object], *, sums: bool = True,
                 mode: int | None = None) -> Path:
    """Write ``path`` atomically: ``write(tmp)`` fills a temporary file in the same folder, which is fsynced and
    moved over ``path``; with ``sums``, ``<name>.sha256`` records its checksum and size. ``mode``: the file's
    permission bits (default: the temporary file's, owner only). On any error (a full disk included) the temporary
    file is removed and ``path`` is as it was."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    tmp = Path(name)
    try:
        write(tmp)
        with open(tmp, "rb+") as handle:
            os.fsync(handle.fileno())
        line = f"{checksum(tmp)} {tmp.stat().st_size}\n" if sums else None
        if mode is not None:
            os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    if line is not None:
        write_atomic(_sum_path(path), lambda sum_tmp: sum_tmp.write_text(line), sums=False)
    return path


def _mismatch(path: Path) -> str | None:
    """Why ``path`` disagrees with its checksum file (None when it agrees or there is none)."""
    sums = _sum_path(path)
    if not sums.exists():
        return None
    try:
        expected, size = sums.read_text().split()
        size = int(size)
    except (OSError, ValueError):
        return f"its checksum file {sums.name} is unreadable"
    actual = path.stat().st_size
    if actual != size:
        return f"{actual} bytes where {size} were written"
    if checksum(path) != expected:
        return "its checksum differs from the one written"
    return None


def remove(path: str | Path) -> None:
    """Delete an artefact and its checksum file (:func:`write_atomic`), whichever exist."""
    path = Path(path)
    path.unlink(missing_ok=True)
    _sum_path(path).unlink(missing_ok=True)


def set_aside(path: str | Path, why: str, stream=None) -> Path:
    """Rename a damaged artefact (a file or a folder) to ``<name>.damaged`` (and its checksum file) with a one-line
    notice; the new path."""
    path = Path(path)
    target = path.with_name(path.name + DAMAGED_SUFFIX)
    if target.is_dir():  # an older damaged copy: the newer one replaces it
        shutil.rmtree(target)
    os.replace(path, target)
    sums = _sum_path(path)
    if sums.exists():
        os.replace(sums, target.with_name(target.name + _SUM_SUFFIX))
    notice(f"{path} is damaged ({why}); set it aside as {target.name} and computing it again", stream)
    return target


def notice(text: str, stream=None) -> None:
    """Print ``papa: notice: <text>`` on a line of its own (progress bars move below it), on stderr by default."""
    from tqdm.auto import tqdm

    tqdm.write(f"papa: notice: {text}", file=stream if stream is not None else sys.stderr)


def read_or_heal(path: str | Path | None, read: Callable[[Path], T], stream=None) -> T | None:
    """``read(path)`` when ``path`` exists and is whole; ``None`` when it is absent or was damaged (then set aside
    with a notice, :func:`set_aside`), so the caller computes it again."""
    if path is None:
        return None
    path = Path(path)
    if not path.exists():
        return None
    why = _mismatch(path)
    if why is None:
        try:
            return read(path)
        except Exception as error:  # noqa: BLE001 - any failed read of a cache file means: compute it again
            why = f"cannot be read: {' '.join(str(error).split())[:160]}"
    set_aside(path, why, stream)
    return None
