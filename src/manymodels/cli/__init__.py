"""The command line: `manymodels train|runs|show|why|predict|report|dashboard|demo`."""

from . import verify as _verify  # noqa: F401  (registers `manymodels verify`)
from .app import app

__all__ = ["app"]
