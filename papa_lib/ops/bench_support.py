"""What :mod:`papa_lib.ops.bench` builds on: the FLOP model of the all-constant speed-up (paper Sec. 3.4; encoders and
decoders), the problem sizes, the benchmark models, device synchronisation and the process's resident memory.
Re-exported by :mod:`papa_lib.ops.bench`."""

from __future__ import annotations

import os
import statistics
from contextlib import contextmanager
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


# ---------------------------------------------------------------------------------------------- the FLOP model
def layer_flops(length: int, hidden: int, intermediate: int, constant: bool, *, attention_width: int | None = None,
                kv_width: int | None = None, ffn_matrices: int = 2) -> int:
    """FLOPs of one transformer layer on one sequence of ``length`` tokens (1 multiply-add = 2 FLOPs).

    Original layer: the Q, K, V and O projections ``n·d·(a + 2·a_kv + a)·2`` (a = H·d′ the width of the query
    heads, a_kv = H_kv·d′ that of the key/value heads; an encoder has a = a_kv = d, so ``4·n·d²·2``), the scores QKᵀ
    and the product AV ``2·n²·a·2`` (summed over heads; grouped-query attention still computes them per query head)
    and the feed-forward block's ``ffn_matrices`` matrices ``m·n·d·d_ff·2`` (2 for BERT's, 3 for the gated blocks of
    Gemma and Llama). All-constant layer: only the V and O projections ``n·d·(a_kv + a)·2``, the product CV
    ``n²·a·2`` and the same feed-forward block.

    This is the paper's per-head count (Sec. 3.4: 2n²d′ + 3nd′² → n²d′ + nd′² multiply-adds, with the projection
    term read as n·d·d′ per head) summed over the H heads, plus the output projection and the feed-forward block,
    which the replacement does not touch. A decoder's causal mask and sliding window do not reduce the count: the
    eager attention and the fast path both compute the full ``n × n`` products. Softmax, scaling, masking, layer
    norms, rotary embeddings, activations and biases are not counted (they are O(n²·H) or O(n·d), small next to the
    matrix products in FLOPs, though not always in time).
    """
    n, d, f = int(length), int(hidden), int(intermediate)
    a = d if attention_width is None else int(attention_width)
    a_kv = a if kv_width is None else int(kv_width)
    feed_forward = int(ffn_matrices) * n * d * f * 2
    if constant:
        return n * d * (a_kv + a) * 2 + n * n * a * 2 + feed_forward
    return n * d * (2 * a + 2 * a_kv) * 2 + 2 * n * n * a * 2 + feed_forward


def flop_limit(length: int, hidden: int, intermediate: int, *, attention_width: int | None = None,
               kv_width: int | None = None, ffn_matrices: int = 2, layers: int = 1, other_flops: int = 0) -> float:
    """The FLOP-count limit of the all-constant speed-up: FLOPs(original stack) / FLOPs(all-constant stack).

    Every layer has the same shape, so without ``other_flops`` this is the per-layer ratio of :func:`layer_flops`.
    ``other_flops`` are the FLOPs of one sequence outside the ``layers`` layers that the replacement leaves alone (a
    decoder's LM head, ``n·d·V·2``): counted on both sides, they pull the limit towards 1.
    """
    shape = dict(attention_width=attention_width, kv_width=kv_width, ffn_matrices=ffn_matrices)
    original = layers * layer_flops(length, hidden, intermediate, False, **shape) + other_flops
    constant = layers * layer_flops(length, hidden, intermediate, True, **shape) + other_flops
    return original / constant


def decoder_shape(config) -> dict[str, int]:
    """The :func:`layer_flops` shape of a decoder's layers from its (text) config: ``hidden``, ``intermediate``,
    ``attention_width`` (H·d′), ``kv_width`` (H_kv·d′), ``ffn_matrices`` (3: the gated blocks of Gemma and Llama;
    2 for GPT-2), ``layers`` and ``vocab``."""
    config = getattr(config, "text_config", config)
    if getattr(config, "model_type", None) == "gpt2":
        hidden, heads = int(config.n_embd), int(config.n_head)
        intermediate, kv_heads, matrices = int(config.n_inner or 4 * hidden), heads, 2
        layers = int(config.n_layer)
        head_dim = hidden // heads
    else:
        hidden, heads = int(config.hidden_size), int(config.num_attention_heads)
        intermediate, matrices, layers = int(config.intermediate_size), 3, int(config.num_hidden_layers)
        kv_heads = int(getattr(config, "num_key_value_heads", None) or heads)
        head_dim = int(getattr(config, "head_dim", None) or hidden // heads)
    return {"hidden": hidden, "intermediate": intermediate, "attention_width": heads * head_dim,
            "kv_width": kv_heads * head_dim, "ffn_matrices": matrices, "layers": layers,
            "vocab": int(config.vocab_size)}


def load_bench_model(spec: str | None, device: str = "cpu", dtype: str = "fp32"):
    """(model, tokenizer) for a model spec: ``minilm`` (embedded, default), ``tiny`` (random 2-layer BERT), or a path.

    ``tiny`` uses the embedded model's tokenizer with a tiny randomly initialised BERT of the same vocabulary.
    """
    from transformers import AutoModel, AutoTokenizer, BertConfig

    from ..core.models import embedded_model_path, load_encoder

    if dtype not in DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}; choose one of {sorted(DTYPES)}")
    if str(device).startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"device {device!r} requested but CUDA is not available on this machine")
    spec = spec or os.environ.get(MODEL_ENV) or "minilm"
    if spec == "tiny":
        from ..core.packaged import EMBEDDED_HUB_ID

        tokenizer = AutoTokenizer.from_pretrained(str(embedded_model_path() or EMBEDDED_HUB_ID))
        config = BertConfig(
            vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37,
            max_position_embeddings=512,
        )
        torch.manual_seed(0)
        model = AutoModel.from_config(config, attn_implementation="eager").to(device=device, dtype=DTYPES[dtype]).eval()
        model.papa_model_id = "tiny-random-bert"
        return model, tokenizer
    return load_encoder(None if spec == "minilm" else spec, device=device, dtype=DTYPES[dtype])


#: The decoder the ``decoder`` benchmark runs by default (the ``gemma`` extra).
DEFAULT_DECODER = "gemma-3-270m"


def load_bench_decoder(spec: str | None, device: str = "cpu", dtype: str = "fp32"):
    """(model, tokenizer) for the ``decoder`` benchmark: ``gemma-3-270m`` (default, :func:`papa_lib.load_decoder`),
    ``tiny`` (a random 2-layer Gemma 3 with one key/value head for four query heads, the embedded model's tokenizer;
    the tests' stand-in), or a decoder folder or hub id."""
    from transformers import AutoModelForCausalLM, AutoTokenizer, Gemma3TextConfig

    from ..core.decoders import load_decoder, mark_causal_tokenizer
    from ..core.models import embedded_model_path, prepare_model

    if dtype not in DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}; choose one of {sorted(DTYPES)}")
    if str(device).startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"device {device!r} requested but CUDA is not available on this machine")
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


def median_ratio(numerators: list[float], denominators: list[float]) -> float:
    return statistics.median(a / b for a, b in zip(numerators, denominators))


@contextmanager
def frozen_parameters(model):
    """Temporarily stop ``model``'s parameters from requiring gradients (restored exactly on exit)."""
    flags = [(p, p.requires_grad) for p in model.parameters()]
    try:
        for p, _ in flags:
            p.requires_grad_(False)
        yield model
    finally:
        for p, flag in flags:
            p.requires_grad_(flag)


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
