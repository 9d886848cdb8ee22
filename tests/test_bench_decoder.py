"""The decoder benchmark (``papa bench decoder``) on a tiny random Gemma 3: its rows, their ratio columns, the GGUF
load kept out of the real cache, and the FLOP model's decoder shapes. Not timed: no ratio is asserted."""

from __future__ import annotations

import contextlib
import io
import json
import math

import pytest
from test_bench import parse

from papa_lib.core.packaged import cache_root
from papa_lib.ops import bench, bench_memory, bench_support, costs

TINY = bench_support.BenchSizes(decoder_length=32, decoder_batch=2, decoder_repeats=1, decoder_chunk=8)
RATIOS = ("decoder_constant_vs_original_L32", "decoder_flop_limit_L32", "decoder_constant_speedup_over_limit_L32",
          "decoder_flop_limit_with_lm_head_L32", "decoder_constant_reference_vs_original_L32",
          "decoder_full_vs_chunked_nll_peak_L32")


def in_process_child(flags, model_spec, device, dtype, threads, what, env=None):
    """bench_memory._child without the fresh process: the same command line, run by bench.main here."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert bench.main([*flags, "--device", device, "--dtype", dtype]) == 0
    return json.loads(out.getvalue().strip().splitlines()[-1])


def test_decoder_benchmark_on_a_tiny_gemma_prints_the_rows_with_their_ratios(monkeypatch):
    monkeypatch.setattr(bench_memory, "_child", in_process_child)
    lines = []
    figures = bench.run_benchmarks(["decoder"], decoder_model="tiny", sizes=TINY, gguf_load=True, emit=lines.append)
    printed = parse(lines)
    assert set(printed) == set(figures)
    assert set(RATIOS) <= set(figures)
    for name in ("decoder_original_tokens_per_s_L32", "decoder_constant_tokens_per_s_L32",
                 "decoder_nll_peak_growth_mb_chunk8_L32", "decoder_nll_peak_growth_mb_full_L32",
                 "decoder_nll_peak_mb_chunk8_L32", "decoder_nll_peak_mb_full_L32", "decoder_cached_load_s",
                 "decoder_cached_load_peak_mb"):
        assert name in figures
    assert all(math.isfinite(value) for value in figures.values())
    assert all(figures[name] > 0 for name in RATIOS[:-1])
    # one repetition: the speed-up is the ratio of the two throughputs
    assert figures["decoder_constant_vs_original_L32"] == pytest.approx(
        figures["decoder_constant_tokens_per_s_L32"] / figures["decoder_original_tokens_per_s_L32"])
    assert figures["decoder_constant_speedup_over_limit_L32"] == pytest.approx(
        figures["decoder_constant_vs_original_L32"] / figures["decoder_flop_limit_L32"])
    assert figures["decoder_fast_vs_reference_max_abs_diff_L32"] <= 1e-5
    assert figures["decoder_nll_tokens_L32"] == 2 * 31
    assert abs(figures["decoder_nll_chunked_minus_full_L32"]) < 1e-2  # the same loss, chunked or not
    assert "decoder_gguf_load_s" not in figures  # tiny has no GGUF file
    assert any("--gguf-load needs the packaged gemma-3-270m" in line for line in lines)
    assert any(line.startswith("# decoder: tiny-random-gemma3, 2 layers, 4 query heads, 1 key/value head")
               for line in lines)


def test_all_is_the_encoder_benchmarks_and_decoder_is_named():
    assert bench._expand(["all"]) == list(bench.ENCODER_BENCHMARKS)
    assert bench._expand(["decoder", "constant"]) == ["decoder", "constant"]


def test_the_gguf_load_converts_into_a_temporary_cache_and_reloads_from_it(monkeypatch):
    calls = []

    def child(flags, model_spec, device, dtype, threads, what, env=None):
        calls.append((flags, dict(env or {})))
        first = len(calls) == 1
        return {"load_s": 200.0 if first else 5.0, "peak_mb": 3000.0 if first else 1500.0, "converted": first}

    monkeypatch.setattr(bench_memory, "_child", child)
    lines = []
    figures = bench_memory.bench_decoder_load("gemma-3-270m", "cpu", "fp32", None, gguf_load=True, say=lines.append)
    assert figures == {"decoder_gguf_load_s": 200.0, "decoder_gguf_load_peak_mb": 3000.0,
                       "decoder_cached_load_s": 5.0, "decoder_cached_load_peak_mb": 1500.0,
                       "decoder_gguf_vs_cached_load": 40.0}
    (first_flags, first_env), (second_flags, second_env) = calls
    assert first_flags == second_flags == ["--decoder-load-child", "--decoder-model", "gemma-3-270m"]
    assert first_env == second_env and first_env["PAPA_CACHE_DIR"] != str(cache_root())
    assert "papa-bench-decoder-" in first_env["PAPA_CACHE_DIR"]
    calls.clear()
    assert set(bench_memory.bench_decoder_load("gemma-3-270m", "cpu", "fp32", None, say=lines.append)) == {
        "decoder_cached_load_s", "decoder_cached_load_peak_mb"}  # without the flag: the real cache, no conversion
    assert calls[0][1] == {}


def test_the_flop_model_covers_the_decoders_shapes():
    from transformers import Gemma3TextConfig

    config = Gemma3TextConfig(vocab_size=262144, hidden_size=640, intermediate_size=2048, num_hidden_layers=18,
                              num_attention_heads=4, num_key_value_heads=1, head_dim=256)  # Gemma 3 270M's shapes
    shape = costs.decoder_shape(config)
    assert shape == {"hidden": 640, "intermediate": 2048, "attention_width": 1024, "kv_width": 256,
                     "ffn_matrices": 3, "layers": 18, "vocab": 262144}
    n, d, f, a, kv = 512, 640, 2048, 1024, 256
    original = n * d * (2 * a + 2 * kv) * 2 + 2 * n * n * a * 2 + 3 * n * d * f * 2
    constant = n * d * (kv + a) * 2 + n * n * a * 2 + 3 * n * d * f * 2
    flop_shape = dict(attention_width=a, kv_width=kv, ffn_matrices=3)
    assert costs.layer_flops(n, d, f, False, **flop_shape) == original
    assert costs.layer_flops(n, d, f, True, **flop_shape) == constant
    assert costs.flop_limit(n, d, f, **flop_shape) == pytest.approx(1.2547, abs=1e-4)
    lm_head = n * d * 262144 * 2
    with_head = costs.flop_limit(n, d, f, **flop_shape, layers=18, other_flops=lm_head)
    assert with_head == pytest.approx((18 * original + lm_head) / (18 * constant + lm_head))
    assert 1 < with_head < costs.flop_limit(n, d, f, **flop_shape)
    # an encoder (a = a_kv = d, two feed-forward matrices) keeps its formula
    assert costs.layer_flops(128, 384, 1536, False) == costs.layer_flops(128, 384, 1536, False, attention_width=384,
                                                                         kv_width=384, ffn_matrices=2)


@pytest.mark.slow
def test_papa_bench_decoder_command_line_with_fresh_processes(capsys, monkeypatch):
    monkeypatch.setattr(bench, "QUICK", TINY)
    assert bench.main(["decoder", "--quick", "--decoder-model", "tiny", "--threads", "1"]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    figures = parse(out)
    assert set(RATIOS) <= set(figures) and "decoder_cached_load_s" in figures
    assert figures["decoder_nll_peak_growth_mb_full_L32"] >= 0 and figures["decoder_cached_load_s"] > 0
    assert out[-1].startswith("# total wall time")
