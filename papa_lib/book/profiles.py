"""Run profiles: what a chapter runs on, and where its results live.

=========  ==========================================================  ==========  =====================================
profile    model and data                                              runs on     results
=========  ==========================================================  ==========  =====================================
``smoke``  a tiny random BERT and generated data (:mod:`papa_lib.smoke`)  seconds    ``runs/smoke/`` (never committed)
``local``  the embedded all-MiniLM-L6-v2 and a local data folder        CPU         ``data/results/local-minilm/``
           such as ``../shared/data`` (else the packaged sample)
``paper``  the paper's hub models and hub datasets                     GPU         ``data/results/paper/``
=========  ==========================================================  ==========  =====================================

Each profile has a grid file (``<results>/grid.yaml``; smoke's is built here) that declares every run the book shows.
Chapters call :func:`resolve` with their papermill parameters and then :meth:`Setup.results`, which reads the
results store and — when ``run_missing`` is true — first runs whatever the grid still lacks (resuming).

At ``local``, a data folder that does not hold the files the chapters compute on (a fresh machine has no
``../shared/data``) gives way to the real-text sample packaged with the library
(:mod:`papa_lib.experiments.sample_data`), with a one-line notice when a chapter first reads its data; the hub is
never tried. :attr:`Setup.data_source` and :attr:`Setup.data_label` say which data a run used; committed results are
read as they are.
"""

from __future__ import annotations

import copy
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

PROFILES = ("smoke", "local", "paper")
RESULT_FOLDERS = {"smoke": "runs/smoke/results", "local": "data/results/local-minilm", "paper": "data/results/paper"}
PAPER_MODELS = ("bert-base-uncased", "roberta-base", "microsoft/deberta-base", "bert-large-uncased", "roberta-large",
                "microsoft/deberta-large", "google/electra-base-discriminator")

SMOKE_GRID = {
    "model": None,
    "profile": "smoke",
    "seeds": [0, 1],
    "limit": None,
    "max_length": {"default": 16, "mnli": 32},
    "epochs": 1,
    "lambda_epochs": 1,
    "inloop_epochs": 1,
    "lambda_learning_rate": 0.05,
    "blocks": [
        {"name": "fig2", "tasks": ["sst2", "cola", "mnli", "ner", "pos"], "matrix_types": ["average"],
         "orders": ["lambda"], "fractions": [1, 0.5, 0.125, 0.0625, 0]},
        {"name": "table1", "tasks": ["sst2", "cola", "mnli", "ner", "pos"],
         "matrix_types": ["average", "identity", "toeplitz", "zeros", "trainable_toeplitz", "trainable_average"],
         "fractions": [0]},
        {"name": "table2", "tasks": ["sst2", "cola", "ner", "pos"], "matrix_types": ["average"],
         "matrices_from": "mnli", "fractions": [0]},
        {"name": "fig5", "tasks": ["mnli"], "matrix_types": ["average"],
         "orders": ["lambda", "reversed", "first_to_last", "last_to_first", "random"],
         "fractions": [1, 0.5, 0.125, 0.0625, 0]},
    ],
}


def find_repo_root(start: str | os.PathLike | None = None, *, fallback: str = "start") -> Path:
    """Return the book's repository root: the nearest folder (from ``start``, default the working directory,
    upwards) holding ``_config.yml`` beside ``_toc.yml`` or the ``papa_lib/`` package.

    Chapters run with the working directory set to ``book/`` (Jupyter Book) or to the root (papermill,
    :func:`papa_book.build.run_chapters`); resolving paths against this root makes both agree. Outside a checkout
    (e.g. in Colab) it is the start folder itself (``fallback="start"``) or the folder above this package
    (``fallback="package"``, what :func:`resolve` uses).
    """
    here = Path(start if start is not None else Path.cwd()).resolve()
    if here.is_file():
        here = here.parent
    for folder in (here, *here.parents):
        if (folder / "_config.yml").is_file() and ((folder / "_toc.yml").is_file() or (folder / "papa_lib").is_dir()):
            return folder
    return Path(__file__).resolve().parents[2] if fallback == "package" else here


def shared_data_dir(root: str | os.PathLike | None = None) -> Path:
    """``../shared/data`` beside the checkout, the folder the ``local`` profile, the CLI and the benchmarks read:
    beside ``root``, by default the repository root (:func:`find_repo_root`, ``fallback="package"``)."""
    return Path(root if root is not None else find_repo_root(fallback="package")).parent / "shared" / "data"


def shown_folder(folder: str | os.PathLike, root: str | os.PathLike) -> str:
    """A folder as a reader should see it, never a machine path: relative to the repository ``root`` when it lies
    beside it (``../shared/data``), else its name (``/tmp/papa-smoke-data`` -> ``papa-smoke-data``)."""
    folder = Path(folder)
    if folder.resolve().is_relative_to(Path(root).resolve().parent):
        return os.path.relpath(folder, root)
    return folder.name


@dataclass
class Setup:
    """A resolved profile: model, data and results folder for one chapter run.

    ``requested_data_dir`` is the data folder the parameters name; :attr:`data_dir` is the one the chapter reads,
    resolved on first use: at ``local`` a folder without the chapters' files gives way to the packaged sample, and
    :attr:`sample_reason` says why (the page's banner shows it: :func:`papa_lib.book.provenance.live_facts`).
    """

    profile: str
    root: Path
    model_name: str | None
    requested_data_dir: Path | None
    results_dir: Path
    device: str = "cpu"
    _encoder: tuple | None = field(default=None, repr=False)
    _data_dir: Path | None = field(default=None, repr=False)
    _data_resolved: bool = field(default=False, repr=False)
    _sample_reason: str | None = field(default=None, repr=False)

    @property
    def data_dir(self) -> Path | None:
        """The data folder the chapter reads (see the class docstring)."""
        if not self._data_resolved:
            folder = self.requested_data_dir
            if self.profile == "local":
                from ..experiments.sample_data import sample_dir, sample_reason

                self._sample_reason = sample_reason(folder, shown=shown_folder(folder, self.root))
                folder = sample_dir() if self._sample_reason else folder
            self._data_dir = Path(folder) if folder else None
            self._data_resolved = True
        return self._data_dir

    @property
    def sample_reason(self) -> str | None:
        """Why the chapter reads the packaged sample (``"../shared/data does not exist"``), else ``None``."""
        return self._sample_reason if self.data_dir is not None else None  # reading data_dir resolves both

    # ------------------------------------------------------------------ what produced a figure
    @property
    def model_label(self) -> str:
        if self.profile == "smoke":
            return "tiny random BERT"
        return self.model_name or "all-MiniLM-L6-v2"

    @property
    def data_source(self) -> str:
        """Which data the chapter computes on: ``generated``, ``hub``, ``sample`` (the packaged one) or ``local``."""
        from ..experiments.sample_data import is_sample

        if self.profile == "smoke":
            return "generated"
        if self.data_dir is None:
            return "hub"
        return "sample" if is_sample(self.data_dir) else "local"

    @property
    def data_label(self) -> str:
        """:attr:`data_source` in words, for figure subtitles."""
        from ..experiments.sample_data import SAMPLE_LABEL

        source = self.data_source
        if source == "local":
            return f"local files ({self.data_dir.name})"
        labels = {"generated": "generated data", "hub": "hub datasets", "sample": f"{SAMPLE_LABEL} (papa_lib/samples)"}
        return labels[source]

    def label(self) -> str:
        """"model: …, data: …, profile: …" for figure subtitles."""
        from .charts import label

        return label(self.model_label, self.data_label, self.profile)

    # ------------------------------------------------------------------ model
    def encoder(self):
        """(model, tokenizer) of the profile, loaded once."""
        if self._encoder is None:
            from transformers.utils import logging as hf_logging

            hf_logging.disable_progress_bar()  # keep chapter outputs free of weight-loading bars
            hf_logging.set_verbosity_error()
            if self.profile == "smoke":
                from ..smoke import tiny_encoder

                model, tokenizer = tiny_encoder("bert")
                model.to(self.device)
            else:
                from ..core.models import load_encoder

                model, tokenizer = load_encoder(self.model_name, device=self.device)
            self._encoder = (model, tokenizer)
        return self._encoder

    # ------------------------------------------------------------------ results
    def grid(self) -> dict:
        """The profile's declared grid (``smoke``: built in; otherwise ``<results_dir>/grid.yaml``)."""
        from ..experiments.grid import GridBlock, load_grid

        if self.profile == "smoke":
            spec = copy.deepcopy(SMOKE_GRID)
            spec["blocks"] = [GridBlock(**block) for block in spec["blocks"]]
            return spec
        path = self.results_dir / "grid.yaml"
        if not path.exists():
            raise FileNotFoundError(f"profile {self.profile!r} has no grid file at {path}")
        return load_grid(path)

    def results(self, run_missing: bool = False, blocks: list[str] | None = None, progress: bool = False,
                seeds: int | None = None):
        """The results table (pandas) of this profile; with ``run_missing``, first run what the grid lacks
        (``seeds``: that many seeds, 0 to seeds-1, in place of the grid file's, as ``papa grid --seeds`` does).

        Runs on the packaged sample never go into the committed results folder (computed on the full files).
        """
        from ..experiments.grid import run_grid
        from ..experiments.results import ResultsStore

        committed = (self.root / RESULT_FOLDERS[self.profile]).resolve()
        if run_missing and self.data_source == "sample" and self.results_dir.resolve() == committed:
            raise ValueError(f"{RESULT_FOLDERS[self.profile]} holds runs on the full data files, not on the packaged "
                             "sample: pass results_dir (a folder of its own) to run experiments on the sample")
        if run_missing:
            spec = self.grid()
            if blocks is not None:
                spec["blocks"] = [b for b in spec["blocks"] if b.name in blocks]
            overrides = {"data_dir": str(self.data_dir) if self.data_dir else None, "device": self.device,
                         "seeds": list(range(seeds)) if seeds is not None else None}
            if self.profile != "smoke":
                overrides["model"] = self.model_name
            model, tokenizer = self.encoder()
            run_grid(spec, self.results_dir, model=model, tokenizer=tokenizer, progress=progress, overrides=overrides)
        return ResultsStore(self.results_dir).frame()


def resolve(profile: str = "local", model_name: str | None = None, data_dir: str | Path | None = None,
            results_dir: str | Path | None = None, device: str = "auto", root: str | Path | None = None) -> Setup:
    """Resolve a chapter's parameters into a :class:`Setup`.

    ``model_name=None`` means the embedded MiniLM (smoke: a tiny random BERT; paper: ``roberta-base``).
    ``data_dir=None`` means: smoke — generated data (written once to a temp folder); local — ``../shared/data`` next
    to the repository; paper — the hub. Relative paths are taken from the repository root. At ``local``, when the
    folder does not hold the files the chapters compute on, the packaged sample is used instead, and the page's
    banner says why (:attr:`Setup.sample_reason`); a page that computes nothing on data never looks.
    ``device="auto"`` (the chapters' default) is CUDA when torch sees a GPU, else the CPU, at every profile.
    """
    from ..core.models import resolve_device

    device = resolve_device(device)
    if profile not in PROFILES:
        raise ValueError(f"unknown profile {profile!r}; choose one of {PROFILES}")
    root = find_repo_root(root, fallback="package")
    if profile == "paper" and model_name is None:
        model_name = "roberta-base"  # the model of the paper's Sec. 5 analyses; pass another hub id per run
    if profile == "smoke":
        import torch

        torch.set_num_threads(1)  # tiny tensors: extra threads only contend
    if data_dir is None:
        if profile == "smoke":
            from ..smoke import generate_data_dir

            data_dir = generate_data_dir(Path(tempfile.gettempdir()) / "papa-smoke-data")
        elif profile == "local":
            data_dir = shared_data_dir(root)
    elif not Path(data_dir).is_absolute():
        data_dir = root / data_dir
    folder = Path(results_dir) if results_dir else Path(RESULT_FOLDERS[profile])
    if not folder.is_absolute():
        folder = root / folder
    return Setup(profile, root, model_name, Path(data_dir) if data_dir else None, folder, device)


