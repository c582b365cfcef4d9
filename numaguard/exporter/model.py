"""The model: one NodeSnapshot per collection cycle, with every derived signal computed
once, here. Pure: readings (and the previous snapshot, for rates) in, snapshot out.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace

from numaguard.exporter.readers.cgroup import CpuThrottling, Pressure
from numaguard.exporter.readers.dra import DraView, device_plugin_id
from numaguard.exporter.readers.numa import NodeMeminfo
from numaguard.exporter.readers.nvml import mig_resource
from numaguard.exporter.readers.podresources import ContainerResources
from numaguard.exporter.records import (
    ContainerReading,
    GpuReading,
    GpuRecord,
    HostReading,
    KubeletReading,
    L3Domain,
    PodMeta,
    PodsReading,
    ResctrlReading,
    SliceRecord,
)
from numaguard.exporter.traffic import ResctrlState, build_resctrl

MIB = 1 << 20


@dataclass(frozen=True, slots=True)
class Thresholds:
    """When a pod's memory counts as remote (verdict ``memory_remote``), and when a GPU is
    starved by its host: low utilization while one of the host signals is high."""

    memory_remote_ratio: float = 0.3
    memory_remote_min_bytes: int = 64 * MIB
    gpu_starved_utilization: float = 0.3  # SM (else graphics) activity below this is low
    starved_cpu_throttled: float = 0.1  # share of CFS periods throttled
    starved_cpu_pressure: float = 0.2  # share of time some task stalled on CPU
    starved_memory_pressure: float = 0.1  # share of time some task stalled on memory
    starved_remote_traffic: float = 0.5  # share of memory traffic to remote nodes


@dataclass(frozen=True, slots=True)
class Topology:
    nodes: tuple[int, ...]
    node_of_cpu: Mapping[int, int]
    socket_of_cpu: Mapping[int, int]
    # distance[a][b]; rows whose length does not match the node list are left out
    distance: Mapping[int, Mapping[int, int]]
    l3_domains: Mapping[int, L3Domain]


@dataclass(frozen=True, slots=True)
class NumaNodeState:
    id: int
    cpus: frozenset[int] | None
    cpus_by_socket: Mapping[int, int]  # socket -> number of this node's CPUs on it
    meminfo: NodeMeminfo | None
    numastat: Mapping[str, int] | None
    remote_alloc_ratio: float | None  # over the last interval


@dataclass(slots=True)
class ContainerState:
    container_id: str
    name: str  # "" without API metadata
    runtime: str
    qos_class: str
    exclusive_cpus: bool
    cpus: frozenset[int] | None
    # Per NUMA node, only the nodes that hold some; None when unknown.
    cpus_by_node: Mapping[int, int] | None
    memory_by_node: Mapping[int, int] | None
    memory_remote_bytes: int | None  # on NUMA nodes that hold none of its CPUs
    memory_remote_ratio: float | None
    numa_nodes_spanned: int | None
    throttling: CpuThrottling | None
    pressure: Mapping[str, Pressure]
    # CPU verdict: exclusive CPUs on more than one NUMA node; None when unknown
    cpu_span: bool | None


@dataclass(slots=True)
class PodState:
    uid: str
    namespace: str
    name: str
    containers: tuple[ContainerState, ...]
    cpus_by_node: Mapping[int, int] | None
    memory_by_node: Mapping[int, int] | None
    memory_remote_ratio: float | None
    numa_nodes_spanned: int | None
    # reason -> verdict, only for reasons that could be decided on this cycle's data
    cross_numa: Mapping[str, bool]


@dataclass(slots=True)
class DeviceUse:
    """A pod container on a GPU or MIG slice."""

    gpu: GpuRecord
    mig: SliceRecord | None
    resource: str  # the extended resource it stands for: nvidia.com/gpu, nvidia.com/mig-1g.10gb
    pod_uid: str
    container_id: str
    namespace: str  # names are "" without API metadata
    pod: str
    container: str
    source: str  # kubelet (PodResources) | claim (a DRA ResourceClaim) | process (NVML's)
    pod_state: PodState | None = None  # the pod as this cycle sees it, when its cgroup is


# Why a GPU may be starved by its host; see Starvation.
STARVED_REASONS = (
    "device_remote",
    "memory_remote",
    "cpu_throttled",
    "cpu_pressure",
    "memory_pressure",
    "remote_traffic",
)


@dataclass(slots=True)
class Starvation:
    """A device with work on it, how busy it was over the last interval, and for each
    host-side reason that could be decided whether it starves it: low utilization while
    that host signal is high."""

    use: DeviceUse
    utilization: float
    verdicts: Mapping[str, bool]


@dataclass(frozen=True, slots=True)
class Zone:
    """What one NUMA node can still give a pod, from the kubelet (None: not reported)."""

    numa_node: int | None  # None: devices the kubelet places on no NUMA node
    cpus_allocatable: int | None
    cpus_allocated: int | None  # exclusive CPUs handed out
    devices_allocatable: Mapping[str, int]  # resource -> devices
    devices_free: Mapping[str, int]
    memory_allocatable_bytes: int | None  # memory manager; None without it
    memory_free_bytes: int | None


@dataclass(frozen=True, slots=True)
class NodeSnapshot:
    node_name: str
    timestamp: float
    topology: Topology | None
    numa_nodes: tuple[NumaNodeState, ...]
    balancing: Mapping[str, int]
    hint_fault_locality: float | None
    pods: tuple[PodState, ...]
    pod_metadata_synced: bool
    resctrl: ResctrlState | None
    gpus: GpuReading | None = None
    device_uses: tuple[DeviceUse, ...] = ()
    zones: tuple[Zone, ...] = ()
    starvation: tuple[Starvation, ...] = ()


def build_snapshot(
    node_name: str,
    timestamp: float,
    host: HostReading | None,
    pods: PodsReading | None,
    metadata: Mapping[str, PodMeta] | None,
    previous: NodeSnapshot | None,
    thresholds: Thresholds,
    resctrl: ResctrlReading | None = None,
    gpus: GpuReading | None = None,
    kubelet: KubeletReading | None = None,
    dra: DraView | None = None,
) -> NodeSnapshot:
    """Combine this cycle's readings; a reading that failed (None) contributes nothing.

    ``metadata`` is None when the API server is not in use or not yet synced.
    """
    topology = build_topology(host) if host else (previous.topology if previous else None)
    prev_nodes = {n.id: n for n in previous.numa_nodes} if previous else {}
    numa_nodes = (
        tuple(_numa_node(n, host, prev_nodes.get(n.id)) for n in host.nodes) if host else ()
    )
    balancing = dict(host.balancing) if host else {}
    locality = None
    if previous and balancing:
        locality = _delta_ratio(
            previous.balancing, balancing, "numa_hint_faults_local", ("numa_hint_faults",)
        )
    granted = _kubelet_index(kubelet)
    pod_states = _pods(pods, topology, metadata or {}, thresholds, granted) if pods else ()
    traffic = None
    if resctrl is not None:
        traffic = build_resctrl(
            resctrl,
            topology.l3_domains if topology else {},
            topology.node_of_cpu if topology else {},
            topology.socket_of_cpu if topology else {},
            previous.resctrl if previous else None,
            timestamp - previous.timestamp if previous else None,
        )
    find = _DeviceFinder(gpus, dra) if gpus else None  # one index of the devices a cycle
    uses = _device_uses(gpus, pod_states, granted, metadata or {}, find) if find else ()
    starvation: tuple[Starvation, ...] = ()
    if uses:
        pod_states = _with_device_verdicts(pod_states, uses)
        by_uid = {p.uid: p for p in pod_states}
        uses = tuple(replace(u, pod_state=by_uid.get(u.pod_uid)) for u in uses)
        starvation = _starvation(
            uses,
            previous,
            timestamp - previous.timestamp if previous else None,
            traffic,
            thresholds,
        )
    return NodeSnapshot(
        node_name=node_name,
        timestamp=timestamp,
        topology=topology,
        numa_nodes=numa_nodes,
        balancing=balancing,
        hint_fault_locality=locality,
        pods=pod_states,
        pod_metadata_synced=metadata is not None,
        resctrl=traffic,
        gpus=gpus,
        device_uses=uses,
        zones=_zones(kubelet, topology, _dra_devices(find, uses)) if kubelet else (),
        starvation=starvation,
    )


def build_topology(host: HostReading) -> Topology:
    nodes = tuple(n.id for n in host.nodes)
    cpus_of_node = {n.id: n.cpus for n in host.nodes if n.cpus is not None}
    node_of_cpu = {cpu: node for node, cpus in cpus_of_node.items() for cpu in cpus}
    distance = {
        n.id: dict(zip(nodes, n.distances, strict=True))
        for n in host.nodes
        if n.distances is not None and len(n.distances) == len(nodes)
    }
    return Topology(nodes, node_of_cpu, host.socket_of_cpu, distance, host.l3_domains)


def _numa_node(reading, host: HostReading, previous: NumaNodeState | None) -> NumaNodeState:
    by_socket: dict[int, int] = {}
    for cpu in reading.cpus or ():
        socket = host.socket_of_cpu.get(cpu)
        if socket is not None:
            by_socket[socket] = by_socket.get(socket, 0) + 1
    ratio = None
    if previous and previous.numastat and reading.numastat:
        ratio = _delta_ratio(
            previous.numastat, reading.numastat, "other_node", ("local_node", "other_node")
        )
    return NumaNodeState(
        reading.id, reading.cpus, by_socket, reading.meminfo, reading.numastat, ratio
    )


def _delta_ratio(
    before: Mapping[str, int], after: Mapping[str, int], part: str, whole: tuple[str, ...]
) -> float | None:
    """Δpart / Σ Δwhole between two counter readings.

    None when a counter is missing or went backwards (reset), or nothing happened.
    """
    keys = {part, *whole}
    if not all(k in before and k in after for k in keys):
        return None
    deltas = {k: after[k] - before[k] for k in keys}
    if any(d < 0 for d in deltas.values()):
        return None
    total = sum(deltas[k] for k in whole)
    return deltas[part] / total if total else None


def _pods(
    reading: PodsReading,
    topology: Topology | None,
    metadata: Mapping[str, PodMeta],
    thresholds: Thresholds,
    granted: Mapping[tuple[str, str, str], ContainerResources] | None,
) -> tuple[PodState, ...]:
    placer = _CpuPlacer(topology)
    by_pod: dict[str, list[ContainerReading]] = {}
    for c in reading.containers:
        by_pod.setdefault(c.pod_uid, []).append(c)
    pods = []
    for uid, raw in by_pod.items():
        # (the source read only the containers the API server names, given names: a
        # pod's sandbox, which no one names, is not among them)
        meta = metadata.get(uid)
        containers = tuple(_container(c, meta, placer, reading.shared_pool, granted) for c in raw)
        pods.append(_pod(uid, meta, containers, placer, thresholds))
    return tuple(sorted(pods, key=lambda p: p.uid))


def _container(
    c: ContainerReading,
    meta: PodMeta | None,
    placer: _CpuPlacer,
    shared_pool: frozenset[int] | None,
    granted: Mapping[tuple[str, str, str], ContainerResources] | None,
) -> ContainerState:
    name = meta.containers.get(c.container_id, "") if meta else ""
    kubelet = granted.get((meta.namespace, meta.name, name)) if granted and meta else None
    if kubelet is not None:  # the CPU manager says which CPUs it gave exclusively
        exclusive = bool(kubelet.exclusive_cpus)
    else:
        # Exclusive CPUs are taken out of the shared pool by the CPU manager, so a
        # Guaranteed container's cpuset is exclusive exactly when it is disjoint from it.
        exclusive = bool(
            c.qos_class == "guaranteed"
            and c.cpus
            and shared_pool is not None
            and c.cpus.isdisjoint(shared_pool)
        )
    cpus_by_node = placer.by_node(c.cpus)
    cpu_nodes = set(cpus_by_node) if cpus_by_node is not None else None
    memory = _nonzero(c.memory_by_node)
    remote = _remote_bytes(memory, cpu_nodes)
    total = sum(memory.values()) if memory is not None else None
    return ContainerState(
        container_id=c.container_id,
        name=name,
        runtime=c.runtime,
        qos_class=c.qos_class,
        exclusive_cpus=exclusive,
        cpus=c.cpus,
        cpus_by_node=cpus_by_node,
        memory_by_node=memory,
        memory_remote_bytes=remote,
        memory_remote_ratio=remote / total if remote is not None and total else None,
        numa_nodes_spanned=len(cpu_nodes) if cpu_nodes is not None else None,
        throttling=c.throttling,
        pressure=c.pressure,
        cpu_span=None if cpu_nodes is None else bool(exclusive and len(cpu_nodes) > 1),
    )


def _pod(
    uid: str,
    meta: PodMeta | None,
    containers: tuple[ContainerState, ...],
    placer: _CpuPlacer,
    thresholds: Thresholds,
) -> PodState:
    known_cpus = all(c.cpus is not None for c in containers)
    cpus = frozenset().union(*(c.cpus for c in containers)) if known_cpus else None
    cpus_by_node = placer.by_node(cpus)
    memory = None
    if containers and all(c.memory_by_node is not None for c in containers):
        memory = {}
        for c in containers:
            for node, size in c.memory_by_node.items():
                memory[node] = memory.get(node, 0) + size
        memory = dict(sorted(memory.items()))
    total = sum(memory.values()) if memory is not None else 0
    remote_ratio = None
    if total and all(c.memory_remote_bytes is not None for c in containers):
        remote_ratio = sum(c.memory_remote_bytes for c in containers) / total
    verdicts: dict[str, bool] = {}
    if containers and all(c.cpu_span is not None for c in containers):
        verdicts["cpu_span"] = any(c.cpu_span for c in containers)
    if remote_ratio is not None:
        verdicts["memory_remote"] = (
            remote_ratio >= thresholds.memory_remote_ratio
            and total >= thresholds.memory_remote_min_bytes
        )
    return PodState(
        uid=uid,
        namespace=meta.namespace if meta else "",
        name=meta.name if meta else "",
        containers=containers,
        cpus_by_node=cpus_by_node,
        memory_by_node=memory,
        memory_remote_ratio=remote_ratio,
        numa_nodes_spanned=len(cpus_by_node) if cpus_by_node is not None else None,
        cross_numa=verdicts,
    )


def _kubelet_index(
    kubelet: KubeletReading | None,
) -> dict[tuple[str, str, str], ContainerResources] | None:
    """(namespace, pod, container) -> what the kubelet gave it; None when it is silent."""
    if kubelet is None or kubelet.pods is None:
        return None
    return {(p.namespace, p.name, c.name): c for p in kubelet.pods for c in p.containers}


def _device_uses(
    gpus: GpuReading,
    pods: tuple[PodState, ...],
    granted: Mapping[tuple[str, str, str], ContainerResources] | None,
    metadata: Mapping[str, PodMeta],
    find: _DeviceFinder,
) -> tuple[DeviceUse, ...]:
    """Who uses which GPU or slice: the kubelet's allocations first (device plugins'
    ids, and DRA devices by what their ResourceSlice says they are), then the node's
    pods' ResourceClaims for what the kubelet did not name; NVML's processes for the
    devices neither says anything about (no kubelet, or devices handed out some other
    way, such as a privileged pod that sees them all)."""
    given = _GivenDevices(metadata)
    for (namespace, pod, container), resources in (granted or {}).items():
        for d in resources.devices:
            for device_id in d.ids:
                unit = find.plugin_device(device_id)
                if unit is not None:
                    given.add(unit, d.resource, namespace, pod, container, "kubelet")
        for c in resources.claims:
            unit = find.dra_device(c.driver, c.pool, c.device)
            if unit is not None:
                given.add(unit, c.driver, namespace, pod, container, "kubelet")
    told = {(pod, uuid) for pod, _, uuid in given.seen}  # what the kubelet said goes first
    for uid, meta in metadata.items():
        for claim, containers in meta.claims.items():
            for a in find.dra.allocations.get((meta.namespace, claim), ()) if find.dra else ():
                unit = find.dra_device(a.driver, a.pool, a.device)
                if unit is None or (uid, (unit[1] or unit[0]).uuid) in told:
                    continue
                for container in containers:
                    given.add(unit, a.driver, meta.namespace, meta.name, container, "claim", uid)
    claimed = {uuid for _, _, uuid in given.seen}
    return (*given.uses, *_process_uses(gpus, pods, claimed))


class _GivenDevices:
    """Devices handed to containers by name (the kubelet's answer, the claims), each
    (pod, container, device) once, whoever says it first."""

    def __init__(self, metadata: Mapping[str, PodMeta]) -> None:
        self.metadata = metadata
        self.by_name = {(m.namespace, m.name): (uid, m) for uid, m in metadata.items()}
        self.uses: list[DeviceUse] = []
        self.seen: set[tuple[str, str, str]] = set()  # (pod, container, device uuid)

    def add(
        self,
        unit,
        resource: str,
        namespace: str,
        pod: str,
        container: str,
        source: str,
        uid: str | None = None,
    ) -> None:
        """``uid``: the pod's, when known; else the pod of that name (the kubelet names
        pods, not uids)."""
        if uid is None:
            uid, meta = self.by_name.get((namespace, pod), ("", None))
        else:
            meta = self.metadata.get(uid)
        key = (uid or f"{namespace}/{pod}", container, (unit[1] or unit[0]).uuid)
        if key in self.seen:
            return
        self.seen.add(key)
        container_id = (
            next((cid for cid, n in meta.containers.items() if n == container), "") if meta else ""
        )
        self.uses.append(
            DeviceUse(
                unit[0], unit[1], resource, uid, container_id, namespace, pod, container, source
            )
        )


def _process_uses(
    gpus: GpuReading, pods: tuple[PodState, ...], claimed: set[str]
) -> list[DeviceUse]:
    """The devices nobody named, by the pods of the processes NVML sees on them."""
    by_uid = {p.uid: p for p in pods}
    uses = []
    for gpu in gpus.gpus:
        found = [(None, gpu.holders, "nvidia.com/gpu", gpu.uuid)] + [
            (s, s.holders, mig_resource(s.profile), s.uuid) for s in gpu.slices
        ]
        for mig, holders, resource, uuid in found:
            if uuid in claimed:
                continue
            for h in holders:
                pod = by_uid.get(h.pod_uid)
                container = (
                    next((c.name for c in pod.containers if c.container_id == h.container_id), "")
                    if pod
                    else ""
                )
                namespace, name = (pod.namespace, pod.name) if pod else ("", "")
                uses.append(
                    DeviceUse(
                        gpu,
                        mig,
                        resource,
                        h.pod_uid,
                        h.container_id,
                        namespace,
                        name,
                        container,
                        "process",
                    )
                )
    return uses


class _DeviceFinder:
    """The GPU or slice a device plugin's id or a DRA device names."""

    def __init__(self, gpus: GpuReading, dra: DraView | None) -> None:
        self.dra = dra
        self.units: dict[str, tuple[GpuRecord, SliceRecord | None]] = {}
        self.by_index: dict[int, GpuRecord] = {}
        for gpu in gpus.gpus:
            self.by_index[gpu.index] = gpu
            if gpu.uuid:
                self.units[gpu.uuid] = (gpu, None)
                self.units[str(gpu.index)] = (gpu, None)  # device plugins given indices
            for s in gpu.slices:
                self.units[s.uuid] = (gpu, s)
                self.units[f"MIG-{gpu.uuid}/{s.gi_id}/{s.ci_id}"] = (gpu, s)  # old plugins

    def plugin_device(self, device_id: str) -> tuple[GpuRecord, SliceRecord | None] | None:
        device_id, index, gi = device_plugin_id(device_id)
        if index is None:
            return self.units.get(device_id)
        gpu = self.by_index.get(index)  # GKE's nvidia<index>[/gi<id>]
        if gpu is None or gi is None:
            return (gpu, None) if gpu else None
        return next(((gpu, s) for s in gpu.slices if s.gi_id == gi), None)

    def dra_device(self, driver: str, pool: str, name: str):
        """By the UUID its ResourceSlice gives, or a MIG device made on demand by its
        parent and placement; None when the node's slices do not say (no guess)."""
        device = self.dra.devices.get((driver, pool, name)) if self.dra else None
        if device is None:
            return None
        if device.uuid and device.uuid in self.units:  # "" names nothing
            return self.units[device.uuid]
        parent = self.units.get(device.parent_uuid) if device.parent_uuid else None
        if parent is None or device.placement is None:
            return None
        gpu, where = parent[0], device.placement
        placed = (s for s in gpu.slices if (s.placement_start, s.placement_size) == where)
        return next(((gpu, s) for s in placed), None)


def _starvation(
    uses: tuple[DeviceUse, ...],
    previous: NodeSnapshot | None,
    interval: float | None,
    traffic: ResctrlState | None,
    thresholds: Thresholds,
) -> tuple[Starvation, ...]:
    before = {p.uid: p for p in previous.pods} if previous else {}
    limits = {
        "cpu_throttled": thresholds.starved_cpu_throttled,
        "cpu_pressure": thresholds.starved_cpu_pressure,
        "memory_pressure": thresholds.starved_memory_pressure,
        "remote_traffic": thresholds.starved_remote_traffic,
    }
    out = []
    for use in uses:
        unit = use.mig or use.gpu
        activity = unit.activity.utilization
        utilization = activity.get("sm", activity.get("graphics"))
        pod = use.pod_state
        if not unit.processes or utilization is None or pod is None:
            continue  # nothing running, unmeasured, or a pod we cannot see: no verdict
        low = utilization < thresholds.gpu_starved_utilization
        verdicts = {
            reason: low and pod.cross_numa[reason]
            for reason in ("device_remote", "memory_remote")
            if reason in pod.cross_numa
        }
        signals = _host_signals(pod, before.get(pod.uid), interval, traffic)
        verdicts |= {r: low and value >= limits[r] for r, value in signals.items()}
        out.append(Starvation(use, utilization, verdicts))
    return tuple(out)


def _host_signals(
    pod: PodState, before: PodState | None, interval: float | None, traffic: ResctrlState | None
) -> dict[str, float]:
    """The pod's host-side signals over the last interval, worst container first: share
    of periods throttled, share of time stalled on CPU and on memory (PSI some), share of
    its memory traffic that went remote. Only those the counters allow (a counter that
    went back, a new container, the first cycle: none)."""
    out: dict[str, float] = {}
    earlier = {c.container_id: c for c in before.containers} if before else {}
    for c in pod.containers:
        e = earlier.get(c.container_id)
        if e is None or not interval or interval <= 0:
            continue
        if c.throttling and e.throttling:
            periods = c.throttling.periods - e.throttling.periods
            throttled = c.throttling.throttled_periods - e.throttling.throttled_periods
            if periods > 0 and throttled >= 0:
                out["cpu_throttled"] = max(out.get("cpu_throttled", 0.0), throttled / periods)
        for resource in ("cpu", "memory"):
            now, then = c.pressure.get(resource), e.pressure.get(resource)
            if now and then and now.some_seconds >= then.some_seconds:
                share = (now.some_seconds - then.some_seconds) / interval
                key = f"{resource}_pressure"
                out[key] = max(out.get(key, 0.0), share)
    remote = traffic.pods.get(pod.uid) if traffic else None
    if remote is not None and remote.remote_ratio is not None:
        out["remote_traffic"] = remote.remote_ratio
    return out


def _dra_devices(
    find: _DeviceFinder | None, uses: tuple[DeviceUse, ...]
) -> list[tuple[int | None, str, bool]]:
    """(NUMA node, driver, free) of each DRA device of the node's ResourceSlices that is a
    GPU or slice NVML knows; taken when a pod holds it through a claim."""
    if find is None or find.dra is None:
        return []
    held = {(u.mig or u.gpu).uuid for u in uses if u.source != "process"}
    out = []
    for driver, pool, name in sorted(find.dra.devices):
        unit = find.dra_device(driver, pool, name)
        if unit is not None:
            out.append((unit[0].numa_node, driver, (unit[1] or unit[0]).uuid not in held))
    return out


def _zones(
    kubelet: KubeletReading, topology: Topology | None, dra: list[tuple[int | None, str, bool]]
) -> tuple[Zone, ...]:
    """Per NUMA node: allocatable and allocated exclusive CPUs, devices per resource and
    memory, from the kubelet's GetAllocatableResources and List; DRA devices (``dra``)
    under their driver's name."""
    alloc = kubelet.allocatable
    if kubelet.pods is None or alloc is None:
        return ()
    given = [c for p in kubelet.pods for c in p.containers]
    node_of_cpu = topology.node_of_cpu if topology else {}
    nodes: set[int | None] = set(topology.nodes) if topology else set()

    def per_node(cpus) -> dict[int | None, int]:
        out: dict[int | None, int] = {}
        for cpu in cpus:
            node = node_of_cpu.get(cpu)
            out[node] = out.get(node, 0) + 1
        return out

    cpus_allocatable = per_node(alloc.cpus)
    cpus_allocated = per_node(frozenset().union(*(c.exclusive_cpus for c in given)))
    taken = {(d.resource, i) for c in given for d in c.devices for i in d.ids}
    devices_all: dict[int | None, dict[str, int]] = {}
    devices_free: dict[int | None, dict[str, int]] = {}
    for d in alloc.devices:
        # a device on several nodes (or none) cannot be placed on one: zone None
        node = d.numa_nodes[0] if len(d.numa_nodes) == 1 else None
        nodes.add(node)
        for i in d.ids:
            devices_all.setdefault(node, {}).setdefault(d.resource, 0)
            devices_free.setdefault(node, {}).setdefault(d.resource, 0)
            devices_all[node][d.resource] += 1
            devices_free[node][d.resource] += (d.resource, i) not in taken
    for node, driver, free in dra:
        nodes.add(node)
        devices_all.setdefault(node, {}).setdefault(driver, 0)
        devices_free.setdefault(node, {}).setdefault(driver, 0)
        devices_all[node][driver] += 1
        devices_free[node][driver] += free
    memory_all: dict[int | None, int] = {}
    memory_used: dict[int | None, int] = {}
    for m in alloc.memory:
        if m.kind == "memory" and len(m.numa_nodes) == 1:
            memory_all[m.numa_nodes[0]] = memory_all.get(m.numa_nodes[0], 0) + m.size_bytes
    for c in given:
        for m in c.memory:
            if m.kind == "memory" and m.numa_nodes:
                # a multi-node allocation is split evenly, as the memory manager does
                share = m.size_bytes // len(m.numa_nodes)
                for n in m.numa_nodes:
                    memory_used[n] = memory_used.get(n, 0) + share
    has_cpus = bool(alloc.cpus)
    zones = []
    for node in sorted(nodes | set(cpus_allocatable), key=lambda n: -1 if n is None else n):
        memory = memory_all.get(node)
        zones.append(
            Zone(
                node,
                cpus_allocatable.get(node, 0) if has_cpus and node is not None else None,
                cpus_allocated.get(node, 0) if has_cpus and node is not None else None,
                devices_all.get(node, {}),
                devices_free.get(node, {}),
                memory,
                None if memory is None else max(0, memory - memory_used.get(node, 0)),
            )
        )
    return tuple(zones)


def _with_device_verdicts(
    pods: tuple[PodState, ...], uses: tuple[DeviceUse, ...]
) -> tuple[PodState, ...]:
    """device_remote: a device the pod uses hangs off a NUMA node none of its CPUs is on.
    Decided only when the device's node and the pod's CPUs are both known."""
    device_nodes: dict[str, list[int | None]] = {}
    for use in uses:
        if use.pod_uid:
            device_nodes.setdefault(use.pod_uid, []).append(use.gpu.numa_node)
    out = []
    for pod in pods:
        nodes = device_nodes.get(pod.uid)
        if nodes and pod.cpus_by_node is not None and all(n is not None for n in nodes):
            remote = any(n not in pod.cpus_by_node for n in nodes)
            pod = replace(pod, cross_numa={**pod.cross_numa, "device_remote": remote})
        out.append(pod)
    return tuple(out)


class _CpuPlacer:
    """CPUs per NUMA node for a cpuset, remembered per distinct cpuset: every container
    of the shared pool has the same one."""

    def __init__(self, topology: Topology | None) -> None:
        self.topology = topology
        self._known: dict[frozenset[int], dict[int, int] | None] = {}

    def by_node(self, cpus: frozenset[int] | None) -> dict[int, int] | None:
        """Nodes holding some of ``cpus`` -> how many; None when unknown."""
        if cpus is None or self.topology is None:
            return None
        if cpus not in self._known:
            counts: dict[int, int] | None = {}
            for cpu in cpus:
                node = self.topology.node_of_cpu.get(cpu)
                if node is None:
                    counts = None  # a CPU we cannot place: no verdict on doubtful data
                    break
                counts[node] = counts.get(node, 0) + 1
            self._known[cpus] = dict(sorted(counts.items())) if counts is not None else None
        return self._known[cpus]


def _nonzero(memory: Mapping[int, int] | None) -> dict[int, int] | None:
    """Memory per node, leaving out nodes that hold none of it."""
    if memory is None:
        return None
    return {node: size for node, size in sorted(memory.items()) if size}


def _remote_bytes(memory: Mapping[int, int] | None, cpu_nodes: set[int] | None) -> int | None:
    if memory is None or cpu_nodes is None or not cpu_nodes:
        return None
    return sum(size for node, size in memory.items() if node not in cpu_nodes)
