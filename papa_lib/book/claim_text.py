"""How the claims engine's rows read (:mod:`papa_lib.book.claims`): three significant figures, a value with its
interval, one claim's sentence, the summary paragraph, the intro's Markdown table, and what C3 across two models can
tell (:func:`pair_caveat`). Re-exported by :mod:`papa_lib.book.claims`."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import numpy as np
import pandas as pd

from ..analysis.claims import ours_text, sig3  # noqa: F401  (used below)
from .tables import name_tasks


# ---------------------------------------------------------------------------------------------- rendering

def every_task_text(row: pd.Series | Mapping) -> str | None:
    """Ours with every task included, as :func:`ours_text` writes it; ``None`` where that changes neither the number
    nor the verdict (a table then says "same")."""
    every = ours_text({"ours": row["ours_all_tasks"], "ci_low": row["ci_low_all_tasks"],
                       "ci_high": row["ci_high_all_tasks"]})
    return None if (every, row["verdict_all_tasks"]) == (ours_text(row), row["verdict"]) else every


def claim_row(claim_id: str, table: pd.DataFrame, model: str | None = None) -> pd.Series:
    """The row of one claim (of ``model``, default the first model that has it)."""
    rows = table[table.claim == claim_id]
    if model is not None:
        rows = rows[rows.model == model]
    if rows.empty:
        raise KeyError(f"no claim {claim_id!r}{f' for {model}' if model else ''} in the claims table")
    return rows.iloc[0]


def mixed_devices(row) -> str:
    """``'cpu and cuda'`` when a claim row's records come from more than one device (its ``devices``), else ``''``."""
    devices = str(getattr(row, "devices", "") or "")
    return devices.replace(", ", " and ") if "," in devices else ""


def verdict_sentence(claim_id: str, table: pd.DataFrame, model: str | None = None) -> str:
    """One plain sentence of a claim's row: statement, ours with its interval and tasks, the paper's value, the
    verdict and its rule (and the verdict with every task, when it differs; the devices, when two made its records)."""
    row = claim_row(claim_id, table, model)
    if str(row.verdict).startswith(("not testable", "not measured")):
        return f"{claim_id} — {row.statement} Verdict for {row.model}: **{row.verdict}**."
    text = (f"{claim_id} — {row.statement} Ours ({row.model}; {row.statistic}): {ours_text(row)}"
            f"{f' over {name_tasks(row.tasks)}' if row.tasks else ''}; paper: {row.paper}. Verdict: **{row.verdict}** "
            f"({row.rule}).")
    every = {"ours": row.ours_all_tasks, "ci_low": row.ci_low_all_tasks, "ci_high": row.ci_high_all_tasks}
    if row.verdict_all_tasks and (ours_text(every) != ours_text(row) or row.verdict_all_tasks != row.verdict):
        text += f" With every task included: {ours_text(every)}, **{row.verdict_all_tasks}**."
    if devices := mixed_devices(row):
        text += (f" Its records were made on {devices}: the device moves a probe's number "
                 "like another draw of the seed, at times by more than the seeds' spread (BENCHMARKS.md, CPU rerun of "
                 "GPU-made rows).")
    return text


def summary(table: pd.DataFrame) -> str:
    """What the records show in plain language (Markdown), every number from the engine's rows: one bullet per
    verdict naming the claims that got it, then C1a's task-averaged drop as an example."""
    models = [m for m in table.model.unique() if " vs " not in str(m)]
    groups: dict[str, list[str]] = {}
    for row in table.itertuples():
        key = row.verdict.split(":")[0]
        groups.setdefault(key, []).append(row.claim if len(models) < 2 or " vs " in row.model
                                          else f"{row.claim} ({row.model})")
    order = ["agrees", "direction agrees", "differs", "direction differs", "negligible", "inconclusive",
             "not measured", "not testable"]
    words = {  # verdict -> (plural, singular, why in brackets)
        "agrees": ("agree with the paper", "agrees with the paper", ""),
        "direction agrees": ("agree in direction", "agrees in direction", ""),
        "differs": ("differ from it", "differs from it", ""),
        "direction differs": ("differ in direction", "differs in direction", ""),
        "negligible": ("show the paper's sign but a negligible effect",
                       "shows the paper's sign but a negligible effect", "|ρ| < 0.1"),
        "inconclusive": ("are inconclusive", "is inconclusive",
                         "their 95% interval reaches both inside and outside the paper's band"),
        "not measured": ("are not measured yet", "is not measured yet", ""),
        "not testable": ("cannot be tested with these records", "cannot be tested with these records", ""),
    }
    parts = []
    for key in (k for k in order if k in groups):
        plural, single, why = words[key]
        n = len(groups[key])
        parts.append(f"- **{n} {single if n == 1 else plural}**{f' ({why})' if why else ''}: {', '.join(groups[key])}")
    text = f"Of the {len(table)} claim rows checked on {' and '.join(models) or 'no model'}:\n\n" + "\n".join(parts)
    c1a = table[(table.claim == "C1a") & table.ours.notna()]
    if len(c1a):
        row = c1a.iloc[0]
        tasks, _, seeds = name_tasks(str(row.tasks)).split(" (")[0].partition("; ")
        text += (f"\n\nFor example, on {row.model}, replacing every head by its constant matrix costs {ours_text(row)} "
                 f"of the original score on average over {tasks} (C1a{'; ' + seeds if seeds else ''}; the paper: "
                 f"{row.paper}).")
    return text


#: Which column of :func:`book_table` holds the statement (1-based, as CSS's ``nth-child`` counts).
STATEMENT_COLUMN = 3


def book_table(table: pd.DataFrame, link_suffix: str = ".html") -> str:
    """The intro's claims table as Markdown: claim, model (each claim is decided per model), full statement, the
    paper's value, ours with its interval (three significant figures), the verdict (naming the devices when its
    records come from more than one), the verdict with every task, and a link to the chapter. No index, no NaN. The
    statement is always the third column (:data:`STATEMENT_COLUMN`): the book's style sheet widens it in the intro's
    cell tagged ``claims-table``.

    The links point at the built book's pages (``probing.html``: myst-nb renders a cell's Markdown output as plain
    CommonMark, so a ``probing.md`` link would stay unresolved and the build's link check fails on it); pass
    ``link_suffix=".md"`` for links between the chapters' sources (Jupyter). A verdict's reason (``"not testable:
    needs …"``) goes to a numbered note under the table, so the verdict cell stays one or two words tall. A claim
    decided for several models states its statement and the paper's value on its first row only."""
    header = ["claim", "model", "statement", "paper", "ours [95% interval]", "verdict", "with every task", "chapter"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    notes: list[str] = []

    def short(verdict) -> str:
        label, _, why = str(verdict).partition(": ")
        if not why:
            return f"**{label}**"
        if why not in notes:
            notes.append(why)
        return f"**{label}** (note {notes.index(why) + 1})"

    previous = None
    for row in table.itertuples():
        again, previous = row.claim == previous, row.claim  # a claim's next model: its statement is said above
        ours, every = ours_text(row._asdict()), every_task_text(row._asdict())
        mixed = f" (rows made on {devices})" if (devices := mixed_devices(row)) else ""
        cells = [row.claim, row.model] + [
            "" if again else row.statement, "" if again else str(row.paper), ours, f"{short(row.verdict)}{mixed}",
            "same" if every is None else f"{every} {short(row.verdict_all_tasks)}",
            f"[{row.chapter.removesuffix('.md')}]({row.chapter.removesuffix('.md')}{link_suffix})"]
        lines.append("| " + " | ".join(str(c).replace("|", "\\|").replace("\n", " ") for c in cells) + " |")
    notes_text = "".join(f"\n{i}. {why[:1].upper()}{why[1:]}." for i, why in enumerate(notes, 1))
    return "\n".join(lines) + (f"\n\nNotes:\n{notes_text}" if notes else "")


#: The committed local models that are sentence-transformers encoders: pretrained, then contrastively fine-tuned on
#: the same sentence-pair data (the paper's models are MLM-pretrained checkpoints, probed as released).
SENTENCE_ENCODERS = ("all-MiniLM-L6-v2", "all-mpnet-base-v2")


def pair_caveat(models: Iterable[str], long: bool = False) -> str:
    """What C3 across these models can tell, in words (``''`` for fewer than two models). The short form is one
    sentence (the intro, beside the claims table); ``long`` adds why (the probing chapter, beside Fig. 3)."""
    models = [str(m) for m in dict.fromkeys(models)]
    if len(models) < 2:
        return ""
    names = " and ".join(models) if len(models) == 2 else f"{', '.join(models[:-1])} and {models[-1]}"
    sentence_encoders = all(m in SENTENCE_ENCODERS for m in models)
    kind = (
        "both are sentence-transformers encoders, contrastively fine-tuned on the same sentence-pair data, "
        "while the paper's models are MLM-pretrained"
        if sentence_encoders and len(models) == 2
        else "the records hold only these models, not the paper's"
    )
    count = "two" if len(models) == 2 else str(len(models))
    short = f"C3 compares {names}: {kind}, and {count} models show a direction, not a trend."
    if not long:
        return short
    return (
        short + " So the pair can say whether the stronger of two encoders trained the same way loses more "
        "without input-dependent attention; it cannot say whether that holds across model sizes in general, nor "
        "for MLM-pretrained models, whose attention the contrastive fine-tuning may have reshaped. Its verdict "
        'is therefore named for a direction ("direction agrees", "direction differs", "inconclusive"), '
        'never a bare "agrees".'
    )
