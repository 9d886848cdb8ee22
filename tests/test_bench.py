"""Benchmarks (papa_lib.ops.bench): output format, figures finite and positive, the FLOP model. Not timed: no ratio is
asserted."""

from __future__ import annotations

import math
import re

import pytest
import torch

from papa_lib.ops import bench, bench_support, costs

TINY_SIZES = bench_support.BenchSizes(
    averaging_sentences=8, averaging_batch=4, averaging_repeats=1, probe_sentences=8, probe_batch=4, probe_repeats=1,
    constant_lengths=(16, 32), constant_batch=2, constant_repeats=1, memory_sentences=(4, 16), memory_batch=4,
    store_sentences=16, store_batch=4,
)
LINE = re.compile(r"^([a-z][A-Za-z0-9_]*): (\S+)$")


def parse(lines):
    figures = {}
    for line in lines:
        if line.startswith("#"):
            continue
        match = LINE.match(line)
        assert match, f"not a 'name: value' line: {line!r}"
        figures[match.group(1)] = float(match.group(2))
    return figures


def check_values(figures):
    for name, value in figures.items():
        assert math.isfinite(value), name
        if "growth" in name:
            assert value >= 0, name
        else:
            assert value > 0, name


def test_run_benchmarks_on_a_tiny_model_prints_name_value_lines():
    lines = []
    figures = bench.run_benchmarks(
        ["averaging", "constant", "probe"], model="tiny", sizes=TINY_SIZES, emit=lines.append
    )
    printed = parse(lines)
    assert set(printed) == set(figures)
    for name in (
        "averaging_vs_forward",
        "cached_vs_recomputed_epoch",
        "ragged_vs_padded_probe_steps",
        "constant_vs_original_L16",
        "constant_vs_original_L32",
        "flop_limit_L16",
        "flop_limit_L32",
        "constant_reference_vs_original_L32",
    ):
        assert name in figures
    check_values(figures)
    assert any(line.startswith("# model: tiny-random-bert") for line in lines)
    for name, value in figures.items():  # printed with 4 significant digits
        assert printed[name] == pytest.approx(value, rel=1e-3)


@pytest.mark.slow
def test_memory_benchmark_runs_in_subprocesses():
    lines = []
    figures = bench.run_benchmarks(["memory"], model="tiny", sizes=TINY_SIZES, emit=lines.append)
    assert set(figures) == {
        "averaging_peak_mem_ratio", "averaging_peak_mem_mb_4", "averaging_peak_mem_mb_16",
        "averaging_peak_growth_mb_4", "averaging_peak_growth_mb_16",
    }
    check_values(parse(lines))
    assert figures["averaging_peak_mem_ratio"] == pytest.approx(
        figures["averaging_peak_mem_mb_16"] / figures["averaging_peak_mem_mb_4"]
    )


@pytest.mark.slow
def test_feature_store_benchmark_runs_in_subprocesses():
    lines = []
    figures = bench.run_benchmarks(["store"], model="tiny", sizes=TINY_SIZES, emit=lines.append)
    assert set(figures) == {"feature_store_in_memory_vs_in_place_peak", "feature_store_peak_vs_size_in_place",
                            "feature_store_peak_vs_size_in_memory", "feature_store_mb"}
    printed = parse(lines)
    assert all(math.isfinite(value) and value >= 0 for value in printed.values())  # tiny sizes: growth may be 0
    assert figures["feature_store_mb"] > 0
    if figures["feature_store_peak_vs_size_in_place"] > 0:
        assert figures["feature_store_in_memory_vs_in_place_peak"] == pytest.approx(
            figures["feature_store_peak_vs_size_in_memory"] / figures["feature_store_peak_vs_size_in_place"], rel=1e-6)


def test_main_command_line(capsys, monkeypatch):
    assert bench.QUICK.constant_lengths == (128, 256, 512)
    monkeypatch.setattr(bench, "QUICK", TINY_SIZES)  # --quick, made even smaller for the test
    threads = torch.get_num_threads()
    try:
        assert bench.main(["constant", "--quick", "--model", "tiny", "--threads", "1", "--clock", "process"]) == 0
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(threads)
    out = capsys.readouterr().out.strip().splitlines()
    figures = parse(out)
    assert {"constant_vs_original_L16", "constant_vs_original_L32", "flop_limit_L32"} <= set(figures)
    assert out[-1].startswith("# total wall time")
    assert "process clock" in out[0]
    assert bench._clock is bench.CLOCKS["wall"]  # restored
    check_values(figures)
    with pytest.raises(SystemExit):
        bench.main(["nonsense", "--model", "tiny"])


def test_unknown_benchmark_and_bad_options_raise():
    with pytest.raises(ValueError, match="unknown benchmark 'speed'"):
        bench.run_benchmarks(["speed"], emit=None)
    with pytest.raises(ValueError, match="unknown clock 'sundial'"):
        bench.run_benchmarks(["constant"], clock="sundial", emit=None)
    with pytest.raises(ValueError, match="unknown dtype"):
        bench_support.load_bench_model("tiny", dtype="fp8")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="torch sees no CUDA GPU"):
            bench_support.load_bench_model("tiny", device="cuda")


def test_model_from_environment(monkeypatch):
    monkeypatch.setenv(bench_support.MODEL_ENV, "tiny")
    model, tokenizer = bench_support.load_bench_model(None)
    assert model.papa_model_id == "tiny-random-bert"
    assert model.config.vocab_size == len(tokenizer)


def test_flop_model_matches_the_formula():
    n, d, f = 128, 384, 1536
    original = 4 * n * d * d * 2 + 2 * n * n * d * 2 + 2 * n * d * f * 2
    constant = 2 * n * d * d * 2 + n * n * d * 2 + 2 * n * d * f * 2
    assert costs.layer_flops(n, d, f, constant=False) == original
    assert costs.layer_flops(n, d, f, constant=True) == constant
    assert costs.flop_limit(n, d, f) == pytest.approx(original / constant)
    assert costs.flop_limit(128, 384, 1536) == pytest.approx(1.2258, abs=1e-4)
    # long sequences: the n² terms dominate and the limit tends to 2; it grows with n
    assert costs.flop_limit(10**7, d, f) == pytest.approx(2.0, abs=1e-3)
    assert costs.flop_limit(128, d, f) < costs.flop_limit(256, d, f) < costs.flop_limit(512, d, f)


def test_benchmark_sentences_cycle_and_fall_back(monkeypatch, tmp_path):
    texts, labels, source = bench.benchmark_sentences(3)
    assert len(texts) == len(labels) == 3 and all(isinstance(t, str) and t for t in texts)
    if source == "SST-2 dev":
        many, _, _ = bench.benchmark_sentences(2000)  # more than the 872 dev sentences: cycled
        assert len(many) == 2000 and many[872] == many[0]
    monkeypatch.setattr(bench, "SST2_DEV", tmp_path / "missing.tsv")
    generated, generated_labels, source = bench.benchmark_sentences(5)
    assert source == "generated" and len(generated) == 5 and set(generated_labels) <= {0, 1}
    assert generated == bench.benchmark_sentences(5)[0]  # deterministic
    with pytest.raises(ValueError, match="count must be positive"):
        bench.benchmark_sentences(0)


def _task_files(tmp_path):
    words = "the film a story is very not moving dull funny sad long with of and but".split()
    rng = __import__("random").Random(0)
    sentences = [" ".join(rng.choice(words) for _ in range(rng.randint(3, 20))) for _ in range(12)]
    (tmp_path / "glue" / "SST-2").mkdir(parents=True)
    (tmp_path / "glue" / "CoLA").mkdir(parents=True)
    (tmp_path / "glue" / "SST-2" / "train.tsv").write_text(
        "sentence\tlabel\n" + "".join(f"{s}\t{i % 2}\n" for i, s in enumerate(sentences)))
    (tmp_path / "glue" / "CoLA" / "train.tsv").write_text(
        "".join(f"src\t{i % 2}\t\t{s}\n" for i, s in enumerate(sentences)))


def test_packing_benchmark_on_generated_task_files(tmp_path):
    """Packed and padded extraction see the same sentences; the stored bytes are exactly the real-token rows."""
    _task_files(tmp_path)
    model, tokenizer = bench_support.load_bench_model("tiny")
    sizes = bench_support.BenchSizes(packing_sentences=12, packing_batch=4, packing_repeats=1)
    figures = bench.bench_packing(model, tokenizer, sizes, "cpu", data_dir=tmp_path)
    for task in ("sst2", "cola"):
        assert figures[f"packed_vs_padded_{task}_L64"] > 0
        assert figures[f"packed_vs_padded_max_abs_diff_{task}"] < 5e-3  # fp16 storage rounding only
    layers, hidden = model.config.num_hidden_layers + 1, model.config.hidden_size
    real = figures["real_tokens_per_example_sst2_L64"]
    assert figures["feature_bytes_per_example_sst2_L64"] == pytest.approx(real * layers * hidden * 2)
    assert figures["feature_bytes_per_example_padded_sst2_L64"] == 64 * layers * hidden * 2
    assert figures["feature_bytes_padded_vs_stored_sst2_L64"] == pytest.approx(64 / real)
    assert bench.bench_packing(model, tokenizer, sizes, "cpu", data_dir=tmp_path / "none") == {}


@pytest.mark.slow
def test_packing_benchmark_on_the_real_mpnet(tmp_path, mpnet):
    """``papa bench packing --model all-mpnet-base-v2``: MPNet packs (its relative bias read from position ids), so
    packed extraction gives the padded run's states and is faster on sentences of 5-22 tokens at L = 64."""
    _task_files(tmp_path)
    model, tokenizer = mpnet
    sizes = bench_support.BenchSizes(packing_sentences=12, packing_batch=12, packing_repeats=1)
    figures = bench.bench_packing(model, tokenizer, sizes, "cpu", data_dir=tmp_path)
    assert figures["packed_vs_padded_max_abs_diff_sst2"] < 1e-2  # fp16 storage rounding only
    assert figures["packed_vs_padded_sst2_L64"] > 1.5


def test_seeds_benchmark_trains_together_what_it_trains_one_by_one():
    lines = []
    sizes = bench_support.BenchSizes(seeds=3, seeds_sentences=12, seeds_repeats=1)
    figures = bench.run_benchmarks(["seeds"], model="tiny", sizes=sizes, emit=lines.append)
    for kind in ("sentence", "token"):
        assert figures[f"probe_seeds_batched_vs_sequential_{kind}"] > 0
        assert figures[f"probe_seeds_together_s_{kind}"] > 0
        assert figures[f"probe_seeds_max_abs_diff_{kind}"] == 0.0  # the same weights, bit for bit
    assert f"probe_seeds_batched_vs_sequential_token: {figures['probe_seeds_batched_vs_sequential_token']:.4g}" in lines
