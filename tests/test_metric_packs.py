"""Metrics in packs: worker processes send a part's float metrics as one
array (MetricsPack); the driver reads them as columns, and the store keeps
them as JSON made by Arrow that reads back as the very same floats."""

from __future__ import annotations

import json
import math
import pickle
import struct

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

import manymodels as mm
from manymodels.engine.execution import metrics_dict
from manymodels.engine.metriccolumns import metric_columns, metrics_texts, text_columns
from manymodels.engine.metricpacks import MetricsPack
from manymodels.engine.metrictext import float_texts, pack_texts
from manymodels.engine.partpacks import PartPacker, distinct_objects

pytestmark = pytest.mark.usefixtures("no_leftovers")

AWKWARD = [0.0, -0.0, 1.0, -1.0, 0.1, 1e-05, 3.5e-05, 1e-07, 123456789.0, 1e15, 1e16,
           1e22, 1.5e300, -2.5e-300, 5e-324, 2.2250738585072014e-308,
           1.7976931348623157e308, 9007199254740993.0, 0.30000000000000004, 100.0]


def _same_float(got: object, want: float) -> bool:
    if type(got) is not float:
        return False
    if math.isnan(want):
        return math.isnan(got)
    return struct.pack("<d", got) == struct.pack("<d", want)  # -0.0 kept too


def test_float_texts_read_back_as_the_same_floats_with_json_and_arrow():
    rng = np.random.default_rng(5)
    bits = rng.integers(0, 2**63, size=20_000, dtype=np.uint64) | (
        rng.integers(0, 2, size=20_000, dtype=np.uint64) << np.uint64(63))
    random_floats = bits.view(np.float64)
    values = np.concatenate([AWKWARD, [math.nan, math.inf, -math.inf],
                             random_floats[np.isfinite(random_floats)],
                             rng.normal(size=2000), rng.integers(-99, 99, 500).astype(float)])
    texts = float_texts(values).to_pylist()
    for text, value in zip(texts, values.tolist()):
        assert _same_float(json.loads(text), value), (text, value)
    # Arrow's JSON reader (how the store reads a run's metrics at once)
    finite = np.isfinite(values)
    objects = pa.array(['{"m": ' + t + '}' for t, ok in zip(texts, finite) if ok])
    read = text_columns(objects)["m"]
    assert all(_same_float(got, want) for got, want in zip(read, values[finite].tolist()))
    # where repr would do, it is repr
    assert texts[:3] == ["0.0", "-0.0", "1.0"]
    assert float_texts(np.array([math.nan, math.inf, -math.inf])).to_pylist() == [
        "NaN", "Infinity", "-Infinity"]


def _pack(names, indices, rows):
    return MetricsPack(tuple(names)).seal(list(indices), [v for row in rows for v in row])


def _entries():
    """Slots as a run holds them: two packs (one task in both), dicts, the
    store's text, None; tasks out of order."""
    first = _pack(["rss", "r2"], [4, 0, 2], [[0.5, 0.9], [1e-05, -0.0], [2.0, math.nan]])
    second = _pack(["rss"], [5, 1], [[3.25], [math.inf]])
    return [first, second, first, '{"rss": 7, "note": "text"}', first, second,
            {"rss": 1, "extra": [1, 2]}, None]


def test_metrics_texts_and_columns_equal_reading_each_task_alone():
    entries = _entries()
    expected = [metrics_dict(entry, index) for index, entry in enumerate(entries)]
    assert expected[0] == {"rss": 1e-05, "r2": -0.0}
    texts = metrics_texts(entries, list(range(len(entries)))).to_pylist()
    for text, want in zip(texts, expected):
        if want is None:
            assert text is None
            continue
        got = json.loads(text)
        assert list(got) == list(want)
        for name, value in want.items():
            assert got[name] == value if not isinstance(value, float) else _same_float(
                got[name], value)
    columns = metric_columns(entries)
    assert set(columns) == {"rss", "r2", "note", "extra"}
    for name, values in columns.items():
        values = values.tolist() if isinstance(values, np.ndarray) else values
        for value, want in zip(values, expected):
            wanted = (want or {}).get(name)
            if isinstance(wanted, float):
                assert _same_float(value, wanted)
            elif wanted is None:  # None or NaN: a missing value either way
                assert value is None or (isinstance(value, float) and math.isnan(value))
            else:
                assert value == wanted


def test_metric_columns_come_in_order_of_first_appearance():
    pack = _pack(["a", "c"], [1, 2], [[1.0, 0.5], [2.0, 0.25]])
    assert list(metric_columns([{"b": 1}, pack, pack])) == ["b", "a", "c"]
    assert list(metric_columns([None, pack, pack, '{"b": 2}'])) == ["a", "c", "b"]
    assert list(metric_columns([pack, '{"a": 2, "d": 1}', pack])) == ["a", "c", "d"]


def test_metrics_texts_follow_the_handed_over_rows_order():
    pack = _pack(["a"], [10, 11, 12], [[1.5], [2.5], [3.5]])
    texts = metrics_texts([pack, None, pack, pack, {"a": 9.0}], [12, 3, 10, 11, 4])
    assert texts.to_pylist() == ['{"a": 3.5}', None, '{"a": 1.5}', '{"a": 2.5}',
                                 '{"a": 9.0}']


def test_distinct_objects_numbers_each_slot_by_the_object_it_holds():
    first_pack, second_pack = _pack(["a"], [0], [[1.0]]), _pack(["a"], [1], [[2.0]])
    text = '{"a": 3.0}'
    # runs of one object, an object coming back after another, None in between
    slots = [first_pack, first_pack, second_pack, None, None, first_pack, text, second_pack]
    first, number = distinct_objects(slots)
    assert len(first) == 4 and sorted(set(number.tolist())) == [0, 1, 2, 3]
    assert all(slots[first[number[at]]] is slot for at, slot in enumerate(slots))
    assert all(slots.index(slots[at]) == at for at in first.tolist())  # first appearances
    assert [len(part) for part in distinct_objects([])] == [0, 0]


def test_a_part_packs_only_the_metrics_that_fit_and_seals_them_whole():
    packer = PartPacker(hashed=False)
    pack = packer.metrics(0, {"loss": 0.25, "acc": 0.5})
    assert type(pack) is MetricsPack and len(pack) == 0  # open until the part is sent
    assert packer.metrics(1, {"loss": 0.75, "acc": 1.0}) is pack
    assert packer.metrics(2, {"acc": 1.0, "loss": 0.75}) is None  # other order
    assert packer.metrics(3, {"loss": 1, "acc": 1.0}) is None  # an int stays an int
    assert packer.metrics(4, {"loss": np.float64(1.0), "acc": 1.0}) is None
    assert packer.metrics(5, {"loss": True, "acc": 1.0}) is None
    assert packer.metrics(6, {"loss": 0.5}) is None
    packer.seal()
    sent = pickle.loads(pickle.dumps([pack, pack]))
    assert sent[0] is sent[1] and len(sent[0]) == 2
    assert sent[0].get(1) == {"loss": 0.75, "acc": 1.0}
    # a new part starts a new pack, with the names of its own first task
    assert packer.metrics(7, {"other": 2.0}).names == ("other",)


def test_for_a_store_a_part_makes_its_metrics_text_and_sends_it():
    packer = PartPacker(hashed=True)  # a store will keep the part
    pack = packer.metrics(7, {"loss": 0.25, "acc": 1e-05})
    packer.metrics(3, {"loss": math.nan, "acc": 2.0})
    packer.seal()
    made_here = pack_texts(("loss", "acc"), np.array([[0.25, 1e-05], [math.nan, 2.0]]))
    assert pack.texts.equals(made_here)
    assert json.loads(pack.texts[0].as_py()) == {"loss": 0.25, "acc": 1e-05}
    sent = pickle.loads(pickle.dumps(pack))
    assert sent.texts.equals(made_here) and sent.get(3)["acc"] == 2.0
    # a subset, out of order, is taken from the text; without text, None
    assert sent.texts_of(np.array([3])).to_pylist() == [made_here[1].as_py()]
    assert sent.texts_of(np.array([7, 3])) is sent.texts
    plain = PartPacker(hashed=False)  # no store: no text
    plain_pack = plain.metrics(0, {"loss": 0.5})
    plain.seal()
    assert plain_pack.texts is None and len(plain_pack) == 1
    assert pickle.loads(pickle.dumps(_pack(["loss"], [0], [[0.5]]))).texts is None


def test_a_packs_text_pickles_whatever_array_holds_it(monkeypatch):
    pack = _pack(["a"], [1, 2, 3], [[1.0], [2.0], [3.0]])
    pack.texts = pa.array(['{"a": 0.0}', '{"a": 1.0}', '{"a": 2.0}', None, '{"a": 3.0}'])[1:]
    sent = pickle.loads(pickle.dumps(pack))  # a slice, with a null: as it reads
    assert sent.texts.to_pylist() == ['{"a": 1.0}', '{"a": 2.0}', None, '{"a": 3.0}']
    assert pack_texts((), np.zeros((2, 0))).to_pylist() == ["{}", "{}"]  # no names
    empty = MetricsPack(()).seal([4, 5], [], texts=True)
    assert pickle.loads(pickle.dumps(empty)).texts.to_pylist() == ["{}", "{}"]

    import manymodels.engine.metrictext as metrictext

    def failing(names, rows):
        raise MemoryError

    monkeypatch.setattr(metrictext, "pack_texts", failing)
    # a worker that cannot make the text sends the pack without it: the writer makes it
    kept = MetricsPack(("a",)).seal([7], [0.5], texts=True)
    assert kept.texts is None and kept.get(7) == {"a": 0.5}


def test_the_stores_metrics_are_the_text_a_pack_came_with_and_then_let_go():
    pack = _pack(["a"], [10, 11], [[1.5], [2.5]])
    pack.texts = pa.array(['{"a": 1.5}', '{"a": "as the worker wrote it"}'])
    used = []
    texts = metrics_texts([pack, None, pack], [11, 3, 10], used)
    assert texts.to_pylist() == ['{"a": "as the worker wrote it"}', None, '{"a": 1.5}']
    assert used == [pack]
    pack.drop_texts()  # committed: the text is made again if ever needed
    assert metrics_texts([pack], [11]).to_pylist() == ['{"a": 2.5}']


def fit_with_metrics(data):
    n = len(data["x"])
    total = float(np.sum(data["x"]))
    if n == 3:
        return None, {"sum": total, "rows": n}  # an int: not packed
    if n == 4:
        return None, {"other": total}  # other names than the part's first task
    return float(total), {"sum": total, "mean": total / n, "nan": math.nan}


def fit_unless_nan(data):
    if np.isnan(data["x"]).any():
        raise ValueError("a missing x")
    return fit_with_metrics(data)


@pytest.mark.parametrize("store", [False, True])
def test_a_runs_metrics_are_the_same_packed_by_workers_or_not(tmp_path, store):
    rng = np.random.default_rng(3)
    lengths = rng.integers(2, 7, size=400)
    table = pd.DataFrame({"g": np.repeat(np.arange(400), lengths),
                          "x": rng.normal(size=int(lengths.sum()))})
    source = mm.groups(table, by="g", format="numpy")
    run = mm.train(fit_with_metrics, source, workers=2, progress=False,
                   store=tmp_path / "s" if store else None)
    reference = mm.train(fit_with_metrics, source, backend="serial", progress=False)
    held = run._records.metrics
    assert sum(type(entry) is MetricsPack for entry in held) > 200  # packed indeed
    assert len({id(entry) for entry in held if type(entry) is MetricsPack}) < 200
    columns = ["sum", "mean", "nan", "rows", "other"]
    pd.testing.assert_frame_equal(run.results[columns], reference.results[columns])
    assert list(run.results.columns) == list(reference.results.columns)
    if store:  # the workers' text of each pack, let go of once committed
        assert all(entry.texts is None for entry in held if type(entry) is MetricsPack)
        stored = mm.Store(tmp_path / "s").results()
        pd.testing.assert_frame_equal(stored[columns].reset_index(drop=True),
                                      reference.results[columns], check_dtype=False)
        again = mm.train(fit_with_metrics, source, workers=2, progress=False,
                         store=tmp_path / "s")
        assert again.summary().reused == 400
        pd.testing.assert_frame_equal(again.results[columns], reference.results[columns],
                                      check_dtype=False)


def test_a_callback_gets_each_tasks_metrics_as_a_dict(tmp_path):
    seen = {}

    class Watch(mm.Callback):
        def on_task_finished(self, task):
            seen[task.key] = task.metrics

    table = pd.DataFrame({"g": np.repeat(np.arange(50), 5), "x": np.arange(250.0)})
    mm.train(fit_with_metrics, mm.groups(table, by="g", format="numpy"), workers=2,
             progress=False, callbacks=[Watch()])
    assert len(seen) == 50
    for key, metrics in seen.items():
        total = float(np.arange(key * 5, key * 5 + 5).sum())
        assert metrics["sum"] == total and metrics["mean"] == total / 5
        assert math.isnan(metrics["nan"])


def test_a_reruns_metrics_stay_in_the_store_until_asked_and_read_back_equal(tmp_path):
    """An unchanged re-run's slots name the stored texts (one object per run
    it names), and every reader gets what the first run had: a task's dict,
    the results' columns, a re-run naming two runs, evaluation windows."""
    from manymodels.engine.execution import metrics_dict
    from manymodels.engine.metricpacks import MetricTexts

    rng = np.random.default_rng(4)
    lengths = rng.integers(2, 7, size=300)
    table = pd.DataFrame({"g": np.repeat(np.arange(300), lengths),
                          "x": rng.normal(size=int(lengths.sum()))})
    table.loc[table["g"] == 5, "x"] = math.nan  # group 5 fails, until fixed below
    store = tmp_path / "s"
    source = mm.groups(table, by="g", format="numpy")
    first = mm.train(fit_unless_nan, source, workers=2, progress=False, store=store)
    again = mm.train(fit_unless_nan, source, workers=2, progress=False, store=store)
    assert again.summary().reused == 299
    held = again._records.metrics
    assert len({id(entry) for entry in held if type(entry) is MetricTexts}) == 1
    assert sum(type(entry) is MetricTexts for entry in held) == 299
    columns = ["sum", "mean", "nan", "rows", "other"]
    pd.testing.assert_frame_equal(again.results[columns], first.results[columns],
                                  check_dtype=False)
    for index in (0, 17, 299):  # (group 5 failed: no metrics)
        want = metrics_dict(first._records.metrics[index], index)
        got = metrics_dict(held[index], index)
        assert got.keys() == want.keys()
        assert all(g == w or (math.isnan(g) and math.isnan(w)) for g, w in
                   ((got[k], want[k]) for k in want))

    # a re-run that names two runs: group 5 was fixed and trained in between
    fixed = table.copy()
    fixed.loc[fixed["g"] == 5, "x"] = 1.0
    second = mm.train(fit_unless_nan, mm.groups(fixed, by="g", format="numpy"), workers=2,
                      progress=False, store=store)
    third = mm.train(fit_unless_nan, mm.groups(fixed, by="g", format="numpy"), workers=2,
                     progress=False, store=store)
    assert second.summary().reused == 299 and third.summary().reused == 300
    assert len({id(entry) for entry in third._records.metrics}) == 2
    pd.testing.assert_frame_equal(third.results[columns], second.results[columns],
                                  check_dtype=False)



def test_metric_texts_pickle_and_refuse_a_task_they_do_not_hold():
    import pickle

    import pyarrow as pa

    from manymodels.engine.metricpacks import MetricTexts

    texts = MetricTexts(pa.chunked_array([['{"a": 1.5}'], ['{"a": 2.5}', None]]),
                        np.array([2, -1, 0, 1]))
    for protocol in range(pickle.HIGHEST_PROTOCOL + 1):
        back = pickle.loads(pickle.dumps(texts, protocol=protocol))
        assert [back.get(i) for i in (0, 2, 3)] == [None, {"a": 1.5}, {"a": 2.5}]
    with pytest.raises(KeyError, match="task 1 is not one"):
        texts.text(1)
    with pytest.raises(KeyError):
        texts.texts_of(np.array([0, 1]))
    assert texts.texts_of(np.array([3, 0])).to_pylist() == ['{"a": 2.5}', None]
