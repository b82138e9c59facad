"""A store opened: where its index and its model files are, and one SQLite
connection to the index per thread.

A store is a folder (its index, ``index.sqlite``, and its model files
under ``artifacts/``), or an object store's location, whose model files are
objects there and whose index is this machine's copy, pulled when opened
and published after each write (:mod:`.remote`). What the rest of the
package needs to tell the two apart is here: ``path`` is always the
index's folder on this machine, ``root`` where the model files are (that
folder, or the URI), ``location`` what the user named.
"""

from __future__ import annotations

import contextlib
import logging
import sqlite3
import threading
from collections.abc import Iterator
from pathlib import Path, PurePath

from ..inputs.fileuris import local_location
from ..inputs.objectstores import is_remote, shown
from . import database, newstore, remote
from .localcopy import copied_from
from .remote import RemoteIndex

log = logging.getLogger("manymodels.store")


def store_to_make(store: object) -> bool:
    """Whether ``store`` is a local path where no store is yet (no index:
    missing, an empty folder or one of other files). A run makes it only
    once its input is checked, so that a refused input leaves the path as it
    was, not an empty store."""
    if isinstance(store, OpenedIndex):  # opened where there was none: made by the run
        return store._missing
    if not isinstance(store, (str, PurePath)) or is_remote(str(store)):
        return False
    store = store_location(store)
    return newstore.NewStore.before(Path(store).expanduser()) is not None


def store_location(store: object) -> object:
    """``store`` as the local path it names where it is a ``file:`` URI
    (``file:///tmp/s``: the folder ``/tmp/s``, not one named ``file:``), as
    it is otherwise; one naming no absolute path or a host is refused with
    :class:`StoreError`, as any other bad store location is."""
    try:
        return local_location(store, "store")
    except ValueError as exc:
        raise database.StoreError(str(exc)) from None


class OpenedIndex:
    """A store's index, opened (see the module docstring); the base of
    :class:`manymodels.Store`, which reads and writes what it holds."""

    def __init__(self, path: str | Path, read_only: bool | None = None) -> None:
        if isinstance(path, str) and not path.strip():
            raise database.StoreError("the store path is empty: name a directory (an empty "
                                      "path would make the current directory a store)")
        path = store_location(path)
        self._remote: RemoteIndex | None = None
        if is_remote(path):
            self._remote = RemoteIndex(str(path))
            self._remote.pull(read_only)
            #: where its index is: for a store on an object store, this
            #: machine's copy of it
            self.path = self._remote.copy
            #: where its model files are: its folder, or its object store's URI
            self.root: Path | str = str(path)
        else:
            self.path = Path(path).expanduser().absolute()  # fit may change the directory
            self.root = self.path
            copied = copied_from(self.path)
            if copied is not None:  # read as it is now, a run here writing it included
                # (its model files with the SDK's credentials: keys never written down)
                if read_only is False:
                    raise database.StoreError(
                        f"{str(self.path)!r} is this machine's copy of the index of the store "
                        f"{copied!r}: it opens for reading only; open that store by its URI "
                        "to write to it")
                read_only, self.root = True, copied
        self._local = threading.local()
        self._connections: list[sqlite3.Connection] = []
        self._connecting = threading.Lock()
        self._making = threading.Lock()
        self._closed = False
        #: True where no store was at the local path when opened (and
        #: ``read_only=False``, open to write, was not asked): nothing is made
        #: until a run writes to it (:meth:`_make`), and reading it is refused,
        #: naming the path (a typo would read as an empty store)
        self._missing = (self._remote is None and read_only is None
                         and newstore.NewStore.before(self.path) is not None)
        if self._missing:
            newstore.refuse_inside_artifacts(self.path)  # (at once: not only when a run makes it)
            #: True when the store was opened for reading only (asked for, or the
            #: files are not writable by this user): it can be read, not trained into.
            self.read_only = False
        else:
            self._open_index(read_only)
        self._publish()  # the runs of a driver here that stopped before publishing

    def _open_index(self, read_only: bool | None) -> None:
        """Open the index (making the store where there is none yet): its
        first connection, this thread's."""
        # what this call makes, where it makes a new store: removed again
        # if it is refused (a full disk), so that nothing half-made is left
        made = (None if self._remote is not None or read_only is True
                else newstore.NewStore.before(self.path))
        try:
            self.read_only = not newstore.prepare_directory(self.path, read_only)
            if made is not None and not self.read_only:
                made.claim_index()
            # a connection per thread: SQLite's transactions are a connection's,
            # and threads sharing one broke each other's (a delete's BEGIN inside
            # another thread's read, a reader's COMMIT of a half-done write)
            first = database.connect(self.path, read_only=self.read_only)
        except BaseException as exc:
            if made is None:
                raise
            made.remove()  # (only what this call made: see NewStore)
            if isinstance(exc, database.StoreError):
                raise database.StoreError(f"the store {str(self.path)!r} could not be made, "
                                          f"and nothing of it is left: {exc}") from exc
            raise
        self._keep(first)

    def _keep(self, conn: sqlite3.Connection) -> sqlite3.Connection:
        """``conn``, just opened, as this thread's connection, unless the
        store was closed meanwhile (another thread's :meth:`close` while it
        was opened): then it is closed too, and the use refused. Checked and
        kept under the lock :meth:`close` takes, so no connection opened
        after a close outlives it."""
        with self._connecting:
            if not self._closed:
                self._connections.append(conn)
                self._local.conn = conn
                return conn
        conn.close()
        raise self._closed_error()

    def _closed_error(self) -> database.StoreError:
        return database.StoreError(f"the store {str(self)!r} was closed: open it again "
                                   "(mm.Store(...)) to use it")

    def _make(self) -> None:
        """Make the store where none was when it was opened (a run about to
        write to it); nothing otherwise."""
        with self._making:
            if self._missing and not self._closed:  # (a closed one is refused on use)
                self._open_index(None)
                self._missing = False

    def _refuse_missing(self) -> None:
        """Refuse to use a store that does not exist: :attr:`_conn` does it
        before anything reads the index (or gc, delete, attach write to it),
        so that no reader can forget it. A run makes the store first
        (:meth:`_make`); one made since by another process is opened."""
        if self._missing and not (self.path / database.INDEX_NAME).exists():
            raise database.StoreError(
                f"the store {str(self.path)!r} does not exist (no index.sqlite there): "
                "name an existing store to read it; mm.train(..., store=) makes a new one")

    def __enter__(self) -> OpenedIndex:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def location(self) -> str:
        """What names the store, as it was opened: its folder, or its URI."""
        return str(self.root)

    @property
    def reopened_as(self) -> str:
        """What a worker opens to read this store as it was opened here: its
        URI on an object store, else its index's folder. This machine's copy
        of a store's index opened by its path (a copy moved away too) is
        that copy, not the store's URI, whose published index may hold
        other runs, and other packs under the same numbers."""
        return self.location if self._remote is not None else str(self.path)

    @property
    def _version(self) -> str | None:
        """A store on an object store: the published index its copy was
        last synced with; None otherwise."""
        return None if self._remote is None else self._remote.synced_with()

    def _refresh(self) -> None:
        """A store on an object store: bring its index's copy to what was
        published since it was opened (refused where the copy holds writes
        of its own not published yet, and another machine published since);
        nothing otherwise. Each write to the store starts with it, so that it
        writes onto what was published, never an older copy."""
        if self._remote is not None:
            self._remote.pull(self.read_only)

    def _publish(self, held: bool = True) -> None:
        """A store on an object store: publish its index's copy, where it
        holds writes not published yet (:mod:`.remote`); nothing otherwise,
        nor (``held``) inside this thread's :meth:`_one_publication`, which
        publishes at its end. ``held=False``: publish now all the same (gc,
        before it removes objects the published index may name)."""
        if self._remote is not None and not self.read_only and not (
                held and getattr(self._local, "held", 0)):
            self._remote.publish()

    @contextlib.contextmanager
    def _one_publication(self) -> Iterator[None]:
        """A store on an object store: hold the publications of the writes
        this thread makes in the block, and publish once at its end (a
        ``train`` with its selection and its evaluation's record: one upload
        of the index, not three). Other threads' writes, and gc's publication
        before it removes objects, are not held. Where the block raises, a
        failure to publish is a warning, not an error that would hide the
        block's own."""
        self._local.held = getattr(self._local, "held", 0) + 1  # (this thread's writes)
        failing = True  # (sys.exc_info() would see a caller's own exception, handled)
        try:
            yield
            failing = False
        finally:
            self._local.held -= 1
            try:
                self._publish()
            except Exception as exc:  # (a full disk's sqlite3 error, an OSError, too)
                if not failing:
                    raise
                import warnings

                warnings.warn(str(exc), RuntimeWarning, stacklevel=3)

    @contextlib.contextmanager
    def _publishing(self) -> Iterator[None]:
        """A store on an object store: publish its index's copy every
        :data:`.remote.PUBLISH_EVERY_S` while the block runs (a run), so that
        a machine lost mid-run loses only what it did since; the caller
        publishes at the end. A publication that fails is logged, and the
        next is tried at the next tick."""
        if self._remote is None or self.read_only:
            yield
            return
        stop = threading.Event()

        def publish() -> None:
            while not stop.wait(remote.PUBLISH_EVERY_S):
                try:
                    self._remote.publish()
                except Exception as exc:  # (a full disk, the network): tried at the next tick
                    log.warning("publishing %s while its run runs failed: %s", self, exc)

        thread = threading.Thread(target=publish, name="manymodels-publish", daemon=True)
        thread.start()
        try:
            yield
        finally:
            stop.set()
            thread.join()

    @property
    def _conn(self) -> sqlite3.Connection:
        """This thread's connection to the index (opened on first use)."""
        if self._closed:
            raise self._closed_error()
        if self._missing:  # (a run makes it first: see _make)
            self._refuse_missing()
            self._make()  # made since by another process: opened as it is
        conn = getattr(self._local, "conn", None)
        if conn is None:
            conn = self._keep(database.connect(self.path, read_only=self.read_only,
                                               opened=True))
        return conn

    def close(self) -> None:
        """Close this process's connections to the index; a store on an
        object store first publishes the writes its copy holds, so that
        other machines see them. Each call that writes commits (and
        publishes) on its own. Using the store afterwards is refused, naming
        it; closing it again does nothing (``with mm.Store(...) as store:``
        closes it at the block's end)."""
        if self._closed:
            return
        self._publish(held=False)
        with self._connecting:
            self._closed = True
            connections, self._connections = self._connections, []
        for conn in connections:  # (each once a call under way on it has ended)
            conn.close_refusing(self._closed_error)

    def __str__(self) -> str:
        return shown(self.location)

    def __repr__(self) -> str:
        return f"Store({str(self)!r})"

    def _require_writable(self, what: str) -> None:
        """Refuse ``what`` on a store open for reading only, or whose folder is
        gone (:meth:`_refuse_gone`); on an object store, bring the copy to
        what was published first (:meth:`_refresh`). A store that does not
        exist is refused by the first use of :attr:`_conn`."""
        if self.read_only:
            raise database.StoreError(
                f"store {str(self)!r} is open for reading only (asked for, or its "
                f"files are not writable here): {what} writes to it")
        self._refuse_gone()
        self._refresh()

    def _refuse_gone(self) -> None:
        """Refuse a write where the store's folder was removed or moved since
        it was opened: its connections still have the removed index open
        (reads go on from it), and a write would be lost with it. One stat,
        at the start of each write (a run's: before its first)."""
        if self._remote is None:  # (an object store's copy is this machine's own)
            database.refuse_gone(self._conn, self.path)

