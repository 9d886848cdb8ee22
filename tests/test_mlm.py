"""Tests for the MLM probing experiment of paper Sec. 5.5 (Fig. 6a): papa_lib.analysis.mlm_probe (data, masking,
probe, score), papa_lib.analysis.mlm (λ, the curve), the committed run, and the MLM chapter's by-hand score
(book/mlm.md, which reads and draws the results itself)."""

from __future__ import annotations

import math
import random

import pytest
import torch

from papa_lib.analysis import mlm
from papa_lib.analysis.mlm import mlm_head_status, run_mlm_curve
from papa_lib.analysis.mlm_probe import (
    KIND_MASK,
    KIND_RANDOM,
    KIND_UNCHANGED,
    MaskedFeatures,
    MLMProbe,
    evaluate_mlm_probe,
    mask_tokens,
    masked_token_log_probs,
    mlm_sequences,
    neg_log_perplexity,
    sequence_log_probs,
    train_mlm_probe,
)
from papa_lib.experiments.loop import set_seed
from papa_lib.experiments.results import ResultsStore
from papa_lib.smoke import tiny_config, tiny_model

SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
WORDS = (
    "the a cat dog sat ran on in park mat red blue ball big small and with of to is was it he she they "
    "house tree river city road day night old new green"
).split()


@pytest.fixture(scope="module")
def tiny_tokenizer():
    """A BertTokenizerFast over a tiny word vocabulary (ids 0-4 are the special tokens)."""
    from transformers import BertTokenizerFast

    vocab = {token: i for i, token in enumerate(SPECIALS + WORDS + ["<", ">"])}
    return BertTokenizerFast(vocab=vocab, do_lower_case=True)


def _sentences(count: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(5, 14))) for _ in range(count)]


def _write_wikitext(root, lines_valid, lines_test):
    folder = root / "wikitext-2"
    folder.mkdir(parents=True)
    body = lambda lines: " \n = Heading = \n \n" + "".join(f" {line} \n" for line in lines)  # noqa: E731
    (folder / "wiki.valid.tokens").write_text(body(lines_valid), encoding="utf-8")
    (folder / "wiki.test.tokens").write_text(body(lines_test), encoding="utf-8")
    return root


# ------------------------------------------------------------------------------------------------ sequences


def test_sequences_are_full_chunks_in_papa_layout(tiny_tokenizer):
    lines = _sentences(30)
    encoded = mlm_sequences(tiny_tokenizer, lines, max_length=16)
    ids = encoded["input_ids"]
    cls, sep = tiny_tokenizer.cls_token_id, tiny_tokenizer.sep_token_id
    assert ids.shape[1] == 16 and bool(encoded["attention_mask"].all())
    assert bool((ids[:, 0] == cls).all()) and bool((ids[:, -1] == sep).all())
    # The text between the special tokens is the concatenated token stream, in order, without gaps.
    stream = [t for line in lines for t in tiny_tokenizer(line, add_special_tokens=False)["input_ids"]]
    assert ids[:, 1:-1].reshape(-1).tolist() == stream[: ids.shape[0] * 14]
    assert ids.shape[0] == len(stream) // 14  # the trailing partial chunk is dropped
    assert mlm_sequences(tiny_tokenizer, lines, max_length=16, limit=3)["input_ids"].tolist() == ids[:3].tolist()


def test_sequences_errors_and_unk(tiny_tokenizer):
    with pytest.raises(ValueError, match="does not fill"):
        mlm_sequences(tiny_tokenizer, ["the cat"], max_length=16)
    with pytest.raises(ValueError, match="no room"):
        mlm_sequences(tiny_tokenizer, ["the cat"], max_length=2)
    encoded = mlm_sequences(tiny_tokenizer, ["the <unk> cat"] * 10, max_length=8)
    assert tiny_tokenizer.unk_token_id in encoded["input_ids"].tolist()[0]
    assert tiny_tokenizer.convert_tokens_to_ids("<") not in encoded["input_ids"].reshape(-1).tolist()


# ------------------------------------------------------------------------------------------------ masking


def test_masking_is_deterministic_and_seed_dependent(tiny_tokenizer):
    encoded = mlm_sequences(tiny_tokenizer, _sentences(60), max_length=24)
    first = mask_tokens(encoded, tiny_tokenizer, seed=3)
    again = mask_tokens(encoded, tiny_tokenizer, seed=3)
    other = mask_tokens(encoded, tiny_tokenizer, seed=4)
    assert torch.equal(first.selected, again.selected) and torch.equal(
        first.inputs["input_ids"], again.inputs["input_ids"]
    )
    assert torch.equal(first.kinds, again.kinds)
    assert not torch.equal(first.selected, other.selected)
    # Masking a slice (with its first index) gives the same rows as masking everything: depends on (seed, index) only.
    part = {k: v[5:9] for k, v in encoded.items()}
    sliced = mask_tokens(part, tiny_tokenizer, seed=3, first_index=5)
    assert torch.equal(sliced.inputs["input_ids"], first.inputs["input_ids"][5:9])
    assert torch.equal(sliced.selected, first.selected[5:9])
    # The original ids are kept, and the input is untouched outside the selected positions.
    assert torch.equal(first.original_ids, encoded["input_ids"])
    assert torch.equal(first.inputs["input_ids"][~first.selected], encoded["input_ids"][~first.selected])


def test_masking_rates_on_a_large_sample(tiny_tokenizer):
    encoded = mlm_sequences(tiny_tokenizer, _sentences(8000, seed=1), max_length=42)
    # Pad some rows (PAPA layout: padding before the final [SEP]) to check only real tokens are chosen.
    encoded["attention_mask"][::3, 30:41] = 0
    encoded["input_ids"][::3, 30:41] = tiny_tokenizer.pad_token_id
    masked = mask_tokens(encoded, tiny_tokenizer, seed=0)
    ids, selected, kinds = encoded["input_ids"], masked.selected, masked.kinds
    special = torch.tensor(tiny_tokenizer.all_special_ids)
    candidates = encoded["attention_mask"].bool() & ~torch.isin(ids, special)
    assert not bool((selected & ~candidates).any())  # never a special token or padding
    per_row = selected.sum(1).float() / candidates.sum(1).float()
    assert float((per_row - 0.15).abs().max()) < 0.02  # exactly round(15%) per sequence
    total = selected.sum().item()
    share = {k: (kinds == k).sum().item() / total for k in (KIND_MASK, KIND_RANDOM, KIND_UNCHANGED)}
    assert total > 9000
    assert abs(share[KIND_MASK] - 0.8) < 0.02 and abs(share[KIND_RANDOM] - 0.1) < 0.015
    assert abs(share[KIND_UNCHANGED] - 0.1) < 0.015
    out = masked.inputs["input_ids"]
    assert bool((out[kinds == KIND_MASK] == tiny_tokenizer.mask_token_id).all())
    assert torch.equal(out[kinds == KIND_UNCHANGED], ids[kinds == KIND_UNCHANGED])
    random_ids = out[kinds == KIND_RANDOM]
    assert not bool(torch.isin(random_ids, special).any())  # random tokens are never special
    assert len(set(random_ids.tolist())) > 25  # spread over the vocabulary


def test_roberta_style_layout_and_masking(roberta_tokenizer):
    lines = ["hello there good morning the cat sat on the mat"] * 12
    encoded = mlm_sequences(roberta_tokenizer, lines, max_length=20)
    ids = encoded["input_ids"]
    assert "token_type_ids" not in encoded
    assert bool((ids[:, 0] == roberta_tokenizer.bos_token_id).all()) and bool(
        (ids[:, -1] == roberta_tokenizer.eos_token_id).all()
    )
    masked = mask_tokens(encoded, roberta_tokenizer, seed=0)
    assert not bool(masked.selected[:, [0, -1]].any())
    assert (masked.selected.sum(1) == round(0.15 * 18)).all()
    assert bool((masked.inputs["input_ids"][masked.kinds == KIND_MASK] == roberta_tokenizer.mask_token_id).all())


def test_masking_rejects_bad_arguments(tiny_tokenizer):
    encoded = mlm_sequences(tiny_tokenizer, _sentences(10), max_length=16)
    with pytest.raises(ValueError, match="replacement_split"):
        mask_tokens(encoded, tiny_tokenizer, replacement_split=(0.5, 0.1, 0.1))
    with pytest.raises(ValueError, match="seed"):
        mask_tokens(encoded, tiny_tokenizer, seed=-1)
    with pytest.raises(ValueError, match="mask_probability"):
        mask_tokens(encoded, tiny_tokenizer, mask_probability=0.0)


# ------------------------------------------------------------------------------------------------ scores


def test_score_matches_hand_computation():
    logits = torch.tensor([[0.0, 0.0, 0.0], [2.0, 0.0, 0.0], [1.0, 2.0, 3.0]])
    targets = torch.tensor([1, 0, 2])
    token = masked_token_log_probs(logits, targets)
    expected = [
        math.log(1 / 3),
        2.0 - math.log(math.exp(2) + 2),
        3.0 - math.log(math.exp(1) + math.exp(2) + math.exp(3)),
    ]
    assert token.tolist() == pytest.approx(expected, abs=1e-12)
    # Sequence 0 holds targets 0 and 1, sequence 2 holds target 2, sequence 1 has none and is left out.
    per_sequence = sequence_log_probs(token, torch.tensor([0, 0, 2]), num_sequences=3)
    seq0, seq2 = (expected[0] + expected[1]) / 2, expected[2]
    assert per_sequence.tolist() == pytest.approx([seq0, seq2], abs=1e-12)
    mean, low, high = neg_log_perplexity(per_sequence)
    assert mean == pytest.approx((seq0 + seq2) / 2)
    half = 12.706204736174707 * abs(seq0 - seq2) / math.sqrt(2) / math.sqrt(2)  # t_{0.975,1} * s / sqrt(n)
    assert (low, high) == pytest.approx((mean - half, mean + half))


# ------------------------------------------------------------------------------------------------ probe


def _planted(n: int, codes: torch.Tensor, layers: int, generator):
    """Targets are a function of the features: layer 1 carries a fixed random code of the target token."""
    vocab, dim = codes.shape
    targets = torch.randint(0, vocab, (n,), generator=generator)
    features = 0.3 * torch.randn(n, layers, dim, generator=generator)
    features[:, 1] += codes[targets]
    sequence_index = torch.arange(n) // 16
    return MaskedFeatures(features.half(), targets, sequence_index, int(sequence_index[-1]) + 1)


def test_probe_learns_a_planted_token_mapping():
    generator = torch.Generator().manual_seed(0)
    vocab, layers, dim = 20, 3, 16
    codes = torch.randn(vocab, dim, generator=generator)
    train = _planted(1600, codes, layers, generator)
    test = _planted(400, codes, layers, generator)
    embeddings = torch.randn(vocab, 12, generator=generator)
    set_seed(0)
    probe = MLMProbe(layers, dim, embeddings)
    assert {n for n, _ in probe.named_parameters()} == {
        "mlp.0.weight", "mlp.0.bias", "mlp.3.weight", "mlp.3.bias", "norm.weight", "norm.bias", "bias"}
    before = evaluate_mlm_probe(probe, test)
    losses = train_mlm_probe(probe, train, seed=0, epochs=8, batch_size=8, lr=3e-3)
    after = evaluate_mlm_probe(probe, test)
    assert losses[-1] < 0.3 * losses[0]
    assert after["masked_accuracy"] > 0.9
    assert after["value"] > before["value"] + 1.0
    assert torch.equal(probe.decoder_weight, embeddings)  # the tied decoder stays frozen


# ------------------------------------------------------------------------------------------------ pretrained head


def test_mlm_head_status_detects_fresh_heads():
    from transformers import BertForMaskedLM

    torch.manual_seed(0)
    bare = tiny_model("bert")
    assert mlm_head_status(bare)[0] is False
    with_head = BertForMaskedLM(tiny_config("bert"))
    available, reason = mlm_head_status(with_head)
    assert available is False and "fresh" in reason
    with torch.no_grad():
        with_head.cls.predictions.bias.normal_()
        with_head.cls.predictions.transform.LayerNorm.weight.normal_()
    assert mlm_head_status(with_head)[0] is True
    with_head.papa_missing_keys = {"cls.predictions.bias"}
    assert mlm_head_status(with_head)[0] is False


# ------------------------------------------------------------------------------------------------ end to end


def test_run_mlm_curve_end_to_end(tiny_tokenizer, tmp_path):
    from transformers import BertForMaskedLM

    data_dir = _write_wikitext(tmp_path / "data", _sentences(80, seed=2), _sentences(40, seed=3))
    torch.manual_seed(0)
    model = BertForMaskedLM._from_config(tiny_config("bert", vocab_size=64), attn_implementation="eager").eval()
    with torch.no_grad():  # pretend the head was pretrained
        model.cls.predictions.bias.normal_()
    model.papa_model_id = "tiny-bert-mlm"
    results = tmp_path / "results"
    fractions = (1.0, 0.5, 0.0)
    frame = run_mlm_curve(
        model, tiny_tokenizer, data_dir=data_dir, fractions=fractions, seeds=(0, 1), max_length=32,
        train_sequences=12, eval_sequences=6, epochs=1, results_dir=results, progress=False,
    )
    curve = frame[frame["matrix_type"] == "average"]
    assert sorted(zip(curve["fraction"], curve["seed"])) == sorted((f, s) for f in fractions for s in (0, 1))
    assert set(curve["num_replaced_heads"]) == {0, 4, 8}
    assert bool((curve["value"] < 0).all()) and bool((curve["ci_low"] <= curve["value"]).all())
    assert bool((curve["value"] <= curve["ci_high"]).all())
    assert (curve["eval_size"] == 6).all() and (curve["train_size"] == 12).all()
    head = frame[frame["matrix_type"] == "pretrained_head"]
    assert len(head) == 1 and float(head["fraction"].iloc[0]) == 1.0
    stored = ResultsStore(results).frame()
    assert len(stored) == 7 and set(stored["task"]) == {"mlm"} and set(stored["metric"]) == {"neg_log_perplexity"}
    assert set(stored.loc[stored["matrix_type"] == "average", "selection_order"]) == {"lambda"}
    from papa_lib.analysis.mlm import lambda_files
    from papa_lib.experiments.workspace import read_lambda_info, read_lambdas

    files = lambda_files(results)
    assert sorted(read_lambda_info(path)["seed"] for path in files) == [0, 1]
    for path in files:
        assert path.with_name(path.name + ".sha256").is_file()  # the grid's λ format: checksummed safetensors
        values = read_lambdas(path)
        assert values.shape == (2, 4)
        assert not bool((values == 0.5).all())  # θ was trained (λ starts at exactly 0.5)
        assert float((values - 0.5).abs().max()) < 0.01  # one epoch at lr 5e-4 moves θ only a little
    # The same variant (fraction 1 = original model) is scored on the same masked tokens for every seed: the probe
    # seed is the only difference, so the two seeds differ but both are finite.
    assert curve["value"].notna().all()

    # Re-running finds every run stored and computes nothing.
    def boom(*args, **kwargs):
        raise AssertionError("a stored run was recomputed")

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(mlm, "train_mlm_probe", boom)  # the name run_mlm_curve calls
        again = run_mlm_curve(
            model, tiny_tokenizer, data_dir=data_dir, fractions=fractions, seeds=(0, 1), max_length=32,
            train_sequences=12, eval_sequences=6, epochs=1, results_dir=results, progress=False,
        )
    assert sorted(again["run_id"]) == sorted(frame["run_id"])
    assert again.set_index("run_id")["value"].to_dict() == pytest.approx(frame.set_index("run_id")["value"].to_dict())


def test_run_mlm_curve_electra_without_head_and_missing_data(tiny_tokenizer, tmp_path):
    """ELECTRA's discriminator has no MLM head; its embeddings (24) are narrower than its hidden states (32)."""
    data_dir = _write_wikitext(tmp_path / "data", _sentences(40, seed=4), _sentences(30, seed=5))
    model = tiny_model("electra", vocab_size=64)
    frame = run_mlm_curve(
        model, tiny_tokenizer, data_dir=data_dir, fractions=(1.0, 0.0), max_length=32,
        train_sequences=6, eval_sequences=4, epochs=1, progress=False,
    )
    assert list(frame["matrix_type"]) == ["average", "average"]  # a bare encoder has no head to score
    assert frame.loc[frame["fraction"] == 0.0, "num_replaced_heads"].item() == 8
    with pytest.raises(FileNotFoundError, match="does not exist"):
        run_mlm_curve(model, tiny_tokenizer, data_dir=tmp_path / "nowhere", progress=False)


# ------------------------------------------------------------------------------------------------ the records


def test_committed_minilm_run_is_a_complete_curve():
    """The committed run the MLM chapter (book/mlm.md) shows at the local profile: five fractions, one λ order."""
    from pathlib import Path

    from papa_lib.analysis.mlm import lambda_files
    from papa_lib.experiments.workspace import read_lambda_info, read_lambdas

    folder = Path(__file__).resolve().parents[1] / "data" / "results" / "mlm"
    if not (folder / "results.csv").is_file():
        pytest.skip("no committed MLM run")
    frame = ResultsStore(folder).frame()
    minilm = frame[(frame["model"] == "all-MiniLM-L6-v2") & (frame["matrix_type"] == "average")]
    minilm = minilm.sort_values("fraction", ascending=False)
    assert list(minilm["fraction"]) == [1.0, 0.5, 0.125, 0.0625, 0.0]
    assert bool((minilm["ci_low"] <= minilm["value"]).all()) and bool((minilm["value"] <= minilm["ci_high"]).all())
    assert list(minilm["num_replaced_heads"]) == [0, 36, 63, 67, 72]
    (path,) = lambda_files(folder)
    assert read_lambdas(path).shape == (6, 12)
    assert read_lambda_info(path) == {"corpus": "local-wikitext-2:valid->test", "model": "all-MiniLM-L6-v2",
                                      "seconds": 250.0, "seed": 0}


def test_paper_mlm_numbers():
    """Sec. 5.5's numbers the MLM chapter puts beside ours."""
    from papa_lib.analysis.paper import headline

    assert headline("electra_mlm_original") == pytest.approx(-3.51)
    assert headline("electra_mlm_drop") == pytest.approx(0.44)
    assert [headline("mlm_models_mlm_drop_low"), headline("mlm_models_mlm_drop_high")] == pytest.approx([1.0, 1.5])


@pytest.mark.slow
def test_mlm_chapter_builds_the_score_by_hand_at_smoke(tmp_path):
    """book/mlm.ipynb at the smoke profile in a plain kernel: its by-hand features, logits, score, interval,
    accuracy and cross-entropy equal the library's (the check cells print the largest differences)."""
    import re
    from pathlib import Path

    import nbformat
    import papermill

    book = Path(__file__).resolve().parents[1] / "book"
    executed = tmp_path / "mlm.ipynb"
    papermill.execute_notebook(
        str(book / "mlm.ipynb"), str(executed), cwd=str(book), kernel_name="python3", progress_bar=False,
        parameters={"profile": "smoke", "results_dir": str(tmp_path / "results"),
                    "mlm_results_dir": str(tmp_path / "mlm")},
    )
    text = "".join(o.get("text", "") for c in nbformat.read(executed, as_version=4).cells if c.cell_type == "code"
                   for o in c.get("outputs", []) if o.get("output_type") == "stream")
    features = re.search(r"features; largest difference \S+ \(float16 rounding\), (\S+) once ours", text)
    assert features and float(features.group(1)) == 0.0
    assert "same targets, same sequences: True" in text
    checks = re.search(r"largest differences: (.*)", text).group(1)
    differences = [float(v) for v in re.findall(r"(\d\.\de[-+]\d+)", checks)]
    assert len(differences) == 6 and max(differences) < 1e-4, checks
    shown = "".join("".join(o.get("data", {}).get("text/markdown", "")) for c in nbformat.read(
        executed, as_version=4).cells if c.cell_type == "code" for o in c.get("outputs", []))
    assert "These are the records' own evaluation tokens" in shown  # the guessing level is scored on them
