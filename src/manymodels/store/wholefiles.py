"""Files written whole or not at all (``Store.export``): under a temporary
name beside the target, renamed over it once complete, and the temporary
files of writes that were killed removed by the next write to the target."""

from __future__ import annotations

from pathlib import Path

import pandas as pd


def write_whole(frame: pd.DataFrame, path: Path) -> None:
    """``frame`` as the Parquet file ``path``, whole or not at all: written
    beside it under a temporary name, then renamed over it, so that a write
    cut short (a full disk) leaves no half file, and an earlier export at
    ``path`` stays as it was. The error names the file. The temporary
    name holds the writer's process id: one a killed export left is
    removed by the next export to ``path`` (:func:`remove_stale_temporaries`)."""
    import os
    import uuid

    remove_stale_temporaries(path)
    # (a name of its own, made by the write: the file gets the umask's mode)
    temporary = path.with_name(f".{path.name}.{os.getpid()}.{uuid.uuid4().hex[:12]}.tmp")
    try:
        frame.to_parquet(temporary, index=False)
        os.replace(temporary, path)
    except BaseException as exc:
        temporary.unlink(missing_ok=True)
        if isinstance(exc, OSError):
            said = f"cannot write the export {str(path)!r}: {exc.strerror or exc}"
            raise (OSError(said) if exc.errno is None else OSError(exc.errno, said)) from exc
        raise


#: How long a temporary file of an export whose process is gone is left:
#: a process of another machine writing beside it (a shared folder) has an
#: id this machine does not know, and its file is written to as it goes.
STALE_TEMPORARY_S = 60.0


def remove_stale_temporaries(path: Path) -> int:
    """Remove the temporary files of earlier writes of ``path`` that were
    killed before they could (``.NAME.PID.tmp``, the command line's,
    ``.NAME.PID.HEX.tmp``, :func:`write_whole`'s): those whose process
    is not running on this machine and that no one wrote to for
    :data:`STALE_TEMPORARY_S`. How many were removed."""
    import re
    import time

    import psutil

    own = re.compile(rf"\.{re.escape(path.name)}\.(\d+)(?:\.[0-9a-f]{{12}})?\.tmp")
    removed = 0
    try:
        beside = list(path.parent.iterdir())
    except OSError:  # (a folder that is not there is said by the write itself)
        return 0
    for file in beside:
        found = own.fullmatch(file.name)
        if found is None or psutil.pid_exists(int(found[1])):
            continue
        try:
            if time.time() - file.lstat().st_mtime > STALE_TEMPORARY_S:
                file.unlink()
                removed += 1
        except OSError:  # gone meanwhile, or not this user's to remove
            continue
    return removed
