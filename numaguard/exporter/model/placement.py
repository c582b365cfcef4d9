"""Placement (pure): the node's topology and NUMA nodes, and each pod's and container's
CPUs and memory per NUMA node with the verdicts cpu_span and memory_remote."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from numaguard.exporter.model.isolation import CoreIsolation
from numaguard.exporter.model.thresholds import Thresholds
from numaguard.exporter.readers.cgroup import CpuThrottling, Pressure
from numaguard.exporter.readers.numa import NodeMeminfo
from numaguard.exporter.readers.podresources import ContainerResources
from numaguard.exporter.records import ContainerReading, HostReading, L3Domain, PodMeta, PodsReading


@dataclass(frozen=True, slots=True)
class Topology:
    nodes: tuple[int, ...]
    node_of_cpu: Mapping[int, int]
    socket_of_cpu: Mapping[int, int]
    # distance[a][b]; rows whose length does not match the node list are left out
    distance: Mapping[int, Mapping[int, int]]
    l3_domains: Mapping[int, L3Domain]
    core_of_cpu: Mapping[int, frozenset[int]] = field(default_factory=dict)  # SMT siblings
    smt_active: bool | None = None

    @property
    def cpus_per_core(self) -> int | None:
        """Online CPUs per core as the kubelet's CPU manager counts them (its
        ``full-pcpus-only`` admits only multiples of it); None: the cores are not known."""
        cores = set(self.core_of_cpu.values())
        if not cores or self.node_of_cpu.keys() - self.core_of_cpu.keys():
            return None  # a CPU whose core was not read: no count to trust
        return len(self.core_of_cpu) // len(cores)

    @property
    def l3_finer_than_numa(self) -> bool:
        """Whether a NUMA node has several L3 caches (AMD's CCXs, sub-NUMA clusters):
        else a span of caches is one of NUMA nodes."""
        return len(self.l3_domains) > len(set(self.node_of_cpu.values()))


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
    exclusive_cpus_by_node: Mapping[int, int] | None  # empty: in the shared pool
    memory_by_node: Mapping[int, int] | None
    memory_remote_ratio: float | None
    numa_nodes_spanned: int | None
    # reason -> verdict, only for reasons that could be decided on this cycle's data
    cross_numa: Mapping[str, bool]
    # summed over its containers; None when one of them could not be read
    throttled_seconds: float | None
    pressure_seconds: Mapping[str, float]  # PSI some, by resource: where all containers say
    isolation: CoreIsolation | None = None  # of a pod holding exclusive CPUs (isolation.py)


def build_topology(host: HostReading) -> Topology:
    nodes = tuple(n.id for n in host.nodes)
    cpus_of_node = {n.id: n.cpus for n in host.nodes if n.cpus is not None}
    node_of_cpu = {cpu: node for node, cpus in cpus_of_node.items() for cpu in cpus}
    distance = {
        n.id: dict(zip(nodes, n.distances, strict=True))
        for n in host.nodes
        if n.distances is not None and len(n.distances) == len(nodes)
    }
    return Topology(
        nodes,
        node_of_cpu,
        host.socket_of_cpu,
        distance,
        host.l3_domains,
        host.core_of_cpu,
        host.smt_active,
    )


def numa_node_state(reading, host: HostReading, previous: NumaNodeState | None) -> NumaNodeState:
    by_socket: dict[int, int] = {}
    for cpu in reading.cpus or ():
        socket = host.socket_of_cpu.get(cpu)
        if socket is not None:
            by_socket[socket] = by_socket.get(socket, 0) + 1
    ratio = None
    if previous and previous.numastat and reading.numastat:
        ratio = delta_ratio(
            previous.numastat, reading.numastat, "other_node", ("local_node", "other_node")
        )
    return NumaNodeState(
        reading.id, reading.cpus, by_socket, reading.meminfo, reading.numastat, ratio
    )


def delta_ratio(
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


def pods_of(
    reading: PodsReading,
    topology: Topology | None,
    metadata: Mapping[str, PodMeta],
    thresholds: Thresholds,
    granted: Mapping[tuple[str, str, str], ContainerResources] | None,
) -> tuple[PodState, ...]:
    placer = CpuPlacer(topology)
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
    placer: CpuPlacer,
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
    placer: CpuPlacer,
    thresholds: Thresholds,
) -> PodState:
    known_cpus = all(c.cpus is not None for c in containers)
    cpus = frozenset().union(*(c.cpus for c in containers)) if known_cpus else None
    cpus_by_node = placer.by_node(cpus)
    exclusive = [c.cpus for c in containers if c.exclusive_cpus]
    exclusive_by_node = placer.by_node(frozenset().union(*exclusive)) if known_cpus else None
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
    # CPU placement is the CPU manager's only for exclusive CPUs: the shared pool spans
    # the node by design, so a pod without exclusive CPUs gets no cpu_span verdict
    if exclusive and all(c.cpu_span is not None for c in containers):
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
        exclusive_cpus_by_node=exclusive_by_node,
        memory_by_node=memory,
        memory_remote_ratio=remote_ratio,
        numa_nodes_spanned=len(cpus_by_node) if cpus_by_node is not None else None,
        cross_numa=verdicts,
        throttled_seconds=_sum(
            c.throttling.throttled_seconds if c.throttling else None for c in containers
        ),
        pressure_seconds=_pressure(containers),
    )


def _pressure(containers: tuple[ContainerState, ...]) -> dict[str, float]:
    """PSI some of CPU and memory, summed over the containers, where all of them say."""
    out = {}
    for resource in ("cpu", "memory"):
        total = _sum(
            c.pressure[resource].some_seconds if resource in c.pressure else None
            for c in containers
        )
        if total is not None:
            out[resource] = total
    return out


def _sum(values) -> float | None:
    """The sum of a pod's containers' values; None when one is unknown (or none)."""
    values = list(values)
    if not values or any(v is None for v in values):
        return None
    return sum(values)


class CpuPlacer:
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
