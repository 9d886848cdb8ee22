"""The one training loop (papa_lib.experiments.loop.fit): all seeds of a variant trained together equal the seeds
trained one by one, bit for bit, for sentence and token probes, early stopping included."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from papa_lib.experiments import loop, probes, training
from papa_lib.experiments.features import RaggedRows
from papa_lib.experiments.loop import Member, fit

LAYERS, HIDDEN, N = 3, 16, 120


def _rows(kind: str):
    generator = torch.Generator().manual_seed(0)
    lengths = torch.randint(3, 12, (N,), generator=generator)
    offsets = torch.cat([torch.zeros(1, dtype=torch.long), lengths.cumsum(0)])
    values = torch.randn(int(offsets[-1]), LAYERS, HIDDEN, generator=generator).half()
    positions = torch.cat([torch.arange(int(n)) for n in lengths])
    if kind == "token":
        labels = torch.full((N, 12), -100)
        for i, n in enumerate(lengths.tolist()):
            labels[i, :n] = torch.randint(0, 3, (n,), generator=generator)
    else:
        labels = torch.randint(0, 2, (N,), generator=generator)
    return RaggedRows(values, offsets, positions), labels


class Killed(Exception):
    pass


def _train(kind: str, seeds, batched: bool = True, checkpoint=None, stop_at=None, scored=None):
    rows, labels = _rows(kind)
    plans = [training.SeedPlan(s, *training.heldout_split(torch.arange(N), 0.1, s)) for s in seeds]
    scored = [] if scored is None else scored

    def score(plan, predictions):  # a noisy held-out score, so the seeds stop at different epochs
        scored.append(plan.seed)
        if stop_at is not None and len(scored) == stop_at:
            raise Killed  # the process is killed mid-training
        return float(torch.rand(1, generator=torch.Generator().manual_seed(int(predictions.sum()) + plan.seed)))

    return training.train_seeds(
        lambda seed: probes.make_probe(kind, LAYERS, 16, HIDDEN, 3 if kind == "token" else 2, dropout=0.3), plans,
        lambda chunk: (rows, chunk), lambda plan: (rows, plan.heldout), score, labels, kind, pool_size=N,
        batch_size=8, learning_rate=1e-2, max_epochs=8, patience=2, chunk_size=50, batched=batched,
        checkpoint=checkpoint)


def _same(a, b):
    assert a.curve == b.curve  # losses and held-out scores, exact float equality
    assert (a.best_epoch, a.updates, a.updates_at_best) == (b.best_epoch, b.updates, b.updates_at_best)
    for x, y in zip(a.probe.state_dict().values(), b.probe.state_dict().values(), strict=True):
        assert torch.equal(x, y)


@pytest.mark.parametrize("kind", ["sentence", "token"])
def test_a_run_stopped_mid_training_resumes_from_its_last_epoch_to_the_same_probes(kind, tmp_path):
    seeds = [0, 1, 2, 3]
    whole_scored, again_scored = [], []
    whole = _train(kind, seeds, scored=whole_scored)
    names = {seed: f"run-{seed}" for seed in seeds}
    # killed while scoring the 10th held-out slice: seeds 0-3 finished epochs 1 and 2, seed 0 finished epoch 3 too
    with pytest.raises(Killed):
        _train(kind, seeds, checkpoint=loop.EpochCheckpoint(tmp_path, names), stop_at=10)
    saved = {seed: torch.load(tmp_path / f"run-{seed}.pt", weights_only=True)["epochs"] for seed in seeds}
    assert saved == {0: 2, 1: 2, 2: 2, 3: 2}  # an epoch is saved once every member has finished it
    # a member saved one epoch ahead of the others (its file was written just before a kill) waits for them
    ahead = loop.EpochCheckpoint(tmp_path / "ahead", names)
    with pytest.raises(Killed):
        _train(kind, [0], checkpoint=ahead, stop_at=4)  # seed 0 alone, killed scoring epoch 4: 3 epochs saved
    (tmp_path / "ahead" / "run-0.pt").replace(tmp_path / "run-0.pt")
    (tmp_path / "ahead" / "run-0.pt.sha256").replace(tmp_path / "run-0.pt.sha256")
    resumed = loop.EpochCheckpoint(tmp_path, names)
    again = _train(kind, seeds, checkpoint=resumed, scored=again_scored)
    # the resumed run trained only the epochs after the saved ones (seed 0: after its 3)
    assert len(again_scored) == len(whole_scored) - 2 * len(seeds) - 1
    for seed in seeds:
        _same(again[seed], whole[seed])
        assert resumed.seconds(seed) > 0
    assert min(len(whole[s].curve) for s in seeds) >= 3 < max(len(whole[s].curve) for s in seeds)  # past the kill


@pytest.mark.parametrize("kind", ["sentence", "token"])
def test_seeds_trained_together_equal_seeds_trained_one_by_one(kind):
    seeds = [0, 1, 2, 3, 4]
    together = _train(kind, seeds)
    interleaved = _train(kind, seeds, batched=False)
    stopped = {len(together[s].curve) for s in seeds}
    assert len(stopped) > 1, "every seed stopped at the same epoch: early stopping is not exercised"
    assert min(stopped) < 8  # at least one seed froze before the last epoch
    for seed in seeds:
        alone = _train(kind, [seed])[seed]
        for other in (together[seed], interleaved[seed]):
            assert other.curve == alone.curve  # losses and held-out scores, exact float equality
            assert (other.best_epoch, other.updates, other.updates_at_best) == (alone.best_epoch, alone.updates,
                                                                                 alone.updates_at_best)
            for a, b in zip(other.probe.state_dict().values(), alone.probe.state_dict().values(), strict=True):
                assert torch.equal(a, b)


def test_a_member_without_a_batch_is_not_touched():
    torch.manual_seed(0)
    a, b = torch.nn.Linear(4, 2), torch.nn.Linear(4, 2)
    before = [p.detach().clone() for p in b.parameters()]
    members = [Member(0, a, [{"params": list(a.parameters())}]), Member(1, b, [{"params": list(b.parameters())}])]
    x, y = torch.randn(8, 4), torch.randint(0, 2, (8,))

    def steps(epoch, active):
        yield [(members[0], x, y)]  # member 1 never gets a batch: no AdamW step, no momentum, no decay

    fit(members, steps, epochs=3, learning_rate=0.1, weight_decay=0.1)
    assert members[0].result.updates == 3 and members[1].result.updates == 0
    assert all(torch.equal(p, q) for p, q in zip(b.parameters(), before))
    assert not torch.equal(a.weight, torch.nn.Linear(4, 2).weight)


def test_records_carry_provenance_and_old_records_read_it_as_empty(tmp_path):
    import hashlib
    import json

    from papa_lib import smoke
    from papa_lib.experiments import results
    from papa_lib.experiments.engine import TaskExperiment
    from papa_lib.experiments.variants import Variant
    from papa_lib.experiments.workspace import ExperimentConfig

    data_dir = smoke.generate_data_dir(tmp_path / "data", n_train=24, n_dev=8)
    model, tokenizer = smoke.tiny_encoder("bert")
    config = ExperimentConfig("cola", data_dir=str(data_dir), max_length=16, epochs=1, seeds=(0,))
    experiment = TaskExperiment(config, model, tokenizer, results_dir=tmp_path / "runs", progress=False)
    record = experiment.run(Variant(), 0)
    assert set(results.PROVENANCE_FIELDS) <= set(record)
    digests = json.loads(record["data_sha256"])
    files = {str(data_dir / "glue" / "CoLA" / name) for name in ("train.tsv", "dev.tsv")}
    assert set(digests) == files
    for name, digest in digests.items():
        assert digest == hashlib.sha256(Path(name).read_bytes()).hexdigest()
    assert record["torch_version"] == torch.__version__ and record["threads"] == torch.get_num_threads()
    assert record["optimizer"] == "torch.optim.AdamW(fused=True)" and record["processor"]
    assert record["git_commit"] == "unknown" or len(record["git_commit"].removesuffix("-dirty")) == 40
    stored = results.ResultsStore(tmp_path / "runs").get(record["run_id"])
    assert stored["data_sha256"] == record["data_sha256"] and stored["threads"] == record["threads"]
    # a table written before these columns existed: they read as missing
    old = results.ResultsStore(tmp_path / "old")
    old.append({k: v for k, v in record.items() if k not in results.PROVENANCE_FIELDS})
    frame = old.frame()
    assert set(results.PROVENANCE_FIELDS) <= set(frame.columns) and frame["git_commit"].isna().all()


def test_plan_counts_the_seeds_of_a_seed_independent_variant_stepping_together():
    from papa_lib.experiments.variants import Variant
    from papa_lib.experiments.workspace import ExperimentConfig
    from papa_lib.ops import plan

    config = ExperimentConfig("cola", seeds=tuple(range(10)), epochs=2).resolved()
    kwargs = {"layers": 6, "hidden": 384, "tokens_per_second": 1e4, "step_seconds": 1e-3, "budget": 10**12}
    costs = {}
    for name, variants in {"constant": [Variant(), Variant.make("zeros", "none", 0.0)],
                           "lambda": [Variant.make("average", "lambda", 0.5)]}.items():
        for together in (1.0, 0.1):
            costs[name, together] = plan.plan_task("cola", variants, config, together=together, **kwargs)
    alone, batched = costs["constant", 1.0], costs["constant", 0.1]
    assert batched.frozen_backbones == alone.frozen_backbones == 2  # one backbone pass per variant, all seeds
    assert batched.probe_seconds == pytest.approx(0.1 * alone.probe_seconds) and batched.probe_seconds > 0
    assert batched.seconds == pytest.approx(batched.backbone_seconds + batched.probe_seconds)
    # λ differs per seed: its own backbone and its own probe per seed, whatever training together would save
    assert costs["lambda", 0.1].probe_seconds == costs["lambda", 1.0].probe_seconds
    assert costs["lambda", 1.0].frozen_backbones == 10


def test_measured_seed_batching_is_a_positive_factor():
    from papa_lib import smoke
    from papa_lib.ops import plan

    model, _ = smoke.tiny_encoder("bert")
    factor = plan.measure_seed_batching(model, seeds=3, tokens=8, steps=3)
    assert 0 < factor < float("inf")  # a timing ratio (its size depends on the machine and its load)


def test_a_saved_state_that_does_not_fit_is_set_aside_and_the_member_trains_from_the_start(tmp_path, capsys):
    whole = _train("token", [0])
    (tmp_path / "run-0.pt").write_bytes(b"not a checkpoint")
    torch.save({"name": "run-0", "module": {}}, tmp_path / "run-1.pt")
    checkpoint = loop.EpochCheckpoint(tmp_path, {0: "run-0", 1: "run-1"})
    _same(_train("token", [0], checkpoint=checkpoint)[0], whole[0])
    assert (tmp_path / "run-0.pt.damaged").exists()
    _train("token", [1], checkpoint=checkpoint)
    assert (tmp_path / "run-1.pt.damaged").exists()
    assert "not a training state" in capsys.readouterr().err
