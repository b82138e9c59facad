"""The models a server holds: loaded from the store on first use, checked
against their SHA-256 as every store read is, and kept in an LRU bounded by
count and by bytes (the models' stored sizes).

A packed model's cold load reads only its byte range of the pack's BLOB.
The pack's template (head and tail, see :mod:`manymodels.store.packs`) is
read once per pack and held: SQLite keeps those columns after the BLOB, so
reading them walks the pack's pages (84 us a load on a store of a million
tiny models, two thirds of the cold path, measured). A model that does not
match its SHA-256 so read is read again the store's own way, which refuses
it by name: a held template is never what refuses a model."""

from __future__ import annotations

import hashlib
import pickle
import sqlite3
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from ..store import artifacts, packs

#: Pack templates held (a few hundred bytes each; a pack holds up to 32 MiB).
_TEMPLATES_HELD = 100_000

#: A request is answered on the event loop only where its models' last
#: predictions took less than this, together: a slow model (a large forest,
#: seconds a call) would hold up every other request there, /healthz too.
INLINE_SECONDS = 0.001


class NotHeld(LookupError):
    """A request to be answered by held, quick models only (on the event
    loop) needs one the cache does not hold, or one whose predictions take
    their time: it is answered again where a load or a slow prediction holds
    up no other request (a thread)."""


class ModelLoadError(Exception):
    """A model whose bytes are sound but that does not unpickle here (its
    class's module missing or changed): the model's fault, answered 500
    naming its key and why, where Ray Serve's multiplexing gave a bare 500."""


def _unpickled(data: bytes, digest: str, what: str) -> Any:
    try:
        return pickle.loads(data)
    except Exception as exc:
        raise ModelLoadError(f"artifact {digest} of {what} does not unpickle here: "
                             f"{type(exc).__name__}: {exc}") from exc


class ModelCache:
    """Digest -> model, least recently used first out. Keyed by the model's
    content (its SHA-256 or pack locator): a new run that reuses a model
    keeps it warm across a swap, and two groups with one model hold one copy.

    A model larger than ``max_bytes`` on its own is still served (loaded for
    the request), never kept. Loads happen outside the lock: a slow read of
    one model does not hold up requests for the others."""

    def __init__(self, max_models: int = 1000, max_bytes: int = 1 << 30,
                 on_load: Callable[[float], None] | None = None) -> None:
        if not isinstance(max_models, int) or isinstance(max_models, bool) or max_models < 1:
            raise ValueError(f"cache_models must be a whole number of at least 1, "
                             f"got {max_models!r}")
        if not isinstance(max_bytes, int) or isinstance(max_bytes, bool) or max_bytes < 1:
            raise ValueError(f"cache_bytes must be a whole number of bytes of at least 1, "
                             f"got {max_bytes!r}")
        self.max_models, self.max_bytes = max_models, max_bytes
        self._models: OrderedDict[str, tuple[Any, int]] = OrderedDict()
        self._seconds: dict[str, float] = {}  # a held model's last prediction's time
        self._lock = threading.Lock()
        self.bytes_held = 0
        self.hits = self.misses = self.evictions = 0
        self._on_load = on_load  # told each cold load's seconds (the metrics' histogram)
        self._templates: dict[int, tuple[bytes, bytes]] = {}  # pack id -> (head, tail)

    def __len__(self) -> int:
        return len(self._models)

    def quick(self, digests: list[str]) -> bool:
        """Whether the cache holds each of ``digests`` now and their last
        predictions (:meth:`timed`) took under :data:`INLINE_SECONDS`
        together (counted neither a hit nor a miss). A model never timed is
        not quick: its first prediction may take any time."""
        with self._lock:
            if not all(digest in self._models for digest in digests):
                return False
            seconds = self._seconds
            return sum(seconds.get(digest, INLINE_SECONDS)
                       for digest in set(digests)) < INLINE_SECONDS

    def timed(self, digest: str, seconds: float) -> None:
        """Note how long a held model's prediction took."""
        with self._lock:
            if digest in self._models:
                self._seconds[digest] = seconds

    def get(self, store: Any, digest: str, what: str) -> Any:
        """The model ``digest`` names, from the cache or else read from
        ``store`` (raising :class:`~manymodels.StoreIntegrityError`, naming
        ``what``, when its bytes do not match their SHA-256)."""
        with self._lock:
            held = self._models.get(digest)
            if held is not None:
                self._models.move_to_end(digest)
                self.hits += 1
                return held[0]
            self.misses += 1
        started = time.perf_counter()
        data = self._read_packed(store._conn, digest) if packs.is_locator(digest) else None
        if data is None:
            data = artifacts.read_artifact(store._conn, store.root, digest, what)
        model = _unpickled(data, digest, what)  # checked against its SHA-256 above
        if self._on_load is not None:
            self._on_load(time.perf_counter() - started)
        self._keep(digest, model, len(data))
        return model

    def _read_packed(self, conn: Any, locator: str) -> bytes | None:
        """A packed model's bytes if they match its SHA-256, else None (then
        :func:`~manymodels.store.artifacts.read_artifact` reads and judges)."""
        if not hasattr(conn, "blobopen"):  # Python 3.10
            return None
        try:
            digest, pack, offset, size = packs.parse_locator(locator)
        except ValueError:
            return None
        template = self._templates.get(pack)
        if template is None:
            template = packs.pack_template(conn, pack)
            with self._lock:
                while len(self._templates) >= _TEMPLATES_HELD:
                    self._templates.pop(next(iter(self._templates)))
                self._templates[pack] = template
        head, tail = template
        part = size - len(head) - len(tail)
        try:
            with conn.blobopen("packs", "blob", pack, readonly=True) as blob:
                if part < 0 or offset + part > len(blob):
                    return None
                blob.seek(offset)
                data = b"".join((head, blob.read(part), tail)) if head or tail else blob.read(
                    part)
        except sqlite3.Error:  # no such pack: judged by read_artifact
            return None
        return data if hashlib.sha256(data).hexdigest() == digest else None

    def forget_templates(self) -> None:
        """Drop the held templates (a reload: a pack id may have been reused)."""
        with self._lock:
            self._templates.clear()

    def _keep(self, digest: str, model: Any, size: int) -> None:
        if size > self.max_bytes:
            return
        with self._lock:
            if digest in self._models:  # another request loaded it meanwhile
                return
            self._models[digest] = (model, size)
            self.bytes_held += size
            while len(self._models) > self.max_models or self.bytes_held > self.max_bytes:
                evicted, (_, freed) = self._models.popitem(last=False)
                self._seconds.pop(evicted, None)
                self.bytes_held -= freed
                self.evictions += 1

    def stats(self) -> dict[str, int]:
        with self._lock:
            return {"hits": self.hits, "misses": self.misses, "evictions": self.evictions,
                    "models": len(self._models), "bytes": self.bytes_held}
