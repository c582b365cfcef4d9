"""Readers for the cgroup files of a container (v1 and v2)."""

from __future__ import annotations

import re
from dataclasses import dataclass

from exporter.readers import MAX_ID, ParseError, _count

# Regular expressions do the per-value work in C: these files are read ~1,000 times a
# cycle on a busy node.
_PER_NODE = re.compile(r"N(\d{1,5})=(\d{1,20})")
_NUMA_ROW_V2 = re.compile(r"^(anon|file)((?: N\d{1,5}=\d{1,20})*) *$", re.MULTILINE)
_NUMA_ROW_V1 = re.compile(
    r"^(hierarchical_total|total)=\d{1,20}((?: N\d{1,5}=\d{1,20})*) *$", re.MULTILINE
)
_PSI_LINE = re.compile(
    r"(some|full) avg10=\d+\.\d+ avg60=\d+\.\d+ avg300=\d+\.\d+ total=(\d{1,20})"
)


@dataclass(frozen=True, slots=True)
class CpuThrottling:
    periods: int
    throttled_periods: int
    throttled_seconds: float


@dataclass(frozen=True, slots=True)
class Pressure:
    some_seconds: float
    full_seconds: float | None  # cpu "full" exists only on newer kernels


def parse_numa_stat_v2(text: str) -> dict[int, int]:
    """cgroup v2 ``memory.numa_stat`` (bytes): anon + file per NUMA node."""
    rows = _numa_rows(_NUMA_ROW_V2, text)
    if "anon" not in rows or "file" not in rows:
        raise ParseError("memory.numa_stat lacks a well-formed anon or file row")
    return _per_node(rows["anon"], rows["file"])


def parse_numa_stat_v1(text: str, page_size: int) -> dict[int, int]:
    """cgroup v1 ``memory.numa_stat`` (pages): the hierarchical total per node, in bytes."""
    rows = _numa_rows(_NUMA_ROW_V1, text)
    pages = rows.get("hierarchical_total", rows.get("total"))
    if pages is None:
        raise ParseError("memory.numa_stat lacks a well-formed total row")
    return {node: count * page_size for node, count in _per_node(pages).items()}


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


def _numa_rows(row: re.Pattern, text: str) -> dict[str, str]:
    """The rows we use (the kernel writes a score of others), key -> per-node text."""
    return {m[1]: m[2] for m in row.finditer(text)}


def _per_node(*rows: str) -> dict[int, int]:
    """Sum rows of `` N0=<n> N1=<n>`` per node."""
    out: dict[int, int] = {}
    for row in rows:
        for node, value in _PER_NODE.findall(row):
            n = int(node)
            if n >= MAX_ID:
                raise ParseError(f"node id {n} out of range")
            out[n] = out.get(n, 0) + int(value)
    return out
