"""The model: one NodeSnapshot per collection cycle, with every derived signal computed
once, here. Pure: readings (and the previous snapshot, for rates) in, snapshot out. By
topic: placement (topology, pods, cpu_span and memory_remote), devices (who uses which
GPU or slice, device_remote), links (how a pod's GPUs reach each other), starvation,
counters (DRA's partitionable devices), zones (capacity per NUMA node); thresholds holds
what decides the verdicts.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from numaguard.exporter.model.counters import CounterSetState, counter_states
from numaguard.exporter.model.devices import (
    DeviceFinder,
    DeviceUse,
    device_uses,
    with_device_verdicts,
)
from numaguard.exporter.model.isolation import core_isolation
from numaguard.exporter.model.links import (
    FreeSet,
    Pair,
    PodLinks,
    free_gpus,
    free_sets,
    pair_breakers,
    pairs,
    pod_links,
)
from numaguard.exporter.model.placement import (
    NumaNodeState,
    PodState,
    Topology,
    build_topology,
    delta_ratio,
    numa_node_state,
    pods_of,
)
from numaguard.exporter.model.starvation import Starvation, starvation_of
from numaguard.exporter.model.thresholds import Thresholds
from numaguard.exporter.model.traffic import ResctrlState, build_resctrl
from numaguard.exporter.model.zones import Zone, dra_devices, zones_of
from numaguard.exporter.readers.cpu import CpuTime
from numaguard.exporter.readers.dra import DraView
from numaguard.exporter.readers.kubeletconfig import KubeletConfig
from numaguard.exporter.readers.podresources import ContainerResources
from numaguard.exporter.records import (
    GpuReading,
    HostReading,
    KubeletReading,
    PodMeta,
    PodsReading,
    ResctrlReading,
)


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
    counters: tuple[CounterSetState, ...] = ()  # DRA counter sets (partitionable devices)
    gpu_pairs: Mapping[tuple[int, int], Pair] = field(default_factory=dict)
    pod_links: tuple[PodLinks, ...] = ()
    gpu_free_sets: tuple[FreeSet, ...] = ()
    pair_breakers: tuple[PodLinks, ...] = ()  # single-GPU pods, their breaks_pair verdict
    cpu_times: Mapping[int, CpuTime] | None = None  # /proc/stat, for the next cycle's rates
    kubelet_config: KubeletConfig | None = None  # its resource managers; None: not read
    # the readings of the collectors turned on this cycle (None: failed), by name
    readings: Mapping[str, object] = field(default_factory=dict)
    detail: bool = False  # the families render their detail too (--detail)


def build_snapshot(
    node_name: str,
    timestamp: float,
    *,
    previous: NodeSnapshot | None = None,
    thresholds: Thresholds = Thresholds(),
    metadata: Mapping[str, PodMeta] | None = None,
    dra: DraView | None = None,
    host: HostReading | None = None,
    pods: PodsReading | None = None,
    resctrl: ResctrlReading | None = None,
    gpus: GpuReading | None = None,
    kubelet: KubeletReading | None = None,
    readings: Mapping[str, object] | None = None,
    detail: bool = False,
) -> NodeSnapshot:
    """Combine this cycle's readings; a reading that failed (None) contributes nothing.

    ``metadata`` is None when the API server is not in use or not yet synced.
    ``readings``: every collector's turned on, by name, for collectors that render their
    reading as it is (the named ones above are also among them).
    """
    topology = build_topology(host) if host else (previous.topology if previous else None)
    prev_nodes = {n.id: n for n in previous.numa_nodes} if previous else {}
    numa_nodes = (
        tuple(numa_node_state(n, host, prev_nodes.get(n.id)) for n in host.nodes) if host else ()
    )
    balancing = dict(host.balancing) if host else {}
    locality = None
    if previous and balancing:
        locality = delta_ratio(
            previous.balancing, balancing, "numa_hint_faults_local", ("numa_hint_faults",)
        )
    granted = kubelet_index(kubelet)
    pod_states = pods_of(pods, topology, metadata or {}, thresholds, granted) if pods else ()
    cpu_times = host.cpu_times if host else None
    before = previous.cpu_times if previous else None
    if pods:  # without the kubelet, smt_shared is unknown; the caches are not
        allocatable = kubelet.allocatable if kubelet else None
        pod_states = with_isolation(
            pod_states,
            topology,
            pods.shared_pool,
            allocatable.cpus if allocatable else None,
            (before, cpu_times) if before and cpu_times else None,
        )
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
    find = DeviceFinder(gpus, dra) if gpus else None  # one index of the devices a cycle
    uses = device_uses(gpus, pod_states, granted, metadata or {}, find) if find else ()
    starvation: tuple[Starvation, ...] = ()
    if uses:
        pod_states = with_device_verdicts(pod_states, uses)
        by_uid = {p.uid: p for p in pod_states}
        uses = tuple(replace(u, pod_state=by_uid.get(u.pod_uid)) for u in uses)
        starvation = starvation_of(
            uses,
            previous.pods if previous else (),
            timestamp - previous.timestamp if previous else None,
            traffic,
            thresholds,
        )
    counters = counter_states(dra, {g.uuid: g for g in gpus.gpus if g.uuid} if gpus else {})
    gpu_pairs = pairs(gpus.gpus) if gpus else {}
    free = free_gpus(find, kubelet.pods, kubelet.allocatable) if find and kubelet else None
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
        zones=zones_of(kubelet, topology, dra_devices(find, uses, counters)) if kubelet else (),
        starvation=starvation,
        counters=counters,
        gpu_pairs=gpu_pairs,
        pod_links=pod_links(uses, gpu_pairs),
        gpu_free_sets=free_sets(free, gpu_pairs) if free is not None else (),
        pair_breakers=pair_breakers(uses, gpu_pairs, free) if free is not None else (),
        cpu_times=cpu_times,
        readings=dict(readings or {}),
        kubelet_config=kubelet.config if kubelet else None,
        detail=detail,
    )


def kubelet_index(
    kubelet: KubeletReading | None,
) -> dict[tuple[str, str, str], ContainerResources] | None:
    """(namespace, pod, container) -> what the kubelet gave it; None when it is silent."""
    if kubelet is None or kubelet.pods is None:
        return None
    return {(p.namespace, p.name, c.name): c for p in kubelet.pods for c in p.containers}


def with_isolation(
    pods: tuple[PodState, ...],
    topology: Topology | None,
    shared_pool: frozenset[int] | None,
    allocatable: frozenset[int] | None,
    times: tuple[Mapping[int, CpuTime], Mapping[int, CpuTime]] | None,
) -> tuple[PodState, ...]:
    """``pods``, each holding exclusive CPUs with its core isolation."""
    if topology is None:
        return pods
    held = {p.uid: _exclusive(p) for p in pods}
    exclusive = frozenset().union(*held.values())
    out = []
    for pod in pods:
        own = held[pod.uid]
        if own:
            isolation = core_isolation(
                own,
                exclusive - own,
                topology.core_of_cpu,
                shared_pool,
                allocatable,
                topology.l3_domains,
                topology.l3_finer_than_numa,
                times,
            )
            pod = replace(pod, isolation=isolation)
        out.append(pod)
    return tuple(out)


def _exclusive(pod: PodState) -> frozenset[int]:
    return frozenset().union(
        *(c.cpus for c in pod.containers if c.exclusive_cpus and c.cpus is not None)
    )
