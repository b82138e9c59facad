"""The command line, at the top of the flow beside ``api`` and ``serve``:
`manymodels train|predict|serve|runs|show|export|why|verify|report|dashboard|demo`.

Each command refuses bad options before any work, naming the option at
fault (:mod:`.arguments`), and calls the library: the jobs ``train`` and
``predict`` (:mod:`.jobs`; the no-code estimator per group, :mod:`.tabular`,
and its fallback model, :mod:`.fallback`),
the store's readers (:mod:`.inspection`, printed by :mod:`.tables`, written
by :mod:`.outputs`), serving and the dashboard. Nothing below imports it."""

# each module registers its commands on the one typer app
from . import dashboard, inspection, jobs  # noqa: F401
from . import serve as _serve  # noqa: F401  (registers `manymodels serve`)
from . import verify as _verify  # noqa: F401  (registers `manymodels verify`)
from .app import app

__all__ = ["app"]
