from __future__ import annotations

import json
import subprocess
import sys


def test_demo_runs_and_reports(tmp_path):
    out = tmp_path / "demo.json"
    result = subprocess.run(
        [sys.executable, "-m", "manymodels.cli", "demo", "--stores", "4", "--items", "5",
         "--json", str(out)],
        capture_output=True, text=True, timeout=300,
    )
    assert result.returncode == 0, result.stderr
    assert "speed-up over serial" in result.stdout
    numbers = json.loads(out.read_text())
    assert numbers["groups"] == 20 and numbers["ok"] == 20 and numbers["failed"] == 0
    assert 0 < numbers["utilization"] <= 1.05
    assert numbers["serial_wall_s"] > 0


def test_help_lists_demo():
    result = subprocess.run([sys.executable, "-m", "manymodels.cli", "--help"],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0 and "demo" in result.stdout
