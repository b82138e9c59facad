"""Finding a run's task by its key: the run's keys sorted once and searched
(:class:`KeyLookup`), the lookups of the runs last asked about shared by a
``Store``'s threads (:class:`KeyLookups`), and a key given in another type
than it was stored in (:func:`find_row`). What ``Store.load`` and the
readers of one group's model stand on; the rows come from
:func:`.taskblocks.read_run`."""

from __future__ import annotations

from collections.abc import Callable

import pyarrow as pa
import pyarrow.compute as pc

from ..inputs.keys import (
    canonical,
    encode_key,
    instant_text,
    stored_object_texts,
    typed_otherwise,
)


class KeyLookup:
    """A run's tasks with their keys sorted once: a task found by its encoded
    key in a binary search (Arrow sorts strings by their UTF-8 bytes, which is
    the order of Python's ``<`` on them)."""

    def __init__(self, version: tuple, tasks: pa.Table) -> None:
        self.version, self.tasks = version, tasks
        self._order = pc.sort_indices(tasks["key"]).to_numpy()
        self._sorted = tasks["key"].take(pa.array(self._order))
        self._instants: dict[str, int] | None = None

    def find(self, key: str) -> int | None:
        """The row of the task with ``key`` (the last in task order if two
        have it), or None."""
        keys, low, high = self._sorted, 0, len(self._sorted)
        while low < high:
            middle = (low + high) // 2
            if keys[middle].as_py() < key:
                low = middle + 1
            else:
                high = middle
        rows = []
        while low < len(keys) and keys[low].as_py() == key:
            rows.append(int(self._order[low]))
            low += 1
        return max(rows) if rows else None

    def find_instant(self, instant: str) -> int | None:
        """The row of the task whose key, its zone-aware times as UTC
        instants, is ``instant`` (:func:`~manymodels.inputs.keys.instant_text`):
        a time of a zone given in another. Indexed at the first such lookup."""
        import json

        from ..inputs.keys import instant_text

        if self._instants is None:
            # filled aside, then kept: a lookup is shared by a Store's threads,
            # and another one finding it half filled would miss the key
            instants: dict[str, int] = {}
            for row, text in enumerate(self.tasks["key"].to_pylist()):
                if "$datetime" in text:
                    try:
                        found = instant_text(json.loads(text))
                    except ValueError:
                        continue
                    if found is not None:
                        instants[found] = row  # (the last in task order)
            self._instants = instants
        return self._instants.get(instant)


class KeyLookups:
    """The :class:`KeyLookup` of the runs last asked about (``kept`` of them),
    each until its run gains a block, shared by the threads of one Store
    (a server's, a user's pool calling ``load``). One lock guards them and
    the read of a run's keys: two threads asking about a run not kept read
    it once, not once each (a million keys each), and the eviction of one
    never races another's (it raised ``KeyError`` or "dictionary changed
    size during iteration")."""

    def __init__(self, kept: int = 2) -> None:
        import threading

        self._kept = kept
        self._lookups: dict[int, KeyLookup] = {}  # run_id -> its lookup, the latest last
        self._lock = threading.Lock()

    def get(self, run_id: int, version: tuple, read: Callable[[], pa.Table]) -> KeyLookup:
        """``run_id``'s lookup at ``version`` (its block count and last block),
        made from ``read()`` where the one kept is older or there is none."""
        with self._lock:
            lookup = self._lookups.pop(run_id, None)
            if lookup is None or lookup.version != version:
                lookup = None  # the old one is freed before the new one is read
                lookup = KeyLookup(version, read())
            self._lookups[run_id] = lookup
            while len(self._lookups) > self._kept:
                self._lookups.pop(next(iter(self._lookups)))
            return lookup


def find_row(lookup: KeyLookup, parts: tuple) -> int | None:
    """The row of ``lookup`` whose key is ``parts``, as stored or as the
    same values typed otherwise (an object's stored text, a time of a zone
    given in another, a whole number given as 2.0 or "2"); None if none."""
    row = lookup.find(encode_key(parts))
    for text in () if row is not None else stored_object_texts(parts):
        row = lookup.find(text)
        if row is not None:
            return row
    instant = None if row is not None else instant_text([canonical(v) for v in parts])
    if instant is not None:  # a time of a zone, given in another
        row = lookup.find_instant(instant)
    if row is None and len(parts) <= 8:  # a whole number typed otherwise (2.0, "2")
        for variant in typed_otherwise(parts):
            row = lookup.find(encode_key(variant))
            if row is not None:
                break
    return row
