"""Reports, the dashboard and MLflow tracking under hostile but plausible
input: metrics a rounding apart or past a float, a tracker used for two
runs at once, runs whose driver died or that reused models, odd run ids in
URLs, an IPv6 host, terminal escapes in keys. Each test fails before its fix."""

from __future__ import annotations

import signal
import sqlite3
import subprocess
import sys
import textwrap
import time
import urllib.error
import urllib.request
import warnings

import numpy as np
import pandas as pd
import pytest

import manymodels as mm
from manymodels.observe.dashboard.queries import Queries
from manymodels.observe.dashboard.server import DashboardServer


def _three_groups() -> pd.DataFrame:
    return pd.DataFrame({"k": np.repeat(["a", "b", "c"], 2), "y": np.arange(6.0)})


def near_equal(rows):
    return {"score": {"a": 0.1 + 0.2, "b": 0.3, "c": 0.3}[rows["k"].iloc[0]]}


def test_a_report_of_metrics_a_rounding_apart_is_made_and_logged(tmp_path, monkeypatch):
    pytest.importorskip("mlflow")
    monkeypatch.chdir(tmp_path)  # MLflow's default artifact root is ./mlruns
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    tracker = mm.MLflow(experiment="near", tracking_uri=uri)
    run = mm.train(near_equal, mm.groups(_three_groups(), by="k"), store=tmp_path / "s",
                   backend="serial", progress=False, track=tracker)
    assert "score" in run.report(tmp_path / "r.html").read_text()
    import mlflow

    logged = mlflow.MlflowClient(uri).get_run(tracker.run_id)
    assert logged.info.status == "FINISHED" and logged.data.metrics["progress.done"] == 3
    huge = mm.train(lambda rows: {"m": 1e308 if rows["k"].iloc[0] == "a" else -1e308},
                    mm.groups(_three_groups(), by="k"), backend="serial", progress=False)
    assert huge.report(tmp_path / "huge.html").exists()


def test_one_tracker_for_two_runs_keeps_them_apart(tmp_path, monkeypatch):
    """The first run's logging outlives its timeout: the second run's must
    not take its place, nor leave it RUNNING."""
    mlflow = pytest.importorskip("mlflow")
    monkeypatch.chdir(tmp_path)  # MLflow's default artifact root is ./mlruns
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    slow = mlflow.MlflowClient.log_batch

    def slow_batch(self, *args, **kwargs):
        time.sleep(1.0)
        return slow(self, *args, **kwargs)

    monkeypatch.setattr(mlflow.MlflowClient, "log_batch", slow_batch)
    tracker = mm.MLflow(experiment="twice", tracking_uri=uri, timeout=0.2)
    ids = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        for groups in (3, 5):
            table = pd.DataFrame({"k": range(groups), "y": 1.0})
            mm.train(lambda rows: {"n": len(rows)}, mm.groups(table, by="k"),
                     backend="serial", progress=False, track=tracker)
            deadline = time.time() + 30
            while tracker.run_id is None and time.time() < deadline:
                time.sleep(0.1)
            ids.append(tracker.run_id)
    client = mlflow.MlflowClient(uri)
    deadline = time.time() + 60
    while time.time() < deadline and any(
            client.get_run(i).info.status == "RUNNING" for i in ids):
        time.sleep(0.5)
    runs = [client.get_run(i) for i in ids]
    assert ids[0] != ids[1]
    assert [r.info.status for r in runs] == ["FINISHED", "FINISHED"]
    assert [r.data.metrics["tasks"] for r in runs] == [3, 5]


def killed_run(store) -> None:
    """A run of 400 tasks whose driver is killed once some are committed."""
    script = textwrap.dedent(f"""
        import time, pandas as pd, manymodels as mm
        def fit(rows):
            time.sleep(0.02)
            return float(rows["x"].sum())
        mm.train(fit, mm.groups(pd.DataFrame({{"g": range(400), "x": 1.0}}), by="g"),
                 store={str(store)!r}, backend="serial", progress=False)
    """)
    driver = subprocess.Popen([sys.executable, "-c", script])
    index = store / "index.sqlite"
    deadline = time.time() + 60
    while time.time() < deadline:
        time.sleep(0.5)
        if index.exists():
            with sqlite3.connect(index) as conn:
                if conn.execute("SELECT count(*) FROM sqlite_master WHERE name = "
                                "'task_blocks'").fetchone()[0] and conn.execute(
                        "SELECT count(*) FROM task_blocks").fetchone()[0]:
                    break
    driver.send_signal(signal.SIGKILL)
    driver.wait()


def test_a_run_whose_driver_died_keeps_its_pace_and_counts(tmp_path):
    store = tmp_path / "s"
    killed_run(store)
    first = Queries(store).page()["runs"][0]
    time.sleep(1.5)
    again = Queries(store).page()["runs"][0]  # a new dashboard, later
    assert first["status"] == "interrupted"
    assert again["rate"] == pytest.approx(first["rate"], rel=1e-6)
    assert again["elapsed_s"] == pytest.approx(first["elapsed_s"], rel=1e-6)
    from manymodels.observe.report import store_report

    text = store_report(mm.Store(store), None, tmp_path / "r.html").read_text()
    assert "400 (" in text and " done)" in text  # planned, and how many have a row


def test_a_stored_reports_times_are_its_own_run(tmp_path):
    from manymodels.observe.report import store_report

    for _ in range(2):
        mm.train(lambda rows: float(rows["y"].sum()), mm.groups(_three_groups(), by="k"),
                 store=tmp_path / "s", backend="serial", progress=False)
    text = store_report(mm.Store(tmp_path / "s"), 2, tmp_path / "r.html").read_text()
    assert "duration (s): no values" in text  # every model was reused: nothing ran


def test_the_dashboard_takes_huge_metrics_odd_run_ids_and_ipv6(tmp_path):
    mm.train(lambda rows: {"combos": 10**400}, mm.groups(_three_groups(), by="k"),
             store=tmp_path / "s", backend="serial", progress=False)
    assert Queries(tmp_path / "s").page()["runs"][0]["run_id"] == 1
    for host in ("127.0.0.1", "::1"):
        try:
            board = DashboardServer(tmp_path / "s", host=host, token="abcdefgh123").start()
        except OSError as exc:  # no IPv6 on this machine
            assert host == "::1", exc
            continue
        try:
            base = f"http://{'[::1]' if ':' in host else host}:{board.port}"
            with urllib.request.urlopen(f"{base}/api/page?token=abcdefgh123", timeout=10) as r:
                assert r.status == 200
            for path in ("/api/page?run=%C2%B2&", "/api/run/99999999999999999999999?",
                         f"/api/run/{'9' * 5000}?"):
                with pytest.raises(urllib.error.HTTPError) as refused:
                    urllib.request.urlopen(f"{base}{path}token=abcdefgh123", timeout=10)
                assert refused.value.code == 404
        finally:
            board.close()


def test_long_metric_names_keep_their_statistics_apart():
    from manymodels.observe.mlflow_terms import describe

    named = describe("L" * 248, pd.Series([1.0, 2.0]))
    assert len(named) == 8 and max(map(len, named)) <= 250
    assert {name.rsplit(".", 1)[1] for name in named} == {
        "mean", "std", "min", "p05", "p50", "p95", "max", "count"}


def test_terminal_escapes_in_keys_are_shown_not_run():
    from manymodels.cli.tables import cell

    assert cell("\x1b[31mred\x1b[0m") == "\\x1b[31mred\\x1b[0m"
    assert cell("\x1b]0;title\x07") == "\\x1b]0;title\\x07"
    assert cell("a\tb") == "a\tb"


def metrics_named_like_their_renames(item):
    """``status`` is a results column: as a metric it becomes ``metric_status``,
    which this fit returns too; ``resumed`` is a column the public store adds."""
    return {"metric_status": 1.0, "status": 2.0, "resumed": 3.0, "score": float(item)}


def test_a_metric_named_as_anothers_rename_is_kept(tmp_path):
    """``status`` renamed ``metric_status`` wrote over the fit's own
    ``metric_status`` (2.0 where it returned 1.0), in ``run.results`` and in
    ``Store.results``; and a metric named ``resumed`` made ``Store.results``
    raise (the public store's column could not be inserted)."""
    run = mm.train(metrics_named_like_their_renames, mm.items([1, 2]), backend="serial",
                   progress=False, store=tmp_path / "store")
    expected = {"metric_status": [1.0, 1.0], "metric_metric_status": [2.0, 2.0],
                "metric_resumed": [3.0, 3.0], "score": [1.0, 2.0]}
    for results in (run.results, mm.Store(tmp_path / "store").results()):
        assert {name: results[name].tolist() for name in expected} == expected
        assert results["status"].tolist() == ["ok", "ok"]
        assert results["resumed"].tolist() == [False, False]


def test_show_of_a_run_whose_driver_died_says_what_it_planned(tmp_path):
    """``manymodels show`` counted only the tasks that have a row ("20 tasks,
    20 ok" of a run that planned 400), where the report says both."""
    from conftest import run_cli

    store = tmp_path / "s"
    killed_run(store)
    done = len(mm.Store(store).results())
    assert 0 < done < 400
    shown = run_cli("show", store)
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.splitlines()[0] == f"run 1: 400 tasks ({done} done), {done} ok"


def fail_every_tenth(item):
    if item % 10 == 3:
        raise ValueError(f"bad item {item}")
    return {"score": float(item)}


def test_the_summary_does_not_repeat_the_failure_count():
    """``36 ok, 4 failed of 40 (failed 4)``: the parenthesis, which breaks
    the failures down by kind and counts the tasks never run, repeated the
    count where every failure was fit's error."""
    run = mm.train(fail_every_tenth, mm.items(range(40)), backend="serial", progress=False)
    assert str(run.summary()).splitlines()[0] == "models      36 ok, 4 failed of 40"
    with pytest.raises(mm.TooManyFailures) as raised:
        mm.train(fail_every_tenth, mm.items(range(40)), backend="serial", progress=False,
                 max_failures=1)
    stopped = raised.value.run.summary()
    cancelled = stopped.statuses["cancelled"]
    assert str(stopped).splitlines()[0] == (
        f"models      {stopped.ok} ok, 2 failed of 40 (cancelled {cancelled})")


def test_the_bar_shows_a_rate_below_one_model_a_second():
    """Models of 4 s each read ``0 models/s`` on the progress bar."""
    from rich.progress import Progress

    from manymodels.observe.progress import _RateColumn

    bar = Progress(disable=True)
    bar.add_task("training", total=10)
    task = bar.tasks[0]
    task.finished_speed = 0.25
    assert _RateColumn().render(task).plain == "0.25 models/s"
    task.finished_speed = 1234.4
    assert _RateColumn().render(task).plain == "1,234 models/s"


def test_mlflows_file_store_is_refused_before_any_work(tmp_path, monkeypatch):
    """MLflow 3 refuses its file store only at the run's first MLflow call:
    the run trained, then warned that it was logged nowhere."""
    mlflow = pytest.importorskip("mlflow")
    if getattr(mlflow.environment_variables, "MLFLOW_ALLOW_FILE_STORE", None) is None:
        pytest.skip("this MLflow takes its file store")
    monkeypatch.delenv("MLFLOW_ALLOW_FILE_STORE", raising=False)
    for uri in (f"file://{tmp_path / 'mlruns'}", str(tmp_path / "mlruns")):
        with pytest.raises(ValueError, match="MLflow's file store") as refused:
            mm.MLflow(experiment="files", tracking_uri=uri)
        assert repr(uri) in str(refused.value) and "sqlite:///" in str(refused.value)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", str(tmp_path / "mlruns"))
    with pytest.raises(ValueError, match="MLFLOW_ALLOW_FILE_STORE=true"):
        mm.MLflow(experiment="files")  # MLflow's own setting, read as the tracker is made
    from typer.testing import CliRunner

    from manymodels.cli import app

    _three_groups().to_csv(tmp_path / "t.csv", index=False)
    result = CliRunner(env={"COLUMNS": "400"}).invoke(app, [
        "train", str(tmp_path / "t.csv"), "--by", "k", "--target", "y", "--model",
        "sklearn.linear_model.Ridge", "--mlflow", "files", "--backend", "serial",
        "--store", str(tmp_path / "s")])
    assert result.exit_code == 2 and "--mlflow" in result.output, result.output
    assert not (tmp_path / "mlruns").exists() and not (tmp_path / "s").exists()
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # asked for: taken
    assert mm.MLflow(experiment="files").tracking_uri is None


def _failing_past(limit: int):
    """Writes past ``limit`` bytes fail in this process (EFBIG), as on a full disk."""
    import contextlib
    import resource

    @contextlib.contextmanager
    def limited():
        soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
        previous = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, hard))
        try:
            yield
        finally:
            resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
            signal.signal(signal.SIGXFSZ, previous)

    return limited()


def test_a_report_cut_short_by_a_full_disk_leaves_the_earlier_report_whole(tmp_path):
    """run.report and a stored run's report wrote in place: a disk that
    filled mid-write left part of the new report over the good one."""
    from manymodels.observe.report import store_report

    run = mm.train(near_equal, mm.groups(_three_groups(), by="k"), store=tmp_path / "s",
                   backend="serial", progress=False)
    for write in (run.report, lambda path: store_report(mm.Store(tmp_path / "s"), None, path)):
        path = tmp_path / "r.html"
        path.write_text("the good report")
        with _failing_past(1024), pytest.raises(OSError):
            write(path)
        assert path.read_text() == "the good report"
        assert sorted(p.name for p in tmp_path.iterdir()) == ["r.html", "s"]
        assert "score" in write(path).read_text()
    with pytest.raises(FileNotFoundError, match="no-such-folder"):
        run.report(tmp_path / "no-such-folder" / "r.html")


def metrics_a_floats_range_apart(rows):
    return {"loss": 1e308 if rows["y"].iloc[0] > 1 else -1e308}


def test_metrics_a_floats_range_apart_are_charted_by_the_dashboard_and_report(tmp_path):
    from manymodels.observe.report import store_report

    mm.train(metrics_a_floats_range_apart, mm.groups(_three_groups(), by="k"),
             store=tmp_path / "s", backend="serial", progress=False)
    (chart,) = Queries(tmp_path / "s").page()["run"]["metrics"]["charts"]
    assert (chart["low"], chart["high"], sum(chart["counts"])) == (-1e308, 1e308, 3)
    assert (chart["counts"][0], chart["counts"][-1]) == (1, 2)
    assert -1e308 <= chart["p05"] <= chart["mean"] <= chart["p95"] <= 1e308
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # numpy's overflow warnings are no user's business
        text = store_report(mm.Store(tmp_path / "s"), 1, tmp_path / "r.html").read_text()
    assert ">-1e+308 to 1e+308: 3<" in text


class _ExitsIn(mm.Callback):
    def __init__(self, hook: str) -> None:
        self.hook = hook

    def on_task_finished(self, task):
        if self.hook == "on_task_finished":
            sys.exit("the callback ends the program")

    def on_run_end(self, run):
        if self.hook == "on_run_end":
            sys.exit("the callback ends the program")


class _Hears(mm.Callback):
    def __init__(self) -> None:
        self.tasks, self.ends = 0, []

    def on_task_finished(self, task):
        self.tasks += 1

    def on_run_end(self, run):
        self.ends.append(run.summary().ok)


@pytest.mark.parametrize("hook", ["on_task_finished", "on_run_end"])
def test_a_callback_that_calls_sys_exit_ends_the_run_and_the_others_hear_its_end(
        tmp_path, hook):
    """A callback's SystemExit (sys.exit in a hook) went past the callbacks
    after it: from on_run_end, they never heard the run's end (a tracker's
    run left RUNNING); from on_task_finished, they missed that task. The
    others now hear the hook out, then the run ends with the SystemExit,
    what finished committed and the run's end recorded."""
    hears = _Hears()
    with pytest.raises(SystemExit, match="ends the program"):
        mm.train(_one, mm.items(range(6)), backend="serial", progress=False,
                 store=tmp_path / "s", callbacks=[_ExitsIn(hook), hears])
    runs = mm.Store(tmp_path / "s").runs()
    assert runs["status"].tolist() == ["finished" if hook == "on_run_end" else "failed"]
    assert len(hears.ends) == 1 and hears.tasks == hears.ends[0] >= 1
    stored = mm.Store(tmp_path / "s").results()
    assert (stored["status"] == "ok").sum() == hears.ends[0]


def _one(item):
    return {"item": item}
