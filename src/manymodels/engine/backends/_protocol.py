"""What the processes backend's driver and workers share: the slot layout.

Each worker owns one slot of a small shared file: the index of the task it is
running (-1 when none) and the wall-clock time it started it. The driver reads
the slots to blame the right task when a worker dies and to enforce timeouts.
"""

import struct

SLOT = struct.Struct("qd")
