"""Declared grids (``data/results/*/grid.yaml``): blocks of variants per task, read, planned and run in order.

A grid file holds top-level settings (model, data, seeds, per-task limits and hyperparameters; :func:`run_grid` lists
them) and ``blocks``: each :class:`GridBlock` is the cross product of its matrix types, orders and fractions for
each of its tasks (the paper's Fig. 2, Tables 1-2, Fig. 5). :func:`grid_runs` turns blocks into each task's
deduplicated canonical :class:`~papa_lib.experiments.variants.Variant` list; :func:`run_grid` runs them one after
another with :class:`~papa_lib.experiments.engine.TaskExperiment`, resuming (finished run ids are skipped). The
Ray executor (:mod:`papa_lib.ops.executors`) runs the same runs elsewhere.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from ..core.decoders import load_model
from ..core.models import resolve_device
from . import custom, results, selection
from .engine import TaskExperiment
from .features import parse_bytes
from .variants import Variant
from .workspace import ExperimentConfig

__all__ = [
    "GridBlock", "block_variants", "grid_runs", "grid_seeds", "grid_settings", "load_grid", "per_task_value",
    "run_grid", "task_config",
]

@dataclass
class GridBlock:
    """One block of a declared grid: the cross product of its lists, for each task."""

    name: str
    tasks: list[str]
    matrix_types: list[str] = field(default_factory=lambda: ["average"])
    orders: list[str] = field(default_factory=lambda: ["lambda"])
    fractions: list[float] = field(default_factory=lambda: list(selection.PAPER_FRACTIONS))
    matrices_from: str | None = None


def load_grid(path: str | Path) -> dict:
    """Read and check a grid YAML file: top-level settings plus ``blocks`` (see ``data/results/*/grid.yaml``).

    Every key, type and range is checked before anything runs (:mod:`papa_lib.experiments.specs`): a problem raises
    :class:`~papa_lib.experiments.specs.SpecError`, one line ``<file>:<line>: <what>`` (an unknown key names the
    closest valid one). The file's ``custom_tasks`` are then registered (their files checked) and ``blocks`` become
    :class:`GridBlock` objects; the other settings are returned as written.
    """
    from .specs import validate_grid

    path = Path(path)
    spec, root = validate_grid(path)
    # tasks of your own (issue 11), registered now so that blocks may name them
    if spec.get("custom_tasks") is not None:
        spec["custom_tasks"] = custom.register_custom_tasks(spec["custom_tasks"], base=path.parent, where=str(path),
                                                            root=root)
    spec["blocks"] = [GridBlock(**block) for block in spec["blocks"]]
    return spec


def block_variants(block) -> Iterator[tuple[str, str, Variant]]:
    """(block name, task, canonical :class:`~papa_lib.experiments.variants.Variant`) for every run of a grid block,
    task by task, then matrix type, order and fraction, without repeats inside the block.

    ``block`` is a :class:`GridBlock` or a plain mapping with the same keys; a missing (or empty) ``tasks``,
    ``matrix_types`` or ``orders`` is none, ``["average"]`` and ``["lambda"]``, a missing ``fractions`` the paper's.
    """
    get = block.get if isinstance(block, Mapping) else (lambda key: getattr(block, key, None))
    fractions = get("fractions") if get("fractions") is not None else list(selection.PAPER_FRACTIONS)
    for task in get("tasks") or []:
        seen = []
        for matrix_type in get("matrix_types") or ["average"]:
            for order in get("orders") or ["lambda"]:
                for fraction in fractions:
                    variant = Variant.make(matrix_type, order, fraction, get("matrices_from"))
                    if variant not in seen:
                        seen.append(variant)
                        yield get("name"), task, variant


def grid_runs(blocks: Iterable[GridBlock]) -> dict[str, list[Variant]]:
    """Deduplicated canonical variants per task, in a cache-friendly order (grouped by variant): the runs of
    :func:`block_variants`, block after block, a variant that several blocks declare once."""
    per_task: dict[str, list[Variant]] = {}
    for block in blocks:
        for _, task, variant in block_variants(block):
            variants = per_task.setdefault(task, [])
            if variant not in variants:
                variants.append(variant)
    return per_task


def run_grid(spec: dict, results_dir: str | Path, model=None, tokenizer=None, progress: bool = True,
             overrides: dict | None = None, only_seeds=None) -> results.ResultsStore:
    """Run every run of a declared grid, resuming: finished runs (same run id) are skipped.

    ``spec`` is :func:`load_grid`'s output. Top-level keys: ``model``, ``data_dir``, ``profile``, ``seeds`` (list or
    count), ``limit`` (probe training rows per seed), ``average_limit`` (examples the constant matrices average over;
    default all), ``eval_limit``, ``max_length`` (int or per-task mapping with ``default``), ``epochs``,
    ``patience``, ``cache_budget``, ``lambda_epochs``, ``lambda_seed`` (one λ for every seed; default: λ per seed),
    ``inloop_epochs``, ``inloop_limit``, ``matrix_learning_rate``,
    ``lambda_learning_rate``, ``learning_rate``, ``batch_size``, ``device`` (each of
    the per-task ones may be a mapping ``{task: value, default: value}``). ``overrides`` replace top-level keys (the
    CLI's flags). A ``language_model`` section (a decoder's own next-token loss, :mod:`papa_lib.experiments.lm`)
    runs before the blocks, resuming the same way; its records go to ``results_dir/lm/results.csv``.
    ``only_seeds`` runs a subset of the seeds (a shard); subsets and stores stay those of the full seed list.
    """
    from tqdm.auto import tqdm

    custom.register_custom_tasks(spec.get("custom_tasks"))  # tasks of your own (issue 11), registered by load_grid too
    settings, seeds = grid_settings(spec, overrides)
    if model is None:
        model, tokenizer = load_model(settings.get("model"), device=settings.get("device", "cpu"))
    store = results.ResultsStore(results_dir)
    if spec.get("language_model") is not None:  # first: its λ ranks the heads of the blocks' lm_lambda order
        from . import lm

        lm.run_language_model(model, tokenizer, lm.LMSettings.from_mapping(spec["language_model"]), results_dir,
                              settings.get("data_dir"), progress=progress)
    plan = grid_runs(spec["blocks"])
    run_seeds = [s for s in seeds if only_seeds is None or s in only_seeds]
    total = sum(len(v) for v in plan.values()) * len(run_seeds)
    bar = tqdm(total=total, disable=not progress, desc="grid runs")
    for task, variants in plan.items():
        config = task_config(settings, task, seeds)
        experiment = TaskExperiment(config, model, tokenizer, results_dir=results_dir, progress=progress)
        for variant in variants:
            bar.set_postfix_str(f"{task} {variant.matrix_type} {variant.selection_order} {variant.fraction:g}")
            experiment.run_variant(variant, run_seeds)
            bar.update(len(run_seeds))
        del experiment
    bar.close()
    return store


def grid_settings(spec: dict, overrides: dict | None = None) -> tuple[dict, list[int]]:
    """A grid's top-level settings with the command line's ``overrides`` applied, and its list of seeds."""
    settings = {k: v for k, v in spec.items() if k != "blocks"}
    settings.update({k: v for k, v in (overrides or {}).items() if v is not None})
    settings["device"] = resolve_device(settings.get("device"))  # auto: CUDA when there is one
    if settings.get("cache_budget") is not None:  # a grid file's "9G" -> bytes (the CLI's flag is parsed already)
        settings["cache_budget"] = parse_bytes(settings["cache_budget"])
    return settings, grid_seeds(settings)


def grid_seeds(spec: Mapping) -> list[int]:
    """The seeds a grid's settings declare: ``seeds`` a count n (seeds 0 to n-1) or a list of seeds; default 3."""
    seeds = spec.get("seeds", 3)
    return list(range(seeds)) if isinstance(seeds, int) else [int(s) for s in seeds]


def task_config(settings: dict, task: str, seeds) -> ExperimentConfig:
    """The :class:`ExperimentConfig` of one task of a grid (per-task settings resolved)."""
    return ExperimentConfig(
        task=task,
        model=settings.get("model"),
        data_dir=settings.get("data_dir"),
        profile=settings.get("profile", "local"),
        limit=per_task_value(settings.get("limit"), task),
        average_limit=per_task_value(settings.get("average_limit"), task),
        eval_limit=per_task_value(settings.get("eval_limit"), task),
        max_length=per_task_value(settings.get("max_length"), task),
        epochs=per_task_value(settings.get("epochs"), task),
        patience=per_task_value(settings.get("patience"), task) or 3,
        lambda_epochs=per_task_value(settings.get("lambda_epochs"), task),
        inloop_epochs=per_task_value(settings.get("inloop_epochs"), task),
        inloop_limit=per_task_value(settings.get("inloop_limit"), task),
        matrix_learning_rate=per_task_value(settings.get("matrix_learning_rate"), task),
        lambda_learning_rate=per_task_value(settings.get("lambda_learning_rate"), task),
        learning_rate=per_task_value(settings.get("learning_rate"), task),
        batch_size=per_task_value(settings.get("batch_size"), task),
        lambda_seed=settings.get("lambda_seed"),
        seeds=tuple(seeds),
        cache_budget=settings.get("cache_budget"),
        keep_features=bool(settings.get("keep_features", False)),
        device=settings.get("device", "cpu"),
    )


def per_task_value(value, task: str):
    """One task's value of a grid setting: ``value`` itself, or for a mapping by task its entry for ``task``, else
    its ``default`` (None when neither is there)."""
    if isinstance(value, Mapping):
        return value.get(task, value.get("default"))
    return value
