"""The example inputs the chapters compute on live (attention matrices, Eq. 3): a few SST-2 validation sentences
from the profile's data, or sentences written here when there is no data folder."""

from __future__ import annotations

__all__ = ["BUILT_IN", "sentences"]

#: Sentences used when the profile has no data folder (e.g. the paper profile, which reads the hub).
BUILT_IN = [
    "A gripping, beautifully shot film.",
    "The plot is thin and the jokes fall flat.",
    "It never quite decides what it wants to be.",
    "An honest, moving portrait of a family.",
    "Too long, too loud and far too pleased with itself.",
    "The cast is wonderful.",
]


def sentences(setup, limit: int = 64) -> tuple[list[str], str]:
    """``(texts, label)``: the first ``limit`` sentences of SST-2's validation split in the setup's data folder
    (generated ones at ``smoke``), or :data:`BUILT_IN` without a data folder; ``label`` names them for a figure."""
    from ..experiments.tasks import load_task

    if setup.data_dir is None:
        return list(BUILT_IN[:limit]), "sentences written in this chapter"
    examples = load_task("sst2", "validation", data_dir=setup.data_dir, limit=limit)
    return list(examples.texts), f"SST-2 validation, {setup.data_label}"
