"""A run's start in the store: the models it reuses found (by identity, in
the runs before it), and its row written with the reused tasks' rows, in one
transaction. The recorder then records the tasks it trains
(:mod:`.recorder`), and the reused ones' results come from here."""

from __future__ import annotations

import sqlite3
import time
import warnings
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..engine.messages import Status
from ..engine.metricpacks import MetricTexts
from ..identity.hashing import TaskIdentities
from ..inputs.keys import decode_key, encode_keys
from . import database, taskblocks
from . import verify as verification
from .lazymodels import IN_STORE
from .reuse import ReuseSearch


class RunStart:
    """The start of one run into ``store``: :meth:`begin`, then
    :meth:`fill_reused` once the run's records are made."""

    def __init__(self, store: Any, plan: Any, identities: TaskIdentities, code_detail: dict,
                 *, fit_name: str, source: str, backend: str, workers: int) -> None:
        self.store, self.conn, self.plan = store, store._conn, plan
        self.identities, self.code_detail = identities, code_detail
        self.fit_name, self.source = fit_name, source
        self.backend, self.workers = backend, workers
        self.run_id: int | None = None
        self._began: float | None = None  # when begin() began (the run's started_at)
        self._keys: pa.Array | None = None
        self.reused: pa.Table | None = None
        #: (run, tasks, held) of each run every trained row of which is reused
        #: here (see ReuseSearch.same_as), and the metrics of those tasks by run
        self.same_as: list[tuple[int, int, int]] = []
        self.metric_texts: dict[int, MetricTexts] = {}

    @property
    def keys(self) -> pa.Array:
        """The run's keys, encoded as the store keeps them: made when first
        asked for (an unchanged re-run named by its input's digest compares
        and writes none: a million keys were a fifth of its time)."""
        if self._keys is None:  # (two threads asking at once make it twice, alike)
            self._keys = encode_keys(self.plan.key_rows, self.plan.key_table)
        return self._keys

    def begin(self, reuse: bool, verify: bool = False) -> int:
        """Create the run's row and record the tasks whose models are reused
        (their rows as blocks, or one block naming the run whose trained rows
        they all are); return how many. ``verify``: each reused model's bytes
        are checked against its SHA-256 first (see :mod:`.verify`)."""
        self.store._refuse_gone()  # (before its first write: a verify's marks)
        if not reuse:  # kept with the run: why_not_reused says so, not a guess
            self.code_detail = {**self.code_detail, "reuse": False}
        # the run's start is its search's, not its row's: a run that trained
        # on after the search began then ended after this one started, as the
        # search of a later re-run by digest asks (ReuseSearch._run_of_same_input)
        self._began = time.time()
        for last_try in (False, True):
            reused = self._find_reusable(reuse, verify)
            if self._start_run(reused, last_try):
                break
        return 0 if reused is None else reused.num_rows

    def _find_reusable(self, reuse: bool, verify: bool = False) -> pa.Table | None:
        self.same_as, self.reused, self.metric_texts = [], None, {}
        if reuse and self.plan.tasks:
            search = ReuseSearch(self.conn, self.store.root, self.identities,
                                 lambda: self.keys)
            self.reused = search.find()
            if verify:
                self.reused = self._verified(search, self.reused)
            self.same_as, self.metric_texts = search.same_as, search.metric_texts
        # what the match read and dropped goes back to the system now: a
        # re-run of a million would otherwise hold it through the run
        pa.default_memory_pool().release_unused()
        return self.reused

    def _verified(self, search: ReuseSearch, reused: pa.Table | None) -> pa.Table | None:
        """What ``search`` found, each model's bytes checked against its
        SHA-256: the corrupt ones are recorded so (and named in a warning),
        and the search is made again without them, until what it finds is
        whole (another run's intact copy of a model may take its place)."""
        checked: dict[str, str | None] = {}
        corrupt_keys: list[Any] = []
        corrupt_problems: list[str] = []
        while reused is not None:
            tasks, names = verification.reused_models(self.conn, reused, search.same_as)
            new = set(names) - checked.keys()
            problems = verification.check_artifacts(self.conn, self.store.root, new)
            checked.update({name: problems.get(name) for name in new})
            if not problems:
                break
            if not verification.record(self.conn, problems):
                raise database.StoreError(
                    f"store {str(self.store)!r}: models found corrupt could not be "
                    "recorded so (the index is not writable)")
            for task, name in zip(tasks.tolist(), names):
                if name in problems:
                    parts = decode_key(self.keys[task].as_py())
                    corrupt_keys.append(parts[0] if len(parts) == 1 else parts)
                    corrupt_problems.append(problems[name])
            reused = search.find()
        if corrupt_keys:
            warnings.warn(
                f"train(verify=True): {len(corrupt_keys)} model(s) this run would have "
                "reused do not match their SHA-256 and are not reused (trained again): "
                + verification.describe_corrupt(corrupt_keys, corrupt_problems), RuntimeWarning,
                stacklevel=2)
        return reused

    def _start_run(self, reused: pa.Table | None, last_try: bool) -> bool:
        """Write the run's row and its reused tasks in one transaction; False
        (nothing written) when the run to be named was deleted since it was
        found, to search again (on the last try, it is an error)."""
        conn = self.conn
        try:  # (another process's lock held past the busy timeout: a long gc)
            conn.execute("BEGIN IMMEDIATE")
        except sqlite3.Error as exc:
            raise database.busy_or_write_error(self.store.root, exc,
                                               "the run could not start") from exc
        try:
            # checked again where no other driver can delete those runs meanwhile:
            # a run named must be as it was found (a delete adds to what a run
            # holds), a run whose rows are copied must still be there (else its
            # models would be held by no run, or removed by a gc meanwhile)
            copied = [] if reused is None else pc.unique(reused.filter(pc.invert(
                reused["by_reference"]))["reused_from"]).drop_null().to_pylist()
            gone = [run for run, _, held in self.same_as
                    if not taskblocks.run_has_ended(conn, run)
                    or taskblocks.held_count(conn, run) != held]
            gone += [run for run in copied if conn.execute(
                "SELECT 1 FROM runs WHERE run_id = ?", (run,)).fetchone() is None]
            if gone:
                conn.execute("ROLLBACK")
                if last_try:
                    raise database.StoreError(
                        f"run {gone[0]}, whose models this run reuses, was deleted or changed "
                        "twice while the run started: start it again")
                return False
            self.run_id = database.insert_run(
                conn, backend=self.backend, workers=self.workers, source=self.source,
                fit=self.fit_name, tasks=len(self.plan.tasks),
                key_columns=self.plan.key_columns, param_columns=self.plan.param_columns,
                code_detail=self.code_detail, started_at=self._began)
            for source, tasks, _ in self.same_as:
                taskblocks.insert_same_as(conn, self.run_id, source, tasks)
            if reused is not None and reused.num_rows:
                self._insert_reused(reused.filter(pc.invert(reused["by_reference"])))
            conn.execute("COMMIT")
            return True
        except BaseException as exc:
            database.rollback_quietly(conn)
            if isinstance(exc, sqlite3.Error):
                raise database.write_error(self.store.root, exc, "the run could not start") \
                    from exc
            raise

    def _insert_reused(self, reused: pa.Table) -> None:
        """The reused tasks' rows, in blocks of
        :data:`~.taskblocks.REUSED_ROWS_PER_BLOCK`."""
        size = taskblocks.REUSED_ROWS_PER_BLOCK
        for start in range(0, reused.num_rows, size):
            part = reused.slice(start, size)
            taskblocks.insert(self.conn, self.run_id, taskblocks.table({
                **taskblocks.task_columns(self.keys, self.identities, part["task_index"]),
                "status": pa.repeat(pa.scalar(Status.OK.value, pa.string()), part.num_rows),
                "attempts": np.zeros(part.num_rows, dtype=np.int64),
                "duration_s": part["duration_s"], "metrics": part["metrics"],
                "artifact": part["artifact"], "size": part["size"],
                "reused_from": part["reused_from"]}))
            pa.default_memory_pool().release_unused()

    def fill_reused(self, records: Any) -> int:
        """Fill in the results of the reused tasks (their models stay in the
        store, loaded when asked for); return how many."""
        reused, texts_of = self.reused, self.metric_texts
        self.reused, self.metric_texts = None, {}
        if reused is None:
            return 0
        indices = reused["task_index"].to_numpy()
        records.mark_reused(indices, pc.fill_null(reused["reused_from"], -1).to_numpy())
        if len(indices) == records.size and (indices == np.arange(records.size)).all() and (
                len(texts_of) == 0 or len(texts_of) == 1 and reused["by_reference"]
                .to_numpy(zero_copy_only=False).all()):
            # every task, in order (an unchanged re-run): whole columns at once
            records.metrics = [*texts_of.values()] * records.size if texts_of else \
                reused["metrics"].to_pylist()
            in_store = reused["has_model"].to_numpy(zero_copy_only=False)
            records.model = [IN_STORE] * records.size if in_store.all() else \
                np.where(in_store, IN_STORE, None).tolist()
            return reused.num_rows
        metrics, model = records.metrics, records.model
        for index, run, metric, artifact, by_reference in zip(
                indices.tolist(), reused["reused_from"].to_pylist(),
                reused["metrics"].to_pylist(), reused["has_model"].to_pylist(),
                reused["by_reference"].to_pylist()):
            metrics[index] = texts_of[run] if by_reference else metric
            if artifact:  # this run's row names it: loaded from there
                model[index] = IN_STORE
        return reused.num_rows
