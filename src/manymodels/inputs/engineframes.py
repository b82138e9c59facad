"""Tables that live in an engine: a Spark or a Dask DataFrame, or a Ray Dataset,
given to ``mm.groups``.

Such a table is never read here. The source keeps the engine's DataFrame
(its columns checked at once, before any work), and the planner has the
engine group it (:mod:`manymodels.planning.staging`): one shuffle by key on
the engine's workers, each partition sorted and written once, and only one
small row per group back to the driver.

Recognised by the class's module, so that neither PySpark, Dask nor Ray is
imported to ask.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .fileuris import local_location
from .objectstores import check_location, is_remote

#: The engines whose tables ``mm.groups`` takes, by the top of their module
#: and the names of their classes.
_ENGINE_CLASSES = {"pyspark": ("spark", ("DataFrame",)), "dask": ("dask", ("DataFrame",)),
                   "ray": ("ray", ("Dataset", "MaterializedDataset"))}
#: What a user calls each engine's table, in errors.
TABLE_NAMES = {"spark": "Spark DataFrame", "dask": "Dask DataFrame", "ray": "Ray Dataset"}
#: The columns the engine's workers add after a group's key columns when they
#: stage it (planning/staging.py): no key column may have one of these names.
STAGED_INDEX_COLUMNS = ("__file__", "__offset__", "__length__", "__lane_a__", "__lane_b__")
#: How a user brings an engine's DataFrame to the driver, where a call needs its rows there.
_COLLECT = {"spark": "spark_df.toPandas()", "dask": "dask_df.compute()",
            "ray": "ray_dataset.to_pandas()"}


def engine_of(table: Any) -> str | None:
    """``"spark"`` for a Spark DataFrame, ``"dask"`` for a Dask DataFrame,
    ``"ray"`` for a Ray Dataset, else None."""
    kind = type(table)
    engine, names = _ENGINE_CLASSES.get(kind.__module__.split(".")[0], (None, ()))
    return engine if kind.__name__ in names else None


def refuse_engine_frame(table: Any, argument: str, why: str, instead: str = "") -> None:
    """Refuse, before any work, an engine's DataFrame given as ``argument`` to
    a call that needs its rows on the driver (``why``): the error says how to
    collect it, and ``instead`` what else the user may do."""
    engine = engine_of(table)
    if engine is None:
        return
    raise TypeError(f"{argument} is a {TABLE_NAMES[engine]}, but {why}: collect it "
                    f"first ({_COLLECT[engine]}){'; ' + instead if instead else ''}")


@dataclass
class EngineFrame:
    """An engine's DataFrame with the columns ``fit`` will see, and where the
    engine's workers write the grouped rows (``staging``: a directory every
    node sees; None: a temporary directory on this machine, enough for a
    local engine)."""

    frame: Any
    engine: str
    staging: str | None = None

    @property
    def columns(self) -> list[str]:
        return _column_names(self.frame, self.engine)

    @property
    def schema(self) -> Any:
        """The Arrow schema of the rows ``fit`` will see, from the engine's
        own schema (Spark's) or its empty sample (Dask's): no job runs."""
        import pyarrow as pa

        if self.engine == "spark":
            from pyspark.sql.pandas.types import to_arrow_schema

            return to_arrow_schema(self.frame.schema, timezone="UTC")
        if self.engine == "ray":
            return _ray_schema(self.frame)
        # a sample with values: an empty object column would read as Arrow's null type
        sample = self.frame._meta_nonempty
        return pa.Schema.from_pandas(sample, preserve_index=False).remove_metadata()

    @classmethod
    def of(cls, table: Any, engine: str, wanted: Sequence[str] | None,
           needed: Sequence[str], staging: str | None, keys: Sequence[str] = ()
           ) -> EngineFrame:
        """Check that ``needed`` and ``wanted`` columns are in ``table`` (named
        in the error otherwise), and that the ``keys`` columns' values can be
        keys (:func:`refuse_nested_keys`), and keep ``wanted`` only (all when
        None)."""
        present = _column_names(table, engine)
        taken = [name for name in needed if name in STAGED_INDEX_COLUMNS]
        if taken:
            raise ValueError(f"column {taken[0]!r} has a name the engine's staging gives its "
                             "own columns: rename it in the DataFrame")
        for name in list(needed) + list(wanted or []):
            if name not in present:
                raise ValueError(f"column {name!r} is not in the {TABLE_NAMES[engine]}; "
                                 f"its columns are {present}")
        kept = present if wanted is None else [name for name in present if name in set(wanted)]
        _refuse_names_twice(kept, engine)
        refuse_labels_not_text(table, engine, kept)
        refuse_nested_keys(table, engine, keys)
        if wanted is not None:
            keep = kept
            table = (table.select(*spark_columns(table, keep)) if engine == "spark" else
                     table.select_columns(keep) if engine == "ray" else table[keep])
        return cls(table, engine, staging_location(staging))


def staging_location(staging: Any) -> str | None:
    """``staging=`` as a path's text or an object store's location (checked),
    or None; anything else refused by name before any row is read
    (``str(True)`` made a folder named "True")."""
    if staging is not None and not isinstance(staging, str):
        if not isinstance(staging, os.PathLike):
            raise TypeError("staging= must be a directory's path or an object store's "
                            f"location, got {staging!r}")
        staging = os.fspath(staging)
    staging = local_location(staging, "staging=")  # (file:///tmp/s: a folder, not "file:")
    if is_remote(staging):
        check_location(staging, "staging")
    return staging


def refuse_labels_not_text(table: Any, engine: str, kept: Sequence[str] | None = None
                           ) -> None:
    """Refuse a Dask DataFrame with a column label that is not text (``0``,
    ``1.5``) among its columns (those named in ``kept``, as text, when
    given): Dask's shuffle failed on it with its own traceback once the job
    had started (the pandas path keeps such labels)."""
    if engine != "dask":
        return  # (Spark's and Ray's columns are named by text)
    for name in table.columns:
        if not isinstance(name, str) and (kept is None or str(name) in set(kept)):
            raise ValueError(f"column {name!r} of the {TABLE_NAMES[engine]} is labelled by a "
                             f"{type(name).__name__}, not a string, which the engine's shuffle "
                             "refuses: rename the columns (.rename(columns=str))"
                             + (", or leave it out with columns=" if kept is not None else ""))


def _refuse_names_twice(names: list[str], engine: str) -> None:
    """Refuse a table with two columns of one name (a Spark join's): Spark
    handed ``fit`` both, where ``df[name]`` is a frame, not a column, and
    Dask failed once its job had run; the pandas path refuses such a frame."""
    seen: set[str] = set()
    for name in names:
        if name in seen:
            raise ValueError(f"the {TABLE_NAMES[engine]} has two columns named {name!r} (a "
                             "join's?): rename or drop one, or leave it out with columns=")
        seen.add(name)


def nested_key_error(name: str, kind: Any) -> ValueError:
    """The error for a ``by`` column of ``kind`` values (lists, maps, structs),
    which no group key can be: the pandas path's and an engine's."""
    return ValueError(f"by column {name!r} holds {kind} values: a group key must be a plain "
                      "value (a number, string, date, ...), not a list, a map or a struct")


def refuse_nested_keys(table: Any, engine: str, keys: Sequence[str]) -> None:
    """Refuse a key column of lists, maps or structs from the engine's schema,
    before any job runs, as the pandas path refuses it: the engine would
    group by it and fail inside its job. A Dask column of Python objects
    cannot tell (only one of pandas' Arrow types can); a Ray Dataset may read
    its first block to know its schema."""
    import pyarrow as pa

    for name in keys:
        if engine == "spark":
            from pyspark.sql import types

            kind = table.schema[name].dataType
            if isinstance(kind, (types.ArrayType, types.MapType, types.StructType)):
                raise nested_key_error(name, kind.simpleString())
            continue
        if engine == "ray":
            kind = _ray_schema(table).field(name).type
        else:
            kind = getattr(table._meta[name].dtype, "pyarrow_dtype", None)
        if kind is not None and pa.types.is_nested(kind):
            raise nested_key_error(name, kind)


def stand_ins(count: int) -> list[str]:
    """Names a Spark DataFrame's columns go by, position for position, through
    a Python function of Spark's (``mapInArrow``, ``applyInPandas``): PySpark
    resolves each column there by its name as a path, so a name with a dot
    or a backtick in it would not be found. The function gives the rows
    their own names back."""
    return [f"_mm{position}" for position in range(count)]


def spark_columns(frame: Any, names: Sequence[str]) -> list[Any]:
    """``frame``'s columns of these names, as Spark's columns: Spark reads a
    string given for a column as a path (``store.id``: the field ``id`` of a
    column ``store``), so each name is quoted whole, its backticks doubled."""
    return [frame["`" + name.replace("`", "``") + "`"] for name in names]


def _column_names(table: Any, engine: str) -> list[str]:
    """The table's column names, from its schema (no job runs for a Spark or
    Dask frame; a Ray Dataset may read its first block to know them)."""
    names = table.columns() if engine == "ray" else table.columns
    if names is None:
        raise ValueError("the Ray Dataset has no schema to name its columns (is it empty?)")
    return [str(name) for name in names]


def _ray_schema(dataset: Any) -> Any:
    """A Ray Dataset's schema in Arrow types; a column Arrow has no type for
    reads as null. A Dataset of pandas blocks is typed from their dtypes as
    Arrow types them (:func:`_pandas_block_schema`): Ray's own conversion
    has no type for a categorical or a zone-aware datetime (logging an error
    with its traceback at each call), so a categorical key came back as text."""
    import pyarrow as pa

    schema = dataset.schema()
    base = getattr(schema, "base_schema", None)
    if isinstance(base, pa.Schema):
        return base
    if base is not None and hasattr(base, "types"):
        return _pandas_block_schema(base.names, base.types)
    return pa.schema([(name, kind if isinstance(kind, pa.DataType) else pa.null())
                      for name, kind in zip(schema.names, schema.types)])


def _pandas_block_schema(names: Sequence[str], dtypes: Sequence[Any]) -> Any:
    """The Arrow schema of pandas columns of ``dtypes``, as ``Table.from_pandas``
    types them (a categorical a dictionary, ``Int64`` an ``int64``); a column
    of Python objects, whose values alone tell, is of the null type."""
    import pandas as pd
    import pyarrow as pa

    fields = []
    for name, dtype in zip(names, dtypes):
        try:
            kind = pa.Array.from_pandas(pd.Series([], dtype=dtype)).type
        except (TypeError, ValueError, pa.ArrowException):
            kind = pa.null()
        fields.append(pa.field(str(name), kind))
    return pa.schema(fields)
