"""Selection: each group's best candidate of ``groups * grid``.

``select="rmse"`` (lower is better for error metrics, higher for ``r2`` and
``accuracy``) or ``select=("r2", "max")`` picks, per group, the task whose
metric is best; ties go to the first setting of the grid. A metric whose
direction manymodels does not know (one a score function or ``fit`` reports,
such as ``auc`` or ``val_accuracy``) needs it said, ``select=("auc", "max")``:
it is refused before any work rather than guessed. ``run.best()``
shows the winners; a store records each group's winner as its model, so that
``Store.predict`` (and ``manymodels predict``) use it. Successive halving,
``select=mm.halving(...)``, races each group's candidates inside one task
instead: :mod:`.halving`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from ..engine.messages import Status
from .metrics import direction as _direction
from .splitters import SKIPPED


@dataclass(frozen=True)
class Selection:
    """A checked ``select=``: the metric, and whether higher is better."""

    metric: str
    higher: bool

    @classmethod
    def parse(cls, select: Any, evaluate: Any = None, example: str = "select=({!r}, 'max')"
              ) -> Selection:
        """Refuse, before work, a malformed ``select``, one naming a metric
        that ``evaluate`` does not compute, or one whose direction is unknown
        (see :func:`manymodels.evaluation.metrics.direction`); ``example`` shows how to
        give one, formatted with the metric's name."""
        if isinstance(select, str):
            metric, direction = select, None
        elif isinstance(select, tuple) and len(select) == 2 and isinstance(select[0], str):
            metric, direction = select
            if direction not in ("min", "max"):
                raise ValueError(f"select=({metric!r}, {direction!r}): the direction must be "
                                 "'min' or 'max'")
        else:
            raise TypeError(f"select must be a metric name or (name, 'min'|'max'), "
                            f"got {select!r}")
        if evaluate is not None:
            named = evaluate.metric_names()
            scored_by_function = len(named) < len(evaluate.metrics)
            if metric not in named and not scored_by_function:
                raise ValueError(f"select={metric!r} names a metric that evaluate= does not "
                                 f"compute; it computes {', '.join(named)}")
        return cls(metric, _direction(metric, direction, example.format(metric)))


def refuse_a_key_named_like(selection: Selection, key_columns: list[str]) -> None:
    """Refuse, before any work, ``select=`` naming a key column (a grid
    parameter, a ``by`` column): ``run.results`` keeps the key under that
    name and the metric as ``metric_<name>``, so the winners were chosen by
    the key's values (a parameter ``rmse=[0.1, 10]`` won at 0.1, whatever
    its score)."""
    if selection.metric in key_columns:
        raise ValueError(
            f"select={selection.metric!r} names a key column too (a grid parameter or a by "
            f"column, {selection.metric!r}), whose values run.results keeps under that "
            f"name (the metric is metric_{selection.metric} there): the winners could not "
            "be chosen by the metric; rename the grid parameter or the column")


class FirstReport:
    """The run's watch of ``select``'s metric (the scheduler's ``watch_ok``):
    handed each task that ends ok, with its metrics, until one reports the
    metric, or one (its evaluation not skipped: a group too short reports
    only the splitter's named metrics) does not; then it warns, once, that
    the metric may be misnamed. The run goes on: a later task may report it,
    and the run's end still selects, or says that no task reported it."""

    def __init__(self, selection: Selection) -> None:
        self.metric = selection.metric

    def __call__(self, key: Any, metrics: Any) -> bool:
        """Whether the watch is over (the task said whether it reports the metric)."""
        metrics = metrics if isinstance(metrics, dict) else {}
        if self.metric in metrics:
            return True
        if SKIPPED in metrics:  # no metric function ran: it says nothing yet
            return False
        import warnings

        reported = sorted(name for name in metrics if not name.startswith("__"))
        warnings.warn(f"select={self.metric!r}: the first task that trained ({key!r}) reported "
                      f"no {self.metric!r} metric (it reported {reported or 'none'}); the run "
                      "goes on, but unless a later task reports it no winner is chosen",
                      UserWarning, stacklevel=_outside_the_package())
        return True


def _outside_the_package() -> int:
    """The ``stacklevel`` of a warning given by this module's caller that
    points at the first frame outside manymodels (the user's ``mm.train``)."""
    import os
    import sys

    package = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    frame, level = sys._getframe(1), 1
    while frame.f_back is not None and frame.f_code.co_filename.startswith(package):
        frame, level = frame.f_back, level + 1
    return level


def best_rows(results: pd.DataFrame, group_columns: list[str], selection: Selection
              ) -> pd.DataFrame:
    """One row per group (in key order): its best task's row of ``results``. A
    group none of whose tasks has the metric (too short to evaluate) keeps its
    first task that trained ok; a group with none ok is left out."""
    if selection.metric not in results.columns:
        raise ValueError(f"select={selection.metric!r}: no task reported that metric; the "
                         f"results' columns are {list(results.columns)}")
    ok = results[results["status"] == Status.OK]
    if ok.empty:
        return results.iloc[0:0]
    scores = pd.to_numeric(ok[selection.metric], errors="coerce")
    ranked = -scores if selection.higher else scores
    # unscored tasks rank last, in task order: the first one stands in
    ranked = ranked.fillna(np.inf)
    if not group_columns:  # a bare grid: one winner
        if scores.isna().all():
            _warn_unscored(selection.metric, None, 1)
        return results.loc[[ranked.idxmin()]]
    keys = [ok[c] for c in group_columns]
    unscored = scores.notna().groupby(keys if len(keys) > 1 else keys[0], sort=True,
                                      dropna=False, observed=True).any()
    if not unscored.all():
        _warn_unscored(selection.metric, unscored.index[~unscored.to_numpy()][0],
                       int((~unscored).sum()))
    winners = ranked.groupby(keys if len(keys) > 1 else keys[0], sort=True,
                             dropna=False, observed=True).idxmin()
    return results.loc[winners.to_numpy()]


def _warn_unscored(metric: str, example: Any, count: int) -> None:
    """Say that ``count`` groups (``example`` one of them; None: a bare grid)
    have no candidate with a score, and keep their first: the choice is no
    choice (a metric undefined in every window, r2 of one row a window)."""
    import warnings

    which = "the grid" if example is None else f"{count} group(s) (e.g. {example!r})"
    warnings.warn(f"select={metric!r}: no candidate of {which} has a {metric} score (it is "
                  "undefined in every window, or no window was tested): the first candidate "
                  "that trained is kept, unchosen", RuntimeWarning, stacklevel=3)


def record_winners(store: Any, run_id: int, best: pd.DataFrame, key_rows: list[tuple],
                   group_columns: list[str], selection: Selection) -> int:
    """Attach to the run each group's winning model artifact (its key encoded as
    a prediction looks it up); return how many groups have one."""
    from ..inputs.keys import encode_key

    artifacts = store._run_artifacts(run_id)
    width = len(group_columns)
    chosen = {}
    for index in best.index:
        digest = artifacts.get(int(index))
        if digest is not None:
            chosen[encode_key(key_rows[index][:width])] = digest
    store.attach(run_id, "selection", {"by": list(group_columns), "metric": selection.metric,
                                       "higher": selection.higher, "artifacts": chosen})
    return len(chosen)
