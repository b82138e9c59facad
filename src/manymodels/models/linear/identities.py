"""A group's identity, for :mod:`.stored`: a 64-bit hash of its rows in
order (features, target, weights) and its per-group alpha, salted by the
*options hash* (family, names, the options that family uses and the model
code's version), for every group at once.

NumPy mixes the prepared columns chunk by chunk (splitmix64's finalizer, as
the store's task identities in :mod:`manymodels.identity.hashing`; in place, in
chunks that stay in the CPU's cache), then sums each group's mixed rows: no
per-group Python call, so a million groups of 20 rows hash in about half a
second. It is not a cryptographic hash: an accidental change is missed with
odds of about 2^-64, and the identity of a group does not depend on where its
rows sit in the table, only on their order among themselves.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from ...identity.hashing import digest
from ...identity.rowhash import lanes_of, mix64, mix64_inplace
from .prepare import Prepared

#: the code whose edit changes a fitted model: a new version refits every group
MODEL_FILES = ("fitting.py", "glance.py", "kernels.py", "prepare.py", "torch_kernels.py")
CHUNK = 1 << 18     # rows hashed at a time: the passes stay in the CPU's cache
_K = [np.uint64(k) for k in (0x9E3779B97F4A7C15, 0xBF58476D1CE4E5B9, 0x94D049BB133111EB,
                             0xD6E8FEB86659FD93, 0xCA5A826395121157, 0xA0761D6478BD642F)]


@functools.lru_cache(maxsize=1)
def model_code_version() -> str:
    here = Path(__file__).parent
    return digest(*((here / name).read_bytes() for name in MODEL_FILES),
                  f"numpy=={np.__version__}")


def describe_options(family: str, by: list[str], features: list[str], target: str,
                     weights: str | None, alpha: Any, options: dict) -> dict:
    """What a fitted model depends on besides its rows: only the options that
    ``family`` uses (a new ``tol`` does not refit least squares)."""
    what: dict[str, Any] = {"family": family, "by": by, "features": features,
                            "target": target, "weights": weights,
                            "fit_intercept": options["fit_intercept"]}
    if family == "ridge":
        what["alpha"] = alpha if isinstance(alpha, str) else float(alpha)
    if family == "logistic":
        what.update(C=float(options["C"]), max_iter=int(options["max_iter"]),
                    tol=float(options["tol"]))
    what["model_code"] = model_code_version()
    return what


def _row_hashes(columns: list[np.ndarray], a: int, out: np.ndarray,
                scratch: np.ndarray) -> None:
    """The hashes of rows ``a .. a + len(out)`` of ``columns`` into ``out``."""
    for j, column in enumerate(columns):
        bits = column[a:a + len(out)].view(np.uint64)
        if j == 0:
            np.add(bits, _K[5], out=out)
        else:
            np.bitwise_xor(out, bits, out=out)
        np.multiply(out, _K[j % 5], out=out)
        np.right_shift(out, np.uint64(31), out=scratch)
        np.bitwise_xor(out, scratch, out=out)


def group_identities(data: Prepared, options_hash: str) -> np.ndarray:
    """One uint64 identity per group of ``data``, all at once (see the module's doc).

    Chunk by chunk of rows in key order: each row's hash (computed there, or
    gathered once from the table's order), mixed with its position in its
    group, summed into its group's total (a group may span chunks)."""
    columns = [*data.columns, *([] if data.w is None else [data.w])]
    n = len(columns[0])
    ordered = None
    buffer, scratch = (np.empty(min(CHUNK, max(n, 1)), dtype=np.uint64) for _ in range(2))
    sums = np.zeros(data.groups, dtype=np.uint64)
    starts = data.starts
    with np.errstate(over="ignore"):
        if data.order is not None:  # rows hashed in table order, then one gather
            ordered = np.empty(n, dtype=np.uint64)
            for a in range(0, n, CHUNK):
                _row_hashes(columns, a, ordered[a:a + CHUNK], scratch[:min(CHUNK, n - a)])
            ordered = ordered[data.order]
        for a in range(0, n, CHUNK):
            b = min(a + CHUNK, n)
            out, tmp = buffer[:b - a], scratch[:b - a]
            if ordered is None:
                _row_hashes(columns, a, out, tmp)
            else:
                out[:] = ordered[a:b]
            g0 = int(np.searchsorted(starts, a, side="right")) - 1  # groups in this chunk
            g1 = int(np.searchsorted(starts, b, side="left"))
            local = np.maximum(starts[g0:g1], a) - a
            lengths = np.diff(np.append(local, b - a))
            position = np.arange(a, b, dtype=np.uint64) - np.repeat(
                starts[g0:g1].astype(np.uint64), lengths)
            np.multiply(position, _K[4], out=position)
            np.add(out, position, out=out)
            mix64_inplace(out, tmp)
            sums[g0:g1] += np.add.reduceat(out, local)
        salt_a, salt_b = (np.uint64(v) for v in lanes_of(options_hash))
        identity = mix64(sums ^ mix64(data.counts.astype(np.uint64) + salt_a))
        alpha = np.asarray(data.alpha, dtype=np.float64)
        alpha_bits = (alpha if alpha.ndim else np.full(len(identity), alpha)).view(np.uint64)
        return mix64(identity + mix64(alpha_bits ^ salt_b))


def match_keys(new: pd.DataFrame, old: pd.DataFrame) -> np.ndarray:
    """Each new group's position in ``old``, -1 where it has none."""
    if len(new) == len(old) and list(new.dtypes) == list(old.dtypes) and new.equals(old):
        return np.arange(len(new))
    position = _positions(new, old)
    if (position < 0).any() and new.isna().to_numpy().any():
        # a missing key reads as NaN in a fresh fit's object column (booleans
        # beside a missing one) but <NA> in the saved result's nullable
        # column, and pandas finds neither by the other: that group was
        # fitted again on every re-run
        position = _positions(_missing_as_none(new), _missing_as_none(old))
    return position


def _positions(new: pd.DataFrame, old: pd.DataFrame) -> np.ndarray:
    try:
        if new.shape[1] == 1:
            return pd.Index(old.iloc[:, 0]).get_indexer(new.iloc[:, 0])
        return pd.MultiIndex.from_frame(old).get_indexer(pd.MultiIndex.from_frame(new))
    except (TypeError, ValueError, pd.errors.InvalidIndexError):  # keys of other types
        # (or not unique, in a result saved before its keys were read back exactly)
        return np.full(len(new), -1)


def _missing_as_none(keys: pd.DataFrame) -> pd.DataFrame:
    """``keys`` as Python objects, every missing value (NaN, ``<NA>``, None) as None."""
    return keys.astype(object).where(keys.notna(), None)
