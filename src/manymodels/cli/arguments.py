"""Checking the command line's arguments before any work: an option given
twice, a list option, a STORE that is no store. Each refusal is one line
naming the option at fault, exit status 2 (click's usage error)."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any, NoReturn

import typer
from typer.core import TyperGroup


def given_twice(command: Any, args: Sequence[str]) -> tuple[Any, list[str]] | None:
    """The first option of ``command`` that ``args`` give twice though it
    takes one value, with the two as given (``['--by store', '--by
    item']``), or a flag given both ways (``['--fallback',
    '--no-fallback']``), or None. Click keeps the last one silently: ``--by
    store --by item`` trained by item alone, ``-o a.csv -o b.csv`` wrote
    b.csv, ``--fallback --no-fallback`` trained without a fallback. Options
    meant to repeat (``multiple``, as ``--param`` and ``--grid``) are not
    counted, nor a flag given twice the same way; what follows ``--`` is not
    an option."""
    options = _options_of(command)
    seen: dict[str, list[str]] = {}
    flags: dict[str, dict[bool, str]] = {}  # a flag's forms given: primary (True) or --no-
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
            forms = flags.setdefault(param.name, {})
            forms.setdefault(name in getattr(param, "opts", []), name)
            if len(forms) > 1:  # --x ... --no-x: both ways
                return param, [forms[name not in param.opts], name]
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


def _options_of(command: Any) -> dict[str, Any]:
    """Each option name of ``command`` (``--by``, ``-o``, ``--no-fallback``) -> its param."""
    options: dict[str, Any] = {}
    for param in getattr(command, "params", []):
        for name in [*getattr(param, "opts", []), *getattr(param, "secondary_opts", [])]:
            if name.startswith("-"):
                options[name] = param
    return options


_NEGATIVE_NUMBER = re.compile(r"-(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?")


def negatives_as_arguments(command: Any, args: list[str]) -> list[str]:
    """``args`` with its options first, then ``--`` and its arguments in
    their order, where an argument is a negative number (a run id ``-1``, a
    key ``-5``): click reads a token that starts with ``-`` as an option,
    and refused ``show STORE -1`` with "No such option: -1" (a key -1 could
    not be named without ``--``). An option's value (``--limit -1``) stays
    its option's; ``args`` as they are where no argument is negative."""
    options = _options_of(command)
    before: list[str] = []
    arguments: list[str] = []
    index = 0
    while index < len(args):
        token = args[index]
        index += 1
        if token == "--":
            arguments += args[index:]
            break
        param = options.get(token.partition("=")[0] if token.startswith("--") else token[:2])
        if param is None and _NEGATIVE_NUMBER.fullmatch(token):
            arguments.append(token)
            continue
        if param is None or not token.startswith("-") or len(token) < 2:
            (before if token.startswith("-") and len(token) > 1 else arguments).append(token)
            continue
        before.append(token)
        attached = "=" in token if token.startswith("--") else len(token) > 2
        if not (getattr(param, "is_flag", False) or getattr(param, "count", False)
                or attached):  # its value follows (and may start with '-')
            before += args[index:index + param.nargs]
            index += param.nargs
    if not any(_NEGATIVE_NUMBER.fullmatch(token) for token in arguments):
        return args
    return [*before, "--", *arguments]


class OneValueGroup(TyperGroup):
    """The app's group: a command whose option taking one value is given
    twice, or whose flag is given both ways (``--x ... --no-x``), is refused
    before any work, naming the option (see :func:`given_twice`), exit
    status 2."""

    def resolve_command(self, ctx: Any, args: list[str]) -> tuple[Any, Any, list[str]]:
        name, command, rest = super().resolve_command(ctx, args)
        if command is not None:
            rest = negatives_as_arguments(command, rest)
        twice = given_twice(command, rest) if command is not None else None
        if twice is not None:
            param, given = twice
            flag = bool(getattr(param, "is_flag", False))
            raise typer.BadParameter(
                f"given both ways ({given[0]!r}, then {given[1]!r}): give one of them" if flag
                else f"given twice ({given[0]!r}, then {given[1]!r}); it takes one value: "
                "give it once" + (" (a list is comma-separated)" if param.name in _LISTS
                                  else ""),
                ctx=command.context_class(command, info_name=name, parent=ctx),
                param_hint="/".join([*param.opts, *(param.secondary_opts if flag else [])]))
        return name, command, rest


#: The options that take a comma-separated list in one value.
_LISTS = frozenset({"by", "features", "metrics"})


FORMAT_HELP = ("table (aligned; plain text when piped), csv or json (every column, "
               "full precision).")


def split_list(text: str | None) -> list[str]:
    """A comma-separated list's names; ``\\,`` is a comma inside a name
    (a column ``"a,b"``: ``--by 'a\\,b'``)."""
    import re

    parts = re.split(r"(?<!\\),", text or "")
    return [part.strip().replace("\\,", ",") for part in parts if part.strip()]


def column_list(text: str, columns: list[str], option: str) -> list[str]:
    """The columns of a table (of ``columns``) that ``option``'s ``text``
    names: its comma-separated names, or the one column it spells whole
    (a name holding a comma); refused where it could be either."""
    names, whole = split_list(text), text.strip()
    if len(names) < 2 or whole not in columns or "\\," in text:
        return names
    if all(name in columns for name in names):
        escaped = whole.replace(",", "\\,")
        fail(f"{text!r} names the column {whole!r} and the columns {names}: write "
             f"'{escaped}' for the one column", option)
    return [whole]


def fail(message: str, hint: str) -> NoReturn:
    raise typer.BadParameter(message, param_hint=hint)


def store_path(path: str | None) -> str | None:
    """A STORE argument (or ``--store``) given as a ``file:`` URI, as the path
    it names, so that ``file:///tmp/s`` is the store ``/tmp/s`` and not a
    folder named ``file:``; refused where it names no absolute path. The
    typer callback of every command's store."""
    return _local_path(path, "store")


def out_path(path: str | None) -> str | None:
    """An output file (``--out``, ``--json``) given as a ``file:`` URI, as the
    path it names, so that ``-o file:///tmp/p.csv`` writes ``/tmp/p.csv`` and
    not a file under a folder named ``file:``; ``-`` and ``/dev/stdout`` as
    they are. The typer callback of every command's output file."""
    return _local_path(path, "output")


def _local_path(path: str | None, argument: str) -> str | None:
    from ..inputs.fileuris import local_location

    try:
        return local_location(path, argument)
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from exc


def open_store(path: str, writes: bool = False):
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
            fail(str(exc), "STORE")
    if not Path(path).is_dir():
        raise typer.BadParameter(f"store {path!r} " + ("is a file, not a store's directory"
                                                       if Path(path).exists() else
                                                       "does not exist"), param_hint="STORE")
    check_store_index(path)
    try:
        return Store(path)
    except StoreError as exc:
        fail(str(exc), "STORE")


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
        fail(f"store index {str(index)!r} is empty (0 bytes): not a manymodels store "
              "index, or one cut to nothing", "STORE")
    try:
        check_existing_index(index)
    except StoreError as exc:
        fail(str(exc), "STORE")
