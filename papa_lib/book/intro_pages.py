"""The introduction's tables and figure (book/intro.md): what a chapter run uses, the paper's tasks and models, how
many heads PAPA can replace, and the paper's claims checked against the records (:mod:`papa_lib.book.claims`)."""

from __future__ import annotations

import os
from typing import Any, Sequence

import pandas as pd

from . import charts, claims, profiles

__all__ = ["HEADS", "claims_rules", "claims_table", "findings", "glue_findings", "heads_chart", "settings", "task_table"]

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
    from .provenance import seeds_label

    if frame is None:
        frame = setup.results(run_missing=False)
    seeds = seeds_label(frame["seed"]) if "seed" in frame.columns else ""
    values = {
        "profile": setup.profile, "model (live cells)": setup.model_label, "data (live cells)": setup.data_label,
        "data folder": _shown(setup, setup.data_dir), "results folder": _shown(setup, setup.results_dir),
        "records in the results folder": f"{len(frame):,}", "seeds in the records": seeds or "no records yet",
        "tasks": ", ".join(tasks), "device": setup.device,
        "missing runs": "run now" if runs_missing else "not run: read the committed results",
    }
    return pd.DataFrame({"setting": list(values), "value": list(values.values())}).style.hide(axis="index")


def task_table(setup, tasks: Sequence[str]) -> Any:
    """The paper's tasks (metric, hub dataset, reported split, Table 3's L), captioned with the paper's models and
    what this run uses instead."""
    from ..experiments.tasks import TASKS

    rows = [{"task": name, "metric": TASKS[name].metric, "paper: dataset": TASKS[name].hub_dataset,
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
    """Each claim of the paper, the statistic that tests it, the paper's value, ours with its interval and the
    verdict (:func:`papa_lib.book.claims.for_setup`), or a sentence when the profile has no records yet."""
    from IPython.display import Markdown

    verdicts = claims.for_setup(setup)
    if verdicts is None:
        return Markdown("No records in this profile's results folder yet, so no claim can be checked.")
    return verdicts.drop(columns="rule")


def claims_rules(setup) -> Any:
    """The rule behind every verdict of :func:`claims_table`."""
    verdicts = claims.for_setup(setup)
    return None if verdicts is None else verdicts[["claim", "rule"]].drop_duplicates().set_index("claim")


#: Readable task names for the prose.
TASK_NAMES = {"cola": "CoLA", "sst2": "SST-2", "mrpc": "MRPC", "mnli": "MNLI", "ner": "NER", "pos": "POS"}


def findings(setup, frame: pd.DataFrame | None = None) -> dict[str, str]:
    """The numbers the intro's first screen states, as text, from the records
    (:func:`papa_lib.book.figures.all_constant_drop` and :func:`~papa_lib.book.figures.half_heads_drop`, as in the
    probing chapter) and the paper's (:func:`papa_lib.book.paper.headline`). Every name is always there: without
    records its value says "not measured yet"."""
    from . import figures, paper
    from .provenance import seeds_label
    from .records import describe

    frame = setup.results(run_missing=False) if frame is None else frame
    missing = "not measured yet"

    def percent(value, digits: int = 1) -> str:
        return missing if value is None or pd.isna(value) else f"{value:.{digits}%}"

    values = {"paper_drop_all": percent(paper.headline("mean_relative_drop_all_constant"), 0),
              "paper_drop_all_max": percent(paper.headline("max_relative_drop_all_constant"), 0)}
    if frame.empty:
        return {**values, "found_model": setup.model_label, "found_data": "no records yet", "found_records": "0",
                "found_seeds": "no seeds", "found_tasks": "0", "found_drop_all": missing,
                "found_drop_all_max": missing, "found_drop_all_worst": missing, "found_drop_half": missing,
                "found_drop_half_max": missing}
    every, half = figures.all_constant_drop(frame), figures.half_heads_drop(frame)
    who = describe(frame)
    return {**values,
            "found_model": who["model"], "found_data": who["data"], "found_records": f"{len(frame):,}",
            "found_seeds": seeds_label(frame["seed"]), "found_tasks": str(every.count),
            "found_drop_all": percent(every.mean), "found_drop_all_max": percent(every.max),
            "found_drop_all_worst": TASK_NAMES.get(str(every.worst), str(every.worst)) if every.count else missing,
            "found_drop_half": percent(half.mean), "found_drop_half_max": percent(half.max)}


def glue_findings(setup, frame: pd.DataFrame | None = None) -> None:
    """Glue every value of :func:`findings` under its name (the intro's first screen pastes them)."""
    from .prose import glue_all

    glue_all(findings(setup, frame))
