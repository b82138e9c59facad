"""The command line: `manymodels
train|predict|serve|runs|show|export|why|verify|report|dashboard|demo`."""

# each module registers its commands on the one typer app
from . import dashboard, inspection, jobs  # noqa: F401
from . import serve as _serve  # noqa: F401  (registers `manymodels serve`)
from . import verify as _verify  # noqa: F401  (registers `manymodels verify`)
from .app import app

__all__ = ["app"]
