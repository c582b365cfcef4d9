"""Readers for the cgroup files of a container (v1 and v2)."""

from __future__ import annotations

import re
from dataclasses import dataclass

from numaguard.exporter.readers import MAX_ID, ParseError, _count

# Regular expressions do the per-value work in C: these files are read ~1,000 times a
# cycle on a busy node.
_PER_NODE = re.compile(r"N(\d{1,5})=(\d{1,20})")
_PER_NODE_ROW = re.compile(r"(?: N\d{1,5}=\d{1,20})*")
_PSI_LINE = re.compile(
    r"(some|full) avg10=\d+\.\d+ avg60=\d+\.\d+ avg300=\d+\.\d+ total=(\d{1,20})"
)


# Pod and container cgroup names: systemd driver (``kubepods-burstable-pod<uid>.slice``,
# ``cri-containerd-<id>.scope``) and cgroupfs driver (``pod<uid>``, ``<id>``).
_SYSTEMD_POD = re.compile(r"kubepods(?:-(?:burstable|besteffort))?-pod([0-9a-f_]+)\.slice")
_CGROUPFS_POD = re.compile(r"pod([0-9a-f-]+)")
_CONTAINER = re.compile(r"(?:(cri-containerd|crio|docker)-)?([0-9a-f]{64})(?:\.scope)?")
_RUNTIME = {"cri-containerd": "containerd", "crio": "cri-o", "docker": "docker"}


def pod_uid_of(name: str) -> str | None:
    """The pod UID in a pod cgroup's directory name, under either driver."""
    m = _SYSTEMD_POD.fullmatch(name)
    if m:
        return m[1].replace("_", "-")
    m = _CGROUPFS_POD.fullmatch(name)
    return m[1] if m else None


def container_of(name: str) -> tuple[str, str] | None:
    """(runtime, container id) from a container cgroup's directory name; runtime is ""
    when the name does not say (cgroupfs)."""
    m = _CONTAINER.fullmatch(name)
    return (_RUNTIME.get(m[1] or "", ""), m[2]) if m else None


def parse_proc_cgroup(text: str) -> tuple[str, str] | None:
    """``/proc/<pid>/cgroup`` -> (pod uid, container id) of the pod container the process
    runs in; None for a process outside any pod (v1 and v2 lines alike)."""
    for line in text.splitlines():
        fields = line.split(":", 2)
        if len(fields) != 3:
            raise ParseError(f"expected 'id:controllers:path', got {line[:60]!r}")
        parts = fields[2].split("/")
        for i, part in enumerate(parts[:-1]):
            uid = pod_uid_of(part)
            container = uid and container_of(parts[i + 1])
            if container:
                return uid, container[1]
    return None


@dataclass(slots=True)
class CpuThrottling:
    periods: int
    throttled_periods: int
    throttled_seconds: float


@dataclass(slots=True)
class Pressure:
    some_seconds: float
    full_seconds: float | None  # cpu "full" exists only on newer kernels


def parse_numa_stat_v2(text: str) -> dict[int, int]:
    """cgroup v2 ``memory.numa_stat`` (bytes): anon + file per NUMA node."""
    anon, file = _numa_row(text, "anon "), _numa_row(text, "file ")
    if anon is None or file is None:
        raise ParseError("memory.numa_stat lacks anon or file")
    return _per_node(anon, file)


def parse_numa_stat_v1(text: str, page_size: int) -> dict[int, int]:
    """cgroup v1 ``memory.numa_stat`` (pages): the hierarchical total per node, in bytes."""
    row = _numa_row(text, "hierarchical_total=") or _numa_row(text, "total=")
    if row is None:
        raise ParseError("memory.numa_stat lacks total")
    total, _, row = row.strip().partition(" ")
    _count(total)
    return {node: count * page_size for node, count in _per_node(row).items()}


def parse_cpu_throttling(text: str) -> CpuThrottling | None:
    """``cpu.stat``; None when the cpu controller gives no bandwidth figures."""
    values: dict[str, int] = {}
    for line in text.splitlines():
        fields = line.split()
        if len(fields) == 2 and fields[0] in _THROTTLE_KEYS:
            values[fields[0]] = _count(fields[1])
        elif line.strip() and len(fields) != 2:
            raise ParseError(f"expected 'key value', got {line[:60]!r}")
    if "nr_periods" not in values or "nr_throttled" not in values:
        return None
    if "throttled_usec" in values:  # v2
        seconds = values["throttled_usec"] / 1e6
    elif "throttled_time" in values:  # v1, nanoseconds
        seconds = values["throttled_time"] / 1e9
    else:
        raise ParseError("cpu.stat lacks throttled time")
    return CpuThrottling(values["nr_periods"], values["nr_throttled"], seconds)


def parse_pressure(text: str) -> Pressure:
    """A PSI file: ``some avg10=0.00 avg60=0.00 avg300=0.00 total=123`` (total in µs)."""
    totals: dict[str, float] = {}
    for line in text.splitlines():
        if not line:
            continue
        m = _PSI_LINE.fullmatch(line)
        if m is None:
            raise ParseError(f"unexpected pressure line {line[:60]!r}")
        totals[m[1]] = int(m[2]) / 1e6
    if "some" not in totals:
        raise ParseError("pressure file lacks 'some'")
    return Pressure(totals["some"], totals.get("full"))


_THROTTLE_KEYS = frozenset({"nr_periods", "nr_throttled", "throttled_usec", "throttled_time"})


def _numa_row(text: str, key: str) -> str | None:
    """What follows ``key`` on its row, found by plain search: the kernel writes a score
    of rows we do not use, and scanning them all with a pattern costs twice as much."""
    if text.startswith(key):
        start = len(key)
    else:
        at = text.find("\n" + key)
        if at < 0:
            return None
        start = at + 1 + len(key)
    end = text.find("\n", start)
    return (text[start:end] if end >= 0 else text[start:]).rstrip(" ")


def _per_node(*rows: str) -> dict[int, int]:
    """Sum rows of `` N0=<n> N1=<n>`` per node."""
    out: dict[int, int] = {}
    for row in rows:
        row = row.strip()
        if row and not _PER_NODE_ROW.fullmatch(" " + row):
            raise ParseError(f"bad per-node values {row[:60]!r}")
        for node, value in _PER_NODE.findall(row):
            n = int(node)
            if n >= MAX_ID:
                raise ParseError(f"node id {n} out of range")
            out[n] = out.get(n, 0) + int(value)
    return out
