"""Why a task was trained rather than reused: which part of its identity
(code, parameters, data, shared objects) changed since the latest earlier run
that had its key, or that that run's task did not end ok."""

from __future__ import annotations

import json
from collections.abc import Hashable
from typing import Any

from ..keys import encode_key, key_parts
from ..messages import Status

_PARTS = ("code", "params", "data", "shared")
#: What says why a task was not reused: its identity's parts, its status, and
#: its run's code description (which holds the run-level code and shared hashes)
_IDENTITY_COLUMNS = ("code_hash, params_hash, data_hash, shared_hash, status, "
                     "(SELECT code_detail FROM runs WHERE runs.run_id = tasks.run_id)")


def why_not_reused(store: Any, key: Hashable, run: int | None = None) -> str:
    """:meth:`manymodels.Store.why_not_reused`."""
    run_id, _, _ = store._run_row(run)
    linear = store._linear_run(run_id)
    if linear is not None:
        from ..linmodels.stored import explain

        return explain(store, linear, key)
    row = store._task_row(key, run_id, f"reused_from, {_IDENTITY_COLUMNS}")
    if row[0] is not None:
        return f"{key!r} was reused from run {row[0]}"
    before = store._conn.execute(
        f"SELECT run_id, {_IDENTITY_COLUMNS} FROM tasks WHERE key = ? AND run_id < ? "
        "ORDER BY (status = 'ok') DESC, run_id DESC LIMIT 1",
        (encode_key(key_parts(key)), run_id)).fetchone()
    if before is None:
        return f"{key!r} was trained: no earlier run in this store has this key"
    changed = [name for name, now, then in zip(_PARTS, _identity_parts(row),
                                               _identity_parts(before)) if now != then]
    if changed:
        described = {
            "code": "the code of fit (or of a module it uses, or a package version)",
            "params": "its parameters", "data": "its data", "shared": "the shared objects",
        }
        return (f"{key!r} was trained: since run {before[0]}, "
                + ", ".join(described[c] for c in changed) + " changed")
    if before[5] != Status.OK:
        return f"{key!r} was trained: in run {before[0]} it ended {before[5]!r}"
    return f"{key!r} was trained: reuse was turned off (reuse=False)"


def _identity_parts(row: tuple) -> tuple:
    """(code, params, data, shared) of a task row ``(_, code, params, data,
    shared, status, run's code_detail)``: code and shared are the same for
    every task of a run, so the run keeps them (a task row keeps its own only
    in stores written before)."""
    _, code, params, data, shared, _, detail = row
    run_level = json.loads(detail) if detail else {}
    return (code or run_level.get("code_hash"), params or "-", data,
            shared or run_level.get("shared_hash"))
