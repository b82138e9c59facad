"""Successive halving: ``select=mm.halving(...)``, each group's candidates
raced inside one task.

``select="rmse"`` (:mod:`.selection`) runs a task per candidate and picks
each group's best in the driver; halving runs one task per group instead,
on its worker: every candidate is scored on the evaluation's first window,
the best ``1/eta`` go on to the next, and the survivor is fitted on all
rows. It sits on the evaluation's windows (:mod:`.windowed`) and on
:class:`~.selection.Selection`, the checked metric; the run (``run.runner``)
builds its search and hashes it into the tasks' identities, ties broken by
:func:`stable_order`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ..engine.options import positive_int
from .selection import Selection


def _mean(scores: np.ndarray) -> float:
    """A candidate's mean over its scored windows (NaN where none was)."""
    return float(np.mean(scores)) if len(scores) else float("nan")


@dataclass(frozen=True)
class Halving:
    """``select=mm.halving("rmse", eta=3)``: successive halving per group."""

    selection: Selection
    eta: int = 3
    keep: str = "best"

    def __getstate__(self) -> dict[str, Any]:
        # keep="best" pickles as before the option was added: a task's
        # identity (which pickles this) stays what earlier runs stored
        state = dict(self.__dict__)
        if state.get("keep") == "best":
            del state["keep"]
        return state


def halving(metric: str | tuple[str, str], eta: int = 3, keep: str = "best") -> Halving:
    """Successive halving of each group's candidates over the evaluation's
    windows: every candidate is scored on the first window, the best
    ``1/eta`` (by their mean so far) go on to the next, and so on; the
    survivor of the last window is refitted on all rows. Needs
    ``groups * grid`` and an ``evaluate=`` of several windows (a backtest or
    k folds); it runs one task per group, whose result row names its winning
    setting in ``best_<name>`` columns and counts its ``window_fits``.

    ``eta=1`` drops no candidate early: every candidate is scored on every
    window, as ``select="rmse"`` does, but in one task per group on the same
    windows, and only the winner is fitted on all rows and stored (not one
    model per candidate).

    ``keep="all"`` keeps every candidate's model, each fitted on all rows:
    the task's model is then a
    :class:`~manymodels.evaluation.candidates.Candidates`, which predicts as
    its winner and holds every candidate's model, setting and mean score."""
    eta = positive_int("halving's eta", eta, 1)
    if keep not in ("best", "all"):
        raise ValueError(f"halving's keep must be 'best' (the winner's model) or 'all' "
                         f"(every candidate's), got {keep!r}")
    return Halving(Selection.parse(metric, example="mm.halving(({!r}, 'max'))"), eta, keep)


class HalvingSearch:
    """The task of one group under :func:`halving` (runs on its worker)."""

    def __init__(self, fit: Any, splitter: Any, settings: list[dict[str, Any]],
                 halving: Halving, retry_on: tuple[type[BaseException], ...] = ()) -> None:
        self.fit, self.splitter, self.settings, self.halving = fit, splitter, settings, halving
        #: each setting's place in :func:`stable_order`: ties go to the first
        #: there, whatever the grid's order
        self._tie = stable_ranks(settings)
        #: errors the run retries (``retry_on=``, with ``retries=``): raised
        #: again, not a candidate's failure (see :meth:`_left_race`)
        self.retry_on = retry_on

    def __call__(self, rows: Any, **shared: Any) -> tuple[Any, dict[str, Any]]:
        from .splitters import WINDOWS, TooShort
        from .windowed import GroupWindows, skipped_metrics
        from .windowtable import join, mean_scores

        splitter = self.splitter
        skipped = None
        try:
            group = GroupWindows(splitter, rows)
        except TooShort as exc:
            group, skipped = None, str(exc)
        if group is None:
            alive, records, failed, fits = [0], {i: [] for i, _ in enumerate(self.settings)}, {}, 0
        elif self.halving.eta == 1:
            alive, records, failed, fits = self._score_all(group, shared)
        else:
            alive, records, failed, fits = self._race(group, shared)
        # the final fits see the rows as the windows did (a backtest's: sorted by time)
        rows = splitter.prepare(rows) if group is None else group.rows
        if self.halving.keep == "all":
            model, fit_metrics, winner = self._fit_all(rows, shared, records, failed, alive[0])
        else:  # too short to race: the first candidate that fits; else the best
            order = (sorted(range(len(self.settings)), key=self._tie.__getitem__)
                     if group is None
                     else self._best_first(records, failed, alive[0]))
            model, fit_metrics, winner = self._first_that_fits(rows, shared, failed, order)
        self._refuse_own_columns(fit_metrics, "fit")
        windows = join(records[winner])
        metrics: dict[str, Any] = {**fit_metrics, **mean_scores(windows)}
        if skipped is not None:
            metrics.update(skipped_metrics(splitter, skipped))
        metrics.update({f"best_{k}": v for k, v in self.settings[winner].items()})
        metrics["window_fits"] = fits
        if failed:  # how many candidates raised, and the first one's error
            metrics["candidates_failed"] = len(failed)
            first = self._first(failed)
            metrics["candidate_error"] = f"{self.settings[first]}: {failed[first]}"[:500]
        metrics[WINDOWS] = windows
        return model, metrics

    def _race(self, group: Any, shared: dict[str, Any]) -> tuple[list[int], dict, dict, int]:
        """Successive halving over ``group``'s windows: ``(the candidates
        left, best first; each one's windows tables; those that raised, with
        their error; the fits made)``."""
        from ..engine.execution import split_result

        alive = list(range(len(self.settings)))
        records: dict[int, list[dict[str, Any]]] = {i: [] for i in alive}  # windows tables
        failed: dict[int, str] = {}  # a candidate that raised: out of the race, not the group
        benched: list[list[int]] = []  # each halving's cut, best first: never raised
        fits, windows = 0, len(group.windows)

        def run(i: int, number: int) -> None:
            nonlocal fits
            fits += 1
            try:
                model, fit_metrics = split_result(self.fit(
                    group.train_rows(number), **self.settings[i], **shared))
                predicted, scores = group.predict(model, number)
            except Exception as exc:
                failed[i] = self._left_race(exc)
                return
            self._refuse_own_columns(fit_metrics, "fit")  # (the group's error, at once)
            self._refuse_own_columns(scores, "a metric function")
            records[i].append(group.table([number], [predicted], [scores]))

        for number in range(windows):
            for i in alive:
                run(i, number)
            alive = [i for i in alive if i not in failed]
            while not alive and benched:
                # every survivor raised: those cut last come back (they never
                # raised), each catching up on the windows it missed
                for i in benched.pop():
                    for missed in range(len(records[i]), number + 1):
                        if i not in failed:
                            run(i, missed)
                alive = [i for i in range(len(self.settings))
                         if i not in failed and len(records[i]) == number + 1]
            if not alive:
                first = self._first(failed)
                raise RuntimeError(
                    f"every candidate failed by window {number}, e.g. "
                    f"{self.settings[first]}: {failed[first]}")
            ranks = {i: self._rank(records[i]) for i in alive}
            if number < windows - 1 and all(rank == np.inf for rank in ranks.values()):
                continue  # no candidate has a score yet (mase of a flat start): none is cut
            keep = max(1, -(-len(alive) // self.halving.eta)) if number < windows - 1 else 1
            # ties go to the first setting in stable_order's (alive is in the
            # order of the last cut, best first, not that one)
            ranked = sorted(alive, key=lambda i: (ranks[i], self._tie[i]))
            alive = ranked[:keep]
            if ranked[keep:]:
                benched.append(ranked[keep:])
        return alive, records, failed, fits

    def _score_all(self, group: Any, shared: dict[str, Any]
                   ) -> tuple[list[int], dict, dict, int]:
        """``eta=1``: every candidate on every window, each candidate's
        windows scored at once (as ``select=`` scores a task's); the same
        as :meth:`_race`'s answer, in fewer calls."""
        from .windowed import evaluate_group

        records: dict[int, list[dict[str, Any]]] = {}
        failed: dict[int, str] = {}
        fits = 0

        def counted(*args: Any, **kwargs: Any) -> Any:
            nonlocal fits
            fits += 1
            return self.fit(*args, **kwargs)

        for i, setting in enumerate(self.settings):
            try:
                _, fit_metrics, table = evaluate_group(counted, group, {**setting, **shared})
            except Exception as exc:
                failed[i] = self._left_race(exc)
                continue
            self._refuse_own_columns(fit_metrics, "fit")
            self._refuse_own_columns(table, "a metric function")
            records[i] = [table]
        if not records:
            raise self._all_failed(failed)
        alive = sorted(records, key=lambda i: (self._rank(records[i]), self._tie[i]))[:1]
        return alive, records, failed, fits

    def own_columns(self) -> set[str]:
        """The result columns a halving task writes itself: a metric of
        one of these names would be overwritten in its row. (A grid's
        settings all name the same parameters.)"""
        return {"window_fits", "candidates_failed", "candidate_error",
                *(f"best_{name}" for name in (self.settings[0] if self.settings else ()))}

    def _refuse_own_columns(self, named: Any, reporter: str) -> None:
        """Refuse, naming it, a metric that ``reporter`` gave one of
        :meth:`own_columns`' names (it would be overwritten, silently)."""
        taken = self.own_columns().intersection(named)
        if taken:
            raise ValueError(f"{reporter} reported a metric named {min(taken)!r}, a column "
                             "select=mm.halving(...) writes in each group's row (the "
                             "winner's setting, best_<name>; window_fits; "
                             "candidates_failed; candidate_error): name it otherwise")

    def _best_first(self, records: dict[int, list], failed: dict[int, str],
                    winner: int) -> list[int]:
        """The race's winner, then the others that did not raise, best mean
        first (ties: :func:`stable_order`'s): who is fitted on all rows in turn."""
        rest = [i for i in range(len(self.settings)) if i != winner and i not in failed]
        return [winner, *sorted(rest, key=lambda i: (
            self._rank(records[i]) if records.get(i) else np.inf, self._tie[i]))]

    def _first_that_fits(self, rows: Any, shared: dict[str, Any], failed: dict[int, str],
                         order: Any) -> tuple[Any, dict[str, Any], int]:
        """The first candidate of ``order`` whose fit on all rows does not
        raise (one that does leaves, as in a race; the group fails only when
        every candidate has): the winner's where it fits, else the next
        best's (the group failed, though others had raced without raising)."""
        from ..engine.execution import split_result

        for i in order:
            try:
                return (*split_result(self.fit(rows, **self.settings[i], **shared)), i)
            except Exception as exc:
                failed[i] = self._left_race(exc)
        raise self._all_failed(failed)

    def _first(self, failed: dict[int, str]) -> int:
        """The candidate of ``failed`` whose error is shown: the first in
        :func:`stable_order` (the same whatever the grid's order)."""
        return min(failed, key=self._tie.__getitem__)

    def _left_race(self, exc: Exception) -> str:
        """What a candidate that raised ``exc`` leaves the race with. An error
        of ``retry_on=`` is raised again: the group's task is retried, as any
        task's is; dropping the candidate let a worse one win on a passing
        fault (the best candidate's ConnectionError in one window)."""
        if isinstance(exc, self.retry_on):
            raise exc
        return f"{type(exc).__name__}: {exc}"

    def _all_failed(self, failed: dict[int, str]) -> RuntimeError:
        """The error of a group every candidate of which raised: the first one's."""
        first = self._first(failed)
        return RuntimeError(f"every candidate failed, e.g. {self.settings[first]}: "
                            f"{failed[first]}")

    def _fit_all(self, rows: Any, shared: dict[str, Any], records: dict[int, list],
                 failed: dict[int, str], winner: int) -> tuple[Any, dict[str, Any], int]:
        """``keep="all"``: every candidate that did not raise fitted on all
        rows, as one :class:`~.candidates.Candidates`; the winner's fit
        metrics, and the winner: a candidate whose fit on all rows raises
        leaves (None in its place), and where that is the winner, or the
        group was too short to race, the best one left wins."""
        from ..engine.execution import split_result
        from .candidates import Candidates

        models: list[Any] = []
        own_metrics: dict[int, dict[str, Any]] = {}
        for i, setting in enumerate(self.settings):
            model = None
            if i not in failed:
                try:
                    model, own_metrics[i] = split_result(self.fit(rows, **setting, **shared))
                except Exception as exc:
                    failed[i] = self._left_race(exc)
            models.append(model)
        if len(failed) == len(self.settings):
            raise self._all_failed(failed)
        if winner in failed:
            left = [i for i in range(len(self.settings)) if i not in failed]
            winner = min(left, key=lambda i: (self._rank(records[i]) if records.get(i)
                                              else np.inf, self._tie[i]))
        fit_metrics = own_metrics[winner]
        metric = self.halving.selection.metric
        from .windowtable import score_column

        scores = [_mean(score_column(records[i], metric))
                  if records.get(i) and i not in failed else float("nan")
                  for i in range(len(self.settings))]
        return Candidates(self.settings, models, scores, winner, metric), fit_metrics, winner

    def _rank(self, records: list[dict[str, Any]]) -> float:
        """A candidate's mean score so far, lower better (NaN last)."""
        from .windowtable import score_column

        value = _mean(score_column(records, self.halving.selection.metric))  # as mean_scores
        if value != value:
            return np.inf
        return -value if self.halving.selection.higher else value

    @staticmethod
    def prepare(fit: Any, source: Any, splitter: Any, halving: Halving,
                retry_on: tuple[type[BaseException], ...] = ()) -> tuple:
        """``(source, fit)`` to run: one task per group of ``groups * grid``;
        ``retry_on``: the errors the run retries (none without ``retries=``)."""
        from ..inputs.grids import ProductSource

        if splitter is None:
            raise ValueError("select=mm.halving(...) needs evaluate= (a backtest or k folds)")
        if not isinstance(source, ProductSource):
            raise ValueError("select=mm.halving(...) needs groups * grid: candidates to halve")
        metric = halving.selection.metric
        named = splitter.metric_names()
        if metric not in named and len(named) == len(splitter.metrics):
            raise ValueError(f"select={metric!r} names a metric that evaluate= does not "
                             f"compute; it computes {', '.join(named)}")
        if source.grid.cost is not None:  # (one task a group: its candidates, all of them)
            raise ValueError(
                "grid(cost=...) orders a run's tasks by their settings' cost, but under "
                "select=mm.halving(...) every group's candidates run in one task, so no "
                "setting's cost can order anything: leave out grid's cost= (give groups' "
                "cost= to order the groups)")
        return source.base, HalvingSearch(fit, splitter, source.grid.combinations(), halving,
                                          retry_on)


def stable_ranks(settings: list[dict[str, Any]]) -> list[int]:
    """Each setting's place in :func:`stable_order`."""
    order = stable_order(list(range(len(settings))), settings)
    ranks = [0] * len(settings)
    for place, position in enumerate(order):
        ranks[position] = place
    return ranks


def stable_order(items: list[Any], settings: list[dict[str, Any]]) -> list[Any]:
    """``items`` (one a setting) in an order of the settings that does not
    depend on the grid's: by their values, parameter by parameter in the
    grid's order of parameters (see :func:`_value_keys`). Halving breaks ties
    by this order, and a task's identity hashes its settings in it, so that
    the same grid given in another order (built from a set, a dict's keys)
    chooses the same winners and reuses the stored models rather than
    retraining every group. A grid whose values are given in ascending
    order is already in this order (its identity is what it was before)."""
    if not settings:
        return list(items)
    keys = {name: _value_keys([setting[name] for setting in settings])
            for name in settings[0]}
    return [items[i] for i in sorted(range(len(settings)),
                                     key=lambda i: tuple(keys[name][i] for name in keys))]


def _value_keys(values: list[Any]) -> list[tuple]:
    """Each of one parameter's values (one a setting) as it sorts: by number
    where every value is a real number (NaN last), by text where every one
    is text, else by its hash (:func:`~manymodels.identity.valuehash.value_hash`:
    an estimator, a tuple, None beside numbers); a value that cannot be
    hashed (not picklable: a run without a store) by its first place in the
    grid."""
    import numbers

    from ..identity.hashing import plain_setting
    from ..identity.valuehash import value_hash

    if all(isinstance(v, numbers.Real) for v in values):
        return [(1, 0.0) if v != v else (0, float(v)) for v in values]
    if all(isinstance(v, str) for v in values):
        return [(0, str(v)) for v in values]
    hashes: dict[int, tuple] = {}  # (the settings share their values' objects)
    keys = []
    for position, value in enumerate(values):
        key = hashes.get(id(value))
        if key is None:
            try:
                key = (0, value_hash(plain_setting({"v": value})["v"]))
            except Exception:
                key = (1, str(position).zfill(12))
            hashes[id(value)] = key
        keys.append(key)
    return keys
