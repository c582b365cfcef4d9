"""Memory traffic and the LLC, from resctrl: per L3 domain, NUMA node and pod."""

from __future__ import annotations

from numaguard.contract.catalogue.spec import (
    POD,
    declare,
)

# -- memory traffic and LLC (resctrl) ----------------------------------------------
RESCTRL_AVAILABLE = declare(
    "resctrl_available",
    "gauge",
    "1 when resctrl L3 monitoring is mounted and in use (mode manage or read-only).",
    (),
    "resctrl",
)
RESCTRL_MODE = declare(
    "resctrl_mode_info",
    "gauge",
    "The resctrl mode in effect (manage, read-only, off, unavailable); value 1.",
    ("mode",),
    "resctrl",
)
RESCTRL_RMIDS = declare(
    "resctrl_rmids",
    "gauge",
    "Monitoring IDs (RMIDs) by state: used (the default group, control groups and "
    "monitoring groups, ours or not), free (not in use; some may still be in limbo), and "
    "limbo (only when the kernel refused a group with EBUSY: freed, but not yet reusable; "
    "free is then 0).",
    ("state",),
    "resctrl",
)
RESCTRL_UNMONITORED = declare(
    "resctrl_unmonitored_pods",
    "gauge",
    "Pods whose traffic is not monitored (RMIDs or assignable counters exhausted, or "
    "their threads not movable); their traffic is not zero, it is unknown.",
    (),
    "resctrl",
)
RESCTRL_EXHAUSTIONS = declare(
    "resctrl_rmid_exhaustions_total",
    "counter",
    "Monitoring groups the kernel refused to create for want of RMIDs.",
    (),
    "resctrl",
)
RESCTRL_UNREADABLE = declare(
    "resctrl_unreadable_values_total",
    "counter",
    "Monitoring values the kernel would not give, by reason (unavailable, error, "
    "unassigned); they are left out, never shown as numbers.",
    ("reason",),
    "resctrl",
)
RESCTRL_MBM_COUNTERS = declare(
    "resctrl_mbm_counters",
    "gauge",
    "Assignable memory-bandwidth counters per L3 domain, by state (used, free); only on "
    "CPUs whose MBM counts through them (AMD ABMC, mbm_assign_mode mbm_event). A group "
    "without a counter for an event is not counted at all.",
    ("l3_domain", "state"),
    "resctrl",
)
RESCTRL_MBM_PARTIAL = declare(
    "resctrl_mbm_totals_partial",
    "gauge",
    "1 when some monitoring group's traffic in the L3 domain is counted by no assignable "
    "counter (AMD ABMC): the domain's and its NUMA nodes' traffic then leave it out; 0 "
    "when every group is counted. Only on CPUs with assignable counters.",
    ("l3_domain",),
    "resctrl",
)
L3_INFO = declare(
    "l3_domain_info",
    "gauge",
    "An L3 cache domain with its socket, NUMA nodes (comma-separated) and CPUs; value 1.",
    ("l3_domain", "socket", "numa_node", "cpulist"),
    "resctrl",
)
L3_CAPACITY = declare(
    "l3_llc_capacity_bytes",
    "gauge",
    "Size of the L3 cache domain.",
    ("l3_domain",),
    "resctrl",
)
L3_OCCUPANCY = declare(
    "l3_llc_occupancy_bytes",
    "gauge",
    "L3 cache in use in the domain.",
    ("l3_domain",),
    "resctrl",
)
L3_TRAFFIC = declare(
    "l3_memory_traffic_bytes_total",
    "counter",
    "Memory traffic from the domain's CPUs (MBM total).",
    ("l3_domain",),
    "resctrl",
)
L3_TRAFFIC_LOCAL = declare(
    "l3_memory_traffic_local_bytes_total",
    "counter",
    "Memory traffic from the domain's CPUs to their local memory (MBM local).",
    ("l3_domain",),
    "resctrl",
)
L3_BANDWIDTH = declare(
    "l3_memory_bandwidth_bytes_per_second",
    "gauge",
    "Memory bandwidth of the domain over the last interval. Absent when a counter reset.",
    ("l3_domain",),
    "resctrl",
)
L3_REMOTE = declare(
    "l3_remote_traffic_ratio",
    "gauge",
    "Share of the domain's memory traffic over the last interval that went to remote "
    "memory: 1 - local / total, each counter's increase over the interval.",
    ("l3_domain",),
    "resctrl",
)
NUMA_TRAFFIC = declare(
    "numa_node_memory_traffic_bytes_total",
    "counter",
    "Memory traffic from the NUMA node's CPUs (Sub-NUMA monitoring, or the L3 domains "
    "wholly inside the node).",
    ("numa_node",),
    "resctrl",
)
NUMA_TRAFFIC_LOCAL = declare(
    "numa_node_memory_traffic_local_bytes_total",
    "counter",
    "Memory traffic from the NUMA node's CPUs to local memory.",
    ("numa_node",),
    "resctrl",
)
NUMA_BANDWIDTH = declare(
    "numa_node_memory_bandwidth_bytes_per_second",
    "gauge",
    "Memory bandwidth of the NUMA node's CPUs over the last interval.",
    ("numa_node",),
    "resctrl",
)
NUMA_REMOTE_TRAFFIC = declare(
    "numa_node_remote_traffic_ratio",
    "gauge",
    "Share of the NUMA node's memory traffic over the last interval that was remote.",
    ("numa_node",),
    "resctrl",
)
NUMA_OCCUPANCY = declare(
    "numa_node_llc_occupancy_bytes",
    "gauge",
    "L3 cache held by the NUMA node's tasks.",
    ("numa_node",),
    "resctrl",
)
POD_MONITORED = declare(
    "pod_resctrl_monitored",
    "gauge",
    "1 when the pod has a resctrl monitoring group holding all its threads; 0 when RMIDs "
    "ran out before it got one, the kernel would not move its threads into it, or (AMD "
    "ABMC) no counter counts its traffic: its LLC occupancy may still be shown, its "
    "traffic is unknown, never 0.",
    POD,
    "resctrl",
)
POD_TRAFFIC = declare(
    "pod_memory_traffic_bytes_total",
    "counter",
    "Memory traffic of the pod's tasks, per L3 domain (restarts from 0 when its "
    "monitoring group is recreated).",
    (*POD, "l3_domain"),
    "resctrl",
    detail=True,
)
POD_TRAFFIC_LOCAL = declare(
    "pod_memory_traffic_local_bytes_total",
    "counter",
    "Memory traffic of the pod's tasks to local memory, per L3 domain.",
    (*POD, "l3_domain"),
    "resctrl",
    detail=True,
)
POD_BANDWIDTH = declare(
    "pod_memory_bandwidth_bytes_per_second",
    "gauge",
    "Memory bandwidth of the pod over the last interval, all domains. Absent when its "
    "counters reset.",
    POD,
    "resctrl",
)
POD_REMOTE_TRAFFIC = declare(
    "pod_remote_traffic_ratio",
    "gauge",
    "Share of the pod's memory traffic over the last interval that was remote.",
    POD,
    "resctrl",
)
POD_OCCUPANCY = declare(
    "pod_llc_occupancy_bytes",
    "gauge",
    "L3 cache held by the pod's tasks, per L3 domain.",
    (*POD, "l3_domain"),
    "resctrl",
    detail=True,
)
POD_LLC_SHARE = declare(
    "pod_llc_share_ratio",
    "gauge",
    "The pod's LLC occupancy as a share of the domain's capacity.",
    (*POD, "l3_domain"),
    "resctrl",
)
