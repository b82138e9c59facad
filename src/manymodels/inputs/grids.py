"""Grids: one task per combination of parameter values (:func:`grid`), alone
or times groups or items (``groups * grid``, :class:`ProductSource`)."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from .itemsource import ItemSource
from .sourcechecks import called_cost, require_unique
from .sources import GroupSource, Source

#: The most settings one grid may make, and the most tasks a grid times
#: groups or items may make: each task's setting and key are Python objects
#: while the run is planned, about 300 bytes a task (a million settings:
#: 290 MB and a second before the first task starts), so ten million are
#: 3 GB; a hundred million ran out of memory before any task ran.
MOST_SETTINGS = 10_000_000


class _Combining(Source):
    """A source that ``*`` combines: a grid, or groups/items times a grid."""

    combines = True

    def __mul__(self, other: Any) -> Any:
        return product(self, other)

    def __rmul__(self, other: Any) -> Any:
        return product(other, self)


class GridSource(_Combining):
    """One task per combination of the given parameter values."""

    def __init__(self, values: dict[str, Iterable[Any]],
                 cost: Callable[[dict[str, Any]], float] | None = None) -> None:
        if cost is not None and not callable(cost):
            raise TypeError(
                f"grid(cost=...) is each setting's expected cost, a function of its dict of "
                f"values; got {cost!r}. To sweep a parameter named 'cost', give the values "
                "as a mapping: mm.grid({'cost': [...]})")
        self.cost = cost
        if not values:
            raise ValueError("grid() needs at least one parameter, e.g. grid(alpha=[0.1, 1])")
        self.values: dict[str, list[Any]] = {}
        for name, options in values.items():
            if not isinstance(name, str):
                raise TypeError(f"grid parameter names are fit's keyword names, text; got "
                                f"{name!r}")
            if isinstance(options, (str, bytes)) or not isinstance(options, Iterable):
                raise TypeError(
                    f"grid parameter {name!r} must be a list of values, got {options!r}"
                )
            options = list(options)
            if not options:
                raise ValueError(f"grid parameter {name!r} has no values")
            require_unique(options, f"value of grid parameter {name!r}", by_equality=True)
            self.values[name] = options
        if len(self) > MOST_SETTINGS:  # each one is a dict held while the run is planned
            raise ValueError(
                f"grid() makes {len(self):,} combinations of its {len(self.values)} "
                f"parameters, more than a run of a grid plans ({MOST_SETTINGS:,}, each a "
                "dict held while the run is planned): narrow the grid, or run it in parts")

    @property
    def key_columns(self) -> list[str]:
        return list(self.values)

    @property
    def param_columns(self) -> list[str]:
        return list(self.values)

    def combinations(self) -> list[dict[str, Any]]:
        names = list(self.values)
        return [dict(zip(names, combo)) for combo in itertools.product(*self.values.values())]

    def costs(self, settings: list[dict[str, Any]]) -> list[float] | None:
        """Each setting's expected cost by ``cost=`` (None without one), checked
        here, on the driver, before any task runs."""
        if self.cost is None:
            return None
        return [_checked_cost(self.cost, setting) for setting in settings]

    def __len__(self) -> int:
        n = 1
        for options in self.values.values():
            n *= len(options)
        return n

    def __repr__(self) -> str:
        return "grid(" + ", ".join(f"{k}={len(v)} values" for k, v in self.values.items()) + ")"


class ProductSource(_Combining):
    """Every task of ``base`` (groups or items) with every setting of ``grid``."""

    def __init__(self, base: GroupSource | ItemSource, grid: GridSource) -> None:
        clash = set(base.key_columns) & set(grid.param_columns)
        if clash:
            raise ValueError(f"grid parameter {sorted(clash)[0]!r} has the name of a key column")
        self.base = base
        self.grid = grid

    @property
    def key_columns(self) -> list[str]:
        return self.base.key_columns + self.grid.param_columns

    @property
    def param_columns(self) -> list[str]:
        return self.grid.param_columns

    def __repr__(self) -> str:
        return f"{self.base!r} * {self.grid!r}"


def product(left: Source, right: Source) -> Source:
    """Combine two sources: a grid with a grid, or groups/items with a grid."""
    if not isinstance(left, Source) or not isinstance(right, Source):
        return NotImplemented
    if isinstance(left, GridSource) and isinstance(right, GridSource):
        clash = set(left.values) & set(right.values)
        if clash:
            raise ValueError(f"grid parameter {sorted(clash)[0]!r} appears in both grids")
        return GridSource({**left.values, **right.values},
                          cost=_product_cost(left.cost, right.cost, list(left.values)))
    if isinstance(left, GridSource):
        left, right = right, left
    if isinstance(right, GridSource):
        if isinstance(left, ProductSource):
            return ProductSource(left.base, product(left.grid, right))
        if isinstance(left, (GroupSource, ItemSource)):
            return ProductSource(left, right)
    raise TypeError(
        f"cannot combine {left!r} with {right!r}: only a grid can multiply "
        "groups, items or another grid"
    )


def require_distinct_texts(source: Source) -> None:
    """Refuse two values of a grid parameter that differ but read the same,
    for a run with a store: it keys a model by its values' text
    (:func:`manymodels.inputs.keys.encode_key`, an object's ``str()``), so both
    would be kept, and found, under one key. scikit-learn shortens a long
    estimator's repr with "...", so two pipelines that differ in the middle
    read the same."""
    from .keys import encode_key

    grid = source.grid if isinstance(source, ProductSource) else source
    for name, options in (grid.values.items() if isinstance(grid, GridSource) else ()):
        seen: dict[str, int] = {}
        for position, value in enumerate(options):
            text = encode_key((value,))
            if text in seen:
                raise ValueError(
                    f"values {seen[text]} and {position} of grid parameter {name!r} differ "
                    f"but read the same ({str(value)[:60]!r}...), and a store names each "
                    "model by that text, so it could not tell them apart: give them texts "
                    "of their own (a __repr__ that tells them apart), or make the grid's "
                    "values names and build each one in fit")
            seen[text] = position


def require_picklable_values(source: Source, needed_by: str) -> None:
    """Refuse, before any work, a grid value that cannot be pickled, naming
    its parameter: a store hashes each setting's pickle (its identity), and
    a backend of worker processes sends it pickled. The store's hashing
    raised the pickler's bare error (``cannot pickle '_thread.lock'
    object``), naming no parameter; without a store every task of that
    setting failed, each after the run had started."""
    import cloudpickle

    grid = source.grid if isinstance(source, ProductSource) else source
    for name, options in (grid.values.items() if isinstance(grid, GridSource) else ()):
        for position, value in enumerate(options):
            try:
                cloudpickle.dumps(value)
            except Exception as exc:
                raise TypeError(
                    f"value {position} of grid parameter {name!r} ({str(value)[:60]!r}) "
                    f"cannot be pickled ({type(exc).__name__}: {exc}), which {needed_by} "
                    "needs: make it picklable, or make the grid's values names and build "
                    "each one in fit") from exc


def _checked_cost(cost: Callable, setting: dict[str, Any]) -> float:
    """``cost`` of ``setting`` (given a copy), or the error naming the setting
    (a setting's cost is at least 0: two grids' costs are multiplied)."""
    if isinstance(cost, _ProductCost):  # (each grid's part checked, and named, there)
        return cost(dict(setting))
    number = called_cost(cost, dict(setting), "grid", f"the setting {setting!r}")
    if number < 0:
        raise ValueError(f"grid(cost=...) must return a number of at least 0; for the "
                         f"setting {setting!r} it returned {number!r}")
    return number


class _ProductCost:
    """The cost of a setting of two grids multiplied: the product of each
    one's, each given its own grid's values and checked (its errors name
    that grid's part of the setting)."""

    def __init__(self, left: Callable | None, right: Callable | None,
                 left_names: list[str]) -> None:
        self.left, self.right, self.left_names = left, right, left_names

    def _own(self, cost: Callable | None, setting: dict[str, Any], mine: bool) -> float:
        part = {name: value for name, value in setting.items()
                if (name in self.left_names) == mine}
        return 1.0 if cost is None else _checked_cost(cost, part)

    def __call__(self, setting: dict[str, Any]) -> float:
        return self._own(self.left, setting, True) * self._own(self.right, setting, False)


def _product_cost(left: Callable | None, right: Callable | None,
                  left_names: list[str]) -> Callable | None:
    """The cost of two grids' settings multiplied (None where neither has one)."""
    if left is None and right is None:
        return None
    return _ProductCost(left, right, left_names)


def grid(values: Mapping[str, Iterable[Any]] | None = None, /, *,
         cost: Callable[[dict[str, Any]], float] | None = None,
         **more: Iterable[Any]) -> GridSource:
    """One task per combination of values; ``fit`` receives them as keywords.

    ``cost`` maps a setting (the dict of its values) to its expected cost, so
    that the most costly settings start first and the last to finish is not
    the largest (``cost=lambda s: s["n_estimators"]``); without it, settings
    start in the grid's order. Times groups, a task's cost is its group's
    (its rows) times its setting's. Values may also come as a mapping first,
    for a parameter named ``cost``: ``grid({"cost": [1, 2]})``.
    """
    merged = dict(values or {})
    clash = set(merged) & set(more)
    if clash:
        raise ValueError(f"grid parameter {sorted(clash)[0]!r} is given twice")
    return GridSource({**merged, **more}, cost=cost)
