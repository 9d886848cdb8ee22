"""What a grid costs before it runs (``papa grid FILE --plan``): examples, variants, backbone passes, feature bytes,
cache or stream, and an estimated time from throughput measured on this machine.

Counting backbone work in *example passes* (one forward pass over one example; a training step forward and backward
counts 3):

* constant matrices (Eq. 2): one pass over the training text of each source task (its first ``average_limit``
  examples when the grid sets one);
* λ (Sec. 3.2): ``lambda_epochs`` training passes over each seed's rows, per matrices source;
* frozen variants: one pass over the store's rows and the validation set per distinct backbone (λ and random
  orders differ per seed) when cached; when streamed, one pass per epoch (at most ``epochs``);
* trainable matrices (Sec. 5.2): ``inloop_epochs`` training passes per seed over at most ``inloop_limit`` of its
  rows (the matrices' training phase), then one frozen pass over the seed's rows and the validation set;
* registered head scores (the label-free orders): one scoring pass over each seed's training rows per ranking, and
  constant builders that take no packed batches (the norm-weighted matrices): one pass over their text; both timed
  directly on one padded batch of the task (:func:`score_cost`; they pad every row to L and read every head's
  attention, so the packed throughput does not price them).

With the grid's results folder (``papa grid`` passes it), what is stored there is left out: the runs already
recorded, the constant matrices and λ already saved (a run stopped after learning its λ keeps that file, and the
resumed run reads it), and, for the variants whose seeds train together, their cached features when whole and the
probe epochs their seeds' states hold (``checkpoints/``: a run stopped mid-training goes on from there).

Feature bytes are the store's (:func:`papa_lib.experiments.features.feature_rows_bytes`): its rows (a sentence
task's real tokens; a token task's words, estimated as 0.6 of its sub-tokens) x (layers+1) x hidden x 2 bytes, plus
the 2-byte position of each row of a sentence task.

The backbone passes alone give a floor no probe speed-up can lower; the plan prints it twice: as the grid declares
it, and as it would be with λ learned once per task (and one random order) instead of once per seed, the largest
saving a budget could buy without touching the data, the seeds or the probes.

Time = example passes x real tokens per example / measured tokens per second (packed forward), plus probe steps x
measured seconds per step. The probes of all seeds of a variant whose backbone does not depend on the seed train
together from one pass over its features (:func:`papa_lib.experiments.training.train_seeds`): such a variant costs one
backbone pass and the seeds' steps taken together, measured here as a multiple of one seed's step
(:func:`measure_seed_batching`; on a CPU close to the number of seeds, since a probe step's matrix products grow
with it; on a GPU far less). Variants whose backbone depends on the seed (λ, random orders) and those trained
inside the backbone train each seed on its own. Both figures are measured here, on the requested device, with the
grid's model — or, for a model given by name with no weights at hand, with a randomly initialised model built from its
configuration (timing does not depend on the weights).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from ..errors import PapaInputError
from ..experiments import tasks
from ..experiments.features import feature_rows_bytes  # the bytes the store keeps
from ..experiments.task_specs import TASKS
from .bench_support import median_ratio, time_call, time_interleaved
from .costs import PAPER_TRAIN_SIZES  # the one cost model's training sizes

#: Validation-set sizes of the paper's data; with :data:`~papa_lib.ops.costs.PAPER_TRAIN_SIZES` (the training sets),
#: used when the data is not at hand.
PAPER_VALIDATION_SIZES = {"cola": 1043, "sst2": 872, "mrpc": 408, "mnli": 9832, "ner": 3250, "pos": 3250}
#: Typical real tokens per example (measured on ../shared/data with the MiniLM tokenizer), for data not at hand.
TYPICAL_TOKENS = {"cola": 11.0, "sst2": 13.3, "mrpc": 53.0, "mnli": 42.0, "ner": 24.0, "pos": 24.0}


@dataclass
class TaskPlan:
    task: str
    train_examples: int
    rows_per_seed: int
    validation_examples: int
    tokens_per_example: float
    seeds: int  # the seeds of each variant the plan covers (a shard's, with --only-seed)
    variants: int
    frozen_backbones: int
    inloop_runs: int
    lambda_runs: int
    example_passes: float
    probe_steps: float
    feature_bytes: int
    mode: str
    seconds: float
    data: str
    backbone_seconds: float = 0.0  # the backbone passes alone: a floor no probe speed-up can lower
    probe_seconds: float = 0.0  # the probes' steps, the seeds of seed-independent variants stepping together
    shared_seconds: float = 0.0  # the same floor with λ and random orders drawn once per task, not once per seed
    runs: int = 0  # runs still to do (variant x seed), the ones the times count
    finished: int = 0  # runs of the grid already in its results folder (skipped when it resumes)
    saved_epochs: int = 0  # probe epochs held by the pending seeds' saved states (skipped when it resumes)
    stored_features: int = 0  # variants whose cached features are whole in the results folder
    score_passes: int = 0  # passes of registered head scores over a seed's rows (label-free orders), timed here


@dataclass
class Stored:
    """What a resumed grid reads from its results folder instead of computing (:func:`stored_stages`)."""

    matrices: set  # matrices sources whose averaged matrices are stored
    lambdas_left: dict  # matrices source -> λ still to learn
    features: set = field(default_factory=set)  # variants whose cached features (train and validation) are whole
    epochs: dict = field(default_factory=dict)  # variant -> probe epochs its pending seeds' saved states hold


def measure_throughput(model, device="cpu", tokens: int = 24, batch: int = 64, repeats: int = 3) -> tuple[float, float]:
    """(real tokens per second of a packed forward with all hidden states, seconds per probe step) on ``device``."""
    from ..core.models import run_backbone  # a decoder LM's bare decoder: no 262k-column logits
    from ..experiments.loop import adamw
    from ..experiments.probes import make_probe

    model = model.to(device).eval()
    vocab = int(model.config.vocab_size)
    ids = torch.randint(5, max(6, vocab - 1), (batch, tokens), device=device)
    inputs = {"input_ids": ids, "attention_mask": torch.ones_like(ids),
              "position_ids": torch.arange(tokens, device=device).expand(batch, tokens)}

    def forward_passes():
        with torch.inference_mode():
            for _ in range(repeats):
                run_backbone(model, inputs, output_hidden_states=True)

    with torch.inference_mode():
        run_backbone(model, inputs, output_hidden_states=True)  # warm-up
    tokens_per_second = batch * tokens * repeats / time_call(forward_passes, device)
    layers, hidden = int(model.config.num_hidden_layers) + 1, int(model.config.hidden_size)
    probe = make_probe("sentence", layers, 128, hidden, 3).to(device)
    optimiser = adamw(probe.parameters(), 1e-4)
    features = torch.randn(16, layers, tokens, hidden, device=device)
    mask = torch.ones(16, tokens, dtype=torch.long, device=device)
    labels = torch.zeros(16, dtype=torch.long, device=device)

    def probe_steps():
        for _ in range(20):
            loss = torch.nn.functional.cross_entropy(probe(features, mask), labels)
            optimiser.zero_grad()
            loss.backward()
            optimiser.step()

    return tokens_per_second, time_call(probe_steps, device) / 20


def measure_seed_batching(model, device="cpu", seeds: int = 10, tokens: int = 24, steps: int = 10,
                          repeats: int = 3) -> float:
    """Seconds of one training step of ``seeds`` probes stepping together (one backward, one AdamW call; the library's
    loop, :func:`papa_lib.experiments.loop.fit`) over ``seeds`` x the seconds of one probe's step: 1 when training
    together saves nothing, 1/seeds when the seeds cost what one does. Median of ``repeats`` interleaved
    measurements (:func:`~papa_lib.ops.bench_support.time_interleaved`)."""
    from ..experiments.loop import Member, fit
    from ..experiments.probes import make_probe

    layers, hidden = int(model.config.num_hidden_layers) + 1, int(model.config.hidden_size)
    features = torch.randn(16, layers, tokens, hidden, device=device)
    mask = torch.ones(16, tokens, dtype=torch.long, device=device)
    labels = torch.zeros(16, dtype=torch.long, device=device)
    groups = {}
    for count in (1, seeds):
        members = []
        for seed in range(count):
            probe = make_probe("sentence", layers, 128, hidden, 3).to(device)
            members.append(Member(seed, probe, [{"params": list(probe.parameters())}]))
        groups[count] = members

    def train(members, count=steps) -> None:
        fit(members, lambda epoch, active: ([(m, (features, mask), labels) for m in active] for _ in range(count)),
            epochs=1, learning_rate=1e-4, device=device)

    took = time_interleaved({"one": lambda: train(groups[1]), "all": lambda: train(groups[seeds])}, repeats, device,
                            warmups=[lambda members=members: train(members, 1) for members in groups.values()])
    return median_ratio(took["all"], [seeds * one for one in took["one"]])  # the steps' count cancels


def _task_data(task: str, config, tokenizer):
    """(train examples, validation examples, real tokens per example, where the numbers come from)."""
    own_files = TASKS[task].loader is not None  # a task of your own reads its files, whatever data_dir is
    if tokenizer is not None and (config.data_dir is not None or own_files):
        try:
            train = tasks.load_task(task, "train", data_dir=config.data_dir)
            validation = tasks.load_task(task, "validation", data_dir=config.data_dir, limit=config.eval_limit)
        except (FileNotFoundError, ValueError):
            train = None
        if train is not None:
            from ..core.layout import encode, encode_words

            sample = train.words[:512] if hasattr(train, "words") else None
            if sample is not None:
                encoded = encode_words(tokenizer, sample, max_length=config.max_length)
            else:
                pairs = train.pairs[:512] if train.pairs is not None else None
                encoded = encode(tokenizer, train.texts[:512], pairs, max_length=config.max_length)
            tokens = float(encoded["attention_mask"].sum(1).float().mean())
            return len(train), len(validation), tokens, f"{train.source if own_files else config.data_dir} (measured)"
    if task not in PAPER_TRAIN_SIZES:
        raise PapaInputError(f"task {task}: its data could not be read to plan it, and the paper gives no size for it")
    return (PAPER_TRAIN_SIZES[task], PAPER_VALIDATION_SIZES[task], TYPICAL_TOKENS[task],
            "paper data sizes (data not at hand; tokens per example typical)")


def plan_task(task: str, variants, config, *, layers: int, hidden: int, tokens_per_second: float,
              step_seconds: float, budget: int, tokenizer=None, together: float = 1.0,
              left: dict | None = None, planned: int | None = None, stored: Stored | None = None,
              scores: tuple[int, float, float] = (0, 0.0, 0.0)) -> TaskPlan:
    """The cost of one task's variants under one resolved :class:`~papa_lib.experiments.workspace.ExperimentConfig`;
    ``together``: a step of all seeds together over as many separate steps (:func:`measure_seed_batching`);
    ``left``: how many seeds of each variant are still to run (default: all; :func:`pending_runs`); ``planned``: how
    many seeds of each variant this plan covers (default: all of the config's; fewer for a shard, ``--only-seed``);
    ``stored``: what the results folder holds already (:func:`stored_stages`), left out of the passes; ``scores``:
    (passes, seconds, seconds if drawn once per task) of the registered head scores the variants need
    (:func:`score_cost`)."""
    spec = TASKS[task]
    n_train, n_val, tokens, data = _task_data(task, config, tokenizer)
    seeds = len(config.seeds)
    planned = seeds if planned is None else planned
    todo = {v: (planned if left is None else int(left.get(v, planned))) for v in variants}
    variants = [v for v in variants if todo[v] > 0]
    per_seed = min(config.limit, n_train) if config.limit else n_train
    # the store covers the union of the seeds a variant still runs (engine.store_rows): independent subsets of
    # per_seed rows leave each row out with probability (1 - per_seed / n_train) per seed
    running = max(todo.values(), default=0) or planned
    store_rows = (round(n_train * (1 - (1 - per_seed / n_train) ** running))
                  if config.limit and config.limit < n_train else n_train)
    rows_per_example = tokens if spec.kind == "sentence" else tokens * 0.6  # token tasks keep first sub-tokens only
    feature_bytes = feature_rows_bytes((store_rows + n_val) * rows_per_example, layers, hidden, spec.kind,
                                       positions=True)  # what the store keeps, sentence positions included
    mode = "cache" if feature_bytes <= budget else "stream"
    frozen = [v for v in variants if v.frozen]
    inloop = [v for v in variants if not v.frozen]
    together_variants = [v for v in frozen if not v.backbone_per_seed(config.lambda_seed)]
    features_stored = set(stored.features) & set(together_variants) if stored is not None else set()
    saved = {v: stored.epochs.get(v, 0) for v in together_variants} if stored is not None else {}
    backbones = sum(todo[v] if v.backbone_per_seed(config.lambda_seed) else int(v not in features_stored)
                    for v in frozen)
    lambda_seeds: dict = {}  # λ per source and seed, learned once for every variant that mixes with it
    for v in variants:
        if v.needs_lambdas:
            source = v.matrices_from or task
            learned = todo[v] if config.lambda_seed is None else 1  # one λ shared by every seed
            lambda_seeds[source] = max(lambda_seeds.get(source, 0), learned)
    matrix_sources = {v.matrices_from or task for v in variants if v.matrix_type in ("average", "trainable_average")}
    if stored is not None:  # a resumed grid reads these from its results folder
        matrix_sources -= set(stored.matrices)
        lambda_seeds = {source: min(count, stored.lambdas_left.get(source, 0))
                        for source, count in lambda_seeds.items()}
    lambda_runs = sum(lambda_seeds.values())
    epochs, inloop_epochs = config.epochs, config.inloop_epochs
    averaged = min(n_train, config.average_limit) if config.average_limit else n_train  # the matrices' text
    passes = float(len(matrix_sources) * averaged)
    passes += lambda_runs * config.lambda_epochs * per_seed * 3
    per_backbone = (store_rows + n_val) if mode == "cache" else epochs * (store_rows + n_val)
    passes += backbones * per_backbone
    inloop_rows = min(per_seed, config.inloop_limit) if config.inloop_limit else per_seed
    inloop_runs = sum(todo[v] for v in inloop)
    passes += inloop_runs * (inloop_epochs * inloop_rows * 3 + per_seed + n_val)
    batch = config.batch_size
    runs = sum(todo.values())
    skipped = min(sum(saved.values()), runs * epochs)  # epochs the seeds' saved states hold: not trained again
    steps = (runs * epochs - skipped) * per_seed / batch
    together_runs = sum(todo[v] for v in together_variants)
    shared_steps = (together_runs * epochs - skipped) * per_seed / batch  # the seeds of one backbone step together
    probe_seconds = (steps - shared_steps + shared_steps * together) * step_seconds
    score_passes, score_seconds, score_once = scores
    backbone_seconds = passes * tokens / tokens_per_second + score_seconds
    seconds = backbone_seconds + probe_seconds
    # what learning λ once per task (and drawing one random order) would leave: each seed-dependent backbone once
    shared = passes - sum(max(0, n - 1) for n in lambda_seeds.values()) * config.lambda_epochs * per_seed * 3 \
        - sum(todo[v] - 1 for v in frozen if v.backbone_per_seed(config.lambda_seed)) * per_backbone
    return TaskPlan(task, n_train, per_seed, n_val, round(tokens, 1), planned, len(variants), backbones,
                    inloop_runs, lambda_runs, passes, steps, feature_bytes, mode, seconds, data,
                    backbone_seconds, probe_seconds, shared * tokens / tokens_per_second + score_once, runs=runs,
                    finished=planned * len(todo) - runs, saved_epochs=skipped, stored_features=len(features_stored),
                    score_passes=score_passes)


def format_plan(plans: list[TaskPlan], *, model: str, device: str, tokens_per_second: float, step_seconds: float,
                budget: int, together: float = 1.0, results_dir=None) -> str:
    """A plain-text table of the plan, with totals (upper bounds: every probe runs to its epoch cap); with
    ``results_dir``, the runs already stored there are left out (and counted)."""
    seeds = max((p.seeds for p in plans), default=1)
    lines = [f"plan for {model} on {device}: measured {tokens_per_second:,.0f} real tokens/s (packed forward), "
             f"{step_seconds * 1e3:.1f} ms per probe step, "
             + (f"{seeds} seeds stepping together {together * seeds:.1f}x one seed's step" if seeds > 1
                else "one seed per variant") + f"; feature budget {budget / 2**30:.1f} GiB",
             f"{'task':6} {'train':>8} {'/seed':>7} {'valid':>6} {'tok/ex':>6} {'runs':>5} {'variants':>8} "
             f"{'backbones':>9} {'inloop':>6} {'λ runs':>6} {'scores':>6} {'passes':>10} {'features':>10} {'mode':>6} "
             f"{'time':>9}  data"]
    for p in plans:
        lines.append(f"{p.task:6} {p.train_examples:8d} {p.rows_per_seed:7d} {p.validation_examples:6d} "
                     f"{p.tokens_per_example:6.1f} {p.runs:5d} {p.variants:8d} {p.frozen_backbones:9d} "
                     f"{p.inloop_runs:6d} {p.lambda_runs:6d} {p.score_passes:6d} {p.example_passes:10.3g} "
                     f"{p.feature_bytes / 2**30:9.2f}G {p.mode:>6} {p.seconds / 3600:8.2f}h  {p.data}")
    total = sum(p.seconds for p in plans)
    floor = sum(p.backbone_seconds for p in plans)
    shared = sum(p.shared_seconds for p in plans)
    finished = sum(p.finished for p in plans)
    resumed = sum(p.saved_epochs for p in plans), sum(p.stored_features for p in plans)
    done = (f" still to run ({finished} already in {results_dir}/results.csv are skipped, {resumed[0]} probe epochs "
            f"of the rest and {resumed[1]} variants' features are saved there)") if results_dir else ""
    lines.append(f"total: {sum(p.runs for p in plans)} runs{done}, at most {total / 3600:.2f} h "
                 f"(every probe to its epoch cap; early stopping ends most sooner); at least {floor / 3600:.2f} h "
                 f"(the backbone passes alone, at the measured throughput); at least {shared / 3600:.2f} h if λ and "
                 f"random orders were drawn once per task instead of per seed; probes "
                 f"{sum(p.probe_seconds for p in plans) / 3600:.2f} h of it (seeds of seed-independent variants "
                 f"stepping together)")
    return "\n".join(lines)


#: Published shapes of the paper's models (model_type, layers, hidden, heads, intermediate, vocabulary), so a plan
#: can time them from a configuration when neither weights nor a configuration file are at hand.
KNOWN_CONFIGURATIONS = {
    "bert-base-uncased": ("bert", 12, 768, 12, 3072, 30522),
    "bert-large-uncased": ("bert", 24, 1024, 16, 4096, 30522),
    "roberta-base": ("roberta", 12, 768, 12, 3072, 50265),
    "roberta-large": ("roberta", 24, 1024, 16, 4096, 50265),
    "microsoft/deberta-base": ("deberta", 12, 768, 12, 3072, 50265),
    "microsoft/deberta-large": ("deberta", 24, 1024, 16, 4096, 50265),
    "google/electra-base-discriminator": ("electra", 12, 768, 12, 3072, 30522),
}


def _model_for_timing(name: str | None, device: str):
    """(model, tokenizer or None, how it was obtained): the real model (encoder or decoder LM) if its weights load,
    else a random encoder built from its configuration (a local folder or the hub), else a clear error."""
    from ..core.decoders import load_model
    from ..core.models import check_device, missing_model_folder

    check_device(device)
    if missing_model_folder(name):
        raise PapaInputError(f"model folder not found: {name}")
    try:
        model, tokenizer = load_model(name, device=device)
        return model, tokenizer, "weights"
    except Exception as weights_error:  # noqa: BLE001 - fall back to the configuration below
        from transformers import AutoConfig, AutoModel

        how = "configuration only: random weights, timing only"
        try:
            config = AutoConfig.from_pretrained(name)
        except Exception:  # noqa: BLE001
            if name not in KNOWN_CONFIGURATIONS:
                raise PapaInputError(f"no weights and no configuration could be loaded for model {name!r}: pass a "
                                     f"local folder holding its config.json as --model") from weights_error
            kind, layers, hidden, heads, intermediate, vocab = KNOWN_CONFIGURATIONS[name]
            config = AutoConfig.for_model(kind, num_hidden_layers=layers, hidden_size=hidden, num_attention_heads=heads,
                                          intermediate_size=intermediate, vocab_size=vocab)
            how = "published shapes, no configuration file at hand: random weights, timing only"
        config._attn_implementation = "eager"
        return AutoModel.from_config(config).to(device).eval(), None, how


def pending_runs(variants, ws, done: set, only_seeds=None) -> dict:
    """The seeds of each variant (of ``only_seeds`` alone, when given: a shard) whose run id is not in ``done``
    (the ids already stored; the same run ids as :func:`papa_lib.experiments.grid.run_grid`, which skips the stored
    ones when it resumes). ``ws``: the task's :class:`~papa_lib.experiments.engine.TaskExperiment`; nothing runs."""
    from ..experiments import engine

    seeds = [s for s in ws.config.seeds if only_seeds is None or s in only_seeds]
    return {v: engine.pending_seeds(ws, v, seeds, done) for v in variants}


def score_cost(ws, pending: dict) -> tuple[int, float, float]:
    """(passes, seconds, seconds if drawn once per task) of the work the packed throughput does not price, for the
    ``pending`` runs (variant -> seeds), timed here on one padded batch of the task's training rows: each ranking with
    a ``score_pass`` (:class:`~papa_lib.experiments.rankings.HeadRanking`) scores every training row of each seed it
    runs for (one seed for ``same_for_every_seed``; these are the passes), and each constant builder that does not
    take packed batches (:func:`papa_lib.experiments.matrices.constant_builder`, e.g. the norm-weighted matrices)
    averages its source's text once unless its matrices are stored. Nothing runs when no pending run needs either."""
    from ..experiments import engine
    from ..experiments.matrices import constant_builder, matrix_type
    from ..experiments.rankings import head_ranking

    seeds_of: dict = {}  # ranking name -> the seeds whose scores the pending runs read
    builds: set = set()  # (source task, constants kind) built from padded batches, not yet stored
    for variant, seeds in pending.items():
        if not seeds:
            continue
        if variant.needs_scores and head_ranking(variant.selection_order).score_pass is not None:
            seeds_of.setdefault(variant.selection_order, set()).update(seeds)
        kind = matrix_type(variant.matrix_type).constants  # None for the original and the data-free types
        source = variant.matrices_from or ws.config.task
        path = engine.constants_path(ws, source, kind) if kind else None
        if kind and not constant_builder(kind)[1] and not (path is not None and path.is_file()):
            builds.add((source, kind))
    if not seeds_of and not builds:
        return 0, 0.0, 0.0
    split = engine.split(ws, "train")
    first = engine.seed_rows(ws, ws.config.seeds[0])
    batch = next(iter(engine.packed_batches(ws.model, split.encoded, ws.config.feature_batch_size,
                                            first[:ws.config.feature_batch_size], use_packing=False)))
    rows = int(batch["input_ids"].shape[0])

    def timed(work, *args, **kwargs) -> float:  # seconds of one padded batch
        started = time.perf_counter()
        with torch.inference_mode():
            work(*args, **kwargs)
        return time.perf_counter() - started

    passes = seconds = once = 0.0
    for name, seeds in seeds_of.items():
        ranking = head_ranking(name)
        per_pass = timed(ranking.score_pass, ws.model, batch) * len(first) / rows
        count = 1 if ranking.same_for_every_seed else len(seeds)
        passes, seconds, once = passes + count, seconds + count * per_pass, once + per_pass
    for source, kind in builds:
        builder = constant_builder(kind)[0]
        examples = int(engine.averaged_split(ws, source).encoded["input_ids"].shape[0])
        build = timed(builder, ws.model, [batch], progress=False, source="plan") * examples / rows
        seconds, once = seconds + build, once + build
    return int(passes), seconds, once


def stored_stages(ws, pending: dict) -> Stored:
    """What a resumed grid reads from ``ws.results_dir`` instead of computing, for the ``pending`` runs (variant ->
    seeds, :func:`pending_runs`): the files :func:`papa_lib.experiments.engine.constants_path` and
    :func:`~papa_lib.experiments.engine.lambda_path` name (a run stopped after its λ was saved is planned without
    it) and, for the variants whose seeds train together, their cached features and their seeds' saved probe
    epochs (:func:`saved_work`)."""
    from ..experiments import engine

    config = ws.config
    sources = {v.matrices_from or config.task for v, seeds in pending.items()
               if seeds and v.matrix_type in ("average", "trainable_average")}
    on_disk = {source for source in sources if engine.constants_path(ws, source).is_file()}
    wanted: dict = {}  # matrices source -> the seeds whose λ the pending runs read
    for variant, seeds in pending.items():
        if variant.needs_lambdas:
            wanted.setdefault(variant.matrices_from or config.task, set()).update(
                engine.lambda_seed(ws, seed) for seed in seeds)
    lambdas_left = {source: sum(not engine.lambda_path(ws, source, seed).is_file() for seed in seeds)
                    for source, seeds in wanted.items()}
    features, epochs = saved_work(ws, pending)
    return Stored(on_disk, lambdas_left, features, epochs)


def saved_work(ws, pending: dict) -> tuple[set, dict]:
    """(the variants whose cached features are whole in the store, {variant: probe epochs its pending seeds' saved
    states hold}), for the frozen variants whose seeds train together (a run killed mid-training leaves both). The
    feature keys are the run's own (:func:`papa_lib.experiments.engine.features_key`); a variant whose override
    needs work first (matrices not yet stored, head scores) has none stored."""
    from ..experiments import engine
    from ..experiments.matrices import matrix_type

    config, features, epochs = ws.config, set(), {}
    for variant, seeds in pending.items():
        if not seeds or not variant.frozen or variant.backbone_per_seed(config.lambda_seed):
            continue
        checkpoint = engine.epoch_checkpoint(ws, variant, seeds)  # where the run keeps its seeds' states
        epochs[variant] = sum(checkpoint.saved_epochs(seed) for seed in seeds)
        entry = matrix_type(variant.matrix_type) if variant.matrix_type != "original" else None
        needs_work = variant.needs_scores or (
            entry is not None and entry.constants
            and not engine.constants_path(ws, variant.matrices_from, entry.constants).is_file())
        if ws.features_store is None or needs_work or not engine.use_cache(ws, seeds):
            continue
        state = engine.override_for(ws, variant, seeds[0])
        keys = {"train": engine.store_rows(ws, seeds), "validation": torch.arange(len(engine.split(ws, "validation")))}
        if all(ws.features_store.has(engine.features_key(ws, state, name, rows), name) for name, rows in keys.items()):
            features.add(variant)
    return features, epochs


def plan_grid(spec: dict, overrides: dict | None = None, model_name: str | None = None, results_dir=None,
              only_seeds=None, length_source: str = "max_length") -> str:
    """The plan of a declared grid as text (see the module docstring); nothing is trained. With ``results_dir``
    (``papa grid`` passes the grid's folder) the runs already stored there are left out of the times; with
    ``only_seeds`` (``--only-seed``) the plan is that shard's: those of the grid's seeds alone. An L longer than the
    model's positions is refused as the run would refuse it, naming ``length_source``."""
    from ..core.models import check_length, num_layers_and_heads
    from ..experiments import engine
    from ..experiments.features import default_budget
    from ..experiments.grid import grid_runs, grid_settings, task_config
    from ..experiments.results import ResultsStore

    settings, seeds = grid_settings(spec, overrides)
    name = model_name or settings.get("model")
    device = settings.get("device", "cpu")
    model, tokenizer, how = _model_for_timing(name, device)
    check_length(model, settings.get("max_length"), length_source)
    layers, _ = num_layers_and_heads(model)
    hidden = int(model.config.hidden_size)
    tokens_per_second, step_seconds = measure_throughput(model, device)
    planned = [s for s in seeds if only_seeds is None or s in only_seeds]
    seed_count = max(len(planned), 1)
    together = measure_seed_batching(model, device, seed_count) if seed_count > 1 else 1.0
    budget = settings.get("cache_budget") or default_budget()
    done = None
    if results_dir:  # read the stored run ids once, for every task
        store = ResultsStore(results_dir, read_only=True)  # a plan adds, moves or sets aside no line of results.csv
        done = set(store.run_ids()) if store.path.is_file() else set()
    plans = []
    for task, variants in grid_runs(spec["blocks"]).items():
        config = task_config(settings, task, seeds).resolved()
        # one workspace per task for both questions: the run ids and the stored stages' file names
        ws = engine.TaskExperiment(config, model, tokenizer, results_dir=results_dir or None, progress=False)
        pending = pending_runs(variants, ws, done or set(), only_seeds) \
            if done is not None or only_seeds is not None else None
        left = {v: len(seeds) for v, seeds in pending.items()} if pending is not None else None
        stored = stored_stages(ws, pending) \
            if results_dir and pending is not None and tokenizer is not None else None
        scores = score_cost(ws, pending or {v: planned for v in variants}) if tokenizer is not None else (0, 0.0, 0.0)
        plans.append(
            plan_task(
                task,
                variants,
                config,
                layers=layers,
                hidden=hidden,
                tokens_per_second=tokens_per_second,
                step_seconds=step_seconds,
                budget=budget,
                tokenizer=tokenizer,
                together=together,
                left=left,
                planned=len(planned),
                stored=stored,
                scores=scores,
            )
        )
    label = f"{name or 'embedded all-MiniLM-L6-v2'} ({how})"
    text = format_plan(plans, model=label, device=device, tokens_per_second=tokens_per_second,
                       step_seconds=step_seconds, budget=budget, together=together, results_dir=results_dir)
    if spec.get("language_model") is not None:
        text += "\n" + format_language_model_plan(model, spec["language_model"], results_dir)
    return text


def format_language_model_plan(model, section: dict, results_dir=None) -> str:
    """The plan of a grid's ``language_model`` section (:func:`papa_lib.experiments.lm.plan_language_model`) in one
    line: runs declared, stored, left, and the time of what is left at the measured speed."""
    from ..experiments import lm

    settings = lm.LMSettings.from_mapping(section)
    plan = lm.plan_language_model(model, settings, results_dir or None)
    stored = [name for name, key in (("constants", "constants_stored"), ("λ", "lambdas_stored")) if plan[key]]
    return (f"language model ({settings.corpus}, {settings.test_windows} test windows of {settings.length} tokens): "
            f"{plan['runs']} runs, {plan['stored']} stored, {plan['left']} left"
            + (f" ({' and '.join(stored)} stored)" if stored else "")
            + f"; about {plan['seconds'] / 3600:.2f} h left at the measured {plan['tokens_per_second']:,.0f} "
              "tokens/s (model and chunked LM loss)")
