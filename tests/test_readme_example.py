"""The extension guide (CONTRIBUTING.md, "Extending papa_lib", linked from the README) runs as written: its one code
block registers a matrix type and prints a table."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def extension_section() -> str:
    text = (ROOT / "CONTRIBUTING.md").read_text()
    match = re.search(r"^## Extending papa_lib\n(.*?)(?=^## |\Z)", text, flags=re.S | re.M)
    assert match, "CONTRIBUTING.md has no '## Extending papa_lib' section"
    return match.group(1)


def test_the_section_holds_one_complete_python_block():
    blocks = re.findall(r"^```python\n(.*?)^```", extension_section(), flags=re.S | re.M)
    assert len(blocks) == 1
    compile(blocks[0], "CONTRIBUTING.md", "exec")
    assert "register_matrix_type(\"uniform\"" in blocks[0]


@pytest.mark.slow
def test_the_extension_example_runs_as_written(tmp_path):
    (code,) = re.findall(r"^```python\n(.*?)^```", extension_section(), flags=re.S | re.M)
    script = tmp_path / "example.py"
    script.write_text(code)
    out = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    rows = [line.split() for line in out.stdout.splitlines()]
    labels = [" ".join(row[:-1]) for row in rows if row and re.fullmatch(r"\d\.\d\d", row[-1])]
    assert labels == ["Original (input-dependent)", "Identity", "Uniform over real keys", "Average (PAPA)"]
    scores = [float(row[-1]) for row in rows if row and re.fullmatch(r"\d\.\d\d", row[-1])]
    assert all(0.0 <= score <= 1.0 for score in scores)
