"""The memory benchmarks of :mod:`papa_lib.ops.bench` (``memory``, ``store``): each size or way measured in a fresh
process (``python -m papa_lib.ops.bench --memory-child`` / ``--store-child``), so that one measurement's peak cannot
hide in another's. The figures are described in :mod:`papa_lib.ops.bench`'s docstring."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

from .bench_support import BenchSizes, current_rss_kb, load_bench_model, peak_rss_kb, reset_peak_rss

__all__ = ["bench_memory", "bench_store", "memory_child", "store_child"]


def memory_child(texts: list[str], batch_size: int, model_spec: str | None, device: str, dtype: str) -> dict:
    """Average attention over ``texts`` (streamed, batch by batch) and measure the peak memory: ``peak_mb``,
    ``before_mb`` and the method used."""
    from ..core.averaging import average_attention
    from ..core.layout import encode

    model, tokenizer = load_bench_model(model_spec, device, dtype)

    def batches():
        for start in range(0, len(texts), batch_size):
            yield encode(tokenizer, texts[start : start + batch_size], max_length=64)

    average_attention(model, [encode(tokenizer, texts[:batch_size], max_length=64)], progress=False)  # warm-up
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
        average_attention(model, batches(), progress=False)
        torch.cuda.synchronize()
        return {"peak_mb": torch.cuda.max_memory_allocated() / 2**20, "before_mb": before / 2**20, "method": "cuda"}
    reset = reset_peak_rss()
    before = current_rss_kb() or 0
    average_attention(model, batches(), progress=False)
    return {"peak_mb": peak_rss_kb() / 1024, "before_mb": before / 1024, "method": "VmHWM" if reset else "ru_maxrss"}


def store_child(texts: list[str], labels: list[int], batch_size: int, model_spec: str | None, device: str,
                dtype: str, in_place: bool) -> dict:
    """Extract the real-token features of ``texts`` into a feature store, in place
    (:meth:`~papa_lib.experiments.features.FeatureStore.build`) or filled in memory then saved, and measure the peak
    memory growth: ``growth_mb``, ``stored_mb`` and the method used."""
    from ..core.layout import encode
    from ..experiments.features import BackboneRunner, FeatureStore

    model, tokenizer = load_bench_model(model_spec, device, dtype)
    runner = BackboneRunner(model, encode(tokenizer, texts, max_length=64), torch.tensor(labels), "sentence",
                            batch_size=batch_size)
    runner.rows(torch.arange(min(batch_size, len(texts))))  # warm-up
    examples = torch.arange(len(texts))
    with tempfile.TemporaryDirectory() as folder:
        store = FeatureStore(folder)
        reset = reset_peak_rss()
        before = current_rss_kb() or 0
        if in_place:
            rows = store.build("k", "train", lambda allocate: runner.rows(examples, allocate=allocate))
        else:
            store.save("k", "train", runner.rows(examples))
            rows = store.load("k", "train")
        peak = peak_rss_kb()
        stored = rows.values.numel() * rows.values.element_size()
        del rows
    return {"growth_mb": max(peak - before, 0) / 1024, "stored_mb": stored / 2**20,
            "method": "VmHWM" if reset else "ru_maxrss"}


def _child(flags: list[str], model_spec: str | None, device: str, dtype: str, threads: int | None, what: str) -> dict:
    """Run ``python -m papa_lib.ops.bench`` with ``flags`` in a fresh process; its last output line as JSON."""
    command = [sys.executable, "-m", "papa_lib.ops.bench", *flags, "--device", device, "--dtype", dtype]
    if model_spec:
        command += ["--model", model_spec]
    if threads:
        command += ["--threads", str(threads)]
    env = dict(
        os.environ,
        PYTHONPATH=os.pathsep.join(
            filter(None, [str(Path(__file__).resolve().parents[1]), os.environ.get("PYTHONPATH")])
        ),
    )
    done = subprocess.run(command, capture_output=True, text=True, env=env)
    if done.returncode != 0:
        raise RuntimeError(f"{what} failed:\n{done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def bench_memory(
    model_spec: str | None, sizes: BenchSizes, device: str, dtype: str, threads: int | None
) -> dict[str, float]:
    """``averaging_peak_mem_ratio``: peak memory of averaging at two corpus sizes 4x apart, one fresh process each."""
    figures: dict[str, float] = {}
    peaks = []
    for count in sizes.memory_sentences:
        result = _child(["--memory-child", str(count), "--batch", str(sizes.memory_batch)], model_spec, device, dtype,
                        threads, f"memory benchmark child for {count} sentences")
        peaks.append(result["peak_mb"])
        figures[f"averaging_peak_mem_mb_{count}"] = result["peak_mb"]
        figures[f"averaging_peak_growth_mb_{count}"] = max(result["peak_mb"] - result["before_mb"], 0.0)
    return {"averaging_peak_mem_ratio": peaks[1] / peaks[0], **figures}


def bench_store(
    model_spec: str | None, sizes: BenchSizes, device: str, dtype: str, threads: int | None
) -> dict[str, float]:
    """``feature_store_in_memory_vs_in_place_peak``: the peak memory growth of caching features filled in memory
    then saved over that of writing them in place into the store's file; one fresh process each."""
    growth = {}
    for way, flag in (("in_place", "1"), ("in_memory", "0")):
        result = _child(["--store-child", str(sizes.store_sentences), flag, "--batch", str(sizes.store_batch)],
                        model_spec, device, dtype, threads, f"feature store benchmark child ({way})")
        growth[way] = (result["growth_mb"], result["stored_mb"])
    return {
        "feature_store_in_memory_vs_in_place_peak": growth["in_memory"][0] / max(growth["in_place"][0], 1e-9),
        "feature_store_peak_vs_size_in_place": growth["in_place"][0] / growth["in_place"][1],
        "feature_store_peak_vs_size_in_memory": growth["in_memory"][0] / growth["in_memory"][1],
        "feature_store_mb": growth["in_place"][1],
    }
