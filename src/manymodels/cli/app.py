"""The ``manymodels`` command line."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, BinaryIO, NoReturn

import typer
from typer.core import TyperGroup

from .._version import __version__


def given_twice(command: Any, args: Sequence[str]) -> tuple[Any, list[str]] | None:
    """The first option of ``command`` that ``args`` give twice though it
    takes one value, with the two as given (``['--by store', '--by
    item']``), or None. Click keeps the last one silently: ``--by store --by
    item`` trained by item alone, ``-o a.csv -o b.csv`` wrote b.csv.
    Options meant to repeat (``multiple``, as ``--param`` and ``--grid``) and
    flags are not counted; what follows ``--`` is not an option."""
    options: dict[str, Any] = {}
    for param in getattr(command, "params", []):
        for name in [*getattr(param, "opts", []), *getattr(param, "secondary_opts", [])]:
            if name.startswith("-"):
                options[name] = param
    seen: dict[str, list[str]] = {}
    index = 0
    while index < len(args):
        token = args[index]
        index += 1
        if token == "--":
            break
        if token.startswith("--"):
            name, attached, value = token.partition("=")
        elif token.startswith("-") and len(token) > 1:  # -o x, or -ox
            name, attached, value = token[:2], token[2:], token[2:]
        else:
            continue
        param = options.get(name)
        if param is None:  # an argument (a run id -1), or an unknown option: click says so
            continue
        if getattr(param, "is_flag", False) or getattr(param, "count", False):
            continue
        if not attached:  # its value follows (and may start with '-')
            value = " ".join(args[index:index + param.nargs])
            index += param.nargs
        if getattr(param, "multiple", False):
            continue
        seen.setdefault(param.name, []).append(f"{name} {value}".strip())
        if len(seen[param.name]) > 1:
            return param, seen[param.name]
    return None


class _OneValueGroup(TyperGroup):
    """The app's group: a command whose option taking one value is given
    twice is refused before any work, naming the option (see
    :func:`given_twice`), exit status 2."""

    def resolve_command(self, ctx: Any, args: list[str]) -> tuple[Any, Any, list[str]]:
        name, command, rest = super().resolve_command(ctx, args)
        twice = given_twice(command, rest) if command is not None else None
        if twice is not None:
            param, given = twice
            raise typer.BadParameter(
                f"given twice ({given[0]!r}, then {given[1]!r}); it takes one value: give it "
                "once" + (" (a list is comma-separated)" if param.name in _LISTS else ""),
                ctx=command.context_class(command, info_name=name, parent=ctx),
                param_hint="/".join(param.opts))
        return name, command, rest


#: The options that take a comma-separated list in one value.
_LISTS = frozenset({"by", "features", "metrics"})

app = typer.Typer(
    cls=_OneValueGroup,
    help="Train many ML models at once: one per group, per file or per setting.",
    no_args_is_help=True,
    add_completion=False,
)


def _print_version(value: bool) -> None:
    if value:
        typer.echo(f"manymodels {__version__}")
        raise typer.Exit()


@app.callback()
def _main(
    version: bool = typer.Option(False, "--version", callback=_print_version, is_eager=True,
                                 help="Print the version and exit."),
) -> None:
    """manymodels: train many models at once."""
    import sys

    for stream in (sys.stdout, sys.stderr):  # keys a narrow encoding lacks: escaped, not a crash
        if (getattr(stream, "encoding", "utf-8") or "").lower().replace("-", "") != "utf8":
            with contextlib.suppress(AttributeError, ValueError):
                stream.reconfigure(errors="backslashreplace")


@app.command()
def demo(
    stores: int = typer.Option(48, min=1, help="Stores in the generated table."),
    items: int = typer.Option(50, min=1, help="Items per store."),
    workers: int = typer.Option(None, min=1, help="Worker processes (default: usable cores)."),
    serial: bool = typer.Option(True, help="Also run the same tasks serially to compare."),
    json_out: str = typer.Option(None, "--json", help="Also write the numbers to this "
                                  "file (- for standard output)."),
) -> None:
    """Train a tuned Ridge per store x item of a generated sales table.

    Example: manymodels demo --stores 10 --items 20 --no-serial
    """
    from .demo import run_demo

    if json_out:
        _check_out(json_out, (".json",), "--json")
    numbers = run_demo(stores, items, workers=workers, compare_serial=serial)
    if json_out:
        with _written(json_out, "--json") as path:
            path.write_text(json.dumps(numbers, indent=2) + "\n")


def _open_store(path: str, writes: bool = False):
    """The store at ``path``, or a refusal naming STORE: a missing directory, or
    an index that is not a manymodels store's (random bytes, text, another
    program's SQLite file) is told in one line, not a traceback. A store on
    an object store opens for reading unless the command ``writes``."""
    from pathlib import Path

    from ..inputs.objectstores import is_remote, shown
    from ..run.store import Store
    from ..store import StoreError, remote_store_exists

    if is_remote(path):  # a store on an object store, as published
        try:  # (opened for reading, a store nothing was published to is refused by Store)
            if writes and not remote_store_exists(path):
                raise typer.BadParameter(f"store {shown(path)!r} does not exist (nothing "
                                         "was published there)", param_hint="STORE")
            return Store(path, read_only=None if writes else True)
        except StoreError as exc:
            _fail(str(exc), "STORE")
    if not Path(path).is_dir():
        raise typer.BadParameter(f"store {path!r} " + ("is a file, not a store's directory"
                                                       if Path(path).exists() else
                                                       "does not exist"), param_hint="STORE")
    check_store_index(path)
    try:
        return Store(path)
    except StoreError as exc:
        _fail(str(exc), "STORE")


def check_store_index(path: str) -> None:
    """A local store's index, refused naming STORE unless it is a manymodels
    store's: checked read-only, so that a command that only reads makes
    nothing where there is no store (an empty ``index.sqlite`` included)."""
    from pathlib import Path

    from ..store import StoreError, check_existing_index

    index = Path(path) / "index.sqlite"
    if not index.is_file():  # nothing made where only reading
        raise typer.BadParameter(f"{path!r} is not a manymodels store (it has no "
                                 "index.sqlite)", param_hint="STORE")
    if index.stat().st_size == 0:
        _fail(f"store index {str(index)!r} is empty (0 bytes): not a manymodels store "
              "index, or one cut to nothing", "STORE")
    try:
        check_existing_index(index)
    except StoreError as exc:
        _fail(str(exc), "STORE")


#: Suffixes that name a file format: an output named with another format's
#: (``-o out.json`` for CSV) is refused; any other name is written as asked.
_FORMAT_SUFFIXES = frozenset({".csv", ".tsv", ".txt", ".json", ".parquet", ".pq", ".xlsx",
                              ".xls", ".html", ".htm", ".feather", ".arrow", ".orc", ".avro"})


def _check_out(out: str, suffixes: tuple[str, ...] = (), option: str = "--out") -> None:
    """An output file's place, checked before any work (the work was lost to a
    traceback when its directory was missing): a file, in a directory that
    exists and may be written, not named as a format other than
    ``suffixes``' (what it is written as), unless it is a device
    (``/dev/stdout``)."""
    import os
    from pathlib import Path

    target = Path(out)
    if target.is_dir():
        _fail(f"{out!r} is a directory: name a file", option)
    if not target.parent.is_dir():
        _fail(f"the directory of {out!r} does not exist", option)
    if is_device(out) or (target.exists() and not target.is_file()):
        return  # a device or a pipe: written as it is
    suffix = target.suffix.lower()
    if suffixes and suffix in _FORMAT_SUFFIXES and suffix not in suffixes:
        _fail(f"{out!r} would be written as {suffixes[0].lstrip('.')}, not {suffix}: name a "
              f"{' or '.join(suffixes)} file", option)
    if not os.access(target if target.exists() else target.parent, os.W_OK):
        _fail(f"{out!r} cannot be written here (permissions)", option)


@contextlib.contextmanager
def _written(out: str, option: str = "--out") -> Iterator[Path]:
    """The path to write ``out``'s content to: a temporary file beside it,
    moved into place once written whole (a failed or cut-short write leaves
    no half file, and an earlier one as it was); a device is written in
    place. A write that fails is said in one line, exit code 1."""
    import os
    import shutil
    import tempfile

    if is_device(out):  # made whole in a temporary file, then its bytes sent on
        with tempfile.TemporaryDirectory(prefix="manymodels-out-") as folder:
            temporary = Path(folder, "out")
            try:
                yield temporary
                descriptor = inherited_descriptor(out)
                with open(temporary, "rb") as made:
                    if descriptor is None:  # /dev/null, /dev/full, a named pipe
                        with open(out, "wb") as device:
                            shutil.copyfileobj(made, device)
                    else:
                        _send(made, descriptor)
            except OSError as exc:
                _write_failed(out, option, exc)
        return
    target = Path(out).resolve()  # (a link: the file it names is replaced, not the link)
    in_place = target.exists() and not target.is_file()
    temporary = target if in_place else target.with_name(f".{target.name}.{os.getpid()}.tmp")
    try:
        yield temporary
        if not in_place:
            if target.exists():  # the new file keeps the old one's permissions
                os.chmod(temporary, target.stat().st_mode & 0o7777)
            os.replace(temporary, target)
    except OSError as exc:
        _write_failed(out, option, exc)
    finally:
        if not in_place:
            temporary.unlink(missing_ok=True)


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


def _send(made: BinaryIO, descriptor: int) -> None:
    """``made``'s bytes written to ``descriptor`` at its own offset (an
    appending one appends), after whatever the command printed before;
    standard output and error through Python's streams, so that what they
    hold is flushed first and what is written stays in order."""
    import os
    import shutil
    import sys

    stream = {1: sys.stdout, 2: sys.stderr}.get(descriptor)
    for each in (sys.stdout, sys.stderr):
        if each is not None:
            each.flush()
    binary = getattr(stream, "buffer", None)
    if binary is not None:
        shutil.copyfileobj(made, binary)
        binary.flush()
        return
    with os.fdopen(descriptor, "wb", closefd=False) as target:  # (it writes what a pipe
        shutil.copyfileobj(made, target)                       # takes in parts whole)


def _write_failed(out: str, option: str, exc: OSError) -> NoReturn:
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


_FORMAT_HELP = ("table (aligned; plain text when piped), csv or json (every column, "
                "full precision).")


def _split_list(text: str | None) -> list[str]:
    return [part.strip() for part in (text or "").split(",") if part.strip()]


def _fail(message: str, hint: str) -> NoReturn:
    raise typer.BadParameter(message, param_hint=hint)


if __name__ == "__main__":  # pragma: no cover
    app()
