"""What the driver and the workers of every backend share: the kinds of
message they exchange, and the processes backend's slot layout.

Messages are tuples whose first item is one of :class:`Msg`'s kinds (plain
strings on the wire). Each processes worker owns one slot of a small shared
file: the index of the task it is running (-1 when none, :data:`LOADING`
while it unpickles its next batch) and the wall-clock time it started it,
negated once the worker found its pipes to the driver closed
(:func:`mark_pipes_closed`), and how many ``timeout=`` it may take: 1 for
a task, :data:`READ_TIMEOUTS` or the batch's task count while the batch's
rows are read (the read is no task's own time, and a hung one still ends). The driver reads the
slots to blame the right task when a worker dies and to enforce timeouts.
"""

import struct
from typing import Any

SLOT = struct.Struct("qdq")
#: A slot's index while its worker unpickles its next batch: a death then is
#: that batch's doing (an item whose unpickling kills the process).
LOADING = -2
#: The timeouts a batch's read of its rows may take at least (a slow file
#: system, an object store): a first batch holds one task, whose own
#: ``timeout=`` is for its fit.
READ_TIMEOUTS = 10


def mark_pipes_closed(slots: Any, offset: int) -> None:
    """Mark the slot at ``offset``: its worker found its pipes to the driver
    closed (by the task the slot names) and ends. The start time is kept,
    negated, so that the task's time is still known."""
    index, started, allowance = SLOT.unpack_from(slots, offset)
    SLOT.pack_into(slots, offset, index, -abs(started), allowance)


def read_slot(slots: Any, offset: int) -> tuple[int, float, bool]:
    """The slot's task index, its start time, and whether its worker found
    its pipes to the driver closed."""
    index, started, _ = SLOT.unpack_from(slots, offset)
    return index, abs(started), started < 0


def slot_allowance(slots: Any, offset: int) -> int:
    """How many ``timeout=`` the slot's mark may run: more than 1 while its
    worker reads a batch's rows."""
    return max(1, SLOT.unpack_from(slots, offset)[2])


class Msg:
    """The first item of each message tuple: what the message is."""

    # driver -> worker
    BATCH = "batch"  # tasks to run
    ACK = "ack"  # a remote worker's part was received
    STOP = "stop"  # end cleanly
    # worker -> driver
    READY = "ready"  # a process worker is up (its pid)
    START = "start"  # a Ray or remote worker is up (its node, pid, version)
    FATAL = "fatal"  # the run cannot be loaded here (a traceback)
    RETIRE = "retire"  # the worker ends itself (why)
    UNREADABLE = "unreadable"  # a process worker cannot unpickle its next batch (why)
    RUN = "run"  # about to run one task of a marked batch
    PART = "part"  # outcomes so far
    DONE = "done"  # the batch's last outcomes
    TIMEOUT = "timeout"  # a remote worker ends itself: its task ran past timeout=
