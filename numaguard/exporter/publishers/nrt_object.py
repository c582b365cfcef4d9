"""This node's NodeResourceTopology (``topology.node.k8s.io/v1alpha2``, the CRD the
scheduler-plugins project's NodeResourceTopologyMatch plugin reads), built from the
cycle's zones: the same numbers as the ``numaguard_zone_*`` series, so the scheduler
places pods on the room the remediator counts. Pure: snapshot in, object out.

Per NUMA zone (``node-<id>``): ``cpu`` (capacity: the node's CPUs; allocatable: what the
kubelet may hand out exclusively; available: that less what it has), ``memory`` where
the kubelet's memory manager reports it, and each device resource (capacity and
allocatable: the healthy devices; available: the free ones); costs from the kernel's
distance matrix; as attributes, when the kubelet's config was read: the Topology
Manager's policy and scope, and the CPU manager's policy, options (``name=value``, comma
separated) and reserved CPUs, as the config names them.
"""

from __future__ import annotations

from numaguard.exporter.model import NodeSnapshot
from numaguard.exporter.readers import format_id_list

API_VERSION = "topology.node.k8s.io/v1alpha2"
PATH = "/apis/topology.node.k8s.io/v1alpha2/noderesourcetopologies"


def node_resource_topology(snap: NodeSnapshot) -> dict | None:
    """The object, or None when the kubelet said nothing of its zones (no object beats
    one that says a node has no room)."""
    zones = [z for z in snap.zones if z.numa_node is not None]
    if not zones:
        return None
    topology = snap.topology
    cpus_of = {}
    if topology is not None:
        for node in topology.node_of_cpu.values():
            cpus_of[node] = cpus_of.get(node, 0) + 1
    memory_of = {n.id: n.meminfo.total_bytes for n in snap.numa_nodes if n.meminfo}
    out = []
    for zone in sorted(zones, key=lambda z: z.numa_node):
        numa = zone.numa_node
        cpus_free = None
        if zone.cpus_allocatable is not None and zone.cpus_allocated is not None:
            cpus_free = zone.cpus_allocatable - zone.cpus_allocated
        resources = [
            _resource(name, capacity or allocatable, allocatable, available)
            for name, capacity, allocatable, available in (
                ("cpu", cpus_of.get(numa), zone.cpus_allocatable, cpus_free),
                (
                    "memory",
                    memory_of.get(numa),
                    zone.memory_allocatable_bytes,
                    zone.memory_free_bytes,
                ),
            )
            if allocatable is not None and available is not None
        ]
        for name, count in sorted(zone.devices_allocatable.items()):
            resources.append(_resource(name, count, count, zone.devices_free.get(name, 0)))
        entry = {"name": f"node-{numa}", "type": "Node", "resources": resources}
        distances = topology.distance.get(numa) if topology is not None else None
        if distances:
            entry["costs"] = [
                {"name": f"node-{n}", "value": d} for n, d in sorted(distances.items())
            ]
        out.append(entry)
    attributes = [{"name": name, "value": value} for name, value in _attributes(snap) if value]
    obj = {
        "apiVersion": API_VERSION,
        "kind": "NodeResourceTopology",
        "metadata": {"name": snap.node_name},
        "zones": out,
    }
    if attributes:
        obj["attributes"] = attributes
    return obj


def _attributes(snap: NodeSnapshot) -> list[tuple[str, str]]:
    config = snap.kubelet_config
    if config is None:
        return []
    cpu = config.cpu_manager
    return [
        ("topologyManagerPolicy", config.topology_policy),
        ("topologyManagerScope", config.topology_scope),
        ("cpuManagerPolicy", cpu.policy),
        ("cpuManagerPolicyOptions", ",".join(f"{k}={v}" for k, v in cpu.options.items())),
        ("reservedSystemCPUs", format_id_list(cpu.reserved) if cpu.reserved else ""),
    ]


def _resource(name: str, capacity: int, allocatable: int, available: int) -> dict:
    return {
        "name": name,
        "capacity": capacity,
        "allocatable": allocatable,
        "available": max(0, available),
    }
