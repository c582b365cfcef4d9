"""Host NUMA source: sysfs node and CPU topology (sockets, SMT siblings, L3 caches),
per-node memory and counters, vmstat, and each CPU's busy time (/proc/stat)."""

from __future__ import annotations

import os
import re
from typing import TYPE_CHECKING

from numaguard.exporter.readers import parse_id_list, parse_single_int
from numaguard.exporter.readers.cpu import parse_cpu_times, parse_smt_active
from numaguard.exporter.readers.numa import (
    parse_distance,
    parse_node_meminfo,
    parse_numastat,
    parse_vmstat_balancing,
)
from numaguard.exporter.readers.resctrl import parse_cache_size
from numaguard.exporter.records import HostReading, Issue, L3Domain, NumaNodeReading
from numaguard.exporter.sources import read_parsed, subdirs

if TYPE_CHECKING:
    from numaguard.exporter.settings import Settings

_NODE_DIR = re.compile(r"node(\d+)")


class HostSource:
    """Reads the host's NUMA picture under ``host_root``."""

    def __init__(self, host_root: str) -> None:
        self.root = host_root
        self._node_dir = os.path.join(host_root, "sys/devices/system/node")
        self._cpu_dir = os.path.join(host_root, "sys/devices/system/cpu")
        # CPU -> socket, core and L3 cache only change with CPU hotplug (SMT turned off
        # takes siblings offline): re-read when the online set changes.
        self._cpus_read_for: frozenset[int] | None = None
        self._socket_of_cpu: dict[int, int] = {}
        self._core_of_cpu: dict[int, frozenset[int]] = {}
        self._smt_active: bool | None = None
        self._l3_domains: dict[int, L3Domain] = {}

    def read(self) -> HostReading:
        issues: list[Issue] = []
        nodes = tuple(self._read_node(n, issues) for n in self._node_ids(issues))
        online = read_parsed(issues, f"{self._cpu_dir}/online", parse_id_list)
        if online is not None and online != self._cpus_read_for:
            before = len(issues)
            self._socket_of_cpu = self._read_sockets(online, issues)
            self._core_of_cpu = self._read_cores(online, issues)
            self._smt_active = self._read_smt(issues)
            self._l3_domains = self._read_l3(online, issues)
            # Cache only a complete answer, so a failed read is retried next cycle.
            self._cpus_read_for = online if len(issues) == before else None
        vmstat = os.path.join(self.root, "proc/vmstat")
        balancing = read_parsed(issues, vmstat, parse_vmstat_balancing) or {}
        times = read_parsed(issues, os.path.join(self.root, "proc/stat"), parse_cpu_times)
        return HostReading(
            nodes,
            dict(self._socket_of_cpu),
            dict(self._l3_domains),
            balancing,
            issues,
            core_of_cpu=dict(self._core_of_cpu),
            smt_active=self._smt_active,
            cpu_times=times,
        )

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

    def _read_cores(self, cpus: frozenset[int], issues: list[Issue]) -> dict[int, frozenset[int]]:
        """Each CPU's core: the threads that share it (itself alone without SMT), from
        ``core_cpus_list``, or ``thread_siblings_list`` on kernels before 5.3."""
        cores: dict[int, frozenset[int]] = {}
        for cpu in sorted(cpus):
            if cpu in cores:
                continue  # a sibling's read named it
            base = f"{self._cpu_dir}/cpu{cpu}/topology"
            tried: list[Issue] = []
            path = f"{base}/core_cpus_list"
            core = read_parsed(tried, path, parse_id_list)
            if core is None and [i.reason for i in tried] == ["missing"]:
                tried, path = [], f"{base}/thread_siblings_list"
                core = read_parsed(tried, path, parse_id_list)
            issues += tried
            if core is None:
                continue
            if cpu not in core or not core <= cpus:
                issues.append(Issue("parse", path, "not the CPU's core of online CPUs"))
                continue
            cores.update(dict.fromkeys(core, core))
        return cores

    def _read_smt(self, issues: list[Issue]) -> bool | None:
        """Whether SMT is on; None on kernels that do not say (before 4.18, or built
        without SMT control): the cores say it then."""
        tried: list[Issue] = []
        active = read_parsed(tried, f"{self._cpu_dir}/smt/active", parse_smt_active)
        issues += [i for i in tried if i.reason != "missing"]
        return active

    def _read_l3(self, cpus: frozenset[int], issues: list[Issue]) -> dict[int, L3Domain]:
        """L3 caches from cpuN/cache/indexM; one CPU per cache is enough to read."""
        domains: dict[int, L3Domain] = {}
        covered: set[int] = set()
        for cpu in sorted(cpus):
            if cpu in covered:
                continue
            index = self._l3_index(cpu)
            if index is None:
                continue  # no L3 (or no cache info): nothing to monitor per cache
            cache_id = read_parsed(issues, f"{index}/id", parse_single_int)
            shared = read_parsed(issues, f"{index}/shared_cpu_list", parse_id_list)
            size = read_parsed(issues, f"{index}/size", parse_cache_size)
            if cache_id is None or shared is None or size is None:
                continue
            domains[cache_id] = L3Domain(cache_id, shared, size)
            covered |= shared
        return domains

    def _l3_index(self, cpu: int) -> str | None:
        base = f"{self._cpu_dir}/cpu{cpu}/cache"
        indexes = [n for n in subdirs(base) if n.startswith("index")]
        for index in sorted(indexes, reverse=True):  # L3 is usually the last
            if read_parsed([], f"{base}/{index}/level", parse_single_int) == 3:
                return f"{base}/{index}"
        return None


def open_source(settings: Settings) -> HostSource:
    return HostSource(settings.host_root)
