"""Pods and containers: where their CPUs and memory are, throttling, pressure, verdicts."""

from __future__ import annotations

from numaguard.contract.catalogue.spec import (
    CONTAINER,
    POD,
    declare,
)

# -- pods and containers -----------------------------------------------------------
CONTAINER_INFO = declare(
    "container_info",
    "gauge",
    "A pod container seen in the cgroup tree; value 1. exclusive_cpus is true when it holds "
    "CPUs of its own (CPU manager static policy).",
    (*CONTAINER, "qos_class", "runtime", "exclusive_cpus"),
    "pod_placement",
    detail=True,
)
CONTAINER_CPUS = declare(
    "container_cpus",
    "gauge",
    "CPUs of the container's cpuset per NUMA node (nodes holding none are left out).",
    (*CONTAINER, "numa_node"),
    "pod_placement",
    detail=True,
)
CONTAINER_MEMORY = declare(
    "container_memory_bytes",
    "gauge",
    "Container memory (anon + file) per NUMA node, from memory.numa_stat (nodes holding "
    "none are left out).",
    (*CONTAINER, "numa_node"),
    "pod_placement",
    detail=True,
)
CONTAINER_REMOTE_MEMORY = declare(
    "container_memory_remote_ratio",
    "gauge",
    "Share of the container's memory on NUMA nodes that hold none of its CPUs.",
    CONTAINER,
    "pod_placement",
    detail=True,
)
CONTAINER_NODES_SPANNED = declare(
    "container_numa_nodes_spanned",
    "gauge",
    "NUMA nodes the container's CPUs sit on.",
    CONTAINER,
    "pod_placement",
    detail=True,
)
CONTAINER_PERIODS = declare(
    "container_cpu_periods_total",
    "counter",
    "CFS enforcement periods of the container.",
    CONTAINER,
    "pod_placement",
    detail=True,
)
CONTAINER_THROTTLED_PERIODS = declare(
    "container_cpu_throttled_periods_total",
    "counter",
    "CFS periods in which the container was throttled.",
    CONTAINER,
    "pod_placement",
    detail=True,
)
CONTAINER_THROTTLED_SECONDS = declare(
    "container_cpu_throttled_seconds_total",
    "counter",
    "Time the container was throttled by its CPU quota.",
    CONTAINER,
    "pod_placement",
    detail=True,
)
CONTAINER_PRESSURE = {
    resource: declare(
        f"container_{resource}_pressure_seconds_total",
        "counter",
        f"PSI: time some (or all, stall=full) of the container's tasks stalled on {resource}.",
        (*CONTAINER, "stall"),
        "pod_placement",
        detail=True,
    )
    for resource in ("cpu", "memory", "io")
}
POD_CPUS = declare(
    "pod_cpus",
    "gauge",
    "CPUs of the pod's containers per NUMA node (nodes holding none are left out).",
    (*POD, "numa_node"),
    "pod_placement",
    detail=True,
)
POD_EXCLUSIVE_CPUS = declare(
    "pod_exclusive_cpus",
    "gauge",
    "Exclusive CPUs of the pod's containers (CPU manager static policy) per NUMA node; "
    "pods in the shared pool have none.",
    (*POD, "numa_node"),
    "pod_placement",
)
POD_MEMORY = declare(
    "pod_memory_bytes",
    "gauge",
    "Memory of the pod's containers per NUMA node (nodes holding none are left out). "
    "Without --detail only of pods holding exclusive CPUs or devices: the pods whose "
    "placement is decided, and remedied.",
    (*POD, "numa_node"),
    "pod_placement",
)
POD_REMOTE_MEMORY = declare(
    "pod_memory_remote_ratio",
    "gauge",
    "Share of the pod's memory on NUMA nodes that hold none of its containers' CPUs.",
    POD,
    "pod_placement",
)
POD_NODES_SPANNED = declare(
    "pod_numa_nodes_spanned",
    "gauge",
    "NUMA nodes the pod's CPUs sit on.",
    POD,
    "pod_placement",
    detail=True,
)
POD_THROTTLED_SECONDS = declare(
    "pod_cpu_throttled_seconds_total",
    "counter",
    "Time the pod's containers were throttled by their CPU quota, summed over them. "
    "Without --detail only of pods holding exclusive CPUs or devices.",
    POD,
    "pod_placement",
)
POD_PRESSURE = {
    resource: declare(
        f"pod_{resource}_pressure_seconds_total",
        "counter",
        f"PSI some: time some of a container's tasks stalled on {resource}, summed over the "
        "pod's containers. Without --detail only of pods holding exclusive CPUs or devices.",
        POD,
        "pod_placement",
    )
    for resource in ("cpu", "memory")
}
POD_CROSS_NUMA = declare(
    "pod_cross_numa",
    "gauge",
    "1 when the pod is placed across NUMA nodes for the reason given: cpu_span (exclusive "
    "CPUs on several nodes; only pods holding exclusive CPUs), memory_remote (remote "
    "memory ratio over the threshold), "
    "device_remote (a GPU it holds hangs off a NUMA node none of its CPUs is on). "
    "Absent when the data to decide is missing.",
    (*POD, "reason"),
    "pod_placement",
)
POD_CORE_ISOLATION = declare(
    "pod_core_isolation",
    "gauge",
    "1 when a pod's exclusive CPUs are not its own down to the core or the cache, for the "
    "reason given: smt_shared (a thread of a core it holds is another's: the shared pool, "
    "another container's exclusive CPU, or the kubelet's reserved CPUs; only on nodes with "
    "SMT, where a core has several threads), l3_span (its CPUs "
    "span more L3 caches than their count needs; only on nodes whose L3 caches are finer "
    "than their NUMA nodes, where cpu_span does not say it). Only pods holding exclusive "
    "CPUs; absent when the cores, the cpusets or the kubelet's CPUs are unknown.",
    (*POD, "reason"),
    "pod_placement",
)
POD_SMT_SHARED_CPUS = declare(
    "pod_smt_shared_cpus",
    "gauge",
    "Threads beside a pod's exclusive CPUs (on the same cores) that are not its own, by "
    "whose they are: reserved, exclusive (another container's), shared_pool. Without "
    "--detail only of pods whose smt_shared verdict is 1.",
    (*POD, "shared_with"),
    "pod_placement",
)
POD_SMT_SIBLING_BUSY = declare(
    "pod_smt_sibling_busy_ratio",
    "gauge",
    "Busy share of the threads beside a pod's exclusive CPUs that are not its own, over the "
    "last interval (/proc/stat): an idle sibling does no harm, a busy one is a noisy "
    "neighbour in the core. Absent when there are none.",
    POD,
    "pod_placement",
)
POD_L3_DOMAINS = declare(
    "pod_l3_domains",
    "gauge",
    "L3 caches a pod's exclusive CPUs span. Without --detail only of pods whose l3_span "
    "verdict is 1.",
    POD,
    "pod_placement",
)
POD_L3_DOMAINS_FEWEST = declare(
    "pod_l3_domains_fewest",
    "gauge",
    "The fewest L3 caches of the node that could hold as many CPUs as the pod's exclusive "
    "ones. Without --detail only of pods whose l3_span verdict is 1.",
    POD,
    "pod_placement",
)
