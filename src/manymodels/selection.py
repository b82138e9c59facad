"""Selection: each group's best candidate of ``groups * grid``.

``select="rmse"`` (lower is better for error metrics, higher for ``r2`` and
``accuracy``) or ``select=("r2", "max")`` picks, per group, the task whose
metric is best; ties go to the first setting of the grid. ``run.best()``
shows the winners; a store records each group's winner as its model, so that
``Store.predict`` (and ``manymodels predict``) use it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from .metrics import higher_is_better


@dataclass(frozen=True)
class Selection:
    """A checked ``select=``: the metric, and whether higher is better."""

    metric: str
    higher: bool

    @classmethod
    def parse(cls, select: Any, evaluate: Any = None) -> Selection:
        """Refuse, before work, a malformed ``select`` or one naming a metric
        that ``evaluate`` does not compute."""
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
        higher = direction == "max" if direction else bool(higher_is_better(metric))
        return cls(metric, higher)


def best_rows(results: pd.DataFrame, group_columns: list[str], selection: Selection
              ) -> pd.DataFrame:
    """One row per group (in key order): its best task's row of ``results``. A
    group none of whose tasks has the metric (too short to evaluate) keeps its
    first task that trained ok; a group with none ok is left out."""
    if selection.metric not in results.columns:
        raise ValueError(f"select={selection.metric!r}: no task reported that metric; the "
                         f"results' columns are {list(results.columns)}")
    ok = results[results["status"] == "ok"]
    if ok.empty:
        return results.iloc[0:0]
    scores = pd.to_numeric(ok[selection.metric], errors="coerce")
    ranked = -scores if selection.higher else scores
    # unscored tasks rank last, in task order: the first one stands in
    ranked = ranked.fillna(np.inf)
    if not group_columns:  # a bare grid: one winner
        return results.loc[[ranked.idxmin()]]
    keys = [ok[c] for c in group_columns]
    winners = ranked.groupby(keys if len(keys) > 1 else keys[0], sort=True,
                             dropna=False).idxmin()
    return results.loc[winners.to_numpy()]


def record_winners(store: Any, run_id: int, best: pd.DataFrame, key_rows: list[tuple],
                   group_columns: list[str], selection: Selection) -> int:
    """Attach to the run each group's winning model artifact (its key encoded as
    a prediction looks it up); return how many groups have one."""
    from .keys import encode_key

    artifacts = dict(store._conn.execute(
        "SELECT task_index, artifact FROM tasks WHERE run_id = ? AND artifact IS NOT NULL",
        (run_id,)).fetchall())
    width = len(group_columns)
    chosen = {}
    for index in best.index:
        digest = artifacts.get(int(index))
        if digest is not None:
            chosen[encode_key(key_rows[index][:width])] = digest
    store.attach(run_id, "selection", {"by": list(group_columns), "metric": selection.metric,
                                       "higher": selection.higher, "artifacts": chosen})
    return len(chosen)
