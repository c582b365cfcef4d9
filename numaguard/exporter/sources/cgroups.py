"""Pod cgroup source: finds every pod container under kubepods and reads its placement.

Handles cgroup v2 (unified) and v1 (one hierarchy per controller), the systemd and
cgroupfs drivers, and containerd, CRI-O and docker container cgroups.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from numaguard.exporter.readers import parse_id_list
from numaguard.exporter.readers.cgroup import (
    Pressure,
    container_of,
    parse_cpu_throttling,
    parse_numa_stat_v1,
    parse_numa_stat_v2,
    parse_pressure,
    pod_uid_of,
)
from numaguard.exporter.records import ContainerReading, Issue, PodMeta, PodsReading
from numaguard.exporter.sources import read_parsed, subdirs

if TYPE_CHECKING:
    from numaguard.exporter.settings import Settings

QOS_CLASSES = ("guaranteed", "burstable", "besteffort")
PRESSURE_RESOURCES = ("cpu", "memory", "io")


@dataclass(frozen=True, slots=True)
class _Layout:
    version: int
    driver: str
    # Directory of kubepods for each controller we read ("" key for cgroup v2).
    roots: dict[str, str]


# Threads left behind in reads that never returned (D state): at this many, no more pod
# is read until one returns (each costs a thread until the kernel lets it go).
MAX_STUCK_READS = 8


class CgroupSource:
    def __init__(
        self,
        host_root: str,
        page_size: int | None = None,
        max_pods: int | None = None,
        read_timeout: float = 2.0,
    ) -> None:
        self.cgroup_root = os.path.join(host_root, "sys/fs/cgroup")
        self.page_size = page_size or os.sysconf("SC_PAGE_SIZE")
        self.max_pods = max_pods  # past it, read no pod: the cardinality guard
        # a pod whose files take longer than this is given up for the cycle, and not
        # read again while the thread reading it is still stuck: only it is lost
        self.read_timeout = read_timeout
        self._stuck: dict[str, threading.Thread] = {}  # pod uid -> the thread stuck in it

    def read(self, known: Mapping[str, PodMeta] | None = None) -> PodsReading:
        """Every pod container's placement. ``known``: pod uid -> what the API server
        says of it; a pod it knows has only the containers it names read, so its sandbox
        (pause) container, which no one names, is neither read nor taken for one."""
        issues: list[Issue] = []
        layout = self._layout()
        if layout is None:
            if not os.path.isdir(self.cgroup_root):  # not "no pods": nowhere to look
                issues.append(Issue("missing", self.cgroup_root, "no cgroup hierarchy"))
            return PodsReading((), None, issues)  # no kubepods here: not a node, or no pods
        found = list(self._pods(layout, issues))
        if self.max_pods is not None and len(found) > self.max_pods:
            return PodsReading((), None, issues, over_limit=len(found))
        self._stuck = {uid: t for uid, t in self._stuck.items() if t.is_alive()}
        containers: list[ContainerReading] = []
        todo = []
        for qos, pod_uid, pod_rel in found:
            if pod_uid in self._stuck:
                issues.append(Issue("timeout", pod_rel, "a read of its files has not returned"))
            else:
                todo.append((qos, pod_uid, pod_rel))
        while todo:
            if len(self._stuck) >= MAX_STUCK_READS:
                issues.append(Issue("timeout", "", "too many reads stuck: pods left unread"))
                break
            todo = self._read_pods(layout, todo, known, containers, issues)
        shared = self._shared_pool(layout, containers, issues)
        return PodsReading(tuple(containers), shared, issues)

    def _read_pods(self, layout: _Layout, todo: list, known, containers: list, issues: list):
        """Read the pods in a thread of their own, watched: one whose files do not answer
        within read_timeout is left to its thread; the pods after it are returned, to be
        read by another."""
        # the pod being read, since when; and whether the cycle gave up waiting
        progress = {"index": 0, "since": time.monotonic(), "abandoned": False}
        done: list[tuple[list[ContainerReading], list[Issue]]] = []

        def run() -> None:
            for i, (qos, pod_uid, pod_rel) in enumerate(todo):
                if progress["abandoned"]:
                    return  # another thread reads the pods after the stuck one
                progress["index"], progress["since"] = i, time.monotonic()
                done.append(self._read_pod(layout, qos, pod_uid, pod_rel, known))

        worker = threading.Thread(target=run, name="cgroup-reads", daemon=True)
        worker.start()
        while True:
            worker.join(max(0.0, progress["since"] + self.read_timeout - time.monotonic()))
            if not worker.is_alive():
                results, rest = done, []
                break
            i = progress["index"]
            if time.monotonic() - progress["since"] >= self.read_timeout and len(done) == i:
                progress["abandoned"] = True
                results = done[:i]
                _, pod_uid, pod_rel = todo[i]
                self._stuck[pod_uid] = worker
                issues.append(Issue("timeout", pod_rel, f"no answer in {self.read_timeout:g}s"))
                rest = todo[i + 1 :]
                break
        for pod_containers, pod_issues in results:
            containers.extend(pod_containers)
            issues.extend(pod_issues)
        return rest

    def _read_pod(self, layout: _Layout, qos: str, pod_uid: str, pod_rel: str, known):
        containers: list[ContainerReading] = []
        issues: list[Issue] = []
        meta = known.get(pod_uid) if known else None
        for runtime, container_id, rel in self._containers(layout, pod_rel, issues):
            # a pod the API server knows: only the containers it names (none, until the
            # kubelet has posted their ids: its sandbox would be taken for one)
            if meta is not None and container_id not in meta.containers:
                continue
            reading = self._read_container(layout, rel, issues)
            if reading is not None:
                containers.append(ContainerReading(pod_uid, container_id, runtime, qos, *reading))
        return containers, issues

    # -- discovery ---------------------------------------------------------------

    def _layout(self) -> _Layout | None:
        root = self.cgroup_root
        if os.path.exists(f"{root}/cgroup.controllers"):
            driver = _driver_at(root)
            return _Layout(2, driver, {"": f"{root}/{_KUBEPODS[driver]}"}) if driver else None
        controllers = {
            "cpuset": _v1_controller_dir(root, "cpuset"),
            "memory": _v1_controller_dir(root, "memory"),
            "cpu": _v1_controller_dir(root, "cpu"),
        }
        base = controllers["cpuset"] or controllers["memory"]
        driver = _driver_at(base) if base else ""
        if not driver:
            return None
        roots = {k: f"{d}/{_KUBEPODS[driver]}" for k, d in controllers.items() if d}
        return _Layout(1, driver, roots)

    def _discovery_root(self, layout: _Layout) -> str:
        return layout.roots.get("") or layout.roots.get("cpuset") or layout.roots["memory"]

    def _pods(self, layout: _Layout, issues: list[Issue]):
        """Yield (qos, pod uid, pod dir relative to kubepods)."""
        root = self._discovery_root(layout)
        for qos in QOS_CLASSES:
            qos_rel = _QOS_DIR[layout.driver][qos]
            for name in subdirs(os.path.join(root, qos_rel), issues, required=qos_rel == ""):
                uid = pod_uid_of(name)
                if uid:
                    yield qos, uid, os.path.join(qos_rel, name)

    def _containers(self, layout: _Layout, pod_rel: str, issues: list[Issue]):
        """Yield (runtime, container id, container dir relative to kubepods)."""
        for name in subdirs(os.path.join(self._discovery_root(layout), pod_rel), issues):
            container = container_of(name)
            if container:
                yield *container, f"{pod_rel}/{name}"

    # -- reading -----------------------------------------------------------------

    def _read_container(self, layout: _Layout, rel: str, issues: list[Issue]):
        mine: list[Issue] = []
        pressure: dict[str, Pressure] = {}
        if layout.version == 2:
            d = f"{layout.roots['']}/{rel}"
            cpus = read_parsed(mine, f"{d}/cpuset.cpus.effective", parse_id_list)
            memory = read_parsed(mine, f"{d}/memory.numa_stat", parse_numa_stat_v2)
            throttling = read_parsed(mine, f"{d}/cpu.stat", parse_cpu_throttling)
            for resource in PRESSURE_RESOURCES:
                psi: list[Issue] = []
                value = read_parsed(psi, f"{d}/{resource}.pressure", parse_pressure)
                if value is not None:
                    pressure[resource] = value
                # A kernel without PSI has no pressure files: that is not an error.
                mine.extend(i for i in psi if i.reason != "missing")
            container_dir = d
            tasks_file = f"{d}/cgroup.threads"
        else:
            # v1: a controller the host does not mount leaves its values unknown
            def v1(controller: str, name: str, reader, *args):
                root = layout.roots.get(controller)
                return read_parsed(mine, f"{root}/{rel}/{name}", reader, *args) if root else None

            cpus = v1("cpuset", "cpuset.effective_cpus", parse_id_list)
            memory = v1("memory", "memory.numa_stat", parse_numa_stat_v1, self.page_size)
            throttling = v1("cpu", "cpu.stat", parse_cpu_throttling)
            container_dir = f"{self._discovery_root(layout)}/{rel}"
            tasks_file = f"{container_dir}/tasks"
        if mine and not os.path.isdir(container_dir):
            return None  # the container went away while we read it: not an error
        issues.extend(mine)
        return cpus, memory, throttling, pressure, tasks_file

    def _shared_pool(
        self, layout: _Layout, containers: list[ContainerReading], issues: list[Issue]
    ) -> frozenset[int] | None:
        """CPUs of the shared pool: what burstable and best-effort containers run on.

        With no such container, the cpuset of the burstable/besteffort QoS cgroup.
        """
        shared = [c.cpus for c in containers if c.qos_class != "guaranteed" and c.cpus]
        if shared:
            return frozenset().union(*shared)
        if layout.version == 2:
            name = "cpuset.cpus.effective"
            cpuset_root = layout.roots[""]
        else:
            name = "cpuset.effective_cpus"
            cpuset_root = layout.roots.get("cpuset")
            if cpuset_root is None:
                return None
        for qos in ("burstable", "besteffort"):
            path = f"{cpuset_root}/{_QOS_DIR[layout.driver][qos]}/{name}"
            if os.path.exists(path):
                return read_parsed(issues, path, parse_id_list)
        return None


_KUBEPODS = {"systemd": "kubepods.slice", "cgroupfs": "kubepods"}
_QOS_DIR = {
    "systemd": {
        "guaranteed": "",
        "burstable": "kubepods-burstable.slice",
        "besteffort": "kubepods-besteffort.slice",
    },
    "cgroupfs": {"guaranteed": "", "burstable": "burstable", "besteffort": "besteffort"},
}


def _driver_at(hierarchy: str) -> str:
    for driver, name in _KUBEPODS.items():
        if os.path.isdir(os.path.join(hierarchy, name)):
            return driver
    return ""


def _v1_controller_dir(root: str, controller: str) -> str | None:
    """v1 mounts a controller alone or co-mounted (``cpu,cpuacct``); find its directory."""
    for name in subdirs(root):
        if controller in name.split(","):
            return os.path.join(root, name)
    return None


def open_source(settings: Settings) -> CgroupSource:
    return CgroupSource(settings.host_root, max_pods=settings.max_pods)
