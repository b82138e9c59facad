"""The fallback model of ``manymodels train``: one model on every row, for
the groups that have none of their own, with the grid setting most of the
fitted groups chose (as given in ``--grid``, not as the results column
holds it), fitted after the run; a stop while it is fitted keeps the run's
models, and a failure is said in one line."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pandas as pd

from .tables import exception_line

if TYPE_CHECKING:
    from ..run.results import Run


def _fit_fallback(task: Any, table: Any, run: Run) -> Any:
    """One model on every row, with the grid setting most groups chose: the
    prediction for a group that has no model of its own."""
    frame = table.select(task.features + [task.target]).to_pandas()
    fitted = _fitted_results(run)
    setting = {name: _most_chosen(values, fitted.get(f"best_{name}"))
               for name, values in task.grid.items()}
    return task.fit(frame, **setting)


def _fitted_results(run: Run) -> pd.DataFrame:
    """The results of the groups that have a model: a failed group chose no
    setting, and its empty ``best_`` cell read as a choice of ``None`` (three
    failed groups outvoted two that chose ``class_weight=balanced``)."""
    results = run.results
    return results[results["status"] == "ok"] if "status" in results else results


def fallback_or_error(task: Any, table: Any, run: Run) -> tuple[Any, str | None]:
    """The fallback model (fitted by ``task``, the run's
    :class:`~.tabular.GroupModelTask`, on ``table``'s rows), or why it
    could not be fitted. Ctrl-C or SIGTERM
    while it is fitted (on every row: it may take longer than any group's)
    is a :class:`RunInterrupted` holding the run, whose models are kept, as
    during the run: it ended the command with no line at all (SIGTERM,
    killed with status 143), as though nothing was kept."""
    from ..engine.interrupts import RunInterrupts
    from ..engine.scheduling import RunInterrupted

    try:
        with RunInterrupts():  # (SIGTERM raises as Ctrl-C does)
            return _fit_fallback(task, table, run), None
    except KeyboardInterrupt as exc:
        raise RunInterrupted("interrupted while fitting the fallback model", run) from exc
    except Exception as exc:  # e.g. the rows of a failed group poison the whole table
        return None, f"fitting it on all rows failed: {exception_line(exc)}"


def _most_chosen(values: list[Any], chosen: pd.Series | None) -> Any:
    """The one of a grid's ``values`` that most groups chose (the first on a
    tie), as given, not as the results column holds it: there ``None``
    beside numbers is NaN and ``3`` a float ``3.0``, which an estimator
    taking ``None`` or an int refuses (``max_depth=None,3`` left the run
    without a fallback), and a column of ``None`` alone has no mode."""
    if chosen is None:
        return values[0]
    picks = chosen.dropna().tolist()
    missing = len(chosen) - len(picks)

    def times(value: Any) -> int:
        if value is None:
            return missing
        return sum(1 for pick in picks if _same_value(value, pick))

    return max(values, key=times)


def _same_value(given: Any, pick: Any) -> bool:
    """Whether a results cell ``pick`` holds the grid value ``given`` (``3`` in ``3.0``)."""
    import numpy as np

    if isinstance(given, bool) != isinstance(pick, (bool, np.bool_)):  # True is not 1
        return False
    try:
        return bool(given == pick)
    except Exception:  # values that do not compare (arrays)
        return False
