"""Every Python example of the package README runs as written (each saved
to a file and run by a fresh interpreter, from an empty directory, with
`cellbox` on PATH)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

README = Path(__file__).resolve().parent.parent / "README.md"
BLOCKS = re.findall(r"^```python\n(.*?)^```$", README.read_text(), re.S | re.M)


def test_the_readme_has_its_three_examples():
    text = "\n".join(BLOCKS)
    assert len(BLOCKS) >= 3
    assert "sbx.session()" in text and "environment=\"cellbox\"" in text and "CellboxExecutor()" in text


@pytest.mark.parametrize("index", range(len(BLOCKS)))
def test_example_runs_as_written(index, tmp_path, binary):
    env = dict(os.environ)
    env["PATH"] = f"{Path(binary).parent}{os.pathsep}{env.get('PATH', '')}"
    env.pop("CELLBOX_BIN", None)  # found on PATH, as the README says
    script = tmp_path / f"example_{index}.py"  # saved to a file, as a user would
    script.write_text(BLOCKS[index])
    r = subprocess.run([sys.executable, script.name], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, f"example {index} failed:\n{BLOCKS[index]}\n--- stdout\n{r.stdout}\n--- stderr\n{r.stderr}"
