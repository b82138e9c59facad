"""Large models written by the worker that trained them, straight into the
store's folder, so that their bytes never pass through the driver.

A model that pickles to :data:`~.partpacks.PACKED_BELOW` (1 MiB) or more is
a file of a store's, ``artifacts/<2 hex>/<sha256>`` (content-addressed: the
same bytes make the same name, whoever writes them, two drivers included).
With a store, the worker that pickled it writes that file itself (to a
temporary name, then renamed: a reader never sees part of one) and sends
the driver a :class:`ModelFile`, its name, size and SHA-256; the driver's
writer only records the row that names it. On a cluster this needs the
store on a path every node sees: a worker first looks for the run's
marker file there (:class:`ModelFiles`), and where it does not see it (a
node with a disk of its own) it sends the bytes to the driver as before.

The driver checks that the file is there with its size before it hands the
task to the store's writer (a task whose file is not there fails, with the
reason), and the writer makes the file new again as it writes the row, as it
does a file it wrote itself: the store's collection
(:mod:`manymodels.store.collect`) removes a file no row names only once it
is an hour old, and one whose row it deletes likewise while a run runs
(its worker may have just written the same model again). A worker's file
waits for its row about a second on the process and cluster backends (a
part of a batch is sent every quarter of a second), up to its batch's end
on threads. A worker's temporary file is named after its run, and what a
worker killed mid-write leaves goes when the run ends (:meth:`ModelFiles.close`).

A store on an object store (:mod:`manymodels.store.remote`) has its model
files there, under the same names: its "root" is then the store's URI, not
a path, and a worker that can reach the object store (it finds the run's
marker object) uploads each model whole, in one request, so that nothing
of a killed worker's is ever seen; no temporary name is needed.
"""

from __future__ import annotations

import hashlib
import os
import pickle
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..inputs.objectstores import child, is_remote, redacted, resolve, shown, upload

#: A store's folder of model files, under its root.
FOLDER = "artifacts"
#: A run's marker there: this, the run's id, "-" and a random part.
MARKER_PREFIX = ".run-"


def marker_run(name: str) -> int | None:
    """The run a marker file of ``name`` stands for; None for another file."""
    if not name.startswith(MARKER_PREFIX):
        return None
    run_id = name[len(MARKER_PREFIX):].split("-", 1)[0]
    return int(run_id) if run_id.isdigit() else None


def relative_path(digest: str) -> str:
    """Where the model of SHA-256 ``digest`` lies, under a store's root."""
    return f"{FOLDER}/{digest[:2]}/{digest}"


def intact_file(path: Path, size: int) -> bool:
    """Whether a model file is at ``path`` with its ``size`` bytes."""
    try:
        return path.stat().st_size == size
    except OSError:
        return False


def intact_model(root: Path | str, relative: str, size: int) -> bool:
    """Whether the model file ``relative`` is under ``root`` with ``size``
    bytes (a stat, or one request to an object store)."""
    if not is_remote(root):
        return intact_file(Path(root, relative), size)
    return object_size(child(root, relative)) == size


def object_size(uri: str) -> int | None:
    """The size of the object at ``uri``; None where there is none (or the
    store cannot be reached)."""
    try:
        filesystem, path = resolve(uri)
        return filesystem.get_file_info(path).size
    except (OSError, ValueError):
        return None


def model_objects(root: str) -> list[tuple[str, int, float | None]]:
    """The objects under an object store's ``root``'s model folder, in one
    listing (a request a thousand objects): each one's name under ``root``
    (``artifacts/...``), its size and its modification time."""
    from pyarrow import fs

    filesystem, base = resolve(child(root, FOLDER))
    found = filesystem.get_file_info(fs.FileSelector(base, recursive=True,
                                                     allow_not_found=True))
    start = len(base) - len(FOLDER)
    return [(entry.path[start:], entry.size,
             entry.mtime.timestamp() if entry.mtime is not None else None)
            for entry in found if entry.type == fs.FileType.File]


def listed_models(root: str) -> dict[str, int]:
    """The model files under an object store's ``root``: relative name -> size."""
    return {name: size for name, size, _ in model_objects(root)}


def read_model_bytes(root: Path | str, relative: str) -> bytes:
    """The bytes of the model file ``relative`` under ``root``; an
    ``OSError`` (a ``FileNotFoundError`` where it is not there) otherwise."""
    if not is_remote(root):
        return Path(root, relative).read_bytes()
    uri = child(root, relative)
    try:
        filesystem, path = resolve(uri)
        with filesystem.open_input_file(path) as source:
            return source.read()
    except FileNotFoundError:
        raise FileNotFoundError(f"no object {shown(uri)}") from None
    except (OSError, ValueError) as exc:
        raise OSError(redacted(exc, uri)) from None


def remove_object(uri: str) -> bool:
    """Remove the object at ``uri``; whether it was removed (a clean-up:
    errors are not raised, and an object that is not there was not removed)."""
    try:
        filesystem, path = resolve(uri)
        filesystem.delete_file(path)
    except Exception:  # (gone meanwhile, no permission, the network)
        return False
    return True


def write_model_file(root: Path | str, data: bytes | memoryview, digest: str,
                     temporary_prefix: str = ".tmp-") -> str:
    """Put ``data`` (of SHA-256 ``digest``) in place under ``root``, whole or
    not at all; return its relative path. Owner-only, as the store is (on an
    object store: one upload, seen once complete)."""
    relative = relative_path(digest)
    if is_remote(root):
        try:
            upload(child(root, relative), data)
        except (OSError, ValueError) as exc:
            raise OSError(f"cannot upload {shown(child(root, relative))}: "
                          f"{redacted(exc, root)}") from None
        return relative
    target = Path(root, relative)
    target.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    descriptor, temporary = tempfile.mkstemp(dir=target.parent, prefix=temporary_prefix)
    try:
        with os.fdopen(descriptor, "wb") as out:
            out.write(data)
        os.chmod(temporary, 0o600)
        os.replace(temporary, target)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
    return relative


class ModelFile:
    """A large model a worker wrote into the store (see the module
    docstring): what the driver receives instead of its bytes. ``load()``
    reads it back, checked against its SHA-256 before it is unpickled."""

    __slots__ = ("sha256", "size", "path", "root")

    def __init__(self, sha256: str, size: int, path: str, root: str) -> None:
        self.sha256, self.size, self.path, self.root = sha256, size, path, root

    def __reduce__(self) -> tuple:
        return (ModelFile, (self.sha256, self.size, self.path, self.root))

    def intact(self) -> bool:
        """Whether the file is there with its size (what the driver can see
        cheaply: a stat, not a read)."""
        return intact_model(self.root, self.path, self.size)

    def load(self) -> Any:
        data = read_model_bytes(self.root, self.path)
        if hashlib.sha256(data).hexdigest() != self.sha256:
            raise OSError(f"the model file {self.path} in store {shown(self.root)!r} does not "
                          "hold the bytes its worker wrote (changed or cut short since)")
        return pickle.loads(data)


@dataclass
class ModelFiles:
    """Where a run's workers write their large models: the store's ``root``,
    and the ``marker`` file the driver put there for the run (see
    :meth:`open`), which a worker must see to write there."""

    root: str
    marker: str
    _visible: bool | None = field(default=None, repr=False, compare=False)

    @classmethod
    def open(cls, root: Path | str, run_id: int) -> ModelFiles:
        """Mark ``root`` as run ``run_id``'s (the marker is removed by
        :meth:`close`; the store's collection leaves it while the run is
        running, and collects one a crash left as a stray)."""
        if is_remote(root):
            import uuid

            marker = f"{FOLDER}/{MARKER_PREFIX}{run_id}-{uuid.uuid4().hex[:8]}"
            try:
                upload(child(root, marker), b"")
            except (OSError, ValueError) as exc:
                raise OSError(redacted(exc, root)) from None
            return cls(root, marker)
        folder = Path(root, FOLDER)
        folder.mkdir(mode=0o700, exist_ok=True)
        descriptor, marker = tempfile.mkstemp(dir=folder, prefix=f"{MARKER_PREFIX}{run_id}-")
        os.close(descriptor)
        return cls(str(root), os.path.relpath(marker, root))

    def close(self) -> None:
        """The run's end: its marker goes, with what a worker killed while
        writing a model file left (a timeout's, a crash's)."""
        if is_remote(self.root):  # (an upload a worker did not finish is never seen)
            remove_object(child(self.root, self.marker))
            return
        folder = Path(self.root, FOLDER)
        for left in folder.glob(f"*/{self._temporary_prefix}*"):
            left.unlink(missing_ok=True)
        Path(self.root, self.marker).unlink(missing_ok=True)

    @property
    def _temporary_prefix(self) -> str:
        """The run's workers' temporary files: ``.tmp-<run id>-``."""
        run_id = marker_run(os.path.basename(self.marker))
        return f".tmp-{run_id}-"

    def __getstate__(self) -> dict[str, Any]:
        return {"root": self.root, "marker": self.marker, "_visible": None}

    def visible(self) -> bool:
        """Whether this worker sees the store, as the driver's user (asked
        once a worker): a worker running as another user (root, in a
        container) would leave files the driver cannot read."""
        if self._visible is None and is_remote(self.root):
            self._visible = object_size(child(self.root, self.marker)) is not None
        elif self._visible is None:
            try:
                owner = os.stat(os.path.join(self.root, self.marker)).st_uid
            except OSError:
                self._visible = False
            else:
                self._visible = owner == os.geteuid()
        return self._visible

    def write(self, data: bytes, digest: str) -> ModelFile:
        path = write_model_file(self.root, data, digest, self._temporary_prefix)
        return ModelFile(digest, len(data), path, self.root)
