"""Evaluation: what a task computes besides its model, inside the worker.

Holdout, k-fold and time-series backtests that score ``fit``'s model on rows
it did not see (:mod:`.splitters`), the metrics and their directions
(:mod:`.metrics`), selection of each group's best candidate (:mod:`.selection`) and
successive halving (:mod:`.halving`), and fit statistics (:mod:`.fitstats`). It sits
above the engine, whose tasks it wraps, and below the store, which keeps its
scores.
"""
