"""A process's memory per NUMA node, as the kernel's numa_maps and the cgroup's
memory.numa_stat count it."""

from __future__ import annotations


def numa_maps_bytes(text: str) -> dict[str, int]:
    """Pages per NUMA node over a process's mappings (/proc/<pid>/numa_maps), in bytes."""
    out: dict[str, int] = {}
    for line in text.splitlines():
        size = 4096 * (512 if "huge" in line else 1)  # kernelpagesize_kB aside, as numastat -p
        for field in line.split()[2:]:
            if field.startswith("N") and "=" in field:
                node, pages = field[1:].split("=")
                out[node] = out.get(node, 0) + int(pages) * size
    return out


def numa_stat_bytes(text: str) -> dict[str, int]:
    """A cgroup's memory per NUMA node (memory.numa_stat, anon + file), in bytes."""
    out: dict[str, int] = {}
    for line in text.splitlines():
        kind, *nodes = line.split()
        if kind in ("anon", "file"):
            for field in nodes:
                node, value = field[1:].split("=")
                out[node] = out.get(node, 0) + int(value)
    return out
