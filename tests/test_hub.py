"""The hub paths a user with a network runs: every task's dataset id and every paper model's config load from the
hub. Marked ``hub`` and skipped unless ``PAPA_HUB=1`` (this machine and CI have no network; the GPU workflow,
``.github/workflows/reproduce-gpu.yml``, runs them with ``python -m pytest -m hub tests/test_hub.py``)."""

from __future__ import annotations

import os

import pytest

from papa_lib.book.profiles import PAPER_MODELS

pytestmark = [pytest.mark.hub, pytest.mark.skipif(os.environ.get("PAPA_HUB") != "1",
                                                  reason="needs the model and dataset hub (PAPA_HUB=1)")]

TASKS = ("cola", "sst2", "mrpc", "mnli", "ner", "pos")
#: The paper's models, the two sentence encoders the book's local runs use, and the decoder LM.
MODELS = (*PAPER_MODELS, "sentence-transformers/all-MiniLM-L6-v2", "sentence-transformers/all-mpnet-base-v2",
          "google/gemma-3-270m")


@pytest.mark.parametrize("split", ["train", "validation"])
@pytest.mark.parametrize("task", TASKS)
def test_every_task_loads_from_the_hub(task, split):
    from papa_lib.experiments import tasks

    examples = tasks.load_task(task, split, data_dir=None, limit=8)
    assert len(examples.labels) == 8 and examples.source.startswith("hub:")


@pytest.mark.parametrize("model", MODELS)
def test_every_model_config_loads_and_has_an_adapter(model):
    from transformers import AutoConfig

    from papa_lib import supported_model_types

    config = AutoConfig.from_pretrained(model)
    assert config.model_type in supported_model_types(), config.model_type
