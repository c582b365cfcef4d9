"""Readers for sysfs NUMA files, the NUMA part of /proc/vmstat, and a process's mappings
per NUMA node (/proc/<pid>/maps and numa_maps)."""

from __future__ import annotations

import re
from dataclasses import dataclass

from numaguard.exporter.readers import ParseError, _count, _small_int, parse_key_values

NUMASTAT_KINDS = (
    "numa_hit",
    "numa_miss",
    "numa_foreign",
    "interleave_hit",
    "local_node",
    "other_node",
)
VMSTAT_BALANCING = ("numa_hint_faults", "numa_hint_faults_local", "numa_pages_migrated")


@dataclass(frozen=True, slots=True)
class NodeMeminfo:
    total_bytes: int
    free_bytes: int
    used_bytes: int


def parse_distance(text: str) -> tuple[int, ...]:
    """``node/nodeN/distance``: distances to every node, in node order."""
    fields = text.split()
    if not fields:
        raise ParseError("empty distance row")
    return tuple(_count(f) for f in fields)


def parse_node_meminfo(text: str) -> NodeMeminfo:
    """``node/nodeN/meminfo``: lines like ``Node 0 MemTotal:  3631316 kB``."""
    values: dict[str, int] = {}
    for line in text.splitlines():
        fields = line.split()
        # "Node", id, "Key:", value[, "kB"]
        if len(fields) < 4 or fields[0] != "Node" or not fields[2].endswith(":"):
            continue
        key = fields[2][:-1]
        if key in ("MemTotal", "MemFree", "MemUsed"):
            scale = 1024 if fields[4:5] == ["kB"] else 1
            values[key] = _count(fields[3]) * scale
    if "MemTotal" not in values or "MemFree" not in values:
        raise ParseError("node meminfo lacks MemTotal or MemFree")
    used = values.get("MemUsed", values["MemTotal"] - values["MemFree"])
    if values["MemFree"] > values["MemTotal"] or used < 0:
        raise ParseError("node meminfo: free exceeds total")
    return NodeMeminfo(values["MemTotal"], values["MemFree"], used)


def parse_numastat(text: str) -> dict[str, int]:
    """``node/nodeN/numastat``: page counters by kind."""
    values = parse_key_values(text)
    missing = [k for k in ("local_node", "other_node") if k not in values]
    if missing:
        raise ParseError(f"numastat lacks {', '.join(missing)}")
    return {k: values[k] for k in NUMASTAT_KINDS if k in values}


def parse_vmstat_balancing(text: str) -> dict[str, int]:
    """The NUMA-balancing counters of ``/proc/vmstat``; empty when the kernel has none."""
    wanted = "\n".join(
        line for line in text.splitlines() if line.split(" ", 1)[0] in VMSTAT_BALANCING
    )
    return parse_key_values(wanted)


@dataclass(frozen=True, slots=True)
class ProcessMapping:
    """One mapping of a process: its address range, page size and pages per NUMA node."""

    start: int
    end: int
    page_size: int
    pages: dict[int, int]  # NUMA node -> pages resident there


_NUMA_MAPS_NODE = re.compile(r"N(\d{1,5})=(\d{1,20})")
_HEX = re.compile(r"[0-9a-f]{1,16}")


def parse_process_mappings(maps: str, numa_maps: str) -> tuple[ProcessMapping, ...]:
    """``/proc/<pid>/maps`` (each mapping's range) joined with ``/proc/<pid>/numa_maps``
    (its resident pages per node, ``N<node>=<pages>`` of ``kernelpagesize_kB``), read
    one after the other: a mapping in only one of them changed in between and is left
    out. Only mappings with resident pages are returned."""
    ends: dict[int, int] = {}
    for line in maps.splitlines():
        span = line.split(" ", 1)[0]
        lo, sep, hi = span.partition("-")
        if not sep or not _HEX.fullmatch(lo) or not _HEX.fullmatch(hi):
            raise ParseError(f"maps: expected 'start-end ...', got {line[:60]!r}")
        start, end = int(lo, 16), int(hi, 16)
        if end <= start:
            raise ParseError(f"maps: empty range {span!r}")
        ends[start] = end
    out = []
    for line in numa_maps.splitlines():
        fields = line.split()
        if not fields:
            continue
        if not _HEX.fullmatch(fields[0]):
            raise ParseError(f"numa_maps: expected an address, got {line[:60]!r}")
        start = int(fields[0], 16)
        pages: dict[int, int] = {}
        page_size = 4096
        for field in fields[1:]:
            if m := _NUMA_MAPS_NODE.fullmatch(field):
                pages[_small_int(m[1])] = int(m[2])
            elif field.startswith("kernelpagesize_kB="):
                page_size = _count(field.partition("=")[2]) * 1024
        if page_size <= 0 or page_size & (page_size - 1):
            raise ParseError(f"numa_maps: page size {page_size} is not a power of two")
        if pages and start in ends:
            out.append(ProcessMapping(start, ends[start], page_size, pages))
    return tuple(out)
