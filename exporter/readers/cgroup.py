"""Readers for the cgroup files of a container (v1 and v2)."""

from __future__ import annotations

from dataclasses import dataclass

from exporter.readers import MAX_ID, ParseError, _count


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
    rows = _numa_rows(text, sep=" ")
    if "anon" not in rows or "file" not in rows:
        raise ParseError("memory.numa_stat lacks anon or file")
    return _add(rows["anon"], rows["file"])


def parse_numa_stat_v1(text: str, page_size: int) -> dict[int, int]:
    """cgroup v1 ``memory.numa_stat`` (pages): the hierarchical total per node, in bytes."""
    rows = _numa_rows(text, sep="=")
    pages = rows.get("hierarchical_total", rows.get("total"))
    if pages is None:
        raise ParseError("memory.numa_stat lacks total")
    return {node: count * page_size for node, count in pages.items()}


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
        fields = line.split()
        if not fields:
            continue
        if fields[0] not in ("some", "full") or not fields[-1].startswith("total="):
            raise ParseError(f"unexpected pressure line {line[:60]!r}")
        totals[fields[0]] = _count(fields[-1][len("total=") :]) / 1e6
    if "some" not in totals:
        raise ParseError("pressure file lacks 'some'")
    return Pressure(totals["some"], totals.get("full"))


_THROTTLE_KEYS = frozenset(
    {"nr_periods", "nr_throttled", "throttled_usec", "throttled_time"}
)


def _numa_rows(text: str, sep: str) -> dict[str, dict[int, int]]:
    """Rows of ``<key><sep><value> N0=<n> N1=<n>``, keyed by ``key``."""
    rows: dict[str, dict[int, int]] = {}
    for line in text.splitlines():
        fields = line.split()
        if not fields:
            continue
        if sep == " ":
            key, per_node = fields[0], fields[1:]
        else:
            key, _, total = fields[0].partition("=")
            _count(total)
            per_node = fields[1:]
        nodes: dict[int, int] = {}
        for item in per_node:
            name, eq, value = item.partition("=")
            if not eq or not name.startswith("N"):
                raise ParseError(f"bad per-node field {item[:40]!r}")
            node = _count(name[1:])
            if node >= MAX_ID:
                raise ParseError(f"node id {node} out of range")
            nodes[node] = _count(value)
        rows[key] = nodes
    return rows


def _add(a: dict[int, int], b: dict[int, int]) -> dict[int, int]:
    return {node: a.get(node, 0) + b.get(node, 0) for node in a.keys() | b.keys()}
