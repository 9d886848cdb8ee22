"""The scale chapter's tables and figure (book/scale.md): the three profiles, the grid files, the paper's models, what
the paper grid would cost, and the feature-cache memory at the paper's sizes.

The compute estimate (:func:`estimate`) scales the wall times recorded in the committed ``local`` results
(:func:`papa_lib.book.costs.run_costs`) to the paper grid (:func:`papa_lib.book.costs.estimate_compute`). It uses the
records of one device: a GPU when the records have GPU runs (their times are GPU time already, no speed-up is
assumed), else the CPU with an assumed GPU speed-up. Without any timed record (a copy of the book without the
committed results) it falls back to the plan alone — how many runs each model and block declares — so the chapter
shows a figure at every profile.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from . import charts, costs, figures, profiles
from .display import markdown as _markdown
from .records import describe

__all__ = ["Estimate", "estimate", "memory_table", "model_table", "profiles_table", "show_file"]

#: What the paper itself ran (App. C): Fig. 2 for every model, Tables 1-2 for the RoBERTa models, Fig. 5 for
#: RoBERTa-base.
PAPER_SCOPE = {name: {"fig2"} for name in profiles.PAPER_MODELS}
PAPER_SCOPE["roberta-base"] = {"fig2", "table1", "table2", "fig5"}
PAPER_SCOPE["roberta-large"] = {"fig2", "table1", "table2"}


def _grid(path: Path) -> dict:
    from ..experiments.grid import load_grid

    return load_grid(path) if path.exists() else {"blocks": []}


def _frame(folder: Path) -> pd.DataFrame:
    from ..experiments.results import ResultsStore

    return ResultsStore(folder).frame() if (folder / "results.csv").exists() else pd.DataFrame()


def show_file(path: str | os.PathLike) -> None:
    """Print a file of the repository (or say that this installation has no copy of it)."""
    path = Path(path)
    print(path.read_text() if path.exists() else f"{path} is not here: clone the repository to get it.")


def profiles_table(setup) -> pd.io.formats.style.Styler:
    """Per profile (a column each): model, data, results folder with its grid file, runs the grid declares / runs
    the table holds. Profiles side by side, the grid named relative to its results folder (``grid.yaml`` in it):
    the table fits the page column. Returned as a Styler (the notebook shows it without the index header row)."""
    rows = []
    for name in profiles.PROFILES:
        other = profiles.resolve(name, root=setup.root) if name != setup.profile else setup
        try:
            declared = int(costs.grid_plan(other.grid())["runs"].sum())
            grid_file = "built in: profiles.SMOKE_GRID" if name == "smoke" else "grid.yaml in it"
        except FileNotFoundError:
            declared, grid_file = 0, "missing"
        stored = _frame(other.results_dir)
        described = describe(stored, profile=name)
        rows.append({"profile": name,
                     "model": other.model_label if name != "paper" else "the paper's models (one --model per run)",
                     "data of its stored runs": described["data"] if len(stored) else "no runs stored",
                     "data of live cells here": other.data_label,
                     "results folder": os.path.relpath(other.results_dir, setup.root),
                     "grid": grid_file, "runs declared / stored": f"{declared} / {len(stored)}"})
    return pd.DataFrame(rows).set_index("profile").T.rename_axis(index=None, columns="profile").style


def model_table() -> pd.DataFrame:
    """The paper's models (and the embedded MiniLM): layers, hidden and feed-forward sizes, compute per token
    relative to MiniLM (:func:`papa_lib.book.costs.encoder_cost_ratio`)."""
    rows = [{"model": name, "layers": costs.MODEL_SHAPES[name][0], "hidden": costs.MODEL_SHAPES[name][1],
             "feed-forward": costs.MODEL_SHAPES[name][2],
             "compute per token vs MiniLM": round(costs.encoder_cost_ratio(costs.MODEL_SHAPES[name]), 1)}
            for name in ("all-MiniLM-L6-v2", *profiles.PAPER_MODELS)]
    return pd.DataFrame(rows).set_index("model")


@dataclass
class Estimate:
    """What the paper grid costs, from the committed local records.

    ``rows``: one row per (model, block, task, kind) with ``runs`` and ``hours`` (NaN in the plan-only fallback),
    ``in_paper`` (the paper's own scope) and ``source``. ``measured``: the per-(task, kind) costs the hours scale
    (:func:`papa_lib.book.costs.run_costs`), empty without timed records. ``device``: the device those records
    ran on; ``speedup``: the speed-up divided out (1 for GPU records). ``records``: the timed records used.
    """

    rows: pd.DataFrame
    measured: pd.DataFrame
    device: str | None
    speedup: float
    records: pd.DataFrame = field(default_factory=pd.DataFrame)

    @property
    def timed(self) -> bool:
        return not self.measured.empty

    def per_model(self) -> pd.DataFrame:
        """Per model: runs, GPU-hours over every block and over the paper's own scope (runs only without timings)."""
        grouped = self.rows.groupby("model", sort=False)
        table = grouped.agg(runs=("runs", "sum"))
        if self.timed:
            table["gpu_hours_all_blocks"] = grouped["hours"].sum()
            table["gpu_hours_paper_scope"] = self.rows[self.rows.in_paper].groupby("model", sort=False)["hours"].sum()
        return table.round(1)

    def measured_table(self) -> Any:
        """The measured costs per (task, kind), or a sentence saying there are none."""
        if not self.timed:
            return _markdown("The local results table has no timed runs here, so the estimate below counts runs "
                             "only (no hours).")
        return self.measured.set_index(["task", "kind"]).round(5)

    def measured_text(self) -> Any:
        """How many timed runs, how many device-hours, on which device."""
        if not self.timed:
            return _markdown("")
        return _markdown(f"{int(self.measured.runs.sum())} timed local runs, {self.measured.wall_hours.sum():.1f} "
                         f"device-hours in all, on `{self.device}`; runs on other devices are left out, so that "
                         "one cost does not mix two speeds.")

    def chart(self) -> Any:
        """Estimated GPU-hours per model, stacked by grid block (runs per model and block without timings)."""
        import altair as alt

        value = "hours" if self.timed else "runs"
        if self.timed:
            x_title = (f"estimated GPU-hours (assumed speed-up {self.speedup:g}x)" if self.speedup != 1 else
                       "estimated GPU-hours (measured on a GPU)")
            title = "Estimated GPU-hours of the paper grid, per model and block"
        else:
            x_title, title = "runs declared", "Runs of the paper grid, per model and block (no timings here)"
        pick = alt.selection_point(fields=["block"], bind="legend")
        bars = alt.Chart(self.rows).mark_bar().encode(
            x=alt.X(f"sum({value}):Q", title=x_title),
            y=alt.Y("model:N", sort=list(profiles.PAPER_MODELS), title=None),
            color=alt.Color("block:N", title="grid block", legend=alt.Legend(orient="bottom")),
            opacity=alt.condition(pick, alt.value(1.0), alt.value(0.2)),
            tooltip=["model:N", "block:N", alt.Tooltip("sum(runs):Q", title="runs"),
                     alt.Tooltip(f"sum({value}):Q", title=value, format=",.1f"),
                     alt.Tooltip("in_paper:N", title="in the paper's scope")],
        ).add_params(pick)
        described = describe(self.records, model="the paper grid (plan)", data="data/results/paper/grid.yaml",
                             profile="paper")
        if self.device:
            described["data"] += f"; timed on {self.device}"
        return bars.properties(width=400, title=charts.chart_title(title, **described))

    def text(self) -> Any:
        """The totals in words: the paper's own scope, every block, and MNLI's share."""
        if not self.timed:
            runs = int(self.rows.runs.sum())
            return _markdown(f"Without timed records only the plan can be shown: {runs:,} runs over "
                             f"{len(profiles.PAPER_MODELS)} models.")
        total, scope = self.rows.hours.sum(), self.rows[self.rows.in_paper].hours.sum()
        how = (f"With a GPU **{self.speedup:g}×** faster than the CPU we measured on" if self.speedup != 1 else
               f"Scaling GPU times measured on `{self.device}` (no speed-up assumed)")
        mnli = self.rows[self.rows.task == "mnli"].hours.sum() / total if total else float("nan")
        return _markdown(
            f"{how}, the paper's own scope (Fig. 2 for all {len(profiles.PAPER_MODELS)} models, Tables 1–2 for the "
            f"RoBERTa models, Fig. 5 for RoBERTa-base) comes to about **{scope:,.0f} GPU-hours**; running every "
            f"block for every model, as `papa grid` does for each `--model`, about **{total:,.0f} GPU-hours**. "
            f"MNLI takes {mnli:.0%} of the total, with {costs.PAPER_TRAIN_SIZES['mnli']:,} training pairs.")


def _device_records(frame: pd.DataFrame) -> tuple[pd.DataFrame, str | None]:
    """The timed records of one device: GPU records when there are any, else CPU ones."""
    if frame.empty or "wall_time_s" not in frame.columns:
        return frame.iloc[0:0], None
    timed = frame[frame["wall_time_s"].notna() & frame["train_size"].notna()]
    devices = timed["device"].astype(str) if "device" in timed.columns else pd.Series("cpu", index=timed.index)
    for prefix in ("cuda", "cpu"):
        chosen = timed[devices.str.startswith(prefix)]
        if not chosen.empty:
            return chosen, prefix
    return timed.iloc[0:0], None


def estimate(setup, gpu_speedup: float = 50.0) -> Estimate:
    """The paper grid's cost from the committed local records (see the module docstring)."""
    from ..experiments.tasks import TASKS

    local_dir = setup.root / profiles.RESULT_FOLDERS["local"]
    local_spec = _grid(local_dir / "grid.yaml")
    paper_plan = costs.grid_plan(_grid(setup.root / profiles.RESULT_FOLDERS["paper"] / "grid.yaml"))
    records, device = _device_records(_frame(local_dir))
    tasks = [t for t in TASKS if t in set(records.get("task", []))]
    measured = (costs.run_costs(records, figures.task_lengths(local_spec, tasks), device=device) if tasks
                else pd.DataFrame())
    speedup = 1.0 if device == "cuda" else float(gpu_speedup)
    paper_tasks = [t for t in figures.PAPER_TASK_ORDER if t in set(paper_plan.get("task", []))]
    lengths = figures.task_lengths({}, paper_tasks)  # Table 3
    table3 = {t: TASKS[t].epochs for t in paper_tasks}
    local_inloop = figures.per_task_setting(local_spec, "inloop_epochs", paper_tasks, table3)
    epoch_factor = {t: table3[t] / local_inloop[t] for t in paper_tasks}
    parts = []
    for name in profiles.PAPER_MODELS:
        ratio = costs.encoder_cost_ratio(costs.MODEL_SHAPES[name])
        for block, part in paper_plan.groupby("block", sort=False):
            if measured.empty:
                hours = part.assign(hours=float("nan"), source="plan only")
            else:
                hours = costs.estimate_compute(measured, part, lengths, costs.PAPER_TRAIN_SIZES, cost_ratio=ratio,
                                               speedup=speedup, epoch_factor=epoch_factor)
            parts.append(hours.assign(model=name, block=block, in_paper=block in PAPER_SCOPE[name]))
    rows = pd.concat(parts, ignore_index=True) if parts else pd.DataFrame(
        columns=["task", "kind", "runs", "hours", "source", "model", "block", "in_paper"])
    return Estimate(rows, measured if measured is not None else pd.DataFrame(), device, speedup, records)


def memory_table() -> pd.DataFrame:
    """The frozen features of every paper task's training set at Table 3's lengths, for RoBERTa-base and -large (GiB):
    what the feature store keeps (real tokens only, :data:`papa_lib.experiments.plan.TYPICAL_TOKENS` per example)
    and what a cache of every padded position would need, against the store's default budget on this machine."""
    from ..experiments.features import default_budget
    from ..experiments.plan import TYPICAL_TOKENS
    from ..experiments.tasks import TASKS

    budget = default_budget()
    tasks = list(figures.PAPER_TASK_ORDER)
    lengths = figures.task_lengths({}, tasks)
    rows = []
    for task in tasks:
        kind = TASKS[task].kind
        examples = costs.PAPER_TRAIN_WORDS[task] if kind == "token" else costs.PAPER_TRAIN_SIZES[task]
        row = {"task": task, "training set": f"{examples:,} {'words' if kind == 'token' else 'examples'}",
               "L": lengths[task], "real tokens": TYPICAL_TOKENS[task] if kind == "sentence" else "—"}
        for name in ("roberta-base", "roberta-large"):
            layers, hidden, _ = costs.MODEL_SHAPES[name]
            real = costs.feature_cache_bytes(kind, examples, layers, hidden, length=lengths[task],
                                             tokens_per_example=TYPICAL_TOKENS[task])
            padded = costs.feature_cache_bytes(kind, examples, layers, hidden, length=lengths[task])
            short = name.replace("roberta-", "")
            row[f"{short}: store"] = round(real / 2**30, 1)
            row[f"{short}: padded"] = round(padded / 2**30, 1)
            row[f"{short}: mode"] = "cache" if real <= budget else "stream"
        rows.append(row)
    return pd.DataFrame(rows).set_index("task")
