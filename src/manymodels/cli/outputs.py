"""Writing a command's output file: checked before any work, made whole in a
temporary file and moved into place (a failed write leaves no half file),
or sent to the descriptor the shell gave (``-``, ``/dev/stdout``)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO, NoReturn

import typer

from .arguments import fail

#: Suffixes that name a file format: an output named with another format's
#: (``-o out.json`` for CSV) is refused; any other name is written as asked.
#: A compression's (``-o out.csv.gz``) too: the output is not compressed, and
#: a reader that goes by the name (pandas, ``zcat``) would fail on it.
FORMAT_SUFFIXES = frozenset({".csv", ".tsv", ".txt", ".json", ".parquet", ".pq", ".xlsx",
                              ".xls", ".html", ".htm", ".feather", ".arrow", ".orc", ".avro",
                              ".gz", ".bz2", ".xz", ".zst", ".zip", ".tar", ".7z", ".lz4"})


def check_out(out: str, suffixes: tuple[str, ...] = (), option: str = "--out") -> None:
    """An output file's place, checked before any work (the work was lost to a
    traceback when its directory was missing): a file, in a directory that
    exists and may be written, not named as a format other than
    ``suffixes``' (what it is written as), unless it is a device
    (``/dev/stdout``)."""
    import os
    from pathlib import Path

    target = Path(out)
    if target.is_dir():
        fail(f"{out!r} is a directory: name a file", option)
    if not target.parent.is_dir():
        fail(f"the directory of {out!r} does not exist", option)
    if is_device(out) or (target.exists() and not target.is_file()):
        return  # a device or a pipe: written as it is
    suffix = target.suffix.lower()
    if suffixes and suffix in FORMAT_SUFFIXES and suffix not in suffixes:
        fail(f"{out!r} would be written as {suffixes[0].lstrip('.')}, not {suffix}: name a "
              f"{' or '.join(suffixes)} file", option)
    if not os.access(target if target.exists() else target.parent, os.W_OK):
        fail(f"{out!r} cannot be written here (permissions)", option)


def check_binary_out(out: str, what: str, option: str = "--out") -> None:
    """Refuse, before any work, to write ``what`` (a binary format: Parquet)
    to a terminal (``-o -`` not redirected): its bytes would be sent to the
    terminal as commands, never saved."""
    import os

    descriptor = inherited_descriptor(out)
    try:
        terminal = (os.isatty(descriptor) if descriptor is not None else is_device(out)
                    and os.path.realpath(out).startswith(("/dev/tty", "/dev/pts/",
                                                          "/dev/console")))
    except OSError:  # (a descriptor that is not open: said when written)
        terminal = False
    if terminal:
        fail(f"{out!r} is a terminal, and {what} is binary: redirect it to a file "
             f"(> results.parquet) or a pipe, or name a file", option)


def check_out_of_store(out: str, store: str, option: str = "--out") -> None:
    """Refuse an output that would replace a file of the store the command
    reads (``export models/ -o models/index.sqlite``, a slip of the
    keyboard): its index, or anything in its folders (``artifacts/``),
    whose loss is the store's. A file beside the index
    (``models/report.html``) is the user's to write."""
    from ..inputs.objectstores import is_remote
    from ..store.database import INDEX_NAME

    if is_device(out) or is_remote(store):
        return
    root, target = Path(store).resolve(), Path(out).resolve()
    if root not in target.parents:
        return
    inside = target.relative_to(root)
    if len(inside.parts) > 1 or inside.name.startswith(INDEX_NAME):
        fail(f"{out!r} is a file of the store {store!r}, which writing it would "
             "damage: name a file outside the store's index and folders", option)


@contextlib.contextmanager
def written(out: str, option: str = "--out") -> Iterator[Path]:
    """The path to write ``out``'s content to: a temporary file beside it,
    moved into place once written whole (a failed or cut-short write leaves
    no half file, and an earlier one as it was); a device is written in
    place. A write that fails is said in one line, exit code 1."""
    import os
    import shutil
    import tempfile

    if is_device(out):  # made whole in a temporary file, then its bytes sent on
        with tempfile.TemporaryDirectory(prefix="manymodels-out-") as folder, \
                terminated_as_exit():
            temporary = Path(folder, "out")
            try:
                yield temporary
                descriptor = inherited_descriptor(out)
                with open(temporary, "rb") as made:
                    if descriptor is None:  # /dev/null, /dev/full, a named pipe
                        with open(out, "wb") as device:
                            shutil.copyfileobj(made, device)
                    else:
                        send(made, descriptor)
            except OSError as exc:
                write_failed(out, option, exc)
        return
    target = Path(out).resolve()  # (a link: the file it names is replaced, not the link)
    in_place = target.exists() and not target.is_file()
    if not in_place:  # those a killed command (kill -9) left beside it
        from ..store.wholefiles import remove_stale_temporaries

        remove_stale_temporaries(target)
    temporary = target if in_place else target.with_name(f".{target.name}.{os.getpid()}.tmp")
    try:
        with terminated_as_exit():
            yield temporary
        if not in_place:
            if target.exists():  # the new file keeps the old one's permissions
                os.chmod(temporary, target.stat().st_mode & 0o7777)
            os.replace(temporary, target)
    except OSError as exc:
        write_failed(out, option, exc)
    finally:
        if not in_place:
            temporary.unlink(missing_ok=True)


@contextlib.contextmanager
def terminated_as_exit() -> Iterator[None]:
    """SIGTERM (``kill``, a scheduler's timeout) as an exit, status 143
    (128 + SIGTERM, what the shell reports of a process it killed), so that
    the ``finally`` clauses run: killed outright, a command writing a large
    output left its temporary file (``.out.csv.1234.tmp``) beside the
    output. As it was outside the main thread, where no handler can be set."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def _exit(number: int, frame: object) -> NoReturn:
        raise SystemExit(128 + number)

    previous = signal.signal(signal.SIGTERM, _exit)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def inherited_descriptor(out: str) -> int | None:
    """The file descriptor this process inherited that ``out`` names (``-``
    and ``/dev/stdout``: 1, ``/dev/stderr``: 2, ``/dev/fd/N`` and
    ``/proc/self/fd/N``: N), or None. Such an output is written to that
    descriptor, never reopened by its name: on Linux opening
    ``/dev/stdout`` opens the redirected file anew and truncates it, which
    lost what ``>>`` appended to, or what the shell wrote before the
    command in ``{ echo HEADER; manymodels ...; } > file``."""
    import os

    if out in ("-", "/dev/stdout"):
        return 1
    if out == "/dev/stderr":
        return 2
    for prefix in ("/dev/fd/", "/proc/self/fd/", f"/proc/{os.getpid()}/fd/"):
        number = out[len(prefix):] if out.startswith(prefix) else ""
        if number.isascii() and number.isdigit():
            return int(number)
    return None


def send(made: BinaryIO, descriptor: int) -> None:
    """``made``'s bytes written to ``descriptor`` at its own offset (an
    appending one appends), after whatever the command printed before;
    standard output and error through Python's streams, so that what they
    hold is flushed first and what is written stays in order. A pipe whose
    reader closed it early (``| head -1``) ends the command quietly, see
    :func:`pipe_closed`."""
    import os
    import shutil
    import sys

    stream = {1: sys.stdout, 2: sys.stderr}.get(descriptor)
    try:
        for each in (sys.stdout, sys.stderr):
            if each is not None:
                each.flush()
        binary = getattr(stream, "buffer", None)
        if binary is not None:
            shutil.copyfileobj(made, binary)
            binary.flush()
            return
        with os.fdopen(descriptor, "wb", closefd=False) as target:  # (it writes what a
            shutil.copyfileobj(made, target)                       # pipe takes in parts)
    except BrokenPipeError as exc:
        pipe_closed(descriptor, exc)


def pipe_closed(descriptor: int, exc: BrokenPipeError) -> NoReturn:
    """A reader that closed the pipe before the end (``manymodels predict
    STORE DATA -o - | head -1``), as a shell does all the time: the command
    ends quietly, no error line, exit status 1, as typer ends any command
    whose printing meets a closed pipe (and Python's documentation advises).
    The descriptor is pointed at ``/dev/null`` first, so that what Python's
    streams still hold is flushed there at exit, not failed on again."""
    import os

    with contextlib.suppress(OSError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, descriptor)
        os.close(devnull)
    raise typer.Exit(1) from exc


def write_failed(out: str, option: str, exc: OSError) -> NoReturn:
    """A write of ``out`` that failed, said in one line: exit code 1."""
    typer.echo(f"Error: cannot write {option} {out!r}: {exc.strerror or exc}", err=True)
    raise typer.Exit(1) from exc


def is_device(out: str) -> bool:
    """Whether ``out`` names a device (``-`` or ``/dev/stdout``: the shell's
    pipe, or the file it redirected to): written in place (see
    :func:`inherited_descriptor`), and what a command says of it goes to
    standard error."""
    return out == "-" or out.startswith(("/dev/", "/proc/"))


def out_name(out: str) -> str:
    """``out`` as a command's summary names it (``-``: standard output)."""
    return "standard output" if out == "-" else out


def said(message: str, out: str) -> None:
    """A command's one line about what it wrote, kept out of ``out``'s way."""
    typer.echo(message, err=is_device(out))
