"""The introduction's tables and figure (book/intro.md): what a chapter run uses, the paper's tasks and models, how
many heads PAPA can replace, and the paper's claims checked against the records (:mod:`papa_lib.book.claims`)."""

from __future__ import annotations

import os
from typing import Any, Sequence

import pandas as pd

from . import charts, claims, profiles

__all__ = ["HEADS", "claims_rules", "claims_summary", "claims_table", "heads_chart", "settings", "task_table"]

#: The models PAPA is run on, their sizes and where the book uses them (Sec. 4.1, 5.5; the local profile).
HEADS = pd.DataFrame(
    [("BERT-base", "base", 12, 12, "paper"), ("RoBERTa-base", "base", 12, 12, "paper"),
     ("DeBERTa-base", "base", 12, 12, "paper"), ("ELECTRA-base", "base", 12, 12, "paper (Sec. 5.5)"),
     ("BERT-large", "large", 24, 16, "paper"), ("RoBERTa-large", "large", 24, 16, "paper"),
     ("DeBERTa-large", "large", 24, 16, "paper"), ("all-MiniLM-L6-v2", "small", 6, 12, "local profile")],
    columns=["model", "size", "layers", "heads_per_layer", "used_in"],
)


def _shown(setup, path) -> str:
    if path is None:
        return "(none: the dataset hub)"
    path = os.fspath(path)
    inside = os.path.abspath(path).startswith(os.path.abspath(setup.root.parent))
    return os.path.relpath(path, setup.root) if inside else path


def settings(setup, tasks: Sequence[str], seeds: int, runs_missing: bool) -> pd.DataFrame:
    """What a chapter run uses: profile, model, data (folder), results folder, tasks, seeds, device, missing runs."""
    values = {
        "profile": setup.profile, "model": setup.model_label, "data": setup.data_label,
        "data folder": _shown(setup, setup.data_dir), "results folder": _shown(setup, setup.results_dir),
        "tasks": ", ".join(tasks), "seeds": seeds, "device": setup.device,
        "missing runs": "run now" if runs_missing else "not run: read the committed results",
    }
    return pd.DataFrame({"value": list(values.values())}, index=pd.Index(list(values), name="setting"))


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
    """The claims table of :func:`papa_lib.book.claims.book_table`: each claim's full statement, the paper's value,
    ours with its 95% interval (three significant figures), the verdict, the verdict with every task and a link to
    the chapter that shows it (rows of :func:`papa_lib.book.claims.for_setup`); a sentence without records."""
    from IPython.display import Markdown

    table = claims.for_setup(setup)
    if table is None:
        return Markdown("No records in this profile's results folder yet, so no claim can be checked.")
    return Markdown(claims.book_table(table))


def claims_summary(setup) -> Any:
    """What the records show about the paper's claims, in plain language (:func:`papa_lib.book.claims.summary`)."""
    from IPython.display import Markdown

    table = claims.for_setup(setup)
    if table is None:
        return Markdown("No records in this profile's results folder yet, so no claim can be checked.")
    return Markdown(claims.summary(table))


def claims_rules(setup=None) -> Any:
    """The declared rule behind every verdict (``data/paper/claims_rules.csv``, :func:`papa_lib.book.claims.rules`):
    claim, statistic and rule in words, with the band it tests."""
    rules = claims.rules()
    return pd.DataFrame({"statistic": rules.statistic, "rule": [claims.rule_text(r) for _, r in rules.iterrows()],
                         "source": rules.source}).rename_axis("claim")
