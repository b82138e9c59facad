"""What a server answers with: for each group key, the model of the run it
serves, as ``Store.predict`` would pick it.

A catalog is read from the store once per run that ends and never changed:
a reload builds a new one beside it and swaps the reference, so a request
that started on the old catalog finishes on it. It holds each group's model
*digest* (SHA-256 or pack locator), not the model, in Arrow columns
(:class:`~manymodels.serve.keytable.KeyTable`: a million keys in about 110
MB, not a dict's 300): the models are loaded on first use by
:class:`~manymodels.serve.cache.ModelCache`.

By default the catalog is the store as ``Store.predict`` reads it with no
``run=`` — each group's latest model, a group that failed in a re-run
keeping its earlier one, each group's selected candidate for a run trained
with ``select=``, the latest fallback model — over the runs that have
ended (a run still being written is served once it ends). With ``run=`` it
is that run's models alone.
"""

from __future__ import annotations

import datetime as _dt
import decimal
import json
import math
import re
import threading
from dataclasses import dataclass, field
from typing import Any

from ..engine.execution import metrics_dict
from ..engine.messages import Status
from ..inputs.keys import canonical, decode_key
from ..store import taskblocks
from .keytable import TEMPORAL, KeyTable, value_kind

#: What ``GET /v1/models/{key}`` reads of a group's task.
_DESCRIBED = ["key", "status", "artifact", "size", "metrics", "duration_s", "started_at",
              "code_hash", "params_hash", "data_hash", "shared_hash", "reused_from"]


class RunGone(LookupError):
    """A run the catalog serves was deleted from the store since the catalog
    was read: the store is read again (as a predict whose model is gone
    does), and the question asked of the new catalog."""


@dataclass
class Catalog:
    """The models one state of the store serves (see the module)."""

    run_id: int  # the run served: the latest ended run, or the one asked for
    by: list[str]
    features: list[str] | None
    runs: list[int]  # the runs whose models it serves, earliest first
    keys: KeyTable | None = None  # encoded key -> digest (None for an mm.linear run)
    selected: bool = False  # the run chose each group's best candidate (select=)
    fallback: str | None = None  # digest of the run's fallback model
    linear: Any = None  # the LinearResult of an mm.linear run
    store: Any = field(default=None, repr=False)  # the Store it was read from
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    _described: dict[int, Any] = field(default_factory=dict, repr=False)
    _kinds: tuple[frozenset[str], ...] | None = field(default=None, repr=False)
    key_columns: list[str] | None = None  # the served run's own key columns
    _failed: Any = field(default=None, repr=False)  # TypedKeys: key -> status, read once
    _said: set = field(default_factory=set, repr=False)  # the failed groups said so far

    @property
    def key_kinds(self) -> tuple[frozenset[str], ...]:
        """What each key column holds (:meth:`KeyTable.kinds`), read once:
        how a key given as text is read (:func:`key_parts`)."""
        if self._kinds is None:
            if self.linear is not None:
                kinds = tuple(frozenset(value_kind(canonical(value)) for value in
                                        self.linear.keys[name].unique())
                              for name in self.by)
            else:
                kinds = self.keys.kinds(len(self.by)) if self.keys is not None else (
                    (frozenset(),) * len(self.by))
            self._kinds = kinds
        return self._kinds

    @property
    def kinds_known(self) -> bool:
        """Whether :attr:`key_kinds` has been read (reading it walks every key:
        seconds for a million keys of dates, never on the event loop)."""
        return self._kinds is not None

    @property
    def models(self) -> int:
        return len(self.linear.keys) if self.linear is not None else len(self.keys or ())

    def find(self, parts: tuple) -> tuple[str | None, str]:
        """The digest of the model that answers the group ``parts``, and
        which it is: "group" (or "selected"), "fallback", or "none"."""
        digest = self.keys.find(parts) if self.keys is not None else None
        if digest is not None:
            return digest, "selected" if self.selected else "group"
        if self.fallback is not None:
            return self.fallback, "fallback"
        return None, "none"

    @property
    def failures_known(self) -> bool:
        """Whether the groups that failed in training have been read
        (:meth:`fallback_for_failed`; a read of the run's tasks, never on the
        event loop)."""
        return self._failed is not None

    def fallback_for_failed(self, parts: tuple) -> str | None:
        """What to say, once per group of this catalog, of the group ``parts``
        the fallback answers where it failed in training (as ``Store.predict``
        warns of it): None where it was never trained, or was said before."""
        from ..inputs.keys import TypedKeys
        from ..store.nomodel import failed_statuses, said_by_fallback

        with self._lock:
            if self._failed is None:
                statuses: dict[str, str] = {}
                for run_id in self.runs:  # this catalog's, not the store's runs now
                    try:
                        found = failed_statuses(self.store, run_id, self.by,
                                                self.key_columns or self.by)
                    except ValueError:  # deleted since the catalog was read
                        continue
                    statuses.update(found or {})
                self._failed = TypedKeys(statuses)
            status = self._failed.find(parts)
            if status is None or parts in self._said:
                return None
            self._said.add(parts)
        return f"run {self.run_id}: " + said_by_fallback(
            [(parts[0] if len(parts) == 1 else parts, status)])

    def describe(self, store: Any, parts: tuple) -> dict[str, Any] | None:
        """The run, metrics, training time and identity of the model that
        answers ``parts``, or None when no model does."""
        if self.linear is not None:
            described = self._describe_linear(parts)
            if described is not None:
                _refuse_runs_gone(store, self.runs)  # (the one query it makes, as a group's)
            return described
        digest, source = self.find(parts)
        if digest is None or source == "fallback":
            if digest is None:
                return None
            _refuse_runs_gone(store, self.runs)  # (the one query it makes, as a group's)
            return {"source": source, "artifact": digest, "run_id": self.run_id}
        for run_id in reversed(self.runs):  # the latest run that holds this model
            tasks = self._tasks(store, run_id)
            row = _index_of(tasks["artifact"], digest)
            if row is None:
                continue
            task = {name: tasks[name][row].as_py() for name in _DESCRIBED}
            run_level = _run_identity(store, run_id)  # (the one query a description makes)
            if run_level is None:  # its tasks read before the run was deleted
                raise RunGone(f"run {run_id} was deleted from the store {str(store)!r} "
                              "since it was served")
            return {"source": source, "run_id": run_id, "artifact": digest,
                    "task_key": json.loads(task["key"]), "size": task["size"],
                    "metrics": metrics_dict(task["metrics"], row) or {},
                    "duration_s": task["duration_s"], "started_at": task["started_at"],
                    "reused_from": task["reused_from"],
                    "identity": _identity(task, run_level)}
        # (read only here: no query on the common path) the run that held it
        # deleted before its tasks were read
        _refuse_runs_gone(store, self.runs)
        return {"source": source, "artifact": digest, "run_id": None}

    def _tasks(self, store: Any, run_id: int) -> Any:
        with self._lock:
            tasks = self._described.get(run_id)
        if tasks is None:
            tasks = taskblocks.read_run(store._conn, run_id, _DESCRIBED)
            with self._lock:
                while len(self._described) >= 2:  # a run of a million tasks is large
                    self._described.pop(next(iter(self._described)))
                self._described[run_id] = tasks
        return tasks

    def _describe_linear(self, parts: tuple) -> dict[str, Any] | None:
        import pandas as pd

        result = self.linear
        frame = pd.DataFrame({name: [value] for name, value in zip(self.by, parts)})
        try:
            row = int(result.group_of(frame)[0])
        except (ValueError, TypeError, OverflowError):  # no key of its columns' types
            return None  # (a whole number past 64 bits)
        if row < 0:
            return None
        metrics = {name: plain(value) for name, value in result.metrics.iloc[row].items()}
        return {"source": "group", "run_id": self.run_id, "linear": True,
                "metrics": metrics, "coefficients": plain(result.coef[row])}


def _run_identity(store: Any, run_id: int) -> dict[str, Any] | None:
    """The code and shared-object hashes of ``run_id``: the same for every
    task of a run, so the run keeps them (in its ``code_detail``) and its
    task rows hold none of their own. None where the run is gone (deleted)."""
    row = store._conn.execute("SELECT code_detail FROM runs WHERE run_id = ?",
                              (run_id,)).fetchone()
    if row is None:
        return None
    detail = json.loads(row[0]) if row[0] else {}
    return {name: detail.get(name) for name in ("code_hash", "shared_hash")}


def _refuse_runs_gone(store: Any, runs: list[int]) -> None:
    """Raise :class:`RunGone` where the store no longer holds one of ``runs``
    (one query): a model described from the catalog alone (a fallback, an
    mm.linear run's coefficients) would be described after its run was
    deleted, until a reload."""
    held = {run_id for (run_id,) in store._conn.execute("SELECT run_id FROM runs")}
    gone = [run_id for run_id in runs if run_id not in held]
    if gone:
        raise RunGone(f"run {gone[0]} was deleted from the store {str(store)!r} since "
                      "it was served")


def _identity(task: dict[str, Any], run_level: dict[str, Any]) -> dict[str, Any]:
    """A task's identity hashes, the run's where the task row has none (a
    store written before the run kept them holds them per task)."""
    return {name: task[name] or run_level.get(name)
            for name in ("code_hash", "params_hash", "data_hash", "shared_hash")}


def _index_of(column: Any, value: str) -> int | None:
    import pyarrow.compute as pc

    where = pc.index(column, value).as_py()
    return None if where is None or where < 0 else int(where)


def plain(value: Any) -> Any:
    """A NumPy or pandas value as JSON can hold it."""
    import numpy as np

    if isinstance(value, np.ndarray):
        return [plain(v) for v in value.tolist()]
    if isinstance(value, np.generic):
        value = value.item()
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return None if value != value else value
    import pandas as pd

    if pd.isna(value):  # pd.NA, NaT
        return None
    return value.isoformat() if hasattr(value, "isoformat") else str(value)


#: Key parts of types JSON has not, that a request names in the store's
#: tagged form (:func:`is_tagged`); dates and datetimes it names in ISO-8601.
_TAGGED_TYPES = (bytes, decimal.Decimal, _dt.time, _dt.timedelta, tuple)


def named(part: Any) -> Any:
    """A key part as a request names it: a type JSON has not in the store's
    tagged form (``{"$bytes": "6162"}``, not Python's ``b'ab'``), a date or
    datetime as ISO-8601 text, any other as :func:`plain` gives it (an
    infinite float as itself: ``Infinity`` in Python's JSON)."""
    return canonical(part) if isinstance(part, _TAGGED_TYPES) else plain(part)


def echoed(part: Any) -> Any:
    """A key part as an answer (strict JSON) echoes it: as :func:`named`,
    and an infinite float as the text the request gave, ``"Infinity"`` or
    ``"-Infinity"``: JSON has no infinity, and ``null`` is the missing
    key's echo (another group)."""
    value = named(part)
    if isinstance(value, float) and value in (math.inf, -math.inf):
        return "Infinity" if value > 0 else "-Infinity"
    return value


def shown_key(parts: tuple) -> str:
    """A group's key in an error message, as a request names it
    (:func:`named`): one part alone, several as a JSON list."""
    if len(parts) == 1:
        return json.dumps(named(parts[0]))
    return json.dumps([named(part) for part in parts])


# -- reading a catalog from the store ----------------------------------------------


def ended_runs(store: Any) -> list[tuple[int, list[str]]]:
    """(run_id, key columns) of the runs that have ended, earliest first."""
    return [(run_id, json.loads(columns)) for run_id, columns in store._conn.execute(
        "SELECT run_id, key_columns FROM runs WHERE status != 'running' ORDER BY run_id")]


def store_version(store: Any) -> tuple:
    """What changes when a run ends, is deleted, or gets an attachment
    (``manymodels train`` attaches its fallback model after its run ends):
    the poller rebuilds the catalog when this changes."""
    return tuple(store._conn.execute(
        "SELECT (SELECT count(*) FROM runs WHERE status != 'running'), "
        "(SELECT max(run_id) FROM runs WHERE status != 'running'), "
        "(SELECT count(*) FROM attachments), (SELECT max(rowid) FROM attachments)").fetchone())


def build_catalog(store: Any, run: int | None = None) -> Catalog:
    """The catalog of ``store`` (a :class:`manymodels.Store`): ``run``'s
    models, or by default the store's as ``Store.predict`` serves them from
    the runs that have ended. Raises ValueError naming the store or run."""
    if run is not None:
        run_id, key_columns, _ = store._run_row(run)  # "has no run N"
        runs = [run_id]
    else:
        ended = ended_runs(store)
        if not ended:
            raise ValueError(f"store {str(store)!r} holds no run that has ended yet")
        run_id, key_columns = ended[-1]
        runs = [r for r, columns in ended if columns == key_columns]
    found = store._linear_run(run_id)
    if found is not None:  # coefficient arrays, checked, nothing unpickled
        from ..models.linear import stored as linear_runs

        result = linear_runs.load(store, None, run_id)
        return Catalog(run_id, list(result.by), None, [run_id], linear=result, store=store)
    config = store.attached("train_config", run_id, default={}) or {}
    chosen = store.attached("selection", run_id, default=None)
    by = config.get("by") or (chosen or {}).get("by") or key_columns
    by = [by] if isinstance(by, str) else list(by)
    parts: list[tuple[Any, Any]] = []  # (keys, digests) of each run, earliest first
    if chosen is not None:
        for earlier in runs:  # each group's latest winner (a re-run may have lost one)
            picked = chosen if earlier == run_id else store.attached(
                "selection", earlier, default=None)
            if picked is not None and picked.get("by") == chosen.get("by"):
                parts.append((list(picked["artifacts"]), list(picked["artifacts"].values())))
    else:
        for earlier in runs:  # the latest run's last: a failed group keeps its model
            parts.append(_models_of(store, earlier))
    fallback = None
    for earlier in reversed(runs):
        fallback = store._latest_attached_digest("fallback", earlier)
        if fallback is not None:
            break
    return Catalog(run_id, by, config.get("features"), runs, keys=KeyTable.joined(parts),
                   selected=chosen is not None, fallback=fallback, store=store,
                   key_columns=list(key_columns))


def _models_of(store: Any, run_id: int) -> tuple[Any, Any]:
    """The encoded keys and artifacts of the tasks of ``run_id`` that ended
    ok with a model, as Arrow columns (no Python string per model)."""
    import pyarrow.compute as pc

    tasks = taskblocks.read_run(store._conn, run_id, ["key", "status", "artifact"],
                                trained_only=False, ordered=False)
    tasks = tasks.filter(pc.and_(pc.equal(tasks["status"], Status.OK.value),
                                 pc.is_valid(tasks["artifact"])))
    return tasks["key"], tasks["artifact"]


def key_parts(catalog: Catalog, text: str) -> tuple:
    """The key of ``GET /v1/models/{key}``, read as its column holds keys
    (:attr:`Catalog.key_kinds`): a column of text takes the text as it is
    (``1.0``, ``true``, ``null`` are text there); any other reads it as
    JSON where that gives a value of a kind the column holds (``7`` where
    it holds numbers, ``true`` where bools; ``Infinity``, ``-Infinity`` a
    float's, ``NaN`` the missing key's, as a JSON body's rows route them),
    else as the text. Several key
    columns: a JSON list of their values, ``["s1", 7]``. A column of
    datetimes or dates reads ISO-8601 text (:func:`temporal_key`)."""
    kinds = catalog.key_kinds
    if len(catalog.by) > 1:
        try:
            value = json.loads(text)
        except (ValueError, RecursionError):
            value = None
        if not isinstance(value, list) or len(value) != len(catalog.by):
            raise ValueError(f"the key must be a JSON list of {len(catalog.by)} values "
                             f"({', '.join(catalog.by)}), got {text!r}")
        # a part given as text is read as one key column's text is (["s1", "Infinity"]:
        # a float where the column holds numbers)
        return tuple(part_from_text(v, column, name) if isinstance(v, str)
                     else tagged_value(v) if is_tagged(v) else v
                     for v, column, name in zip(value, kinds, catalog.by))
    return (part_from_text(text, kinds[0], catalog.by[0]),)


def part_from_text(text: str, kinds: frozenset[str], column: str) -> Any:
    """One key part given as ``text``, as :func:`key_parts` reads it for the
    key column ``column``, which holds ``kinds``."""
    if temporal(kinds):
        return temporal_key(text, kinds, column)
    if "text" in kinds:
        return text
    try:
        value = json.loads(text)
    except (ValueError, RecursionError):  # (a digit string past Python's int limit too)
        return text
    if isinstance(value, float) and value != value:
        # NaN: a missing key, stored as null (canonical), as POST /v1/predict routes it
        value = None
    if is_tagged(value):
        return tagged_value(value)
    kind = value_kind(value)
    if kind in ("number", "bool", "null") and (kind in kinds or not kinds):
        return value
    return text


#: The tags of the store's text of a key part JSON has no type for
#: (:func:`manymodels.inputs.keys.canonical`).
_TAGS = frozenset({"$decimal", "$bytes", "$timedelta", "$time", "$date", "$datetime",
                   "$tuple", "$str"})


def is_tagged(value: Any) -> bool:
    """Whether a key part read as JSON is in the store's tagged form,
    ``{"$decimal": "1.5"}``, ``{"$bytes": "6162"}``: the only way a URL
    names a key of a type JSON has not (a decimal, bytes, a time)."""
    return isinstance(value, dict) and len(value) == 1 and next(iter(value)) in _TAGS


def tagged_value(value: dict) -> Any:
    """The key part a tagged form stands for; a malformed one (bytes not in
    hexadecimal, a decimal that is no number) refused, naming it."""
    try:
        return decode_key(json.dumps([value]))[0]
    except (ValueError, TypeError, ArithmeticError) as exc:
        raise ValueError(f"the key part {json.dumps(value)} is not a {next(iter(value))[1:]} "
                         f"as the store writes it ({type(exc).__name__}: {exc})") from exc


class KeyTextError(ValueError):
    """Text given for a column of datetimes or dates that is not one (422)."""


def temporal(kinds: frozenset[str]) -> bool:
    """Whether a key column of these kinds holds datetimes or dates (and
    perhaps nulls) only: text given for it is read as ISO-8601."""
    return bool(kinds & TEMPORAL) and kinds <= TEMPORAL | {"null"}


_ISO_DATE = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}")
_ISO_DATETIME = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}(?:[T ][0-9]{2}(?::[0-9]{2}(?::[0-9]{2}"
                           r"(?:[.,][0-9]{1,9})?)?)?)?(?:Z|[+-][0-9]{2}(?::?[0-9]{2})?)?")


def temporal_key(text: str, kinds: frozenset[str], column: str) -> Any:
    """ISO-8601 ``text`` as the key value of ``column``, which holds
    ``kinds`` (:func:`temporal`): a date, or a ``pandas.Timestamp`` with a
    time zone (as UTC: the same instant in any zone is one key) where the
    column's keys have one, and without where they have none, as
    ``Store.predict`` matches them. Raises :class:`KeyTextError` naming
    ``column`` otherwise."""
    if "date" in kinds and _ISO_DATE.fullmatch(text):
        try:
            return _dt.date.fromisoformat(text)
        except ValueError as exc:
            raise KeyTextError(f"column {column!r} holds dates: {text!r} is not one "
                               f"({exc})") from exc
    timed = kinds & {"datetime", "zoned"}
    if not timed or not _ISO_DATETIME.fullmatch(text):
        raise KeyTextError(f"column {column!r} holds {'datetimes' if timed else 'dates'}: "
                           f"{text!r} is not an ISO-8601 "
                           f"{'datetime (2024-01-31T08:00:00)' if timed else 'date (2024-01-31)'}")
    import pandas as pd

    try:
        stamp = pd.Timestamp(text)
    except ValueError as exc:
        raise KeyTextError(f"column {column!r} holds datetimes: {text!r} is not an ISO-8601 "
                           f"datetime ({exc})") from exc
    if stamp.tzinfo is None and "datetime" not in timed:
        raise KeyTextError(f"column {column!r} holds datetimes with a time zone: {text!r} has "
                           "none; give its offset (2024-01-31T08:00:00Z, ...+01:00)")
    if stamp.tzinfo is not None and "zoned" not in timed:
        raise KeyTextError(f"column {column!r} holds datetimes without a time zone: {text!r} "
                           "has one; give the datetime without its offset")
    return stamp if stamp.tzinfo is None else stamp.tz_convert("UTC")
