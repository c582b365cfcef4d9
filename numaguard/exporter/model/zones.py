"""Zones (pure): what each NUMA node can still give a pod — exclusive CPUs, devices per
resource, memory — from the kubelet's answers, for the remediator's fit check."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from numaguard.exporter.model.counters import CounterSetState
from numaguard.exporter.model.devices import DeviceFinder, DeviceUse
from numaguard.exporter.model.placement import Topology
from numaguard.exporter.records import KubeletReading


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
    # free CPUs in wholly free cores (SMT nodes only), and the most free CPUs of one L3
    # cache (where a NUMA node has several): what a pod kept to whole cores, or to one
    # cache, can still get
    cpus_free_whole_cores: int | None = None
    l3_most_free_cpus: int | None = None


def dra_devices(
    find: DeviceFinder | None, uses: tuple[DeviceUse, ...], counters: tuple[CounterSetState, ...]
) -> list[tuple[int | None, str, int, int | None]]:
    """(NUMA node, driver, allocatable, free) of the DRA devices of the node's
    ResourceSlices: one for each GPU or slice NVML knows that consumes no counters (free
    unless a pod holds it through a claim); for each counter set's GPU, the partitions
    its counters allow (the most of any one profile) and how many more still fit (free
    None: unknown, some claim not read yet)."""
    if find is None or find.dra is None:
        return []
    held = {(u.mig or u.gpu).uuid for u in uses if u.source != "process"}
    out: list[tuple[int | None, str, int, int | None]] = []
    for key, device in sorted(find.dra.devices.items()):
        unit = None if device.consumes else find.dra_device(*key)  # counters: below
        if unit is not None:
            out.append(
                (unit[0].numa_node, device.driver, 1, int((unit[1] or unit[0]).uuid not in held))
            )
    for state in counters:
        gpu = find.units.get(state.gpu_uuid) if state.gpu_uuid else None
        if gpu is None:
            continue  # on no NUMA node NVML knows
        unused = int(not any((state.consumed or {}).values()))  # the whole GPU, if nothing else
        free = None
        if state.profiles_free is not None and state.consumed is not None:
            free = max(state.profiles_free.values(), default=unused)
        out.append(
            (gpu[0].numa_node, state.driver, max(state.profiles_max.values(), default=1), free)
        )
    return out


def zones_of(
    kubelet: KubeletReading,
    topology: Topology | None,
    dra: list[tuple[int | None, str, int, int | None]],
) -> tuple[Zone, ...]:
    """Per NUMA node: allocatable and allocated exclusive CPUs, devices per resource and
    memory, from the kubelet's GetAllocatableResources and List; DRA devices and
    partitions (``dra``) under their driver's name."""
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
    exclusive = frozenset().union(*(c.exclusive_cpus for c in given))
    cpus_allocated = per_node(exclusive)
    whole, one_cache = aligned_room(alloc.cpus - exclusive, topology)
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
    unknown = set()
    for node, driver, allocatable, free in dra:
        nodes.add(node)
        devices_all.setdefault(node, {}).setdefault(driver, 0)
        devices_free.setdefault(node, {}).setdefault(driver, 0)
        devices_all[node][driver] += allocatable
        devices_free[node][driver] += free or 0
        if free is None:
            unknown.add((node, driver))
    for node, driver in unknown:  # no made-up count: the driver's devices left out
        del devices_all[node][driver], devices_free[node][driver]
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
                whole.get(node, 0) if whole is not None and has_cpus and node is not None else None,
                one_cache.get(node, 0)
                if one_cache is not None and has_cpus and node is not None
                else None,
            )
        )
    return tuple(zones)


def aligned_room(
    free: frozenset[int], topology: Topology | None
) -> tuple[dict[int, int] | None, dict[int, int] | None]:
    """Per NUMA node: the free CPUs whose whole core is free (None: no SMT, or the
    cores are not all known) and the most free CPUs of one L3 cache (None: no NUMA node
    has several caches, or they are not known)."""
    if topology is None:
        return None, None
    whole: dict[int, int] | None = None
    if (topology.cpus_per_core or 1) > 1:
        whole = {}
        for cpu in free:
            node = topology.node_of_cpu.get(cpu)
            core = topology.core_of_cpu.get(cpu)
            if node is not None and core is not None and core <= free:
                whole[node] = whole.get(node, 0) + 1
    one_cache: dict[int, int] | None = None
    if topology.l3_finer_than_numa:
        one_cache = {}
        for cache in topology.l3_domains.values():
            nodes = {topology.node_of_cpu.get(cpu) for cpu in cache.cpus}
            if len(nodes) == 1 and None not in nodes:  # a cache on one NUMA node
                (node,) = nodes
                one_cache[node] = max(one_cache.get(node, 0), len(cache.cpus & free))
    return whole, one_cache
