"""Moving a pod's memory, in place, to the NUMA node of its CPUs: the node's half of the
remedy for remote memory (docs/remediator.md), with move_pages(2).

What it may touch is narrow on purpose. Only the pod's own processes: those its cgroup
lists, each checked against its /proc/<pid>/cgroup just before its pages are moved (a
PID reused in between is not the pod's). Only pages that process alone maps
(``MPOL_MF_MOVE``; never ``MPOL_MF_MOVE_ALL``: a library page shared with other pods
stays). Only to the one node ``destination`` chose among the pod's CPUs' nodes and its
``cpuset.mems``, and never against the Memory Manager's pinning. At most ``rate`` bytes a
second, so that the node's memory bandwidth is not taken from its neighbours.

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
import time
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from numaguard.exporter.readers import ParseError
from numaguard.exporter.readers.cgroup import parse_proc_cgroup
from numaguard.exporter.readers.numa import Mapping, parse_process_mappings

MPOL_MF_MOVE = 1 << 1  # <linux/mempolicy.h>: pages mapped by this process alone
MOVE_PAGES = {"x86_64": 279, "aarch64": 239}  # the syscall's number
SCAN_PAGES = 4096  # pages asked where they are in one call
BATCH_PAGES = 256  # pages moved in one call: 1 MiB of 4 KiB pages, between rate checks
# the call's own errors that no other process of the pod would escape: stop at once
FATAL = {errno.EPERM, errno.EACCES, errno.EINVAL, errno.ENODEV, errno.ENOSYS}


class KernelRefused(OSError):
    """move_pages(2) failed as a whole (not page by page)."""


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
    stopped: str = ""  # why it stopped before the end (an errno name), if it did


def destination(
    cpu_nodes: Iterable[int],
    mems: Iterable[int],
    free_bytes: dict[int, int],
    needed_bytes: int,
    pinned: Iterable[int] = (),
) -> tuple[int | None, str]:
    """The NUMA node to move a pod's far memory to, or None and the reason: among its CPUs'
    nodes that its ``cpuset.mems`` allows (and the Memory Manager's ``pinned`` nodes, when
    it pinned the pod's memory), the one with most free memory, if that covers
    ``needed_bytes``."""
    candidates = set(cpu_nodes) & set(mems)
    if not candidates:
        return None, "mems"
    pinned = set(pinned)
    if pinned:
        candidates &= pinned
        if not candidates:
            return None, "memory_manager"
    node = max(sorted(candidates), key=lambda n: free_bytes.get(n, 0))
    if free_bytes.get(node, 0) < needed_bytes:
        return None, "no_free_memory"
    return node, ""


class Pace:
    """At most ``rate`` bytes a second since the first call: ``after(n)`` waits until the
    ``n`` bytes moved so far are due."""

    def __init__(
        self,
        rate: float,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        if not rate > 0:
            raise ValueError(f"rate must be positive, got {rate!r}")
        self.rate, self.clock, self.sleep = rate, clock, sleep
        self.started = clock()

    def after(self, moved_bytes: int) -> None:
        wait = self.started + moved_bytes / self.rate - self.clock()
        if wait > 0:
            self.sleep(wait)

    def elapsed(self) -> float:
        return self.clock() - self.started


def move_pod_memory(
    pod_cgroup: str,
    pod_uid: str,
    node: int,
    pace: Pace,
    kernel: Kernel,
    proc: str = "/proc",
) -> Moved:
    """Move the pages of the pod's processes that sit on any NUMA node but ``node`` to
    ``node``, at ``pace``. A process that ends meanwhile is skipped (ESRCH); a refusal
    that no other process would escape (EPERM, EACCES: no CAP_SYS_PTRACE) stops it."""
    moved = Moved()
    for pid in _pids(pod_cgroup):
        try:
            with open(f"{proc}/{pid}/cgroup") as f:
                owner = parse_proc_cgroup(f.read())
            if owner is None or owner[0] != pod_uid:
                moved.failures["not_the_pod"] += 1
                continue
            with open(f"{proc}/{pid}/maps") as f:
                maps = f.read()
            with open(f"{proc}/{pid}/numa_maps") as f:
                mappings = parse_process_mappings(maps, f.read())
            moved.processes += 1
            for mapping in mappings:
                if any(n != node and pages for n, pages in mapping.pages.items()):
                    _move_mapping(kernel, pid, mapping, node, pace, moved)
        except (FileNotFoundError, ProcessLookupError):
            moved.failures["ESRCH"] += 1
        except PermissionError:  # its maps: the same ptrace check move_pages makes
            moved.failures["EACCES"] += 1
            moved.stopped = "EACCES"
            break
        except ParseError:
            moved.failures["unreadable"] += 1
        except KernelRefused as e:
            name = errno.errorcode.get(e.errno, str(e.errno))
            moved.failures[name] += 1
            if e.errno in FATAL:
                moved.stopped = name
                break
    moved.seconds = pace.elapsed()
    return moved


def _move_mapping(
    kernel: Kernel, pid: int, mapping: Mapping, node: int, pace: Pace, moved: Moved
) -> None:
    size = mapping.page_size
    for first in range(mapping.start, mapping.end, SCAN_PAGES * size):
        addresses = range(first, min(mapping.end, first + SCAN_PAGES * size), size)
        where = kernel.move_pages(pid, addresses, None)
        far = [a for a, at in zip(addresses, where, strict=True) if at >= 0 and at != node]
        for i in range(0, len(far), BATCH_PAGES):
            for at in kernel.move_pages(pid, far[i : i + BATCH_PAGES], node):
                if at == node:
                    moved.pages += 1
                    moved.bytes += size
                elif at < 0:
                    moved.failures[errno.errorcode.get(-at, str(-at))] += 1
                else:  # the kernel put it elsewhere
                    moved.failures["other_node"] += 1
            pace.after(moved.bytes)


def _pids(pod_cgroup: str) -> list[int]:
    """Every process in the pod's cgroup and the cgroups below it (its containers)."""
    pids: list[int] = []
    for folder, _, files in os.walk(pod_cgroup):
        if "cgroup.procs" in files:
            try:
                with open(f"{folder}/cgroup.procs") as f:
                    pids += [int(word) for word in f.read().split() if word.isdigit()]
            except FileNotFoundError:  # a container that ended meanwhile
                continue
    return pids
