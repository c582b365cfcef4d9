"""Moving one pod's pages home with move_pages(2): the memory mover's helper, the one
process that holds ``CAP_SYS_PTRACE`` (helper.py), does this and nothing else.

What it may touch is narrow on purpose. Only the pod's own processes: those its cgroup
lists, each checked against its /proc/<pid>/cgroup just before its pages are moved (a
PID reused in between is not the pod's). Only pages that process alone maps
(``MPOL_MF_MOVE``; never ``MPOL_MF_MOVE_ALL``: a library page shared with other pods
stays). Only to the node it is given, which its ``cpuset.mems`` must allow. At most
``rate`` bytes a second, so that the node's memory bandwidth is not taken from its
neighbours.

The capability it takes is ``CAP_SYS_PTRACE``, and nothing more: since Linux 4.14 (commit
197e7e521384, "Sanitize 'move_pages()' permission checks") move_pages(2) on another
user's process, or one with capabilities the caller lacks, asks the ptrace access check
that reading /proc/<pid>/maps and numa_maps asks too; ``CAP_SYS_NICE`` is only for
``MPOL_MF_MOVE_ALL``, which this never uses.
"""

from __future__ import annotations

import ctypes
import errno
import os
import platform
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from numaguard.exporter.readers import ParseError, parse_id_list
from numaguard.exporter.readers.cgroup import parse_proc_cgroup
from numaguard.exporter.readers.numa import ProcessMapping, parse_process_mappings
from numaguard.exporter.readers.process import parse_start_time

MPOL_MF_MOVE = 1 << 1  # <linux/mempolicy.h>: pages mapped by this process alone
MOVE_PAGES = {"x86_64": 279, "aarch64": 239}  # the syscall's number
SCAN_PAGES = 4096  # pages asked where they are in one call
# bytes moved in one call, between rate checks: 256 pages of 4 KiB, one huge page (a
# 1 GiB page is moved alone, and the rate waits for it)
BATCH_BYTES = 1 << 20
# numa_maps counts a mapping's pages per node, not where they are: a mapping is scanned
# until all its far pages are found, the densest first. A mapping reserved and untouched
# but for a page (MAP_NORESERVE: 0.25 TiB held a mover at full CPU for minutes, seen) is
# asked about one chunk and as many addresses again as 16 times its pages, and a request
# about a million addresses and 16 per far page of the pod; past either, its far pages
# are counted unfound (scan_limit).
SCAN_PAGES_PER_PAGE = 16
SCAN_FLOOR_PAGES = 1 << 20
PAGE_SIZE = os.sysconf("SC_PAGE_SIZE")  # a mapping of larger pages is hugetlb's
# the call's own errors that no other process of the pod would escape: stop at once
FATAL = {errno.EPERM, errno.EACCES, errno.EINVAL, errno.ENODEV, errno.ENOSYS}
# why a move stopped when it was told to (its exporter or its helper ending): the request
# stays on the pod, and the next exporter carries it on
SHUTDOWN = "shutdown"


class KernelRefused(OSError):
    """move_pages(2) failed as a whole (not page by page)."""


class Reused(Exception):
    """The PID no longer names the process checked against the pod (it ended, and the
    PID was given to another)."""


class Kernel:
    """move_pages(2), through libc's syscall()."""

    def __init__(self) -> None:
        number = MOVE_PAGES.get(platform.machine())
        if number is None:
            raise KernelRefused(errno.ENOSYS, f"move_pages on {platform.machine()}")
        self._number = number
        self._syscall = ctypes.CDLL(None, use_errno=True).syscall
        self._syscall.restype = ctypes.c_long

    def move_pages(self, pid: int, addresses: Sequence[int], node: int | None) -> list[int]:
        """Per page: the NUMA node it is on after the call, or a negative errno (ENOENT:
        not present, EFAULT: not mapped, EACCES: mapped by others too, EBUSY, ENOMEM...).
        ``node`` None moves nothing and only says where each page is."""
        n = len(addresses)
        pages = (ctypes.c_void_p * n)(*addresses)
        nodes = (ctypes.c_int * n)(*([node] * n)) if node is not None else None
        status = (ctypes.c_int * n)()
        flags = MPOL_MF_MOVE if node is not None else 0
        args = (ctypes.c_long(pid), ctypes.c_ulong(n), pages, nodes, status, ctypes.c_int(flags))
        if self._syscall(ctypes.c_long(self._number), *args) < 0:
            code = ctypes.get_errno()
            raise KernelRefused(code, f"move_pages(pid {pid}): {os.strerror(code)}")
        return list(status)


@dataclass
class Moved:
    """What one move did."""

    pages: int = 0
    bytes: int = 0
    seconds: float = 0.0
    processes: int = 0  # the pod's processes whose pages were looked at
    failures: Counter[str] = field(default_factory=Counter)  # pages (or calls) by errno name
    stopped: str = ""  # why it stopped before the end (an errno name, SHUTDOWN), if it did
    scan_left: int = 0  # addresses it may still ask about
    # hugetlb pages of each size (bytes) it may still move: the destination's free ones,
    # as its pool said when first asked (memory.numa_stat counts none of them, so the
    # free memory the request was judged by says nothing of them)
    hugepages_left: dict[int, int] = field(default_factory=dict)


class Stopped(Exception):
    """The move was told to stop (its exporter or its helper is ending)."""


class Pace:
    """At most ``rate`` bytes a second since the first call, or since ``owed_until`` (when
    what earlier moves moved is paid for): ``after(n)`` waits until the ``n`` bytes moved
    so far are due, or raises Stopped once ``stopping`` is set."""

    def __init__(
        self,
        rate: float,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], object] = time.sleep,
        stopping: threading.Event | None = None,
        owed_until: float = 0.0,
    ) -> None:
        if not rate > 0:
            raise ValueError(f"rate must be positive, got {rate!r}")
        self.rate, self.clock, self.sleep, self.stopping = rate, clock, sleep, stopping
        self.started = clock()
        self.due = max(self.started, owed_until)
        self.moved = 0

    def after(self, moved_bytes: int) -> None:
        """Called after every call to the kernel, a move or a scan."""
        self.moved = moved_bytes
        wait = self.owed_until() - self.clock()
        if wait > 0:
            self.sleep(wait)
        if self.stopping is not None and self.stopping.is_set():
            raise Stopped

    def owed_until(self) -> float:
        """When what has moved so far is paid for: the next move's ``owed_until``."""
        return self.due + self.moved / self.rate

    def elapsed(self) -> float:
        return self.clock() - self.started


def move_pod_memory(
    cgroups: Iterable[str],
    pod_uid: str,
    node: int,
    pace: Pace,
    kernel: Kernel,
    proc: str = "/proc",
    home: Iterable[int] = (),
    far_bytes: int = 0,
    sys: str = "/sys",
) -> Moved:
    """Move the pages of the pod's processes that sit on NUMA nodes outside ``home`` (its
    CPUs' nodes; ``node`` is always one) to ``node``, at ``pace``, asking about at most
    as many addresses as its ``far_bytes`` warrant. A process that ends meanwhile is
    skipped (ESRCH), and so is one whose PID names another process by the time of a call
    (pid_reused); a refusal that no other process would escape (EPERM, EACCES: no
    CAP_SYS_PTRACE) stops it, and so does ``pace`` when told to (SHUTDOWN)."""
    home = frozenset(home) | {node}
    far_pages = far_bytes // PAGE_SIZE
    moved = Moved(scan_left=SCAN_FLOOR_PAGES + SCAN_PAGES_PER_PAGE * far_pages)
    for pid in _pids(cgroups):
        try:
            # the start time read before and after the cgroup: the same both times, the
            # cgroup read is of the process the start time names
            started = _start_time(proc, pid)
            with open(f"{proc}/{pid}/cgroup") as f:
                owner = parse_proc_cgroup(f.read())
            if owner is None or owner[0] != pod_uid or started is None:
                moved.failures["not_the_pod"] += 1
                continue
            if _start_time(proc, pid) != started:
                raise Reused(pid)
            with open(f"{proc}/{pid}/maps") as f:
                maps = f.read()
            with open(f"{proc}/{pid}/numa_maps") as f:
                mappings = parse_process_mappings(maps, f.read())
            moved.processes += 1
            process = _Process(kernel, proc, pid, started)
            far = [m for m in mappings if any(n not in home and p for n, p in m.pages.items())]
            for mapping in sorted(far, key=lambda m: -_far_share(m, home)):
                if mapping.page_size > PAGE_SIZE and mapping.page_size not in moved.hugepages_left:
                    moved.hugepages_left[mapping.page_size] = _free_hugepages(
                        sys, node, mapping.page_size
                    )
                _move_mapping(process, mapping, node, home, pace, moved)
        except (FileNotFoundError, ProcessLookupError):
            moved.failures["ESRCH"] += 1
        except Reused:
            moved.failures["pid_reused"] += 1
        except PermissionError:  # its maps: the same ptrace check move_pages makes
            moved.failures["EACCES"] += 1
            moved.stopped = "EACCES"
            break
        except ParseError:
            moved.failures["unreadable"] += 1
        except Stopped:
            moved.stopped = SHUTDOWN
            break
        except KernelRefused as e:
            name = errno.errorcode.get(e.errno, str(e.errno))
            moved.failures[name] += 1
            if e.errno in FATAL:
                moved.stopped = name
                break
    moved.seconds = pace.elapsed()
    return moved


class _Process:
    """move_pages(2) on one process of the pod, each call made only while its PID still
    names the process checked against the pod (the start time /proc/<pid>/stat gives,
    read again just before): a move takes minutes, and a PID freed meanwhile may be
    given to any other process on the node."""

    def __init__(self, kernel: Kernel, proc: str, pid: int, started: int) -> None:
        self.kernel, self.proc, self.pid, self.started = kernel, proc, pid, started

    def move_pages(self, addresses: Sequence[int], node: int | None) -> list[int]:
        if _start_time(self.proc, self.pid) != self.started:
            raise Reused(self.pid)
        return self.kernel.move_pages(self.pid, addresses, node)


def _move_mapping(
    process: _Process,
    mapping: ProcessMapping,
    node: int,
    home: frozenset[int],
    pace: Pace,
    moved: Moved,
) -> None:
    size, span = mapping.page_size, SCAN_PAGES * mapping.page_size
    batch_pages = max(1, BATCH_BYTES // size)
    scan_left = SCAN_PAGES + SCAN_PAGES_PER_PAGE * sum(mapping.pages.values())
    # pages numa_maps shows away from home that move_pages says are not there (ENOENT):
    # Debian's Linux 6.1 cannot see a page NUMA balancing marked for a hinting fault
    shown = sum(pages for n, pages in mapping.pages.items() if n not in home)
    found = unseen = 0
    # chunks aligned in memory, as huge pages are: one never straddles two chunks (its
    # pages in the next one would be home already when that one is asked, and uncounted)
    for edge in range(mapping.start // span * span, mapping.end, span):
        if found >= shown:
            break  # every far page numa_maps counted is found: the rest is home or empty
        first = max(edge, mapping.start)
        addresses = range(first, min(mapping.end, edge + span), size)
        if len(addresses) > min(scan_left, moved.scan_left):
            moved.failures["scan_limit"] += shown - found
            found = shown  # not found, and counted so
            break
        scan_left -= len(addresses)
        moved.scan_left -= len(addresses)
        where = process.move_pages(addresses, None)
        pace.after(moved.bytes)  # a stop is heard between any two calls
        far = [a for a, at in zip(addresses, where, strict=True) if at >= 0 and at not in home]
        found += len(far)
        unseen += where.count(-errno.ENOENT)
        for i in range(0, len(far), batch_pages):
            batch = far[i : i + batch_pages]
            if size in moved.hugepages_left:  # hugetlb: no more than its pool has free
                left = moved.hugepages_left[size]
                moved.failures["no_free_hugepages"] += len(batch[left:])
                batch = batch[:left]
                moved.hugepages_left[size] -= len(batch)
                if not batch:
                    continue
            status = process.move_pages(batch, node)
            # a transparent huge page moves whole with its first address; the kernel says
            # EBUSY for its others in the same call: where they are now tells
            busy = [a for a, at in zip(batch, status, strict=True) if at == -errno.EBUSY]
            if busy:
                now = dict(zip(busy, process.move_pages(busy, None), strict=True))
                status = [now.get(a, at) for a, at in zip(batch, status, strict=True)]
            for at in status:
                if at == node:
                    moved.pages += 1
                    moved.bytes += size
                elif at < 0:
                    moved.failures[errno.errorcode.get(-at, str(-at))] += 1
                else:  # the kernel put it elsewhere
                    moved.failures["other_node"] += 1
            pace.after(moved.bytes)
    if found < shown and unseen:
        moved.failures["ENOENT"] += min(unseen, shown - found)


def _free_hugepages(sys: str, node: int, size: int) -> int:
    """The free pages of ``size`` bytes in ``node``'s hugetlb pool; 0 if unreadable."""
    path = f"{sys}/devices/system/node/node{node}/hugepages/hugepages-{size // 1024}kB"
    try:
        with open(f"{path}/free_hugepages") as f:
            return max(0, int(f.read()))
    except (OSError, ValueError):
        return 0


def _far_share(mapping: ProcessMapping, home: frozenset[int]) -> float:
    """The share of the mapping's addresses that numa_maps says are far from home."""
    far = sum(pages for n, pages in mapping.pages.items() if n not in home)
    return far * mapping.page_size / max(1, mapping.end - mapping.start)


def _start_time(proc: str, pid: int) -> int | None:
    """The process's start time (readers.process); None if it has ended."""
    try:
        with open(f"{proc}/{pid}/stat", errors="surrogateescape") as f:
            return parse_start_time(f.read())
    except (OSError, ParseError):
        return None


def _pids(cgroups: Iterable[str]) -> list[int]:
    """Every process in the cgroups and the cgroups below them."""
    pids: list[int] = []
    for folder, _, files in (w for top in cgroups for w in os.walk(top)):
        if "cgroup.procs" in files:
            try:
                with open(f"{folder}/cgroup.procs") as f:
                    pids += [int(word) for word in f.read().split() if word.isdigit()]
            except FileNotFoundError:  # a container that ended meanwhile
                continue
    return pids


def allowed_mems(cgroups: Iterable[str]) -> frozenset[int]:
    """The NUMA nodes every one of the containers may use (cpuset.mems.effective, or v1's
    cpuset.effective_mems); empty when one cannot be read."""
    allowed = None
    for folder in cgroups:
        for name in ("cpuset.mems.effective", "cpuset.effective_mems"):
            try:
                with open(f"{folder}/{name}") as f:
                    mems = parse_id_list(f.read())
                break
            except (OSError, ParseError):
                continue
        else:
            return frozenset()
        allowed = mems if allowed is None else allowed & mems
    return allowed or frozenset()
