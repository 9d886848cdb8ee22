"""Speed and memory benchmarks of the library (paper Sec. 3.4 "Potential Computational Gains", and our own tools).

Run ``python -m papa_lib.ops.bench [averaging|probe|seeds|constant|packing|memory|store|all|decoder] [--quick]``
(also ``papa bench``). Every figure is printed as one ``name: value`` line (lines starting with ``#`` are context);
all are measured in one run, side by side, on the embedded all-MiniLM-L6-v2 unless ``--model`` (or the
``PAPA_BENCH_MODEL`` environment variable) says otherwise (``tiny`` is a 2-layer random BERT used by the tests;
``all-mpnet-base-v2`` the second real model, from the ``mpnet`` extra). ``all`` is every encoder benchmark;
``decoder`` runs on a decoder LM, the packaged Gemma 3 270M unless ``--decoder-model`` says otherwise (``tiny``: a
random 2-layer Gemma 3, for the tests), and only when named.

Figures
-------
``averaging_vs_forward``
    Throughput of :func:`papa_lib.average_attention` over 512 sentences at L = 64 (batch 32) divided by the
    throughput of a plain forward pass with ``output_attentions=True`` over the same pre-encoded batches, both under
    ``torch.inference_mode``. Target >= 0.9. Three repetitions, interleaved (the order alternates), after a warm-up
    on two batches; the figure is the median of the per-repetition ratios.
``cached_vs_recomputed_epoch``
    Time of one probing epoch that recomputes the frozen backbone at every step divided by the time of one epoch on
    features cached once by :class:`papa_lib.experiments.features.BackboneRunner` (256 sentences, L = 64, batch 32,
    the same batches and probe initialisation; median of three interleaved repetitions). The cached path is the one
    the engine (:func:`papa_lib.experiments.engine.train_frozen`) uses for frozen variants; the recomputing path is
    :class:`~papa_lib.experiments.inloop.BackboneProbe` with the backbone's weights not requiring gradients (what a
    frozen variant would cost without the cache). ``feature_extraction_s`` is the one-off caching cost.
``probe_seeds_batched_vs_sequential_{sentence,token}``
    Time of training the probes of 10 seeds one after another (one :func:`~papa_lib.experiments.training.train_seeds`
    call per seed) divided by training them together (one call for all: every step takes each seed's batch in one
    backward pass and one AdamW call), one epoch on cached real-token features of 256 sentences (L = 64), each seed
    with its own 90% of them; sentence probes at batch 32, token probes (one row per token) at batch 8, Table 3's
    sizes for SST-2 and NER. Median of three interleaved repetitions. ``probe_seeds_interleaved_vs_sequential_*``: the
    same with the seeds trained in one pass but in turns (each seed takes all its batches of a chunk of the pass before
    the next seed; ``train_seeds(batched=False)``). ``probe_seeds_max_abs_diff_*`` is the largest difference between
    the sequential probes' trained weights and the other two ways' (0: equal bit for bit). On a CPU a token probe's step
    is dominated by its first layer's matrix products, whose work grows with the number of seeds either way, so the
    ratio stays near 1 there; what training together saves is the per-step overhead (one backward, one optimiser
    call). On a GPU that overhead is larger, but each seed still gathers its own rows and runs its own products: an
    H200 measured 1.1 for both kinds (BENCHMARKS.md, "Seeds trained together").
``constant_vs_original_L{128,256,512}``
    Speed-up of a forward pass with every head ``constant`` (fast path, :mod:`papa_lib.core.fastpath`) over the original
    eager forward pass, same batch (8 sequences of random ids, every token real), median of four interleaved
    repetitions after a warm-up, measured in the steady state of a long-running override (the per-override matrix
    cache stays warm).
    ``constant_reference_vs_original_L*`` is the same for the reference path (``fast=False``).
``flop_limit_L{128,256,512}``
    The FLOP-count limit of that speed-up, :func:`~papa_lib.ops.costs.flop_limit`: FLOPs of the original layer
    stack over FLOPs of the all-constant stack (see :func:`~papa_lib.ops.costs.layer_flops`, the cost model's
    per-layer count). ``constant_speedup_over_limit_L*`` = measured / limit (target: within 5% of 1).
``averaging_peak_mem_ratio``
    Peak memory of averaging over a corpus 4x larger divided by the peak over the smaller one (256 and 1024
    sentences, batch 32; each size in a fresh subprocess). On CPU the peak is the resident set size (``VmHWM``,
    reset after the model is loaded and warmed up so that loading does not count); on CUDA it is
    ``torch.cuda.max_memory_allocated``. Target ~= 1.0. ``averaging_peak_mem_mb_N`` and
    ``averaging_peak_growth_mb_N`` (peak minus the memory held just before averaging) give the absolute values.

``feature_store_in_memory_vs_in_place_peak``
    How much a variant's feature cache costs in memory. The peak memory growth (``VmHWM``, reset after the model is
    loaded and warmed up; resident pages, file-backed ones included) of extracting the real-token features of 4096
    sentences (L = 64; batch 8, so that the forward pass is small next to the store) into a
    :class:`~papa_lib.experiments.features.FeatureStore` by filling them in memory and then saving them, divided by
    the growth of writing them in place into the store's file
    (:meth:`~papa_lib.experiments.features.FeatureStore.build`, what the engine does); one fresh process each.
    Target >= 1.5 (the in-memory way holds the features twice while it saves). ``feature_store_peak_vs_size_*`` give
    each way's growth over the stored bytes (in place: about 1; the file's pages can be written back and reclaimed).

Decoder figures (``papa bench decoder``; L = 512, batch 2, random ids, every token real)
---------------------------------------------------------------------------------------
``decoder_constant_vs_original_L512``
    Speed-up of the decoder's block stack (the bare model, ``model.base_model``: embeddings, layers, final norm;
    no LM head) with every head ``constant`` (fast path, :func:`papa_lib.core.fastpath.fast_causal_attention`: no
    Q/K projections, no Q·K, no softmax, one shared ``[H, L, L]`` matrix times V) over the original eager forward;
    median of four interleaved repetitions after a warm-up, the matrix cache warm, as for encoders.
    ``decoder_{original,constant}_tokens_per_s_L512`` are the two throughputs (tokens of the batch / median time),
    ``decoder_constant_reference_vs_original_L512`` the same speed-up for the reference path (``fast=False``) and
    ``decoder_fast_vs_reference_max_abs_diff_L512`` the largest difference of the two paths' last hidden states.
``decoder_flop_limit_L512``
    The FLOP-count limit of that speed-up for the blocks only (the LM head excluded, as in the timed forward):
    :func:`~papa_lib.ops.costs.flop_limit` with the decoder's shapes (grouped-query key/value width, gated
    feed-forward block; see :func:`~papa_lib.ops.costs.layer_flops` and :func:`~papa_lib.ops.costs.decoder_shape`).
    ``decoder_constant_speedup_over_limit`` = measured / limit; ``decoder_flop_limit_with_lm_head_L512`` is the
    limit of a forward that also computes the logits (:func:`~papa_lib.ops.costs.lm_head_flops`: Gemma's 262k-word
    LM head, which the replacement leaves alone, is most of that forward's FLOPs).
``decoder_full_vs_chunked_nll_peak_L512``
    Peak memory growth of the summed next-token NLL with the full ``[tokens, vocabulary]`` logits at once
    (:func:`~papa_lib.core.decoders.next_token_nll` with one chunk) over that of its chunked LM head (256 positions
    at a time); one fresh process each, measured as ``averaging_peak_mem_ratio`` is (``VmHWM`` reset after the model is
    loaded and warmed up). ``decoder_nll_peak_growth_mb_*`` and ``decoder_nll_peak_mb_*`` give the growth and the peak
    of each (the model's weights are in the peak); ``decoder_nll_chunked_minus_full_L512`` the difference of the
    two sums (nats).
``decoder_cached_load_s``
    One :func:`papa_lib.load_decoder` call in a fresh process with the converted folder in the cache
    (``decoder_cached_load_peak_mb``: the process's peak RSS, imports included). With ``--gguf-load``, first
    ``decoder_gguf_load_s``: the first-time load (join the GGUF chunks, dequantize, convert the tokenizer, save, load;
    minutes on a CPU) into a temporary cache root, which the cached reload then reads, so the real cache is not
    touched; ``decoder_gguf_vs_cached_load`` is their ratio.

Sentences come from ``../shared/data/glue/SST-2/dev.tsv`` next to the repository (cycled when more are needed), or
are generated from a fixed word list when that file is absent (the figure lines do not change).

``--quick`` shrinks every size so that the whole run takes well under a minute on two CPU cores (the decoder
benchmark: L = 128, batch 1); the figures then are only a smoke test. ``--device cuda`` and ``--dtype bf16`` run on a
GPU; timings synchronise the device.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path

import torch

from ..book.profiles import shared_data_dir
from ..core.models import frozen_parameters
from .bench_memory import (
    bench_decoder_load,
    bench_decoder_memory,
    bench_memory,
    bench_store,
    decoder_load_child,
    decoder_memory_child,
    memory_child,
    random_decoder_batch,
    store_child,
)
from .bench_support import (
    DEFAULT_DECODER,
    DTYPES,
    MODEL_ENV,
    BenchSizes,
    format_figure,
    load_bench_decoder,
    load_bench_model,
    median_ratio,
    time_call,
    time_interleaved,
)
from .costs import decoder_shape, flop_limit, lm_head_flops

#: The encoder benchmarks (what ``all`` runs).
ENCODER_BENCHMARKS = ("averaging", "probe", "seeds", "constant", "packing", "memory", "store")
BENCHMARK_NAMES = (*ENCODER_BENCHMARKS, "decoder")
SHARED_DATA = shared_data_dir()  # ../shared/data beside the checkout
SST2_DEV = SHARED_DATA / "glue" / "SST-2" / "dev.tsv"
#: How time is read: wall-clock (default) or the CPU time of this process (all its threads), which is much less
#: sensitive to other processes on a shared machine (use it with ``--threads 1``; CPU devices only).
CLOCKS: dict[str, Callable[[], float]] = {"wall": time.perf_counter, "process": time.process_time}
_clock: Callable[[], float] = time.perf_counter


FULL = BenchSizes()
QUICK = BenchSizes(
    averaging_sentences=32, averaging_batch=16, averaging_repeats=2, probe_sentences=32, probe_batch=16,
    probe_repeats=1, constant_batch=1, constant_repeats=2, memory_sentences=(32, 128), memory_batch=8,
    packing_sentences=64, packing_batch=16, packing_repeats=1, seeds_sentences=32, seeds_repeats=1,
    store_sentences=512, store_batch=8, decoder_length=128, decoder_batch=1, decoder_repeats=2,
)


# ---------------------------------------------------------------------------------------------- helpers
def benchmark_sentences(count: int, seed: int = 0) -> tuple[list[str], list[int], str]:
    """``count`` sentences with binary labels and where they came from (SST-2 dev, cycled, or generated)."""
    if count < 1:
        raise ValueError(f"count must be positive, got {count}")
    if SST2_DEV.exists():
        from ..experiments.tasks import load_task

        dev = load_task("sst2", "validation", data_dir=SHARED_DATA)  # the task loader reads SST2_DEV
        texts, labels = list(dev.texts), [int(label) for label in dev.labels]
        return (
            [texts[i % len(texts)] for i in range(count)],
            [labels[i % len(labels)] for i in range(count)],
            "SST-2 dev",
        )
    rng = random.Random(seed)
    words = ("the film a story is was very not quite moving dull funny sad long short with of and but it its "
             "actors plot scene music ending charming bleak bright slow fast smart silly warm cold").split()
    texts = [" ".join(rng.choice(words) for _ in range(rng.randint(4, 40))) for _ in range(count)]
    return texts, [rng.randint(0, 1) for _ in range(count)], "generated"


# ---------------------------------------------------------------------------------------------- benchmarks
def bench_averaging(model, tokenizer, sizes: BenchSizes, device) -> dict[str, float]:
    """``averaging_vs_forward``: averaging throughput / plain forward (``output_attentions=True``) throughput."""
    from ..core.averaging import average_attention
    from ..core.layout import batched, encode
    from ..core.models import model_inputs

    texts, _, _ = benchmark_sentences(sizes.averaging_sentences)
    encoded = encode(tokenizer, texts, max_length=sizes.averaging_length)
    batches = list(batched(encoded, sizes.averaging_batch))

    def forward():
        with torch.inference_mode():
            for batch in batches:
                model(**model_inputs(model, batch), output_attentions=True)

    def averaging():
        average_attention(model, batches, progress=False)

    def warmup():  # a couple of batches each: allocations, lazy initialisation
        average_attention(model, batches[:2], progress=False)
        with torch.inference_mode():
            for batch in batches[:2]:
                model(**model_inputs(model, batch), output_attentions=True)

    times = time_interleaved({"averaging": averaging, "forward": forward}, sizes.averaging_repeats, device, [warmup],
                             clock=_clock)
    count = len(texts)
    return {
        "averaging_vs_forward": median_ratio(times["forward"], times["averaging"]),
        "averaging_sentences_per_s": count / statistics.median(times["averaging"]),
        "forward_with_attentions_sentences_per_s": count / statistics.median(times["forward"]),
    }


def bench_probe(model, tokenizer, sizes: BenchSizes, device) -> dict[str, float]:
    """``cached_vs_recomputed_epoch``: one probe epoch recomputing the backbone / one epoch on cached features.

    Uses the engine's real-token features (:class:`papa_lib.experiments.features.BackboneRunner`, float16 hidden
    states of every layer) with the probe trainer of :mod:`papa_lib.experiments.training`, and the in-loop
    :class:`~papa_lib.experiments.inloop.BackboneProbe`, with the SST-2 probing settings of Table 3
    (batch 32, lr 1e-4, L = 64).
    """
    from ..core.layout import encode
    from ..experiments import probes
    from ..experiments.features import BackboneRunner
    from ..experiments.inloop import BackboneProbe, train_inloop
    from ..experiments.loop import adamw, set_seed
    from ..experiments.training import SeedPlan, train_seeds

    length, learning_rate, seed = 64, 1e-4, 0
    texts, labels, _ = benchmark_sentences(sizes.probe_sentences)
    encoded = encode(tokenizer, texts, max_length=length)
    labels = torch.tensor(labels, dtype=torch.long)
    layers = int(model.config.num_hidden_layers) + 1
    hidden = int(model.config.hidden_size)
    rows = torch.arange(len(labels))
    plan = SeedPlan(seed, rows, rows[:1])

    def new_probe(_seed=seed):
        set_seed(seed)
        return probes.make_probe("sentence", layers, length, hidden, 2)

    extraction = []
    runner = BackboneRunner(model, encoded, labels, "sentence", batch_size=sizes.probe_batch)

    def extract():
        extraction.append(runner.rows(rows))

    extract_s = time_call(extract, device, _clock)
    features = extraction[-1]

    def cached_epoch():
        train_seeds(new_probe, [plan], lambda chunk: (features, chunk), lambda p: (features, p.heldout),
                    lambda p, predictions: 0.0, labels, "sentence", pool_size=len(labels),
                    batch_size=sizes.probe_batch, learning_rate=learning_rate, max_epochs=1, patience=1, device=device)

    def recomputed_epoch():
        wrapper = BackboneProbe(model, new_probe(), "sentence")
        with frozen_parameters(model):
            train_inloop(wrapper, None, encoded, labels, "sentence", rows, seed=seed, epochs=1,
                         learning_rate=learning_rate, batch_size=sizes.probe_batch, device=device)

    batches = [rows[i : i + sizes.probe_batch] for i in range(0, len(rows), sizes.probe_batch)]

    def probe_steps(ragged: bool):
        """One pass of training steps of a sentence probe: padded [B, layers, W, D] inputs or real-token rows."""
        probe = new_probe()
        optimiser = adamw(probe.parameters(), learning_rate)
        for part in batches:
            inputs = (features.ragged_sentences(part, device),) if ragged else features.sentence_batch(part, device)
            loss = torch.nn.functional.cross_entropy(probe(*inputs), labels[part].to(device))
            optimiser.zero_grad(set_to_none=True)
            loss.backward()
            optimiser.step()

    # The feature extraction above has warmed the backbone up; no separate warm-up.
    times = time_interleaved({"cached": cached_epoch, "recomputed": recomputed_epoch,
                              "padded_steps": lambda: probe_steps(False), "ragged_steps": lambda: probe_steps(True)},
                             sizes.probe_repeats, device, [], clock=_clock)
    return {
        "ragged_vs_padded_probe_steps": median_ratio(times["padded_steps"], times["ragged_steps"]),
        "probe_step_ms": 1000 * statistics.median(times["ragged_steps"]) / len(batches),
        "cached_vs_recomputed_epoch": median_ratio(times["recomputed"], times["cached"]),
        "cached_epoch_s": statistics.median(times["cached"]),
        "recomputed_epoch_s": statistics.median(times["recomputed"]),
        "feature_extraction_s": extract_s,
    }


def bench_seeds(model, tokenizer, sizes: BenchSizes, device) -> dict[str, float]:
    """``probe_seeds_batched_vs_sequential_{sentence,token}``: the probes of ``sizes.seeds`` seeds trained one after
    another / trained together (see the module docstring), on the same cached features; and how far apart they end."""
    from ..core.layout import encode
    from ..experiments import probes
    from ..experiments.features import BackboneRunner
    from ..experiments.training import HELDOUT_FRACTION, SeedPlan, heldout_split, train_seeds

    length = 64
    texts, labels, _ = benchmark_sentences(sizes.seeds_sentences)
    encoded = encode(tokenizer, texts, max_length=length)
    labels = torch.tensor(labels, dtype=torch.long)
    layers, hidden = int(model.config.num_hidden_layers) + 1, int(model.config.hidden_size)
    rows = torch.arange(len(labels))
    features = BackboneRunner(model, encoded, labels, "sentence", batch_size=32).rows(rows)
    counts = features.offsets.diff()
    generator = torch.Generator().manual_seed(0)
    tags = torch.full((len(labels), int(counts.max())), -100, dtype=torch.long)  # one random tag (of 9) per token
    for row, count in enumerate(counts.tolist()):
        tags[row, :count] = torch.randint(0, 9, (count,), generator=generator)
    plans = [SeedPlan(seed, *heldout_split(rows, HELDOUT_FRACTION, seed)) for seed in range(sizes.seeds)]
    figures: dict[str, float] = {}
    for kind, batch, targets, classes, rate in (("sentence", 32, labels, 2, 1e-4), ("token", 8, tags, 9, 5e-4)):
        def train(chosen, batched=True, kind=kind, batch=batch, targets=targets, classes=classes, rate=rate):
            return train_seeds(lambda seed: probes.make_probe(kind, layers, length, hidden, classes), chosen,
                               lambda chunk: (features, chunk), lambda chosen_plan: (features, chosen_plan.heldout),
                               lambda chosen_plan, predictions: 0.0, targets, kind, pool_size=len(rows),
                               batch_size=batch,
                               learning_rate=rate, max_epochs=1, patience=1, device=device, batched=batched)

        trained = {}  # each way's probes, filled by the timed calls (which run within this iteration)

        def sequential(trained=trained, train=train):
            trained["sequential"] = {seed: out for plan in plans for seed, out in train([plan]).items()}

        def together(trained=trained, train=train):
            trained["together"] = train(plans)

        def interleaved(trained=trained, train=train):
            trained["interleaved"] = train(plans, batched=False)

        times = time_interleaved({"sequential": sequential, "together": together, "interleaved": interleaved},
                                 sizes.seeds_repeats, device, [lambda train=train: train(plans[:1])], clock=_clock)
        figures[f"probe_seeds_batched_vs_sequential_{kind}"] = median_ratio(times["sequential"], times["together"])
        figures[f"probe_seeds_interleaved_vs_sequential_{kind}"] = median_ratio(times["sequential"],
                                                                                  times["interleaved"])
        figures[f"probe_seeds_together_s_{kind}"] = statistics.median(times["together"])
        figures[f"probe_seeds_max_abs_diff_{kind}"] = max(
            float((a - b).abs().max())
            for plan in plans
            for way in ("together", "interleaved")
            for a, b in zip(trained["sequential"][plan.seed].probe.state_dict().values(),
                            trained[way][plan.seed].probe.state_dict().values()))
    return figures


def bench_packing(model, tokenizer, sizes: BenchSizes, device, data_dir: Path | None = None) -> dict[str, float]:
    """``packed_vs_padded_{sst2,cola}_L64``: feature-extraction throughput on real training sentences, packed (real
    tokens only, App. A position ids, batches of similar length) over padded to L = 64; same sentences, same batch
    size, same :class:`~papa_lib.experiments.features.BackboneRunner`. Also what the feature store keeps per SST-2
    example (fp16 real-token rows of every layer) and the padded equivalent, and the largest difference between the
    two runs' hidden states.
    """
    from ..experiments import tasks
    from ..experiments.features import BackboneRunner
    from ..experiments.task_specs import TASKS
    from ..experiments.workspace import encode_split

    data_dir = Path(data_dir) if data_dir is not None else SHARED_DATA
    figures: dict[str, float] = {}
    for task in ("sst2", "cola"):
        try:
            examples = tasks.load_task(task, "train", data_dir=data_dir, limit=sizes.packing_sentences, seed=0)
        except (FileNotFoundError, ValueError) as error:
            print(f"# packing: no {task} training data under {data_dir} ({error}); skipped")
            continue
        split = encode_split(tokenizer, TASKS[task], examples, 64)
        rows = torch.arange(len(split))
        runners = {mode: BackboneRunner(model, split.encoded, split.labels, "sentence", sizes.packing_batch,
                                        packed=(mode == "packed")) for mode in ("packed", "padded")}
        outputs = {}

        def extract(mode, outputs=outputs, runners=runners, rows=rows):
            return lambda: outputs.__setitem__(mode, runners[mode].rows(rows))

        times = time_interleaved({mode: extract(mode) for mode in runners}, sizes.packing_repeats, device,
                                 clock=_clock)
        figures[f"packed_vs_padded_{task}_L64"] = median_ratio(times["padded"], times["packed"])
        figures[f"real_tokens_per_example_{task}_L64"] = float(split.encoded["attention_mask"].sum()) / len(split)
        figures[f"packed_vs_padded_max_abs_diff_{task}"] = float(
            (outputs["packed"].values.float() - outputs["padded"].values.float()).abs().max())
        if task == "sst2":
            values = outputs["packed"].values
            per_example = values.numel() * values.element_size() / len(split)
            padded = 64 * values.shape[1] * values.shape[2] * values.element_size()
            figures["feature_bytes_per_example_sst2_L64"] = per_example
            figures["feature_bytes_per_example_padded_sst2_L64"] = float(padded)
            figures["feature_bytes_padded_vs_stored_sst2_L64"] = padded / per_example
    return figures


def _time_constant(model, matrices: torch.Tensor, forward: Callable[[], object], repeats: int,
                   device) -> tuple[dict[str, list[float]], dict[str, object]]:
    """Times of ``forward()`` (under ``torch.inference_mode``) as it is (``original``) and with every head
    ``constant`` on the fast path (``constant``) and on the reference path (``reference``), interleaved, each
    override's matrix cache kept warm (the steady state of a long-running override); and what each replaced
    ``forward()`` returned last."""
    from ..core.override import AttentionOverride

    overrides = {
        "constant": AttentionOverride(model, matrices, mode="constant", fast=True),
        "reference": AttentionOverride(model, matrices, mode="constant", fast=False),
    }
    caches: dict[str, dict] = {name: {} for name in overrides}
    outputs: dict[str, object] = {}

    def original():
        with torch.inference_mode():
            forward()

    def replaced(name):
        state = overrides[name]
        with torch.inference_mode(), state.applied(model):
            state._dynamic_cache.update(caches[name])
            outputs[name] = forward()
            caches[name] = dict(state._dynamic_cache)

    times = time_interleaved(
        {"original": original, "constant": lambda: replaced("constant"), "reference": lambda: replaced("reference")},
        repeats,
        device,
        clock=_clock,
    )
    return times, outputs


def bench_constant(model, tokenizer, sizes: BenchSizes, device) -> dict[str, float]:
    """``constant_vs_original_L*``, ``flop_limit_L*``: all-constant forward (fast path) vs the original forward."""
    from ..core.models import model_inputs, num_layers_and_heads

    layers, heads = num_layers_and_heads(model)
    hidden, intermediate = int(model.config.hidden_size), int(model.config.intermediate_size)
    vocab = int(model.config.vocab_size)
    figures: dict[str, float] = {}
    for length in sizes.constant_lengths:
        generator = torch.Generator().manual_seed(length)
        ids = torch.randint(min(1000, vocab // 2), vocab, (sizes.constant_batch, length), generator=generator)
        batch = model_inputs(
            model, {"input_ids": ids, "attention_mask": torch.ones_like(ids), "token_type_ids": torch.zeros_like(ids)}
        )
        # Timing does not depend on the values: random positive matrices stand in for averaged ones.
        matrices = torch.rand(layers, heads, length, length, generator=generator) + 1e-3
        times, _ = _time_constant(model, matrices, lambda batch=batch: model(**batch), sizes.constant_repeats, device)
        speedup = median_ratio(times["original"], times["constant"])
        limit = flop_limit(length, hidden, intermediate)
        figures[f"constant_vs_original_L{length}"] = speedup
        figures[f"flop_limit_L{length}"] = limit
        figures[f"constant_speedup_over_limit_L{length}"] = speedup / limit
        figures[f"constant_reference_vs_original_L{length}"] = median_ratio(times["original"], times["reference"])
    return figures


def bench_decoder(model, tokenizer, sizes: BenchSizes, device) -> dict[str, float]:
    """``decoder_constant_vs_original_L*``, ``decoder_flop_limit_L*``: the decoder's block stack with every head
    constant (fast path) vs the original forward, tokens/s of each, and the FLOP-count limit of the blocks."""
    from ..core.models import num_layers_and_heads

    layers, heads = num_layers_and_heads(model)
    shape = decoder_shape(model.config)
    base = model.base_model  # the blocks, without the LM head
    length, count = sizes.decoder_length, sizes.decoder_batch
    inputs = random_decoder_batch(shape["vocab"], count, length, tokenizer.bos_token_id, seed=length)
    inputs = {k: v.to(device) for k, v in inputs.items()}
    # Timing does not depend on the values: random positive matrices stand in for averaged ones (the causal band
    # cuts them).
    matrices = torch.rand(layers, heads, length, length, generator=torch.Generator().manual_seed(length)) + 1e-3
    times, outputs = _time_constant(model, matrices, lambda: base(**inputs, use_cache=False).last_hidden_state,
                                    sizes.decoder_repeats, device)
    flop_shape = {k: shape[k] for k in ("attention_width", "kv_width", "ffn_matrices")}
    limit = flop_limit(length, shape["hidden"], shape["intermediate"], **flop_shape)
    speedup = median_ratio(times["original"], times["constant"])
    tokens = count * length
    lm_head = lm_head_flops(length, shape["hidden"], shape["vocab"])
    return {
        f"decoder_original_tokens_per_s_L{length}": tokens / statistics.median(times["original"]),
        f"decoder_constant_tokens_per_s_L{length}": tokens / statistics.median(times["constant"]),
        f"decoder_constant_vs_original_L{length}": speedup,
        f"decoder_flop_limit_L{length}": limit,
        f"decoder_constant_speedup_over_limit_L{length}": speedup / limit,
        f"decoder_flop_limit_with_lm_head_L{length}": flop_limit(
            length, shape["hidden"], shape["intermediate"], **flop_shape, layers=shape["layers"], other_flops=lm_head),
        f"decoder_constant_reference_vs_original_L{length}": median_ratio(times["original"], times["reference"]),
        f"decoder_fast_vs_reference_max_abs_diff_L{length}": float(
            (outputs["constant"].float() - outputs["reference"].float()).abs().max()),
    }


def run_decoder_benchmark(spec: str | None, sizes: BenchSizes, device: str, dtype: str, threads: int | None,
                          gguf_load: bool, say: Callable[[str], None]) -> dict[str, float]:
    """The ``decoder`` benchmark: :func:`bench_decoder` in this process, then the LM-loss memory
    (:func:`~papa_lib.ops.bench_memory.bench_decoder_memory`) and the load times
    (:func:`~papa_lib.ops.bench_memory.bench_decoder_load`) in fresh processes."""
    model, tokenizer = load_bench_decoder(spec, device, dtype)
    shape = decoder_shape(model.config)
    heads = int(getattr(model.config, "text_config", model.config).num_attention_heads)
    kv_heads = shape["kv_width"] * heads // shape["attention_width"]
    say(f"# decoder: {getattr(model, 'papa_model_id', '?')}, {shape['layers']} layers, {heads} query heads, "
        f"{kv_heads} key/value head(s), vocabulary {shape['vocab']}; L = {sizes.decoder_length}, "
        f"batch {sizes.decoder_batch}; timed: the blocks (no LM head)")
    figures = bench_decoder(model, tokenizer, sizes, device)
    del model
    figures.update(bench_decoder_memory(spec, sizes, device, dtype, threads))
    figures.update(bench_decoder_load(spec, device, dtype, threads, gguf_load, say))
    return figures


# ---------------------------------------------------------------------------------------------- entry points
def _expand(names: Iterable[str]) -> list[str]:
    selected: list[str] = []
    for name in names:
        if name == "all":
            selected.extend(n for n in ENCODER_BENCHMARKS if n not in selected)
        elif name in BENCHMARK_NAMES:
            if name not in selected:
                selected.append(name)
        else:
            raise ValueError(f"unknown benchmark {name!r}; choose from {', '.join(BENCHMARK_NAMES)} or 'all'")
    if not selected:
        raise ValueError("no benchmark selected")
    return selected


def run_benchmarks(
    names: Iterable[str],
    quick: bool = False,
    *,
    model: str | None = None,
    device: str = "cpu",
    dtype: str = "fp32",
    threads: int | None = None,
    emit: Callable[[str], None] | None = print,
    sizes: BenchSizes | None = None,
    clock: str = "wall",
    decoder_model: str | None = None,
    gguf_load: bool = False,
) -> dict[str, float]:
    """Run the named benchmarks (``averaging``, ``probe``, ``seeds``, ``constant``, ``packing``, ``memory``, ``store``,
    ``all`` (those seven) or ``decoder``).

    Args:
        names: which benchmarks to run.
        quick: small sizes (a smoke run, well under a minute on 2 CPU cores).
        model: ``minilm`` (default; or the ``PAPA_BENCH_MODEL`` environment variable), ``tiny`` or a model path.
        device: ``cpu`` or ``cuda``.
        dtype: ``fp32`` or ``bf16``.
        threads: torch CPU threads (default: torch's own choice).
        emit: called with each ``name: value`` line as soon as it is measured (``None``: silent).
        sizes: explicit problem sizes (overrides ``quick``; the tests use very small ones).
        clock: ``wall`` (default) or ``process`` (CPU time of this process; see :data:`CLOCKS`).
        decoder_model: the ``decoder`` benchmark's model: ``gemma-3-270m`` (default), ``tiny`` or a decoder folder.
        gguf_load: the ``decoder`` benchmark also times the first-time GGUF load (minutes), into a temporary cache.

    Returns:
        ``{figure name: value}`` in the order measured (the figures of every benchmark run).
    """
    global _clock
    selected = _expand(names)
    if clock not in CLOCKS:
        raise ValueError(f"unknown clock {clock!r}; choose one of {sorted(CLOCKS)}")
    if clock == "process" and torch.device(device).type != "cpu":
        raise ValueError("the process clock measures CPU time; use clock='wall' on a GPU")
    label = "custom" if sizes is not None else ("quick" if quick else "full")
    sizes = sizes or (QUICK if quick else FULL)
    if threads:
        torch.set_num_threads(int(threads))
    say = emit or (lambda line: None)
    figures: dict[str, float] = {}
    loaded = None
    previous_clock, _clock = _clock, CLOCKS[clock]
    try:
        for name in selected:
            started = time.perf_counter()
            if name in ("memory", "store"):
                result = (bench_memory if name == "memory" else bench_store)(model, sizes, device, dtype, threads)
            elif name == "decoder":
                say(f"# device {device}, dtype {dtype}, torch threads {torch.get_num_threads()}, {clock} clock, "
                    f"{label} sizes")
                result = run_decoder_benchmark(decoder_model, sizes, device, dtype, threads, gguf_load, say)
            else:
                if loaded is None:
                    loaded = load_bench_model(model, device, dtype)
                    say(f"# model: {getattr(loaded[0], 'papa_model_id', '?')}, device {device}, dtype {dtype}, "
                        f"torch threads {torch.get_num_threads()}, {clock} clock, {label} sizes, "
                        f"sentences from {benchmark_sentences(1)[2]}")
                function = {"averaging": bench_averaging, "probe": bench_probe, "seeds": bench_seeds,
                            "constant": bench_constant, "packing": bench_packing}[name]
                result = function(loaded[0], loaded[1], sizes, device)
            for key, value in result.items():
                figures[key] = float(value)
                say(format_figure(key, float(value)))
            say(f"# {name} took {time.perf_counter() - started:.1f} s")
    finally:
        _clock = previous_clock
    return figures


def main(argv: list[str] | None = None, parser_class: type[argparse.ArgumentParser] = argparse.ArgumentParser) -> int:
    """Command line: ``python -m papa_lib.ops.bench [averaging|probe|seeds|constant|packing|memory|store|all|decoder]
    [--quick] [--device cuda] [--gguf-load] ...``.

    ``papa bench ...`` calls this with its own ``parser_class`` (one-line errors, exit status 2).
    """
    parser = parser_class(prog="papa bench", description="PAPA library speed and memory benchmarks")
    parser.add_argument("benchmarks", nargs="*", default=["all"],
                        help=f"any of {', '.join(BENCHMARK_NAMES)}, or all (every one but decoder)")
    parser.add_argument("--quick", action="store_true", help="small sizes (a smoke run, < 60 s)")
    parser.add_argument("--device", default="cpu", help="cpu (default) or cuda")
    parser.add_argument("--dtype", default="fp32", choices=sorted(DTYPES), help="parameter dtype (default fp32)")
    parser.add_argument("--model", default=None,
                        help=f"minilm (default; or ${MODEL_ENV}), tiny, all-mpnet-base-v2, or a model path or hub id")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    parser.add_argument("--clock", default="wall", choices=sorted(CLOCKS),
                        help="wall (default) or process: CPU time of this process, robust to a busy shared machine")
    parser.add_argument("--decoder-model", default=None,
                        help=f"the decoder benchmark's model: {DEFAULT_DECODER} (default; the gemma extra), tiny (a "
                             "random 2-layer Gemma 3) or a decoder folder")
    parser.add_argument("--gguf-load", action="store_true",
                        help="decoder benchmark: also time the first-time GGUF load (join, dequantize, convert: "
                             "minutes), into a temporary cache")
    parser.add_argument("--memory-child", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--decoder-memory-child", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--decoder-load-child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--length", type=int, default=512, help=argparse.SUPPRESS)
    parser.add_argument("--store-child", type=int, nargs=2, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--batch", type=int, default=32, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.memory_child is not None:
        texts = benchmark_sentences(args.memory_child)[0]
        print(json.dumps(memory_child(texts, args.batch, args.model, args.device, args.dtype)))
        return 0
    if args.decoder_memory_child is not None:
        print(json.dumps(decoder_memory_child(args.decoder_model, args.length, args.batch, args.decoder_memory_child,
                                              args.device, args.dtype)))
        return 0
    if args.decoder_load_child:
        print(json.dumps(decoder_load_child(args.decoder_model, args.device, args.dtype)))
        return 0
    if args.store_child is not None:
        texts, labels, _ = benchmark_sentences(args.store_child[0])
        print(json.dumps(store_child(texts, labels, args.batch, args.model, args.device, args.dtype,
                                     bool(args.store_child[1]))))
        return 0
    started = time.perf_counter()
    try:
        run_benchmarks(args.benchmarks, args.quick, model=args.model, device=args.device, dtype=args.dtype,
                       threads=args.threads, emit=lambda line: print(line, flush=True), clock=args.clock,
                       decoder_model=args.decoder_model, gguf_load=args.gguf_load)
    except ValueError as error:
        parser.error(str(error))
    print(f"# total wall time {time.perf_counter() - started:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
