"""The wheel works: built from this checkout and installed in a fresh virtual
environment, it runs ``manymodels demo`` and carries the dashboard's static
files and ``py.typed``. The fresh environment borrows the test environment's
third-party packages (a ``.pth`` file) instead of downloading them again, and
the demo needs none beyond the core dependencies (no scikit-learn)."""

from __future__ import annotations

import json
import subprocess
import sys
import venv
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_the_demo_ridge_equals_scikit_learns():
    from sklearn.linear_model import Ridge

    from manymodels.cli.demo import RidgeModel

    rng = np.random.default_rng(0)
    X = rng.normal(size=(60, 3))
    y = X @ [1.0, -2.0, 0.5] + 4 + rng.normal(size=60)
    ours, theirs = RidgeModel(3.0).fit(X, y), Ridge(alpha=3.0).fit(X, y)
    assert np.allclose(ours.coef_, theirs.coef_, atol=1e-12)
    assert ours.intercept_ == pytest.approx(theirs.intercept_, abs=1e-12)
    assert ours.score(X, y) == pytest.approx(theirs.score(X, y), abs=1e-12)
    constant = np.full(60, 3.0)  # a group whose holdout days all sold the same
    assert ours.score(X, constant) == theirs.score(X, constant) == 0.0


@pytest.mark.slow
def test_the_wheel_installs_and_runs_the_demo(tmp_path):
    dist = tmp_path / "dist"
    subprocess.run([sys.executable, "-m", "build", "--wheel", "--outdir", str(dist), str(ROOT)],
                   check=True, capture_output=True, timeout=600)
    (wheel,) = dist.glob("manymodels-*.whl")
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=True)
    python = env_dir / "bin" / "python"
    site = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()"
                           "['purelib'])"], check=True, capture_output=True, text=True)
    borrowed = [p for p in sys.path if p.endswith("site-packages")]
    (Path(site.stdout.strip()) / "borrowed.pth").write_text("\n".join(borrowed) + "\n")
    subprocess.run([str(python), "-m", "pip", "install", "--quiet", "--no-deps", str(wheel)],
                   check=True, capture_output=True, timeout=600)
    numbers = tmp_path / "demo.json"
    done = subprocess.run([str(env_dir / "bin" / "manymodels"), "demo", "--stores", "4",
                           "--items", "5", "--no-serial", "--json", str(numbers)],
                          cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert json.loads(numbers.read_text())["ok"] == 20
    package = subprocess.run(
        [str(python), "-c", "import manymodels, pathlib; print(pathlib.Path(manymodels.__file__)"
         ".parent)"], check=True, capture_output=True, text=True).stdout.strip()
    assert Path(package).is_relative_to(env_dir)  # the wheel's copy, not this checkout
    assert (Path(package) / "py.typed").is_file()
    static = Path(package) / "observe" / "dashboard" / "static"
    assert {"index.html", "app.js", "style.css"} <= {p.name for p in static.iterdir()}
