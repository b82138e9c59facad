"""``mm.items(iterable)``: one task per element of an iterable (files, ids,
configurations), each keyed by the element itself where it can be a key
(a string, a number, a path, a tuple of them) and by its position otherwise."""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable
from pathlib import PurePath
from typing import Any

import numpy as np

from .keys import encode_key
from .sourcechecks import check_cost, require_unique
from .sources import Source


def _default_item_key(item: Any, position: int) -> Hashable:
    if isinstance(item, (np.number, np.bool_)):  # a NumPy number is a number too
        return item.item()
    return item if _is_own_key(item) else position


def _is_own_key(item: Any) -> bool:
    """Whether an item is its own default key (else its position is)."""
    return isinstance(item, (str, bytes, int, float, PurePath, np.number, np.bool_)) or (
        isinstance(item, tuple) and all(isinstance(v, Hashable) for v in item))


def _refuse_positions_taken(items: list[Any], keys: list[Hashable]) -> None:
    """Refuse an item keyed by its position (it cannot be a key: None, a
    dict, a date) where another item is that number: ``items([None, 0])``
    said "duplicate item key: 0", a key the user never gave."""
    positional = [i for i, item in enumerate(items) if not _is_own_key(item)]
    if not positional:
        return
    own = {made: i for i, (item, made) in enumerate(zip(items, keys)) if _is_own_key(item)
           and isinstance(made, (int, float))}
    for position in positional:
        if position in own:
            raise ValueError(
                f"item {position} (a {type(items[position]).__name__}, which cannot be a "
                f"key) is keyed by its position, {position}, which item {own[position]} is "
                "keyed by too: give items(key=...) a function that keys every item")


def _refuse_keys_stored_alike(keys: list[Hashable]) -> None:
    """Refuse two keys that differ in Python but whose stored text is one
    (:func:`~.keys.encode_key`: a missing value, None or NaN, inside a
    tuple; two objects whose ``str`` is one): a store kept one model for
    both, the other's lost, and ``(1, nan)`` was not found again. Only keys
    that are not plain (:func:`_plain`) are encoded: plain ones differ as
    text where they differ as values (equal ones are refused before)."""
    seen: dict[str, Hashable] = {}
    for made in keys:
        if _plain(made):
            continue
        text = encode_key((made,))
        earlier = seen.setdefault(text, made)
        if earlier is not made:
            raise ValueError(f"item keys {earlier!r} and {made!r} differ but are stored as one "
                             f"key ({text}): a store would keep one model for both; give "
                             "items(key=...) a function that keys each item apart")


def _plain(value: Any, inside: bool = False) -> bool:
    """A number, text, bytes, or a tuple of them: a key whose stored text is
    its own. A NaN is plain alone (two are refused as one key before), not
    ``inside`` a tuple (there two NaNs are not equal, and read as None)."""
    kind = type(value)
    if kind is float:
        return not inside or value == value
    if kind in (int, str, bool, bytes):
        return True
    return kind is tuple and all(_plain(part, inside=True) for part in value)


def _path_hint(value: Any) -> str:
    """For a path (or a path's text) given where items are wanted: how to
    have one task per file instead."""
    if isinstance(value, PurePath) or (isinstance(value, str) and ("/" in value or "." in value)):
        return (f" ({str(value)!r} is one path, not items: for one task per file in it, "
                f"pass mm.items(sorted(Path({str(value)!r}).glob('*'))))")
    return ""


class ItemSource(Source):
    """One task per element of an iterable; ``fit`` receives the element."""

    def __init__(
        self,
        iterable: Iterable[Any],
        *,
        key: Callable[[Any], Hashable] | None = None,
        cost: Callable[[Any], float] | None = None,
    ) -> None:
        if isinstance(iterable, (str, bytes, PurePath)) or not isinstance(iterable, Iterable):
            raise TypeError(f"items() needs an iterable of items, got {type(iterable).__name__}"
                            + _path_hint(iterable))
        self.items = list(iterable)
        if not self.items:
            raise ValueError("items() got an empty iterable: there is nothing to train")
        if key is not None and not callable(key):
            raise TypeError("items(key=...) must be a function of the item")
        check_cost(cost, "items", "the item")
        self.keys = [
            key(item) if key else _default_item_key(item, i) for i, item in enumerate(self.items)
        ]
        if key is not None:  # (a default key that cannot be hashed is its position)
            for position, made in enumerate(self.keys):
                try:
                    hash(made)
                except TypeError:
                    raise TypeError(
                        f"items(key=...) gave item {position} the key {made!r}, a "
                        f"{type(made).__name__}, which cannot be a key (it cannot be "
                        "hashed): return a tuple for a key of several values") from None
        try:
            require_unique(self.keys, "item key")
        except ValueError:
            if key is None:  # said better where a position made the duplicate
                _refuse_positions_taken(self.items, self.keys)
            raise
        _refuse_keys_stored_alike(self.keys)
        self.cost = cost

    @property
    def key_columns(self) -> list[str]:
        return ["item"]

    def __repr__(self) -> str:
        return f"items({len(self.items)})"



def items(
    iterable: Iterable[Any],
    *,
    key: Callable[[Any], Hashable] | None = None,
    cost: Callable[[Any], float] | None = None,
) -> ItemSource:
    """One task per element; the key is the element itself when it is a string,
    number, path or tuple, else its position (or ``key(item)`` when given)."""
    return ItemSource(iterable, key=key, cost=cost)
