"""Issue 37, item 2: the code identity covers the wrapper around ``fit`` and
everything it wraps (``functools.wraps``, ``functools.partial``, a
class-based decorator, ``staticmethod``), so editing any of them retrains.

Each version of the user's module is a real file, imported fresh under one
module name (as a re-run of a script imports it), from its own folder."""

from __future__ import annotations

import functools
import importlib
import importlib.util
import os
import subprocess
import sys
import textwrap
from collections.abc import Callable

import pandas as pd
import pytest

import manymodels as mm

MODULE = "mm_user_decorated"

#: ``{factor}`` is what an edit of the wrapper changes: the wrapped ``fit`` stays as it is
SOURCES = {
    "wraps": """
        import functools

        def deco(f):
            @functools.wraps(f)
            def w(df, **params):
                v = f(df, **params) * {factor}
                return [v], {{"a": v}}
            return w

        @deco
        def fit(df, offset=0):
            return 1 + offset

        def user_fit():
            return fit
    """,
    "partial": """
        import functools

        def deco(f):
            @functools.wraps(f)
            def w(df, **params):
                v = f(df, **params) * {factor}
                return [v], {{"a": v}}
            return w

        @deco
        def fit(df, offset=0):
            return 1 + offset

        def user_fit():
            return functools.partial(fit, offset=0)
    """,
    "class": """
        import functools

        class Deco:
            def __init__(self, f):
                functools.update_wrapper(self, f)
                self.f = f

            def __call__(self, df):
                v = self.f(df) * {factor}
                return [v], {{"a": v}}

        @Deco
        def fit(df):
            return 1

        def user_fit():
            return fit
    """,
    "staticmethod": """
        import functools

        def deco(f):
            @functools.wraps(f)
            def w(df):
                v = f(df) * {factor}
                return [v], {{"a": v}}
            return w

        class Fits:
            @staticmethod
            @deco
            def fit(df):
                return 1

        def user_fit():
            return Fits.__dict__["fit"]  # the staticmethod object itself
    """,
}


def _import_fresh(tmp_path, monkeypatch, kind: str, factor: int) -> Callable:
    """The user's ``fit`` from the module file of this version, imported anew."""
    folder = tmp_path / f"{kind}-{factor}"
    folder.mkdir(exist_ok=True)
    path = folder / f"{MODULE}.py"
    path.write_text(textwrap.dedent(SOURCES[kind]).format(factor=factor))
    spec = importlib.util.spec_from_file_location(MODULE, path)
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, MODULE, module)
    spec.loader.exec_module(module)
    return module.user_fit()


@pytest.mark.parametrize("kind", list(SOURCES))
def test_editing_the_wrapper_around_fit_retrains(tmp_path, monkeypatch, kind):
    table = pd.DataFrame({"g": ["a", "b"]})
    store = tmp_path / "s"

    def train(factor: int) -> mm.Run:
        fit = _import_fresh(tmp_path, monkeypatch, kind, factor)
        return mm.train(fit, mm.groups(table, by="g"), store=store, backend="serial",
                        progress=False)

    first = train(10)
    assert not first.results["reused"].any()
    assert first.models["a"] == [10]
    again = train(10)  # the same code, imported again: nothing to retrain
    assert again.results["reused"].all()
    edited = train(20)  # only the wrapper's code changed
    assert not edited.results["reused"].any(), edited.results
    assert edited.models["a"] == [20] and edited.models["b"] == [20]
    assert edited.results["a"].tolist() == [20, 20]
    assert mm.Store(store).models()["a"] == [20]


def test_a_wrapper_keeps_its_own_label_beside_what_it_wraps():
    """functools.wraps copies the wrapped function's name onto the wrapper:
    both must still count, each under its own label."""
    from manymodels.identity.hashing import code_identity

    def deco(f):
        @functools.wraps(f)
        def w(df):
            return f(df)
        return w

    def fit(df):
        return df

    _, detail = code_identity(deco(fit))
    labels = [label for label in detail["sources"] if label.startswith("function:")
              and ":" not in label.removeprefix("function:")]
    assert any(label.endswith("deco.<locals>.w") for label in labels), labels
    assert any(label.endswith("<locals>.fit") for label in labels), labels


def _scaled(factor):
    def deco(f):
        @functools.wraps(f)
        def w(df):
            return f(df) * factor
        return w
    return deco


def test_each_of_two_wrappers_from_one_decorator_counts():
    """Two wrappers made by one decorator share their code and qualified
    name: the values each one's closure holds must both count."""
    from manymodels.identity.hashing import code_identity

    def fit(df):
        return df

    def identity(inner: int) -> str:
        return code_identity(_scaled(2)(_scaled(inner)(fit)))[0]

    assert identity(3) == identity(3)
    assert identity(3) != identity(4)



def _make_closure_fit(offset):
    def closure_fit(df):  # reads ``offset`` from its closure
        return [len(df) + offset]
    return closure_fit


@pytest.mark.parametrize("fit", [_make_closure_fit(3), lambda df: [len(df)]],
                         ids=["closure", "lambda"])
def test_a_functions_source_is_its_own_lines_closure_or_not(fit):
    """The code identity hashes the lines of ``fit`` itself (found through its
    module, not by scanning every module), with closures and lambdas alike:
    the same text ``inspect`` reads from its code object."""
    import inspect

    from manymodels.identity.codehash import code_identity, digest

    _, detail = code_identity(fit, None, lambda value: repr(value))
    own = [value for label, value in detail["sources"].items()
           if label.endswith(getattr(fit.__code__, "co_qualname", fit.__qualname__))]
    assert own == [digest(inspect.getsource(fit.__code__))]


def test_code_whose_file_is_gone_is_not_read_from_its_modules_loader():
    """A function compiled under a path that is not on disk, into a module's
    namespace (a by-value pickle, code exec'd there), has no source: its
    module's loader must not lend it the module's own lines at its line numbers."""
    import inspect
    import json  # noqa: F401  (loaded: its loader is the one asked)

    from manymodels.identity.codehash import _function_source

    namespace = {"__name__": "json"}  # a module whose loader has its own lines
    exec(compile("\n" * 12 + "def fit(df):\n    return df\n", "/nonexistent/cell_17.py",
                 "exec"), namespace)
    with pytest.raises(OSError):
        inspect.getsource(namespace["fit"].__code__)
    with pytest.raises(OSError):
        _function_source(namespace["fit"])


class _Columns:
    """A config object holding a set of texts (pickled in its iteration
    order, which for texts is the hash seed's)."""

    def __init__(self, names):
        self.names = names


class _Names(frozenset):
    pass


def _two_orders(make):
    """Two equal sets of texts that iterate in different orders (a set's
    order follows the order its elements went in, where they collide: with
    some hash seeds forty texts do not, so more are taken until they do)."""
    for count in (40, 200, 1000, 5000):
        words = [f"column_{i}" for i in range(count)]
        first, second = make(words), make(reversed(words))
        assert first == second
        if list(first) != list(second):
            return first, second
    raise AssertionError("no two orders of 5,000 texts made sets that iterate apart")


@pytest.mark.parametrize("make", [set, frozenset, _Names], ids=["set", "frozenset", "subclass"])
def test_an_objects_set_of_texts_hashes_alike_whatever_its_order(make):
    """A set of texts inside an object (a shared object, a global fit reads)
    was hashed in its iteration order: that order changes with the hash
    seed, so each process gave it another identity and its models were
    never reused. Equal sets hash alike; another set, otherwise."""
    from manymodels.identity.valuehash import value_hash

    first, second = _two_orders(make)
    assert value_hash(_Columns(first)) == value_hash(_Columns(second))
    assert value_hash({"nested": [_Columns(first)]}) == value_hash({"nested": [_Columns(second)]})
    assert value_hash(_Columns(first)) != value_hash(_Columns(make(["column_0"])))
    numbers = {3, 1, 2}  # (a set of numbers pickles as it did: its order is the same everywhere)
    assert value_hash(_Columns(numbers)) == value_hash(_Columns({1, 2, 3}))


def test_a_set_constant_of_code_without_source_hashes_alike_whatever_its_order():
    """Code without source is hashed by its bytecode and constants: a
    frozenset constant (``x in {"a", "b"}``) by its elements, not its repr's order."""
    from manymodels.identity.codehash import _code_text

    code = compile("def fit(df):\n    return df.name in {'a', 'b'}\n", "<cell>", "exec")
    fit_code = next(c for c in code.co_consts if isinstance(c, type(code)))
    first, second = _two_orders(frozenset)
    constants = [first if isinstance(c, frozenset) else c for c in fit_code.co_consts]
    with_first = fit_code.replace(co_consts=tuple(constants))
    with_second = fit_code.replace(co_consts=tuple(
        second if isinstance(c, frozenset) else c for c in fit_code.co_consts))
    assert any(isinstance(c, frozenset) for c in fit_code.co_consts)
    assert _code_text(with_first) == _code_text(with_second)


#: Two lambdas on one line: their source, as ``inspect`` reads it, is that line for both
_ONE_LINE = {"x1": lambda df: [len(df) * 1], "x10": lambda df: [len(df) * 10]}


def test_two_lambdas_written_on_one_line_have_identities_of_their_own(tmp_path):
    """A lambda's source is its whole line: two lambdas on one line hashed
    alike, and a run of the second reused the models of the first (its
    results were the first's). Each one's code counts too."""
    from manymodels.identity.hashing import code_identity

    assert code_identity(_ONE_LINE["x1"])[0] == code_identity(_ONE_LINE["x1"])[0]
    assert code_identity(_ONE_LINE["x1"])[0] != code_identity(_ONE_LINE["x10"])[0]
    frame = pd.DataFrame({"g": ["a", "b", "b"]})
    for name, factor in (("x1", 1), ("x10", 10)):
        run = mm.train(_ONE_LINE[name], mm.groups(frame, by="g"), store=tmp_path / "s",
                       backend="serial", progress=False)
        assert run.summary().reused == 0
        assert [run.models[key] for key in ("a", "b")] == [[factor], [2 * factor]]


def _lookup_total(item, lookup):
    return float(lookup["x"].sum()) + item


def test_a_shared_frame_is_hashed_by_its_content_and_what_a_model_can_read_of_it(tmp_path):
    """A pandas DataFrame or Series among the shared objects was refused with a
    store ('cannot be hashed': the hash read a frame's ``dtype``, a series'
    ``dtypes``): it hashes by its rows, its columns' names and types, its
    index's names and its categories' order, so an equal one is reused and
    another is not."""
    import pandas as pd

    from manymodels.identity.valuehash import value_hash

    frame = pd.DataFrame({"x": [1.0, 2.0], "c": pd.Categorical(["a", "b"])})
    store = tmp_path / "store"

    def run(lookup):
        return mm.train(_lookup_total, mm.items([1, 2]), shared={"lookup": lookup},
                        store=store, backend="serial", progress=False)

    assert not run(frame).results["reused"].any()
    assert run(frame.copy()).results["reused"].all()
    assert not run(frame.assign(x=[1.0, 3.0])).results["reused"].any()
    named = frame.rename_axis("day")
    reordered = frame.assign(c=frame["c"].cat.reorder_categories(["b", "a"]))
    hashes = {value_hash(value) for value in (frame, named, reordered, frame["x"],
                                              frame["x"].rename("y"), frame.astype({"x": int}))}
    assert len(hashes) == 6
    lists = pd.DataFrame({0: [[1, 2], [3]]})  # values pandas cannot hash: each by its own
    assert value_hash(lists) == value_hash(lists.copy())
    assert value_hash(lists) != value_hash(pd.DataFrame({0: [[1, 2], [4]]}))


# -- values a model tells apart, hashed apart; equal ones alike ------------------------
def _frame_of(*values):
    return pd.DataFrame({"v": pd.Series(list(values), dtype=object)})


@pytest.mark.parametrize("first, second", [
    ((1, "x"), ("1", "x")),                      # a number beside texts, and its text
    ((b"a",), ("a",)),                           # bytes and the text they spell
    ((__import__("decimal").Decimal("1.0"),), ("1.0",)),
    (((1, 2),), ("(1, 2)",)),
    ((None, "a"), ("None", "a")),
], ids=["mixed", "bytes", "decimal", "tuple", "none"])
def test_an_object_column_is_hashed_by_what_its_values_are_not_their_text(first, second):
    """pandas hashes an object column's values by their text: a column of
    ``1`` and ``"x"`` hashed as one of ``"1"`` and ``"x"`` (so bytes as their
    text, a decimal or a tuple as its printout), and a shared frame whose
    values changed so reused the old models. Each value counts as what it is."""
    from manymodels.identity.valuehash import value_hash

    assert value_hash(_frame_of(*first)) != value_hash(_frame_of(*second))
    assert value_hash(_frame_of(*first)) == value_hash(_frame_of(*first).copy())
    indexed = pd.Series([1, 2], index=pd.Index(list(first) * 2, dtype=object)[:2])
    assert value_hash(indexed) != value_hash(indexed.set_axis(
        pd.Index(list(second) * 2, dtype=object)[:2]))


def test_a_column_pandas_cannot_hash_is_hashed_value_by_value():
    """A series of Arrow lists made pandas' hash raise (``unhashable type``):
    it could not be shared with a store. Each value counts by its own hash."""
    import pyarrow as pa

    from manymodels.identity.valuehash import value_hash

    kind = pd.ArrowDtype(pa.list_(pa.int64()))
    lists = pd.DataFrame({"v": pd.Series([[1, 2], [3]], dtype=kind)})
    assert value_hash(lists) == value_hash(lists.copy())
    assert value_hash(lists) != value_hash(pd.DataFrame({"v": pd.Series([[1, 2], [4]],
                                                                     dtype=kind)}))
    assert value_hash(lists["v"]) == value_hash(lists["v"].copy())
    assert value_hash(lists["v"]) != value_hash(pd.Series([[1, 2], [4]], dtype=kind, name="v"))


def test_a_changed_value_of_a_shared_frame_retrains_and_says_so(tmp_path):
    """End to end: a shared frame whose ``1`` became ``"1"`` was reused."""
    store = tmp_path / "store"

    def run(lookup):
        return mm.train(_count_ints, mm.items([1, 2]), shared={"lookup": lookup},
                        store=store, backend="serial", progress=False)

    assert run(_frame_of(1, "x")).models[1] == 1
    assert run(_frame_of(1, "x")).results["reused"].all()
    changed = run(_frame_of("1", "x"))
    assert not changed.results["reused"].any() and changed.models[1] == 0
    assert "the shared object 'lookup' changed" in changed.why_not_reused(1)


def _count_ints(item, lookup):
    return sum(isinstance(value, int) for value in lookup["v"])


def test_arrow_values_hash_their_types():
    """An Arrow array or table was hashed as pandas converts it: ``int64``
    with a null and ``double`` with a NaN, the same there, hashed alike."""
    import pyarrow as pa

    from manymodels.identity.valuehash import value_hash

    assert value_hash(pa.array([1, None])) != value_hash(pa.array([1.0, float("nan")]))
    assert value_hash(pa.table({"a": [1, None]})) != value_hash(
        pa.table({"a": [1.0, float("nan")]}))
    assert value_hash(pa.table({"a": [1, None]})) == value_hash(pa.table({"a": [1, None]}))


def test_an_arrays_mask_and_shape_count():
    """A masked array hashed by its bytes alone (a changed mask reused the
    old model), and a 0-d array as the 1-d array of its one value."""
    import numpy as np

    from manymodels.identity.valuehash import value_hash

    masked = np.ma.array([1, 2, 3], mask=[0, 1, 0])
    assert value_hash(masked) == value_hash(masked.copy())
    assert value_hash(masked) != value_hash(np.ma.array([1, 2, 3], mask=[0, 0, 0]))
    assert value_hash(masked) != value_hash(masked.data)
    assert value_hash(np.array(5)) != value_hash(np.array([5]))


def test_a_tensor_or_module_hashes_by_its_content():
    """A PyTorch tensor's pickle names its storage by its address: each copy,
    and each process, hashed another, so a ``fit`` reading a tensor or a
    module was never reused. Equal ones hash alike, others apart."""
    import copy

    torch = pytest.importorskip("torch")
    from manymodels.identity.valuehash import value_hash

    tensor = torch.arange(6.0).reshape(2, 3)
    assert value_hash(tensor) == value_hash(tensor.clone())
    assert value_hash(tensor) != value_hash(tensor.T)
    assert value_hash(tensor) != value_hash(tensor.double())
    module = torch.nn.Linear(2, 1)
    assert value_hash(module) == value_hash(copy.deepcopy(module))
    changed = copy.deepcopy(module)
    with torch.no_grad():
        changed.weight += 1
    assert value_hash(module) != value_hash(changed)


def test_a_container_that_holds_itself_hashes():
    """A list or dict that holds itself failed with Python's bare
    ``RecursionError`` (a shared object refused, an item crashing the run)."""
    from manymodels.identity.valuehash import value_hash

    def looped(tail):
        made = [1, tail]
        made.append(made)
        return made

    assert value_hash(looped(2)) == value_hash(looped(2))
    assert value_hash(looped(2)) != value_hash(looped(3))
    found = {"a": 1}
    found["self"] = found
    assert value_hash(found) == value_hash(found)


def test_what_a_dict_gives_for_a_missing_key_and_its_unordered_keys_count():
    """A defaultdict hashed as the dict of its items (``int``'s and
    ``list``'s alike), and a dict keyed by a frozenset of texts by the
    key's repr, whose order changes with the hash seed."""
    import collections

    from manymodels.identity.valuehash import value_hash

    assert value_hash(collections.defaultdict(int, a=1)) != value_hash(
        collections.defaultdict(list, a=1))
    # a Counter gives 0 for a missing key where a dict raises; an OrderedDict
    # compares its order: neither is the dict of its items
    plain = value_hash({"a": 1})
    assert value_hash(collections.Counter(a=1)) != plain
    assert value_hash(collections.OrderedDict(a=1)) != plain
    assert value_hash(collections.Counter(a=1)) == value_hash(collections.Counter(a=1))
    first, second = _two_orders(frozenset)
    assert value_hash({first: 1}) == value_hash({second: 1})
    assert value_hash({first: 1}) != value_hash({frozenset(["column_0"]): 1})


def test_an_item_that_cannot_be_hashed_is_named_with_its_key(tmp_path):
    """An item a store cannot hash failed with pickle's own words alone,
    naming neither the item nor its key."""
    import threading

    with pytest.raises(TypeError, match=r"the item of key 1 \(lock\) cannot be hashed"):
        mm.train(lambda item: 1, mm.items(["a", threading.Lock()]),
                 store=tmp_path / "s", backend="serial", progress=False)


def test_code_without_source_counts_its_arguments_names():
    """Code without source (``exec``, a notebook's cell gone) was hashed by
    its bytecode, which reads locals by position: swapping two arguments'
    names (``a``, ``b``) kept the identity, and a grid's ``a=5`` reused
    results computed as ``b=5``."""
    from manymodels.identity.hashing import code_identity

    first, second = {}, {}
    exec("def fit(df, a=1, b=2):\n    return a - b\n", first)
    exec("def fit(df, b=1, a=2):\n    return b - a\n", second)
    assert code_identity(first["fit"])[0] != code_identity(second["fit"])[0]


def test_a_notebooks_class_and_the_global_its_property_reads_count(monkeypatch):
    """A ``__main__`` class's methods were followed to the globals they
    read, its properties' getters were not: ``K = 2`` edited to ``K = 3``
    kept the identity of a ``fit`` reading ``S.k``, and reused its models.
    A class without source (a notebook's) was hashed by its pickle, its
    name alone: an edited class attribute (``SCALE = 1`` to ``5``) too."""
    import types

    from manymodels.identity.hashing import code_identity

    def fit_reading(k, scale=1):
        main = types.ModuleType("__main__")  # a notebook's: its code has no file
        monkeypatch.setitem(sys.modules, "__main__", main)
        main.K = k
        exec(f"class Scaler:\n    SCALE = {scale}\n    @property\n    def k(self):\n"
             "        return K * self.SCALE\nS = Scaler()\ndef fit(df):\n    return S.k\n",
             vars(main))
        return code_identity(main.fit)[0]

    assert fit_reading(2) == fit_reading(2)
    assert fit_reading(2) != fit_reading(3)
    assert fit_reading(2) != fit_reading(2, scale=5)


def test_a_global_set_by_the_script_that_a_helper_called_by_module_reads_counts(
        tmp_path, monkeypatch):
    """``helpers.ALPHA`` read by ``fit`` counted by its value, but a
    function called as ``helpers.f()`` was left to its module's file: a
    script's ``helpers.ALPHA = 2``, which ``f`` reads, reused the models
    trained with ``helpers.ALPHA = 1``."""
    from manymodels.identity.hashing import code_identity

    (tmp_path / "mm_user_helpers.py").write_text("ALPHA = 0\n\ndef f():\n    return ALPHA\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "mm_user_helpers", raising=False)
    helpers = importlib.import_module("mm_user_helpers")
    namespace = {"__name__": "__main__", "helpers": helpers}
    exec("def fit(df):\n    return helpers.f()\n", namespace)
    hashes = []
    for alpha in (1, 1, 2):
        monkeypatch.setattr(helpers, "ALPHA", alpha)
        hashes.append(code_identity(namespace["fit"])[0])
    assert hashes[0] == hashes[1] != hashes[2]


#: Values whose cloudpickle differs in each process: a class made in a
#: function (cloudpickle names it by a random id), a set of texts in an
#: object array or a closure (in the hash seed's order), a class of the
#: script's own in an object array (pickled by value, by that random id)
SEEDED_SCRIPT = """
import subprocess
import sys
import numpy as np
from manymodels.identity.valuehash import value_hash

def made_in_a_function(size):
    class Local:
        def __init__(self):
            self.size = size
    return Local

class Script:
    def __init__(self):
        self.names = {"alpha", "beta", "gamma", "delta"}

def closing_over(names):
    return lambda df: len(names)

def dataclass_made_in_a_function(names):
    import dataclasses

    @dataclasses.dataclass
    class Config:
        columns: frozenset = frozenset(names)
    return Config()

def typevar_made_in_a_function(size):
    import typing
    return typing.TypeVar(f"T{size}")

size = int(sys.argv[1])
words = {f"column_{i}" for i in range(size)}
values = [made_in_a_function(size), made_in_a_function(size)(),
          np.array([words, {"x", "y"}], dtype=object), np.array([Script()], dtype=object),
          closing_over(words), dataclass_made_in_a_function(words),
          [typevar_made_in_a_function(size)]]
print(" ".join(value_hash(value) for value in values))
"""


def test_values_only_cloudpickle_pickles_hash_alike_in_every_process(tmp_path):
    """A class made in a function, a set of texts inside an object array or
    a lambda's closure, a script's class inside an object array, a
    dataclass made in a function (its made ``__doc__`` holds its defaults'
    reprs: a frozenset of texts in the hash seed's order) and a TypeVar made
    in a function were hashed by cloudpickle's pickle, which names such a
    class or TypeVar by an id made anew in each process and writes a set in
    the hash seed's order: their models were never reused by a later run.
    Equal values hash alike in every process; a changed one apart."""
    script = tmp_path / "hashes.py"
    script.write_text(SEEDED_SCRIPT)

    def hashes(seed, size):
        done = subprocess.run([sys.executable, str(script), str(size)], capture_output=True,
                              text=True, env={**os.environ, "PYTHONHASHSEED": seed})
        assert done.returncode == 0, done.stderr
        return done.stdout.split()

    first, second = hashes("1", 8), hashes("2", 8)
    assert first == second
    changed = hashes("1", 9)
    assert [a != b for a, b in zip(first, changed)] == [True, True, True, False, True,
                                                         True, True]


def test_an_object_array_of_plain_values_hashes_as_it_did():
    """An object array whose pickle is the same in every process keeps
    cloudpickle's pickle as its hash: its identities did not change."""
    import cloudpickle
    import numpy as np

    from manymodels.identity.codehash import digest
    from manymodels.identity.valuehash import value_hash

    values = [1, "a", 2.5, None, (1, "b"), {3, 1}]
    assert value_hash(np.array(values, dtype=object)) == digest(cloudpickle.dumps(values))


@pytest.mark.parametrize("first, second", [
    (("x", None), ("x", float("nan"))),
    (("x", None), ("x", pd.NA)),
    (("x", None, float("nan")), ("x", float("nan"), None)),
], ids=["none-nan", "none-na", "order"])
def test_an_object_columns_missing_values_count_by_what_they_are(first, second):
    """pandas hashes None, ``pd.NA`` and NaN in an object column alike: a
    shared frame whose None became NaN (which ``x is None`` tells apart)
    reused the old models. A NaN keeps pandas' hash (a column of texts with
    NaNs hashes as it did)."""
    import numpy as np

    from manymodels.identity.valuehash import _column_hashes, value_hash

    assert value_hash(_frame_of(*first)) != value_hash(_frame_of(*second))
    assert value_hash(_frame_of(*first)) == value_hash(_frame_of(*first).copy())
    with_nan = _frame_of("x", float("nan"))["v"]
    assert np.array_equal(_column_hashes(with_nan, "v", []),
                          pd.util.hash_pandas_object(with_nan, index=False).to_numpy())


def test_a_frames_attrs_and_column_level_names_count():
    """``attrs`` and the columns' level names, which a ``fit`` can read, were
    left out of a shared frame's hash: a changed one reused the old models."""
    from manymodels.identity.valuehash import value_hash

    frame = pd.DataFrame({"a": [1, 2]})
    with_attrs = frame.copy()
    with_attrs.attrs["unit"] = "kg"
    assert value_hash(frame) != value_hash(with_attrs)
    other = with_attrs.copy()
    other.attrs["unit"] = "g"
    assert value_hash(with_attrs) != value_hash(other)
    assert value_hash(frame) != value_hash(frame.rename_axis(columns="measure"))
    assert value_hash(frame["a"]) != value_hash(with_attrs["a"])


def _value_kinds(df):
    return pd.DataFrame({"kind": [type(value).__name__ for value in df["v"]]})


@pytest.mark.parametrize("first, second", [
    ((1, "x", 2.5), ("1", "x", 2.5)),
    ((b"x", b"y"), ("x", "y")),
    ((None, "x", 2.5), (float("nan"), "x", 2.5)),
], ids=["mixed", "bytes", "none"])
def test_a_changed_object_column_of_map_partitions_runs_again(tmp_path, first, second):
    """``map_partitions`` over a pandas frame hashed its rows by pandas'
    ``hash_pandas_object``: ``1`` as ``"1"``, bytes as their text, None as
    NaN. A re-run with such a change reused the old output (its kinds were
    the old values')."""
    def run(values):
        return mm.map_partitions(_value_kinds, _frame_of(*values), partitions=1,
                                 store=tmp_path / "s", backend="serial")

    assert run(first).attrs["summary"].reused == 0
    assert run(first).attrs["summary"].reused == 1
    changed = run(second)
    assert changed.attrs["summary"].reused == 0
    assert changed["kind"].tolist() == [type(value).__name__ for value in second]


def test_map_partitions_row_hashes_are_pandas_own_where_it_tells_values_apart():
    """A frame whose object columns hold texts and NaNs hashes as pandas does
    (its partitions' identities did not change)."""
    import numpy as np

    from manymodels.identity.valuehash import pandas_row_hashes

    frames = [
        pd.DataFrame({"a": [1, 2, 3], "t": pd.Series(["x", np.nan, "z"], dtype=object),
                      "c": pd.Categorical(["p", "q", "p"])}, index=[5, 6, 7]),
        pd.DataFrame({"a": [1, 2]}, index=pd.MultiIndex.from_arrays(
            [pd.Index(["a", "b"], dtype=object), [1, 2]])),
        pd.DataFrame([[1, 2]], columns=["a", "a"]),
        pd.DataFrame({"a": []}),
    ]
    for frame in frames:
        rows, noted = pandas_row_hashes(frame)
        assert np.array_equal(rows, pd.util.hash_pandas_object(frame, index=True).to_numpy())
        assert noted == ""


def test_an_arrow_float_null_and_nan_hash_apart():
    """An Arrow float null and NaN read alike in pandas, but not in Arrow (a
    sum skips the null): a shared array whose null became NaN reused the
    old models. Without nulls an Arrow value hashes as it did."""
    import pyarrow as pa

    from manymodels.identity.codehash import digest
    from manymodels.identity.valuehash import value_hash

    nan = float("nan")
    assert value_hash(pa.array([1.0, None])) != value_hash(pa.array([1.0, nan]))
    assert value_hash(pa.table({"a": [1.0, None, nan]})) != value_hash(
        pa.table({"a": [1.0, nan, None]}))
    assert value_hash(pa.chunked_array([[1.0, None]])) == value_hash(pa.chunked_array([[1.0],
                                                                                      [None]]))
    plain = pa.table({"a": [1.0, nan]})
    assert value_hash(plain) == digest("arrow", str(plain.schema), value_hash(plain.to_pandas()))


#: A module of the user's whose lambda and local class call a helper it
#: names by reference: ``{factor}`` is the edit of the helper's body
LAMBDA_MODULE = """
def scale(x):
    return x * {factor}

by_lambda = lambda x: scale(x)

def _made():
    class Local:
        def __call__(self, x):
            return scale(x)
    return Local()

by_local_class = _made()
"""


def _apply(item, transform):
    return transform(item)


@pytest.mark.parametrize("name", ["by_lambda", "by_local_class"])
def test_editing_a_helper_that_a_lambda_calls_retrains(tmp_path, monkeypatch, name):
    """A value only cloudpickle pickles (a lambda, a local class's
    instance) holds its own code but names a helper of the user's module
    without its code: editing the helper's body left the shared object's
    hash as it was, and the old models were reused."""
    store = tmp_path / "store"

    monkeypatch.setattr(sys, "dont_write_bytecode", True)

    def train(factor: int) -> mm.Run:  # (one file: a lambda's pickle holds its file's name)
        path = tmp_path / "mm_user_lambda.py"
        path.write_text(LAMBDA_MODULE.format(factor=factor))
        spec = importlib.util.spec_from_file_location("mm_user_lambda", path)
        module = importlib.util.module_from_spec(spec)
        monkeypatch.setitem(sys.modules, "mm_user_lambda", module)
        spec.loader.exec_module(module)
        return mm.train(_apply, mm.items([1, 2]), shared={"transform": getattr(module, name)},
                        store=store, backend="serial", progress=False)

    assert train(1).models[2] == 2
    assert train(1).results["reused"].all()
    edited = train(3)
    assert not edited.results["reused"].any() and edited.models[2] == 6


def _column_type(df):
    return str(df["n"].dtype)


@pytest.mark.parametrize("first, second", [("int64", "Int64"), ("float64", "Float64")])
def test_a_group_column_made_a_nullable_type_of_the_same_name_length_retrains(
        tmp_path, first, second):
    """A group's data hash read pandas' note of the column types as the
    Arrow schema prints it, cut short: past its first 70 characters only
    its length counted, and ``int64`` made ``Int64`` (which ``fit`` gets)
    reused the model made from the other type."""
    store = tmp_path / "store"

    def run(kind):
        table = pd.DataFrame({"g": ["a", "a", "b"], "n": pd.Series([1, 2, 3], dtype=kind)})
        return mm.train(_column_type, mm.groups(table, by="g"), store=store,
                        backend="serial", progress=False)

    assert run(first).models["a"] == first
    assert run(first).results["reused"].all()
    changed = run(second)
    assert not changed.results["reused"].any() and changed.models["a"] == second


def test_text_columns_storage_counts_in_a_shared_frame_as_in_a_tables_groups():
    """``string[python]`` and ``string[pyarrow]`` print alike: a table's
    groups hashed them apart (Arrow's ``string`` and ``large_string``),
    a shared frame alike. Both tell them apart; Arrow's storage hashes as
    it did."""
    import pyarrow as pa

    from manymodels.identity.rowhash import schema_text
    from manymodels.identity.valuehash import value_hash

    def frame(kind):
        return pd.DataFrame({"v": pd.Series(["x", None], dtype=kind)})

    python, arrow = frame("string[python]"), frame("string[pyarrow]")
    assert value_hash(python) != value_hash(arrow)
    assert value_hash(arrow) == value_hash(frame("string[pyarrow]"))
    schemas = [schema_text(pa.Table.from_pandas(f, preserve_index=False).schema)
               for f in (python, arrow)]
    assert schemas[0] != schemas[1]


class _Settings:
    def __init__(self, path):
        self.path = path


def test_a_path_inside_an_object_counts_by_its_files_content(tmp_path):
    """A path is hashed by its file's content; inside an object (a config
    that names the file ``fit`` reads), by its pickle, its text alone: an
    edited file reused the old models."""
    from pathlib import Path

    from manymodels.identity.valuehash import value_hash

    path = tmp_path / "lookup.csv"
    path.write_text("a,1\n")
    values = [_Settings(path), _Settings(Path(path)), [lambda: path]]
    before = [value_hash(value) for value in values]
    assert before == [value_hash(value) for value in values]
    path.write_text("a,2\n")
    assert all(a != b for a, b in zip(before, [value_hash(value) for value in values]))


def _fit_sees_types(df):
    """A model of the types and categories ``fit`` got."""
    seen = {name: str(df[name].dtype) for name in df.columns}
    seen.update({f"{name} categories": list(df[name].cat.categories)
                 for name in df.columns if isinstance(df[name].dtype, pd.CategoricalDtype)})
    return seen, {"seen": repr(seen)}


def test_a_group_is_not_reused_when_its_columns_categories_change(tmp_path):
    """``fit`` gets a categorical column with all its categories, in their
    order (its codes, a one-hot width): the rows hashed by their values
    alone, so reordered categories, or one more that the group does not
    hold, reused models fitted on the others."""
    store = tmp_path / "store"
    frame = pd.DataFrame({"g": [1, 1, 2], "c": pd.Categorical(["a", "b", "a"]),
                          "y": [1.0, 2.0, 3.0]})

    def train(table):
        return mm.train(_fit_sees_types, mm.groups(table, by="g"), backend="serial",
                        store=store, progress=False).results

    assert not train(frame)["reused"].any()
    assert train(frame.copy())["reused"].all()  # unchanged: reused
    reordered = frame.assign(c=frame["c"].cat.reorder_categories(["b", "a"]))
    results = train(reordered)
    assert not results["reused"].any()
    assert "['b', 'a']" in results["seen"].iloc[0]
    wider = frame.assign(c=frame["c"].cat.add_categories(["z"]))
    assert not train(wider)["reused"].any()
    # a categorical key: a new group's category added leaves the others reused
    keyed = frame.assign(g=pd.Categorical(["s1", "s1", "s2"]))
    assert not train(keyed)["reused"].any()
    grown = pd.concat([keyed, pd.DataFrame({"g": ["s3"], "c": ["a"], "y": [4.0]})])
    grown = grown.astype({"g": pd.CategoricalDtype(["s1", "s2", "s3"]),
                          "c": frame["c"].dtype})
    assert train(grown)["reused"].tolist() == [True, True, False]


def test_an_engine_frames_group_is_not_reused_when_fit_gets_another_pandas_type(tmp_path):
    """A Dask partition's staged rows reach ``fit`` with pandas' types
    (``Int64``, not ``int64``), but the group's data hash left them out:
    an ``int64`` column made ``Int64`` reused the models fitted on
    ``int64``. An unchanged frame is still reused."""
    dd = pytest.importorskip("dask.dataframe")
    store = tmp_path / "store"
    frame = pd.DataFrame({"g": [1, 1, 2, 2], "i": [1, 2, 3, 4], "y": [1.0, 2.0, 3.0, 4.0]})

    def train(table):
        return mm.train(_fit_sees_types, mm.groups(dd.from_pandas(table, npartitions=2),
                                                   by="g"),
                        backend="serial", store=store, progress=False).results

    assert not train(frame)["reused"].any()
    assert train(frame.copy())["reused"].all()
    results = train(frame.astype({"i": "Int64"}))
    assert not results["reused"].any()
    assert "'i': 'Int64'" in results["seen"].iloc[0]
    assert train(frame.astype({"i": "Int64"}))["reused"].all()
