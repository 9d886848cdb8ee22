"""The ``papa`` command: PAPA's steps from the shell (paper Sec. 3-5), with progress bars.

Subcommands::

    papa averages   build constant matrices C^h for a task's training text (Sec. 3.1) and save them
    papa select     learn λ per head (Sec. 3.2) and print/save the replacement order
    papa probe      probe variants (matrix type x order x fraction) for a task, append records (Sec. 3.3, 4, 5)
    papa grid       run a declared grid of runs from a YAML file, resuming where it stopped
    papa bench      speed and memory benchmarks (see BENCHMARKS.md)
    papa reproduce  execute every book chapter through papermill for a profile (smoke, local, paper)
    papa book       sync the chapter notebooks and build the HTML book

Shared flags: ``--model --task --data-dir --max-length --limit --seeds --epochs --device --results-dir``.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path


def _shared(parser: argparse.ArgumentParser, task_required: bool = True) -> None:
    from .tasks import TASKS

    group = parser.add_argument_group("shared options")
    group.add_argument("--model", default=None, help="hub id or local folder; default: the embedded all-MiniLM-L6-v2")
    group.add_argument("--task", required=task_required, choices=sorted(TASKS), help="downstream task")
    group.add_argument("--data-dir", default=None, help="local data folder laid out like ../shared/data; default: the hub")
    group.add_argument("--max-length", type=int, default=None, help="sequence length L (default: paper Table 3 per task)")
    group.add_argument("--limit", type=int, default=None, help="subsample the training data to N examples (seeded)")
    group.add_argument("--seeds", type=int, default=None, help="number of seeds (0..N-1); default 3 (grid: the file's value)")
    group.add_argument("--epochs", type=int, default=None, help="probe epochs (default: Table 3)")
    group.add_argument("--device", default=None, help="cpu, cuda, cuda:1, ... (default: cpu)")
    group.add_argument("--results-dir", default="data/results/cli", help="where records, matrices and λ are stored")


def _experiment(args):
    from .experiments import ExperimentConfig, TaskExperiment

    config = ExperimentConfig(
        task=args.task, model=args.model, data_dir=args.data_dir, max_length=args.max_length, limit=args.limit,
        epochs=args.epochs, device=args.device or "cpu", profile=getattr(args, "profile", "local"),
        lambda_learning_rate=getattr(args, "lambda_lr", None), lambda_epochs=getattr(args, "lambda_epochs", None),
    )
    return TaskExperiment(config, results_dir=args.results_dir)


def cmd_averages(args) -> int:
    experiment = _experiment(args)
    constants = experiment.constants(args.matrices_from)
    out = Path(args.out or Path(args.results_dir) / "matrices" / f"{args.matrices_from or args.task}-L{constants.max_length}.safetensors")
    constants.save(out)
    meta = constants.metadata
    print(f"saved {constants.num_layers}x{constants.num_heads} constant matrices at L={constants.max_length} "
          f"from {meta['num_examples']} examples ({meta['source']}) to {out}")
    return 0


def cmd_select(args) -> int:
    from .selection import replacement_order

    experiment = _experiment(args)
    lambdas = experiment.learn_lambdas(args.matrices_from)
    order = replacement_order("lambda", experiment.layers, experiment.heads, lambdas=lambdas)
    print("layer\thead\tlambda  (replacement order: first line is replaced first)")
    for layer, head in order:
        print(f"{layer}\t{head}\t{float(lambdas[layer, head]):.4f}")
    if args.out:
        import pandas as pd

        rows = [{"rank": i, "layer": l, "head": h, "lambda": float(lambdas[l, h])} for i, (l, h) in enumerate(order)]
        pd.DataFrame(rows).to_csv(args.out, index=False)
        print(f"saved to {args.out}")
    return 0


def cmd_probe(args) -> int:
    from .experiments import Variant

    experiment = _experiment(args)
    seeds = range(args.seeds if args.seeds is not None else 3)
    for matrix_type in args.matrix_type:
        for order in args.order:
            for fraction in args.fraction:
                variant = Variant.make(matrix_type, order, _fraction(fraction), args.matrices_from)
                for seed in seeds:
                    record = experiment.run(variant, seed)
                    print(f"{record['task']}\t{variant.matrix_type}\t{variant.selection_order}\t{variant.fraction:g}\t"
                          f"seed {seed}\t{record['metric']}={record['value']:.4f}")
    print(f"records in {Path(args.results_dir) / 'results.csv'}")
    return 0


def cmd_grid(args) -> int:
    from .experiments import load_grid, run_grid

    spec = load_grid(args.grid)
    overrides = {
        "model": args.model, "data_dir": args.data_dir, "max_length": args.max_length, "limit": args.limit,
        "epochs": args.epochs, "device": args.device,
        "seeds": list(range(args.seeds)) if args.seeds is not None else None,
    }
    if args.task:
        spec["blocks"] = [b for b in spec["blocks"] if args.task in b.tasks]
        for block in spec["blocks"]:
            block.tasks = [args.task]
    results_dir = args.results_dir or str(Path(args.grid).parent)
    store = run_grid(spec, results_dir, overrides=overrides)
    print(f"{len(store)} records in {store.path}")
    return 0


def cmd_bench(args) -> int:
    from . import bench

    return bench.main(args.rest) or 0


def cmd_reproduce(args) -> int:
    from .book import run_chapters

    parameters = {}
    if args.model:
        parameters["model_name"] = args.model
    if args.data_dir:
        parameters["data_dir"] = args.data_dir
    if args.device:
        parameters["device"] = args.device
    paths = run_chapters(args.profile, args.out, parameters=parameters or None, chapters=args.chapter or None, resume=not args.no_resume)
    for path in paths:
        print(path)
    return 0


def cmd_book(args) -> int:
    from .book import build_book, sync_notebooks

    sync_notebooks("book")
    html = build_book(".", warnings_as_errors=not args.allow_warnings)
    print(f"book built: {html / 'index.html'}")
    return 0


def _fraction(text) -> float:
    if isinstance(text, float):
        return text
    if "/" in str(text):
        num, den = str(text).split("/")
        return float(num) / float(den)
    return float(text)


def build_parser() -> argparse.ArgumentParser:
    from .experiments import MATRIX_TYPES
    from .experiments import ALL_ORDERS as ORDERS
    from .selection import PAPER_FRACTIONS

    parser = argparse.ArgumentParser(prog="papa", description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog="Run 'papa <command> --help' for a command's options.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="command")

    p = sub.add_parser("averages", help="build and save constant matrices (Sec. 3.1)",
                       description="Average every head's attention over a task's training text (pad-aware, Eq. 2) and save it.")
    _shared(p)
    p.add_argument("--matrices-from", default=None, help="build from another task's training text (e.g. mnli, Sec. 5.3)")
    p.add_argument("--out", default=None, help="output .safetensors path")
    p.set_defaults(func=cmd_averages)

    p = sub.add_parser("select", help="learn λ per head and print the replacement order (Sec. 3.2)",
                       description="Train B = λA + (1-λ)C mixing weights jointly with a probe; smallest λ is replaced first.")
    _shared(p)
    p.add_argument("--matrices-from", default=None, help="task whose average matrices are mixed in")
    p.add_argument("--lambda-lr", type=float, default=None, help="learning rate for θ (default: the probe's)")
    p.add_argument("--lambda-epochs", type=int, default=None, help="epochs of λ training (default: the probe's)")
    p.add_argument("--out", default=None, help="save the order and λ as CSV")
    p.set_defaults(func=cmd_select)

    p = sub.add_parser("probe", help="probe variants of a task and record the results (Sec. 3.3, 4, 5)",
                       description="For each matrix type x order x fraction x seed, train a probe on the frozen model and append a record.")
    _shared(p)
    p.add_argument("--matrix-type", nargs="+", default=["average"], choices=MATRIX_TYPES)
    p.add_argument("--order", nargs="+", default=["lambda"], choices=ORDERS)
    p.add_argument("--fraction", nargs="+", default=[str(f) for f in PAPER_FRACTIONS],
                   help="fractions of heads kept input-dependent, e.g. 1 1/2 1/8 1/16 0")
    p.add_argument("--matrices-from", default=None, help="average matrices from another task's text (Sec. 5.3)")
    p.add_argument("--lambda-lr", type=float, default=None, help="learning rate for θ in λ learning")
    p.add_argument("--lambda-epochs", type=int, default=None, help="epochs of λ learning")
    p.set_defaults(func=cmd_probe)

    p = sub.add_parser("grid", help="run a declared grid (YAML), resuming finished runs",
                       description="Run every run of a grid file; records go to --results-dir (default: the grid file's folder).")
    p.add_argument("grid", help="grid YAML file (see data/results/local-minilm/grid.yaml)")
    _shared(p, task_required=False)
    p.set_defaults(func=cmd_grid, results_dir=None)

    p = sub.add_parser("bench", help="speed and memory benchmarks", add_help=False,
                       description="Forward to python -m papa_lib.bench (use 'papa bench --help').")
    p.add_argument("rest", nargs=argparse.REMAINDER)
    p.set_defaults(func=cmd_bench)

    p = sub.add_parser("reproduce", help="execute every chapter through papermill for a profile",
                       description="Run all chapters (smoke: tiny model, seconds; local: embedded MiniLM + local data; paper: hub models, GPU).")
    p.add_argument("--profile", required=True, choices=["smoke", "local", "paper"])
    p.add_argument("--out", default="runs", help="executed notebooks go to OUT/<profile>/")
    p.add_argument("--chapter", action="append", help="only this chapter (repeatable)")
    p.add_argument("--model", default=None)
    p.add_argument("--data-dir", default=None)
    p.add_argument("--device", default=None)
    p.add_argument("--no-resume", action="store_true", help="re-run chapters that already finished")
    p.set_defaults(func=cmd_reproduce)

    p = sub.add_parser("book", help="sync chapter notebooks and build the HTML book",
                       description="Regenerate the paired .ipynb files and run jupyter-book (warnings are errors).")
    p.add_argument("--allow-warnings", action="store_true")
    p.set_defaults(func=cmd_book)
    return parser


def main(argv=None) -> int:
    if "--data-dir" in (argv if argv is not None else sys.argv):
        os.environ.setdefault("HF_HUB_OFFLINE", "1")  # local files given: do not wait on an unreachable hub
    parser = build_parser()
    args = parser.parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
