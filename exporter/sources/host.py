"""Host NUMA source: sysfs node and CPU topology, per-node memory and counters, vmstat."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field

from exporter.readers import parse_id_list, parse_single_int
from exporter.readers.numa import (
    NodeMeminfo,
    parse_distance,
    parse_node_meminfo,
    parse_numastat,
    parse_vmstat_balancing,
)
from exporter.sources import Issue, read_parsed

_NODE_DIR = re.compile(r"node(\d+)")


@dataclass(frozen=True, slots=True)
class NumaNodeReading:
    id: int
    cpus: frozenset[int] | None
    distances: tuple[int, ...] | None
    meminfo: NodeMeminfo | None
    numastat: dict[str, int] | None


@dataclass(frozen=True, slots=True)
class HostReading:
    nodes: tuple[NumaNodeReading, ...]
    socket_of_cpu: dict[int, int]
    balancing: dict[str, int]  # vmstat NUMA-balancing counters; empty when absent
    issues: list[Issue] = field(default_factory=list)


class HostSource:
    """Reads the host's NUMA picture under ``host_root``."""

    def __init__(self, host_root: str) -> None:
        self.root = host_root
        self._node_dir = os.path.join(host_root, "sys/devices/system/node")
        self._cpu_dir = os.path.join(host_root, "sys/devices/system/cpu")
        # CPU -> socket only changes with CPU hotplug: re-read when the online set changes.
        self._sockets_for: frozenset[int] | None = None
        self._socket_of_cpu: dict[int, int] = {}

    def read(self) -> HostReading:
        issues: list[Issue] = []
        nodes = tuple(self._read_node(n, issues) for n in self._node_ids(issues))
        online = read_parsed(issues, f"{self._cpu_dir}/online", parse_id_list)
        if online is not None and online != self._sockets_for:
            before = len(issues)
            self._socket_of_cpu = self._read_sockets(online, issues)
            # Cache only a complete answer, so a failed read is retried next cycle.
            self._sockets_for = online if len(issues) == before else None
        vmstat = os.path.join(self.root, "proc/vmstat")
        balancing = read_parsed(issues, vmstat, parse_vmstat_balancing) or {}
        return HostReading(nodes, dict(self._socket_of_cpu), balancing, issues)

    def _node_ids(self, issues: list[Issue]) -> list[int]:
        online = read_parsed(issues, f"{self._node_dir}/online", parse_id_list)
        if online is not None:
            return sorted(online)
        try:  # kernels without NUMA support have no "online" file; list the node dirs
            names = os.listdir(self._node_dir)
        except OSError:
            return []
        return sorted(int(m[1]) for n in names if (m := _NODE_DIR.fullmatch(n)))

    def _read_node(self, node: int, issues: list[Issue]) -> NumaNodeReading:
        base = f"{self._node_dir}/node{node}"
        return NumaNodeReading(
            id=node,
            cpus=read_parsed(issues, f"{base}/cpulist", parse_id_list),
            distances=read_parsed(issues, f"{base}/distance", parse_distance),
            meminfo=read_parsed(issues, f"{base}/meminfo", parse_node_meminfo),
            numastat=read_parsed(issues, f"{base}/numastat", parse_numastat),
        )

    def _read_sockets(self, cpus: frozenset[int], issues: list[Issue]) -> dict[int, int]:
        sockets = {}
        for cpu in sorted(cpus):
            path = f"{self._cpu_dir}/cpu{cpu}/topology/physical_package_id"
            socket = read_parsed(issues, path, parse_single_int)
            if socket is not None:
                sockets[cpu] = socket
        return sockets
