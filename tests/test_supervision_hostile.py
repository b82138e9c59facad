"""The processes backend's supervision under hostile but plausible use
(each case found by a review that hung, killed and interrupted real runs)."""

from __future__ import annotations

import threading
import time

import pytest

import manymodels as mm


def _pause(n, tag):
    time.sleep(0.02)
    return {"n": n}


def test_two_trains_at_once_in_threads_of_one_program_both_end():
    """Each run's forked workers waited at its start gate until end-of-file
    on the pipe, and a worker another run forked meanwhile held its write
    end: both runs waited for ever (2 hangs in 3 tries)."""
    for attempt in range(4):
        runs: dict[int, object] = {}

        def go(tag: int, runs: dict = runs) -> None:
            runs[tag] = mm.train(_pause, mm.items(range(12)) * mm.grid(tag=[tag]),
                                 backend="processes", workers=2, start_method="fork",
                                 progress=False)

        threads = [threading.Thread(target=go, args=(tag,), daemon=True) for tag in (0, 1)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(90)
        assert not any(thread.is_alive() for thread in threads), f"hung at try {attempt}"
        assert sorted(runs) == [0, 1]
        assert all((run.results["status"] == "ok").all() for run in runs.values())


def _square(value):
    return value * value


def _pool_of_its_own(item, method):
    import multiprocessing

    with multiprocessing.get_context(method).Pool(1) as pool:
        return {"total": sum(pool.map(_square, range(item + 2)))}


@pytest.mark.parametrize("method", ["spawn", "forkserver"])
def test_a_fit_with_a_spawned_pool_of_its_own_returns_on_spawned_workers(method):
    """The pool's children ran the spawned worker's entry module again as
    their __main__, unguarded: a second worker loop, and the fit never
    returned."""
    run = mm.train(_pool_of_its_own, mm.items([1, 2]) * mm.grid(method=[method]),
                   backend="processes", workers=2, start_method="spawn", timeout=120,
                   progress=False)
    assert (run.results["status"] == "ok").all(), run.results["error"].tolist()
    assert run.results["total"].tolist() == [5, 14]


def _fails(item):
    raise RuntimeError(f"item {item} is refused")


def test_the_error_budgets_message_says_the_fraction_given():
    """max_failures=0.3 of 3 tasks said "over max_failures=0", a value the
    user never wrote."""
    with pytest.raises(mm.TooManyFailures) as stopped:
        mm.train(_fails, mm.items(range(3)), max_failures=0.3, backend="serial",
                 progress=False)
    assert "over max_failures=0.3 (at most 0 of 3 tasks)" in str(stopped.value)
