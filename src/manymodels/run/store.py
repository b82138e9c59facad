"""The public ``mm.Store``: the store of :mod:`manymodels.store` and what the
layers above it add to it, the kinds of run that are not one task per model
(``mm.linear``'s, :mod:`manymodels.models.linear.stored`) and prediction on
the engine (:mod:`.prediction`). The store below knows none of them, so that it
never imports upward."""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Any

import pandas as pd

from ..models.linear import stored as linear_runs
from ..store import Store as _Store
from ..store.lazymodels import ModelMap
from .checkpointing import with_resumed
from .prediction import predict_from_store


class Store(_Store):
    """A directory of runs and models, as ``train(store=...)`` writes it, or
    an object store's location (``"s3://bucket/models"``): open one to list
    its runs, read their results, load and explain their models, and predict
    with them. Every method of the store below, plus:"""

    def _linear_run(self, run_id: int) -> Any:
        return linear_runs.linear_run(self, run_id)

    def results(self, run: int | None = None) -> pd.DataFrame:
        """The results of a run (default: the latest), like ``Run.results``."""
        linear = self._linear_run(self._run_row(run)[0])
        if linear is not None:  # one artifact, no task rows
            return linear_runs.results_frame(self, linear)
        return with_resumed(self, super().results(run))

    def _shown_results(self, run: int | None) -> tuple[pd.DataFrame, list[str]]:
        """:meth:`results` and its metric columns of floats, for ``manymodels
        show`` to print as floats (``1.0``) whatever task failed."""
        linear = self._linear_run(self._run_row(run)[0])
        if linear is not None:
            return linear_runs.results_and_floats(self, linear)
        frame, floats = self._results_and_floats(run)
        return with_resumed(self, frame), floats

    def load(self, key: Hashable, run: int | None = None) -> Any:
        """The model of ``key`` in ``run`` (default: the latest run that has
        ended). An mm.linear run keeps no model per group, but one result
        for all of them: refused, naming :meth:`linear`, which loads it."""
        self._refuse_linear(run, f"load({key!r})")
        return super().load(key, run)

    def models(self, run: int | None = None) -> ModelMap:
        """A lazy mapping key -> model of a run (default: the latest that
        has ended); refused for an mm.linear run, as :meth:`load` is."""
        self._refuse_linear(run, "models()")
        return super().models(run)

    def _refuse_linear(self, run: int | None, asked: str) -> None:
        """Refuse ``asked`` of an mm.linear run: it has no model objects (its
        ``results`` list every group, but ``load`` said it had no task with
        the key, and ``models`` was empty)."""
        linear = self._linear_run(self._run_row(run, ended=True)[0])
        if linear is not None:
            run_id, detail, _ = linear
            raise ValueError(
                f"run {run_id} is an mm.linear run: its groups' models are one result, not "
                f"a model each, so {asked} has none to give; load it with "
                f"Store.linear({detail.get('linear')!r}, run={run_id}), a LinearResult "
                "(.coefficients, .predict), or predict with Store.predict")

    def why_not_reused(self, key: Hashable, run: int | None = None) -> str:
        """Say why the task ``key`` of ``run`` (default: latest) was trained
        rather than reused: which part of its identity changed (of a task
        that did not end ok, first what became of it: cancelled, or its
        error)."""
        linear = self._linear_run(self._run_row(run)[0])
        if linear is not None:
            return linear_runs.explain(self, linear, key)
        return super().why_not_reused(key, run)

    def linear(self, name: str | None = None, run: int | None = None) -> Any:
        """The result ``mm.linear(..., store=, name=)`` saved (default: the
        latest of any name; ``run``: that run's), as a ``LinearResult``
        whose ``.predict`` works; checked against its SHA-256 first."""
        return linear_runs.load(self, name, run)

    def predict(self, table: Any, by: str | list[str] | None = None, method: str = "predict",
                features: list[str] | None = None, run: int | None = None,
                fallback: bool = True, with_source: bool = False, *,
                fn: Callable[[Any, Any], Any] | None = None, backend: str | None = None,
                workers: int | None = None, progress: bool = False
                ) -> pd.Series | pd.DataFrame:
        """Predict each row of ``table`` with its group's model, on the engine.

        Returns a Series aligned with ``table``'s rows. Each group uses its
        model in ``run``, or by default its latest model in the runs that
        have ended (a re-run where the group failed leaves it its earlier
        model; a run still being written is left out); a run
        trained with ``select=`` gives each group its winning candidate. A row
        whose group has no model gets the run's fallback model when it has one
        (``manymodels train`` keeps a global one) and ``fallback`` is true,
        else NaN, with a warning: never another group's model. When no row has
        a model at all, it raises instead. With ``with_source``, a DataFrame
        of ``prediction`` and ``source`` ("group", "fallback" or "none").
        ``by`` and ``features`` default to what ``manymodels train`` recorded,
        else ``features`` to the model's ``feature_names_in_``, else every
        column but the ``by`` columns. ``fn(model, rows)`` replaces
        ``model.predict(rows[features])`` (a forecaster that needs more).

        A Spark or Dask DataFrame, or a Ray Dataset, is grouped and predicted
        by its engine's workers, and the answer is that engine's lazy table:
        the input's columns plus ``prediction`` (and ``source``), nothing
        collected on the driver (:mod:`manymodels.run.enginepredict`).

        The groups run through ``backend`` (``"processes"``, ``"threads"``,
        ``"serial"``, ``"ray"``, ``"spark"`` or ``"dask"``; by default a few groups
        are predicted first to measure the cost, and all of them run in the
        driver when that cost stays under half a second, else on worker
        processes) on ``workers``: each worker loads its groups' models
        from the store (checked against their SHA-256) and predicts their rows (see
        :mod:`manymodels.run.prediction`).
        """
        return predict_from_store(self, table, by, method, features, run, fallback, with_source,
                                  fn=fn, backend=backend, workers=workers, progress=progress)

    def forecast(self, h: int, by: str | list[str] | None = None, freq: Any = None,
                 run: int | None = None, *, time: str | None = None, history: Any = None,
                 X_future: Any = None, backend: str | None = None, workers: int | None = None,
                 progress: bool = False) -> pd.DataFrame:
        """Forecast every group ``h`` steps after its last observed time, with
        its kept model (its winner with ``select=``), on the engine.

        manymodels makes the future rows: each group's ``h`` time stamps after
        its last time in ``time`` (default: the time column of the run's
        ``mm.backtest``, else the run's one ``order_by`` column),
        ``freq`` apart (a pandas offset alias such as ``"D"`` or ``"MS"``, or a
        number for a time column of whole numbers; inferred per group from its
        times when not given). The times come from ``history`` (a table or
        path with the key and time columns, such as the one trained on), else
        from the run's backtest forecasts, whose last window ends at each
        group's last row. A model with ``forecast(h)``, ``predict(h)`` or
        sktime's ``predict(fh)`` is asked for ``h`` steps; a model with
        ``predict(X)`` gets the future rows as a DataFrame (key and time
        columns, plus the features of ``X_future``: a table with a row per
        group and future time). Returns a DataFrame of the key columns, the
        time column and ``yhat``, ``h`` rows a group. ``backend`` and
        ``workers`` are :meth:`predict`'s (see :mod:`manymodels.run.forecasting`).
        """
        from .forecasting import forecast_from_store

        return forecast_from_store(self, h, by, freq, run, time=time, history=history,
                                   X_future=X_future, backend=backend, workers=workers,
                                   progress=progress)
