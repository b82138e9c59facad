"""Models kept in a store, loaded when first asked for: a run of a million
models holds a marker or a locator for each, not the models (a gigabyte),
and ``run.models[key]`` reads one from the store, checked against its
SHA-256, only when it is used."""

from __future__ import annotations

import pickle
from collections.abc import Hashable, Iterator, Mapping
from functools import cached_property
from typing import Any

from ..engine.messages import Pickled
from ..engine.modelfiles import ModelFile
from ..engine.partpacks import PackedModel
from ..inputs.keys import canonical, typed_otherwise
from . import artifacts


class _InStore:
    """Marks a task's model as committed to the run's store: the driver keeps
    no copy (a million models would be a gigabyte), and ``run.models`` loads
    it from the store when asked for."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "IN_STORE"


IN_STORE = _InStore()


class StoredModel:
    """A model in a store, loaded (and checked) on first use."""

    __slots__ = ("digest", "store", "what")

    def __init__(self, store: Any, digest: str, what: Any) -> None:  # a registry.Store
        # what: a description, or the task's key (described only if needed:
        # a re-run makes a million of these)
        self.store, self.digest, self.what = store, digest, what

    def load(self) -> Any:
        what = self.what if isinstance(self.what, str) else f"key {self.what!r}"
        data = artifacts.read_artifact(self.store._conn, self.store.root, self.digest, what)
        return pickle.loads(data)


class KeyByText:
    """A task's key that Python cannot hash (a grid's dict of settings, a
    list), stood for by its stored text (:func:`manymodels.inputs.keys.encode_key`):
    it equals the key, and ``run.models[key]`` finds it by the key itself."""

    __slots__ = ("key", "_text")

    def __init__(self, key: Any) -> None:
        from ..inputs.keys import encode_key

        self.key = key
        self._text = encode_key(key if isinstance(key, tuple) else (key,))

    def __hash__(self) -> int:
        return hash(self._text)

    def __eq__(self, other: object) -> bool:
        other_key = other.key if isinstance(other, KeyByText) else other
        try:
            return bool(other_key == self.key)
        except Exception:  # (arrays) no single truth: not equal
            return False

    def __repr__(self) -> str:
        return repr(self.key)


#: What a float NaN in a key is marked as, to find a key holding one.
_NAN_MARK = object()


def _nan_marked(parts: tuple) -> tuple:
    return tuple(_NAN_MARK if isinstance(part, float) and part != part else part
                 for part in parts)


def hashable_key(key: Any) -> Hashable:
    """``key`` itself, or a :class:`KeyByText` where Python cannot hash it."""
    try:
        hash(key)
    except TypeError:
        return KeyByText(key)
    return key


class ModelMap(Mapping):
    """Key -> model; models kept in a store are loaded when first asked for.
    A key that cannot be hashed is found by its text (:class:`KeyByText`)."""

    def __init__(self, items: dict[Hashable, Any]) -> None:
        self._items = items

    def __getitem__(self, key: Hashable) -> Any:
        try:
            value = self._items[key]
        except TypeError:  # unhashable: as the map holds it
            if KeyByText(key) not in self._items:
                raise self._not_found(key) from None
            key = KeyByText(key)
            value = self._items[key]
        except KeyError:  # a whole number typed otherwise ("2" for 2), as the store finds it
            found = self._typed_otherwise(key)
            if found not in self._items:
                raise self._not_found(key) from None
            key, value = found, self._items[found]
        if isinstance(value, (StoredModel, Pickled, PackedModel, ModelFile)):  # loaded if asked
            value = self._items[key] = value.load()
        return value

    def _not_found(self, key: Any) -> KeyError:
        """The error for ``key``, with a key the map holds to show what one
        looks like: a grid's key ends with each setting's value, not a dict
        of the settings (``("s1", 0.1)``, not ``("s1", {"alpha": 0.1})``)."""
        example = next(iter(self._items), None)
        if example is None:
            return KeyError(key)
        return KeyError(f"{key!r} is not a key of these models; a key looks like "
                        f"{example!r} (its values in order: the group's key, then "
                        "any grid parameter's value)")

    def _typed_otherwise(self, key: Any) -> Any:
        """The key the map holds for ``key`` typed otherwise; ``key`` where none."""
        parts = key if isinstance(key, tuple) else (key,)
        # NaN, NaT, pd.NA: a missing key, which the map holds as None; where it
        # holds a NaN of its own (a grid of None and NaN: two settings), that one
        missing = [part is not None and canonical(part) is None for part in parts]
        if any(missing):
            held = self._nan_keys.get(_nan_marked(parts))
            if held is not None:
                return held
            held = tuple(None if gone else part for part, gone in zip(parts, missing))
            held = held if isinstance(key, tuple) else held[0]
            if held in self._items:
                return held
        if len(parts) <= 8:
            try:
                for variant in typed_otherwise(parts):
                    held = variant if isinstance(key, tuple) else variant[0]
                    if held in self._items:
                        return held
            except (TypeError, ValueError):  # a value no key holds (an array): not found
                pass
        return key

    @cached_property
    def _nan_keys(self) -> dict[tuple, Hashable]:
        """The keys the map holds with a float NaN in them, by their parts
        with each NaN marked (a NaN equals no other: a new one finds none)."""
        found = {}
        for held in self._items:
            parts = held if isinstance(held, tuple) else (held,)
            if any(isinstance(part, float) and part != part for part in parts):
                found[_nan_marked(parts)] = held
        return found

    def __iter__(self) -> Iterator[Hashable]:
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)

    def __repr__(self) -> str:
        return f"<{len(self)} models>"
