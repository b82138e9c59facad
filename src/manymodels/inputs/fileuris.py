"""A ``file:`` URI made the local path it names, wherever a path is taken (a
table, ``staging=``, a store, the CLI's STORE): ``file:///data/t``,
``file://localhost/data/t`` and ``file:/data/t`` all name ``/data/t``, as
RFC 8089, Python's ``urllib``, pyarrow and fsspec read them, in any case of
the scheme. Its ``%``-escapes are decoded, as pyarrow, pandas, polars and
``urllib`` do and as ``Path.as_uri()`` writes them (``a b`` as ``a%20b``, a
``%`` as ``%25``); fsspec alone keeps them. A ``#`` or ``?`` is part of the
path (a local path may hold them), not a fragment or a query to drop, as
fsspec reads it. One that names no absolute path (``file:data/t``, which
fsspec reads from the current directory and pyarrow refuses;
``file://data/t``, whose "host" was dropped) is refused, naming the
argument."""

from __future__ import annotations

import os
from typing import Any
from urllib.parse import unquote


def is_file_uri(given: Any) -> bool:
    """Whether ``given`` is a ``file:`` URI's text (any case of the scheme)."""
    return isinstance(given, str) and given[:5].lower() == "file:"


def local_location(given: Any, argument: str) -> Any:
    """``given`` as a path where it is a ``file:`` URI (see the module
    docstring; refused naming ``argument`` where it names no absolute
    path); anything else (a path, an object store's URI, a frame) as it is."""
    return file_uri_path(given, argument) if is_file_uri(given) else given


def file_uri_path(uri: str, argument: str) -> str:
    """The absolute local path that the ``file:`` URI ``uri`` names."""
    rest = uri[5:]
    if rest.startswith("//"):
        host, slash, path = rest[2:].partition("/")
        if host.lower() not in ("", "localhost"):
            named = unquote(host + slash + path)
            raise ValueError(f"{argument} {uri!r} names the host {host!r}: a local "
                             "file's URI is file:// and its absolute path (file:///data/"
                             f"t.parquet), or give the path itself ({named!r})")
        rest = slash + path
    if not rest.startswith("/"):
        named = unquote(rest) or "."
        raise ValueError(f"{argument} {uri!r} names no absolute path: a file: URI holds one "
                         "(file:///data/t.parquet, file:/data/t.parquet); for a path relative "
                         f"to the current directory give the path itself ({named!r})")
    path = unquote(rest)
    if path != rest and not os.path.lexists(path) and os.path.lexists(rest):
        raise ValueError(f"{argument} {uri!r} names {path!r} (a file: URI's %-escapes are "
                         f"decoded), which does not exist, where {rest!r} does: write its "
                         "'%' as '%25', or give the path itself")
    return path
