"""Transitional: the claims engine lives in :mod:`papa_lib.analysis.claims`; the sentences in
:mod:`papa_lib.book.claim_text`. (Removed once every chapter imports those.)"""

from ..analysis.claims import *  # noqa: F401,F403
from ..analysis.claims import _from_parts, _number  # noqa: F401
from .claim_text import (  # noqa: F401
    SENTENCE_ENCODERS,
    book_table,
    claim_row,
    every_task_text,
    ours_text,
    pair_caveat,
    sig3,
    summary,
    verdict_sentence,
)
