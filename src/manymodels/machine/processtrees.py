"""The processes of this machine and the memory they hold: which processes
belong to a worker (its tree and its session), ending a tree without
leaving a process that started meanwhile, waiting for a child's exit, and a
process's memory as its share of the pages it maps (PSS), which a worker's
``memory_limit`` is held to. Read from ``/proc`` where there is one (Linux);
psutil elsewhere.
"""

from __future__ import annotations

import functools
import os
import re
import signal


def process_table() -> dict[int, tuple[int, int]]:
    """``{pid: (parent pid, session id)}`` of every live process (zombies left
    out), from one pass over ``/proc``."""
    table: dict[int, tuple[int, int]] = {}
    try:
        names = os.listdir("/proc")
    except OSError:
        return _psutil_process_table()
    for name in names:
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as handle:
                stat = handle.read()
            # after "pid (comm) ": state ppid pgrp session ...
            state, ppid, _, session = stat[stat.rindex(b")") + 2:].split(None, 4)[:4]
        except (OSError, ValueError):
            continue  # gone meanwhile
        if state not in (b"Z", b"X"):
            table[int(name)] = (int(ppid), int(session))
    return table


def _psutil_process_table() -> dict[int, tuple[int, int]]:
    import psutil

    table = {}
    for process in psutil.process_iter(["ppid", "status"]):
        if process.info["status"] == psutil.STATUS_ZOMBIE:
            continue
        try:
            table[process.pid] = (process.info["ppid"], os.getsid(process.pid))
        except OSError:
            continue
    return table


def process_tree(root: int, table: dict[int, tuple[int, int]] | None = None) -> list[int]:
    """The live processes that belong to ``root``, a session leader, ``root``
    left out: its descendants, and every process of its session (a process
    whose parent exited stays in the session), with their descendants. A
    descendant that started a session of its own and was then orphaned (a
    daemon's double fork) is nobody's: it is not found."""
    table = process_table() if table is None else table
    children: dict[int, list[int]] = {}
    pending = []
    for pid, (ppid, session) in table.items():
        children.setdefault(ppid, []).append(pid)
        if session == root and pid != root:
            pending.append(pid)
    pending.extend(children.get(root, ()))
    seen, tree = {root}, []
    while pending:
        pid = pending.pop()
        if pid not in seen:
            seen.add(pid)
            tree.append(pid)
            pending.extend(children.get(pid, ()))
    return tree


def end_tree(root: int, *, with_root: bool) -> list[int]:
    """SIGKILL the processes of ``root``'s tree (:func:`process_tree`), and
    ``root`` itself ``with_root``, but for resource trackers
    (:func:`ends_by_itself`). Each is stopped first and the tree looked up
    again until no new one shows, so that none starts another meanwhile.
    Returns the processes signalled."""
    stopped: list[int] = []
    candidates = [root] if with_root else []
    for _ in range(8):
        for pid in candidates:
            try:
                os.kill(pid, signal.SIGSTOP)
                stopped.append(pid)
            except OSError:
                pass
        tree = process_tree(root)
        candidates = [pid for pid in tree if pid not in stopped and not ends_by_itself(pid)]
        if not candidates:
            break
    for pid in stopped:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    return stopped


def wait_for_exit(pid: int, timeout: float) -> bool:
    """Wait up to ``timeout`` seconds for child ``pid`` to exit, without
    reaping it; whether it did. Woken by the exit itself (a pidfd, Linux
    5.3+), where a poll loop's sleeps add milliseconds to every run's end;
    elsewhere, False at once: the caller polls as before."""
    import select

    try:
        fd = os.pidfd_open(pid)
    except (AttributeError, OSError):  # not Linux, an old kernel, or already reaped
        return False
    try:
        waiter = select.poll()
        waiter.register(fd, select.POLLIN)
        return bool(waiter.poll(max(0, int(timeout * 1000))))
    finally:
        os.close(fd)


def ends_by_itself(pid: int) -> bool:
    """Whether ``pid`` is a resource tracker (multiprocessing's, or loky's
    under joblib): once every process that holds its pipe is gone, it
    removes what they leaked (shared memory, semaphores, joblib's memory
    mapped folders under ``/dev/shm``), then exits. Killing it would leak them."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            return b"resource_tracker import main" in handle.read()
    except OSError:
        return False


def memory_bound(pid: int) -> int:
    """A cheap upper bound (in bytes) of :func:`memory_held`: the process's
    resident anonymous and shared-memory pages and its swap, read from
    ``/proc/PID/status`` (tens of microseconds). Raises ``OSError`` once the
    process is gone."""
    try:
        with open(f"/proc/{pid}/status", "rb") as handle:
            status = handle.read()
    except FileNotFoundError:
        if os.path.isdir("/proc/self"):
            raise
        return _psutil_rss(pid)
    total = 0
    for line in status.split(b"\n"):
        if line.startswith((b"RssAnon:", b"RssShmem:", b"VmSwap:")):
            total += int(line.split()[1])
    return total * 1024


def _psutil_rss(pid: int) -> int:
    import psutil

    try:
        return psutil.Process(pid).memory_info().rss
    except psutil.Error as error:
        raise OSError(str(error)) from None


def memory_held(pid: int, exclude: str | None = None) -> int:
    """The memory (in bytes) that process ``pid`` holds, with pages it shares
    with others split between them (PSS): its anonymous memory (heap, stacks,
    the copy-on-write pages of private file mappings), its shared memory
    (shared anonymous mappings, ``memfd``, files under ``tmpfs`` such as
    ``/dev/shm``) and its swap. Not counted: the page cache of the regular
    files it maps (reclaimable, like the libraries it loaded) and the
    mappings of files whose path contains ``exclude`` (the run's read-only
    data plane).

    The kernel walks the process's page tables for this (milliseconds for a
    worker with NumPy and pandas loaded, more the more it maps): call it only
    when :func:`memory_bound` says it could matter. Raises ``OSError`` once
    the process is gone."""
    try:
        if exclude:
            with open(f"/proc/{pid}/maps", "rb") as handle:
                mapped = handle.read()  # no page walk: cheap
            if exclude.encode() in mapped:
                return _memory_held_by_mapping(pid, exclude.encode())
        with open(f"/proc/{pid}/smaps_rollup", "rb") as handle:
            rollup = handle.read()
    except FileNotFoundError:
        if os.path.isdir("/proc/self"):
            raise
        return _psutil_rss(pid)  # no /proc: not Linux
    fields = dict(_ROLLUP_FIELD.findall(rollup))
    if b"Pss_Anon" not in fields:  # Linux before 5.7
        return _memory_held_by_mapping(pid, exclude.encode() if exclude else None)
    return sum(int(fields.get(name, 0)) for name in (b"Pss_Anon", b"Pss_Shmem", b"SwapPss")) * 1024


_ROLLUP_FIELD = re.compile(rb"\n(\w+): +(\d+)")
#: In /proc/PID/smaps: a mapping's header line (its path), or a field that counts.
_SMAPS_LINE = re.compile(
    rb"\n(?:[0-9a-f]+-[0-9a-f]+ \S+ \S+ \S+ \S+ *([^\n]*)|(Pss|Anonymous|SwapPss): +(\d+))"
)


def _memory_held_by_mapping(pid: int, skip: bytes | None) -> int:
    with open(f"/proc/{pid}/smaps", "rb") as handle:
        smaps = b"\n" + handle.read()
    shared = _shared_memory_mounts()
    total = 0
    counted: bytes | None = b"Pss"  # the field that counts in the current mapping
    for path, field, kib in _SMAPS_LINE.findall(smaps):
        if field:
            if field == counted or (field == b"SwapPss" and counted is not None):
                total += int(kib)
        elif not path.startswith(b"/"):  # anonymous, [heap], [stack], [anon:...]
            counted = b"Pss"
        elif skip is not None and skip in path:
            counted = None
        elif path.startswith(shared):
            counted = b"Pss"
        else:  # a regular file: only the pages written (copied) are the process's
            counted = b"Anonymous"
    return total * 1024


@functools.lru_cache(maxsize=1)
def _shared_memory_mounts() -> tuple[bytes, ...]:
    """Path prefixes of the mappings that are shared memory, not files: those
    of memory file systems (``tmpfs``, such as ``/dev/shm``), ``memfd``
    files, shared anonymous (``/dev/zero``) and System V segments."""
    prefixes = [b"/memfd:", b"/dev/zero", b"/SYSV", b"/dev/shm/"]
    try:
        with open("/proc/self/mounts", "rb") as handle:
            for line in handle:
                fields = line.split()
                if len(fields) > 2 and fields[2] in (b"tmpfs", b"ramfs", b"hugetlbfs"):
                    mount = fields[1].replace(b"\\040", b" ").rstrip(b"/")
                    if mount:  # a root file system in memory: its files are files
                        prefixes.append(mount + b"/")
    except OSError:
        pass
    return tuple(prefixes)
