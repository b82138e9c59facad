"""Dataframe transforms on the same engine: :func:`map_groups` and
:func:`map_partitions` run a function per group or per row partition in
parallel and return one concatenated table."""

from __future__ import annotations

import contextlib
import inspect
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from .api import train
from .engine.checkpointspace import asks_for_checkpoint
from .engine.options import (
    check_fit_takes_shared,
    check_shared,
    check_start_method,
    check_switch,
    positive_int,
)
from .inputs.engineframes import refuse_engine_frame
from .inputs.grids import ProductSource
from .inputs.grouplabels import (
    WithLabels,
    shared_labels,
)
from .inputs.sources import GroupSource, PartitionSource, groups
from .machine import usable_cores
from .planning.plan import asks_for_key, group_layout
from .run.engineoutputs import EngineOutputs, engine_source, refuse_named_key
from .run.groupfailures import (
    WithFallback,
    failures,
    fallen_back,
    refuse_dict_outputs,
    report_failures,
)
from .run.groupoutputs import assemble
from .run.outputconcat import check_table, concat_outputs
from .run.partitioncost import LEFT_TO_US, attach_summary, decide, run_in_process, with_split
from .run.results import Run


def _ok_outputs(run: Run, errors: str, what: str) -> tuple[list[str], list[tuple[tuple, Any]]]:
    key_columns, outputs = run._ok_outputs()
    failed = run.failed
    if errors == "raise" and len(failed):
        row = failed.iloc[0]
        key = tuple(_plain(row[c]) for c in key_columns)
        named = key[0] if len(key) == 1 else key
        raise RuntimeError(
            f"{what}: {len(failed)} task(s) failed; the first, {named!r}, with:\n{row['error']}"
        )
    return key_columns, outputs


def _plain(value: Any) -> Any:
    """A key value as Python holds it: a NumPy number's repr
    (``np.int64(2)``) would name partition 2 or group 2 in NumPy's words."""
    return value.item() if isinstance(value, np.generic) else value


def _check_arguments(fn: Any, errors: str, options: dict[str, Any]) -> None:
    """Refuse, before any work, a ``fn`` that cannot be called, one that
    takes no rows, or one that needs a ``checkpoint`` (wrapped, it would
    have been called on every group, each failing), and an unknown ``errors``."""
    if not callable(fn):
        raise TypeError(f"fn must be a function of a group's (or partition's) rows, got "
                        f"{type(fn).__name__}")
    if _takes_no_rows(fn):
        raise TypeError("fn takes no parameter for its rows: every group (or partition) "
                        "would fail; give it one, fn(rows)")
    setup = options.get("setup")
    given = {*(options.get("shared") or {}), *(setup if isinstance(setup, dict) else ())}
    if _needs_checkpoint(fn) and "checkpoint" not in given:
        raise TypeError("fn takes a checkpoint, which map_groups and map_partitions do not "
                        "give (a transform's groups are run afresh, not resumed): give the "
                        "parameter a default, or train with mm.train, which gives one")
    if errors not in ("raise", "skip"):
        raise ValueError(f"errors must be 'raise' or 'skip', got {errors!r}")


#: The keywords ``train`` takes, which the transforms hand it, and those of ``mm.groups``.
_TRAIN_TAKES = frozenset(name for name, parameter in inspect.signature(train).parameters.items()
                         if parameter.kind is parameter.KEYWORD_ONLY)
_GROUPS_TAKES = frozenset(inspect.signature(groups).parameters)


def _refuse_unknown_keywords(options: dict[str, Any], what: str) -> None:
    """Refuse, as Python would for ``what`` (the function the user called), a
    keyword that neither it nor :func:`train` takes: ``train`` refused it
    once the table was grouped, in its own name. A keyword of ``mm.groups``
    or of the other transform is pointed there."""
    for name in options:
        if name in _TRAIN_TAKES:
            continue
        where = ("map_groups" if name == "fallback" and what == "map_partitions" else
                 "map_partitions" if name == "partitions" and what == "map_groups" else
                 "mm.groups(...)" if name in _GROUPS_TAKES and (
                     what == "map_groups") else None)
        hint = "" if where is None else f" ({where} takes it)"
        raise TypeError(f"{what}() got an unexpected keyword argument {name!r}{hint}")


def _check_takes_keywords(source: Any, options: dict[str, Any], what: str,
                          **functions: Any) -> None:
    """Refuse, before any group runs, a function that lacks a keyword every
    group would hand it (a ``shared`` name) or needs one no group gives:
    ``train`` cannot tell, as it is handed ``fn`` wrapped in a function of
    any keywords (:class:`WithLabels`, :class:`WithFallback`), and every
    group failed with the same ``TypeError``; nor where ``map_partitions``
    calls ``fn`` itself. The error, after ``what``, names the function."""
    shared = options.get("shared")
    if shared is not None:
        check_shared(shared)
    for name, function in functions.items():
        if function is None:
            continue
        try:
            check_fit_takes_shared(function, source, shared, options.get("setup"))
        except (TypeError, ValueError) as error:
            raise _naming(error, name, what) from None


def _naming(error: Exception, name: str, what: str) -> Exception:
    """``error`` of ``train``'s check of its ``fit``, saying ``name`` (the
    argument the user gave: ``fn``, ``fallback``) where it said ``fit``,
    a name the call never used."""
    import re

    return type(error)(what + re.sub(r"\bfit\b", name, str(error)))


def _takes_no_rows(fn: Any) -> bool:
    """Whether ``fn`` has no parameter the rows can be handed to (positionally)."""
    try:
        parameters = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):  # a signature that cannot be read: not judged
        return False
    return not any(p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.VAR_POSITIONAL)
                   for p in parameters)


def _needs_checkpoint(fn: Any) -> bool:
    """Whether ``fn`` has a ``checkpoint`` parameter without a default."""
    if not asks_for_checkpoint(fn):
        return False
    parameter = inspect.signature(fn).parameters["checkpoint"]
    return parameter.default is inspect.Parameter.empty


def _facts_pay(options: dict[str, Any]) -> bool:
    """Whether the outputs should travel as
    :class:`~manymodels.inputs.grouplabels.FrameFacts`: they save
    the driver unpickling a frame per group, so only for a backend whose
    outputs cross a process boundary (elsewhere judging them costs more than
    it saves), and not into a store, which keeps each as ``fn`` returned it."""
    return options.get("store") is None and options.get("backend", "processes") not in (
        "serial", "threads")


def map_groups(
    fn: Callable[..., Any],
    source: GroupSource | ProductSource,
    *,
    errors: str = "raise",
    fallback: Callable[..., Any] | None = None,
    **options: Any,
) -> Any:
    """Run ``fn`` on every group and return one concatenated table, like
    ``df.groupby(by, group_keys=False).apply(fn)`` in parallel.

    ``fn`` receives each group's rows as ``mm.train`` hands them, a pandas
    group under its rows' labels in the input frame (their positions for an
    Arrow or polars table or a file; :mod:`manymodels.inputs.grouplabels`), and may
    return a DataFrame, a Series, an Arrow or polars table or one value. What comes back:

    * a **transform** -- every output (DataFrame or Series) holds its group's
      rows, in order, under the labels ``fn`` received (a pandas group under
      its rows' labels: not one of another ``format=``, nor one under a
      ``shared`` object named ``key``, which come in key order; ``df.assign(...)``,
      ``df["x"] - df["x"].mean()``; groups whose output is empty are left
      out): the rows come back in the input's row order, under the input
      frame's row labels (an Arrow or polars table, or a file, has none: its
      row positions 0, 1, ...), so that ``df["z"] = map_groups(...)["z"]``
      aligns, as with pandas (which keeps a Series in group order; its labels
      are the same);
    * any other DataFrame (an aggregation, a filter): the outputs in key
      order, under a fresh index 0, 1, ...; an output's index that holds
      values (``groupby("day").sum()``, ``set_index``, ``describe()``) as
      columns after the keys, one of row labels (a filter's) dropped, judged
      once for all outputs whose index has the same level names;
    * a Series of the same labels from every group (``df[["x", "y"]].mean()``;
      in any order, as a dict built by group may order them): one row per
      group, in key order, each value in its label's column;
    * other Series (``df["c"].value_counts()``, whose labels differ by
      group): concatenated in key order, under a MultiIndex of the key
      columns and the labels ``fn`` gave, as pandas' ``groupby().apply``
      makes it (the labels alone would not say which group a row is of);
    * one value (a number, a text) from every group: a Series of them under
      the key columns, as pandas' ``groupby().apply`` makes it;
    * Arrow or polars tables: concatenated in key order, their columns'
      types unified as Arrow's permissive concat unifies them (int and
      float: float; a column some lack: null there); a column whose types
      have none in common (a number and a text) raises a TypeError naming
      it, for polars too, whose own relaxed concat would make it text.

    Key columns missing from a table ``fn`` returns are added in front. With
    a grid (``groups * grid``) the outputs come in key order, a group's rows
    once per setting, under a fresh index. With ``errors="raise"`` (default) a
    failing group raises an error naming it; with ``errors="skip"`` its rows
    are left out, a ``RuntimeWarning`` names them with the reason, and a
    pandas result's ``attrs["failed"]`` maps each one's key to its traceback
    (every group failed: an empty table of the source's ``format``, polars,
    Arrow or else pandas, the kind ``fn``'s outputs would have been).
    ``fallback``: a function called on a group's rows (with the same
    keywords) where ``fn`` raises, whose output takes the place of ``fn``'s
    (statsforecast's ``fallback_model``); a pandas result's
    ``attrs["fallback"]`` maps those groups' keys to ``fn``'s traceback.
    Other keywords go to :func:`train` (``backend``, ``workers``, ``shared``, ...).

    ``source`` may be a Spark or Dask DataFrame (with ``by=`` and
    ``mm.groups``' other keywords), or ``mm.groups`` of one: its engine
    groups the rows, each group's output is written by the worker that ran
    it, and the result is a DataFrame of that engine reading those files: the
    outputs in key order, never on the driver (:mod:`manymodels.run.engineoutputs`).
    """
    _check_arguments(fn, errors, options)
    source, in_engine = engine_source(source, options)
    _refuse_unknown_keywords(options, "map_groups")
    base = source.base if isinstance(source, ProductSource) else source
    if not isinstance(base, GroupSource):
        raise TypeError("map_groups needs a source made by mm.groups(...)")
    if fallback is not None and not callable(fallback):
        raise TypeError("fallback must be a function of a group's rows, got "
                        f"{type(fallback).__name__}")
    if in_engine is not None:  # (its own word on a keyword named key)
        refuse_named_key(source, options.get("shared"), options.get("setup"))
    _check_takes_keywords(source, options, "map_groups: ", fn=fn, fallback=fallback)
    if fallback is not None:
        fn = WithFallback(fn, fallback)
    options.setdefault("progress", False)
    labelled = in_engine is None and source is base and base.format == "pandas" and (
        "key" not in (options.get("shared") or {}))
    if labelled:  # each group under its rows' labels
        options["shared"] = {**(options.get("shared") or {}),
                             **shared_labels(group_layout(base), base.row_index)}
        fn = WithLabels(fn, asks_for_key(fn), facts=_facts_pay(options))
    written = None if in_engine is None else EngineOutputs(
        in_engine, source, fn, options.get("shared"), options.get("setup"))
    with written or contextlib.nullcontext():  # a failed run leaves no outputs behind
        run = train(fn if written is None else written.fn, source, **options)
        refuse_dict_outputs(run, "map_groups")
        key_columns, ok = _ok_outputs(run, errors, "map_groups")
        failed = failures(run, key_columns) if errors == "skip" else {}
        fell_back = fallen_back(run) if fallback is not None else None
        if written is not None:  # written by the workers, read by the engine's
            try:
                frame = written.frame([out for _, out in ok if out is not None])
            except ValueError:  # no output at all: say first which groups failed
                report_failures(None, failed, fell_back)
                raise
            return report_failures(frame, failed, fell_back)
    return report_failures(assemble(run, base, source, key_columns, ok, labelled), failed,
                           fell_back)


def _asked_split(source: PartitionSource, asked: int | None, errors: str,
                 options: dict[str, Any]) -> str:
    """The summary's ``split`` line for a split the call chose: as many
    partitions as it asked, or as many as the table has rows (one, at least);
    or, where it asked for none but gave a keyword that only a split run
    takes (``backend=``, ``store=``, ``errors="skip"``...), the default
    number, untimed, naming those keywords (they, not the call's partitions,
    made it split)."""
    made, rows = source.partitions, source.num_rows
    split = f"split into {made} partition{'' if made == 1 else 's'}"
    if asked is None:
        given = [f"{name}=" for name in sorted(set(options) - LEFT_TO_US)]
        if errors != "raise":
            given.append(f"errors={errors!r}")
        return (f"{split} (four per worker, at most one per row), not timed: the call "
                f"gave {', '.join(given)}, which only a split run takes")
    if made == asked:
        return f"{split}, as the call asked"
    return f"{split}: the call asked for {asked}, and the table has {rows} row" + (
        "" if rows == 1 else "s")


def _check_left_options(options: dict[str, Any]) -> None:
    """Refuse, before ``fn`` is timed or run in this process, a bad value of
    the keywords that leave the split to the cost model: ``train``, which
    checks them, is not called where the table is not split."""
    if "progress" in options:
        check_switch("progress", options["progress"])
    check_start_method(options.get("start_method", "auto"))


def map_partitions(
    fn: Callable[..., Any],
    table: Any,
    partitions: int | None = None,
    *,
    format: str = "pandas",
    errors: str = "raise",
    **options: Any,
) -> Any:
    """Run ``fn`` on row partitions of one large table, in parallel, and return
    the outputs concatenated in row order.

    The table is shared with the workers once (zero-copy); each task is an
    ``(offset, length)`` slice, handed to ``fn`` as ``format`` (``"pandas"``,
    ``"arrow"``, ``"polars"`` or ``"numpy"``). A pandas table handed to a
    pandas ``fn`` stays pandas: each partition is a view of its rows (index
    included; ``fn`` must not modify it in place), and the result keeps the
    row labels ``fn`` returns; an Arrow or polars table's partitions come to
    a pandas ``fn`` under their rows' positions, so that the result is
    ``fn(table.to_pandas())``'s, split or not. ``partitions`` defaults to four per worker.
    ``fn`` may return a pandas, polars or Arrow table (or a Series); the
    result is of the same kind (with ``errors="skip"``, every partition
    failed: an empty table of ``format``'s kind). Other keywords go to
    :func:`train`.

    Never slower than ``fn(table)`` by more than its trials: unless the call
    says how to split (``partitions``, ``backend``, ``errors="skip"``, or
    any keyword but ``workers``, ``shared``, ``progress`` and
    ``start_method``: ``store``...), ``fn`` is first timed on one row and on a slice of
    about 1% of the rows (each repeated, or the slice doubled, only while it
    is too quick to time), and where splitting cannot pay
    (a fast function, a small table) it runs once, in this process, on the
    whole table
    (:mod:`manymodels.run.partitioncost`). A pandas result's
    ``attrs["summary"]`` is the run's summary, which says which and why.
    """
    _check_arguments(fn, errors, options)
    _refuse_unknown_keywords(options, "map_partitions")
    refuse_engine_frame(table, "map_partitions' table", "map_partitions splits a table "
                        "that this process holds", "or use the engine's own map over "
                        "partitions (Spark's mapInPandas, Dask's map_partitions)")
    began = time.perf_counter()
    workers = usable_cores() if options.get("workers") is None else positive_int(
        "workers", options["workers"])
    if partitions is not None:  # (a NumPy integer is an integer too)
        partitions = positive_int("partitions", partitions)
    _check_left_options(options)
    left_to_us = partitions is None and errors == "raise" and set(options) <= LEFT_TO_US
    source = PartitionSource(table, 4 * workers if partitions is None else partitions,
                             format=format)
    options.setdefault("progress", False)
    if left_to_us:  # before fn is timed, or called in this process: train's check
        _check_takes_keywords(source, options, "", fn=fn)
    decision = decide(fn, source, workers, options) if left_to_us else None
    if decision is not None and not decision.split:
        output, summary = run_in_process(fn, source, options, decision, began)
        return attach_summary(check_table(output, "map_partitions"), summary, table)
    run = train(fn, source, **options)
    refuse_dict_outputs(run, "map_partitions")
    key_columns, ok = _ok_outputs(run, errors, "map_partitions")
    result = concat_outputs([output for _, output in ok], "map_partitions",
                            keep_index=source.format == "pandas",
                            format=source.format,
                            names=[f"partition {_plain(key[0])}" for key, _ in ok])
    reason = decision.reason if decision is not None else _asked_split(
        source, partitions, errors, options)
    result = attach_summary(result, with_split(run.summary(), reason), table)
    failed = failures(run, key_columns) if errors == "skip" else {}
    return report_failures(result, failed, None, "map_partitions", "partition")

