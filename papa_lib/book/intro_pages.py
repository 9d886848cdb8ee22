"""The introduction's tables and figure (book/intro.md): what a chapter run uses, the paper's tasks and models, how
many heads PAPA can replace, and the paper's claims checked against the records (:mod:`papa_lib.book.claims`)."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd

from . import charts, claims, profiles
from .display import markdown
from .tables import METRIC_NAMES, task_name

__all__ = ["HEADS", "claims_rules", "claims_summary", "claims_table", "findings", "glue_findings", "heads_chart",
           "settings", "task_table"]

#: The models PAPA is run on, their sizes and where the book uses them (Sec. 4.1, 5.5; the local profile).
HEADS = pd.DataFrame(
    [("BERT-base", "base", 12, 12, "paper"), ("RoBERTa-base", "base", 12, 12, "paper"),
     ("DeBERTa-base", "base", 12, 12, "paper"), ("ELECTRA-base", "base", 12, 12, "paper (Sec. 5.5)"),
     ("BERT-large", "large", 24, 16, "paper"), ("RoBERTa-large", "large", 24, 16, "paper"),
     ("DeBERTa-large", "large", 24, 16, "paper"), ("all-MiniLM-L6-v2", "small", 6, 12, "local profile")],
    columns=["model", "size", "layers", "heads_per_layer", "used_in"],
)


def _shown(setup, path) -> str:
    """A folder as the reader should see it: relative to the repository root, the packaged sample by name, never a
    machine path (a temporary or home folder)."""
    if path is None:
        return "(none: the dataset hub)"
    if setup.data_source == "sample" and path == setup.data_dir:
        return "papa_lib/samples (the packaged sample)"
    path = os.fspath(path)
    inside = os.path.abspath(path).startswith(os.path.abspath(setup.root.parent))
    return os.path.relpath(path, setup.root) if inside else os.path.basename(path.rstrip(os.sep))


def settings(setup, tasks: Sequence[str], runs_missing: bool, frame: pd.DataFrame | None = None) -> pd.DataFrame:
    """What a chapter run uses: profile, model and data of the cells that compute live, the results folder and the
    seeds of its records (read from the records, never from a parameter), tasks, device, missing runs."""
    from .provenance import seeds_per_setting

    if frame is None:
        frame = setup.results(run_missing=False)
    seeds = seeds_per_setting(frame)
    values = {
        "profile": setup.profile, "model (live cells)": setup.model_label, "data (live cells)": setup.data_label,
        "data folder": _shown(setup, setup.data_dir), "results folder": _shown(setup, setup.results_dir),
        "records in the results folder": f"{len(frame):,}", "seeds in the records": seeds or "no records yet",
        "tasks": ", ".join(task_name(t) for t in tasks), "device": setup.device,
        "missing runs": "run now" if runs_missing else "not run: read the committed results",
    }
    return pd.DataFrame({"setting": list(values), "value": list(values.values())}).style.hide(axis="index")


def task_table(setup, tasks: Sequence[str]) -> Any:
    """The paper's tasks (metric, hub dataset, reported split, Table 3's L), captioned with the paper's models and
    what this run uses instead."""
    from ..experiments.tasks import TASKS

    rows = [{"task": name, "metric": METRIC_NAMES.get(TASKS[name].metric, TASKS[name].metric),
             "paper: dataset": TASKS[name].hub_dataset,
             "paper: reported split": TASKS[name].validation_split, "L (Table 3)": TASKS[name].max_length}
            for name in tasks]
    caption = (f"Paper models: {', '.join(profiles.PAPER_MODELS)}. This run: model {setup.model_label}, "
               f"data {setup.data_label}, profile {setup.profile}.")
    return pd.DataFrame(rows).set_index("task").style.set_caption(caption)


def heads_chart(profile: str) -> Any:
    """How many attention heads each model has (layers x heads per layer); hover over a bar for the details."""
    import altair as alt

    heads = HEADS.assign(heads=HEADS["layers"] * HEADS["heads_per_layer"])
    return alt.Chart(heads).mark_bar().encode(
        x=alt.X("heads:Q", title="attention heads (layers x heads per layer)"),
        y=alt.Y("model:N", sort="-x", title=None),
        color=alt.Color("size:N", title="model size", sort=["large", "base", "small"]),
        tooltip=["model:N", "layers:Q", alt.Tooltip("heads_per_layer:Q", title="heads per layer"),
                 alt.Tooltip("heads:Q", title="heads in total"), alt.Tooltip("used_in:N", title="used in")],
    ).properties(height=alt.Step(28), width=420, title=charts.chart_title(
        "Attention heads PAPA can replace, per model", model="paper models + MiniLM (configs)",
        data="architectures, Sec. 4.1", profile=profile))


def claims_table(setup) -> Any:
    """The claims table of :func:`papa_lib.book.claims.book_table`: each claim's full statement, the paper's value,
    ours with its 95% interval (three significant figures), the verdict, the verdict with every task and a link to
    the chapter that shows it (rows of :func:`papa_lib.book.claims.for_setup`); a sentence without records."""
    table = claims.for_setup(setup)
    if table is None:
        return markdown("No records in this profile's results folder yet, so no claim can be checked.")
    return markdown(claims.book_table(table))


def claims_summary(setup) -> Any:
    """What the records show about the paper's claims, in plain language (:func:`papa_lib.book.claims.summary`), and,
    where the records hold several models, one sentence on what C3 across them can tell
    (:func:`papa_lib.book.claims.pair_caveat`)."""
    table = claims.for_setup(setup)
    if table is None:
        return markdown("No records in this profile's results folder yet, so no claim can be checked.")
    pair = claims.pair_caveat(m for m in table.model.astype(str) if " vs " not in m)
    return markdown(claims.summary(table) + (f"\n\n{pair}" if pair else ""))


def claims_rules(setup=None) -> Any:
    """The declared rule behind every verdict (``data/paper/claims_rules.csv``, :func:`papa_lib.book.claims.rules`):
    claim, statistic and rule in words, with the band it tests."""
    rules = claims.rules()
    return pd.DataFrame({"statistic": rules.statistic, "rule": [claims.rule_text(r) for _, r in rules.iterrows()],
                         "source": rules.source}).rename_axis("claim")


def _task_names(tasks) -> str:
    """A claim row's task list (``"cola, sst2 (left out: ...)"``) as readable names: ``"CoLA, SST-2"``."""
    names = [t.strip() for t in str(tasks).split(" (")[0].split(";")[0].split(",") if t.strip()]
    return ", ".join(task_name(t) for t in names)


def worst_task(tasks_text) -> str:
    """The task C1b's ``tasks`` cell names as the worst (``'...; worst task: cola; 3 to 10 seeds ...'`` -> ``cola``),
    ``''`` when it names none."""
    text = str(tasks_text)
    return text.rsplit("worst task: ", 1)[-1].split(";")[0].strip() if "worst task: " in text else ""


def findings(setup, frame: pd.DataFrame | None = None) -> dict[str, str]:
    """The numbers the intro's first screen states, as text: the claims engine's rows C1a (task-averaged drop with
    every head constant), C1b (the worst task) and C2 (half the heads) for the setup's model, with their 95%
    intervals and verdicts (:func:`papa_lib.book.claims.for_setup`, so the intro says what the claims table and the
    probing chapter say), C1a of any other model in the records, and the paper's numbers
    (:func:`papa_lib.book.paper.headline`). Every name is always there: without records its value says
    "not measured yet"."""
    from . import paper
    from .provenance import seeds_per_setting
    from .records import describe

    given = frame is not None
    frame = setup.results(run_missing=False) if frame is None else frame
    missing = "not measured yet"

    def percent(value) -> str:
        return missing if value is None or not np.isfinite(value) else f"{claims.sig3(100 * value)}%"

    def interval(row) -> str:
        if not np.isfinite(row.ours):
            return missing
        if not (np.isfinite(row.ci_low) and np.isfinite(row.ci_high)):
            return f"{percent(row.ours)} (no interval: a configuration it reads has one seed)"
        return f"{percent(row.ours)} (95% interval {percent(row.ci_low)} to {percent(row.ci_high)})"

    values = {"paper_drop_all": f"{paper.headline('mean_relative_drop_all_constant'):.0%}",
              "paper_drop_all_max": f"{paper.headline('max_relative_drop_all_constant'):.0%}"}
    empty = {"found_model": setup.model_label, "found_data": "no records yet", "found_records": "0",
             "found_seeds": "no seeds", "found_tasks": missing, "found_drop_all": missing,
             "found_verdict_all": missing, "found_drop_all_max": missing, "found_drop_all_worst": missing,
             "found_verdict_max": missing, "found_drop_half": missing, "found_verdict_half": missing,
             "found_other_models": ""}
    if frame.empty:
        table = None
    elif given:  # records handed in: decide the claims on them alone
        table = claims.claims_table(frame)
    else:
        table = claims.for_setup(setup)
    if table is None or table.empty:
        return {**values, **empty}
    who = describe(frame)
    model = who["model"] if (table.model == who["model"]).any() else table.model.iloc[0]
    c1a, c1b, c2 = (claims.claim_row(c, table, model) for c in ("C1a", "C1b", "C2"))
    worst = worst_task(c1b.tasks) or missing
    others = [r for r in table[(table.claim == "C1a") & (table.model != model)].itertuples()
              if " vs " not in r.model and np.isfinite(r.ours)]
    other_text = " ".join(
        f"On {r.model} (tasks: {_task_names(r.tasks)}) the same drop is {interval(r)}: "
        f"{r.verdict}." for r in others)
    return {**values,
            "found_model": model, "found_data": who["data"], "found_records": f"{len(frame):,}",
            "found_seeds": seeds_per_setting(frame), "found_tasks": _task_names(c1a.tasks),
            "found_drop_all": interval(c1a), "found_verdict_all": str(c1a.verdict),
            "found_drop_all_max": interval(c1b), "found_drop_all_worst": task_name(worst),
            "found_verdict_max": str(c1b.verdict), "found_drop_half": interval(c2),
            "found_verdict_half": str(c2.verdict), "found_other_models": other_text}


def glue_findings(setup, frame: pd.DataFrame | None = None) -> None:
    """Glue every value of :func:`findings` under its name (the intro's first screen pastes them)."""
    from .prose import glue_all

    glue_all(findings(setup, frame))
