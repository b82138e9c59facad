"""An :func:`manymodels.linear` result as one artifact: Arrow IPC bytes.

Keys, coefficients, metrics, and per group its identity and the run that
fitted it, as columns; the family, names and options in the schema's
metadata. The bytes depend on the result alone (no run id, no time), so an
unchanged result is the same artifact, stored once.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import numpy as np
import pandas as pd
import pyarrow as pa

from .fitting import STATUSES, blank_integers, plain_values
from .result import LinearResult

FORMAT = 1
META = b"manymodels.linear"


def to_artifact(result: LinearResult, identity: np.ndarray, fitted_in: np.ndarray,
                options: dict, options_hash: str) -> memoryview:
    """The result as Arrow IPC bytes (a view of Arrow's buffer, not copied
    into a ``bytes``): the same bytes for the same result, so an unchanged
    re-run stores nothing new."""
    keys = pa.Table.from_pandas(result.keys.reset_index(drop=True), preserve_index=False)
    arrays = {f"key:{c}": keys.column(c) for c in result.by}
    for position, feature in enumerate(result.features):
        arrays[f"coef:{feature}"] = pa.array(result.coef[:, position])
    arrays["intercept"] = pa.array(result.intercept)
    metric_names = [c for c in result.metrics.columns
                    if c not in result.by and c not in ("status", "reused_from")]
    for metric in metric_names:
        column = result.metrics[metric]
        if isinstance(column.dtype, np.dtype):
            arrays[f"metric:{metric}"] = pa.array(column.to_numpy())
        else:  # a nullable integer (a no_weight group's df): its blanks as Arrow nulls
            arrays[f"metric:{metric}"] = pa.array(
                plain_values(column, np.dtype(np.int64)), mask=column.isna().to_numpy())
    arrays["status"] = pa.array(np.asarray(result.metrics["status"].cat.codes, np.int8))
    arrays["identity"], arrays["fitted_in"] = pa.array(identity), pa.array(fitted_in)
    meta = {"format": FORMAT, "family": result.family, "by": result.by,
            "features": result.features, "target": result.target,
            "fit_intercept": result.fit_intercept, "metrics": metric_names,
            "statuses": STATUSES, "options": options, "options_hash": options_hash}
    table = pa.table(arrays).replace_schema_metadata({META: json.dumps(meta)})
    counter = pa.MockOutputStream()  # its size first: one buffer, written once
    with pa.ipc.new_file(counter, table.schema) as writer:
        writer.write_table(table)
    buffer = pa.allocate_buffer(counter.size())
    with pa.ipc.new_file(pa.FixedSizeBufferWriter(buffer), table.schema) as writer:
        writer.write_table(table)
    return memoryview(buffer)


@dataclass
class Saved:
    result: LinearResult
    identity: np.ndarray
    fitted_in: np.ndarray
    meta: dict
    digest: str = ""  # the artifact's SHA-256


#: Arrow's integer and boolean types as pandas' nullable ones.
_NULLABLE = {pa.int8(): pd.Int8Dtype(), pa.int16(): pd.Int16Dtype(),
             pa.int32(): pd.Int32Dtype(), pa.int64(): pd.Int64Dtype(),
             pa.uint8(): pd.UInt8Dtype(), pa.uint16(): pd.UInt16Dtype(),
             pa.uint32(): pd.UInt32Dtype(), pa.uint64(): pd.UInt64Dtype(),
             pa.bool_(): pd.BooleanDtype()}


def _key_values(column: pa.ChunkedArray) -> pd.Series:
    """A key column as pandas holds it: integers or booleans with a missing
    key in pandas' nullable types (as floats, ids above 2**53 became one
    another, and no group's key found its row again)."""
    if column.null_count and column.type in _NULLABLE:
        return column.to_pandas(types_mapper=_NULLABLE.get)
    return column.to_pandas()


def from_artifact(data: bytes, run_id: int) -> Saved:
    table = pa.ipc.open_file(pa.py_buffer(data)).read_all()
    meta = json.loads(table.schema.metadata[META])
    by, features = meta["by"], meta["features"]
    keys = pd.DataFrame({column: _key_values(table.column(f"key:{column}")) for column in by})
    G = table.num_rows
    coef = np.empty((G, len(features)))
    for position, feature in enumerate(features):
        coef[:, position] = table.column(f"coef:{feature}").to_numpy()
    metrics = keys.copy()
    for metric in meta["metrics"]:
        column = table.column(f"metric:{metric}")
        metrics[metric] = (column.to_numpy() if not column.null_count or column.type
                           not in _NULLABLE else column.to_pandas(types_mapper=_NULLABLE.get))
    codes = table.column("status").to_numpy().astype(np.int64)
    metrics["status"] = pd.Categorical.from_codes(codes, categories=meta["statuses"])
    blank_integers(metrics)  # (as a fresh result has them, from its statuses)
    fitted_in = table.column("fitted_in").to_numpy()
    metrics["reused_from"] = pd.arrays.IntegerArray(fitted_in.astype(np.int64),
                                                    fitted_in == run_id)
    result = LinearResult(meta["family"], by, features, meta["target"], meta["fit_intercept"],
                          keys, coef, table.column("intercept").to_numpy().copy(), metrics)
    result.run_id = run_id
    return Saved(result, table.column("identity").to_numpy(), fitted_in, meta)
