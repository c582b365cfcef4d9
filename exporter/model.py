"""The model: one NodeSnapshot per collection cycle, with every derived signal computed
once, here. Pure: readings (and the previous snapshot, for rates) in, snapshot out.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from exporter.readers.cgroup import CpuThrottling, Pressure
from exporter.readers.numa import NodeMeminfo
from exporter.sources.cgroups import ContainerReading, PodsReading
from exporter.sources.gpu import GpuReading, GpuRecord, SliceRecord
from exporter.sources.host import HostReading, L3Domain
from exporter.sources.resctrl import ResctrlReading
from exporter.traffic import ResctrlState, build_resctrl

MIB = 1 << 20


@dataclass(frozen=True, slots=True)
class Thresholds:
    """When a pod's memory counts as remote (verdict ``memory_remote``)."""

    memory_remote_ratio: float = 0.3
    memory_remote_min_bytes: int = 64 * MIB


@dataclass(frozen=True, slots=True)
class PodMeta:
    """What the API server says about a pod: names, and container id -> container name."""

    namespace: str
    name: str
    containers: Mapping[str, str] = field(default_factory=dict)


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


@dataclass(frozen=True, slots=True)
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


@dataclass(frozen=True, slots=True)
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


@dataclass(frozen=True, slots=True)
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
    source: str  # process


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
    pod_states = _pods(pods, topology, metadata or {}, thresholds) if pods else ()
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
    uses = _device_uses(gpus, pod_states) if gpus else ()
    if uses:
        pod_states = _with_device_verdicts(pod_states, uses)
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
) -> tuple[PodState, ...]:
    placer = _CpuPlacer(topology)
    by_pod: dict[str, list[ContainerReading]] = {}
    for c in reading.containers:
        by_pod.setdefault(c.pod_uid, []).append(c)
    pods = []
    for uid, raw in by_pod.items():
        meta = metadata.get(uid)
        if meta and meta.containers:
            # The API server lists the pod's real containers; the rest is the sandbox.
            raw = [c for c in raw if c.container_id in meta.containers]
            if not raw:
                continue  # only its sandbox is left: nothing of the pod's own to show
        containers = tuple(_container(c, meta, placer, reading.shared_pool) for c in raw)
        pods.append(_pod(uid, meta, containers, placer, thresholds))
    return tuple(sorted(pods, key=lambda p: p.uid))


def _container(
    c: ContainerReading,
    meta: PodMeta | None,
    placer: _CpuPlacer,
    shared_pool: frozenset[int] | None,
) -> ContainerState:
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
        name=meta.containers.get(c.container_id, "") if meta else "",
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


def _device_uses(gpus: GpuReading, pods: tuple[PodState, ...]) -> tuple[DeviceUse, ...]:
    by_uid = {p.uid: p for p in pods}
    uses = []
    for gpu in gpus.gpus:
        units = [(None, gpu.holders, "nvidia.com/gpu")] + [
            (s, s.holders, f"nvidia.com/mig-{s.profile}") for s in gpu.slices
        ]
        for mig, holders, resource in units:
            for h in holders:
                pod = by_uid.get(h.pod_uid)
                container = (
                    next((c.name for c in pod.containers if c.container_id == h.container_id), "")
                    if pod
                    else ""
                )
                uses.append(
                    DeviceUse(
                        gpu,
                        mig,
                        resource,
                        h.pod_uid,
                        h.container_id,
                        pod.namespace if pod else "",
                        pod.name if pod else "",
                        container,
                        "process",
                    )
                )
    return tuple(uses)


def _with_device_verdicts(
    pods: tuple[PodState, ...], uses: tuple[DeviceUse, ...]
) -> tuple[PodState, ...]:
    """device_remote: a device the pod uses hangs off a NUMA node none of its CPUs is on.
    Decided only when the device's node and the pod's CPUs are both known."""
    device_nodes: dict[str, list[int | None]] = {}
    for use in uses:
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
