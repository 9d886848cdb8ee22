"""What :mod:`papa_lib.ops.bench` builds on: the problem sizes, the benchmark models, device synchronisation and
interleaved timing (which ``papa grid --plan``'s measurements use too, :mod:`papa_lib.ops.plan`) and the process's
resident memory. (The FLOP model of the all-constant speed-up is the cost model's, :mod:`papa_lib.ops.costs`.)"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import torch

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
MODEL_ENV = "PAPA_BENCH_MODEL"


@dataclass(frozen=True)
class BenchSizes:
    """Problem sizes of one benchmark run (full or ``--quick``)."""

    averaging_sentences: int = 512
    averaging_length: int = 64
    averaging_batch: int = 32
    averaging_repeats: int = 3
    probe_sentences: int = 256
    probe_batch: int = 32
    probe_repeats: int = 3
    constant_lengths: tuple[int, ...] = (128, 256, 512)
    constant_batch: int = 8
    constant_repeats: int = 4
    memory_sentences: tuple[int, int] = (256, 1024)
    memory_batch: int = 32
    packing_sentences: int = 1024
    packing_batch: int = 32
    packing_repeats: int = 3
    seeds: int = 10
    seeds_sentences: int = 256
    seeds_repeats: int = 3
    store_sentences: int = 4096
    store_batch: int = 8
    decoder_length: int = 512
    decoder_batch: int = 2
    decoder_repeats: int = 4
    decoder_chunk: int = 256


def format_figure(name: str, value: float) -> str:
    """One output line, ``name: value``."""
    return f"{name}: {value:.4g}"


def load_bench_model(spec: str | None, device: str = "cpu", dtype: str = "fp32"):
    """(model, tokenizer) for a model spec: ``minilm`` (embedded, default), ``tiny`` (random 2-layer BERT), or a path.

    ``tiny`` uses the embedded model's tokenizer with a tiny randomly initialised BERT of the same vocabulary
    (:func:`papa_lib.smoke.tiny_model`, 512 positions).
    """
    from transformers import AutoTokenizer

    from ..core.models import check_device, embedded_model_path, load_encoder
    from ..smoke import tiny_model

    if dtype not in DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}; choose one of {sorted(DTYPES)}")
    device = check_device(device)
    spec = spec or os.environ.get(MODEL_ENV) or "minilm"
    if spec == "tiny":
        from ..core.packaged import EMBEDDED_HUB_ID

        tokenizer = AutoTokenizer.from_pretrained(str(embedded_model_path() or EMBEDDED_HUB_ID))
        model = tiny_model("bert", 0, vocab_size=len(tokenizer), max_position_embeddings=512)  # "tiny-random-bert"
        return model.to(device=device, dtype=DTYPES[dtype]).eval(), tokenizer
    return load_encoder(None if spec == "minilm" else spec, device=device, dtype=DTYPES[dtype])


#: The decoder the ``decoder`` benchmark runs by default (the ``gemma`` extra).
DEFAULT_DECODER = "gemma-3-270m"


def load_bench_decoder(spec: str | None, device: str = "cpu", dtype: str = "fp32"):
    """(model, tokenizer) for the ``decoder`` benchmark: ``gemma-3-270m`` (default, :func:`papa_lib.load_decoder`),
    ``tiny`` (a random 2-layer Gemma 3 with one key/value head for four query heads, the embedded model's tokenizer;
    the tests' stand-in), or a decoder folder or hub id."""
    from transformers import AutoModelForCausalLM, AutoTokenizer, Gemma3TextConfig

    from ..core.decoders import load_decoder, mark_causal_tokenizer
    from ..core.models import check_device, embedded_model_path, prepare_model

    if dtype not in DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}; choose one of {sorted(DTYPES)}")
    device = check_device(device)
    spec = spec or DEFAULT_DECODER
    if spec != "tiny":
        return load_decoder(spec, device=device, dtype=DTYPES[dtype])
    from ..core.packaged import EMBEDDED_HUB_ID

    tokenizer = mark_causal_tokenizer(AutoTokenizer.from_pretrained(str(embedded_model_path() or EMBEDDED_HUB_ID)))
    config = Gemma3TextConfig(vocab_size=2048, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                              num_attention_heads=4, num_key_value_heads=1, head_dim=8, query_pre_attn_scalar=8,
                              sliding_window=8, layer_types=["sliding_attention", "full_attention"],
                              max_position_embeddings=1024, pad_token_id=0, bos_token_id=1, eos_token_id=2)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, attn_implementation="eager")
    model = model.to(device=device, dtype=DTYPES[dtype]).eval()
    model.papa_model_id = "tiny-random-gemma3"
    prepare_model(model)
    return model, tokenizer


def synchronize_device(device) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def time_call(function: Callable[[], object], device, clock: Callable[[], float] = time.perf_counter) -> float:
    """Seconds (read on ``clock``) of one call of ``function``, the device synchronised before and after."""
    synchronize_device(device)
    start = clock()
    function()
    synchronize_device(device)
    return clock() - start


def time_interleaved(
    functions: dict[str, Callable[[], object]],
    repeats: int,
    device,
    warmups: Iterable[Callable[[], object]] | None = None,
    clock: Callable[[], float] = time.perf_counter,
) -> dict[str, list[float]]:
    """Time each function ``repeats`` times (:func:`time_call`), interleaved, alternating the order each repetition.

    ``warmups`` run first, untimed (default: each function once).
    """
    names = list(functions)
    for warmup in functions.values() if warmups is None else warmups:
        warmup()
    times = {name: [] for name in names}
    for repeat in range(repeats):
        for name in names if repeat % 2 == 0 else reversed(names):
            times[name].append(time_call(functions[name], device, clock))
    return times


def median_ratio(numerators: list[float], denominators: list[float]) -> float:
    return statistics.median(a / b for a, b in zip(numerators, denominators))


def current_rss_kb() -> int | None:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        pass
    return None


def peak_rss_kb() -> int:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    except OSError:
        pass
    import resource

    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)


def reset_peak_rss() -> bool:
    """Reset the process's peak RSS (Linux ``/proc/self/clear_refs``); False where that is not possible."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False
