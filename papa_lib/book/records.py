"""What a results table says about itself: which model, data and profile produced its records, and how much of a
declared grid it holds.

Every figure of the book names the model, data and profile behind it (:func:`papa_lib.book.charts.label`). For a
figure drawn from records, those three words come from the records themselves (:func:`describe`: the ``model``,
``data_source`` and ``profile`` columns of :class:`papa_lib.experiments.results.ResultsStore`'s frame), never from
the reader's current setup: committed results made from local files stay "local files" on a machine without them.

* :func:`data_label` turns ``data_source`` strings (``train: …/glue/SST-2/train.tsv; validation: …``,
  ``hub:nyu-mll/glue/sst2:train``, a WikiText folder) into a short label: ``local files: SST-2, CoLA``.
* :func:`describe` and :func:`ours_label`: the subtitle words and the "ours" legend entry of a figure.
* :func:`coverage`: the declared runs of a grid's blocks that are (not yet) in the table, as a small table and one
  sentence (results may be partial while a grid runs).
* :func:`grid_or_empty`: a profile's grid file, or an empty grid where this installation has none (e.g. Colab).
* :func:`diagnostic_records`: the records of a diagnostic run kept beside a profile's results folder, or none.
* :func:`other_local_models`, :func:`with_models`: under the ``local`` profile, the committed records of the other
  local models (:data:`papa_lib.analysis.claims.LOCAL_FOLDERS`, read by
  :func:`papa_lib.analysis.claims.read_folders`), and a page's records with them, so a chapter shows every model
  the records have.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from pathlib import Path, PurePosixPath

import pandas as pd

__all__ = ["coverage", "data_label", "dataset_name", "describe", "diagnostic_records", "grid_or_empty", "model_label",
           "other_local_models", "ours_label", "source_kind", "with_models"]

#: Readable names of the data folders the loaders read (:mod:`papa_lib.experiments.tasks`, MLM corpora).
DATASET_NAMES = {"conll2003": "CoNLL-2003", "wikitext-2": "WikiText-2", "wikitext-103": "WikiText-103",
                 "wikitext-103-raw-v1": "WikiText-103", "wikitext-2-raw-v1": "WikiText-2"}
_FILE_SUFFIXES = (".tsv", ".csv", ".txt", ".tokens", ".json", ".jsonl")
_SPLIT_PREFIX = re.compile(r"^\s*(train|validation|test|probe|score)\s*:\s*")
#: Temporary folder of the smoke profile's generated data (:func:`papa_lib.smoke.generate_data_dir`).
_GENERATED_MARK = "papa-smoke-data"


def _parts(source: str) -> list[str]:
    """The file or hub references of one ``data_source`` string (``train: X; validation: Y`` -> [X, Y])."""
    parts = []
    for piece in str(source).split(";"):
        piece = _SPLIT_PREFIX.sub("", piece.strip())
        if piece:
            parts.append(piece.split()[0])
    return parts


def source_kind(source: str, profile: str | None = None) -> str:
    """``'generated data'`` (smoke), ``'packaged sample'`` (:mod:`papa_lib.samples`), ``'hub datasets'`` or
    ``'local files'`` for one ``data_source`` string."""
    text = str(source)
    if profile == "smoke" or _GENERATED_MARK in text:
        return "generated data"
    if "(packaged sample)" in text or "papa_lib/samples/" in text:
        return "packaged sample"
    if any(part.startswith("hub:") for part in _parts(text)) or text.startswith("hub:"):
        return "hub datasets"
    return "local files"


def dataset_name(reference: str) -> str:
    """The dataset of one file or hub reference: ``…/glue/SST-2/train.tsv`` -> ``SST-2``,
    ``hub:nyu-mll/glue/sst2:train`` -> ``glue/sst2``, ``…/wikitext-2`` -> ``WikiText-2``."""
    text = str(reference).strip()
    if text.startswith("hub:"):
        name = text[4:].rsplit(":", 1)[0] if text.count(":") >= 2 else text[4:]
        parts = [p for p in name.split("/") if p]
        name = "/".join(parts[-2:]) if len(parts) > 2 else "/".join(parts)
        return DATASET_NAMES.get(parts[-1], name) if parts else name
    path = PurePosixPath(text)
    is_file = path.suffix in _FILE_SUFFIXES or path.name.startswith(("eng.", "wiki."))
    name = path.parent.name if is_file else path.name
    return DATASET_NAMES.get(name, name or text)


def data_label(sources: Iterable, profile: str | None = None) -> str:
    """A short label of the data behind records: kind and dataset names, e.g. ``local files: SST-2, CoLA``.

    ``sources`` are ``data_source`` values (missing ones are skipped); ``profile`` ``smoke`` means generated data.
    Several kinds are joined with ``; ``. Empty input gives ``''``.
    """
    by_kind: dict[str, list[str]] = {}
    for source in sources:
        if source is None or (isinstance(source, float) and source != source) or not str(source).strip():
            continue
        kind = source_kind(source, profile)
        names = by_kind.setdefault(kind, [])
        for part in _parts(source):
            name = dataset_name(part)
            if name not in names:
                names.append(name)
    return "; ".join(f"{kind}: {', '.join(names)}" if names and kind != "generated data" else kind
                     for kind, names in by_kind.items())


def model_label(models: Iterable) -> str:
    """The models of some records: one name, a list of up to three, or ``'N models'``."""
    names = [str(m) for m in dict.fromkeys(models) if m is not None and str(m) not in ("", "nan")]
    if len(names) > 3:
        return f"{len(names)} models"
    return ", ".join(names)


def describe(frame: pd.DataFrame | None, *, model: str | None = None, data: str | None = None,
             profile: str | None = None) -> dict[str, str]:
    """``{"model", "data", "profile"}`` of the records in ``frame``, for a figure's subtitle.

    Read from the ``model``, ``data_source`` and ``profile`` columns; the keyword arguments are used only where the
    records do not say (an empty frame, a column without values — e.g. MLM records carry no profile). A smoke-profile
    record's data is "generated data".
    """
    found = {"model": "", "data": "", "profile": ""}
    if frame is not None and len(frame):
        if "profile" in frame.columns:
            profiles = [str(p) for p in dict.fromkeys(frame["profile"].dropna())]
            found["profile"] = ", ".join(profiles)
        if "model" in frame.columns:
            found["model"] = model_label(frame["model"].dropna())
        if "data_source" in frame.columns:
            only = found["profile"] if found["profile"] in ("smoke", "local", "paper") else profile
            found["data"] = data_label(frame["data_source"].dropna(), only)
    fallback = {"model": model, "data": data, "profile": profile}
    return {key: value or str(fallback[key] or "") for key, value in found.items()}


def ours_label(frame: pd.DataFrame | None, **fallback) -> str:
    """``"ours: <model> (<profile>)"``, the legend entry of our numbers next to the paper's."""
    described = describe(frame, **fallback)
    return f"ours: {described['model'] or 'this run'} ({described['profile'] or 'no records'})"


def grid_or_empty(setup) -> dict:
    """The profile's declared grid (:meth:`papa_lib.book.profiles.Setup.grid`), or ``{"blocks": []}`` when this
    installation has no grid file (a chapter opened in Colab without a clone of the repository)."""
    try:
        return setup.grid()
    except FileNotFoundError:
        return {"blocks": []}


def diagnostic_records(results_dir, folder) -> pd.DataFrame:
    """The records of the run in ``folder`` beside ``results_dir`` (``data/results/<folder>`` for the committed local
    run; an absolute ``folder`` is used as it is), or an empty frame where that run has no ``results.csv``."""
    from ..experiments.results import read_results

    path = Path(results_dir).parent / folder
    return read_results(path) if (path / "results.csv").is_file() else pd.DataFrame()


def coverage(frame: pd.DataFrame, spec: Mapping, blocks: Iterable[str], tasks: Iterable[str] | None = None,
             what: str = "declared runs") -> tuple[pd.DataFrame, str]:
    """How much of the grid's ``blocks`` the table holds: per (block, task) the expected, done and missing runs
    (:func:`papa_lib.book.grid_views.grid_coverage`), and one sentence that says it, naming the tasks the grid does not
    declare. Without a grid file (``spec["blocks"]`` empty) the sentence says so and the table is empty."""
    from ..experiments.grid import grid_seeds
    from .grid_views import grid_coverage

    tasks = list(tasks) if tasks is not None else None
    if not spec.get("blocks"):
        empty = pd.DataFrame(columns=["block", "task", "expected", "done", "missing"])
        return empty, ("This installation has no grid file, so what is missing cannot be listed "
                       "(clone the repository to get it; chapter *Reproducing at scale*).")
    table = grid_coverage(frame, spec, blocks=list(blocks))
    if tasks is not None:
        table = table[table["task"].isin(tasks)]
    done, expected = int(table["done"].sum()), int(table["expected"].sum())
    text = f"{done} of {expected} {what} are in the table"
    text += "." if done == expected else "; the figures and tables below show what is there (— = not run yet)."
    declared = set(grid_seeds(spec))
    more = sorted({int(s) for s in frame["seed"].dropna()} - declared) if "seed" in frame else []
    if more:  # seeds the grid file does not list (a seed file beside it, grid-seeds*.yaml): counted, not hidden
        every = grid_coverage(frame, {**spec, "seeds": sorted(declared | set(more))}, blocks=list(blocks))
        if tasks is not None:
            every = every[every["task"].isin(tasks)]
        if (extra := int(every["done"].sum()) - done) > 0:
            text += (f" The table holds {extra} more runs of these variants, with seeds the grid file does not list "
                     f"({_seed_span(more)}, from the seed files beside it); the numbers below use every seed stored.")
    absent = [t for t in (tasks or []) if t not in set(table["task"])]
    if absent:
        text += f" Not in this profile's grid: {', '.join(absent)}."
    return table.set_index(["block", "task"]), text


def _seed_span(seeds: list[int]) -> str:
    """``[3, 4, 5, 6]`` -> ``'seeds 3-6'``; a list with gaps is listed."""
    if len(seeds) > 2 and seeds == list(range(seeds[0], seeds[-1] + 1)):
        return f"seeds {seeds[0]}–{seeds[-1]}"
    return ("seed " if len(seeds) == 1 else "seeds ") + ", ".join(map(str, seeds))


def other_local_models(setup, frame: pd.DataFrame | None = None,
                       needs: Iterable[str] | None = None) -> dict[Path, pd.DataFrame]:
    """Under the ``local`` profile: folder -> records of every committed local results folder
    (:data:`papa_lib.analysis.claims.LOCAL_FOLDERS`) other than the profile's own, restricted to models not already in
    ``frame``; folders without records (or without a new model) are left out. ``needs``: matrix types a model's
    records must include at least one of to be shown (a page about data-free matrices shows a model only once its
    data-free runs exist). Other profiles: ``{}``."""
    from ..analysis.claims import LOCAL_FOLDERS, read_folders

    if getattr(setup, "profile", None) != "local" or setup.results_dir is None:
        return {}
    own = Path(setup.results_dir).resolve()
    shown = set(frame["model"].dropna().astype(str)) if frame is not None and "model" in frame else set()
    found: dict[Path, pd.DataFrame] = {}
    for name in LOCAL_FOLDERS:
        folder = Path(setup.root) / "data" / "results" / name
        if folder.resolve() == own:
            continue
        frames = {m: f for m, f in read_folders([folder]).items() if m not in shown
                  and (needs is None or f["matrix_type"].isin(list(needs)).any())}
        if frames:
            found[folder] = pd.concat(frames.values(), ignore_index=True)
            shown |= set(frames)
    return found


def with_models(frame: pd.DataFrame, others: Mapping[Path, pd.DataFrame]) -> pd.DataFrame:
    """``frame`` with the records of :func:`other_local_models` appended (``frame`` itself when there are none)."""
    parts = [frame, *[f for f in others.values() if len(f)]]
    return pd.concat(parts, ignore_index=True) if len(parts) > 1 else frame
