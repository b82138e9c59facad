"""The command line: `manymodels train|runs|show|why|predict|report|dashboard|demo`."""

from .app import app

__all__ = ["app"]
