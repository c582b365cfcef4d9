"""The host's NUMA nodes: topology, memory, allocation counters, NUMA balancing."""

from __future__ import annotations

from numaguard.contract.catalogue.spec import (
    declare,
)

# -- host NUMA ---------------------------------------------------------------------
NUMA_NODE_INFO = declare(
    "numa_node_info",
    "gauge",
    "A NUMA node of the host with its CPU list; value 1.",
    ("numa_node", "cpulist"),
    "host_numa",
)
NUMA_NODE_CPUS = declare(
    "numa_node_cpus",
    "gauge",
    "Online CPUs of the NUMA node, by socket.",
    ("numa_node", "socket"),
    "host_numa",
)
NODE_SMT_ACTIVE = declare(
    "node_smt_active",
    "gauge",
    "1 when some core of the host runs more than one thread (SMT, hyperthreading), 0 when "
    "none does (sys/devices/system/cpu/smt/active). Absent on kernels that do not say.",
    (),
    "host_numa",
)
NODE_CPUS_PER_CORE = declare(
    "node_cpus_per_core",
    "gauge",
    "Online CPUs per physical core, as the kubelet's CPU manager counts them (online CPUs "
    "over cores): its full-pcpus-only option admits only multiples of it. Absent when the "
    "cores are not known.",
    (),
    "host_numa",
)
NUMA_NODE_DISTANCE = declare(
    "numa_node_distance",
    "gauge",
    "ACPI SLIT distance from numa_node to target_numa_node (10 = local).",
    ("numa_node", "target_numa_node"),
    "host_numa",
)
NUMA_MEMORY_TOTAL = declare(
    "numa_node_memory_total_bytes",
    "gauge",
    "Memory of the NUMA node.",
    ("numa_node",),
    "host_numa",
)
NUMA_MEMORY_FREE = declare(
    "numa_node_memory_free_bytes",
    "gauge",
    "Free memory of the NUMA node.",
    ("numa_node",),
    "host_numa",
)
NUMA_MEMORY_USED = declare(
    "numa_node_memory_used_bytes",
    "gauge",
    "Used memory of the NUMA node.",
    ("numa_node",),
    "host_numa",
)
# numastat's counters, a family each as node_exporter splits them: numa_hit + numa_miss
# and local_node + other_node each add up to the pages allocated on the node, so one
# family with a kind label would count every page twice when summed. (The kernel counts
# an allocation: a transparent huge page once, as the real guest kernel shows.)
NUMASTAT = {
    kind: declare(name, "counter", help, ("numa_node",), "host_numa")
    for kind, name, help in (
        (
            "numa_hit",
            "numa_node_hit_pages_total",
            "Pages allocated on the NUMA node that were meant for it (numastat numa_hit).",
        ),
        (
            "numa_miss",
            "numa_node_miss_pages_total",
            "Pages allocated on the NUMA node that were meant for another node, short of "
            "memory (numastat numa_miss).",
        ),
        (
            "numa_foreign",
            "numa_node_foreign_pages_total",
            "Pages meant for the NUMA node that were allocated on another (numastat numa_foreign).",
        ),
        (
            "interleave_hit",
            "numa_node_interleave_hit_pages_total",
            "Interleaved pages allocated on the NUMA node as meant (numastat interleave_hit; "
            "part of numa_hit).",
        ),
        (
            "local_node",
            "numa_node_local_pages_total",
            "Pages allocated on the NUMA node for a process running on it (numastat local_node).",
        ),
        (
            "other_node",
            "numa_node_other_pages_total",
            "Pages allocated on the NUMA node for a process running on another node "
            "(numastat other_node).",
        ),
    )
}
NUMA_REMOTE_ALLOC = declare(
    "numa_node_remote_alloc_ratio",
    "gauge",
    "Share of the node's allocations over the last interval made for a process running on "
    "another node: other_node / (local_node + other_node), each counter's increase over "
    "the interval. Absent when nothing was allocated or a counter reset.",
    ("numa_node",),
    "host_numa",
)
HINT_FAULTS = declare(
    "numa_balancing_hint_faults_total",
    "counter",
    "NUMA-balancing hinting faults (vmstat numa_hint_faults).",
    (),
    "host_numa",
)
HINT_FAULTS_LOCAL = declare(
    "numa_balancing_hint_faults_local_total",
    "counter",
    "NUMA-balancing hinting faults on local memory (vmstat numa_hint_faults_local).",
    (),
    "host_numa",
)
PAGES_MIGRATED = declare(
    "numa_balancing_pages_migrated_total",
    "counter",
    "Pages migrated by NUMA balancing (vmstat numa_pages_migrated).",
    (),
    "host_numa",
)
HINT_LOCALITY = declare(
    "numa_balancing_hint_fault_locality_ratio",
    "gauge",
    "Share of hinting faults over the last interval that were local. Absent without faults.",
    (),
    "host_numa",
)
