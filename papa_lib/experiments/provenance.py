"""Where a record was made (issue 21): the columns :data:`papa_lib.experiments.results.PROVENANCE_FIELDS` of every
new record — git commit, SHA-256 of each data file read, torch and transformers versions, processor, threads and
optimiser implementation."""

from __future__ import annotations

import hashlib
import json
import math
import os
import platform
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from ..core.artefacts import checksum

__all__ = ["config_hash", "file_sha256", "git_commit", "package_versions", "processor_name", "run_provenance"]

_CONFIG_HASH_LENGTH = 16

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
        _DIGESTS[key] = checksum(path)
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
        "torch_version": distribution_version("torch"),
        "transformers_version": distribution_version("transformers"),
        "processor": processor_name(device),
        "threads": int(torch.get_num_threads()),
        "optimizer": optimizer,
    }


# --------------------------------------------------------------------------------------------------------------
# Run ids and versions
# --------------------------------------------------------------------------------------------------------------


def _canonical(obj: Any, where: str) -> Any:
    """Return a JSON-ready copy of ``obj`` with numbers, paths and containers in one canonical form."""
    if obj is None or isinstance(obj, (bool, str)):
        return obj
    if isinstance(obj, np.generic):
        obj = obj.item()
        if isinstance(obj, (bool, str)) or obj is None:
            return obj
    if isinstance(obj, int):
        return obj
    if isinstance(obj, float):
        if math.isfinite(obj) and obj == int(obj):
            # 1 and 1.0 (and -0.0 and 0.0) describe the same experiment: hash them identically.
            return int(obj)
        if math.isnan(obj):
            return "NaN"
        if math.isinf(obj):
            return "Infinity" if obj > 0 else "-Infinity"
        return obj
    if isinstance(obj, os.PathLike):
        return os.fspath(obj)
    if isinstance(obj, Mapping):
        out = {}
        for key, val in obj.items():
            if not isinstance(key, str):
                raise ValueError(f"config_hash: key {key!r} at {where} is not a string; use string keys")
            out[key] = _canonical(val, f"{where}.{key}")
        return out
    if isinstance(obj, (list, tuple)):
        return [_canonical(v, f"{where}[{i}]") for i, v in enumerate(obj)]
    if isinstance(obj, (set, frozenset)):
        items = [_canonical(v, f"{where}{{}}") for v in obj]
        return sorted(items, key=lambda v: json.dumps(v, sort_keys=True))
    raise ValueError(
        f"config_hash: value at {where} has type {type(obj).__name__}, which has no canonical JSON form "
        "(use str/int/float/bool/None, lists, tuples, sets, dicts with string keys, or paths)"
    )


def config_hash(config: dict) -> str:
    """Return a stable short (16 hex characters) SHA-256 of a configuration dictionary.

    The dictionary is serialised as canonical JSON (sorted keys, no whitespace) before hashing, so key order
    does not matter, and floats are written with Python's shortest round-trip ``repr`` (``1/16`` always gives
    ``0.0625``). Integral floats are folded into ints (``1.0`` and ``1`` hash the same), tuples hash as lists,
    paths as strings and numpy scalars as their Python values. Any change of a value or key changes the hash.
    """
    if not isinstance(config, Mapping):
        raise ValueError(f"config_hash expects a dict, got {type(config).__name__}")
    canonical = _canonical(config, "config")
    text = json.dumps(canonical, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:_CONFIG_HASH_LENGTH]


def distribution_version(name: str) -> str:
    """Version of an installed distribution, or ``'unknown'`` when it is not installed."""
    from importlib import metadata

    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return "unknown"


def _papa_lib_version() -> str:
    """``papa_lib.__version__`` when defined, else the installed distribution's version, else ``'unknown'``."""
    package = sys.modules.get("papa_lib")
    version = getattr(package, "__version__", None)
    if isinstance(version, str) and version:
        return version
    return distribution_version("papa_lib")


def package_versions() -> str:
    """Return a JSON string (sorted keys) with the versions of python, torch, transformers and papa_lib.

    Versions come from the installed distributions' metadata (torch is not imported); a package that is
    not installed is reported as ``'unknown'``.
    """
    versions = {
        "python": platform.python_version(),
        "torch": distribution_version("torch"),
        "transformers": distribution_version("transformers"),
        "papa_lib": _papa_lib_version(),
    }
    return json.dumps(versions, sort_keys=True)
