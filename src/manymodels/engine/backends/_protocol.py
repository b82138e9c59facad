"""What the driver and the workers of every backend share: the kinds of
message they exchange, and the processes backend's slot layout.

Messages are tuples whose first item is one of :class:`Msg`'s kinds (plain
strings on the wire). Each processes worker owns one slot of a small shared
file: the index of the task it is running (-1 when none, :data:`LOADING`
while it unpickles its next batch) and the wall-clock time it started it,
negated once the worker found its pipes to the driver closed
(:func:`mark_pipes_closed`). The driver reads the slots to blame the right
task when a worker dies and to enforce timeouts.
"""

import struct
from typing import Any

SLOT = struct.Struct("qd")
#: A slot's index while its worker unpickles its next batch: a death then is
#: that batch's doing (an item whose unpickling kills the process).
LOADING = -2


def mark_pipes_closed(slots: Any, offset: int) -> None:
    """Mark the slot at ``offset``: its worker found its pipes to the driver
    closed (by the task the slot names) and ends. The start time is kept,
    negated, so that the task's time is still known."""
    index, started = SLOT.unpack_from(slots, offset)
    SLOT.pack_into(slots, offset, index, -abs(started))


def read_slot(slots: Any, offset: int) -> tuple[int, float, bool]:
    """The slot's task index, its start time, and whether its worker found
    its pipes to the driver closed."""
    index, started = SLOT.unpack_from(slots, offset)
    return index, abs(started), started < 0


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
