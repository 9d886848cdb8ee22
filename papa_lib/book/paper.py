"""Transitional: the paper's numbers live in :mod:`papa_lib.analysis.paper`. (Removed once no chapter imports this.)"""

from ..analysis.paper import PAPER_DIR, TABLES, captioned, headline, table, table_long  # noqa: F401
