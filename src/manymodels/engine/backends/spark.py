"""Run batches on Apache Spark: ``backend="spark"`` or ``SparkBackend(session=...)``.

Which session
    The session given (``session=``), else the active ``SparkSession`` of
    this process (a notebook's ``spark``, ``spark-submit``, Databricks), else
    a ``local[N]`` session started here with ``workers * cpus_per_task``
    cores. :meth:`stop` stops only a session started here (and the Java
    gateway, where it started that too): a user's session stays up.

How it runs
    ``workers`` long-lived Spark tasks, each a one-partition job that a driver
    thread submits (``mapPartitions`` over the launch's number) and that
    runs :func:`._remote_worker.serve` in a Python worker: the driver feeds
    them batches over a socket (:mod:`._remote_slots` says why, and how a
    crash or a timeout costs one task). The run's payload is a Spark
    broadcast: it reaches each executor once. A session started here has
    ``spark.task.maxFailures`` 1 (``local[N]``); on a cluster's session
    Spark may retry a failed task, which only starts a fresh worker loop,
    never a batch. All jobs of a run share one job group, cancelled when the
    run is stopped by force.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import uuid
from typing import Any

from ...machine import usable_cores
from ..options import BackendOptions
from ._remote_slots import RemoteSlotsBackend, describe
from ._remote_worker import serve


def _import_pyspark() -> Any:
    try:
        import pyspark
        import pyspark.sql  # noqa: F401
    except ImportError as exc:
        raise ImportError("backend='spark' needs PySpark (and a Java runtime): "
                          "pip install 'manymodels[spark]'") from exc
    return pyspark


def _active_session() -> Any:
    if "pyspark" not in sys.modules:
        return None
    from pyspark.sql import SparkSession

    # the session active in this thread, else the one this process created
    # in another thread (getActiveSession is per thread)
    return SparkSession.getActiveSession() or getattr(SparkSession, "_instantiatedSession", None)


class _Launch(threading.Thread):
    """A driver thread that runs one launch's Spark job to its end."""

    def __init__(self, context: Any, group: str, launch: int, args: tuple) -> None:
        super().__init__(daemon=True, name=f"manymodels-spark-{launch}")
        self.context, self.group, self.launch, self.args = context, group, launch, args
        self.ended: str | None = None

    def run(self) -> None:
        args = self.args
        try:
            self.context.setJobGroup(self.group, "manymodels run", interruptOnCancel=True)
            rdd = self.context.parallelize([self.launch], 1)
            rdd.mapPartitions(lambda _: [serve(*args)]).collect()
            self.ended = "finished"
        except BaseException as exc:
            self.ended = describe(exc)


class SparkBackend(RemoteSlotsBackend):
    """Batches on Spark; see the module docstring.

    ``workers`` is the number of worker loops at once; ``None`` takes the
    session's ``defaultParallelism`` (its cores), or the usable cores for a
    session started here. ``spark_conf`` entries go to the builder of a
    session started here.
    """

    name = "spark"
    engine = "Spark"

    def __init__(
        self,
        workers: int | None = None,
        cpus_per_task: int = 1,
        timeout: float | None = None,
        memory_limit: int | None = None,
        gpu_sets: list[list[str]] | None = None,
        *,
        session: Any = None,
        **spark_conf: Any,
    ) -> None:
        _import_pyspark()  # fail here, before any work, where PySpark is not installed
        self.session = session
        self.spark_conf = spark_conf
        self._own_session: Any = None
        self._own_gateway = False
        super().__init__(workers, cpus_per_task, timeout=timeout, memory_limit=memory_limit,
                         gpu_sets=gpu_sets)

    @classmethod
    def default_workers(cls, cpus_per_task: int) -> int | None:
        return None  # the session's cores, counted when configured

    def configure(self, options: BackendOptions) -> None:
        super().configure(options)
        self.auto_workers = options.workers is None
        if self.auto_workers:
            session = self.session or _active_session()
            cores = session.sparkContext.defaultParallelism if session is not None else 0
            self.workers = max(1, (cores or usable_cores()) // self.cpus_per_task)

    def _start_engine(self) -> str:
        _import_pyspark()
        from pyspark import SparkContext
        from pyspark.sql import SparkSession

        session = self.session or _active_session()
        if session is None:
            self._own_gateway = SparkContext._gateway is None
            builder = SparkSession.builder.master(
                f"local[{self.workers * self.cpus_per_task}]").appName("manymodels")
            conf = {"spark.ui.enabled": "false", "spark.ui.showConsoleProgress": "false",
                    "spark.task.maxFailures": "1", "spark.task.cpus": str(self.cpus_per_task),
                    "spark.driver.host": "127.0.0.1", "spark.driver.bindAddress": "127.0.0.1",
                    **self.spark_conf}
            for key, value in conf.items():
                builder = builder.config(key, value)
            # The workers run this interpreter (the one with manymodels), not
            # whichever `python3` comes first: PySpark reads PYSPARK_PYTHON
            # when the context starts.
            unset = not os.environ.get("PYSPARK_PYTHON")
            if unset:
                os.environ["PYSPARK_PYTHON"] = sys.executable
            try:
                session = self._own_session = builder.getOrCreate()
            finally:
                if unset:
                    os.environ.pop("PYSPARK_PYTHON", None)
            session.sparkContext.setLogLevel("ERROR")
        self._session = session
        try:
            context = session.sparkContext
        except Exception as exc:
            raise ValueError(
                "backend='spark' runs its workers as Spark tasks, which needs a classic "
                "SparkSession (with a SparkContext); this one has none (a Spark Connect "
                f"session?): {describe(exc)}") from exc
        if self.auto_workers and self._own_session is None:
            self.workers = max(1, context.defaultParallelism // self.cpus_per_task)
        self._group = f"manymodels-{uuid.uuid4().hex[:10]}"
        if context.master.startswith("local"):
            return "127.0.0.1"
        return context.getConf().get("spark.driver.host") or "127.0.0.1"

    def _ship(self, payload: bytes) -> Any:
        self._broadcast = self._session.sparkContext.broadcast(payload)
        return self._broadcast  # a worker reads its .value

    def _launch(self, launch: int, args: tuple) -> Any:
        thread = _Launch(self._session.sparkContext, self._group, launch, args)
        thread.start()
        return thread

    def _launch_ended(self, handle: Any) -> str | None:
        return None if handle.is_alive() else (handle.ended or "ended")

    def _cancel_launches(self, handles: list[Any]) -> None:
        with contextlib.suppress(Exception):
            self._session.sparkContext.cancelJobGroup(self._group)
        for thread in handles:
            thread.join(timeout=10)

    def _stop_engine(self) -> None:
        broadcast, self._broadcast = getattr(self, "_broadcast", None), None
        if broadcast is not None:
            with contextlib.suppress(Exception):
                broadcast.destroy()
        session, self._own_session = self._own_session, None
        if session is None:
            return
        session.stop()
        if self._own_gateway:  # the JVM this backend started: no process left behind
            self._own_gateway = False
            _shutdown_gateway()


def _shutdown_gateway() -> None:
    from pyspark import SparkContext

    gateway = SparkContext._gateway
    SparkContext._gateway = None
    SparkContext._jvm = None
    if gateway is None:
        return
    with contextlib.suppress(Exception):
        gateway.shutdown()
    process = getattr(gateway, "proc", None)
    if process is not None:
        with contextlib.suppress(Exception):
            process.stdin.close()  # the JVM ends when its stdin closes
            process.wait(timeout=10)
        if process.poll() is None:
            process.kill()
            process.wait()
