"""The documentation cannot drift from the code: its examples run, its lists
equal the code's, and the site builds.

Every fenced ``python`` and ``bash`` block of README.md and of ``docs/**.md``
runs here, page by page, in a fresh temporary directory: a page's python
blocks are joined in order into one script (so a later block uses what an
earlier one defined, as a reader running them in turn would), run first in a
subprocess; then its bash blocks run in order, each as one ``bash -e`` script
with this interpreter's ``bin`` folder (``manymodels``) first on ``PATH``.
Examples make their own small data, so each page stays a few seconds.

A block that cannot run here is marked by an HTML comment on the line right
before its fence (invisible on GitHub and in the site)::

    <!-- not-run: cluster -->   needs a Ray, Spark or Dask cluster
    <!-- not-run: gpu -->       needs a GPU
    <!-- not-run: long -->      bash only: builds, installs or benchmarks
                                (make demo, make test, make bench)

A block that needs an optional package the test extra does not install (the
CPU build of PyTorch, installed by ``make test`` only where the machine keeps
its wheel on disk) says so, and runs where that package is importable::

    <!-- needs: torch -->

Any other reason, or ``long`` on a python block, fails the suite. The
README's "## Quick start" runs in tests/test_readme.py, which checks its
output too, so it is not run a second time here. Blocks of other languages
(``text`` diagrams) are not code and are not run.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import pytest

import manymodels as mm

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
PAGES = [ROOT / "README.md", *sorted(DOCS.rglob("*.md"))]
REASONS = {"python": {"cluster", "gpu"}, "bash": {"cluster", "gpu", "long"}}
FENCE = re.compile(r"(?:^<!-- (?:not-run: (?P<reason>[\w-]+)|needs: (?P<needs>[\w.]+)) -->\n)?"
                   r"^```(?P<lang>[\w-]*)[^\n]*\n(?P<code>.*?)^```[ \t]*$", re.S | re.M)


@dataclass(frozen=True)
class Block:
    page: Path
    line: int
    lang: str
    code: str
    not_run: str | None
    needs: str | None = None


def blocks(page: Path) -> list[Block]:
    """The fenced blocks of ``page``, with the reason each is not run, if any."""
    text = page.read_text()
    if page.name == "README.md":  # tests/test_readme.py runs the quick start
        section = re.search(r"^## Quick start\n.*?(?=^## )", text, re.S | re.M)
        if section:
            text = text[:section.start()] + "\n" * section.group(0).count("\n") + \
                text[section.end():]
    return [Block(page, text.count("\n", 0, match.start("code")) + 1, match["lang"],
                  match["code"], match["reason"], match["needs"])
            for match in FENCE.finditer(text)]


def runnable(page: Path, lang: str) -> list[Block]:
    return [block for block in blocks(page) if block.lang == lang and block.not_run is None
            and (block.needs is None or importlib.util.find_spec(block.needs) is not None)]


def page_id(page: Path) -> str:
    return str(page.relative_to(ROOT))


RUN_PAGES = [page for page in PAGES if runnable(page, "python") or runnable(page, "bash")]


def test_every_block_is_run_or_marked_with_a_known_reason():
    for page in PAGES:
        for block in blocks(page):
            if block.not_run is not None:
                assert block.not_run in REASONS.get(block.lang, set()), (
                    f"{page_id(page)}:{block.line}: a {block.lang} block marked "
                    f"not-run: {block.not_run}; allowed: {sorted(REASONS.get(block.lang, ()))}")
    assert len(RUN_PAGES) >= 10  # the pages with examples are found


@pytest.mark.parametrize("page", RUN_PAGES, ids=page_id)
def test_the_examples_of_a_page_run(page: Path, tmp_path: Path):
    python = runnable(page, "python")
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
           "MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path / 'mlflow.db'}"}
    if python:
        script = "\n\n".join(f"# --- {page_id(page)}, line {block.line}\n{block.code}"
                             for block in python)
        (tmp_path / "page.py").write_text(script)
        done = subprocess.run([sys.executable, "page.py"], cwd=tmp_path, env=env,
                              capture_output=True, text=True, timeout=240)
        assert done.returncode == 0, f"{page_id(page)}:\n{done.stdout}\n{done.stderr}"
    for block in runnable(page, "bash"):
        done = subprocess.run(["bash", "-e", "-c", block.code], cwd=tmp_path, env=env,
                              capture_output=True, text=True, timeout=240)
        assert done.returncode == 0, (f"{page_id(page)}:{block.line}:\n{block.code}\n"
                                      f"{done.stdout}\n{done.stderr}")


# -- facts kept as lists --------------------------------------------------------------


def registered_backends() -> set[str]:
    """Every backend name ``backend=`` accepts, from the registry itself (found
    through mm.Backend's package, wherever that package lives)."""
    package = importlib.import_module(mm.Backend.__module__.rpartition(".")[0])
    built_in = {name for name, backend in package.BACKENDS.items()  # not what a test registered
                if backend.__module__.startswith(package.__name__)}
    return built_in | set(package._LAZY)


def test_the_backends_table_names_every_registered_backend():
    text = (DOCS / "engines.md").read_text()
    table = re.search(r"^## Backends\n(.*?)(?=^## )", text, re.S | re.M).group(1)
    named = set(re.findall(r'^\| `"(\w+)"` \|', table, re.M))
    assert named == registered_backends()


def _backend_help(command: str) -> str:
    import typer.main

    from manymodels.cli import app

    group = typer.main.get_command(app)
    option = next(p for p in group.commands[command].params if p.name == "backend")
    return option.help


@pytest.mark.parametrize("where", ["train", "Store.predict", "cli train", "cli predict"])
def test_every_list_of_backends_names_every_registered_backend(where: str):
    """The backend lists kept in docstrings and in --backend's help name every
    backend the registry accepts (they fell behind it once)."""
    text = {"train": lambda: mm.train.__doc__, "Store.predict": lambda: mm.Store.predict.__doc__,
            "cli train": lambda: _backend_help("train"),
            "cli predict": lambda: _backend_help("predict")}[where]()
    missing = {name for name in registered_backends()
               if not re.search(rf"\b{name}\b", text)}
    assert not missing, f"{where} does not name {sorted(missing)}"


def cli_reference() -> dict[str, set[str]]:
    """command -> the arguments and options docs/cli.md documents for it (the
    first cell of each row of its table; "" for the top level)."""
    text = (DOCS / "cli.md").read_text()
    documented: dict[str, set[str]] = {}
    command = ""
    for line in text.splitlines():
        heading = re.match(r"^## `manymodels (\w+)`", line)
        if heading:
            command = heading.group(1)
            documented.setdefault(command, set())
        row = re.match(r"^\| (`[^|]*`) \|", line)
        if row:
            documented.setdefault(command, set()).update(re.findall(r"`([^`]+)`", row.group(1)))
    return documented


def cli_options() -> dict[str, set[str]]:
    """command -> its arguments (upper case) and option spellings, from the app."""
    import typer.main

    from manymodels.cli.app import app

    def names(params) -> set[str]:
        found = set()
        for param in params:
            if param.param_type_name == "argument":
                found.add(param.name.upper())
            else:
                found.update(name for name in [*param.opts, *param.secondary_opts]
                             if name != "--help")
        return found

    group = typer.main.get_command(app)
    commands = {name: names(command.params) for name, command in group.commands.items()}
    return {"": names(group.params), **commands}


def test_the_cli_reference_equals_the_cli_options():
    assert cli_reference() == cli_options()


def test_the_api_reference_names_every_public_name():
    text = (DOCS / "reference" / "api.md").read_text()
    named = set(re.findall(r"^::: manymodels\.(\w+)$", text, re.M))
    assert set(mm.__all__) <= named
    from manymodels import sklearn as grouped

    assert {f"sklearn.{name}" for name in grouped.__all__} <= set(
        re.findall(r"^::: manymodels\.(sklearn\.\w+)$", text, re.M))


def test_the_readme_is_a_front_door():
    assert len((ROOT / "README.md").read_text().splitlines()) <= 200


def test_the_site_builds_strictly(tmp_path: Path):
    """No broken link, no missing reference (``mkdocs build --strict``)."""
    mkdocs = shutil.which("mkdocs", path=str(Path(sys.executable).parent))
    if mkdocs is None:
        pytest.skip("mkdocs is not installed: pip install -e '.[dev]'")
    done = subprocess.run([mkdocs, "build", "--strict", "--quiet", "-d", str(tmp_path / "site")],
                          cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert done.returncode == 0, done.stdout + done.stderr
    api = (tmp_path / "site" / "reference" / "api" / "index.html").read_text()
    # docstrings' Sphinx roles are rendered as code, not as ":class:" text
    roles = re.findall(r".{0,60}:(?:attr|class|data|exc|func|meth|mod|obj):(?:<code>|`).{0,40}",
                       api)
    assert not roles, roles[:5]
    missing = [name for name in public_members() if f'id="{name}"' not in api]
    assert not missing, f"public members absent from the API reference: {missing}"


def public_members() -> list[str]:
    """The dotted paths, as the API page's anchors name them, of the public
    members of the classes a user reads or subclasses: their own and those
    they inherit from manymodels' classes (``mm.Store``'s ``runs``, ``gc``,
    ``delete`` are its base's), and a dataclass's fields."""
    import dataclasses

    members = []
    for cls in (mm.Store, mm.Run, mm.Summary, mm.LinearResult, mm.Backend, mm.Checkpoint,
                mm.Callback):
        names = {name for name in dir(cls) if not name.startswith("_") and any(
            name in vars(base) for base in cls.__mro__
            if base.__module__.startswith("manymodels"))}
        if dataclasses.is_dataclass(cls):
            names |= {f.name for f in dataclasses.fields(cls) if not f.name.startswith("_")}
        members += [f"{cls.__module__}.{cls.__qualname__}.{name}" for name in sorted(names)]
    return members


def test_the_answer_serve_quotes_is_what_its_example_gets(tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch):
    """docs/serve.md quotes the answer of its curl request to the store its
    python block trains: the predictions are ``Store.predict``'s of the same
    rows (bit for bit, the page says), so the quoted digits are checked
    against those, without starting a server."""
    import json

    page = DOCS / "serve.md"
    store_block = next(block for block in blocks(page) if block.lang == "python")
    request = next(block for block in blocks(page) if "/v1/predict" in block.code
                   and block.lang == "bash")
    rows = json.loads(re.search(r"-d '(.*?)'", request.code, re.S).group(1))["rows"]
    answer = next(block for block in blocks(page) if block.lang == "text").code
    quoted = re.search(r'"predictions": \[(.*?)\], "source": (\[.*?\])', answer)
    monkeypatch.chdir(tmp_path)
    exec(compile(store_block.code.replace("progress=False", "progress=False, "
                                          "backend='serial'"), str(page), "exec"), {})
    got = mm.Store("models/").predict(pd.DataFrame(rows), by="store", with_source=True)
    digits = [text.strip().rstrip(".") for text in quoted.group(1).split(",")]
    assert len(digits) == len(got)
    for value, text in zip(got["prediction"], digits):
        assert repr(value).startswith(text), (value, text)
    assert list(got["source"]) == json.loads(quoted.group(2))
