"""Why a task was trained rather than reused: which part of its identity
(code, parameters, data, shared objects) changed since the latest earlier run
that had its key, or that that run's task did not end ok; and, for a task
that did not end ok, what became of it (cancelled: it never ran; failed,
timed out, ...: its error), since "was trained" would say otherwise."""

from __future__ import annotations

import json
from collections.abc import Hashable
from typing import Any

import pyarrow.compute as pc

from ..engine.messages import Status
from ..inputs.keys import encode_key, key_parts
from . import artifacts, taskblocks

_PARTS = ("code", "params", "data", "shared")
#: What says why a task was not reused: its identity's parts and its status
#: (with its run's code description, which holds the run-level code and
#: shared hashes)
_IDENTITY_COLUMNS = ["code_hash", "params_hash", "data_hash", "shared_hash", "status"]


def why_not_reused(store: Any, key: Hashable, run: int | None = None) -> str:
    """:meth:`manymodels.Store.why_not_reused`."""
    run_id, _, _ = store._run_row(run)
    row = store._task_row(key, run_id, ["key", "reused_from", *_IDENTITY_COLUMNS])
    if row["reused_from"] is not None:
        return f"{key!r} was reused from run {row['reused_from']}"
    reason = _not_reused(store, key, run_id, row)
    status = row["status"]
    if status == Status.OK:
        return f"{key!r} was trained: {reason}"
    if status == Status.CANCELLED:  # (it was not trained: "was trained" said otherwise)
        return (f"{key!r} never ran in run {run_id}: cancelled (the run was interrupted or "
                f"stopped early before it began); it was not reused: {reason}")
    error = _error_line(store, run_id, row["key"])
    return (f"{key!r} was not trained in run {run_id}: its fit ended {str(status)!r}"
            + (f" ({error})" if error else "") + f"; it was not reused: {reason}")


def _not_reused(store: Any, key: Hashable, run_id: int, row: dict) -> str:
    """Why the task ``key`` of ``run_id`` (its ``row``) did not reuse an
    earlier run's model: which part of its identity changed since the latest
    earlier run with its key, or what became of that run's task."""
    now = _identity_parts(row, _code_detail(store, run_id))
    before = _latest_before(store, encode_key(key_parts(key)), run_id)
    if before is None:
        return "no earlier run in this store has this key"
    then_run, then = before
    then_detail = _code_detail(store, then_run)
    changed = [name for name, a, b in zip(_PARTS, now, _identity_parts(then, then_detail))
               if a != b]
    if changed:
        described = {
            "code": "the code of fit (or of a module it uses, or a package version)",
            "params": "its parameters", "data": "its data",
            "shared": _shared_changes(_code_detail(store, run_id), then_detail),
        }
        return f"since run {then_run}, " + ", ".join(described[c] for c in changed) + " changed"
    if then["status"] != Status.OK:
        return f"in run {then_run} it ended {then['status']!r}"
    if then["artifact"] is not None and not artifacts.loadable_mask(
            store._conn, store.root, [then["artifact"]])[0]:
        return (f"its model from run {then_run} could no longer be loaded (missing from the "
                "store, or found corrupt)")
    if _code_detail(store, run_id).get("reuse") is False:
        return "reuse was turned off (reuse=False)"
    # (the same bytes trained again make a model found corrupt whole once more)
    return (f"its model from run {then_run} could not be loaded when run {run_id} began "
            "(missing from the store, or found corrupt)")


def _error_line(store: Any, run_id: int, key: str) -> str:
    """The first line of the exception the task stored as ``key`` (its
    encoded key) ended with in ``run_id`` (``ValueError: Input X contains
    NaN.``: the line after its traceback's frames, not its message's last
    line), or ``""``."""
    tasks = taskblocks.read_run(store._conn, run_id, ["key", "error"], ordered=False)
    rows = tasks.filter(pc.equal(tasks["key"], key))
    errors = [e for e in rows["error"].to_pylist() if e] if rows.num_rows else []
    lines = [line for line in (errors[-1] if errors else "").splitlines() if line.strip()]
    framed = [i for i, line in enumerate(lines) if line[:1].isspace()]
    raised = lines[framed[-1] + 1:] if framed else lines
    line = raised[0].strip() if raised else ""
    return line if len(line) <= 200 else line[:199] + "…"


#: What the runs' own entries among the shared objects' hashes stand for.
_OWN_SHARED = {"__evaluate__": "the evaluation (evaluate=)",
               "__halving__": "the halving search (select=mm.halving(...))"}


def _shared_changes(now: dict, then: dict) -> str:
    """Which of the shared objects changed, named, where both runs recorded
    each one's hash (runs written before did not)."""
    new, old = now.get("shared_parts"), then.get("shared_parts")
    if new is None or old is None:
        return "the shared objects"
    names = sorted(name for name in new.keys() | old.keys() if new.get(name) != old.get(name))
    if not names:
        return "the shared objects"
    return ", ".join(_OWN_SHARED.get(name, f"the shared object {name!r}") for name in names)


def _latest_before(store: Any, key: str, run_id: int) -> tuple[int, dict] | None:
    """The task with ``key`` in the latest run before ``run_id`` that has it,
    preferring a run where it ended ok: ``(run, its columns)``."""
    fallback = None
    for (earlier,) in store._conn.execute(
            "SELECT run_id FROM runs WHERE run_id < ? ORDER BY run_id DESC", (run_id,)).fetchall():
        # its keys first (a key absent from a long history reads no more of each run)
        keys = taskblocks.read_run(store._conn, earlier, ["key"], ordered=False)["key"]
        if not pc.any(pc.equal(keys, key)).as_py():
            continue
        tasks = taskblocks.read_run(store._conn, earlier, ["key", "artifact",
                                                           *_IDENTITY_COLUMNS])
        rows = tasks.filter(pc.equal(tasks["key"], key))
        if rows.num_rows == 0:
            continue
        row = {name: rows[name][rows.num_rows - 1].as_py()
               for name in ["artifact", *_IDENTITY_COLUMNS]}
        if row["status"] == Status.OK:
            return earlier, row
        fallback = fallback or (earlier, row)
    return fallback


def _code_detail(store: Any, run_id: int) -> dict:
    (detail,) = store._conn.execute("SELECT code_detail FROM runs WHERE run_id = ?",
                                    (run_id,)).fetchone()
    return json.loads(detail) if detail else {}


def _identity_parts(row: dict, run_level: dict) -> tuple:
    """(code, params, data, shared) of a task: code and shared are the same
    for every task of a run, so the run keeps them (a task row keeps its own
    only in stores written before)."""
    return (row["code_hash"] or run_level.get("code_hash"), row["params_hash"] or "-",
            row["data_hash"], row["shared_hash"] or run_level.get("shared_hash"))
