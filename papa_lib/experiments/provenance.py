"""Where a record was made (issue 21): the columns :data:`papa_lib.experiments.results.PROVENANCE_FIELDS` of every
new record — git commit, SHA-256 of each data file read, torch and transformers versions, processor, threads and
optimiser implementation."""

from __future__ import annotations

import hashlib
import json
import platform
from collections.abc import Iterable, Mapping
from pathlib import Path

from .results import _distribution_version

__all__ = ["file_sha256", "git_commit", "processor_name", "run_provenance"]

_GIT_COMMIT: str | None = None
_DIGESTS: dict[tuple, str] = {}


def git_commit() -> str:
    """The commit of the git checkout that holds ``papa_lib`` (``-dirty`` when tracked files differ from it), read
    once per process (so a long run names the code it started with); ``unknown`` when it is not a git checkout."""
    global _GIT_COMMIT
    if _GIT_COMMIT is None:
        import subprocess

        root = Path(__file__).resolve().parents[2]
        try:
            commit = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True,
                                    timeout=10, check=True).stdout.strip()
            dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
                                   capture_output=True, text=True, timeout=30, check=True).stdout.strip()
            _GIT_COMMIT = commit + ("-dirty" if dirty else "") if commit else "unknown"
        except (OSError, subprocess.SubprocessError):
            _GIT_COMMIT = "unknown"
    return _GIT_COMMIT


def file_sha256(path: str | Path) -> str:
    """SHA-256 of a file's bytes (hex), computed once per file version (path, size, modification time)."""
    path = Path(path)
    stat = path.stat()
    key = (str(path.resolve()), stat.st_size, stat.st_mtime_ns)
    if key not in _DIGESTS:
        digest = hashlib.sha256()
        with path.open("rb") as handle:
            for block in iter(lambda: handle.read(1 << 20), b""):
                digest.update(block)
        _DIGESTS[key] = digest.hexdigest()
    return _DIGESTS[key]


def processor_name(device: str = "cpu") -> str:
    """The GPU's name on a CUDA device, else the CPU's model name (``/proc/cpuinfo``, or ``platform.processor()``)."""
    if str(device).startswith("cuda"):
        import torch

        if torch.cuda.is_available():
            return torch.cuda.get_device_name(torch.device(device))
    try:
        for line in Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace").splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def run_provenance(device: str, data_files: Mapping[str, str | Path] | Iterable[str | Path] = (),
                   optimizer: str | None = None) -> dict:
    """The :data:`PROVENANCE_FIELDS` of a record made now on ``device`` from ``data_files`` (paths, or ``{name shown:
    path}``; files that do not exist, e.g. hub datasets, are left out) with ``optimizer`` (e.g.
    ``torch.optim.AdamW(fused=True)``)."""
    import torch

    named = dict(data_files) if isinstance(data_files, Mapping) else {str(f): f for f in data_files}
    return {
        "git_commit": git_commit(),
        "data_sha256": json.dumps({name: file_sha256(path) for name, path in named.items() if Path(path).is_file()},
                                  sort_keys=True),
        "torch_version": _distribution_version("torch"),
        "transformers_version": _distribution_version("transformers"),
        "processor": processor_name(device),
        "threads": int(torch.get_num_threads()),
        "optimizer": optimizer,
    }
