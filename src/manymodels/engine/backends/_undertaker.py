"""The processes backend's undertaker: ends what the workers' tasks started
when the driver is killed.

A worker dies with the driver (``PR_SET_PDEATHSIG``), but the processes its
tasks started do not: the kernel gives them to init, and a SIGKILLed driver
has no chance to end them the way it does when a worker dies or the run
ends (:meth:`~.processes.ProcessesBackend._retire`). Each worker leads a
session of its own, which holds what its tasks start, so killing that
session's process group ends them.

The undertaker is a small separate interpreter, started with the workers,
that reads a line per worker from a pipe (``+pid`` when one starts, ``-pid``
once the driver has retired it). The driver holds the pipe's only write end
(forked workers close it, like the other workers' pipes), so end-of-file
means the driver is gone: at the end of a run it has retired every worker
first and nothing is left to do; killed, it leaves the groups of the workers
it had, which the undertaker SIGKILLs. A process that a task started in a
session of its own (``setsid``) is beyond its reach, as it is beyond
:meth:`~.processes.ProcessesBackend._retire`'s.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import threading

from ...machine import wait_for_exit

#: The undertaker's whole program: no imports beyond ``os`` and ``signal``,
#: so that it starts in milliseconds (``python -I -S``).
_PROGRAM = """\
import os, signal
groups, pending = set(), b""
while chunk := os.read(0, 4096):
    *lines, pending = (pending + chunk).split(b"\\n")
    for line in lines:
        (groups.add if line[:1] == b"+" else groups.discard)(int(line[1:]))
for group in groups:
    try:
        os.killpg(group, signal.SIGKILL)
    except OSError:
        pass
"""


class Undertaker:
    """The driver's end of the undertaker: :meth:`started` and :meth:`retired`
    tell it the workers, :meth:`close` ends it (no worker left to kill)."""

    def __init__(self) -> None:
        self._process = subprocess.Popen(
            [sys.executable, "-I", "-S", "-c", _PROGRAM],
            stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
            start_new_session=True,  # a Ctrl-C in the terminal is the driver's alone
        )

    @property
    def fd(self) -> int:
        """The pipe's write end, which a forked worker must close."""
        return self._process.stdin.fileno()

    def started(self, pid: int) -> None:
        self._tell(b"+%d\n" % pid)

    def retired(self, pid: int) -> None:
        self._tell(b"-%d\n" % pid)

    def _tell(self, line: bytes) -> None:
        with contextlib.suppress(OSError):  # it died: nothing to do about that here
            os.write(self.fd, line)

    def close(self) -> None:
        """End-of-file tells it that nothing is left to kill: it exits by
        itself. A run does not wait for that (a short run's undertaker may
        still be starting, tens of milliseconds under load); a thread reaps it.
        Closed already (a backend stopped twice), it does nothing."""
        if self._process.stdin.closed:
            return
        with contextlib.suppress(OSError):
            self._process.stdin.close()
        try:
            threading.Thread(target=_reap, args=(self._process,), daemon=True,
                             name="manymodels-undertaker-reaper").start()
        except RuntimeError:  # no thread to be had (a limit, the interpreter ending)
            _reap(self._process)


def _reap(process: subprocess.Popen) -> None:
    wait_for_exit(process.pid, 5)  # (Popen.wait's poll loop sleeps up to 50 ms)
    try:
        process.wait(timeout=5)
    except subprocess.TimeoutExpired:  # pragma: no cover - it only reads and exits
        process.kill()
        process.wait()
