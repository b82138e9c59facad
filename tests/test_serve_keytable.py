"""The serving catalog's key -> model map (serve/keytable.py): Arrow columns
searched in bytes, answering as the dict and TypedKeys it replaced."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from manymodels.inputs.keys import TypedKeys, encode_key
from manymodels.serve import keytable
from manymodels.serve.keytable import KeyTable


def test_many_keys_found_as_a_dict_finds_them_in_arrow_columns_not_python_strings():
    n = 200_000
    rng = np.random.default_rng(3)
    order = rng.permutation(n)
    keys = [encode_key((int(k),)) for k in order]
    artifacts = [f"{k:064x}@1/{i * 40}/40" for i, k in enumerate(order)]
    table = KeyTable(pa.array(keys), pa.array(artifacts))
    expected = dict(zip(keys, artifacts))
    assert len(table) == n
    for k in rng.choice(n, 2000, replace=False).tolist():
        assert table.find((k,)) == expected[encode_key((k,))]
    assert table.find((n + 5,)) is None and table.get("[-1]") is None
    # the columns, not two Python strings per key (about 250 bytes a key as a dict)
    assert table.nbytes < 120 * n
    assert sorted(table) == sorted(keys)


def test_a_later_runs_model_replaces_an_earlier_one_and_a_null_never_does():
    earlier = (pa.array(['["a"]', '["b"]', '["c"]']), pa.array(["a1", "b1", "c1"]))
    later = (pa.array(['["b"]', '["c"]', '["d"]']), pa.array(["b2", None, "d2"]))
    table = KeyTable.joined([earlier, later])
    assert {k: table[k] for k in table} == {'["a"]': "a1", '["b"]': "b2", '["c"]': "c1",
                                            '["d"]': "d2"}
    with pytest.raises(KeyError):
        table['["e"]']
    assert len(KeyTable.joined([])) == 0 and KeyTable.joined([]).find(("a",)) is None


@pytest.mark.parametrize("parts", [(1,), ("1",), (1.0,), (True,), ("7", 2), (7.0, "2"),
                                   ("x", 3), (4, "é"), (5,), ("b", False)])
def test_a_key_typed_otherwise_finds_what_typedkeys_finds(parts):
    stored = {encode_key(k): f"m{i}" for i, k in enumerate(
        [(1,), ("7", "2"), (7, 2.0), ("x", "3"), (4, "é"), ("b", 0), ("b", 0.0)])}
    typed = TypedKeys(stored)
    table = KeyTable(pa.array(list(stored)), pa.array(list(stored.values())))
    assert table.find(parts) == typed.find(parts)


def test_keys_of_many_integer_columns_are_indexed_once_as_typedkeys_does(monkeypatch):
    monkeypatch.setattr(keytable, "READINGS_TRIED", 4)
    stored = {encode_key((i, str(i + 1), i + 2)): f"m{i}" for i in range(50)}
    table = KeyTable(pa.array(list(stored)), pa.array(list(stored.values())))
    assert table.find((3, 4, 5)) == "m3"  # 4 * 3 * 3 readings: the index
    assert table._typed is not None
    assert table.find((3.0, "4", "5")) == TypedKeys(stored).find((3.0, "4", "5")) == "m3"
    assert table.find((99, 1, 1)) is None


def test_unicode_keys_sort_and_are_found_by_their_utf8_bytes():
    words = ["zebra", "Äpfel", "apple", "日本", "émile", "a", "ab", ""]
    table = KeyTable(pa.array([encode_key((w,)) for w in words]),
                     pa.array([f"m-{w}" for w in words]))
    for word in words:
        assert table.find((word,)) == f"m-{word}"
    assert table.find(("b",)) is None


def test_artifacts_are_given_back_exactly_as_written_packed_bare_or_otherwise():
    digest = "ab" * 32
    given = [f"{digest}@3/0/151", digest, f"{digest}@12/9000001/40", f"{digest}@1/007/40",
             f"{digest.upper()}@1/7/40", f"{digest}@1/7", "not-a-digest", f"{digest}@-1/2/3"]
    table = KeyTable(pa.array([f"[{i}]" for i in range(len(given))]), pa.array(given))
    assert [table.find((i,)) for i in range(len(given))] == given
    assert len(table._artifacts.other) == 5  # the last five, kept as their text
