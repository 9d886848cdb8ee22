"""PAPA on a decoder's own objective (papa_lib.experiments.lm, issue 60): windows, the chunked loss's gradient, λ on
the LM loss, the declared runs with resume, the unigram floor, the intervals and the grid file's section."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from conftest import TINY_DECODER_VOCAB, tiny_decoder
from papa_lib.core.averaging import ConstantAttention
from papa_lib.core.decoders import next_token_nll, next_token_nll_backward
from papa_lib.core.override import AttentionOverride, override
from papa_lib.experiments import lm
from papa_lib.experiments.specs import SpecError
from papa_lib.experiments.workspace import read_lambda_info

VOCAB = TINY_DECODER_VOCAB


class WordTokenizer:
    """A stand-in tokenizer: each whitespace-separated word is one id in [3, VOCAB) (a hash), <bos> = 1."""

    bos_token_id = 1

    def __call__(self, text, add_special_tokens=False):
        return {"input_ids": [3 + sum(map(ord, word)) % (VOCAB - 3) for word in text.split()]}

    def __len__(self):
        return VOCAB


def _corpus(tmp_path, words: int = 400):
    folder = tmp_path / "wikitext-2"
    folder.mkdir(parents=True)
    rng = np.random.default_rng(0)
    vocabulary = [f"w{i}" for i in range(40)]
    for name in ("wiki.valid.tokens", "wiki.test.tokens"):
        lines = [" = Heading = "] + [" ".join(rng.choice(vocabulary, 20)) for _ in range(words // 20)]
        (folder / name).write_text("\n".join(lines) + "\n", encoding="utf-8")
    return tmp_path


SMALL = lm.LMSettings(length=12, test_windows=4, average_windows=3, lambda_windows=3, lambda_epochs=1,
                      random_seeds=(0, 1), fractions=(1, 0.5, 0.25, 0), alternatives=("identity", "uniform"))


def test_windows_start_with_bos_and_are_evenly_spaced():
    tokenizer = WordTokenizer()
    lines = [" ".join(f"w{i}" for i in range(100))]
    windows = lm.token_windows(tokenizer, lines, length=6, count=4)
    ids = tokenizer(lines[0])["input_ids"]
    assert windows.shape == (4, 6) and bool((windows[:, 0] == 1).all())
    step = (len(ids) // 5) // 4
    for i, row in enumerate(windows):
        assert row[1:].tolist() == ids[i * step * 5:(i * step + 1) * 5]
    with pytest.raises(ValueError, match="fewer than"):
        lm.token_windows(tokenizer, lines, length=6, count=50)
    consecutive = lm.token_windows(tokenizer, lines, length=6, count=4, spaced=False)
    assert consecutive[:, 1:].reshape(-1).tolist() == ids[:4 * 5] and bool((consecutive[:, 0] == 1).all())


def test_chunked_backward_gives_the_gradient_of_the_full_loss():
    model = tiny_decoder()
    batch = {"input_ids": torch.randint(3, VOCAB, (1, 10)), "attention_mask": torch.ones(1, 10, dtype=torch.long)}
    batch["input_ids"][0, 0] = 1
    with torch.no_grad():
        constants = torch.rand(3, 4, 10, 10)
    grads = []
    for chunk in (3, 1000):
        state = AttentionOverride(model, constants, heads="all", mode="mix")
        with override(model, state=state):
            total, count = next_token_nll_backward(model, batch, chunk_size=chunk)
        grads.append(state.theta.grad.clone())
    full, n = next_token_nll(model, batch)
    # the mix at θ = 0 is not the original, so compare the loss with the mixed model's loss
    state = AttentionOverride(model, constants, heads="all", mode="mix")
    with override(model, state=state):
        mixed, _ = next_token_nll(model, batch)
    assert count == n == 9 and math.isclose(total, mixed, rel_tol=1e-5) and not math.isclose(total, full)
    assert torch.allclose(grads[0], grads[1], atol=1e-6) and float(grads[0].abs().sum()) > 0


def test_lambda_training_moves_theta_and_leaves_the_model_frozen_as_it_was():
    model = tiny_decoder()
    windows = torch.randint(3, VOCAB, (3, 10))
    windows[:, 0] = 1
    from papa_lib.core.averaging import average_attention

    constants = average_attention(model, [{"input_ids": w[None], "attention_mask": torch.ones(1, 10)} for w in windows],
                                  progress=False)
    flags = [p.requires_grad for p in model.parameters()]
    before = [p.detach().clone() for p in model.parameters()]
    lambdas, losses = lm.learn_lm_lambdas(model, constants, windows, epochs=2, learning_rate=0.1)
    assert lambdas.shape == (3, 4) and len(losses) == 2 and not torch.allclose(lambdas, torch.full((3, 4), 0.5))
    assert [p.requires_grad for p in model.parameters()] == flags
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))


def test_the_runs_are_the_declared_ones_and_resume_skips_what_is_stored(tmp_path, monkeypatch):
    data = _corpus(tmp_path / "data")
    model, tokenizer = tiny_decoder(), WordTokenizer()
    runs = lm.lm_runs(SMALL)
    # original; 3 orders x 2 fractions in (0, 1) (random: 2 seeds); all constant; 2 alternatives; unigram
    assert len(runs) == 1 + 2 + 2 + 2 * 2 + 1 + 2 + 1
    records = lm.run_language_model(model, tokenizer, SMALL, tmp_path / "out", data, progress=False, log=lambda s: 0)
    assert len(records) == len(runs) and len({r["run_id"] for r in records}) == len(runs)
    by = {(r["matrix_type"], r["order"], r["fraction"], r["seed"]): r for r in records}
    assert by[("average", "lambda", 0.5, 0)]["replaced"] == 6 and by[("average", "lambda", 0.25, 0)]["replaced"] == 9
    assert by[("average", "all", 0.0, 0)]["replaced"] == 12 and by[("original", "none", 1.0, 0)]["replaced"] == 0
    # the original's number is the model's own loss on the same windows
    windows = lm.corpus_windows(tokenizer, SMALL, data)["test"]
    direct = [next_token_nll(model, {"input_ids": w[None], "attention_mask": torch.ones(1, 12)}) for w in windows]
    assert np.allclose(by[("original", "none", 1.0, 0)]["window_nll"], [t / n for t, n in direct], atol=1e-5)
    stored = lm.lm_lambdas_path(tmp_path / "out")
    info = read_lambda_info(stored)  # how λ was learned sits in the file's metadata, not in a sidecar
    assert info["settings"]["lambda_epochs"] == 1 and len(info["epoch_loss"]) == 1 and info["seconds"] >= 0
    assert lm.read_lm_lambdas(tmp_path / "out").shape == (3, 4) and not stored.with_suffix(".json").exists()

    def fail(*args, **kwargs):
        raise AssertionError("a stored run was computed again")

    monkeypatch.setattr(lm, "window_nll", fail)
    monkeypatch.setattr(lm, "learn_lm_lambdas", fail)
    again = lm.run_language_model(model, tokenizer, SMALL, tmp_path / "out", data, progress=False, log=lambda s: 0)
    assert [r["run_id"] for r in again] == [r["run_id"] for r in records]



def test_damaged_lm_constants_and_lambdas_are_set_aside_and_computed_again(tmp_path, capsys):
    data = _corpus(tmp_path / "data")
    model, tokenizer = tiny_decoder(), WordTokenizer()
    out = tmp_path / "out"
    first = lm.run_language_model(model, tokenizer, SMALL, out, data, progress=False, log=lambda s: 0)
    lambdas = lm.lm_lambdas_path(out)
    constants = next((out / "lm" / "matrices").glob("*.safetensors"))
    whole = lambdas.read_bytes(), constants.read_bytes()
    lm.lm_results_path(out).unlink()  # every run again, through the two damaged files
    lambdas.write_bytes(whole[0][:100])
    constants.write_bytes(whole[1][:200])
    assert not lm.plan_language_model(model, SMALL, out)["lambdas_stored"]  # the plan reads them as not stored
    again = lm.run_language_model(model, tokenizer, SMALL, out, data, progress=False, log=lambda s: 0)
    notices = capsys.readouterr().err
    assert f"{lambdas} is damaged (100 bytes" in notices and f"{constants} is damaged (200 bytes" in notices
    assert (lambdas.parent / (lambdas.name + ".damaged")).read_bytes() == whole[0][:100]
    assert lm.read_lm_lambdas(out).shape == (3, 4) and ConstantAttention.load(constants).matrices.shape[:2] == (3, 4)
    assert [r["run_id"] for r in again] == [r["run_id"] for r in first]
    assert np.allclose([r["nll"] for r in again], [r["nll"] for r in first], atol=1e-6)

def test_the_unigram_floor_by_hand():
    tokenizer = WordTokenizer()
    reference = ["a a a b"]
    windows = torch.tensor([[1] + tokenizer("a b")["input_ids"]])
    counts = np.ones(VOCAB)
    for token in tokenizer(reference[0])["input_ids"]:
        counts[token] += 1
    p = counts / counts.sum()
    expected = -(np.log(p[tokenizer("a")["input_ids"][0]]) + np.log(p[tokenizer("b")["input_ids"][0]])) / 2
    assert np.isclose(lm.unigram_nll(tokenizer, reference, windows)[0], expected)


def _record(kind, order, values, fraction=0.0, seed=0):
    return {"matrix_type": kind, "order": order, "fraction": fraction, "seed": seed, "window_nll": list(values)}


def test_intervals_resample_windows_in_pairs():
    original = _record("original", "none", [4.0, 5.0, 6.0, 5.0], 1.0)
    shifted = _record("average", "all", [5.0, 6.0, 7.0, 6.0])
    same = lm.paired_difference([shifted], [original])
    assert (same.value, same.low, same.high) == (1.0, 1.0, 1.0)  # a constant shift has no spread in pairs
    alone = lm.nll_interval([original])
    assert alone.low < 5.0 < alone.high
    seeds = [_record("average", "random", [1.0, 2.0], 0.5, 0), _record("average", "random", [3.0, 4.0], 0.5, 1)]
    assert lm.nll_interval(seeds).value == 2.5


def test_the_constant_share_in_both_units():
    records = [_record("original", "none", [4.0, 4.0], 1.0), _record("average", "all", [5.0, 5.0]),
               _record("unigram", "none", [8.0, 8.0])]
    assert lm.constant_share(records, "chance").value == pytest.approx(0.25)
    assert lm.constant_share(records, "relative").value == pytest.approx(0.25)
    with pytest.raises(ValueError, match="unknown unit"):
        lm.constant_share(records, "nats")


def test_a_bad_language_model_section_is_one_line_naming_file_and_line(tmp_path):
    from papa_lib.experiments.grid import load_grid

    path = tmp_path / "grid.yaml"
    path.write_text("model: gemma-3-270m\nlanguage_model:\n  length: 512\n  alternatives: [identity, zero]\n"
                    "blocks:\n  - name: b\n    tasks: [sst2]\n")
    with pytest.raises(SpecError) as error:
        load_grid(path)
    assert str(error.value).startswith(f"{path}:4:") and "did you mean 'zeros'" in str(error.value)
    path.write_text("language_model:\n  windows: 3\nblocks:\n  - name: b\n    tasks: [sst2]\n")
    with pytest.raises(SpecError, match="unknown key 'windows' in language_model"):
        load_grid(path)


def test_lm_lambda_trains_every_seed_from_one_backbone_pass():
    from papa_lib.experiments.variants import Variant

    shared = Variant.make("average", "lm_lambda", 0.5)
    assert shared.needs_scores and not shared.needs_lambdas and not shared.seed_dependent
    assert Variant.make("average", "random", 0.5).seed_dependent
    assert Variant.make("average", "lambda", 0.5).seed_dependent


def test_a_random_seed_listed_twice_is_one_line(tmp_path):
    from papa_lib.experiments.grid import load_grid

    path = tmp_path / "grid.yaml"
    path.write_text("language_model:\n  random_seeds: [0, 0]\nblocks:\n  - name: b\n    tasks: [sst2]\n")
    with pytest.raises(SpecError, match=r"grid.yaml:2: language_model.random_seeds: lists a seed twice"):
        load_grid(path)
