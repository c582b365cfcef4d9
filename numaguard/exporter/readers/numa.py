"""Readers for sysfs NUMA files and the NUMA part of /proc/vmstat."""

from __future__ import annotations

from dataclasses import dataclass

from numaguard.exporter.readers import ParseError, _count, parse_key_values

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
