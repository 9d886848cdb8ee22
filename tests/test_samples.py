"""The real-text sample packaged in papa_lib, and the local profile's fallback to it (no data folder, no hub).

The sample (``papa_lib/samples/sample.jsonl``, :mod:`papa_lib.experiments.sample_data`) must be small, documented,
carried by a regular install (package data in the wheel), unpack into a data folder the task and WikiText loaders
read, and unpack to exactly what its README's recipe draws from ``../shared/data`` (checked when that folder is
present). Without a data folder the ``local``
profile reads it, says so in one line, and never touches the dataset hub.
"""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import tomllib

from papa_lib.analysis import mlm_probe
from papa_lib.book import profiles, provenance
from papa_lib.experiments import sample_data, tasks

REPO = Path(__file__).resolve().parents[1]
SAMPLE = REPO / "papa_lib" / "samples"


def _sample_files() -> list[str]:
    return sorted(p.relative_to(SAMPLE).as_posix() for p in SAMPLE.rglob("*") if p.is_file())


@pytest.fixture(autouse=True)
def _own_cache(tmp_path, monkeypatch):
    """Every test unpacks the sample into a cache folder of its own."""
    monkeypatch.setenv("PAPA_CACHE_DIR", str(tmp_path / "cache"))


def test_sample_is_small_documented_and_declared_as_package_data():
    assert sample_data.SAMPLE_PACK == SAMPLE / "sample.jsonl"
    assert _sample_files() == ["README.md", "sample.jsonl"]
    assert sorted(sample_data.read_pack()) == sorted(sample_data.SAMPLE_FILES)
    total = sum((SAMPLE / name).stat().st_size for name in _sample_files())
    assert total < 300_000, f"the packaged sample should stay a few hundred KB at most, it is {total:,} bytes"
    readme = (SAMPLE / "README.md").read_text(encoding="utf-8")
    for name in sample_data.SAMPLE_FILES:
        assert f"`{name}`" in readme, f"papa_lib/samples/README.md does not describe {name}"
    assert "CC BY-SA" in readme and "Merity" in readme and "Stanford Sentiment Treebank" in readme
    patterns = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["papa_lib"]
    for name in _sample_files():
        assert any(Path("samples", name).match(pattern) for pattern in patterns), f"{name} is not package data"


@pytest.mark.skipif(importlib.util.find_spec("setuptools") is None, reason="setuptools is not installed")
def test_a_built_wheel_carries_the_sample(tmp_path):
    source = tmp_path / "src"
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(REPO / name, source / name)
    shutil.copytree(REPO / "papa_lib", source / "papa_lib", ignore=shutil.ignore_patterns("__pycache__"))
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w",
                    str(tmp_path / "dist"), str(source)], check=True, capture_output=True)
    (wheel,) = (tmp_path / "dist").glob("papa_lib-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    missing = [name for name in _sample_files() if f"papa_lib/samples/{name}" not in names]
    assert not missing, f"the wheel lacks {missing}"


def test_sample_unpacks_once_into_a_data_folder(tmp_path):
    folder = sample_data.sample_dir()
    assert folder.is_relative_to(tmp_path / "cache") and not sample_data.missing_files(folder)
    assert sample_data.is_sample(folder / "glue/SST-2/dev.tsv") and not sample_data.is_sample(SAMPLE)
    stamp = (folder / "glue/SST-2/train.tsv").stat().st_mtime_ns
    assert sample_data.sample_dir() == folder and (folder / "glue/SST-2/train.tsv").stat().st_mtime_ns == stamp
    header, *rows = (folder / "glue/SST-2/train.tsv").read_text(encoding="utf-8").splitlines()
    assert header == "sentence\tlabel" and len(rows) == 512 and all(row.rsplit("\t", 1)[1] in "01" for row in rows)
    (folder / "glue/SST-2/dev.tsv").unlink()  # a damaged cache is unpacked again
    assert not sample_data.missing_files(sample_data.sample_dir())


def test_a_damaged_pack_is_reported_with_its_line(tmp_path):
    pack = tmp_path / "sample.jsonl"
    pack.write_text('{"file": "a.tsv", "columns": ["sentence", "label"], "rows": 2}\n["x", 0]\n{oops\n')
    with pytest.raises(ValueError, match=r"not a JSON value: .*sample.jsonl:3\)"):
        sample_data.read_pack(pack)
    pack.write_text('["x", 0]\n')
    with pytest.raises(ValueError, match=r"expected a section header .*sample.jsonl:1\)"):
        sample_data.read_pack(pack)
    pack.write_text('{"file": "a.tokens", "lines": 3}\n"one"\n')
    with pytest.raises(ValueError, match="ends 2 rows early"):
        sample_data.read_pack(pack)


def test_sample_loads_and_names_itself():
    sample = sample_data.sample_dir()
    train = tasks.load_task("sst2", "train", data_dir=sample)
    validation = tasks.load_task("sst2", "validation", data_dir=sample, limit=64)
    assert (len(train), len(validation)) == (512, 64)
    assert set(train.labels) == {0, 1} and all(text.strip() for text in train.texts)
    assert train.source == "papa_lib/samples/glue/SST-2/train.tsv (packaged sample)"
    assert validation.source.startswith("papa_lib/samples/glue/SST-2/dev.tsv (packaged sample) [subsample of 64/256")
    valid = tasks.load_wikitext("validation", sample, name="wikitext-2")
    test = tasks.load_wikitext("test", sample, name="wikitext-2")
    assert len(valid) > 100 and len(test) > 50 and not any(line.startswith("= ") for line in valid + test)
    corpus = mlm_probe.load_mlm_corpus(sample)
    assert corpus["corpus"] == "local-wikitext-2-sample:valid->test"  # never the id of runs on the full files
    assert corpus["source"].startswith("papa_lib/samples/wikitext-2 (packaged sample)")
    assert sample_data.describe(REPO / "README.md") == str(REPO / "README.md")


def _every(lines: list[str], step: int, count: int) -> list[str]:
    """The header and data rows 0, step, 2 step, ... (at most ``count``), as the README's awk recipe draws them."""
    return [lines[0]] + lines[1:][::step][:count]


def _head_before_heading(lines: list[str], article: int) -> list[str]:
    """The lines before the ``article``-th (1-based) top-level heading `` = Title = ``."""
    headings = [i for i, line in enumerate(lines) if line.startswith(" = ") and not line.startswith(" = = ")]
    return lines[: headings[article - 1]]


def test_sample_is_what_its_recipe_draws(shared_data):
    def lines(path: Path) -> list[str]:
        return path.read_text(encoding="utf-8").splitlines(keepends=True)

    expected = {
        "glue/SST-2/train.tsv": _every(lines(shared_data / "glue/SST-2/train.tsv"), 131, 512),
        "glue/SST-2/dev.tsv": _every(lines(shared_data / "glue/SST-2/dev.tsv"), 3, 256),
        "wikitext-2/wiki.valid.tokens": _head_before_heading(lines(shared_data / "wikitext-2/wiki.valid.tokens"), 6),
        "wikitext-2/wiki.test.tokens": _head_before_heading(lines(shared_data / "wikitext-2/wiki.test.tokens"), 4),
    }
    sample = sample_data.sample_dir()
    for name, want in expected.items():
        assert lines(sample / name) == want, f"papa_lib/samples/{name} differs from its README's recipe"


def test_the_readme_recipe_rebuilds_the_pack_byte_for_byte(shared_data, tmp_path, monkeypatch):
    import re

    readme = (SAMPLE / "README.md").read_text(encoding="utf-8")
    code = re.search(r"```python\n(.*?)```", readme, re.S).group(1)
    (tmp_path / "papa_lib" / "samples").mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    exec(code.replace('"/work/shared/data"', repr(str(shared_data))), {})
    assert (tmp_path / "papa_lib/samples/sample.jsonl").read_bytes() == sample_data.SAMPLE_PACK.read_bytes()


@pytest.fixture
def no_hub(monkeypatch):
    """Any attempt to reach the dataset hub fails the test."""
    import datasets

    def refuse(*args, **kwargs):
        raise AssertionError(f"the dataset hub was tried: {args}")

    monkeypatch.setattr(datasets, "load_dataset", refuse)
    monkeypatch.setattr(tasks, "_hub_load_dataset", refuse)


def _book_root(tmp_path: Path) -> Path:
    """A repository root (``_config.yml`` + ``papa_lib/``) with nothing beside it: no ``../shared/data``."""
    root = tmp_path / "x" / "papa"
    (root / "papa_lib").mkdir(parents=True)
    (root / "_config.yml").write_text("title: t\n", encoding="utf-8")
    return root


def test_local_profile_without_data_reads_the_sample_and_says_so(tmp_path, capsys, no_hub):
    root = _book_root(tmp_path)
    setup = profiles.resolve("local", root=root)
    assert setup.data_dir == sample_data.sample_dir()
    assert setup.data_source == "sample" and setup.data_label == "packaged sample (papa_lib/samples)"
    assert "data: packaged sample" in setup.label()
    assert setup.sample_reason == "../shared/data does not exist"  # the page's banner says it, not a stderr box
    assert "packaged sample (papa_lib/samples), since ../shared/data does not exist" in provenance.live_facts(setup)
    assert capsys.readouterr().err == ""
    examples = tasks.unlabeled_texts("sst2", data_dir=setup.data_dir, limit=512)
    assert len(examples) == 512 and "(packaged sample)" in examples.source

    empty = tmp_path / "empty"
    empty.mkdir()
    reasons = []
    for given in (empty, tmp_path / "nope"):
        given_setup = profiles.resolve("local", data_dir=given, root=root)
        assert given_setup.data_dir == sample_data.sample_dir()
        reasons.append(given_setup.sample_reason)
    assert reasons == ["empty has no glue/SST-2/train.tsv", "nope does not exist"]  # pages show no absolute path
    assert capsys.readouterr().err == ""
    # the command line's own fallback still prints its one-line notice
    assert sample_data.data_or_sample(tmp_path / "nope") == sample_data.sample_dir()
    assert capsys.readouterr().err.strip() == (f"papa: {tmp_path / 'nope'} does not exist; using the packaged sample "
                                               f"papa_lib/samples ({sample_data.SAMPLE_CONTENTS}) instead")


def test_the_sample_is_resolved_with_the_first_read_of_the_data_only(tmp_path, capsys, no_hub):
    # a page that computes nothing on data (transfer: committed records only) never looks at the data folder
    root = _book_root(tmp_path)
    setup = profiles.resolve("local", root=root)
    assert setup.model_label == "all-MiniLM-L6-v2" and setup.results_dir == root / "data/results/local-minilm"
    assert setup.data_source == "sample"  # the first read resolves the folder and the reason
    assert setup.data_dir == sample_data.sample_dir() and setup.sample_reason == "../shared/data does not exist"
    assert capsys.readouterr().err == ""


def test_a_data_folder_that_holds_the_data_is_used_as_it_is(tmp_path, capsys, no_hub):
    root = _book_root(tmp_path)
    data = tmp_path / "x" / "shared" / "data"
    shutil.copytree(sample_data.sample_dir(), data)
    setup = profiles.resolve("local", root=root)
    assert setup.data_dir == data and setup.data_source == "local" and setup.data_label == "local files (data)"
    assert capsys.readouterr().err == ""
    assert tasks.load_task("sst2", "train", data_dir=setup.data_dir).source == str(data / "glue/SST-2/train.tsv")
    # the other profiles keep their own data: generated (smoke) and the hub (paper)
    assert profiles.resolve("paper", root=root).data_dir is None
    assert profiles.resolve("paper", root=root).data_source == "hub"


def test_an_incomplete_installation_is_reported(monkeypatch, tmp_path):
    monkeypatch.setattr(sample_data, "SAMPLE_PACK", tmp_path / "sample.jsonl")
    with pytest.raises(FileNotFoundError, match="packaged data sample is missing: .*sample.jsonl"):
        sample_data.data_or_sample(tmp_path / "nope")
    (tmp_path / "sample.jsonl").write_text('{"file": "wikitext-2/wiki.test.tokens", "lines": 1}\n"x"\n')
    with pytest.raises(FileNotFoundError, match="packaged data sample is incomplete: .*has no glue/SST-2/train.tsv"):
        sample_data.data_or_sample(tmp_path / "nope")


def test_runs_on_the_sample_stay_out_of_the_committed_results(tmp_path, capsys):
    root = _book_root(tmp_path)
    with pytest.raises(ValueError, match="data/results/local-minilm holds runs on the full data files"):
        profiles.resolve("local", root=root).results(run_missing=True)


def test_a_chapters_seeds_parameter_reaches_the_runs_it_makes(tmp_path, monkeypatch):
    """The chapters' ``seeds``: None keeps the grid file's seeds, n runs seeds 0..n-1 (papa grid --seeds)."""
    from papa_lib.experiments import grid

    calls = []
    monkeypatch.setattr(grid, "run_grid", lambda spec, folder, **kw: calls.append((spec, kw["overrides"])))
    setup = profiles.resolve("smoke", results_dir=tmp_path / "results")
    for seeds in (None, 3):
        setup.results(run_missing=True, blocks=["fig5"], seeds=seeds)
    (spec, default), (_, three) = calls
    assert [b.name for b in spec["blocks"]] == ["fig5"]
    assert grid.grid_settings(spec, default)[1] == [0, 1]  # the smoke grid's own
    assert grid.grid_settings(spec, three)[1] == [0, 1, 2]
    assert setup.results(run_missing=False, seeds=3).empty and len(calls) == 2  # reading runs nothing
