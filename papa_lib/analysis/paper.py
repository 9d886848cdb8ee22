"""The paper's reported numbers (Hassid et al. 2022), transcribed under ``data/paper/`` with their sources.

Used by the book to show the paper's figures beside ours, always labelled as the paper's (model, data).
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

PAPER_DIR = Path(__file__).resolve().parents[2] / "data" / "paper"
TABLES = {
    "table1": ("table1_roberta_base.csv", "RoBERTa-base", "Table 1"),
    "table2": ("table2_roberta_base.csv", "RoBERTa-base", "Table 2"),
    "table3": ("table3_hyperparameters.csv", "all models", "Table 3"),
    "table4": ("table4_roberta_large.csv", "RoBERTa-large", "Table 4"),
    "table5": ("table5_roberta_large.csv", "RoBERTa-large", "Table 5"),
}


def table(name: str) -> pd.DataFrame:
    """One of the paper's tables (``table1`` ... ``table5``) as a DataFrame; ``.attrs`` holds model and source."""
    if name not in TABLES:
        raise ValueError(f"unknown paper table {name!r}; choose one of {sorted(TABLES)}")
    filename, model, source = TABLES[name]
    frame = pd.read_csv(PAPER_DIR / filename)
    frame.attrs.update(model=model, source=f"Hassid et al. 2022, {source}")
    return frame


def headline(key: str | None = None):
    """Numbers stated in the paper's text; one value for ``key``, else the whole table (key, value, claim, source)."""
    frame = pd.read_csv(PAPER_DIR / "headline.csv")
    if key is None:
        return frame
    row = frame[frame.key == key]
    if row.empty:
        raise KeyError(f"no headline number {key!r}; known: {', '.join(frame.key)}")
    return float(row.value.iloc[0])

