# Set-up: `make demo` and `make test` create .venv and install what they need.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test lint docs bench clean browser java torch

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e ".[dev]"
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/manymodels demo

# Bytecode compiled once, even where PYTHONDONTWRITEBYTECODE is set: the
# suite starts hundreds of interpreters (spawned workers, engine workers, the
# command line, the docs' pages) that would each compile the package again.
test: $(STAMP) browser java torch
	$(BIN)/ruff check .
	$(BIN)/lint-imports
	PYTHONDONTWRITEBYTECODE= $(BIN)/python -m compileall -q src tests bench > /dev/null
	$(BIN)/python -m pytest -q

# The HTML report is tested in a real headless browser: Debian's chromium.
browser:
	@command -v chromium >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium; \
	  else echo "chromium is not installed and cannot be (not root): browser tests skip"; fi; }

# mm.linear(device=...) and the GPU workers' PyTorch paths are tested on the CPU build
# of PyTorch where the machine keeps one on disk (no CUDA download of several GB).
torch: $(STAMP)
	@$(BIN)/python -c "import torch" 2>/dev/null || { \
	  wheel=$$(ls /opt/wheels/torch-*+cpu-*.whl 2>/dev/null | head -n 1); \
	  if [ -n "$$wheel" ]; then $(BIN)/python -m pip install --quiet "$$wheel"; \
	  else echo "no CPU build of PyTorch on disk: the PyTorch tests skip"; fi; }

# The Spark backend is tested on a real local Spark session: it needs a Java runtime.
java:
	@command -v java >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq default-jre-headless; \
	  else echo "java is not installed and cannot be (not root): Spark tests skip"; fi; }

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/lint-imports

# The documentation site, into build/site: no broken link, no missing reference.
# (make test builds it too: tests/test_docs.py, with every example of the docs.)
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

bench: $(STAMP)
	$(BIN)/python -m pip install --quiet -e ".[bench]"
	$(BIN)/python bench/run.py
	$(BIN)/python bench/store_bench.py
	$(BIN)/python bench/backtest_bench.py
	$(BIN)/python bench/forecast_bench.py

clean:
	rm -rf $(VENV) build *.egg-info src/*.egg-info .pytest_cache .ruff_cache
