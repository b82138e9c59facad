"""The HTML report renders in a real headless browser."""

from __future__ import annotations

import re
import shutil
import subprocess

import numpy as np
import pandas as pd
import pytest

import manymodels as mm
from manymodels.observe.report import store_report


def fit_or_fail(item):
    if item % 17 == 0:
        raise ValueError(f"bad item {item}")
    rng = np.random.default_rng(item)
    sum(range(20_000 + 1000 * (item % 7)))
    return {"w": item}, {"score": float(rng.normal()), "loss": float(rng.gamma(2.0))}


def _chromium() -> str:
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if not found:
        pytest.skip("chromium is not installed (`make test` installs Debian's chromium)")
    return found


def _screenshot(html_path, tmp_path):
    png = tmp_path / "shot.png"
    result = subprocess.run(
        [_chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
         "--no-first-run", "--disable-background-networking", "--disable-component-update",
         "--disable-sync", "--disable-quic", f"--user-data-dir={tmp_path / 'profile'}",
         "--window-size=1200,2400", "--hide-scrollbars", "--enable-logging=stderr", "--v=0",
         f"--screenshot={png}", html_path.resolve().as_uri()],
        capture_output=True, text=True, timeout=180)
    assert png.exists(), result.stderr[-2000:]
    return png, result.stderr


def _colors(png):
    from PIL import Image

    image = Image.open(png).convert("RGB")
    return image, {color for _, color in image.getcolors(maxcolors=1 << 20)}


def test_store_report_renders_in_a_browser(tmp_path):
    store = tmp_path / "store"
    run = mm.train(fit_or_fail, mm.items(range(120)), store=store, workers=2, progress=False)
    assert len(run.failed) == 8
    report = store_report(mm.Store(store), None, tmp_path / "report.html")
    text = report.read_text()
    assert "<script" not in text and "http" not in text.replace("http://www.w3.org", "")
    assert text.count("<rect") >= 120 + 2 * 5  # a bar per task, histogram bars
    assert "ValueError: bad item 17" in text  # the failure with its traceback
    png, log = _screenshot(report, tmp_path)
    assert "Uncaught" not in log and "CONSOLE" not in log.upper().replace("CONSOLE_", "")
    image, colors = _colors(png)
    assert image.size == (1200, 2400)
    assert len(colors) > 20  # not blank
    assert (76, 120, 168) in colors  # ok bars of the timeline and durations (#4c78a8)
    assert (228, 87, 86) in colors  # failed bars (#e45756)
    assert (84, 162, 75) in colors  # metric histograms (#54a24b)


def test_run_report_without_a_store(tmp_path):
    run = mm.train(fit_or_fail, mm.items(range(40)), backend="threads", progress=False)
    path = run.report(tmp_path / "run.html")
    text = path.read_text()
    assert "Worker timeline" in text and "score" in text and "loss" in text
    png, _ = _screenshot(path, tmp_path)
    _, colors = _colors(png)
    assert (76, 120, 168) in colors


def fail_long(item):
    raise ValueError(f"bad item {item}: " + "x" * (50_000 if item == 3 else 10) + " END")


def test_a_report_of_many_failures_says_how_many_it_shows(tmp_path):
    """150 failures: the heading said 150 and 100 were shown, silently; an
    error of 50,000 characters was written whole."""
    from manymodels.observe import report

    run = mm.train(fail_long, mm.items(range(150)), backend="serial", progress=False)
    text = run.report(tmp_path / "run.html").read_text()
    assert "Failures (150)" in text
    assert f"The first {report.FAILURES_SHOWN} of 150, in task order" in text
    assert text.count("<details>") == report.FAILURES_SHOWN
    assert "bad item 99:" in text and "bad item 100:" not in text
    assert "x" * report.ERROR_CHARACTERS not in text and " END" in text
    assert len(re.findall(r"\[the first [\d,]+ of [\d,]+ characters are left out", text)) == 1
    short = mm.train(fail_long, mm.items(range(4)), backend="serial", progress=False)
    assert "The first" not in short.report(tmp_path / "short.html").read_text()


def chart_titles(text: str) -> list[str]:
    """The titles of a report's charts, the duration histogram first."""
    return re.findall(r'text-anchor="middle">([^<]*)<', text)


def fit_with_metrics_named_like_columns(rows):
    """Metrics named as columns some results table adds (a store's ``size``,
    ``run_id``, ``artifact``; a GPU run's ``gpu``) or that a rule by name
    once took for one (``rows``, ``best_*``)."""
    return {"rows": float(len(rows)), "size": 2.5, "gpu": 1.5, "artifact": 3.5,
            "run_id": 4.5, "best_x": 5.5, "rmse": 6.5}


def test_metrics_of_any_name_get_their_charts_and_no_gpu_is_made_up(tmp_path):
    """A metric named ``rows``, ``size``, ``gpu``... had no chart (the report
    went by names), and one named ``gpu`` labelled the timeline's rows
    "w0 · GPU 1.5" on a machine without GPUs: in ``run.report`` and in the
    store's report that ``manymodels report`` writes."""
    from conftest import run_cli

    frame = pd.DataFrame({"store": np.repeat(["a", "b"], 5), "y": np.arange(10.0)})
    run = mm.train(fit_with_metrics_named_like_columns, mm.groups(frame, by="store"),
                   backend="serial", progress=False, store=tmp_path / "store")
    text = run.report(tmp_path / "run.html").read_text()
    assert chart_titles(text)[1:] == ["rows", "size", "gpu", "artifact", "run_id", "best_x",
                                      "rmse"]
    assert "GPU" not in text and "worker 0" in text
    done = run_cli("report", tmp_path / "store", "-o", tmp_path / "store.html")
    assert done.returncode == 0, done.stderr
    stored = (tmp_path / "store.html").read_text()
    # the store's own size, artifact and run_id columns leave these metrics metric_<name>
    assert chart_titles(stored)[1:] == ["rows", "metric_size", "gpu", "metric_artifact",
                                        "metric_run_id", "best_x", "rmse"]
    assert "GPU" not in stored


def test_a_run_given_gpus_names_them_on_its_timeline_beside_a_gpu_metric(tmp_path):
    """The timeline names each worker's GPU where the run gave its workers
    GPUs (``run.worker_gpus``; set here, on a machine that may have none),
    and the metric ``gpu`` is then ``metric_gpu``, charted."""
    frame = pd.DataFrame({"store": ["a", "b"], "y": [1.0, 2.0]})
    run = mm.train(fit_with_metrics_named_like_columns, mm.groups(frame, by="store"),
                   backend="serial", progress=False)
    run.worker_gpus = {0: "0"}
    text = run.report(tmp_path / "run.html").read_text()
    assert "w0 \u00b7 GPU 0" in text
    assert "metric_gpu" in chart_titles(text)


def fit_with_metrics_of_mixed_types(item):
    if item == 0:
        raise ValueError("no model")
    return {"rmse": "n/a" if item == 1 else item / 10, "combos": 10**20 if item == 2 else item,
            "converged": True}


def test_a_metric_of_numbers_and_text_is_charted_from_its_numbers(tmp_path):
    """A metric that is text for one task ("n/a"), or a number past 64 bits
    for one, is a column of objects: the report left it out (the dashboard
    draws it); a metric of booleans alone is no distribution."""
    run = mm.train(fit_with_metrics_of_mixed_types, mm.items(list(range(12))),
                   backend="serial", progress=False, store=tmp_path / "store")
    for text in (run.report(tmp_path / "run.html").read_text(),
                 store_report(mm.Store(tmp_path / "store"), 1, tmp_path / "s.html").read_text()):
        assert chart_titles(text)[1:] == ["rmse", "combos"]
        assert ">0.2 to " in text and "1e+20" in text  # their numbers: 0.2 the least rmse
    every_one_ok = mm.train(fit_with_metrics_of_mixed_types, mm.items([3, 4]),
                            backend="serial", progress=False)  # converged: a bool column
    assert chart_titles(every_one_ok.report(tmp_path / "ok.html").read_text())[1:] == [
        "rmse", "combos"]
