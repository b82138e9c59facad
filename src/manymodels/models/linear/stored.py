"""``mm.linear(..., store=...)``: the whole result saved as one artifact, and
re-runs that fit only the groups that changed.

A million linear models are a few arrays, so the store keeps them as one
Arrow IPC artifact (keys, coefficients, metrics, and per group its identity
and the run that fitted it), written through the store's content-addressed
artifact path and checked against its SHA-256 before it is read, and one row
in ``runs`` (``Store.runs()``, ``manymodels runs``), not a million task rows.

A group's identity (:mod:`.identities`) is a hash of its rows in order and
of the *options hash*: family, column names, the options that family uses
and the model code's version. A re-run loads the latest saved result with
the same options hash, copies the groups whose key and identity match, fits
the others, and drops the groups that are gone; ``LinearResult.why_not_reused``
says which case a group was. An artifact that fails its SHA-256 check is refused by name
(:class:`~manymodels.store.StoreIntegrityError`, given as a warning) and its
groups are fitted again.
"""

from __future__ import annotations

import json
import sqlite3
import time
import warnings
from dataclasses import dataclass
from pathlib import PurePath
from typing import Any

import numpy as np
import pandas as pd

from ...identity.hashing import digest
from ...store import Store, StoreError, StoreIntegrityError, artifacts, database
from ...store.registry import run_number
from .artifact import Saved, from_artifact, to_artifact
from .fitting import STATUSES, empty, fit_groups, plain_values
from .identities import describe_options, group_identities, match_keys
from .prepare import Prepared
from .result import LinearResult

PREFIX = "linear:"  # attachment name of a saved result: linear:<name>
# why a group was fitted rather than reused (LinearResult.why_not_reused)
REUSED, NEW_KEY, CHANGED, NO_SOURCE = 0, 1, 2, 3


@dataclass
class Opened:
    store: Store
    name: str
    owned: bool  # opened here from a path: closed at the end


def check_name(name: Any) -> None:
    """Refuse a result's name that is no non-empty string."""
    if not isinstance(name, str) or not name:
        raise TypeError(f"name= must be a non-empty string, got {name!r}")


def open_store(store: Any, name: str) -> Opened:
    """The store to save into, refused before any work if it cannot be."""
    check_name(name)
    if isinstance(store, Store):
        opened = Opened(store, name, False)
    elif isinstance(store, (str, PurePath)):
        opened = Opened(Store(store), name, True)
    else:
        raise TypeError(f"store= must be a path or a manymodels.Store, got {store!r}")
    opened.store._make()  # (where it was opened with no store there yet)
    if opened.store.read_only:
        if opened.owned:
            opened.store.close()
        raise StoreError(f"store {str(opened.store)!r} is open for reading only: "
                         "mm.linear cannot save its result there")
    if not opened.owned:  # opened a while ago, on an object store: what was published since
        opened.store._refresh()
    return opened


def subset(data: Prepared, index: np.ndarray) -> Prepared:
    """The groups ``index`` of ``data`` (their rows stay where they are)."""
    alpha = data.alpha if np.ndim(data.alpha) == 0 else data.alpha[index]
    return Prepared(data.keys.iloc[index], data.counts[index], data.starts[index], data.order,
                    data.columns, data.w, alpha)


# -- the run ------------------------------------------------------------------------


def _linear_runs(store: Store, name: str | None = None) -> list[tuple]:
    """(run_id, code_detail, artifact) of the finished mm.linear runs, latest first."""
    rows = store._conn.execute(
        "SELECT r.run_id, r.code_detail, a.artifact, a.name FROM runs r JOIN attachments a "
        "ON a.run_id = r.run_id WHERE r.status = 'finished' AND a.name LIKE 'linear:%' "
        "ORDER BY r.run_id DESC").fetchall()
    return [(run_id, json.loads(detail or "{}"), artifact) for run_id, detail, artifact, label
            in rows if name is None or label == PREFIX + name]


def load(store: Store, name: str | None = None, run: int | None = None) -> LinearResult:
    """The result saved by ``mm.linear(..., store=, name=)`` (default: the
    latest of any name), or the one of ``run``; checked against its SHA-256.
    ``name`` and ``run`` are checked first: ``int(run)`` read ``1.7`` and
    ``True`` as run 1, and a name not a string failed in a concatenation."""
    if name is not None:
        check_name(name)
    if run is not None:
        run = run_number(run)
    found = [row for row in _linear_runs(store, name) if run is None or row[0] == run]
    if not found:
        names = sorted({d.get("linear") for _, d, _ in _linear_runs(store)})
        which = f"named {name!r}" if name is not None else "at all"
        where = f" in run {run}" if run is not None else ""
        raise ValueError(f"store {str(store)!r} holds no mm.linear result {which}{where}"
                         f"; the names it holds: {names}")
    return _read(store, found[0]).result


def _source(store: Store, options_hash: str) -> tuple[Saved | None, list[str]]:
    """The latest saved result with these options that loads, and the
    artifacts refused on the way (a failed SHA-256 check)."""
    refused = []
    for run_id, detail, artifact in _linear_runs(store):
        if detail.get("options_hash") != options_hash:
            continue
        try:
            return _read(store, (run_id, detail, artifact)), refused
        except StoreIntegrityError as exc:
            refused.append(str(exc))
            warnings.warn(f"{exc}; its groups are fitted again", RuntimeWarning, stacklevel=5)
    return None, refused


def _no_source_reason(store: Store, name: str, options: dict, refused: list[str],
                      before_run: int | None = None) -> str:
    if refused:
        return f"the saved result it would reuse was refused: {refused[0]}"
    earlier = [row for row in _linear_runs(store, name)
               if before_run is None or row[0] < before_run]
    if not earlier:
        return f"no earlier mm.linear result named {name!r} in this store"
    run_id, detail, _ = earlier[0]
    before = detail.get("options", {})
    changed = [f"{k} ({before.get(k)!r} -> {options.get(k)!r})"
               for k in sorted(set(before) | set(options)) if before.get(k) != options.get(k)]
    changed = [c if not c.startswith("model_code") else "the model code" for c in changed]
    if not changed:
        return f"the result of run {run_id}, with the same options, could not be used"
    return f"since run {run_id}, " + ", ".join(changed) + " changed"


# -- the store's views of an mm.linear run (Store.results, Store.why_not_reused) --------


def linear_run(store: Store, run_id: int) -> tuple[int, dict, str] | None:
    """``(run_id, code_detail, artifact)`` when ``run_id`` saved an mm.linear result."""
    row = store._conn.execute(
        "SELECT r.code_detail, a.artifact FROM runs r JOIN attachments a ON a.run_id = "
        "r.run_id WHERE r.run_id = ? AND a.name LIKE 'linear:%'", (run_id,)).fetchone()
    return None if row is None else (run_id, json.loads(row[0] or "{}"), row[1])


def _read(store: Store, found: tuple[int, dict, str]) -> Saved:
    run_id, detail, artifact = found
    what = f"the mm.linear result {detail.get('linear')!r} of run {run_id}"
    saved = from_artifact(artifacts.read_artifact(store._conn, store.root, artifact, what),
                          run_id)
    saved.digest = artifact
    return saved


def results_frame(store: Store, found: tuple[int, dict, str]) -> pd.DataFrame:
    """An mm.linear run as ``Store.results`` shows a run: a row per group (its
    status and metrics; its coefficients are in ``Store.linear``)."""
    return results_and_floats(store, found)[0]


def results_and_floats(store: Store, found: tuple[int, dict, str]
                       ) -> tuple[pd.DataFrame, list[str]]:
    """:func:`results_frame`, and its metric columns of floats (an ``r2`` of
    1.0 in every row), for ``manymodels show`` to print as floats: beside a
    failed group's blank it printed them as integers."""
    result = _read(store, found).result
    frame = result.keys.copy()
    frame["run_id"] = found[0]
    frame["status"] = result.metrics["status"].astype(str).to_numpy()
    frame["attempts"] = np.where(result.metrics["reused_from"].isna(), 1, 0)
    frame["duration_s"] = frame["started_at"] = np.nan  # one batched fit, no task timings
    frame["worker"] = None
    frame["reused_from"] = result.metrics["reused_from"].to_numpy()
    frame["error"], frame["artifact"], frame["size"] = None, found[2], None
    floats = []
    for column in result.metrics.columns:
        if column not in frame.columns:
            frame[column] = result.metrics[column].to_numpy()
            if pd.api.types.is_float_dtype(result.metrics[column].dtype):
                floats.append(column)
    return frame, floats


def predict_frame(store: Store, found: tuple[int, dict, str], table: Any, method: str,
                  with_source: bool, *, features: list[str] | None = None,
                  fn: Any = None) -> pd.Series | pd.DataFrame:
    """``Store.predict`` for an mm.linear run: each row by its group's model.

    ``by=`` is checked by the caller against the run's key columns, as for
    any run. An mm.linear run has no fallback model (``fallback=`` changes
    nothing: a row of a group with no model is NaN) nor model objects for
    ``fn=`` (refused); ``features=`` may only name the run's own features,
    which its coefficients multiply."""
    from ...inputs.tables import exact_pandas, read_table

    methods = ("predict", "predict_proba", "decision_function")
    if method not in methods:
        raise ValueError(f"method must be one of {methods} for an mm.linear run, "
                         f"got {method!r}")
    if fn is not None:
        raise ValueError(f"fn= calls each group's model object, but run {found[0]} is an "
                         "mm.linear run, whose models are arrays of coefficients: leave "
                         "fn= out, or load the result with Store.linear()")
    result = _read(store, found).result
    if features is not None and sorted(features) != sorted(result.features):
        raise ValueError(f"features={features!r}, but the models of run {found[0]} "
                         f"(mm.linear) take {result.features!r}: leave features= out")
    # (integer keys beside a missing one as Int64, as the mm.train path reads
    # them: as floats, 2**53 + 1 would find the model of 2**53)
    frame = table if isinstance(table, pd.DataFrame) else exact_pandas(read_table(table))
    if frame.empty:
        raise ValueError("the table to predict has no rows")
    values = getattr(result, method)(frame)
    seen = result.group_of(frame) >= 0
    if not seen.any():
        raise ValueError(f"no row of the table has a model in store {str(store)!r}: "
                         f"none of its groups by {result.by} is in run {found[0]}")
    if not seen.all():
        warnings.warn(_unseen_rows(frame, seen, result.by, found[0], store), RuntimeWarning,
                      stacklevel=3)
    prediction = pd.Series(values, index=frame.index)
    if with_source:
        return pd.DataFrame({"prediction": prediction,
                             "source": np.where(seen, "group", "none")}, index=frame.index)
    return prediction


def _unseen_rows(frame: pd.DataFrame, seen: np.ndarray, by: list[str], run_id: int,
                 store: Store) -> str:
    """The warning for the rows of ``frame`` of no group of the run: never
    trained, as ``Store.predict`` says an mm.train run's groups (an mm.linear
    run keeps every group it was given; none fails)."""
    from ...store.nomodel import said_without_model

    keys = frame.loc[~seen, by].drop_duplicates()
    never = keys[by[0]].tolist() if len(by) == 1 else list(keys.itertuples(index=False,
                                                                            name=None))
    return (f"{int((~seen).sum())} row(s) of {len(never)} group(s) have no model in run "
            f"{run_id} of store {str(store)!r}: their prediction is NaN; "
            + said_without_model([], never))


def explain(store: Store, found: tuple[int, dict, str], key: Any) -> str:
    """Why group ``key`` of an mm.linear run was fitted rather than reused."""
    run_id, detail, _ = found
    saved = _read(store, found)
    where = saved.result._key_index().get_indexer([key])[0]
    if where < 0:
        raise KeyError(f"run {run_id} has no group {key!r}")
    if saved.fitted_in[where] != run_id:
        return f"{key!r} was reused from run {saved.fitted_in[where]}"
    for earlier in _linear_runs(store):
        if earlier[0] < run_id and earlier[2] and (
                earlier[1].get("options_hash") == detail.get("options_hash")):
            try:
                source = _read(store, earlier)
            except StoreIntegrityError as exc:
                return f"{key!r} was fitted: the saved result it would reuse is refused: {exc}"
            position = source.result._key_index().get_indexer([key])[0]
            if position < 0:
                return f"{key!r} was fitted: run {earlier[0]} had no group {key!r}"
            if source.identity[position] != saved.identity[where]:
                return f"{key!r} was fitted: its rows changed since run {earlier[0]}"
            return (f"{key!r} was fitted: the result of run {earlier[0]} could not be used "
                    "when it ran (refused, or saved after it started)")
    return f"{key!r} was fitted: " + _no_source_reason(
        store, detail.get("linear", ""), detail.get("options", {}), [], run_id)


def _begin(store: Store, name: str, table: Any, by: list[str], groups: int, options: dict,
           options_hash: str, workers: int, engine: str) -> int:
    source = f"groups({str(table) if isinstance(table, (str, PurePath)) else type(table).__name__}"
    detail = {"linear": name, "options": options, "options_hash": options_hash}
    store._refuse_gone()  # (its folder removed since it was opened)
    conn = store._conn
    try:
        conn.execute("BEGIN IMMEDIATE")
        run_id = database.insert_run(
            conn, backend=engine, workers=workers, source=f"{source}, by={by})",
            fit=f"mm.linear({options['family']}) {name}", tasks=groups, key_columns=by,
            param_columns=[], code_detail=detail)
        conn.execute("COMMIT")
        return run_id
    except sqlite3.Error as exc:
        database.rollback_quietly(conn)
        raise database.write_error(store.root, exc, "the run could not start") from exc


def _finish(store: Store, run_id: int, name: str, artifact: memoryview | str,
            result: LinearResult,
            reused: int, wall_s: float) -> None:
    """The artifact, its attachment and the run's end: one transaction."""
    store._refuse_gone()  # (its folder removed since it was opened)
    conn = store._conn
    has_model = int(np.isfinite(result.intercept).sum()) if len(result) else 0
    try:
        conn.execute("BEGIN IMMEDIATE")
        digest_ = artifact if isinstance(artifact, str) else artifacts.write_artifact(
            conn, store.root, artifact)[0]
        conn.execute("INSERT OR REPLACE INTO attachments VALUES (?, ?, ?)",
                     (run_id, PREFIX + name, digest_))
        conn.execute("UPDATE runs SET finished_at=?, status='finished', ok=?, failed=?, "
                     "reused=?, wall_s=? WHERE run_id=?",
                     (time.time(), has_model, len(result) - has_model, reused, wall_s, run_id))
        conn.execute("COMMIT")
    except (sqlite3.Error, OSError) as exc:
        database.rollback_quietly(conn)
        raise database.write_error(store.root, exc, "the mm.linear result was not saved") \
            from exc
    store._publish()  # a store on an object store: its index, published


def _abandon(store: Store, run_id: int) -> None:
    try:
        database.rollback_quietly(store._conn)
        store._conn.execute("UPDATE runs SET finished_at=?, status='failed' WHERE run_id=?",
                            (time.time(), run_id))
    except sqlite3.Error:
        pass


def linear_in_store(opened: Opened, table: Any, data: Prepared, family: str, by: list[str],
                    features: list[str], target: str, weights: str | None, alpha: Any,
                    options: dict, *, engine: Any, on: dict, started: float,
                    prepared: float) -> LinearResult:
    """:func:`manymodels.linear` with a store (see the module's doc)."""
    try:
        return _linear_in_store(opened, table, data, family, by, features, target, weights,
                                alpha, options, engine=engine, on=on, started=started,
                                prepared=prepared)
    finally:
        if opened.owned:
            opened.store.close()


def _linear_in_store(opened: Opened, table: Any, data: Prepared, family: str, by: list[str],
                     features: list[str], target: str, weights: str | None, alpha: Any,
                     options: dict, *, engine: Any, on: dict, started: float,
                     prepared: float) -> LinearResult:
    from . import assemble

    store, name = opened.store, opened.name
    described = describe_options(family, by, features, target, weights, alpha, options)
    options_hash = digest(json.dumps(described, sort_keys=True))
    identity = group_identities(data, options_hash)
    hashed = time.perf_counter()
    device = "numpy" if not on else f"torch:{on['device']}"
    run_id = _begin(store, name, table, by, data.groups, described, options_hash,
                    int(options["workers"]), f"mm.linear:{device}")
    try:
        old, refused = _source(store, options_hash)
        text = "" if old is not None else _no_source_reason(store, name, described, refused)
        reason = np.full(data.groups, NO_SOURCE, dtype=np.int8)
        hit = np.zeros(data.groups, dtype=bool)
        position = np.full(data.groups, -1)
        if old is not None:
            position = match_keys(data.keys, old.result.keys)
            known = position >= 0
            hit[known] = old.identity[position[known]] == identity[known]
            reason[:] = np.where(hit, REUSED, np.where(known, CHANGED, NEW_KEY))
        loaded = time.perf_counter()
        todo = np.flatnonzero(~hit)
        fit_options = {k: options[k] for k in ("fit_intercept", "C", "max_iter", "tol",
                                                "workers", "block_rows")}
        fresh = fit_groups(subset(data, todo), len(features), family, engine=engine, on=on,
                           **fit_options)
        fitted = empty(family, data.groups, len(features))
        fitted_in = np.full(data.groups, run_id, dtype=np.int64)
        codes = np.empty(data.groups, dtype=np.int8)  # statuses as codes: no strings
        fitted.coef[todo], fitted.intercept[todo] = fresh.coef, fresh.intercept
        codes[todo] = pd.Categorical(fresh.status, categories=STATUSES).codes
        for metric, values in fresh.extra.items():
            fitted.extra[metric][todo] = values
        if old is not None and hit.any():
            source = position[hit]
            saved = old.result
            fitted.coef[hit], fitted.intercept[hit] = saved.coef[source], saved.intercept[source]
            codes[hit] = saved.metrics["status"].cat.codes.to_numpy()[source]
            for metric, values in fitted.extra.items():
                values[hit] = plain_values(saved.metrics[metric], values.dtype)[source]
            fitted_in[hit] = old.fitted_in[source]
        fitted.status = pd.Categorical.from_codes(codes, categories=STATUSES)
        done = time.perf_counter()
        reused_from = pd.arrays.IntegerArray(fitted_in, ~hit)
        result = assemble(family, by, features, target, options["fit_intercept"], data,
                          fitted, {}, reused_from=reused_from)
        unchanged = (old is not None and hit.all() and len(old.identity) == data.groups
                     and np.array_equal(position, np.arange(data.groups)))
        # an unchanged result is the saved one, byte for byte: named again, not rebuilt
        artifact = old.digest if unchanged else to_artifact(result, identity, fitted_in,
                                                            described, options_hash)
        _finish(store, run_id, name, artifact, result, int(hit.sum()),
                time.perf_counter() - started)
    except BaseException:
        _abandon(store, run_id)
        raise
    saved_at = time.perf_counter()
    result.timings = {"prepare_s": prepared - started, "hash_s": hashed - prepared,
                      "load_s": loaded - hashed, "fit_s": done - loaded,
                      "save_s": saved_at - done}
    result.run_id = run_id
    result._why = (reason, text, None if old is None else old.result.run_id)
    return result
