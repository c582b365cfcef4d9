"""Capacity per NUMA zone, from the kubelet: what each NUMA node can still give a pod
(exclusive CPUs, devices per resource, memory, the best joined sets of free GPUs), for
the remediator's fit check; and how its CPU manager hands CPUs out."""

from __future__ import annotations

from numaguard.contract import catalogue as c
from numaguard.exporter.collectors import Collector
from numaguard.exporter.exposition import Families, Family
from numaguard.exporter.model import NodeSnapshot
from numaguard.exporter.readers import format_id_list


def families(snap: NodeSnapshot) -> list[Family]:
    f = Families("capacity", snap.node_name, snap.detail)
    add = f.add
    for zone in snap.zones:
        node = "" if zone.numa_node is None else str(zone.numa_node)
        add(c.ZONE_CPUS_ALLOCATABLE, zone.cpus_allocatable, node)
        add(c.ZONE_CPUS_ALLOCATED, zone.cpus_allocated, node)
        add(c.ZONE_CPUS_FREE_WHOLE_CORES, zone.cpus_free_whole_cores, node)
        add(c.ZONE_L3_MOST_FREE_CPUS, zone.l3_most_free_cpus, node)
        for resource, count in sorted(zone.devices_allocatable.items()):
            add(c.ZONE_DEVICES_ALLOCATABLE, count, node, resource)
            add(c.ZONE_DEVICES_FREE, zone.devices_free.get(resource, 0), node, resource)
        add(c.ZONE_MEMORY_ALLOCATABLE, zone.memory_allocatable_bytes, node)
        add(c.ZONE_MEMORY_FREE, zone.memory_free_bytes, node)
    if snap.kubelet_config is not None:
        manager = snap.kubelet_config.cpu_manager
        reserved = format_id_list(manager.reserved) if manager.reserved else ""
        add(c.KUBELET_CPU_MANAGER_INFO, 1, manager.policy, reserved)
        for option, value in manager.options.items():
            add(c.KUBELET_CPU_MANAGER_OPTION, 1, option, value)
    for free in snap.gpu_free_sets:
        node = "" if free.numa_node is None else str(free.numa_node)
        add(c.ZONE_GPU_FREE_SET, 1, node, str(free.size), free.level)
    return list(f.values())


COLLECTOR = Collector(
    name="pod_resources",
    help="who holds which device and what each NUMA node can still give (the kubelet's "
    "PodResources API)",
    source="numaguard.exporter.sources.kubelet",
    families=families,
    reading="kubelet",
    errors=("missing", "kubelet"),
)
