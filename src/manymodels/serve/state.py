"""The server's state: the store it reads, the catalog it serves, the cache of
models, and the poller that swaps in a new catalog when a run ends."""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import threading
import weakref
from collections.abc import Iterator
from pathlib import Path, PurePath
from typing import Any

from ..machine import parse_bytes
from .cache import ModelCache
from .catalog import Catalog, build_catalog, store_version
from .metrics import Metrics

log = logging.getLogger("manymodels.serve")

#: The format of the server's log lines (``manymodels serve`` and its workers).
LOG_FORMAT = "%(asctime)s manymodels serve: %(message)s"

def parse_size(value: int | str, name: str) -> int:
    """A size in bytes from ``512MiB``, ``2GB``, ``1000`` or an int
    (:func:`manymodels.machine.parse_bytes`); refused by ``name`` otherwise."""
    try:
        number = parse_bytes(value)
    except (TypeError, ValueError):
        number = 0
    if number < 1:
        raise ValueError(f"{name} must be a size such as 512MiB, 2GB or 1000000 "
                         f"(bytes), at least 1 byte, got {value!r}")
    return number


def check_run_and_poll(run: Any, poll: Any) -> None:
    """Refuse, by name, a ``run`` that is not a run id or a ``poll`` that is
    not a positive number of seconds (or None)."""
    if run is not None and (isinstance(run, bool) or not isinstance(run, int)):
        raise TypeError(f"run must be a run id (an int), got {run!r}")
    if poll is not None and (isinstance(poll, bool) or not (
            isinstance(poll, (int, float)) and poll > 0)):
        raise ValueError(f"poll must be a positive number of seconds or None, got {poll!r}")


def open_served_store(store: Any) -> Any:
    """``store`` (a path or a :class:`manymodels.Store`) opened for reading;
    refused by name when it is not a manymodels store."""
    from ..inputs.fileuris import local_location
    from ..inputs.objectstores import is_remote
    from ..run.store import Store
    from ..store import StoreError

    if isinstance(store, Store):
        try:  # one opened where there is no store: said so, not "its index removed"
            store._refuse_missing()
        except StoreError as exc:
            raise ValueError(str(exc)) from exc
        return store
    if not isinstance(store, (str, PurePath)):
        raise TypeError(f"store must be a path or a manymodels.Store, got {store!r}")
    store = local_location(store, "store")  # (file:///tmp/s: the folder /tmp/s)
    if is_remote(store):  # a store on an object store, as published
        try:
            return _closed_when_dropped(Store(str(store), read_only=True))
        except StoreError as exc:
            raise ValueError(str(exc)) from exc
    path = Path(store).expanduser()
    if not path.is_dir():
        raise ValueError(f"store {str(store)!r} " + ("is a file, not a store's directory"
                                                     if path.exists() else "does not exist"))
    if not (path / "index.sqlite").is_file():
        raise ValueError(f"{str(store)!r} is not a manymodels store (it has no index.sqlite)")
    try:
        return _closed_when_dropped(Store(path, read_only=True))
    except StoreError as exc:
        raise ValueError(str(exc)) from exc


def _closed_when_dropped(store: Any) -> Any:
    """``store``, whose index connections are closed once nothing holds it
    (no catalog, no request in flight). A connection sits in a reference
    cycle (its statement cache) and so outlived its store until a full
    garbage collection: each store replaced at the served path kept its
    index, removed, open on disk, a long-running server one more each time."""
    weakref.finalize(store, _close_connections, store._connections)
    return store


def _close_connections(connections: list) -> None:
    for connection in list(connections):
        connection.close()


def index_identity(store: Any) -> tuple[int, int] | None:
    """(device, inode) of the index file of a store in a local folder (None
    for one on an object store, or a copy of one, whose index is pulled in
    place). While the served store's connection holds its index open, no
    other file at its path can have the same."""
    from ..store.database import INDEX_NAME

    if store.root != store.path:
        return None
    try:
        found = os.stat(store.path / INDEX_NAME)
    except FileNotFoundError as exc:
        raise ValueError(f"store {str(store)!r} has no index now (removed?)") from exc
    return found.st_dev, found.st_ino


@contextlib.contextmanager
def _catalog_memory() -> Iterator[None]:
    """Read a catalog with Arrow on the system allocator, and hand back what
    it freed. Arrow's own (mimalloc) keeps freed memory for reuse: after a
    million models' catalog, 240 MB, and 50 MB still after its
    ``release_unused`` (measured), which a server that reads a catalog once
    a run does not need. Arrays made meanwhile carry their allocator: the
    switch changes where memory comes from, not what any code sees."""
    import pyarrow as pa

    previous = pa.default_memory_pool()
    pa.set_memory_pool(pa.system_memory_pool())
    try:
        yield
    finally:
        pa.set_memory_pool(previous)
        previous.release_unused()
        try:  # glibc keeps freed heap pages too
            ctypes.CDLL("libc.so.6").malloc_trim(0)
        except (OSError, AttributeError):  # not glibc
            pass


class ServedStore:
    """What one server process serves. ``catalog`` is replaced whole, never
    changed: a request reads it once and finishes on what it read (the
    catalog holds the store it was read from: a store replaced at its path
    is served from the new one once its catalog is swapped in)."""

    def __init__(self, store: Any, run: int | None, cache_models: int, cache_bytes: int,
                 poll: float | None) -> None:
        check_run_and_poll(run, poll)
        opened = open_served_store(store)
        self.run, self.poll = run, poll
        self.metrics = Metrics()
        self.cache = ModelCache(cache_models, cache_bytes, on_load=self.metrics.load)
        self._identity = index_identity(opened)
        self._version = store_version(opened)
        with _catalog_memory():
            self.catalog: Catalog = build_catalog(opened, run)  # refuses an unknown run
        self._reloading = threading.Lock()
        self._failing: str | None = None  # the last reload's failure, while it lasts
        self._stop = threading.Event()  # the running poller's (a new one each start)
        self.poller: threading.Thread | None = None
        log.info("serving run %d of %s: %d group model(s)%s", self.catalog.run_id,
                 self.store, self.catalog.models,
                 " and a fallback" if self.catalog.fallback else "")

    def reload(self, force: bool = False) -> bool:
        """Serve the store's current state if it changed (or ``force``); True
        when a new catalog was swapped in. A failed read (the store removed,
        or replaced by a store not written yet) keeps the old one."""
        if self.run is not None and not force:
            return False  # a fixed run never changes
        with self._reloading:
            previous = self.catalog
            try:
                store, identity = self._current_store()
                store._refresh()  # a store on an object store: its published index
                version = store_version(store)
                if version == self._version and store is previous.store and not force:
                    self._read_again()
                    return False
                with _catalog_memory():
                    catalog = build_catalog(store, self.run)
            except Exception as exc:  # the old catalog keeps serving
                self._failed(exc)
                return False
            self._read_again()
            self.catalog, self._version, self._identity = catalog, version, identity
            self.cache.forget_templates()
            self.metrics.reloads += 1
        log.info("reloaded %s%s: serving run %d (was run %d), %d group model(s)%s",
                 store, "" if store is previous.store else " (a new store at its path)",
                 catalog.run_id, previous.run_id, catalog.models,
                 " and a fallback" if catalog.fallback else "")
        return True

    def _failed(self, exc: Exception) -> None:
        """A reload that failed: counted each time, said once until the
        failure changes (a store removed fails every poll the same way)."""
        self.metrics.reload_errors += 1
        said = str(exc)
        if said != self._failing:
            self._failing = said
            log.error("reload of %s failed, still serving run %d: %s", self.store,
                      self.catalog.run_id, said)

    def _read_again(self) -> None:
        """The store read after failed reloads: said once."""
        if self._failing is not None:
            self._failing = None
            log.info("reload of %s works again", self.store)

    @property
    def store(self) -> Any:
        """The store the served catalog was read from."""
        return self.catalog.store

    def _current_store(self) -> tuple[Any, tuple[int, int] | None]:
        """The store at the served store's path, and its index's identity: the
        one served, or a new one opened where another index took its place
        (a store removed and trained again, or moved there). Its connections
        hold the old index open, which would be read, unchanged, forever."""
        served = self.store
        identity = index_identity(served)
        if identity == self._identity:
            return served, identity
        replaced = open_served_store(served.path)
        return replaced, index_identity(replaced)

    def start(self) -> None:
        """Poll the store every ``poll`` seconds (not for a fixed run)."""
        if self.poll is None or self.run is not None or self.poller is not None:
            return
        self.poller = threading.current_thread()  # claimed: one poller at a time
        # its own event: a poller stopped but still in a reload ends there,
        # whatever a later start does
        self._stop = stop = threading.Event()
        poller = threading.Thread(target=self._poll_loop, args=(stop,),
                                  name="manymodels-serve-poll", daemon=True)
        poller.start()
        self.poller = poller

    def _poll_loop(self, stop: threading.Event) -> None:
        while not stop.wait(self.poll):
            self.reload()  # (a failed read is said, counted and tried again)

    def stop(self) -> None:
        """Stop polling; a later :meth:`start` polls again (an app's lifespan
        run once more: a test client opened twice, a server restarted in
        the same process)."""
        self._stop.set()
        poller, self.poller = self.poller, None
        if poller is not None and poller is not threading.current_thread():
            poller.join(timeout=10)
