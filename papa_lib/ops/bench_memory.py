"""The memory benchmarks of :mod:`papa_lib.ops.bench` (``memory``, ``store``, and the ``decoder`` benchmark's LM-loss
memory and load times): each size or way measured in a fresh process (``python -m papa_lib.ops.bench --memory-child``
/ ``--store-child`` / ``--decoder-memory-child`` / ``--decoder-load-child``), so that one measurement's peak cannot
hide in another's. The figures are described in :mod:`papa_lib.ops.bench`'s docstring."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from .bench_support import (
    DEFAULT_DECODER,
    BenchSizes,
    current_rss_kb,
    load_bench_decoder,
    load_bench_model,
    peak_rss_kb,
    reset_peak_rss,
)

__all__ = ["bench_decoder_load", "bench_decoder_memory", "bench_memory", "bench_store", "decoder_load_child",
           "decoder_memory_child", "memory_child", "random_decoder_batch", "store_child"]


def memory_child(texts: list[str], batch_size: int, model_spec: str | None, device: str, dtype: str) -> dict:
    """Average attention over ``texts`` (streamed, batch by batch) and measure the peak memory (:func:`_peak_of`:
    ``peak_mb``, ``before_mb`` and the method used)."""
    from ..core.averaging import average_attention
    from ..core.layout import encode

    model, tokenizer = load_bench_model(model_spec, device, dtype)

    def batches():
        for start in range(0, len(texts), batch_size):
            yield encode(tokenizer, texts[start : start + batch_size], max_length=64)

    average_attention(model, [encode(tokenizer, texts[:batch_size], max_length=64)], progress=False)  # warm-up
    return _peak_of(lambda: average_attention(model, batches(), progress=False), device)[1]


def _peak_of(work, device: str) -> tuple[object, dict]:
    """``work()``'s result and the peak memory while it ran: ``peak_mb``, ``before_mb`` (held just before) and the
    ``method`` (``cuda``: :func:`torch.cuda.max_memory_allocated`; else the resident set size, ``VmHWM`` reset first,
    or ``ru_maxrss`` where it cannot be reset)."""
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
        result = work()
        torch.cuda.synchronize()
        return result, {"peak_mb": torch.cuda.max_memory_allocated() / 2**20, "before_mb": before / 2**20,
                        "method": "cuda"}
    reset = reset_peak_rss()
    before = current_rss_kb() or 0
    result = work()
    return result, {"peak_mb": peak_rss_kb() / 1024, "before_mb": before / 1024,
                    "method": "VmHWM" if reset else "ru_maxrss"}


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


def random_decoder_batch(vocab: int, batch: int, length: int, bos: int | None, seed: int = 0) -> dict:
    """``batch`` sequences of ``length`` random ids (every token real, ``bos`` first), the decoder benchmark's input."""
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(min(1000, vocab // 2), vocab, (batch, length), generator=generator)
    if bos is not None:
        ids[:, 0] = int(bos)
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids)}


def decoder_memory_child(spec: str | None, length: int, batch: int, chunk: int, device: str, dtype: str) -> dict:
    """The summed next-token NLL (:func:`papa_lib.core.decoders.next_token_nll`) of ``batch`` random sequences of
    ``length`` tokens with the LM head applied ``chunk`` positions at a time (``chunk`` >= the number of positions:
    the full ``[tokens, vocabulary]`` logits at once), and its peak memory after a warm-up on 8 tokens
    (:func:`_peak_of`), the ``nll`` and the ``tokens`` predicted."""
    from ..core.decoders import next_token_nll

    model, tokenizer = load_bench_decoder(spec, device, dtype)
    vocab = int(getattr(model.config, "text_config", model.config).vocab_size)
    inputs = random_decoder_batch(vocab, batch, length, tokenizer.bos_token_id)
    next_token_nll(model, {k: v[:1, :8] for k, v in inputs.items()}, chunk_size=chunk)  # warm-up
    (nll, tokens), peak = _peak_of(lambda: next_token_nll(model, inputs, chunk_size=chunk), device)
    return {**peak, "nll": nll, "tokens": tokens}


def decoder_load_child(spec: str | None, device: str, dtype: str) -> dict:
    """Time one :func:`papa_lib.load_decoder` call (the imports done first): ``load_s``, the process's ``peak_mb``
    (``VmHWM``, imports included) and ``converted``: whether the packaged decoder's converted folder was absent from
    the cache root (``$PAPA_CACHE_DIR``) before, i.e. the call converted the GGUF file."""
    from ..core import decoders
    from ..core.packaged import cache_folder, is_marked

    packaged = decoders.packaged_decoder_for(str(spec or DEFAULT_DECODER))
    present = packaged is not None and is_marked(
        cache_folder(packaged, decoders.PACKAGED_DECODERS, "decoder")[1], packaged.sha256)
    started = time.perf_counter()
    load_bench_decoder(spec, device, dtype)
    load_s = time.perf_counter() - started
    return {"load_s": load_s, "peak_mb": peak_rss_kb() / 1024, "converted": packaged is not None and not present}


def _child(flags: list[str], model_spec: str | None, device: str, dtype: str, threads: int | None, what: str,
           env: dict[str, str] | None = None) -> dict:
    """Run ``python -m papa_lib.ops.bench`` with ``flags`` in a fresh process (``env``: extra environment variables);
    its last output line as JSON."""
    command = [sys.executable, "-m", "papa_lib.ops.bench", *flags, "--device", device, "--dtype", dtype]
    if model_spec:
        command += ["--model", model_spec]
    if threads:
        command += ["--threads", str(threads)]
    env = dict(
        os.environ,
        **(env or {}),
        PYTHONPATH=os.pathsep.join(
            filter(None, [str(Path(__file__).resolve().parents[2]), os.environ.get("PYTHONPATH")])  # above papa_lib/
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


def bench_decoder_memory(spec: str | None, sizes: BenchSizes, device: str, dtype: str,
                         threads: int | None) -> dict[str, float]:
    """``decoder_full_vs_chunked_nll_peak``: the peak memory growth of the LM loss with the full
    ``[tokens, vocabulary]`` logits at once over that of :func:`~papa_lib.core.decoders.next_token_nll`'s chunks of
    ``sizes.decoder_chunk`` positions; one fresh process each."""
    chunk, positions = sizes.decoder_chunk, sizes.decoder_batch * sizes.decoder_length
    results = {}
    for way, size in (("chunked", chunk), ("full", max(positions, chunk + 1))):
        flags = ["--decoder-memory-child", str(size), "--length", str(sizes.decoder_length),
                 "--batch", str(sizes.decoder_batch), "--decoder-model", spec or DEFAULT_DECODER]
        results[way] = _child(flags, None, device, dtype, threads, f"decoder LM-loss memory child ({way})")
    growth = {way: max(r["peak_mb"] - r["before_mb"], 0.0) for way, r in results.items()}
    length = sizes.decoder_length
    return {
        f"decoder_full_vs_chunked_nll_peak_L{length}": growth["full"] / max(growth["chunked"], 1e-9),
        f"decoder_nll_peak_growth_mb_chunk{chunk}_L{length}": growth["chunked"],
        f"decoder_nll_peak_growth_mb_full_L{length}": growth["full"],
        f"decoder_nll_peak_mb_chunk{chunk}_L{length}": results["chunked"]["peak_mb"],
        f"decoder_nll_peak_mb_full_L{length}": results["full"]["peak_mb"],
        f"decoder_nll_tokens_L{length}": float(results["chunked"]["tokens"]),
        f"decoder_nll_chunked_minus_full_L{length}": results["chunked"]["nll"] - results["full"]["nll"],
    }


def bench_decoder_load(spec: str | None, device: str, dtype: str, threads: int | None, gguf_load: bool = False,
                       say=print) -> dict[str, float]:
    """``decoder_cached_load_s``: one :func:`papa_lib.load_decoder` call with the converted folder in the cache, in a
    fresh process; with ``gguf_load``, first ``decoder_gguf_load_s``: the first-time load (join the GGUF chunks,
    dequantize, convert, save, load; minutes on a CPU) into a temporary cache root (``$PAPA_CACHE_DIR`` of the
    children), and the cached reload then reads that folder, so the real cache is neither used nor touched.

    ``tiny`` is saved to a temporary folder first (a reload of an ordinary model folder); the GGUF load needs the
    packaged decoder (any other spec: skipped, with a ``#`` line)."""
    from ..core.decoders import packaged_decoder_for

    spec = spec or DEFAULT_DECODER
    figures: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="papa-bench-decoder-") as scratch:
        target = spec
        if spec == "tiny":
            model, tokenizer = load_bench_decoder("tiny")
            target = str(Path(scratch) / "tiny-gemma3")
            model.save_pretrained(target)
            tokenizer.save_pretrained(target)
        env = None
        if gguf_load and packaged_decoder_for(spec) is None:
            say(f"# decoder: --gguf-load needs the packaged {DEFAULT_DECODER}, not {spec!r}; skipped")
        elif gguf_load:
            env = {"PAPA_CACHE_DIR": str(Path(scratch) / "cache")}
            first = _child(["--decoder-load-child", "--decoder-model", target], None, device, dtype, threads,
                           "decoder GGUF load child", env)
            if not first["converted"]:
                raise RuntimeError("the GGUF load child found a converted folder in its empty cache root")
            figures["decoder_gguf_load_s"] = first["load_s"]
            figures["decoder_gguf_load_peak_mb"] = first["peak_mb"]
        cached = _child(["--decoder-load-child", "--decoder-model", target], None, device, dtype, threads,
                        "decoder cached load child", env)
        if cached["converted"]:
            say("# decoder: the cache had no converted folder; the 'cached' load below converted it")
        figures["decoder_cached_load_s"] = cached["load_s"]
        figures["decoder_cached_load_peak_mb"] = cached["peak_mb"]
        if "decoder_gguf_load_s" in figures:
            figures["decoder_gguf_vs_cached_load"] = figures["decoder_gguf_load_s"] / cached["load_s"]
    return figures
