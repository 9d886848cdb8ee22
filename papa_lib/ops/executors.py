"""Where a grid's runs execute: one after another in this process, or as tasks on a Ray cluster.

A grid (:func:`~papa_lib.experiments.grid.load_grid`, :func:`~papa_lib.experiments.grid.grid_runs`) fixes its
runs and their run ids; an executor only decides where they run, so both executors give the same records (same run
ids, and the same numbers for the same seeds once the thread count is pinned).

* :class:`LocalExecutor` (the default) is :func:`~papa_lib.experiments.grid.run_grid`: one run after another.
* :class:`RayExecutor` makes each run (task, variant, seed) one `Ray <https://docs.ray.io>`_ task with the CPUs and
  GPUs it asks for, on a local Ray instance (started here) or an existing cluster (``address``). Work that several
  runs share is computed once, by tasks the runs depend on:

  - per task, its constant matrices (Eq. 2; Sec. 3.1) from its own training text and from every ``matrices_from``
    source (Sec. 5.3), written to ``results_dir/matrices``;
  - per (ranking, source, seed), the head scores of a scored order: λ learned jointly with a probe (Sec. 3.2;
    written to ``results_dir/lambdas``) or a registered label-free score; the runs get them as task arguments;
  - the features of a variant whose backbone does not depend on the seed: the first seed's run caches them and the
    other seeds' runs read them (the driver deletes them once all of them are done; with ``keep_features`` they
    stay, under ``results_dir/features/ray-*``). When they exceed the cache budget the seeds stream in one pass, in
    one task, as the local engine does.

  The driver is the only writer of the results store: it appends the records the run tasks return and, on a
  restart, skips run ids already stored, so a driver stopped with Ctrl-C or killed resumes without losing a finished
  run. Ray retries a run whose worker dies (``max_retries``). Workers write matrices, λ, features and curves into the
  results folder, so **every worker must see the results folder** (and the data) at the same path: a shared file
  system. :meth:`RayExecutor.run_grid` checks that on every node at start and fails with a clear error otherwise.

``ray`` is an optional dependency (``pip install -e ".[ray]"``), imported only on the Ray path.
"""

from __future__ import annotations

import hashlib
import logging
import shutil
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from ..core import registry
from ..core.decoders import load_model
from ..errors import PapaInputError
from ..experiments import engine, matrices, rankings, results
from ..experiments.features import FeatureStore
from ..experiments.grid import grid_runs, grid_settings, run_grid, task_config
from ..experiments.variants import Variant

#: Hidden file through which workers prove that they see the driver's results folder.
_TOKEN_PREFIX = ".papa-ray-check-"
#: Folder (under ``results_dir/features``) of a Ray task's features.
_FEATURES_PREFIX = "ray-"


class LocalExecutor:
    """Today's loop: every run in this process, one after another (:func:`grid.run_grid`)."""

    name = "local"

    def run_grid(self, spec: dict, results_dir, model=None, tokenizer=None, progress: bool = True,
                 overrides: dict | None = None, only_seeds=None) -> results.ResultsStore:
        return run_grid(spec, results_dir, model, tokenizer, progress=progress, overrides=overrides,
                        only_seeds=only_seeds)


def make_executor(name: str = "local", **options):
    """``"local"`` (no options) or ``"ray"`` (options of :class:`RayExecutor`)."""
    if name == "local":
        if any(value is not None for value in options.values()):
            given = sorted(k for k, v in options.items() if v is not None)
            raise PapaInputError(f"options {given} need --executor ray")
        return LocalExecutor()
    if name == "ray":
        return RayExecutor(**{k: v for k, v in options.items() if v is not None})
    raise PapaInputError(f"unknown executor {name!r}; choose local or ray")


# ---------------------------------------------------------------------------------------------- the plan (driver)
@dataclass
class Unit:
    """One Ray task's runs: a variant of a task with one seed (or, streamed, all its pending seeds)."""

    task: str
    variant: Variant
    seeds: tuple[int, ...]
    run_ids: tuple[str, ...]
    features: str = ""        # folder (under results_dir/features) of its cached features
    keep: bool = False        # keep the features after the run (the other seeds' runs read them)
    after: int | None = None  # index of the unit whose cached features it reads
    store_seeds: tuple[int, ...] = ()  # the seeds whose rows the shared feature store covers (all its units')


@dataclass
class GridPlan:
    """A grid's runs as Ray tasks: ``units`` to run, how many runs exist and how many are already stored."""

    settings: dict
    seeds: list[int]
    units: list[Unit] = field(default_factory=list)
    constants: dict[str, list[tuple]] = field(default_factory=dict)   # task -> [(source, kind)]
    total: int = 0
    finished: int = 0


def plan_grid_units(spec: dict, results_dir, model, tokenizer, settings: dict, seeds: list[int],
                    only_seeds=None) -> GridPlan:
    """The grid's runs (same variants, seeds and run ids as :func:`grid.run_grid`) not yet in the store, grouped
    into Ray tasks (see the module docstring); needs the data, not the backbone."""
    store = results.ResultsStore(results_dir)
    done = set(store.run_ids())
    run_seeds = [s for s in seeds if only_seeds is None or s in only_seeds]
    plan = GridPlan(settings, seeds)
    for task, variants in grid_runs(spec["blocks"]).items():
        experiment = engine.TaskExperiment(task_config(settings, task, seeds), model, tokenizer,
                                           results_dir=results_dir, progress=False)
        needs: list[tuple] = []
        for variant in variants:
            ids = {seed: engine.run_id(experiment, variant, seed) for seed in run_seeds}
            pending = engine.pending_seeds(experiment, variant, run_seeds, done, ids)
            plan.total += len(run_seeds)
            plan.finished += len(run_seeds) - len(pending)
            if not pending:
                continue
            entry = matrices.matrix_type(variant.matrix_type)
            for need in ([(variant.matrices_from, entry.constants)] if entry.constants else []) + \
                    ([(variant.matrices_from, "average")] if variant.needs_lambdas else []):
                if need not in needs:
                    needs.append(need)
            shared = variant.frozen and not variant.backbone_per_seed(experiment.config.lambda_seed) \
                and len(pending) > 1
            if shared and not engine.use_cache(experiment, pending):  # streamed: all seeds in one backbone pass
                plan.units.append(Unit(task, variant, tuple(pending), tuple(ids[s] for s in pending),
                                       _folder(ids[pending[0]])))
            elif shared:  # the first seed caches the features, the others read them
                folder = _folder(*(ids[s] for s in run_seeds))
                first = len(plan.units)
                for seed in pending:
                    plan.units.append(Unit(task, variant, (seed,), (ids[seed],), folder, keep=True,
                                           after=None if seed == pending[0] else first, store_seeds=tuple(pending)))
            else:
                plan.units.extend(Unit(task, variant, (seed,), (ids[seed],), _folder(ids[seed])) for seed in pending)
        if needs:
            plan.constants[task] = needs
    return plan


def _folder(*parts: str) -> str:
    return _FEATURES_PREFIX + hashlib.sha256("\0".join(parts).encode()).hexdigest()[:16]


# ---------------------------------------------------------------------------------------------- worker side
@dataclass
class WorkerContext:
    """What every Ray task needs besides the model: the grid's settings, the folder, and what the driver registered
    beyond ``papa_lib``'s built-ins (:func:`papa_lib.core.registry.extensions`: tasks of your own, a matrix type from
    a script; a worker has every built-in from ``import papa_lib``)."""

    settings: dict
    seeds: list[int]
    results_dir: str
    token: str
    extensions: dict
    threads: int = 1
    before_run: Callable | None = None


def _check_visible(context: WorkerContext) -> None:
    host, seen, _ = sees_folder(context.results_dir, context.token, None)
    if not seen:
        raise FileNotFoundError(f"the Ray worker on {host} does not see the driver's results folder "
                                f"{context.results_dir}: put it on a file system every node mounts at the same path")


@dataclass
class PortableModel:
    """A model as the object store can carry it: its class, config and weights (a model that has run carries
    hooks that do not pickle), plus its tokenizer; :meth:`build` gives the same model in eval mode."""

    model_class: type
    config: object
    state: dict
    model_id: str
    tokenizer: object

    @classmethod
    def of(cls, model, tokenizer) -> PortableModel:
        from ..core.models import model_id

        state = {name: tensor.detach().cpu() for name, tensor in model.state_dict().items()}
        return cls(type(model), model.config, state, model_id(model), tokenizer)

    def build(self):
        model = self.model_class(self.config)
        floating = [tensor.dtype for tensor in self.state.values() if tensor.is_floating_point()]
        if floating:
            model.to(floating[0])
        model.load_state_dict(self.state)
        model.papa_model_id = self.model_id
        return model.eval(), self.tokenizer


#: The model a worker process built for the grid it serves (the object-store copy is fetched and built once).
_BUILT: dict = {}


def _model(context: WorkerContext, boxed: list):
    """``(model, tokenizer)`` of the driver, built once per worker process and grid; the tasks of a grid share it in
    a process as the runs share one model in the local executor. ``boxed`` holds the object reference, unresolved."""
    if _BUILT.get("token") != context.token:
        import ray

        _BUILT.clear()
        _BUILT.update(token=context.token, model=ray.get(boxed[0]).build())
    return _BUILT["model"]


def _open(context: WorkerContext, boxed: list, task: str, features: str = "", keep: bool = False):
    """A :class:`engine.TaskExperiment` of ``task`` in a worker (pinned threads, the driver's extensions)."""
    import torch

    _check_visible(context)
    registry.install(context.extensions)
    torch.set_num_threads(context.threads)
    model, tokenizer = _model(context, boxed)
    settings = dict(context.settings, keep_features=True) if keep else context.settings
    config = task_config(settings, task, context.seeds)
    experiment = engine.TaskExperiment(config, model.to(config.device), tokenizer, results_dir=context.results_dir,
                                       progress=False)
    if features:
        experiment.features_store = FeatureStore(Path(context.results_dir) / "features" / features)
    return experiment


def constants_task(context: WorkerContext, boxed: list, task: str, needs, *dependencies) -> list:
    """Ray task: a task's constant matrices (Eq. 2) for every ``(source, kind)`` its runs use, saved to disk."""
    experiment = _open(context, boxed, task)
    for source, kind in needs:
        engine.constants(experiment, source, kind)
    return list(needs)


def scores_task(context: WorkerContext, boxed: list, task: str, order: str, matrices_from, seed: int,
                *dependencies):
    """Ray task: per-head scores of a scored order for one seed (λ, Sec. 3.2, or a label-free score)."""
    return engine.head_scores(_open(context, boxed, task), order, matrices_from, seed)


def run_task(context: WorkerContext, boxed: list, unit: Unit, score_keys: list, *dependencies) -> list[dict]:
    """Ray task: the records of a unit's runs (computed, not stored: the driver appends them)."""
    if context.before_run is not None:
        context.before_run(unit)
    experiment = _open(context, boxed, unit.task, unit.features, unit.keep)
    # scores computed once, by their own tasks, keyed (order, matrices_from, seed)
    experiment.given_scores.update(zip(score_keys, dependencies[1:1 + len(score_keys)]))
    return experiment.compute_records(unit.variant, list(unit.seeds), store_seeds=unit.store_seeds or None)


def sees_folder(results_dir: str, token: str, data_dir: str | None) -> tuple[str, bool, bool]:
    """Ray task (one per node): ``(host, sees the results folder, sees the data folder)``."""
    import socket

    path = Path(results_dir) / f"{_TOKEN_PREFIX}{token}"
    seen = path.is_file() and path.read_text() == token
    return socket.gethostname(), seen, data_dir is None or Path(data_dir).is_dir()


def write_token(results_dir: Path, token: str) -> Path:
    path = Path(results_dir) / f"{_TOKEN_PREFIX}{token}"
    path.write_text(token)
    return path


# ---------------------------------------------------------------------------------------------- the Ray executor
@dataclass
class RayExecutor:
    """Run a grid as Ray tasks (see the module docstring).

    ``address``: an existing cluster (``"auto"``, ``"ray://head:10001"``, ``"head:6379"``); None starts a local Ray
    instance with ``num_cpus`` CPUs (default: all) that stops when the grid is done (a running one in this process is
    reused). ``cpus_per_run``/``gpus_per_run``: the resources of every task (torch uses ``cpus_per_run`` threads);
    with GPUs and no ``device`` in the grid, runs use ``cuda``. ``max_retries``: how often Ray reruns a task whose
    worker died. ``before_run(unit)`` runs in the worker before a run (tests use it to kill a worker).
    """

    address: str | None = None
    cpus_per_run: float = 1
    gpus_per_run: float = 0
    num_cpus: int | None = None
    max_retries: int = 3
    before_run: Callable | None = None
    name: str = "ray"

    def run_grid(self, spec: dict, results_dir, model=None, tokenizer=None, progress: bool = True,
                 overrides: dict | None = None, only_seeds=None) -> results.ResultsStore:
        """Like :func:`grid.run_grid` (same runs, same records), on Ray; returns the store."""
        try:
            import ray
        except ImportError:
            raise ImportError("the ray executor needs Ray: pip install -e \".[ray]\" (or pip install ray)") from None
        from ..experiments import custom

        custom.register_custom_tasks(spec.get("custom_tasks"))
        results_dir = Path(results_dir).resolve()
        store = results.ResultsStore(results_dir)
        settings, seeds = grid_settings(spec, overrides)
        if settings.get("data_dir"):
            settings["data_dir"] = str(Path(settings["data_dir"]).resolve())  # not in run ids (the data's hash is)
        if self.gpus_per_run and "device" not in settings:
            settings["device"] = "cuda"
        if str(settings.get("device", "cpu")).startswith("cuda") and not self.gpus_per_run:
            raise PapaInputError(f"device {settings['device']} needs GPUs per run (--gpus-per-run 1, or 0.5 for two "
                                 "runs on a GPU): Ray hides the GPUs from tasks that do not ask for them")
        if model is None:
            model, tokenizer = load_model(settings.get("model"), device="cpu")  # encoder or decoder LM
        plan = plan_grid_units(spec, results_dir, model, tokenizer, settings, seeds, only_seeds)
        if not plan.units:
            return store
        started = not ray.is_initialized()
        if started:
            if self.address:
                ray.init(address=self.address, logging_level=logging.WARNING)
            else:
                ray.init(address="local", num_cpus=self.num_cpus, include_dashboard=False,
                         logging_level=logging.WARNING)
        token = uuid.uuid4().hex
        marker = write_token(results_dir, token)
        try:
            self._check_cluster(ray, results_dir, token, settings.get("data_dir"), local=started and not self.address)
            context = WorkerContext(settings, seeds, str(results_dir), token, registry.extensions(),
                                    max(1, round(self.cpus_per_run)), self.before_run)
            self._execute(ray, plan, context, PortableModel.of(model, tokenizer), store, progress)
        finally:
            marker.unlink(missing_ok=True)
            if started:
                ray.shutdown()
        return store

    def _check_cluster(self, ray, results_dir: Path, token: str, data_dir, local: bool) -> None:
        """Every node sees the results folder (and the data); the cluster has the resources a run asks for."""
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        check = ray.remote(num_cpus=0)(sees_folder)
        nodes = [node for node in ray.nodes() if node.get("Alive")]
        answers = ray.get([check.options(scheduling_strategy=NodeAffinitySchedulingStrategy(node["NodeID"], soft=False))
                           .remote(str(results_dir), token, data_dir) for node in nodes])
        blind = [host for host, seen, _ in answers if not seen]
        if blind:
            raise FileNotFoundError(f"Ray node(s) {', '.join(sorted(set(blind)))} do not see the results folder "
                                    f"{results_dir}: every worker writes there (matrices, λ, features, curves), so put "
                                    "it on a file system all nodes mount at the same path (--results-dir)")
        no_data = [host for host, _, data in answers if not data]
        if no_data:
            raise FileNotFoundError(f"Ray node(s) {', '.join(sorted(set(no_data)))} do not see the data folder "
                                    f"{data_dir}: put it on a shared file system too")
        available = ray.cluster_resources()
        for resource, asked in (("CPU", self.cpus_per_run), ("GPU", self.gpus_per_run)):
            if asked and available.get(resource, 0) < asked:
                message = (f"a run asks for {asked:g} {resource}(s) but the Ray cluster has "
                           f"{available.get(resource, 0):g}")
                if local:
                    raise PapaInputError(message)
                logging.getLogger(__name__).warning("%s; runs wait until the cluster grows", message)

    def _execute(self, ray, plan: GridPlan, context: WorkerContext, portable, store, progress) -> None:
        """Submit the tasks (shared work first, as dependencies), append records as runs finish."""
        from tqdm.auto import tqdm

        options = dict(num_cpus=self.cpus_per_run, num_gpus=self.gpus_per_run, max_retries=self.max_retries)
        constants_remote = ray.remote(constants_task).options(**options)
        scores_remote = ray.remote(scores_task).options(**options)
        run_remote = ray.remote(run_task).options(**options)
        context_ref, model_ref = ray.put(context), [ray.put(portable)]  # boxed: fetched by a worker only once

        constants_refs: dict[str, object] = {}
        foreign = lambda task: any(s not in (None, task) for s, _ in plan.constants[task])  # noqa: E731
        for task in sorted(plan.constants, key=foreign):  # a source task's own matrices before its borrowers'
            sources = [constants_refs[s] for s, _ in plan.constants[task] if s in constants_refs and s != task]
            constants_refs[task] = constants_remote.remote(context_ref, model_ref, task, plan.constants[task], *sources)
        score_refs: dict[tuple, object] = {}
        run_refs: dict[object, Unit] = {}
        by_index: list = []
        for unit in plan.units:
            variant, keys, scores = unit.variant, [], []
            if variant.needs_scores:
                for seed in unit.seeds:
                    ranking = rankings.head_ranking(variant.selection_order)
                    key = (ranking.scores, variant.matrices_from, seed)
                    if key not in score_refs:
                        score_refs[key] = scores_remote.remote(
                            context_ref, model_ref, unit.task, variant.selection_order, variant.matrices_from, seed,
                            constants_refs.get(unit.task))
                    keys.append((variant.selection_order, variant.matrices_from, seed))
                    scores.append(score_refs[key])
            after = [by_index[unit.after]] if unit.after is not None else []
            ref = run_remote.remote(context_ref, model_ref, unit, keys, constants_refs.get(unit.task), *scores, *after)
            by_index.append(ref)
            run_refs[ref] = unit

        readers: dict[str, int] = {}
        for unit in plan.units:
            readers[unit.features] = readers.get(unit.features, 0) + 1
        bar = tqdm(total=plan.total, initial=plan.finished, disable=not progress, desc="grid runs (ray)")
        failures = []
        try:
            while run_refs:
                ready, _ = ray.wait(list(run_refs), num_returns=1)
                unit = run_refs.pop(ready[0])
                try:
                    records = ray.get(ready[0])
                except Exception as error:  # a run's own error: keep the others, report it at the end
                    failures.append(error)
                    logging.getLogger(__name__).warning("run %s failed: %s", " ".join(unit.run_ids),
                                                        str(error).splitlines()[0] if str(error) else repr(error))
                else:
                    self._store(records, unit, store)
                readers[unit.features] -= 1
                if not readers[unit.features] and not context.settings.get("keep_features"):
                    shutil.rmtree(Path(context.results_dir) / "features" / unit.features, ignore_errors=True)
                bar.set_postfix_str(f"{unit.task} {unit.variant.matrix_type} {unit.variant.selection_order} "
                                    f"{unit.variant.fraction:g}")
                bar.update(len(unit.seeds))
        finally:
            bar.close()
            for ref in run_refs:
                ray.cancel(ref)
        if failures:
            raise failures[0]

    @staticmethod
    def _store(records: list[dict], unit: Unit, store: results.ResultsStore) -> None:
        """Append a finished unit's records, each once; a run id the driver did not expect is an error."""
        for record in records:
            if record["run_id"] not in unit.run_ids:
                raise RuntimeError(f"a Ray worker computed run id {record['run_id']} where the driver expected "
                                   f"{', '.join(unit.run_ids)} ({unit.task}): does it see other data or a different "
                                   "papa_lib?")
            if not store.has(record["run_id"]):
                store.append(record)
            engine.drop_checkpoint(store.root, record["run_id"])
