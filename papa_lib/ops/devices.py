"""Does the device change a number? GPU-made records against their reruns on the CPU (issue 21: no claim may compare
rows made on different devices or library versions unless the difference is shown to be below the seed spread).

A diagnostic folder (``data/results/device-check``) reruns some configurations of a results folder
(``data/results/local-minilm``) on the CPU with the same grid settings, so each rerun has the run id of the record it
repeats. :func:`device_check` pairs them by run id, seed by seed; :func:`device_summary` says per configuration
whether the CPU-minus-GPU differences lie below the spread of the committed values over seeds.

* ``seed_sd``: the sample standard deviation (``ddof=1``) over seeds of the committed values of that configuration
  (every committed seed, whichever device made it);
* ``half_width``: the Student-t 95% half-width of that configuration's mean over its committed seeds,
  ``t(0.975, n-1) * seed_sd / sqrt(n)``;
* ``ratio``: ``|difference| / seed_sd``; below 1, the device changed the value by less than a change of seed does.

Once checked, the GPU-made records were replaced in the results folder by their CPU reruns (issue 21: every claim
rests on CPU-made rows) and kept in a folder of their own (``data/results/local-minilm-gpu``);
:func:`as_committed` puts them back, to repeat the check on the rows it was made on.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd

from ..experiments.summaries import CONFIG_COLUMNS as _PROJECT_CONFIG_COLUMNS
from ..experiments.summaries import t_half_width

__all__ = ["CONFIG_COLUMNS", "as_committed", "config_label", "device_check", "device_summary"]

#: The columns that name one configuration (a row of a figure or table, all seeds together) within one results
#: folder: the project's configuration columns (:data:`papa_lib.experiments.summaries.CONFIG_COLUMNS`) less the model
#: and the metric, which a folder holds one of per task.
CONFIG_COLUMNS = tuple(c for c in _PROJECT_CONFIG_COLUMNS if c not in ("model", "metric"))
_CONFIDENCE = 0.95


def config_label(row) -> str:
    """``original``, ``average 0``, ``average from mnli 0``, ``average lambda 0.5``: one configuration in words."""
    if row["matrix_type"] == "original":
        return "original"
    words = [str(row["matrix_type"])]
    source = row.get("matrices_from")
    if isinstance(source, str) and source not in ("", row["task"]):
        words.append(f"from {source}")
    order = row.get("selection_order")
    if isinstance(order, str) and order not in ("", "none"):
        words.append(order)
    words.append(f"{float(row['fraction']):g}")
    return " ".join(words)


def _frame(source) -> pd.DataFrame:
    if isinstance(source, pd.DataFrame):
        return source
    from ..experiments.results import read_results

    path = Path(source)
    if not (path / "results.csv").is_file():
        raise FileNotFoundError(f"no results.csv in {path}")
    return read_results(path)


def as_committed(local_dir, superseded_dir, seeds=None) -> pd.DataFrame:
    """The records of ``local_dir`` with those of ``superseded_dir`` (same run ids) put back in their place, as they
    stood before the replacement; ``seeds`` keeps only those seeds (the seeds the check reran)."""
    local, old = _frame(local_dir), _frame(superseded_dir)
    frame = pd.concat([local[~local["run_id"].isin(old["run_id"])], old], ignore_index=True)
    if seeds is not None:
        frame = frame[frame["seed"].astype(int).isin(list(seeds))]
    return frame.reset_index(drop=True)


def _sd(values) -> float:
    """The sample standard deviation (``ddof=1``); NaN for fewer than two values."""
    return float(np.std(values, ddof=1)) if len(values) > 1 else float("nan")


def _half_width(sd: float, n: int) -> float:
    if n < 2 or not math.isfinite(sd):
        return float("nan")
    return t_half_width(sd / math.sqrt(n), n - 1, _CONFIDENCE)


def device_check(local_dir, check_dir, committed_devices=("cuda",)) -> pd.DataFrame:
    """The reruns in ``check_dir`` (a folder or a results frame) paired by run id with the records of ``local_dir``
    made on one of ``committed_devices`` (a record's ``device`` is matched on its prefix: ``cuda`` takes
    ``cuda:0``; ``None`` takes every device, e.g. to see the effect of library versions alone on CPU-made rows).

    One row per (configuration, seed): ``task``, ``config`` (:func:`config_label`), ``seed``,
    ``committed_device`` (where the committed record ran), ``gpu`` (its value), ``cpu`` (the rerun's value),
    ``difference`` (``cpu - gpu``), ``seed_sd``, ``half_width``, ``n_seeds`` (committed seeds behind both) and
    ``ratio`` (see the module docstring), plus the configuration columns (:data:`CONFIG_COLUMNS`) and ``run_id``."""
    local, check = _frame(local_dir), _frame(check_dir)
    keys = list(CONFIG_COLUMNS)
    spread = local.assign(**{k: local[k].fillna("none") for k in ("matrices_from", "selection_order")})
    spread = spread.groupby(keys, dropna=False)["value"].agg(seed_sd=_sd, n_seeds="size").reset_index()
    committed = local
    if committed_devices is not None:
        device = local["device"].astype(str)
        committed = local[device.apply(lambda d: any(d.startswith(p) for p in committed_devices))]
    pairs = committed.merge(check[["run_id", "value", "device"]], on="run_id", suffixes=("_gpu", "_cpu"))
    columns = ["task", "config", "seed", "committed_device", "gpu", "cpu", "difference", "seed_sd", "half_width",
               "n_seeds", "ratio", *CONFIG_COLUMNS[1:], "run_id"]
    if pairs.empty:
        return pd.DataFrame(columns=columns)
    pairs = pairs.assign(**{k: pairs[k].fillna("none") for k in ("matrices_from", "selection_order")})
    pairs = pairs.merge(spread, on=keys, how="left")
    out = pd.DataFrame({
        "task": pairs["task"],
        "config": pairs.apply(config_label, axis=1),
        "seed": pairs["seed"].astype(int),
        "committed_device": pairs["device_gpu"].astype(str),
        "gpu": pairs["value_gpu"].astype(float),
        "cpu": pairs["value_cpu"].astype(float),
    })
    out["difference"] = out["cpu"] - out["gpu"]
    out["seed_sd"] = pairs["seed_sd"].astype(float)
    out["n_seeds"] = pairs["n_seeds"].astype(int)
    out["half_width"] = [_half_width(sd, n) for sd, n in zip(out["seed_sd"], out["n_seeds"])]
    out["ratio"] = out["difference"].abs() / out["seed_sd"]
    for key in CONFIG_COLUMNS[1:]:
        out[key] = pairs[key].values
    out["run_id"] = pairs["run_id"].values
    return out[columns].sort_values(["task", "config", "seed"]).reset_index(drop=True)


def device_summary(check: pd.DataFrame) -> pd.DataFrame:
    """Per configuration of a :func:`device_check` frame: ``seeds`` (pairs), ``mean_difference`` with
    ``difference_half_width`` (Student-t 95% over the seed-paired differences: a shift of the mean whose interval
    holds 0 is not told apart from none), ``max_abs_difference``, ``seed_sd`` and ``half_width`` (of the committed
    values), ``cpu_sd`` (the reruns' own sd over seeds), ``max_ratio`` and ``below_spread`` (every |difference| below
    the seed sd). An empty check gives an empty summary."""
    columns = ["task", "config", "seeds", "mean_difference", "difference_half_width", "max_abs_difference",
               "seed_sd", "half_width", "cpu_sd", "max_ratio", "below_spread"]
    if check.empty:
        return pd.DataFrame(columns=columns)
    grouped = check.groupby(["task", "config"], sort=True)
    out = grouped.agg(seeds=("seed", "size"), mean_difference=("difference", "mean"),
                      max_abs_difference=("difference", lambda d: float(d.abs().max())),
                      seed_sd=("seed_sd", "first"), half_width=("half_width", "first"),
                      max_ratio=("ratio", "max"),
                      difference_sd=("difference", _sd), cpu_sd=("cpu", _sd)).reset_index()
    out["difference_half_width"] = [_half_width(sd, n) for sd, n in zip(out["difference_sd"], out["seeds"])]
    out["below_spread"] = out["max_abs_difference"] < out["seed_sd"]
    return out[columns]
