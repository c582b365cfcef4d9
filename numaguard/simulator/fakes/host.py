"""Fake host roots: from a small description of a node, write the sysfs, procfs and
cgroup files the exporter reads below ``--host-root``, in the kernel's own formats.

Change the description (counters, pods) and call ``write`` again to move the host on
to its next state; pods no longer described are removed from the cgroup tree.
"""

from __future__ import annotations

import contextvars
import hashlib
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from numaguard.exporter.readers import format_id_list, parse_id_list
from numaguard.exporter.records import PodMeta

GIB = 1 << 30
MIB = 1 << 20
QOS_CLASSES = ("guaranteed", "burstable", "besteffort")
SANDBOX = "POD"  # what the kubelet calls a pod's sandbox container
KUBELET_CONFIG = "var/lib/kubelet/config.yaml"  # under the root, where kubeadm puts it


@dataclass
class FakeContainer:
    name: str
    cpus: str  # cpuset, kernel list form ("0-3,8")
    memory_by_node: dict[int, int] = field(default_factory=dict)  # bytes
    mems: str | None = None  # cpuset.mems; default: every node
    throttling: tuple[int, int, float] = (0, 0, 0.0)  # periods, throttled, seconds
    # resource (cpu/memory/io) -> (some seconds, full seconds)
    pressure: dict[str, tuple[float, float]] = field(default_factory=dict)
    id: str = ""  # 64 hex digits; derived from pod uid and name when empty
    tids: list[int] | None = None  # its threads; derived from its id when None
    # What the kubelet gave it (served by simulator.fakes.podresources): exclusive CPUs (its cpus),
    # device plugin devices (resource -> device ids), DRA claim devices
    exclusive_cpus: bool = False
    # the NUMA nodes the Memory Manager (Static) put its memory on; empty: not pinned
    memory_pinned: tuple[int, ...] = ()
    devices: dict[str, list[str]] = field(default_factory=dict)
    claims: list[FakeClaim] = field(default_factory=list)
    # its main process's start time (clock ticks since boot): another is another process
    started: int = 4242
    # a mapping of that many bytes reserved (MAP_NORESERVE) and untouched but for its last
    # page, on that NUMA node: numa_maps counts one page, the scan finds it at the end
    reserved: tuple[int, int] | None = None


@dataclass
class FakeClaim:
    """A device a container got through a DRA ResourceClaim."""

    claim: str  # name; in the pod's namespace
    device: str  # gpu-0
    driver: str = "gpu.nvidia.com"
    pool: str = "node-0"


@dataclass
class FakePod:
    name: str
    uid: str
    qos_class: str  # guaranteed | burstable | besteffort
    containers: list[FakeContainer]
    namespace: str = "default"


@dataclass
class FakeNumaNode:
    cpus: str
    socket: int
    memory_total_bytes: int = 64 * GIB
    memory_free_bytes: int = 32 * GIB
    # free pages of its hugetlb pools, by page size in bytes (hugepages-<kB>kB)
    free_hugepages: dict[int, int] = field(default_factory=dict)
    numastat: dict[str, int] = field(
        default_factory=lambda: {
            "numa_hit": 0,
            "numa_miss": 0,
            "numa_foreign": 0,
            "interleave_hit": 0,
            "local_node": 0,
            "other_node": 0,
        }
    )


@dataclass
class FakeHost:
    nodes: list[FakeNumaNode]
    pods: list[FakePod] = field(default_factory=list)
    cgroup_version: int = 2
    cgroup_driver: str = "systemd"  # systemd | cgroupfs
    runtime: str = "containerd"  # containerd | cri-o | docker
    distances: list[list[int]] | None = None  # default: 10 local, 21 elsewhere
    # NUMA-balancing counters of /proc/vmstat; None: a kernel without them
    balancing: dict[str, int] | None = field(
        default_factory=lambda: {
            "numa_hint_faults": 0,
            "numa_hint_faults_local": 0,
            "numa_pages_migrated": 0,
        }
    )
    psi: bool = True  # cgroup v2 only
    # each pod's sandbox (pause) container gets a cgroup beside its containers, as the
    # CRI makes one on a real node; the kubelet and the API server never name it
    sandboxes: bool = False
    page_size: int = 4096
    # each main process's /proc/<pid>/maps and numa_maps (what memory_mover reads)
    process_maps: bool = False
    # L3 caches as (CPU list, size); None: one per socket over all the socket's CPUs
    l3: list[tuple[str, int]] | None = None
    l3_size_bytes: int = 64 * MIB  # size of the default ones
    # PCI devices (sysfs address, 0000:18:00.0) -> NUMA node (-1: the platform does not say)
    pci_devices: dict[str, int] = field(default_factory=dict)
    # PCI devices (sysfs address) -> the root complex and bridges above it, top first
    # ("pci0000:00", "0000:01:00.0", ...): its /sys/bus/pci/devices link resolves
    # through them, as the kernel's does; without one, straight under a root complex
    # of its own bus
    pci_paths: dict[str, tuple[str, ...]] = field(default_factory=dict)
    # threads a core (SMT): each NUMA node's CPUs in that many runs, core k the k-th of
    # each, as Linux numbers x86 threads (0 and 56 share a core of a 112-CPU node)
    threads_per_core: int = 1
    # or numbered as QEMU numbers them: a core's threads next to each other (0 and 1)
    threads_adjacent: bool = False
    # the kubelet's configuration file (/var/lib/kubelet/config.yaml; None: none there):
    # its reservedSystemCPUs are never handed out (simulator.fakes.podresources)
    kubelet_config: dict | None = field(
        default_factory=lambda: {"kind": "KubeletConfiguration", "cpuManagerPolicy": "static"}
    )
    # /proc/stat, by CPU: (busy, idle) ticks since boot
    cpu_ticks: dict[int, tuple[int, int]] = field(default_factory=dict)
    _tids: dict[str, list[int]] = field(default_factory=dict, repr=False, compare=False)

    @property
    def all_cpus(self) -> frozenset[int]:
        return frozenset().union(*(parse_id_list(n.cpus) for n in self.nodes))

    @property
    def runtime_scheme(self) -> str:
        """The prefix of containerID in pod status: ``containerd://<id>``."""
        return self.runtime

    def container_id(self, pod: FakePod, container: FakeContainer) -> str:
        return container.id or hashlib.sha256(f"{pod.uid}/{container.name}".encode()).hexdigest()

    def tids(self, pod: FakePod, container: FakeContainer) -> list[int]:
        """The container's thread ids: three, unique on the host, stable per container."""
        if container.tids is not None:
            return container.tids
        key = self.container_id(pod, container)
        if key not in self._tids:
            first = 1000 + int(key[:6], 16) % 3_000_000 // 4 * 4
            taken = {t for ids in self._tids.values() for t in ids}
            while first in taken:
                first += 4
            self._tids[key] = [first, first + 1, first + 2]
        return self._tids[key]

    def pid(self, pod: FakePod, container: FakeContainer) -> int:
        """The container's main process: its first thread."""
        return self.tids(pod, container)[0]

    @property
    def reserved_cpus(self) -> frozenset[int]:
        return parse_id_list((self.kubelet_config or {}).get("reservedSystemCPUs", ""))

    def cores(self) -> dict[int, frozenset[int]]:
        """Each CPU's core: the CPUs that share it."""
        out: dict[int, frozenset[int]] = {}
        for node in self.nodes:
            cpus = sorted(parse_id_list(node.cpus))
            per, run = self.threads_per_core, len(cpus) // self.threads_per_core
            for k in range(run):
                if self.threads_adjacent:
                    core = frozenset(cpus[k * per : (k + 1) * per])
                else:
                    core = frozenset(cpus[k + t * run] for t in range(per))
                out.update(dict.fromkeys(core, core))
        return out

    def l3_caches(self) -> list[tuple[frozenset[int], int]]:
        if self.l3 is not None:
            return [(parse_id_list(cpus), size) for cpus, size in self.l3]
        sockets: dict[int, set[int]] = {}
        for node in self.nodes:
            sockets.setdefault(node.socket, set()).update(parse_id_list(node.cpus))
        return [(frozenset(cpus), self.l3_size_bytes) for _, cpus in sorted(sockets.items())]

    def pod(self, name: str) -> FakePod:
        return next(p for p in self.pods if p.name == name)


def pod_metadata(host: FakeHost) -> dict[str, PodMeta]:
    """What the API server would tell the exporter about the fake host's pods."""
    out = {}
    for p in host.pods:
        claims: dict[str, tuple[str, ...]] = {}
        for c in p.containers:
            for claim in c.claims:
                claims[claim.claim] = (*claims.get(claim.claim, ()), c.name)
        containers = {host.container_id(p, c): c.name for c in p.containers}
        out[p.uid] = PodMeta(p.namespace, p.name, containers, claims)
    return out


class FakeHostRoot:
    """A directory that looks like a node's ``/`` to the exporter."""

    def __init__(self, root: str | os.PathLike, host: FakeHost) -> None:
        self.root = Path(root)
        self.host = host

    def write(self) -> FakeHostRoot:
        fresh = _FRESH.set(set() if not self.root.exists() else None)
        try:
            self._write()
        finally:
            _FRESH.reset(fresh)
        return self

    def _write(self) -> None:
        config = self.root / KUBELET_CONFIG
        if self.host.kubelet_config is None:
            config.unlink(missing_ok=True)
        else:
            _put(config, yaml.safe_dump(self.host.kubelet_config))
        self._write_nodes()
        self._write_cpus()
        self._write_vmstat()
        self._write_cgroups()
        self._write_pci()
        self._write_procs()

    # -- host ----------------------------------------------------------------------

    def _write_nodes(self) -> None:
        h = self.host
        base = self.root / "sys/devices/system/node"
        ids = format_id_list(frozenset(range(len(h.nodes))))
        _put(base / "online", ids)
        _put(base / "possible", ids)
        for i, n in enumerate(h.nodes):
            d = base / f"node{i}"
            _put(d / "cpulist", n.cpus)
            row = (
                h.distances[i]
                if h.distances
                else [10 if j == i else 21 for j in range(len(h.nodes))]
            )
            _put(d / "distance", " ".join(map(str, row)))
            _put(d / "meminfo", _node_meminfo(i, n))
            _put(d / "numastat", "".join(f"{k} {v}\n" for k, v in n.numastat.items()))
            for size, free in n.free_hugepages.items():
                _put(d / f"hugepages/hugepages-{size // 1024}kB/free_hugepages", str(free))

    def _write_pci(self) -> None:
        for address, node in self.host.pci_devices.items():
            path = self.host.pci_paths.get(address) or (f"pci{address[:7]}",)
            device = Path("devices", *path, address)
            _put(self.root / "sys" / device / "numa_node", str(node))
            link = self.root / f"sys/bus/pci/devices/{address}"
            target = Path("../../..", device)
            if not link.is_symlink() or Path(os.readlink(link)) != target:
                link.parent.mkdir(parents=True, exist_ok=True)
                if link.is_symlink():
                    link.unlink()
                elif link.exists():
                    shutil.rmtree(link)
                link.symlink_to(target)

    def _write_procs(self) -> None:
        """``/proc/<pid>/cgroup``, ``maps`` and ``numa_maps`` of each container's main
        process; exited ones removed."""
        h = self.host
        kubepods = "kubepods.slice" if h.cgroup_driver == "systemd" else "kubepods"
        wanted = set()
        for pod in h.pods:
            for ctr in pod.containers:
                qos = self._qos_dir(pod.qos_class)
                path = "/" + "/".join(
                    p
                    for p in (kubepods, qos, self._pod_dir(pod), self._container_dir(pod, ctr))
                    if p
                )
                if h.cgroup_version == 2:
                    text = f"0::{path}\n"
                else:
                    text = "".join(
                        f"{i}:{c}:{path}\n"
                        for i, c in enumerate(("cpuset", "memory", "cpu,cpuacct"), 1)
                    )
                pid = h.pid(pod, ctr)
                wanted.add(str(pid))
                _put(self.root / f"proc/{pid}/cgroup", text)
                if h.process_maps:
                    maps, numa_maps = process_mappings(ctr, h.page_size)
                    _put(self.root / f"proc/{pid}/maps", maps)
                    _put(self.root / f"proc/{pid}/numa_maps", numa_maps)
                    _put(self.root / f"proc/{pid}/stat", process_stat(pid, ctr.started))
        for d in _dirs(self.root / "proc"):
            if d.name.isdigit() and d.name not in wanted:
                shutil.rmtree(d)

    def _write_cpus(self) -> None:
        base = self.root / "sys/devices/system/cpu"
        cpus = self.host.all_cpus
        _put(base / "online", format_id_list(cpus))
        _put(base / "possible", format_id_list(cpus))
        for node in self.host.nodes:
            for cpu in parse_id_list(node.cpus):
                _put(base / f"cpu{cpu}/topology/physical_package_id", str(node.socket))
        for cpu, core in self.host.cores().items():
            for name in ("core_cpus_list", "thread_siblings_list"):
                _put(base / f"cpu{cpu}/topology/{name}", format_id_list(core))
        smt = self.host.threads_per_core > 1
        _put(base / "smt/active", "1" if smt else "0")
        _put(base / "smt/control", "on" if smt else "notsupported")
        # user nice system idle iowait irq softirq steal guest guest_nice
        lines = [
            f"cpu{cpu} {busy} 0 0 {idle} 0 0 0 0 0 0"
            for cpu in sorted(cpus)
            for busy, idle in [self.host.cpu_ticks.get(cpu, (0, 0))]
        ]
        total_busy = sum(self.host.cpu_ticks.get(c, (0, 0))[0] for c in cpus)
        total_idle = sum(self.host.cpu_ticks.get(c, (0, 0))[1] for c in cpus)
        head = f"cpu  {total_busy} 0 0 {total_idle} 0 0 0 0 0 0"
        _put(self.root / "proc/stat", "\n".join([head, *lines, "intr 0", "ctxt 0"]) + "\n")
        for cache_id, (cpus, size) in enumerate(self.host.l3_caches()):
            for cpu in cpus:
                # a private L2 (which the exporter must pass over) and the shared L3
                for index, level, size_k, cache, shared in (
                    (2, 2, 2048, cpu, str(cpu)),
                    (3, 3, size // 1024, cache_id, format_id_list(cpus)),
                ):
                    d = base / f"cpu{cpu}/cache/index{index}"
                    _put(d / "level", str(level))
                    _put(d / "type", "Unified")
                    _put(d / "size", f"{size_k}K")
                    _put(d / "id", str(cache))
                    _put(d / "shared_cpu_list", shared)

    def _write_vmstat(self) -> None:
        lines = ["nr_free_pages 123456", "nr_zone_inactive_anon 4242"]
        total = {k: sum(n.numastat[k] for n in self.host.nodes) for k in ("numa_hit", "numa_miss")}
        lines += [f"numa_hit {total['numa_hit']}", f"numa_miss {total['numa_miss']}"]
        lines += [f"{k} {v}" for k, v in (self.host.balancing or {}).items()]
        lines += ["pgpgin 1000", "pgpgout 2000"]
        _put(self.root / "proc/vmstat", "\n".join(lines))

    # -- cgroups -------------------------------------------------------------------

    def _write_cgroups(self) -> None:
        h = self.host
        cg = self.root / "sys/fs/cgroup"
        hierarchies = self._hierarchies()
        if h.cgroup_version == 2:
            _put(cg / "cgroup.controllers", "cpuset cpu io memory hugetlb pids rdma misc")
        else:
            for d in hierarchies.values():
                d.mkdir(parents=True, exist_ok=True)
            link = cg / "cpu"
            if not link.exists():
                link.symlink_to("cpu,cpuacct")
        all_cpus = format_id_list(h.all_cpus)
        wanted: set[Path] = set()
        for controller, hierarchy in hierarchies.items():
            kubepods = hierarchy / self._kubepods()
            for qos in QOS_CLASSES:
                qos_dir = kubepods / self._qos_dir(qos)
                if controller in ("", "cpuset"):
                    self._cpuset(qos_dir, controller, all_cpus, self._all_mems())
            for pod in h.pods:
                pod_dir = kubepods / self._qos_dir(pod.qos_class) / self._pod_dir(pod)
                wanted.add(pod_dir)
                for ctr in [*pod.containers, *self._sandbox(pod)]:
                    d = pod_dir / self._container_dir(pod, ctr)
                    wanted.add(d)
                    self._container_files(controller, d, pod, ctr)
            self._prune(kubepods, wanted)

    def write_container(self, pod: FakePod, ctr: FakeContainer) -> None:
        """Rewrite one container's cgroup files alone, as a kernel's counters move all the
        time: a test ticking one counter need not write the whole host each tick."""
        for controller, hierarchy in self._hierarchies().items():
            d = hierarchy / self._kubepods() / self._qos_dir(pod.qos_class) / self._pod_dir(pod)
            self._container_files(controller, d / self._container_dir(pod, ctr), pod, ctr)

    def _hierarchies(self) -> dict[str, Path]:
        """Each cgroup hierarchy's folder by its controller ("" for v2's one)."""
        cg = self.root / "sys/fs/cgroup"
        if self.host.cgroup_version == 2:
            return {"": cg}
        # v1: one hierarchy per controller; cpu and cpuacct share one, as on most hosts
        return {c: cg / c for c in ("cpuset", "memory", "cpu,cpuacct")}

    def _kubepods(self) -> str:
        return "kubepods.slice" if self.host.cgroup_driver == "systemd" else "kubepods"

    def _sandbox(self, pod: FakePod) -> list[FakeContainer]:
        """The pod's pause container, when the host has sandboxes: on the shared pool,
        a few hundred KiB of memory."""
        if not self.host.sandboxes:
            return []
        shared = format_id_list(self.host.all_cpus)
        return [FakeContainer(SANDBOX, shared, {0: 256 << 10})]

    def _container_files(self, controller: str, d: Path, pod: FakePod, ctr: FakeContainer) -> None:
        h = self.host
        mems = ctr.mems if ctr.mems is not None else self._all_mems()
        if controller in ("", "cpuset"):
            self._cpuset(d, controller, ctr.cpus, mems)
        tids = self.host.tids(pod, ctr)
        _put(d / ("cgroup.threads" if controller == "" else "tasks"), "\n".join(map(str, tids)))
        _put(d / "cgroup.procs", str(tids[0]))  # its one process, the main thread's
        if controller in ("", "memory"):
            _put(d / "memory.numa_stat", self._numa_stat(ctr))
        if controller in ("", "cpu,cpuacct"):
            periods, throttled, seconds = ctr.throttling
            if h.cgroup_version == 2:
                stat = (
                    f"usage_usec 1000000\nuser_usec 600000\nsystem_usec 400000\n"
                    f"nr_periods {periods}\nnr_throttled {throttled}\n"
                    f"throttled_usec {round(seconds * 1e6)}\nnr_bursts 0\nburst_usec 0\n"
                )
            else:
                stat = (
                    f"nr_periods {periods}\nnr_throttled {throttled}\n"
                    f"throttled_time {round(seconds * 1e9)}\nnr_bursts 0\nburst_time 0\n"
                )
            _put(d / "cpu.stat", stat)
        if controller == "" and h.psi:
            for resource in ("cpu", "memory", "io"):
                some, full = ctr.pressure.get(resource, (0.0, 0.0))
                _put(
                    d / f"{resource}.pressure",
                    f"some avg10=0.00 avg60=0.00 avg300=0.00 total={round(some * 1e6)}\n"
                    f"full avg10=0.00 avg60=0.00 avg300=0.00 total={round(full * 1e6)}\n",
                )

    def _cpuset(self, d: Path, controller: str, cpus: str, mems: str) -> None:
        if controller == "":
            _put(d / "cpuset.cpus.effective", cpus)
            _put(d / "cpuset.mems.effective", mems)
        else:
            _put(d / "cpuset.cpus", cpus)
            _put(d / "cpuset.effective_cpus", cpus)
            _put(d / "cpuset.mems", mems)
            _put(d / "cpuset.effective_mems", mems)

    def _numa_stat(self, ctr: FakeContainer) -> str:
        nodes = range(len(self.host.nodes))
        size = {n: ctr.memory_by_node.get(n, 0) for n in nodes}
        if self.host.cgroup_version == 2:
            # bytes; anon + file is the container's memory, the rest is detail
            file = {n: size[n] // 4 for n in nodes}
            anon = {n: size[n] - file[n] for n in nodes}
            zero = dict.fromkeys(nodes, 0)
            rows = {
                "anon": anon,
                "file": file,
                "kernel_stack": dict.fromkeys(nodes, 16384),
                "pagetables": dict.fromkeys(nodes, 8192),
                "sec_pagetables": zero,
                "shmem": zero,
                "file_mapped": file,
                "file_dirty": zero,
                "file_writeback": zero,
                "swapcached": zero,
                "anon_thp": zero,
                "file_thp": zero,
                "shmem_thp": zero,
                "unevictable": zero,
                "slab_reclaimable": dict.fromkeys(nodes, 4096),
                "slab_unreclaimable": dict.fromkeys(nodes, 4096),
                "workingset_refault_anon": zero,
                "workingset_refault_file": zero,
                "workingset_activate_anon": zero,
                "workingset_activate_file": zero,
                "workingset_restore_anon": zero,
                "workingset_restore_file": zero,
                "workingset_nodereclaim": zero,
            }
            return "".join(
                f"{k} " + " ".join(f"N{n}={v[n]}" for n in nodes) + "\n" for k, v in rows.items()
            )
        pages = {}
        for n in nodes:
            if size[n] % self.host.page_size:
                raise ValueError(f"{ctr.name}: v1 memory must be whole pages")
            pages[n] = size[n] // self.host.page_size
        file = {n: pages[n] // 4 for n in nodes}
        anon = {n: pages[n] - file[n] for n in nodes}
        zero = dict.fromkeys(nodes, 0)
        lines = []
        for prefix in ("", "hierarchical_"):
            for k, v in (("total", pages), ("file", file), ("anon", anon), ("unevictable", zero)):
                lines.append(
                    f"{prefix}{k}={sum(v.values())} " + " ".join(f"N{n}={v[n]}" for n in nodes)
                )
        return "\n".join(lines) + "\n"

    def _all_mems(self) -> str:
        return format_id_list(frozenset(range(len(self.host.nodes))))

    def pod_cgroup(self, pod: FakePod) -> Path:
        """The pod's cgroup folder (v2), as the kubelet names it."""
        parts = (self._kubepods(), self._qos_dir(pod.qos_class), self._pod_dir(pod))
        return self.root.joinpath("sys/fs/cgroup", *(p for p in parts if p))

    def _qos_dir(self, qos: str) -> str:
        if qos == "guaranteed":
            return ""
        return f"kubepods-{qos}.slice" if self.host.cgroup_driver == "systemd" else qos

    def _pod_dir(self, pod: FakePod) -> str:
        if self.host.cgroup_driver == "cgroupfs":
            return f"pod{pod.uid}"
        qos = "" if pod.qos_class == "guaranteed" else f"-{pod.qos_class}"
        return f"kubepods{qos}-pod{pod.uid.replace('-', '_')}.slice"

    def _container_dir(self, pod: FakePod, ctr: FakeContainer) -> str:
        cid = self.host.container_id(pod, ctr)
        prefix = {"containerd": "cri-containerd", "cri-o": "crio", "docker": "docker"}[
            self.host.runtime
        ]
        if self.host.cgroup_driver == "systemd":
            return f"{prefix}-{cid}.scope"
        return f"crio-{cid}" if self.host.runtime == "cri-o" else cid

    def _prune(self, kubepods: Path, wanted: set[Path]) -> None:
        """Remove pod and container dirs that the description no longer has."""
        for qos in QOS_CLASSES:
            qos_dir = kubepods / self._qos_dir(qos)
            for pod_dir in _dirs(qos_dir):
                if pod_dir.name.startswith(("kubepods", "pod")) and pod_dir.name not in (
                    "kubepods-burstable.slice",
                    "kubepods-besteffort.slice",
                ):
                    if pod_dir not in wanted:
                        shutil.rmtree(pod_dir)
                        continue
                    for ctr_dir in _dirs(pod_dir):
                        if ctr_dir not in wanted:
                            shutil.rmtree(ctr_dir)


def _node_meminfo(i: int, n: FakeNumaNode) -> str:
    kb = {
        "MemTotal": n.memory_total_bytes // 1024,
        "MemFree": n.memory_free_bytes // 1024,
        "MemUsed": (n.memory_total_bytes - n.memory_free_bytes) // 1024,
        "SwapCached": 0,
        "Active": 1024,
        "Inactive": 2048,
        "Dirty": 0,
        "FilePages": 4096,
        "AnonPages": 4096,
        "Shmem": 0,
        "KernelStack": 128,
        "PageTables": 256,
    }
    lines = [f"Node {i} {k + ':':<15} {v:>10} kB" for k, v in kb.items()]
    lines += [f"Node {i} HugePages_Total:     0", f"Node {i} HugePages_Free:      0"]
    return "\n".join(lines) + "\n"


# Each container's main process maps its memory (memory_by_node) as one anonymous
# mapping at HEAP, and two pages of the C library at LIBC, on node 0 and mapped by every
# process: as move_pages(2) without MPOL_MF_MOVE_ALL, those never move.
HEAP = 0x7F0000100000  # 1 MiB past a 2 MiB boundary, as a heap often starts


def heap_at(page_size: int) -> int:
    """Where the heap of pages of that size starts: HEAP, or the next page boundary (a
    mapping of huge pages is aligned to their size)."""
    return -(-HEAP // page_size) * page_size


LIBC = 0x7FF000000000
RESERVED = 0x7E0000000000  # FakeContainer.reserved's mapping
BASE_PAGE = 4096  # pages above this size are hugetlb's (a THP's numa_maps says 4 kB)


def process_stat(pid: int, started: int) -> str:
    """/proc/<pid>/stat: its start time (clock ticks since boot) is the 22nd field."""
    return f"{pid} (main) S 1 {pid} {pid} 0 -1 4194560" + " 0" * 12 + f" {started}" + " 0" * 30


def process_mappings(ctr: FakeContainer, page_size: int) -> tuple[str, str]:
    """The container's main process's /proc/<pid>/maps and numa_maps."""
    pages = {n: b // page_size for n, b in sorted(ctr.memory_by_node.items()) if b >= page_size}
    total = sum(pages.values())
    kb = page_size // 1024
    maps = [f"{LIBC:x}-{LIBC + 2 * page_size:x} r-xp 00000000 fe:00 4242 /usr/lib/libc.so.6"]
    numa_maps = [f"{LIBC:x} default file=/usr/lib/libc.so.6 mapped=2 N0=2 kernelpagesize_kB={kb}"]
    if total:
        heap = heap_at(page_size)
        maps.insert(0, f"{heap:x}-{heap + total * page_size:x} rw-p 00000000 00:00 0")
        nodes = " ".join(f"N{n}={p}" for n, p in pages.items())
        numa_maps.insert(
            0, f"{heap:x} default anon={total} dirty={total} {nodes} kernelpagesize_kB={kb}"
        )
    if ctr.reserved is not None:
        size, node = ctr.reserved
        maps.insert(0, f"{RESERVED:x}-{RESERVED + size:x} rw-p 00000000 00:00 0")
        numa_maps.insert(0, f"{RESERVED:x} default anon=1 dirty=1 N{node}=1 kernelpagesize_kB={kb}")
    return "\n".join(maps), "\n".join(numa_maps)


# While a root is first written (no reader can know it yet): the folders made so far. A
# node of 20,000 pods is 200,000 files; written plainly, in a third of the time.
_FRESH: contextvars.ContextVar[set[Path] | None] = contextvars.ContextVar("fresh", default=None)


def _put(path: Path, text: str) -> None:
    """Write a file as the kernel would show it: unchanged content is not rewritten, and a
    reader never sees a half-written one."""
    if not text.endswith("\n"):
        text += "\n"
    made = _FRESH.get()
    if made is not None:
        if path.parent not in made:
            path.parent.mkdir(parents=True, exist_ok=True)
            made.add(path.parent)
        path.write_text(text)
        return
    try:
        if path.read_text() == text:
            return
    except OSError:
        path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def _dirs(path: Path) -> list[Path]:
    try:
        return [p for p in path.iterdir() if p.is_dir() and not p.is_symlink()]
    except OSError:
        return []
