"""Pod placement metrics: per container and per pod CPUs and memory by NUMA node,
remote memory, throttling, pressure, and the cross-NUMA verdicts."""

from __future__ import annotations

from numaguard.contract import catalogue as c
from numaguard.contract.reasons import L3_SPAN, SHARED_WITH, SMT_SHARED
from numaguard.exporter.collectors import METADATA, Collector
from numaguard.exporter.exposition import Families, Family, LabelPrefix
from numaguard.exporter.model import NodeSnapshot
from numaguard.exporter.model.isolation import CoreIsolation
from numaguard.exporter.model.placement import ContainerState, PodState


def families(snap: NodeSnapshot) -> list[Family]:
    f = Families("pod_placement", snap.node_name, snap.detail)
    info, cpus, memory = (
        f[c.CONTAINER_INFO.name],
        f[c.CONTAINER_CPUS.name],
        f[c.CONTAINER_MEMORY.name],
    )
    remote, spanned = f[c.CONTAINER_REMOTE_MEMORY.name], f[c.CONTAINER_NODES_SPANNED.name]
    periods, throttled = f[c.CONTAINER_PERIODS.name], f[c.CONTAINER_THROTTLED_PERIODS.name]
    throttled_s = f[c.CONTAINER_THROTTLED_SECONDS.name]
    pressure = {r: f[spec.name] for r, spec in c.CONTAINER_PRESSURE.items()}
    pod_cpus, pod_memory = f[c.POD_CPUS.name], f[c.POD_MEMORY.name]
    pod_remote, pod_spanned = f[c.POD_REMOTE_MEMORY.name], f[c.POD_NODES_SPANNED.name]
    cross, exclusive = f[c.POD_CROSS_NUMA.name], f[c.POD_EXCLUSIVE_CPUS.name]
    holding_devices = {use.pod_uid for use in snap.device_uses}

    for pod in snap.pods:
        plabels = LabelPrefix(c.POD, (pod.namespace, pod.name, pod.uid))
        for ctr in pod.containers:
            labels = LabelPrefix(
                c.CONTAINER, (pod.namespace, pod.name, ctr.name, pod.uid, ctr.container_id)
            )
            info.add_under(
                labels, 1, ctr.qos_class, ctr.runtime, "true" if ctr.exclusive_cpus else "false"
            )
            _placement(labels, ctr, cpus, memory, remote, spanned)
            if ctr.throttling:
                periods.add_under(labels, ctr.throttling.periods)
                throttled.add_under(labels, ctr.throttling.throttled_periods)
                throttled_s.add_under(labels, ctr.throttling.throttled_seconds)
            for resource, psi in ctr.pressure.items():
                pressure[resource].add_under(labels, psi.some_seconds, "some")
                if psi.full_seconds is not None:
                    pressure[resource].add_under(labels, psi.full_seconds, "full")
        # the pods whose placement is decided (and remedied) get their breakdowns by
        # default; a shared-pool pod's CPUs span the node, and its throttling and stalls
        # are the kubelet's cAdvisor's to export
        placed = (
            snap.detail
            or any(ctr.exclusive_cpus for ctr in pod.containers)
            or pod.uid in holding_devices
        )
        _placement(plabels, pod, pod_cpus, pod_memory if placed else None, pod_remote, pod_spanned)
        if placed:
            f.add_under(c.POD_THROTTLED_SECONDS, plabels, pod.throttled_seconds)
            for resource, seconds in pod.pressure_seconds.items():
                f.add_under(c.POD_PRESSURE[resource], plabels, seconds)
        for numa, count in (pod.exclusive_cpus_by_node or {}).items():
            exclusive.add_under(plabels, count, str(numa))
        for reason, verdict in pod.cross_numa.items():
            cross.add_under(plabels, int(verdict), reason)
        if pod.isolation is not None:
            _isolation(f, plabels, pod.isolation, snap.detail)
    return list(f.values())


def _isolation(f: Families, labels: LabelPrefix, iso: CoreIsolation, detail: bool) -> None:
    """The verdicts; the breakdowns behind each by default only where it holds (a pod's
    verdict 0 says what they would)."""
    for reason, verdict in iso.verdicts.items():
        f.add_under(c.POD_CORE_ISOLATION, labels, int(verdict), reason)
    if SMT_SHARED in iso.verdicts and (detail or iso.verdicts[SMT_SHARED]):
        for whose in SHARED_WITH:
            f.add_under(c.POD_SMT_SHARED_CPUS, labels, iso.shared.get(whose, 0), whose)
    f.add_under(c.POD_SMT_SIBLING_BUSY, labels, iso.sibling_busy)
    if detail or iso.verdicts.get(L3_SPAN):
        f.add_under(c.POD_L3_DOMAINS, labels, iso.l3_domains)
        f.add_under(c.POD_L3_DOMAINS_FEWEST, labels, iso.l3_fewest)


def _placement(labels: LabelPrefix, state: ContainerState | PodState, *families) -> None:
    """Of a container or a pod: CPUs and memory per NUMA node, the share of its memory
    away from its CPUs, and how many NUMA nodes its CPUs span."""
    cpus, memory, remote, spanned = families
    for numa, count in (state.cpus_by_node or {}).items():
        cpus.add_under(labels, count, str(numa))
    if memory is not None:
        for numa, size in (state.memory_by_node or {}).items():
            memory.add_under(labels, size, str(numa))
    if state.memory_remote_ratio is not None:
        remote.add_under(labels, state.memory_remote_ratio)
    if state.numa_nodes_spanned is not None:
        spanned.add_under(labels, state.numa_nodes_spanned)


COLLECTOR = Collector(
    name="pod_placement",
    help="every pod's CPUs, memory, throttling and pressure per NUMA node (cgroups)",
    source="numaguard.exporter.sources.cgroups",
    families=families,
    reading="pods",
    reads=(METADATA,),
)
