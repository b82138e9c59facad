"""The README's quick start runs as written, so that it cannot drift from the code."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def quick_start_code() -> str:
    """The Python code blocks of the README's "Quick start" section, joined."""
    text = README.read_text()
    section = re.search(r"^## Quick start\n(.*?)(?=^## )", text, re.S | re.M)
    assert section, "README.md has no '## Quick start' section"
    blocks = re.findall(r"^```python\n(.*?)^```", section.group(1), re.S | re.M)
    assert blocks, "the quick start has no python code block"
    return "\n\n".join(blocks)


def test_quick_start_runs_as_written(tmp_path):
    script = tmp_path / "quickstart.py"
    script.write_text(quick_start_code())
    result = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "sales.parquet").exists()  # it made its own data
    assert re.search(r"\b0 failed\b", result.stdout), result.stdout  # every group trained
    served_rows_are_answered_by_their_groups(tmp_path)


def served_rows_are_answered_by_their_groups(folder: Path) -> None:
    """The quick start's serving example (not run: it needs a running server)
    serves the store the quick start wrote, and each row of its request has
    its group's model there."""
    import json

    import pandas as pd

    import manymodels as mm

    section = re.search(r"^## Quick start\n(.*?)(?=^## )", README.read_text(), re.S | re.M)
    serve = re.search(r"^```bash\n(.*?)^```", section.group(1), re.S | re.M).group(1)
    store = re.search(r"manymodels serve (\S+)", serve).group(1)
    rows = json.loads(re.search(r"-d '(.*?)'", serve, re.S).group(1))["rows"]
    answer = mm.Store(folder / store).predict(pd.DataFrame(rows), with_source=True)
    assert list(answer["source"]) == ["group"] * len(rows), answer


def test_quick_start_names_are_all_defined():
    """Every name the quick start reads is imported, assigned or a builtin (a
    static check that also covers lines a run might not reach)."""
    import ast
    import builtins

    tree = ast.parse(quick_start_code())
    bound = set(dir(builtins)) | {"__name__"}
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            bound |= {(alias.asname or alias.name).split(".")[0] for alias in node.names}
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            bound.add(node.name)
        elif isinstance(node, ast.arg):
            bound.add(node.arg)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            bound.add(node.id)
    used = {node.id for node in ast.walk(tree)
            if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load)}
    assert not used - bound, f"undefined in the quick start: {sorted(used - bound)}"
