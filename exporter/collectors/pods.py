"""Pod placement metrics: per container and per pod CPUs and memory by NUMA node,
remote memory, throttling, pressure, and the cross-NUMA verdicts."""

from __future__ import annotations

from exporter import catalogue as c
from exporter.model import NodeSnapshot


def families(snap: NodeSnapshot) -> list[c.Family]:
    node = snap.node_name
    f = {spec.name: spec.family(node) for spec in _SPECS}

    def add(spec: c.MetricSpec, value: float, *labels: str) -> None:
        f[spec.name].add(value, *labels)

    for pod in snap.pods:
        plabels = (pod.namespace, pod.name, pod.uid)
        for ctr in pod.containers:
            clabels = (pod.namespace, pod.name, ctr.name, pod.uid, ctr.container_id)
            add(c.CONTAINER_INFO, 1, *clabels, ctr.qos_class, ctr.runtime,
                "true" if ctr.exclusive_cpus else "false")
            for numa, count in (ctr.cpus_by_node or {}).items():
                add(c.CONTAINER_CPUS, count, *clabels, str(numa))
            for numa, size in (ctr.memory_by_node or {}).items():
                add(c.CONTAINER_MEMORY, size, *clabels, str(numa))
            if ctr.memory_remote_ratio is not None:
                add(c.CONTAINER_REMOTE_MEMORY, ctr.memory_remote_ratio, *clabels)
            if ctr.numa_nodes_spanned is not None:
                add(c.CONTAINER_NODES_SPANNED, ctr.numa_nodes_spanned, *clabels)
            if ctr.throttling:
                add(c.CONTAINER_PERIODS, ctr.throttling.periods, *clabels)
                add(c.CONTAINER_THROTTLED_PERIODS, ctr.throttling.throttled_periods, *clabels)
                add(c.CONTAINER_THROTTLED_SECONDS, ctr.throttling.throttled_seconds, *clabels)
            for resource, psi in ctr.pressure.items():
                spec = c.CONTAINER_PRESSURE[resource]
                add(spec, psi.some_seconds, *clabels, "some")
                if psi.full_seconds is not None:
                    add(spec, psi.full_seconds, *clabels, "full")
        for numa, count in (pod.cpus_by_node or {}).items():
            add(c.POD_CPUS, count, *plabels, str(numa))
        for numa, size in sorted((pod.memory_by_node or {}).items()):
            add(c.POD_MEMORY, size, *plabels, str(numa))
        if pod.memory_remote_ratio is not None:
            add(c.POD_REMOTE_MEMORY, pod.memory_remote_ratio, *plabels)
        if pod.numa_nodes_spanned is not None:
            add(c.POD_NODES_SPANNED, pod.numa_nodes_spanned, *plabels)
        for reason, verdict in pod.cross_numa.items():
            add(c.POD_CROSS_NUMA, int(verdict), *plabels, reason)
    return list(f.values())


_SPECS = [
    spec for spec in c.CATALOGUE.values() if spec.group == "pod_placement"
]
