"""Cached artefacts heal themselves (papa_lib.core.artefacts): atomic writes, checksums, damaged files set aside."""

from __future__ import annotations

import errno

import pytest
import torch

from papa_lib.core import artefacts
from papa_lib.experiments.features import FeatureStore, RaggedRows


def test_write_atomic_keeps_the_old_file_on_a_full_disk(tmp_path):
    path = tmp_path / "x.bin"
    artefacts.write_atomic(path, lambda tmp: tmp.write_bytes(b"old contents"))
    assert (tmp_path / "x.bin.sha256").read_text().split() == [artefacts.checksum(path), "12"]

    def full_disk(tmp):
        tmp.write_bytes(b"half")
        raise OSError(errno.ENOSPC, "No space left on device")

    with pytest.raises(OSError, match="No space left"):
        artefacts.write_atomic(path, full_disk)
    assert path.read_bytes() == b"old contents"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["x.bin", "x.bin.sha256"]  # no temporary file left


def test_a_checksum_mismatch_of_the_same_size_is_caught(tmp_path, capsys):
    path = tmp_path / "l.pt"
    artefacts.write_atomic(path, lambda tmp: torch.save(torch.arange(12.0), tmp))
    assert torch.equal(artefacts.read_or_heal(path, torch.load), torch.arange(12.0))
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF  # a flipped byte that torch.load does not notice
    path.write_bytes(bytes(data))
    assert artefacts.read_or_heal(path, torch.load) is None
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"papa: notice: {path} is damaged (its checksum differs from the one written); "
                   "set it aside as l.pt.damaged and computing it again"]
    assert not path.exists() and (tmp_path / "l.pt.damaged").exists() and (tmp_path / "l.pt.damaged.sha256").exists()
    assert artefacts.read_or_heal(tmp_path / "absent.pt", torch.load) is None


def test_truncated_features_are_set_aside(tmp_path, capsys):
    store = FeatureStore(tmp_path)
    rows = RaggedRows(torch.randn(10, 3, 4).half(), torch.tensor([0, 4, 10]), torch.arange(10))
    store.save("k", "train", rows)
    assert store.has("k", "train")
    assert torch.equal(store.load("k", "train").values, rows.values)
    values = tmp_path / "k" / "train.values"
    values.write_bytes(values.read_bytes()[:33])
    assert not store.has("k", "train")
    assert "train.values has 33 bytes where 240 were written" in capsys.readouterr().err
    assert (tmp_path / "k.damaged").is_dir() and not (tmp_path / "k").exists()
    store.save("k", "train", rows)  # computed again
    assert store.has("k", "train")


def test_features_are_written_straight_into_the_store_file(tmp_path):
    """FeatureStore.build hands the computation a map of the values file being written (never a second copy in
    memory); a build stopped midway stores nothing and leaves no temporary file."""
    store = FeatureStore(tmp_path)
    rows = RaggedRows(torch.randn(10, 3, 4).half(), torch.tensor([0, 4, 10]), torch.arange(10))
    seen = []

    def compute(allocate):
        values = allocate((10, 3, 4))
        seen.extend((p.name, p.stat().st_size) for p in (tmp_path / "k").iterdir())
        values.copy_(rows.values)
        return RaggedRows(values, rows.offsets, rows.positions)

    loaded = store.build("k", "train", compute)
    assert len(seen) == 1 and seen[0][0].startswith(".train.values.") and seen[0][1] == 240  # the file, full size
    assert store.has("k", "train") and torch.equal(loaded.values, rows.values)
    assert sorted(p.name for p in (tmp_path / "k").iterdir()) == [
        "train.json", "train.offsets.npy", "train.positions.npy", "train.values"]

    def stopped(allocate):
        allocate((10, 3, 4))
        raise RuntimeError("stopped")

    with pytest.raises(RuntimeError, match="stopped"):
        store.build("j", "train", stopped)
    assert not store.has("j", "train") and not list((tmp_path / "j").iterdir())
