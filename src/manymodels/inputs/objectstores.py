"""Parquet files on an object store (``s3://``, ``gs://``, ``abfs://``, ...)
that ``read_on_workers=True`` reads on the workers.

A location is a URI that pyarrow's filesystems understand
(``pyarrow.fs.FileSystem.from_uri``), with its options, if any, in the query
(``s3://bucket/sales?region=eu-west-1``); credentials and endpoints come
from where the filesystem's SDK looks for them (``AWS_ACCESS_KEY_ID``,
``AWS_ENDPOINT_URL``, an instance role, ...), on the driver and on every
worker alike. Each file is named by its own URI: the location's text, then
the file's path under it, then the location's query, so that a worker
resolves it with nothing but the text. A process makes one filesystem per
bucket (or container) and keeps it: a batch does not pay for the SDK's set-up
or a region lookup again.

An object's identity is its URI, size and modification time, not a hash of
its bytes: hashing would read the whole data set on the driver, which is
what reading on the workers avoids. An object rewritten with the same size
within the store's clock resolution (a second on S3) is not seen as changed.
"""

from __future__ import annotations

import functools
import os
import re
from collections.abc import Sequence
from typing import Any
from urllib.parse import quote, unquote, urlsplit

#: A URI of a filesystem other than this machine's (``file://`` is a local path;
#: a scheme is case-insensitive, so ``FILE://`` is one too).
_REMOTE = re.compile(r"^(?!file://)[A-Za-z][A-Za-z0-9+.-]*://", re.IGNORECASE)


def is_remote(path: Any) -> bool:
    """Whether ``path`` is an object store's (or any non-local filesystem's) URI."""
    return isinstance(path, str) and _REMOTE.match(path) is not None


#: Query options that hold a secret (pyarrow's names for S3's keys and token),
#: in a query or in an error's text that quotes the URI (to its end).
_SECRET_OPTIONS = re.compile(
    r"((?:^|[?&])(?:access_key|secret_key|session_token)=)[^&\s'\"]*")


def shown(uri: Any) -> str:
    """``uri`` as an error or a log may print it: a password in it (the S3
    secret key of ``s3://key:secret@bucket``) and secret query options
    replaced by ``***``."""
    if not is_remote(uri):
        return str(uri)
    parts = urlsplit(uri)
    netloc = parts.netloc
    if "@" in netloc:
        user, _, host = netloc.rpartition("@")
        netloc = (user.split(":", 1)[0] + ":***" if ":" in user else user) + "@" + host
    query = _SECRET_OPTIONS.sub(r"\1***", parts.query)
    return parts._replace(netloc=netloc, query=query).geturl()


def without_secrets(uri: str) -> str:
    """``uri`` without its password and secret query options (not ``***``
    in their place: what is left still opens, with the SDK's own
    credentials). The user part stays where it names a place (Azure's
    container: ``abfs://container@account...``); S3's is the access key,
    which goes with its secret."""
    if not is_remote(uri):
        return str(uri)
    parts = urlsplit(uri)
    user, at, host = parts.netloc.rpartition("@")
    if not at:
        netloc = parts.netloc
    elif parts.scheme.lower() == "s3":
        netloc = host
    else:
        netloc = user.split(":", 1)[0] + "@" + host
    query = "&".join(option for option in parts.query.split("&")
                     if option and not _SECRET_OPTIONS.match("&" + option))
    return parts._replace(netloc=netloc, query=query).geturl()


#: Query options that say only how a store is reached, not which store it is:
#: credentials (pyarrow's S3 keys, Azure's), the region (an S3 bucket's name is
#: global: any region's request finds it), the protocol, time-outs, TLS
#: settings, whether a bucket may be made. An option not named here (an
#: endpoint: ``endpoint_override``, Azure's ``*_storage_authority``, another
#: server; one pyarrow adds later) is kept: two stores are better two local
#: copies than one.
_REACH_OPTIONS = frozenset({
    "access_key", "secret_key", "session_token", "region", "scheme",
    "allow_bucket_creation", "allow_bucket_deletion", "tls_ca_file_path",
    "tls_verify_certificates", "retry_limit_seconds", "enable_tls",
    "blob_storage_scheme", "dfs_storage_scheme", "credential_kind", "tenant_id",
    "client_id", "client_secret", "account_key", "sas_token", "background_writes"})


def store_identity(uri: str) -> str:
    """What names the store at ``uri``, whatever its spelling: its scheme,
    bucket (an Azure URI's ``container@account``), path, and the options that
    choose another server (an endpoint), sorted, their values decoded; not the
    credentials (S3's access key in the user part, keys in the query) nor the
    options that only say how to reach it (:data:`_REACH_OPTIONS`). The same
    store opened with its options in another order, with other keys or with
    the SDK's own has the same identity (one local copy of its index, not one
    per spelling)."""
    from urllib.parse import parse_qsl

    parts = urlsplit(uri)
    user, at, host = parts.netloc.rpartition("@")
    bucket = (user.split(":", 1)[0] + "@" + host if at and parts.scheme.lower() != "s3"
              else host)
    options = []
    for name, value in parse_qsl(parts.query, keep_blank_values=True):
        if name in _REACH_OPTIONS:
            continue
        if name == "endpoint_override":  # the server
            value = _endpoint(value)
        options.append((name, value))
    if parts.scheme.lower() == "s3" and not any(n == "endpoint_override" for n, _ in options):
        # the server the SDK reaches where the URI names none: the environment's
        given = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
        if given:
            options.append(("endpoint_override", _endpoint(given)))
    path = unquote(parts.path).rstrip("/")
    return (f"{parts.scheme.lower()}://{bucket}{path}"
            + ("?" + "&".join(f"{n}={v}" for n, v in sorted(options)) if options else ""))


def _endpoint(value: str) -> str:
    """A server's endpoint as an identity holds it: http:// or not, one
    trailing slash or not, in any case."""
    value = re.sub(r"^https?://", "", value.strip(), flags=re.IGNORECASE)
    return value.rstrip("/").lower()


def redacted(text: Any, uri: str) -> str:
    """``text`` (an SDK's error about ``uri``) with ``uri``'s secrets as
    ``***``: its password, as given and unquoted, and secret query options."""
    text = _SECRET_OPTIONS.sub(r"\1***", str(text))
    user = urlsplit(uri).netloc.rpartition("@")[0]
    if ":" in user:
        given = user.split(":", 1)[1]
        for secret in {given, unquote(given)} - {""}:
            text = text.replace(secret, "***")
    return text


def without_query(uri: str) -> str:
    """The URI without its options (``?region=...``)."""
    return uri.split("?", 1)[0]


def object_path(uri: str) -> str:
    """The URI without its options, percent-decoded: the text that names the
    object (an object's key may hold ``#``, ``?`` or ``%``: its URI quotes them)."""
    return unquote(without_query(uri))


@functools.lru_cache(maxsize=16)
def _filesystem(scheme: str, netloc: str, query: str) -> tuple[Any, str]:
    """The filesystem of a bucket (``netloc``) and the bucket's own path in it."""
    from pyarrow import fs

    return fs.FileSystem.from_uri(f"{scheme}://{netloc}" + (f"?{query}" if query else ""))


def resolve(uri: str) -> tuple[Any, str]:
    """The pyarrow filesystem of ``uri`` and the object's path in it."""
    parts = urlsplit(uri)
    if parts.fragment or uri.endswith("#"):
        raise ValueError(f"{shown(uri)!r} has a '#', which ends a URI's path: write it as %23")
    filesystem, base = _filesystem(parts.scheme, parts.netloc, parts.query)
    return filesystem, base.rstrip("/") + unquote(parts.path).rstrip("/")


def resolve_all(uris: list[str]) -> tuple[Any, list[str]]:
    """One filesystem for ``uris`` (all under one location) and their paths in it."""
    filesystem = resolve(uris[0])[0]
    return filesystem, [resolve(uri)[1] for uri in uris]


def missing_path(path: str) -> ValueError:
    """The error for a table path that names nothing (``path`` as shown). A
    glob pattern (``data/*.parquet``) is a path too, never expanded: the
    error says so, where "does not exist" alone reads as a missing folder."""
    if any(wildcard in path for wildcard in "*?["):
        return ValueError(f"table path {path!r} does not exist (a glob pattern is not "
                          "expanded: give the folder that holds the files, or read them "
                          "first and give the table)")
    return ValueError(f"table path {path!r} does not exist")


def hidden(parts: Sequence[str]) -> bool:
    """Whether a file under a table's directory (its path's ``parts`` there)
    is one that readers of a directory leave out, as pyarrow's datasets and
    pandas do: a name or folder that starts with ``.`` or ``_`` (a Spark
    job's ``_temporary/``, ``.ipynb_checkpoints/``: copies of the rows)."""
    return any(part.startswith((".", "_")) for part in parts)


def parquet_objects(location: str, suffixes: set[str]) -> list[str]:
    """The URIs of the Parquet objects at ``location``: the object itself, or
    those under it (in key order, as a local directory's files are read);
    a location that names nothing is refused by name."""
    import pyarrow as pa
    from pyarrow import fs

    try:
        filesystem, path = resolve(location)
    except (OSError, pa.ArrowException) as exc:
        raise ValueError(f"cannot open {shown(location)!r} with pyarrow's filesystems: "
                         f"{redacted(exc, location)}") from None
    try:
        info = filesystem.get_file_info(path)
        if info.type == fs.FileType.File:
            return [location]
        if info.type == fs.FileType.NotFound:
            raise missing_path(shown(location))
        found = filesystem.get_file_info(fs.FileSelector(path, recursive=True))
    except OSError as exc:
        raise ValueError(f"cannot list {shown(location)!r}: {redacted(exc, location)}"
                         ) from None
    base, _, query = location.partition("?")
    files = []
    for entry in sorted(found, key=lambda entry: entry.path):
        relative = entry.path[len(path):].lstrip("/")
        if entry.type == fs.FileType.File and any(
                relative.lower().endswith(suffix) for suffix in suffixes) and not hidden(
                relative.split("/")):
            files.append(f"{base.rstrip('/')}/{quote(relative, safe='/=')}"
                         + (f"?{query}" if query else ""))
    if not files:
        raise ValueError(f"{shown(location)!r} holds no .parquet objects")
    return files


def object_versions(uris: list[str]) -> list[str]:
    """Each object's identity: its URI, size and modification time (see the
    module docstring); one listing call per object, no byte read."""
    filesystem, paths = resolve_all(uris)
    try:
        infos = filesystem.get_file_info(paths)
    except OSError as exc:
        raise ValueError(f"cannot read the Parquet objects {[shown(u) for u in uris[:3]]}...: "
                         f"{redacted(exc, uris[0])}") from None
    versions = []
    for uri, info in zip(uris, infos):
        if info.size is None:
            raise ValueError(f"the Parquet object {shown(uri)!r} is gone")
        modified = info.mtime_ns if info.mtime_ns is not None else -1
        versions.append(f"object:{without_query(uri)}:{info.size}:{modified}")
    return versions


# -- staged rows on an object store (``staging="s3://..."``) -----------------

#: A staged file on an object store is written in record batches of about
#: this many bytes: a worker fetches the batches that hold its groups (a ranged
#: read each), never the whole file.
STAGED_BATCH_BYTES = 4 * 2**20
#: The footer's key for the rows of every record batch but the last.
_ROWS_PER_BATCH = b"manymodels.rows_per_batch"


def child(location: str, name: str) -> str:
    """The URI of ``name`` under ``location`` (its options kept at the end)."""
    parts = urlsplit(location)
    return parts._replace(path=f"{parts.path.rstrip('/')}/{quote(name)}").geturl()


def path_in(directory: str, name: str) -> str:
    """The path of ``name`` in ``directory``: a local path's, or an object
    store's URI (:func:`child`)."""
    if is_remote(directory):
        return child(directory, name)
    import os

    return os.path.join(directory, name)


def upload(uri: str, data: Any) -> None:
    """``data`` (bytes, or a pyarrow buffer) as the object at ``uri``, sent in
    one upload: an object store shows it once the upload completes, so a
    process that dies here leaves nothing."""
    filesystem, path = resolve(uri)
    with filesystem.open_output_stream(path) as sink:
        sink.write(data)


def check_location(location: str, argument: str) -> None:
    """Refuse, naming ``argument``, a location pyarrow's filesystems cannot
    open, or one with a fragment (a ``#`` its URI does not quote: every
    object under it would be one, :func:`resolve`)."""
    import pyarrow as pa

    try:
        resolve(location)
    except (OSError, pa.ArrowException, ValueError) as exc:
        raise ValueError(f"{argument}={shown(location)!r} cannot be opened with pyarrow's "
                         f"filesystems: {redacted(exc, location)}") from None


def make_directory(location: str) -> None:
    """Make the folder ``location`` (a no-op on stores that have no folders)."""
    filesystem, path = resolve(location)
    filesystem.create_dir(path, recursive=True)


def remove_tree(location: str) -> None:
    """Remove everything under ``location``; errors are ignored (a clean-up)."""
    import contextlib

    with contextlib.suppress(Exception):  # gone already, or the SDK shut down at exit
        filesystem, path = resolve(location)
        filesystem.delete_dir(path)


def write_arrow_file(uri: str, table: Any) -> None:
    """Write ``table`` as an Arrow IPC file at ``uri``, in record batches of
    about :data:`STAGED_BATCH_BYTES` rows' worth, streamed to the object
    store as they are made (the object is shown once the upload completes):
    beside the table, only one batch is held. A write that fails midway
    sends no footer, so what the stream's close completes is no Arrow file,
    and removes it."""
    import pyarrow as pa

    # every batch but the last holds ``rows`` rows (what a reader counts on):
    # each is a slice of the table made one chunk, so that no chunk boundary
    # of the table cuts a batch short
    table = table.unify_dictionaries()  # (one dictionary a column, as the IPC file holds)
    per_row = max(1, table.nbytes // max(1, table.num_rows))
    rows = max(1, STAGED_BATCH_BYTES // per_row)
    filesystem, path = resolve(uri)
    sink = filesystem.open_output_stream(path)
    try:
        out = pa.ipc.new_file(sink, table.schema, metadata={_ROWS_PER_BATCH: str(rows)})
        for start in range(0, table.num_rows, rows):
            out.write_table(table.slice(start, rows).combine_chunks(), max_chunksize=rows)
        out.close()  # the footer: what makes the file readable
    except BaseException:
        # no footer: what the stream's close sends is no Arrow file, and a
        # reader fails on it rather than reading part of the rows
        import contextlib

        with contextlib.suppress(Exception):
            sink.close()
        with contextlib.suppress(Exception):
            filesystem.delete_file(path)
        raise
    sink.close()


class RemoteArrowFile:
    """A staged Arrow IPC file on an object store, read a record batch at a
    time: :meth:`slice` is a ``pyarrow.Table.slice`` of the whole file that
    fetches only the batches the rows lie in (one ranged read each).
    :meth:`keep_only` drops the batches a worker's next task batch does not
    need, so a worker holds about one task batch's rows, not the file."""

    def __init__(self, uri: str) -> None:
        import pyarrow as pa

        filesystem, path = resolve(uri)
        self._reader = pa.ipc.open_file(filesystem.open_input_file(path))
        self.schema = self._reader.schema
        rows = (self._reader.metadata or {}).get(_ROWS_PER_BATCH)
        self._rows_per_batch = (int(rows) if rows is not None
                                else self._reader.get_batch(0).num_rows)
        self._batches: dict[int, Any] = {}

    def _numbers(self, offset: int, length: int) -> range:
        per = self._rows_per_batch
        return range(offset // per, (offset + max(length, 1) - 1) // per + 1)

    def _batch(self, number: int) -> Any:
        batch = self._batches.get(number)
        if batch is None:
            batch = self._batches[number] = self._reader.get_batch(number)
        return batch

    def keep_only(self, spans: Any) -> None:
        """Hold the batches that the ``(offset, length)`` spans lie in, and no other."""
        wanted = sorted({number for offset, length in spans
                         for number in self._numbers(offset, length)})
        self._batches = {number: self._batch(number) for number in wanted}

    def slice(self, offset: int, length: int) -> Any:
        import pyarrow as pa

        numbers = self._numbers(offset, length)
        table = pa.Table.from_batches([self._batch(n) for n in numbers], self.schema)
        return table.slice(offset - numbers.start * self._rows_per_batch, length)
