"""The papa command: PAPA's steps from the shell (paper Sec. 3-5), with progress bars.

Commands:
  papa averages   build constant matrices C^h for a task's training text (Sec. 3.1) and save them
  papa select     learn lambda per head (Sec. 3.2) and print/save the replacement order
  papa probe      probe variants (matrix type x order x fraction) of a task and append records (Sec. 3.3, 4, 5)
  papa grid       run a declared grid of runs from a YAML file, resuming where it stopped (its keys: the book's
                  "Appendix: grid-file reference"; --executor ray runs it on a Ray cluster)
  papa bench      speed and memory benchmarks (see BENCHMARKS.md)
  papa reproduce  execute every book chapter through papermill for a profile (smoke, local, paper)
  papa book       sync the chapter notebooks and build the HTML book

Data: --data-dir names a folder laid out like ../shared/data. Without it, averages, select and probe read
../shared/data beside the checkout when it exists (as the chapters do), else the packaged data sample for the
tasks it holds (sst2; one line says so), else the Hugging Face hub. papa grid reads the file's data_dir (the
sample stands in when that folder lacks the files of a task the sample holds), else the hub. Records
(results.csv), constant matrices and lambda go to --results-dir (default: data/results/cli; papa grid: the grid
file's folder). probe and grid end with a table of what they measured (mean and 95% interval over seeds) and
how many records were computed and how many reused (already stored). --task custom probes a task of your own
from TSV/CSV files; papa grid FILE --repair keeps every intact record of a damaged results table.

Errors: bad input (a bad or empty file, a bad value or setting, an unsupported model, a wrong L, a missing file
or folder, invalid YAML, a bad command line) and an environment that cannot provide something (an unreachable
hub, a packaged model not installed) print one line, "papa: error: <what> (<file>:<line>)", to stderr and exit
with 2; --debug adds the traceback. These are the errors papa_lib raises on purpose (papa_lib.errors.PapaError
and its subclasses, such as PapaInputError), a path that is missing, not a folder or not allowed, invalid YAML
and a bad command line. A failing chapter (papa book, papa reproduce) prints one line naming the chapter and the
cell, and exits with 1. Anything else, a plain ValueError from inside the library included, is a bug and shows
its traceback.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from pathlib import Path

from .errors import PapaError, PapaInputError  # a leaf: nothing heavy is imported before a command needs it

CUSTOM = "custom"
_CUSTOM_OPTIONS = ("train", "validation", "text_columns", "label_column", "metric", "delimiter", "name")


class UsageError(Exception):
    """A bad command line (what argparse would print under the usage text)."""


class _Formatter(argparse.HelpFormatter):
    """Help that shows every default: an option whose help does not say its default gets ``(default: ...)``."""

    def _get_help_string(self, action):
        text = action.help or ""
        if (not action.option_strings or action.nargs == 0 or action.required or action.default is None
                or action.default is argparse.SUPPRESS or "default" in text):
            return text
        value = action.default
        shown = " ".join(f"{v:g}" if isinstance(v, float) else str(v) for v in value) \
            if isinstance(value, (list, tuple)) else str(value)
        return f"{text} (default: {shown.replace('%', '%%')})"


class _RawFormatter(argparse.RawDescriptionHelpFormatter, _Formatter):
    """:class:`_Formatter` that keeps the description's lines (the top-level help: the module docstring)."""


class _Parser(argparse.ArgumentParser):
    """argparse with one-line errors: :func:`main` prints them as ``papa: error: ...`` and exits with 2; help
    shows every default (:class:`_Formatter`)."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("formatter_class", _Formatter)
        super().__init__(*args, **kwargs)

    def error(self, message):
        raise UsageError(f"{message} (see '{self.prog} --help')")


#: the name ``papa grid --blocks`` gives a grid file's ``language_model`` section
LM_SECTION = "language_model"

def _number(text: str, convert, ok, what: str, out_of_range: str | None = None):
    """``convert(text)`` when it converts and ``ok`` holds for it; else argparse's error "expected <what>, got
    <text>" (``out_of_range``: the words instead of ``what`` for a number that converts but is not ``ok``)."""
    try:
        value = convert(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None
    if not ok(value):
        raise argparse.ArgumentTypeError(f"expected {out_of_range or what}, got {text!r}")
    return value


def _positive_int(text: str) -> int:
    return _number(text, int, lambda value: value >= 1, "a positive integer")


def _positive_float(text: str) -> float:
    return _number(text, float, lambda value: value > 0, "a positive number")


def _non_negative_float(text: str) -> float:
    return _number(text, float, lambda value: not value < 0, "a number", "zero or more")  # NaN is not < 0: it passes


def _device(text: str) -> str:
    """``--device``: a name torch knows (:data:`papa_lib.core.models.DEVICE_NAMES`), else argparse's error."""
    from .core.models import DEVICE_NAMES

    if not DEVICE_NAMES.fullmatch(text):
        raise argparse.ArgumentTypeError(f"expected auto, cpu, cuda, cuda:N or mps, got {text!r}")
    return text


def _shared(parser: argparse.ArgumentParser, task_required: bool = True, custom: bool = True) -> None:
    """The options every probing command shares (``custom=False``: papa grid's, whose defaults are the file's)."""
    from .experiments.task_specs import TASKS

    group = parser.add_argument_group("shared options")
    group.add_argument(
        "--model",
        default=None,
        help="hub id, local folder, all-mpnet-base-v2 (the mpnet extra) or the decoder LM gemma-3-270m (the gemma "
             "extra); default: the embedded all-MiniLM-L6-v2",
    )
    if custom:
        group.add_argument("--task", required=task_required, choices=sorted(TASKS) + [CUSTOM],
                           help="downstream task, or 'custom' for your own files (see below)")
    else:
        group.add_argument("--task", default=None, help="run only this task of the grid (default: every task)")
    group.add_argument(
        "--data-dir", default=None,
        help="local data folder laid out like ../shared/data (an error if it does not exist); default: "
             + ("the file's data_dir, else the hub (the packaged sample stands in for a data_dir that lacks sst2)"
                if not custom else "../shared/data beside the checkout when it exists, else the packaged sample "
                "for sst2 (one line says so), else the hub")
    )
    group.add_argument(
        "--max-length", type=_positive_int, default=None,
        help="sequence length L (default: " + ("the file's max_length, else " if not custom else "")
             + "paper Table 3 per task)"
    )
    group.add_argument("--limit", type=_positive_int, default=None, metavar="N",
                       help="train each seed's probe on a seeded subset of N training examples; the constant matrices "
                            "still average over the whole training set (see --average-limit); default: "
                            + ("the file's limit, else " if not custom else "") + "every training example")
    group.add_argument("--average-limit", type=_positive_int, default=None, metavar="N",
                       help="average the constant matrices (Eq. 2) over a seeded subset of N training examples "
                            "(default: the whole training set, as the paper does); records state it (average_limit)")
    group.add_argument(
        "--seeds", type=_positive_int, default=None, help="number of seeds (0..N-1); default 3 (grid: the file's value)"
    )
    group.add_argument("--epochs", type=_positive_int, default=None,
                       help="probe epochs (default: " + ("the file's epochs, else " if not custom else "") + "Table 3)")
    group.add_argument("--device", type=_device, default=None,
                       help="cpu, cuda, cuda:1, ... or auto (CUDA when torch sees a GPU, else cpu); default: cpu "
                            "(grid: the file's device)")
    group.add_argument("--results-dir", default="data/results/cli" if custom else None,
                       help="where records (results.csv), constant matrices and λ are stored"
                            + ("" if custom else " (default: the grid file's folder)"))
    if custom:
        group = parser.add_argument_group(
            "your own task (--task custom)",
            "Single-text or pair classification from TSV/CSV files with a header row; the label set is the "
            "training file's, sorted. Defaults: SST-2's row of Table 3, L = 128.")
        group.add_argument("--train", metavar="FILE",
                           help="training file (.tsv or .csv, header row); required with --task custom")
        group.add_argument("--validation", metavar="FILE",
                           help="validation file (results are reported on it); required with --task custom")
        group.add_argument("--text-columns", metavar="A[,B]",
                           help="text column, or two columns for a pair; required with --task custom")
        group.add_argument("--label-column", metavar="C",
                           help="label column (strings or integers); required with --task custom")
        group.add_argument("--metric", choices=["accuracy", "f1", "mcc"], default=None,
                           help="accuracy (default), f1 (positive class = second sorted label), mcc")
        group.add_argument(
            "--delimiter", default=None, help="field separator (default: from the extension; 'tab' for a tab)"
        )
        group.add_argument("--name", default=None, help="the task's name in records (default: custom)")


def _register_custom(args) -> None:
    """``--task custom``: register the files as a task (its name replaces ``args.task``)."""
    given = [f"--{key.replace('_', '-')}" for key in _CUSTOM_OPTIONS if getattr(args, key, None) is not None]
    if args.task != CUSTOM:
        if given:
            raise UsageError(f"{', '.join(given)} only appl{'ies' if len(given) == 1 else 'y'} to --task custom")
        return
    missing = [f"--{key.replace('_', '-')}" for key in _CUSTOM_OPTIONS[:4] if getattr(args, key) is None]
    if missing:
        raise UsageError(f"--task custom needs {', '.join(missing)}")
    from .experiments.custom import CustomTask, register_custom_task

    options = {} if args.epochs is None else {"epochs": args.epochs}
    task = CustomTask(name=args.name or CUSTOM, train=args.train, validation=args.validation,
                      text_columns=args.text_columns, label_column=args.label_column, metric=args.metric or "accuracy",
                      max_length=args.max_length, delimiter=args.delimiter, **options)
    register_custom_task(task)
    args.task = task.name


def _check_data_dir(data_dir) -> None:
    if data_dir is not None and not Path(data_dir).is_dir():
        raise FileNotFoundError(f"data directory not found: {data_dir}")


def _shown(folder: Path) -> str:
    """How a notice names ``folder``: relative to the working directory when it lies near, else in full."""
    try:
        relative = os.path.relpath(folder)
    except ValueError:  # another drive
        return str(folder)
    return str(folder) if relative.startswith(os.path.join(os.pardir, os.pardir)) else relative


def _sample_for(folder, tasks, shown: str | None = None) -> str | None:
    """The packaged sample (with its one-line notice) when every task is one it holds and ``folder`` lacks their
    files; else None."""
    from .experiments.sample_data import SAMPLE_TASKS, data_or_sample, missing_files

    if not tasks or not all(task in SAMPLE_TASKS for task in tasks):
        return None
    needed = [name for task in tasks for name in SAMPLE_TASKS[task]]
    if not missing_files(folder, needed):
        return None
    return str(data_or_sample(folder, shown=shown or _shown(Path(folder)), needed=needed))


def _data_dir(given, tasks) -> str | None:
    """The data folder of averages, select and probe: ``--data-dir`` (an error naming it when it is not a folder);
    else ``../shared/data`` beside the checkout when it exists, as the chapters read it; else the packaged sample
    when it holds every task read (``tasks``: the task and ``--matrices-from``'s; one line says so); else None, the
    hub."""
    if given is not None:
        _check_data_dir(given)
        return given
    from .book.profiles import shared_data_dir

    folder = shared_data_dir()
    sample = _sample_for(folder, tasks)
    if sample is not None:
        return sample
    return str(folder) if folder.is_dir() else None


def _check_length(model, lengths, where: str = "--max-length") -> None:
    from .core.models import check_length

    check_length(model, lengths, where)


def _load_model(name, device):
    from .core.decoders import load_model

    try:
        return load_model(name, device=device)
    except OSError as error:  # transformers' "not found / could not connect" (an unreachable hub), a bad folder
        raise PapaInputError(f"could not load the model {name!r}: {error}") from error


def _experiment(args):
    from .core.models import resolve_device
    from .experiments.engine import TaskExperiment
    from .experiments.workspace import ExperimentConfig

    custom = args.task == CUSTOM
    _register_custom(args)
    if custom:
        _check_data_dir(args.data_dir)
    from .experiments.task_specs import TASKS

    matrices_from = getattr(args, "matrices_from", None)
    if matrices_from is not None and matrices_from not in TASKS:
        raise UsageError(f"--matrices-from {matrices_from}: not a task; choose one of {', '.join(sorted(TASKS))}")
    sources = [args.task] + [name for name in [matrices_from] if name and name != args.task]
    data_dir = args.data_dir if custom else _data_dir(args.data_dir, sources)
    config = ExperimentConfig(
        task=args.task, model=args.model, data_dir=data_dir, max_length=args.max_length, limit=args.limit,
        average_limit=args.average_limit,
        epochs=args.epochs, device=resolve_device(args.device), profile=getattr(args, "profile", "local"),
        lambda_learning_rate=getattr(args, "lambda_lr", None), lambda_epochs=getattr(args, "lambda_epochs", None),
    )
    model, tokenizer = _load_model(args.model, config.device)
    experiment = TaskExperiment(config, model, tokenizer, results_dir=args.results_dir)
    _check_length(experiment.model, [experiment.config.max_length])
    return experiment


def cmd_averages(args) -> int:
    from .experiments import engine

    experiment = _experiment(args)
    constants = engine.constants(experiment, args.matrices_from)
    out = Path(
        args.out
        or Path(args.results_dir)
        / "matrices"
        / f"{args.matrices_from or args.task}-L{constants.max_length}.safetensors"
    )
    constants.save(out)
    meta = constants.metadata
    print(f"saved {constants.num_layers}x{constants.num_heads} constant matrices at L={constants.max_length} "
          f"from {meta['num_examples']} examples ({meta['source']}) to {out}")
    return 0


def cmd_select(args) -> int:
    from .experiments import engine
    from .experiments.selection import replacement_order

    experiment = _experiment(args)
    lambdas = engine.learn_lambdas(experiment, args.matrices_from)
    order = replacement_order("lambda", experiment.layers, experiment.heads, lambdas=lambdas)
    print("layer\thead\tlambda  (replacement order: first line is replaced first)")
    for layer, head in order:
        print(f"{layer}\t{head}\t{float(lambdas[layer, head]):.4f}")
    if args.out:
        import pandas as pd

        rows = [{"rank": i, "layer": layer, "head": h, "lambda": float(lambdas[layer, h])}
                for i, (layer, h) in enumerate(order)]
        pd.DataFrame(rows).to_csv(args.out, index=False)
        print(f"saved to {args.out}")
    return 0


def cmd_probe(args) -> int:
    from .experiments.variants import Variant

    experiment = _experiment(args)
    seeds = range(args.seeds if args.seeds is not None else 3)
    stored = set(experiment.store.run_ids()) if experiment.store.path.is_file() else set()
    records = []
    for matrix_type in args.matrix_type:
        for order in args.order:
            for fraction in args.fraction:
                variant = Variant.make(matrix_type, order, _fraction(fraction), args.matrices_from)
                for seed in seeds:
                    record = experiment.run(variant, seed)
                    records.append(record)
                    print(f"{record['task']}\t{variant.matrix_type}\t{variant.selection_order}\t{variant.fraction:g}\t"
                          f"seed {seed}\t{record['metric']}={record['value']:.4f}")
    _report(records, stored, experiment.store.path)
    return 0


def _report(records, stored: set, path) -> None:
    """The closing lines of probe and grid: what was measured (mean ± 95% interval over seeds, per task, variant
    and metric) and how many of the records were computed now and how many were reused (already in ``path``)."""
    import pandas as pd

    from .experiments.summaries import own_text, summarize

    frame = pd.DataFrame([{key: record.get(key) for key in _TABLE_KEYS + ("seed", "value", "run_id")}
                          for record in records])
    reused = sum(record["run_id"] in stored for record in records)
    if records:
        frame["matrices_from"] = frame["matrices_from"].where(~own_text(frame), "-")
        table = summarize(frame, list(_TABLE_KEYS))
        half = (table["ci_high"] - table["ci_low"]) / 2
        shown = pd.DataFrame({
            "task": table["task"], "matrix type": table["matrix_type"], "order": table["selection_order"],
            "fraction": table["fraction"].map(lambda f: f"{float(f):g}"), "from": table["matrices_from"],
            "metric": table["metric"],
            "mean ± 95% CI": [f"{m:.4f} ± {h:.4f}" if n > 1 else f"{m:.4f} (1 seed)"
                              for m, h, n in zip(table["mean"], half, table["n"])],
            "seeds": table["n"],
        })
        if (shown["from"] == "-").all():
            shown = shown.drop(columns="from")
        rows = [list(shown.columns)] + [[str(cell) for cell in row] for row in shown.itertuples(index=False)]
        widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
        for row in rows:
            print("  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip())
    print(f"{len(records)} records in {path}: {len(records) - reused} computed now, {reused} reused (already stored)")


#: What the closing table groups by: a task's variant and its metric (the seeds are averaged).
_TABLE_KEYS = ("task", "matrix_type", "selection_order", "fraction", "matrices_from", "metric")


def cmd_grid(args) -> int:
    from .core.models import resolve_device
    from .experiments.features import parse_bytes
    from .experiments.grid import grid_settings, load_grid

    if args.plan and args.repair:
        raise UsageError("--plan and --repair: give one (each runs nothing else)")
    spec = load_grid(args.grid)
    if args.task and not any(args.task in block.tasks for block in spec["blocks"]):
        raise UsageError(f"--task {args.task}: no block of {args.grid} runs it")
    _check_data_dir(args.data_dir)
    overrides = {
        "model": args.model, "data_dir": args.data_dir or _grid_sample(spec), "max_length": args.max_length,
        "limit": args.limit,
        "average_limit": args.average_limit,
        "epochs": args.epochs, "device": args.device,
        "seeds": list(range(args.seeds)) if args.seeds is not None else None,
        "cache_budget": parse_bytes(args.cache_budget) if args.cache_budget is not None else None,
    }
    _, seeds = grid_settings(spec, overrides)
    strays = sorted(set(args.only_seed or []) - set(seeds))
    if strays:
        raise UsageError(f"--only-seed {', '.join(map(str, strays))}: not among the seeds {seeds} of {args.grid}")
    if args.task:
        spec["blocks"] = [b for b in spec["blocks"] if args.task in b.tasks]
        for block in spec["blocks"]:
            block.tasks = [args.task]
        spec["language_model"] = None  # a probe task: the language-model section is not one
    if args.blocks:
        names = args.blocks.split(",")
        sections = {b.name for b in spec["blocks"]} | ({LM_SECTION} if spec.get("language_model") else set())
        unknown = sorted(set(names) - sections)
        if unknown:
            raise UsageError(f"{args.grid}: no block named {', '.join(unknown)}")
        spec["blocks"] = [b for b in spec["blocks"] if b.name in names]
        if LM_SECTION not in names:
            spec["language_model"] = None
    if args.plan:
        from .ops.plan import plan_grid

        print(plan_grid(spec, overrides, model_name=args.model,
                        results_dir=args.results_dir or str(Path(args.grid).parent), only_seeds=args.only_seed,
                        length_source="--max-length" if args.max_length else f"max_length of {args.grid}"))
        return 0
    executor = _executor(args)
    results_dir = args.results_dir or str(Path(args.grid).parent)
    if args.repair:
        return _repair(args.grid, results_dir)
    _check_store(args.grid, results_dir)
    device = "cpu" if executor.name == "ray" else resolve_device(args.device or spec.get("device"))  # workers move it
    model, tokenizer = _load_model(args.model or spec.get("model"), device)
    lengths = args.max_length or spec.get("max_length")
    _check_length(model, lengths, "--max-length" if args.max_length else f"max_length of {args.grid}")
    from .experiments.results import ResultsStore

    before = ResultsStore(results_dir)
    stored = set(before.run_ids()) if before.path.is_file() else set()
    try:
        store = executor.run_grid(spec, results_dir, model, tokenizer, overrides=overrides, only_seeds=args.only_seed)
    except ImportError as error:  # --executor ray without Ray installed
        raise UsageError(str(error)) from error
    if spec.get("language_model") is not None:
        _report_language_model(spec["language_model"], results_dir)
    if spec["blocks"]:
        _report(_grid_records(spec, store, model, args.only_seed, overrides), stored, store.path)
    return 0


def _report_language_model(section: dict, results_dir) -> None:
    """The closing lines of a grid's language-model section: each configuration's mean next-token NLL with its
    bootstrap interval over test windows (:func:`papa_lib.book.figures.lm_curve`)."""
    from .book.figures import lm_curve
    from .experiments import lm

    records = lm.lm_records(results_dir)
    settings = lm.LMSettings.from_mapping(section)
    for row in lm_curve(records, settings.resamples, settings.bootstrap_seed).itertuples():
        seeds = f" ({row.runs} seeds)" if row.runs > 1 else ""
        print(f"lm\t{row.matrix_type}\t{row.order}\t{row.fraction:g}\tnll={row.nll:.4f} [{row.ci_low:.4f}, "
              f"{row.ci_high:.4f}]{seeds}")
    print(f"{len(records)} language-model records in {lm.lm_results_path(results_dir)}")


def _grid_sample(spec) -> str | None:
    """The packaged sample, when the grid file's ``data_dir`` lacks the files of its tasks and the sample holds
    them all (as the chapters fall back); else None (the file's own setting stands)."""
    if not spec.get("data_dir"):
        return None
    tasks = {task for block in spec["blocks"] for task in block.tasks + [block.matrices_from] if task}
    return _sample_for(spec["data_dir"], sorted(tasks), shown=str(spec["data_dir"]))  # as the file writes it


def _grid_records(spec, store, model, only_seeds, overrides) -> list[dict]:
    """The stored records of a grid's runs: its tasks x variants x seeds, made with this model."""
    from .core.models import model_id
    from .experiments.grid import grid_runs, grid_settings

    _, seeds = grid_settings(spec, overrides)
    seeds = [seed for seed in seeds if only_seeds is None or seed in only_seeds]
    def key(task, matrix_type, order, fraction, source):
        own = source if isinstance(source, str) and source and source != task else None
        return task, matrix_type, order, round(float(fraction), 9), own

    wanted = {key(task, v.matrix_type, v.selection_order, v.fraction, v.matrices_from)
              for task, variants in grid_runs(spec["blocks"]).items() for v in variants}
    frame = store.frame()
    if frame.empty:
        return []
    name = model_id(model)
    keep = [key(row.task, row.matrix_type, row.selection_order, row.fraction, row.matrices_from) in wanted
            and int(row.seed) in seeds and row.model == name for row in frame.itertuples()]
    return frame[keep].to_dict("records")


def _check_store(grid, results_dir) -> None:
    """Read the results table before any model loads: a torn last line is set aside (with a notice); damage before
    it is one line naming it, and how to keep every intact record."""
    from .experiments.damage import DamagedStoreError
    from .experiments.results import RESULTS_FILENAME, ResultsStore

    if not (Path(results_dir) / RESULTS_FILENAME).exists():
        return
    try:
        ResultsStore(results_dir).run_ids()
    except DamagedStoreError as error:
        raise DamagedStoreError(f"{error}; 'papa grid {grid} --repair' keeps every intact record and sets the damaged "
                                f"lines aside", path=error.path, lines=error.lines) from error


def _repair(grid, results_dir) -> int:
    """``papa grid FILE --repair``: keep every intact record, move the damaged lines into a side file."""
    from .experiments.results import RESULTS_FILENAME, ResultsStore

    if not (Path(results_dir) / RESULTS_FILENAME).exists():
        print(f"nothing to repair: no {Path(results_dir) / RESULTS_FILENAME}")
        return 0
    store = ResultsStore(results_dir)
    kept, lines, side = store.repair()
    if not lines:
        print(f"nothing to repair: {store.path} holds {kept} intact records")
        return 0
    print(f"repaired {store.path}: kept {kept} intact records; moved {len(lines)} damaged line(s) "
          f"({', '.join(map(str, lines))}) to {side}; 'papa grid {grid}' computes their runs again")
    return 0


def _executor(args):
    """The grid's executor: ``local`` (default) or ``ray`` with its options."""
    from .ops.executors import make_executor

    options = {"address": args.address, "cpus_per_run": args.cpus_per_run, "gpus_per_run": args.gpus_per_run}
    if args.executor == "local" and any(value is not None for value in options.values()):
        given = [f"--{key.replace('_', '-')}" for key, value in options.items() if value is not None]
        raise UsageError(f"{', '.join(given)} only appl{'ies' if len(given) == 1 else 'y'} to --executor ray")
    return make_executor(args.executor, **options)


def cmd_bench(args) -> int:  # reached only through build_parser(); main() hands 'bench ...' to bench.main directly
    from .ops import bench

    return bench.main(args.rest, parser_class=_Parser) or 0


def _book_tools():
    """The book's build tooling, ``(papa_book.build, papa_book.chapters)`` (``book/_ext/papa_book`` of the checkout
    this runs in; it is not installed)."""
    import importlib

    from .book.profiles import find_repo_root

    root = find_repo_root()
    tools = root / "book" / "_ext"
    if not (tools / "papa_book" / "__init__.py").is_file():
        raise UsageError(f"no book here: run this inside a clone of the book's repository ({root} has no "
                         "book/_ext/papa_book)")
    if str(tools) not in sys.path:
        sys.path.insert(0, str(tools))
    return importlib.import_module("papa_book.build"), importlib.import_module("papa_book.chapters")


def cmd_reproduce(args) -> int:
    from .core.models import resolve_device

    tools, _ = _book_tools()

    parameters = {}
    if args.model:
        parameters["model_name"] = args.model
    if args.data_dir:
        parameters["data_dir"] = args.data_dir
    if args.device:
        parameters["device"] = resolve_device(args.device)
    for name, text in args.parameter or []:  # -p NAME VALUE, as papermill takes them (VALUE as YAML: 3, [a, b], x)
        import yaml

        if not name.isidentifier():
            raise UsageError(f"-p: parameter name {name!r} is not a Python identifier")
        if name == "profile":
            raise UsageError("-p profile: give the profile as --profile")
        try:
            parameters[name] = yaml.safe_load(text)
        except yaml.YAMLError:
            raise UsageError(f"-p {name}: {text!r} is not a YAML value (3, 0.5, x, [0, 1], ...)") from None
    try:
        paths = tools.run_chapters(args.profile, args.out, parameters=parameters or None,
                                   chapters=args.chapter or None, resume=not args.no_resume)
    except tools.ChapterExecutionError as error:  # one line naming the chapter and the cell, like papa book
        print(tools.failure_line("a chapter failed", error), file=sys.stderr)
        return 1
    for path in paths:
        print(path)
    return 0


def cmd_book(args) -> int:
    tools, chapters = _book_tools()

    chapters.sync_notebooks("book")
    try:
        html = tools.build_book(".", warnings_as_errors=not args.allow_warnings)
    except tools.BookBuildError as error:  # a page failed to execute, or Sphinx failed: the message says which
        print(tools.failure_line("the book did not build", error), file=sys.stderr)
        return 1
    print(f"book built: {html / 'index.html'}")
    return 0


def _fraction(text) -> float:
    """A fraction of input-dependent heads: ``0.5``, ``1/8``; in [0, 1]."""
    if isinstance(text, float):
        return text
    try:
        if "/" in str(text):
            num, den = str(text).split("/")
            value = float(num) / float(den)
        else:
            value = float(text)
    except (ValueError, ZeroDivisionError):
        raise argparse.ArgumentTypeError(f"expected a fraction such as 0.5 or 1/8, got {text!r}") from None
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"a fraction of heads must be in [0, 1], got {text!r}")
    return value


def build_parser() -> argparse.ArgumentParser:
    from .experiments.engine import all_orders
    from .experiments.matrices import MATRIX_TYPES
    ORDERS = all_orders()
    from .experiments.selection import PAPER_FRACTIONS

    paragraphs = __doc__.strip().split("\n\n")  # plain text: the commands are listed by argparse itself
    parser = _Parser(prog="papa", description="\n\n".join(p for p in paragraphs if not p.startswith("Commands:")),
                     epilog="Run 'papa <command> --help' for a command's options and their defaults.",
                     formatter_class=_RawFormatter)
    from . import __version__

    parser.add_argument("--version", action="version", version=f"papa {__version__}",
                        help="print the version of papa_lib and exit")
    parser.add_argument("--debug", action="store_true", help="show the traceback of an error (anywhere on the line)")
    sub = parser.add_subparsers(dest="command", required=True, metavar="command")

    p = sub.add_parser(
        "averages",
        help="build and save constant matrices (Sec. 3.1)",
        description="Average every head's attention over a task's training text (pad-aware, Eq. 2) and save it.",
    )
    _shared(p)
    p.add_argument(
        "--matrices-from", default=None,
        help="build from another task's training text (e.g. mnli, Sec. 5.3); default: the task's own"
    )
    p.add_argument("--out", default=None,
                   help="output .safetensors path (default: RESULTS_DIR/matrices/<task>-L<L>.safetensors)")
    p.set_defaults(func=cmd_averages)

    p = sub.add_parser(
        "select",
        help="learn λ per head and print the replacement order (Sec. 3.2)",
        description="Train B = λA + (1-λ)C mixing weights jointly with a probe; smallest λ is replaced first.",
    )
    _shared(p)
    p.add_argument("--matrices-from", default=None,
                   help="task whose average matrices are mixed in (default: the task itself)")
    p.add_argument("--lambda-lr", type=_positive_float, default=None, help="learning rate for θ (default: the probe's)")
    p.add_argument(
        "--lambda-epochs", type=_positive_int, default=None, help="epochs of λ training (default: the probe's)"
    )
    p.add_argument("--out", default=None, help="save the order and λ as CSV (default: print them only)")
    p.set_defaults(func=cmd_select)

    p = sub.add_parser(
        "probe",
        help="probe variants of a task and record the results (Sec. 3.3, 4, 5)",
        description="For each matrix type x order x fraction x seed, train a probe on the frozen model and append "
        "a record (runs already stored are reused); ends with a table of the means and 95% intervals over seeds.",
    )
    _shared(p)
    p.add_argument("--matrix-type", nargs="+", default=["average"], choices=MATRIX_TYPES, metavar="TYPE",
                   help=f"what replaced heads use (Sec. 3, 5.2): {', '.join(MATRIX_TYPES)}; default: average")
    p.add_argument("--order", nargs="+", default=["lambda"], choices=ORDERS, metavar="ORDER",
                   help=f"which heads are replaced first (Sec. 3.2, 5.4): {', '.join(ORDERS)}; default: lambda")
    p.add_argument("--fraction", nargs="+", type=_fraction, default=list(PAPER_FRACTIONS),
                   help="fractions of heads kept input-dependent, e.g. 1 1/2 1/8 1/16 0")
    p.add_argument("--matrices-from", default=None,
                   help="average matrices from another task's text (Sec. 5.3); default: the task's own")
    p.add_argument("--lambda-lr", type=_positive_float, default=None,
                   help="learning rate for θ in λ learning (default: the probe's)")
    p.add_argument("--lambda-epochs", type=_positive_int, default=None,
                   help="epochs of λ learning (default: the probe's)")
    p.set_defaults(func=cmd_probe)

    p = sub.add_parser(
        "grid",
        help="run a declared grid (YAML), resuming finished runs",
        description="Run every run of a grid file, resuming (runs already stored are reused); records go to "
        "--results-dir (default: the grid file's folder). Ends with a table of the means and 95% intervals over "
        "seeds. The file's keys: the book's \"Appendix: grid-file reference\" (book/gridfile.md).",
    )
    p.add_argument("grid", help="grid YAML file (e.g. data/results/local-minilm/grid.yaml)")
    p.add_argument("--plan", action="store_true",
                   help="print per task the examples, variants, backbone passes, feature bytes, cache or stream and "
                        "an estimated time from throughput measured here, for the runs not yet in the results folder "
                        "(reading the matrices and λ saved there); run nothing")
    p.add_argument("--blocks", default=None,
                   help="run only these blocks of the file (comma-separated names; language_model: that section; "
                        "default: every block and the section)")
    p.add_argument("--only-seed", type=int, action="append", default=None,
                   help="run only this seed of the file's seeds (repeatable); training subsets stay those of the "
                        "full grid, so shards run in parallel give the same records; with --plan, the shard's plan "
                        "(default: every seed of the file)")
    p.add_argument("--repair", action="store_true",
                   help="repair the results table (results.csv in --results-dir): keep every intact record, move "
                        "damaged lines into results.csv.damaged-<time>; run nothing")
    p.add_argument("--cache-budget", default=None,
                   help="bytes of cached features per variant before streaming (e.g. 8G; default: a quarter of RAM)")
    group = p.add_argument_group(
        "scale-out (--executor ray)",
        "Each run is a Ray task; constant matrices, λ and shared features are computed once, by tasks the runs "
        "depend on. Every worker must see the results folder (and the data) at the same path.")
    group.add_argument("--executor", choices=["local", "ray"], default="local",
                       help="local: one run after another in this process (default); ray: a Ray cluster")
    group.add_argument("--address", default=None, metavar="ADDR",
                       help="join this Ray cluster (e.g. auto, head:6379, ray://head:10001); default: start a local "
                            "Ray instance on this machine")
    group.add_argument(
        "--cpus-per-run", type=_positive_float, default=None, metavar="N", help="CPUs of each Ray task (default 1)"
    )
    group.add_argument("--gpus-per-run", type=_non_negative_float, default=None, metavar="N",
                       help="GPUs of each Ray task, fractions allowed (default 0; with GPUs the device is cuda)")
    _shared(p, task_required=False, custom=False)
    p.set_defaults(func=cmd_grid, results_dir=None)

    p = sub.add_parser("bench", help="speed and memory benchmarks ('papa bench --help')", add_help=False,
                       description="Forwarded to python -m papa_lib.ops.bench.")
    p.add_argument("rest", nargs=argparse.REMAINDER,
                   help="options of python -m papa_lib.ops.bench ('papa bench --help')")
    p.set_defaults(func=cmd_bench)

    p = sub.add_parser(
        "reproduce",
        help="execute every chapter through papermill for a profile",
        description="Run all chapters (smoke: tiny model, seconds; local: embedded MiniLM + local data; "
        "paper: hub models, GPU).",
    )
    p.add_argument("--profile", required=True, choices=["smoke", "local", "paper"],
                   help="smoke: tiny random model, seconds; local: embedded MiniLM on local data, CPU; paper: the "
                        "paper's hub models, GPU")
    p.add_argument("--out", default="runs", help="executed notebooks go to OUT/<profile>/")
    p.add_argument("--chapter", action="append", help="only this chapter (repeatable; default: every chapter)")
    p.add_argument("--model", default=None, help="the chapters' model (hub id or folder); default: the profile's")
    p.add_argument("--data-dir", default=None,
                   help="local data folder laid out like ../shared/data; default: the profile's")
    p.add_argument("--device", default=None,
                   help="cpu, cuda, cuda:1, ... or auto (CUDA when torch sees a GPU); default: the profile's")
    p.add_argument("-p", "--parameter", nargs=2, action="append", metavar=("NAME", "VALUE"),
                   help="a chapter parameter, as papermill's -p (VALUE read as YAML: 512, [sst2, cola], text); "
                        "repeatable; default: the chapters' own values")
    p.add_argument("--no-resume", action="store_true", help="re-run chapters that already finished")
    p.set_defaults(func=cmd_reproduce)

    p = sub.add_parser("book", help="sync chapter notebooks and build the HTML book",
                       description="Regenerate the paired .ipynb files and run jupyter-book (warnings are errors).")
    p.add_argument("--allow-warnings", action="store_true",
                   help="build even when Sphinx warns (by default a warning fails the build)")
    p.set_defaults(func=cmd_book)
    return parser


def _user_errors() -> tuple[type[BaseException], ...]:
    """Exceptions that report a user's mistake or environment (printed in one line), not a bug in papa: the errors
    papa_lib raises on purpose (:class:`papa_lib.errors.PapaError`: bad input, an unreachable hub, a packaged model
    not installed), a bad command line, a path that is missing, not a folder (or a folder) or not allowed, and
    invalid YAML. Anything else, a plain ValueError included, is a bug: its traceback shows."""
    import yaml

    return (PapaError, UsageError, FileNotFoundError, NotADirectoryError, IsADirectoryError, PermissionError,
            yaml.YAMLError)


_AT_LINE = re.compile(r"(?P<file>[^\n]+?):(?P<line>\d+): (?P<what>.+)", re.S)
_AT_FILE = re.compile(r"(?P<file>[^\n:]+?): (?P<what>.+)", re.S)


def describe(error: BaseException) -> str:
    """One line for a user error: the library's message, with a leading ``file:line:`` moved to the end."""
    if isinstance(error, OSError) and error.strerror and error.filename:
        text = f"{error.strerror}: {error.filename}"
    else:
        text = str(error) or type(error).__name__
    text = " ".join(text.split())
    for pattern in (_AT_LINE, _AT_FILE):
        match = pattern.fullmatch(text)
        if match and Path(match["file"]).exists():
            where = match["file"] + (f":{match['line']}" if "line" in pattern.groupindex else "")
            return f"{match['what']} ({where})"
    return text


def main(argv=None) -> int:
    """Run the command line; returns the exit status (2 for a user error, printed as one line)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in argv
    argv = [arg for arg in argv if arg != "--debug"]
    if "--data-dir" in argv or "--train" in argv:
        # local data given: the datasets library stays offline; the model hub does not (a hub model still downloads)
        os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    if not debug:  # the hub client's own warnings would repeat our one-line error about an unreachable hub
        os.environ.setdefault("HF_HUB_VERBOSITY", "error")
    try:
        if argv[:1] == ["bench"]:  # bench has its own parser (options such as --quick, --help pass straight through)
            from .ops import bench

            return int(bench.main(argv[1:], parser_class=_Parser) or 0)
        if argv == ["--version"]:  # before build_parser; the papa script answers it in papa_entry.py, without torch
            from . import __version__

            print(f"papa {__version__}")
            raise SystemExit(0)
        args = build_parser().parse_args(argv)
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        print("papa: interrupted", file=sys.stderr)
        return 130
    except Exception as error:
        if not isinstance(error, _user_errors()):
            raise
        if debug:
            import traceback

            traceback.print_exc()
        print(f"papa: error: {describe(error)}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
