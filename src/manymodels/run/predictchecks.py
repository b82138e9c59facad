"""What ``Store.predict`` checks of the rows to predict, so that an error
names the column at fault: a feature value a group's model refuses (text
in a numeric column, a NaN), said with the model's own message; and a key
column typed otherwise than the keys the models were stored under (a
zone-aware datetime for a naive one, a date for a datetime), which no
stored key would match."""

from __future__ import annotations

import datetime as dt
import decimal
import itertools
import warnings
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from ..inputs.keys import decode_key, encode_key
from .predictchunks import RefusedValueError

#: scikit-learn's modules whose estimators read their features as numbers
#: (checked up front: text in a feature column is refused by each group).
NUMERIC_ESTIMATORS = tuple(f"sklearn.{name}" for name in (
    "linear_model", "tree", "svm", "neighbors", "naive_bayes", "neural_network",
    "kernel_ridge", "gaussian_process", "discriminant_analysis", "cross_decomposition",
    "ensemble._forest", "ensemble._gb", "ensemble._hist_gradient_boosting",
    "ensemble._weight_boosting"))
#: How many stored keys and planned keys are typed to compare them.
KEYS_COMPARED = 200


def _text_that_is_no_number(column: Any, quoted_in: str | None = None) -> Any:
    """The first value of ``column`` (a pandas or NumPy column of text or
    objects) that is text and not a number, or None; with ``quoted_in`` (a
    message), the first such value that the message quotes."""
    import pandas as pd

    values = pd.Series(np.asarray(column, dtype=object)).dropna()
    texts = values[values.map(lambda v: isinstance(v, (str, bytes)))]
    if texts.empty:
        return None
    unread = texts[pd.to_numeric(texts, errors="coerce").isna()]
    bad = unread[~unread.map(_reads_as_float)]  # "nan", "inf": NumPy reads them
    if quoted_in is not None:
        bad = bad[bad.map(lambda text: _quotes(quoted_in, text))]
    return None if bad.empty else bad.iloc[0]


def _quotes(message: str, text: str | bytes) -> bool:
    """Whether ``message`` quotes ``text`` (as ``'text'`` or ``"text"``)."""
    shown = text.decode(errors="replace") if isinstance(text, bytes) else text
    return f"'{shown}'" in message or f'"{shown}"' in message


def _reads_as_float(text: str | bytes) -> bool:
    """Whether NumPy reads ``text`` as a float, as a model's check does
    (``"nan"``: a tree takes it as a missing value)."""
    try:
        float(text)
    except (TypeError, ValueError):
        return False
    return True


def _numbers_refused(column: np.ndarray, said: str) -> str | None:
    """What a numeric ``column`` holds that a model says (``said``) it
    refuses: NaN or infinity."""
    if column.dtype.kind not in "fc":
        return None
    if "nan" in said and np.isnan(column).any():
        return f"NaN ({int(np.isnan(column).sum())} of its {len(column)} row(s))"
    if "inf" in said and np.isinf(column).any():
        return f"infinity ({int(np.isinf(column).sum())} of its {len(column)} row(s))"
    return None


def refused_value(rows: Any, names: Sequence[str], exc: Exception,
                  reads_text: bool = False) -> str | None:
    """``column 'x' holds ...``: the first feature column of a group's
    ``rows`` that holds a value its model refused with ``exc`` (text that is
    no number, datetimes, a NaN or an infinity its message speaks of), or
    None when no column explains it. A column the message names is looked
    at first. Where the model may read text (``reads_text``: a pipeline that
    encodes it), a column's text is blamed only when the message quotes it
    (a scaler's "could not convert string to float: 'abc'", an encoder's
    unknown category): a text column it reads is no fault, and one it
    refuses still names its column."""
    if not isinstance(exc, (ValueError, TypeError)):
        return None
    message = str(exc)
    said = message.lower()
    named = [n for n in names if f"'{n}'" in message or f'"{n}"' in message]
    for name in [*named, *(n for n in names if n not in named)]:
        if name not in rows:
            continue
        column = np.asarray(rows[name])
        what = None
        if column.dtype.kind in "OUS":
            text = _text_that_is_no_number(column, message if reads_text else None)
            what = None if text is None else f"text ({text!r})"
            if what is None and column.dtype.kind == "O" and "nan" in said:
                missing = [v for v in column if v is None or v != v]
                what = f"a missing value ({missing[0]!r})" if missing else None
        elif column.dtype.kind in "Mm" and len(column):
            what = f"{'datetimes' if column.dtype.kind == 'M' else 'durations'} ({column[0]!r})"
        else:
            what = _numbers_refused(column, said)
        if what is not None:
            return f"column {name!r} holds {what}"
    return None


def refusal(exc: Exception, rows: Any, names: Sequence[str],
            model: Any) -> RefusedValueError | None:
    """``exc`` of ``model`` as the error that names the column of ``rows``
    at fault, or None when none does (the group is named by the driver)."""
    column = refused_value(rows, names, exc, reads_text=not _reads_numbers(model))
    if column is None:
        return None
    return RefusedValueError(f"{column}, which its model "
                             f"({type(model).__name__}) refuses: {type(exc).__name__}: {exc}")


def refuse_text_features(model: Any, frame: Any, names: Sequence[str], named: str) -> None:
    """Refuse before any group runs a feature column of ``frame`` holding
    text that is no number when ``model`` (the model of ``named``) is a
    scikit-learn estimator that reads numbers (:data:`NUMERIC_ESTIMATORS`):
    each group would fail on it."""
    if not _reads_numbers(model):
        return
    categorical = _categorical_features(model)  # (boosting reads their text as categories)
    for name in names:
        column = frame[name]
        if name in categorical:
            continue
        if getattr(column, "dtype", None) is None or column.dtype.kind not in "OUS":
            continue  # (a pandas categorical's kind is "O": its text is checked too)
        text = _text_that_is_no_number(column)
        if text is not None:
            raise ValueError(f"column {name!r} of the table to predict holds text ({text!r}), "
                             f"but the model of {named} ({type(model).__name__}) reads its "
                             "features as numbers: convert the column, or give the features "
                             "it was fitted on")


def _reads_numbers(model: Any) -> bool:
    """Whether ``model`` is one of scikit-learn's estimators that read their
    features as numbers (:data:`NUMERIC_ESTIMATORS`)."""
    return type(model).__module__.startswith(NUMERIC_ESTIMATORS)


def _categorical_features(model: Any) -> set[str]:
    """The features ``model`` reads as categories, whose text it takes
    (histogram boosting's ``categorical_features``: ``is_categorical_``)."""
    flags = getattr(model, "is_categorical_", None)
    fitted = getattr(model, "feature_names_in_", None)
    if flags is None or fitted is None or len(flags) != len(fitted):
        return set()
    return {str(name) for name, flag in zip(fitted, flags) if flag}


def key_type(value: Any) -> set[str]:
    """The kinds of key a value matches as a stored key (a whole number and
    its text match, as :class:`~manymodels.inputs.keys.TypedKeys` finds
    them); empty for a missing value."""
    if value is None or (isinstance(value, float) and value != value):
        return set()
    if isinstance(value, (np.datetime64, np.timedelta64)):
        if np.isnat(value):
            return set()
        import pandas as pd  # (.item() of nanoseconds is an int: no number of a key)

        value = pd.Timestamp(value) if isinstance(value, np.datetime64) else pd.Timedelta(value)
    elif isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, (bool, int, float)):
        return {"number"}
    if isinstance(value, str):
        return {"text", "number"} if value.strip().lstrip("-").isdigit() else {"text"}
    if isinstance(value, dt.datetime):
        if value != value:  # NaT
            return set()
        return {"naive datetime" if value.tzinfo is None else "zone-aware datetime"}
    if isinstance(value, dt.date):
        return {"date"}
    if isinstance(value, dt.timedelta):  # pandas' Timedelta too: the stored keys' own
        return set() if value != value else {"duration"}
    if isinstance(value, dt.time):
        return {"time"}
    if isinstance(value, decimal.Decimal):
        return {"decimal"}
    return {type(value).__name__}


def _kinds(keys: Iterable[tuple], width: int) -> list[tuple[set[str], Any]]:
    """Per key column: the kinds its values match, and one value (for the message)."""
    kinds: list[tuple[set[str], Any]] = [(set(), None) for _ in range(width)]
    for parts in keys:
        for i, value in enumerate(parts[:width]):
            found = key_type(value)
            if found and not kinds[i][0]:
                kinds[i] = (kinds[i][0], value)
            kinds[i][0].update(found)
    return kinds


def _stored_kinds(artifacts: dict[str, str], width: int) -> list[tuple[set[str], Any]]:
    """:func:`_kinds` of the first :data:`KEYS_COMPARED` stored keys
    (``artifacts``: encoded key -> model)."""
    return _kinds((decode_key(text) for text in itertools.islice(artifacts, KEYS_COMPARED)),
                  width)


def check_key_types(by: Sequence[str], planned: Sequence[tuple], unseen: Sequence[int],
                    artifacts: dict[str, str], where: str) -> None:
    """Refuse (when no planned group found its model) or warn (when some
    did) of a key column of the table to predict whose values are of
    another kind than the stored keys' (``artifacts``: encoded key ->
    model): a zone-aware datetime for a naive one, a date for a datetime,
    text for a date. Such keys match no stored key: their rows got NaN, or
    the fallback model, silently. ``planned``: each planned group's key
    parts; ``unseen``: the numbers of those that found no model."""
    if not unseen or not artifacts:
        return
    stored = _stored_kinds(artifacts, len(by))
    asked = _kinds((planned[i] for i in unseen[:KEYS_COMPARED]), len(by))
    for name, (theirs, trained), (ours, given) in zip(by, stored, asked):
        if not theirs or not ours or theirs & ours:
            continue
        said = (f"key column {name!r} of the table to predict holds {_kind_text(ours)} "
                f"(e.g. {given!r}), but the models in {where} were stored under keys of "
                f"{_kind_text(theirs)} (e.g. {trained!r}): those rows match no stored key; "
                f"convert the column to the type the models were trained on")
        if len(unseen) == len(planned):
            raise ValueError(said)
        warnings.warn(said, RuntimeWarning, stacklevel=4)
        return


def check_schema_key_types(by: Sequence[str], schema: Any, artifacts: dict[str, str],
                           where: str) -> None:
    """Refuse a key column of an engine's table to predict whose type (its
    Arrow ``schema``: no job runs) holds no value of the kind the stored
    keys are (``artifacts``: encoded key -> model), as :func:`check_key_types`
    refuses a pandas table none of whose keys found a model: every row of
    it would get a null prediction (or the fallback model's), silently. A
    text column is not refused (its digits may name numbers), nor a column
    of a type that does not tell (Python objects)."""
    if not artifacts:
        return
    for name, (theirs, trained) in zip(by, _stored_kinds(artifacts, len(by))):
        kind = schema.field(name).type if name in schema.names else None
        ours = arrow_key_kinds(kind) if kind is not None else set()
        if theirs and ours and not theirs & ours:
            raise ValueError(
                f"key column {name!r} of the table to predict holds {_kind_text(ours)} "
                f"({kind}), but the models in {where} were stored under keys of "
                f"{_kind_text(theirs)} (e.g. {trained!r}): no row would match a stored key; "
                "convert the column to the type the models were trained on")


def arrow_key_kinds(kind: Any) -> set[str]:
    """The kinds of key (:func:`key_type`) a column of Arrow type ``kind``
    holds; empty where its type does not tell."""
    import pyarrow as pa

    types = pa.types
    if types.is_dictionary(kind):
        kind = kind.value_type
    if types.is_integer(kind) or types.is_floating(kind) or types.is_boolean(kind):
        return {"number"}
    if types.is_string(kind) or types.is_large_string(kind):
        return {"text", "number"}
    if types.is_timestamp(kind):
        return {"naive datetime" if kind.tz is None else "zone-aware datetime"}
    if types.is_date(kind):
        return {"date"}
    if types.is_decimal(kind):
        return {"decimal"}
    if types.is_duration(kind):
        return {"duration"}
    if types.is_time(kind):
        return {"time"}
    return set()


def _kind_text(kinds: set[str]) -> str:
    names = sorted(kinds - {"number"} if kinds > {"number"} and "text" in kinds else kinds)
    return " and ".join(f"{k}s" if not k.endswith("s") else k for k in names)


def check_feature_order(model: Any, features: Sequence[str] | None, named: str) -> None:
    """Refuse ``features=`` other than the columns a scikit-learn ``model``
    (the model of ``named``) was fitted on, in their order
    (``feature_names_in_``): scikit-learn refuses them in every group, in a
    message about feature names, not ``features=``."""
    fitted = getattr(model, "feature_names_in_", None)
    if (features is None or fitted is None
            or not type(model).__module__.startswith("sklearn.")):
        return
    fitted = [str(name) for name in fitted]
    if list(features) == fitted:
        return
    missing = [name for name in fitted if name not in features]
    why = (f"it lacks {missing[0]!r}" if missing else
           f"{[n for n in features if n not in fitted][0]!r} is not one of them"
           if set(features) - set(fitted) else "in another order, or repeated")
    raise ValueError(f"features={list(features)!r}, but the model of {named} "
                     f"({type(model).__name__}) was fitted on {fitted!r} ({why}): give "
                     "those, in that order, or leave features= out")


def near_keys(unseen: list[Any], artifacts: dict[str, str], width: int) -> str:
    """A note naming a key with no model that a stored key equals but for
    the spaces around its texts (``"s1 "`` for ``"s1"``: a CSV's padding),
    ``""`` where none of the first :data:`KEYS_COMPARED` is
    such a key."""
    for key in unseen[:KEYS_COMPARED]:
        parts = (key,) if width == 1 else tuple(key)
        trimmed = tuple(part.strip() if isinstance(part, str) else part for part in parts)
        if trimmed != parts and encode_key(trimmed) in artifacts:
            shown = trimmed[0] if width == 1 else trimmed
            return (f" ({key!r} has no model, and {shown!r}, which it is but for spaces, "
                    "has: strip the key column's text)")
    return ""
