"""The metric catalogue: every metric numaguard exports, declared once.

Collectors, the remediator's queries, alert rules and dashboards take names from here
only (a test checks it). Every series also carries ``node``, added by
``numaguard.exporter.exposition.Family``; ``make docs`` writes docs/metrics.md from it.
"""

from __future__ import annotations

from dataclasses import dataclass

from numaguard.contract.reasons import STARVED_REASONS

PREFIX = "numaguard_"
NODE_LABEL = "node"
_UNITS = ("bytes", "seconds", "ratio")


@dataclass(frozen=True, slots=True)
class MetricSpec:
    name: str  # as exposed; counters end in _total
    kind: str  # gauge | counter | histogram (the remediator's only)
    help: str
    labels: tuple[str, ...] = ()  # besides "node"
    group: str = ""
    buckets: tuple[float, ...] = ()  # a histogram's upper bounds
    # a breakdown a fleet need not pay for: exported only with the exporter's --detail
    detail: bool = False

    @property
    def unit(self) -> str:
        base = self.name.removesuffix("_total")
        return next((u for u in _UNITS if base.endswith("_" + u)), "")

    @property
    def series(self) -> tuple[str, ...]:
        """The names its samples are exposed under, as queries select them."""
        if self.kind == "histogram":
            return tuple(f"{self.name}_{part}" for part in ("bucket", "sum", "count"))
        return (self.name,)


CATALOGUE: dict[str, MetricSpec] = {}


def _m(
    name: str,
    kind: str,
    help: str,
    labels: tuple[str, ...] = (),
    group: str = "",
    buckets: tuple[float, ...] = (),
    detail: bool = False,
) -> MetricSpec:
    spec = MetricSpec(PREFIX + name, kind, help, labels, group, buckets, detail)
    assert spec.name not in CATALOGUE, spec.name
    CATALOGUE[spec.name] = spec
    return spec


def _process(name: str, kind: str, help: str) -> MetricSpec:
    """A metric of the process itself, by the name every Prometheus client library gives
    it (no numaguard_ prefix: dashboards for any exporter use these)."""
    spec = MetricSpec(name, kind, help, (), "process")
    assert spec.name not in CATALOGUE, spec.name
    CATALOGUE[spec.name] = spec
    return spec


# Label sets shared by many metrics.
CONTAINER = ("namespace", "pod", "container", "pod_uid", "container_id")
POD = ("namespace", "pod", "pod_uid")
COLLECTOR = ("collector",)

# -- the process (both components; read by numaguard/common/process.py) --------------------
PROCESS_CPU = _process(
    "process_cpu_seconds_total", "counter", "User and system CPU time the process spent."
)
PROCESS_RSS = _process("process_resident_memory_bytes", "gauge", "Resident memory.")
PROCESS_VSZ = _process("process_virtual_memory_bytes", "gauge", "Virtual memory.")
PROCESS_FDS = _process("process_open_fds", "gauge", "Open file descriptors.")
PROCESS_MAX_FDS = _process("process_max_fds", "gauge", "The process's file descriptor limit.")
PROCESS_START = _process(
    "process_start_time_seconds", "gauge", "When the process started, seconds since the epoch."
)

# -- self-health -------------------------------------------------------------------
BUILD_INFO = _m(
    "build_info",
    "gauge",
    "numaguard build; value is always 1.",
    ("version", "python_version"),
    "health",
)
COLLECTOR_SUCCESS = _m(
    "collector_success",
    "gauge",
    "1 when the collector's last run finished in time without errors.",
    COLLECTOR,
    "health",
)
COLLECTOR_DURATION = _m(
    "collector_duration_seconds",
    "gauge",
    "Wall time of the collector's last run.",
    COLLECTOR,
    "health",
)
COLLECTOR_ERRORS = _m(
    "collector_errors_total",
    "counter",
    "Errors met by the collector, by reason: missing, permission, io, parse, oversized, "
    "not_regular (a FIFO, device or socket where a kernel file should be), write (the "
    "kernel refused a resctrl change), gpu_lost, nvml, kubelet, timeout, internal.",
    (*COLLECTOR, "reason"),
    "health",
)
COLLECTOR_LAST_SUCCESS = _m(
    "collector_last_success_timestamp_seconds",
    "gauge",
    "Unix time of the collector's last successful run.",
    COLLECTOR,
    "health",
)
SERIES_LIMITED = _m(
    "series_limited",
    "gauge",
    "1 when the node has more pods than --max-pods: no pod, container or per-pod resctrl "
    "series this cycle (node-wide ones stay), so that a runaway node cannot take the "
    "exporter past its memory limit; 0 otherwise.",
    (),
    "health",
)
NRT_CURRENT = _m(
    "nrt_current",
    "gauge",
    "With --nrt: 1 when this node's NodeResourceTopology says what the cycle before "
    "found (written, or unchanged), 0 when writing it failed (the log says why).",
    (),
    "health",
)
POD_METADATA_SYNCED = _m(
    "pod_metadata_synced",
    "gauge",
    "1 when pod names come from a synced API-server watch; 0 means pod series carry only "
    "pod_uid and container_id.",
    (),
    "health",
)

# -- host NUMA ---------------------------------------------------------------------
NUMA_NODE_INFO = _m(
    "numa_node_info",
    "gauge",
    "A NUMA node of the host with its CPU list; value 1.",
    ("numa_node", "cpulist"),
    "host_numa",
)
NUMA_NODE_CPUS = _m(
    "numa_node_cpus",
    "gauge",
    "Online CPUs of the NUMA node, by socket.",
    ("numa_node", "socket"),
    "host_numa",
)
NUMA_NODE_DISTANCE = _m(
    "numa_node_distance",
    "gauge",
    "ACPI SLIT distance from numa_node to target_numa_node (10 = local).",
    ("numa_node", "target_numa_node"),
    "host_numa",
)
NUMA_MEMORY_TOTAL = _m(
    "numa_node_memory_total_bytes",
    "gauge",
    "Memory of the NUMA node.",
    ("numa_node",),
    "host_numa",
)
NUMA_MEMORY_FREE = _m(
    "numa_node_memory_free_bytes",
    "gauge",
    "Free memory of the NUMA node.",
    ("numa_node",),
    "host_numa",
)
NUMA_MEMORY_USED = _m(
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
    kind: _m(name, "counter", help, ("numa_node",), "host_numa")
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
NUMA_REMOTE_ALLOC = _m(
    "numa_node_remote_alloc_ratio",
    "gauge",
    "Share of the node's allocations over the last interval made for a process running on "
    "another node: other_node / (local_node + other_node), each counter's increase over "
    "the interval. Absent when nothing was allocated or a counter reset.",
    ("numa_node",),
    "host_numa",
)
HINT_FAULTS = _m(
    "numa_balancing_hint_faults_total",
    "counter",
    "NUMA-balancing hinting faults (vmstat numa_hint_faults).",
    (),
    "host_numa",
)
HINT_FAULTS_LOCAL = _m(
    "numa_balancing_hint_faults_local_total",
    "counter",
    "NUMA-balancing hinting faults on local memory (vmstat numa_hint_faults_local).",
    (),
    "host_numa",
)
PAGES_MIGRATED = _m(
    "numa_balancing_pages_migrated_total",
    "counter",
    "Pages migrated by NUMA balancing (vmstat numa_pages_migrated).",
    (),
    "host_numa",
)
HINT_LOCALITY = _m(
    "numa_balancing_hint_fault_locality_ratio",
    "gauge",
    "Share of hinting faults over the last interval that were local. Absent without faults.",
    (),
    "host_numa",
)

# -- pods and containers -----------------------------------------------------------
CONTAINER_INFO = _m(
    "container_info",
    "gauge",
    "A pod container seen in the cgroup tree; value 1. exclusive_cpus is true when it holds "
    "CPUs of its own (CPU manager static policy).",
    (*CONTAINER, "qos_class", "runtime", "exclusive_cpus"),
    "pod_placement",
    detail=True,
)
CONTAINER_CPUS = _m(
    "container_cpus",
    "gauge",
    "CPUs of the container's cpuset per NUMA node (nodes holding none are left out).",
    (*CONTAINER, "numa_node"),
    "pod_placement",
    detail=True,
)
CONTAINER_MEMORY = _m(
    "container_memory_bytes",
    "gauge",
    "Container memory (anon + file) per NUMA node, from memory.numa_stat (nodes holding "
    "none are left out).",
    (*CONTAINER, "numa_node"),
    "pod_placement",
    detail=True,
)
CONTAINER_REMOTE_MEMORY = _m(
    "container_memory_remote_ratio",
    "gauge",
    "Share of the container's memory on NUMA nodes that hold none of its CPUs.",
    CONTAINER,
    "pod_placement",
    detail=True,
)
CONTAINER_NODES_SPANNED = _m(
    "container_numa_nodes_spanned",
    "gauge",
    "NUMA nodes the container's CPUs sit on.",
    CONTAINER,
    "pod_placement",
    detail=True,
)
CONTAINER_PERIODS = _m(
    "container_cpu_periods_total",
    "counter",
    "CFS enforcement periods of the container.",
    CONTAINER,
    "pod_placement",
    detail=True,
)
CONTAINER_THROTTLED_PERIODS = _m(
    "container_cpu_throttled_periods_total",
    "counter",
    "CFS periods in which the container was throttled.",
    CONTAINER,
    "pod_placement",
    detail=True,
)
CONTAINER_THROTTLED_SECONDS = _m(
    "container_cpu_throttled_seconds_total",
    "counter",
    "Time the container was throttled by its CPU quota.",
    CONTAINER,
    "pod_placement",
    detail=True,
)
CONTAINER_PRESSURE = {
    resource: _m(
        f"container_{resource}_pressure_seconds_total",
        "counter",
        f"PSI: time some (or all, stall=full) of the container's tasks stalled on {resource}.",
        (*CONTAINER, "stall"),
        "pod_placement",
        detail=True,
    )
    for resource in ("cpu", "memory", "io")
}
POD_CPUS = _m(
    "pod_cpus",
    "gauge",
    "CPUs of the pod's containers per NUMA node (nodes holding none are left out).",
    (*POD, "numa_node"),
    "pod_placement",
    detail=True,
)
POD_EXCLUSIVE_CPUS = _m(
    "pod_exclusive_cpus",
    "gauge",
    "Exclusive CPUs of the pod's containers (CPU manager static policy) per NUMA node; "
    "pods in the shared pool have none.",
    (*POD, "numa_node"),
    "pod_placement",
)
POD_MEMORY = _m(
    "pod_memory_bytes",
    "gauge",
    "Memory of the pod's containers per NUMA node (nodes holding none are left out). "
    "Without --detail only of pods holding exclusive CPUs or devices: the pods whose "
    "placement is decided, and remedied.",
    (*POD, "numa_node"),
    "pod_placement",
)
POD_REMOTE_MEMORY = _m(
    "pod_memory_remote_ratio",
    "gauge",
    "Share of the pod's memory on NUMA nodes that hold none of its containers' CPUs.",
    POD,
    "pod_placement",
)
POD_NODES_SPANNED = _m(
    "pod_numa_nodes_spanned",
    "gauge",
    "NUMA nodes the pod's CPUs sit on.",
    POD,
    "pod_placement",
    detail=True,
)
POD_THROTTLED_SECONDS = _m(
    "pod_cpu_throttled_seconds_total",
    "counter",
    "Time the pod's containers were throttled by their CPU quota, summed over them. "
    "Without --detail only of pods holding exclusive CPUs or devices.",
    POD,
    "pod_placement",
)
POD_PRESSURE = {
    resource: _m(
        f"pod_{resource}_pressure_seconds_total",
        "counter",
        f"PSI some: time some of a container's tasks stalled on {resource}, summed over the "
        "pod's containers. Without --detail only of pods holding exclusive CPUs or devices.",
        POD,
        "pod_placement",
    )
    for resource in ("cpu", "memory")
}
POD_CROSS_NUMA = _m(
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


# -- memory traffic and LLC (resctrl) ----------------------------------------------
RESCTRL_AVAILABLE = _m(
    "resctrl_available",
    "gauge",
    "1 when resctrl L3 monitoring is mounted and in use (mode manage or read-only).",
    (),
    "resctrl",
)
RESCTRL_MODE = _m(
    "resctrl_mode_info",
    "gauge",
    "The resctrl mode in effect (manage, read-only, off, unavailable); value 1.",
    ("mode",),
    "resctrl",
)
RESCTRL_RMIDS = _m(
    "resctrl_rmids",
    "gauge",
    "Monitoring IDs (RMIDs) by state: used (the default group, control groups and "
    "monitoring groups, ours or not), free (not in use; some may still be in limbo), and "
    "limbo (only when the kernel refused a group with EBUSY: freed, but not yet reusable; "
    "free is then 0).",
    ("state",),
    "resctrl",
)
RESCTRL_UNMONITORED = _m(
    "resctrl_unmonitored_pods",
    "gauge",
    "Pods whose traffic is not monitored (RMIDs or assignable counters exhausted, or "
    "their threads not movable); their traffic is not zero, it is unknown.",
    (),
    "resctrl",
)
RESCTRL_EXHAUSTIONS = _m(
    "resctrl_rmid_exhaustions_total",
    "counter",
    "Monitoring groups the kernel refused to create for want of RMIDs.",
    (),
    "resctrl",
)
RESCTRL_UNREADABLE = _m(
    "resctrl_unreadable_values_total",
    "counter",
    "Monitoring values the kernel would not give, by reason (unavailable, error, "
    "unassigned); they are left out, never shown as numbers.",
    ("reason",),
    "resctrl",
)
RESCTRL_MBM_COUNTERS = _m(
    "resctrl_mbm_counters",
    "gauge",
    "Assignable memory-bandwidth counters per L3 domain, by state (used, free); only on "
    "CPUs whose MBM counts through them (AMD ABMC, mbm_assign_mode mbm_event). A group "
    "without a counter for an event is not counted at all.",
    ("l3_domain", "state"),
    "resctrl",
)
RESCTRL_MBM_PARTIAL = _m(
    "resctrl_mbm_totals_partial",
    "gauge",
    "1 when some monitoring group's traffic in the L3 domain is counted by no assignable "
    "counter (AMD ABMC): the domain's and its NUMA nodes' traffic then leave it out; 0 "
    "when every group is counted. Only on CPUs with assignable counters.",
    ("l3_domain",),
    "resctrl",
)
L3_INFO = _m(
    "l3_domain_info",
    "gauge",
    "An L3 cache domain with its socket, NUMA nodes (comma-separated) and CPUs; value 1.",
    ("l3_domain", "socket", "numa_node", "cpulist"),
    "resctrl",
)
L3_CAPACITY = _m(
    "l3_llc_capacity_bytes",
    "gauge",
    "Size of the L3 cache domain.",
    ("l3_domain",),
    "resctrl",
)
L3_OCCUPANCY = _m(
    "l3_llc_occupancy_bytes",
    "gauge",
    "L3 cache in use in the domain.",
    ("l3_domain",),
    "resctrl",
)
L3_TRAFFIC = _m(
    "l3_memory_traffic_bytes_total",
    "counter",
    "Memory traffic from the domain's CPUs (MBM total).",
    ("l3_domain",),
    "resctrl",
)
L3_TRAFFIC_LOCAL = _m(
    "l3_memory_traffic_local_bytes_total",
    "counter",
    "Memory traffic from the domain's CPUs to their local memory (MBM local).",
    ("l3_domain",),
    "resctrl",
)
L3_BANDWIDTH = _m(
    "l3_memory_bandwidth_bytes_per_second",
    "gauge",
    "Memory bandwidth of the domain over the last interval. Absent when a counter reset.",
    ("l3_domain",),
    "resctrl",
)
L3_REMOTE = _m(
    "l3_remote_traffic_ratio",
    "gauge",
    "Share of the domain's memory traffic over the last interval that went to remote "
    "memory: 1 - local / total, each counter's increase over the interval.",
    ("l3_domain",),
    "resctrl",
)
NUMA_TRAFFIC = _m(
    "numa_node_memory_traffic_bytes_total",
    "counter",
    "Memory traffic from the NUMA node's CPUs (Sub-NUMA monitoring, or the L3 domains "
    "wholly inside the node).",
    ("numa_node",),
    "resctrl",
)
NUMA_TRAFFIC_LOCAL = _m(
    "numa_node_memory_traffic_local_bytes_total",
    "counter",
    "Memory traffic from the NUMA node's CPUs to local memory.",
    ("numa_node",),
    "resctrl",
)
NUMA_BANDWIDTH = _m(
    "numa_node_memory_bandwidth_bytes_per_second",
    "gauge",
    "Memory bandwidth of the NUMA node's CPUs over the last interval.",
    ("numa_node",),
    "resctrl",
)
NUMA_REMOTE_TRAFFIC = _m(
    "numa_node_remote_traffic_ratio",
    "gauge",
    "Share of the NUMA node's memory traffic over the last interval that was remote.",
    ("numa_node",),
    "resctrl",
)
NUMA_OCCUPANCY = _m(
    "numa_node_llc_occupancy_bytes",
    "gauge",
    "L3 cache held by the NUMA node's tasks.",
    ("numa_node",),
    "resctrl",
)
POD_MONITORED = _m(
    "pod_resctrl_monitored",
    "gauge",
    "1 when the pod has a resctrl monitoring group holding all its threads; 0 when RMIDs "
    "ran out before it got one, the kernel would not move its threads into it, or (AMD "
    "ABMC) no counter counts its traffic: its LLC occupancy may still be shown, its "
    "traffic is unknown, never 0.",
    POD,
    "resctrl",
)
POD_TRAFFIC = _m(
    "pod_memory_traffic_bytes_total",
    "counter",
    "Memory traffic of the pod's tasks, per L3 domain (restarts from 0 when its "
    "monitoring group is recreated).",
    (*POD, "l3_domain"),
    "resctrl",
    detail=True,
)
POD_TRAFFIC_LOCAL = _m(
    "pod_memory_traffic_local_bytes_total",
    "counter",
    "Memory traffic of the pod's tasks to local memory, per L3 domain.",
    (*POD, "l3_domain"),
    "resctrl",
    detail=True,
)
POD_BANDWIDTH = _m(
    "pod_memory_bandwidth_bytes_per_second",
    "gauge",
    "Memory bandwidth of the pod over the last interval, all domains. Absent when its "
    "counters reset.",
    POD,
    "resctrl",
)
POD_REMOTE_TRAFFIC = _m(
    "pod_remote_traffic_ratio",
    "gauge",
    "Share of the pod's memory traffic over the last interval that was remote.",
    POD,
    "resctrl",
)
POD_OCCUPANCY = _m(
    "pod_llc_occupancy_bytes",
    "gauge",
    "L3 cache held by the pod's tasks, per L3 domain.",
    (*POD, "l3_domain"),
    "resctrl",
    detail=True,
)
POD_LLC_SHARE = _m(
    "pod_llc_share_ratio",
    "gauge",
    "The pod's LLC occupancy as a share of the domain's capacity.",
    (*POD, "l3_domain"),
    "resctrl",
)


# -- GPUs and MIG slices ------------------------------------------------------------
GPU = ("gpu", "gpu_uuid")
SLICE = (*GPU, "mig_uuid", "mig_profile")
_KIND = (
    "kind: sm (share of SMs busy), graphics (time any context was active), sm_occupancy "
    "(active warps vs the maximum), tensor (time tensor cores were busy), dram_bandwidth "
    "(DRAM bandwidth used vs the maximum)"
)

GPU_INFO = _m(
    "gpu_info",
    "gauge",
    "A GPU NVML sees; value 1. numa_node is where its PCIe root hangs (empty: unknown); "
    "mig_mode is enabled or disabled; driver_version and nvml_version are the node's "
    "(empty: NVML would not say).",
    (*GPU, "model", "pci_bus_id", "numa_node", "mig_mode", "driver_version", "nvml_version"),
    "gpu",
)
GPU_UP = _m(
    "gpu_up",
    "gauge",
    "1 when the GPU answered NVML this cycle; 0 when it is lost, its calls hung past the "
    'deadline, or it could not be named (see collector_errors_total{collector="gpu"}).',
    GPU,
    "gpu",
)
GPU_POWER = _m("gpu_power_watts", "gauge", "Power draw, once per GPU.", GPU, "gpu")
GPU_TEMPERATURE = _m(
    "gpu_temperature_celsius", "gauge", "GPU core temperature, once per GPU.", GPU, "gpu"
)
GPU_MEMORY_TOTAL = _m("gpu_memory_total_bytes", "gauge", "Frame buffer size.", GPU, "gpu")
GPU_MEMORY_USED = _m(
    "gpu_memory_used_bytes", "gauge", "Frame buffer in use (all slices, with MIG on).", GPU, "gpu"
)
GPU_UTILIZATION = _m(
    "gpu_utilization_ratio",
    "gauge",
    "Whole-GPU activity over the last interval, 0..1, by " + _KIND + ". Only kinds the GPU "
    "measures appear (GPM on Hopper and later; graphics from the utilization rates "
    "otherwise).",
    (*GPU, "kind"),
    "gpu",
)
GPU_UTILIZATION_SUPPORTED = _m(
    "gpu_utilization_supported",
    "gauge",
    "1 when the GPU can measure this kind of activity, 0 when it cannot: a missing "
    "utilization is then unknown, not idle.",
    (*GPU, "kind"),
    "gpu",
)
GPU_PCIE = _m(
    "gpu_pcie_bytes_per_second",
    "gauge",
    "PCIe traffic over the last interval (GPM), direction tx (from the GPU) or rx.",
    (*GPU, "direction"),
    "gpu",
)
GPU_PROCESSES = _m(
    "gpu_processes",
    "gauge",
    "Compute processes on a GPU with MIG off (with MIG on, see mig_processes).",
    GPU,
    "gpu",
)
MIG_INFO = _m(
    "mig_info",
    "gauge",
    "A MIG slice; value 1. gi_id and ci_id are its GPU and compute instance; placement "
    "is its first memory slice and their count, of 8.",
    (*SLICE, "gi_id", "ci_id", "placement_start", "placement_size"),
    "gpu",
)
MIG_SMS = _m(
    "mig_multiprocessors",
    "gauge",
    "Streaming multiprocessors of the slice, as the driver reports them.",
    SLICE,
    "gpu",
)
MIG_MEMORY_TOTAL = _m("mig_memory_total_bytes", "gauge", "The slice's memory.", SLICE, "gpu")
MIG_MEMORY_USED = _m("mig_memory_used_bytes", "gauge", "The slice's memory in use.", SLICE, "gpu")
MIG_UTILIZATION = _m(
    "mig_utilization_ratio",
    "gauge",
    "The slice's own activity over the last interval, 0..1 of the slice (not of the GPU), "
    "by " + _KIND + ". From GPM (Hopper and later); absent where unsupported.",
    (*SLICE, "kind"),
    "gpu",
)
MIG_UTILIZATION_SUPPORTED = _m(
    "mig_utilization_supported",
    "gauge",
    "1 when the slice's activity of this kind can be measured; 0 on GPUs without GPM "
    "(A100), where NVML has no per-slice utilization.",
    (*SLICE, "kind"),
    "gpu",
)
MIG_PCIE = _m(
    "mig_pcie_bytes_per_second",
    "gauge",
    "The slice's PCIe traffic over the last interval (GPM), direction tx or rx.",
    (*SLICE, "direction"),
    "gpu",
    detail=True,
)
MIG_PROCESSES = _m("mig_processes", "gauge", "Compute processes on the slice.", SLICE, "gpu")
GPU_HOLDER = _m(
    "gpu_holder_info",
    "gauge",
    "A pod container using a GPU (mig_uuid empty) or MIG slice; value 1. resource is the "
    "extended resource it stands for (for a DRA claim: its driver); numa_node is the "
    "device's; source says how it was found: kubelet (PodResources allocation), claim "
    "(the pod's DRA ResourceClaim, where the kubelet does not report claims) or process "
    "(a process of the container runs on a device neither says anything about).",
    (*GPU, "mig_uuid", "resource", "numa_node", *CONTAINER, "source"),
    "gpu",
)

GPU_STARVED = _m(
    "gpu_starved",
    "gauge",
    "1 when a GPU or MIG slice (mig_uuid empty: a whole GPU) with processes on it was "
    "barely busy over the last interval (SM activity under --gpu-starved-utilization) "
    "while its pod's host side held it back for the reason given: "
    + "; ".join(
        f"{r.name}: {r.measure}"
        + (f", at least --gpu-starved-{r.name.replace('_', '-')}" if r.default is not None else "")
        for r in STARVED_REASONS
    )
    + ". 0 when that reason does not hold; absent when it cannot be decided.",
    (*GPU, "mig_uuid", "namespace", "pod", "pod_uid", "reason"),
    "gpu",
)

# -- what each NUMA node can still give (the remediator's fit check) ---------------------
ZONE_CPUS_ALLOCATABLE = _m(
    "zone_cpus_allocatable",
    "gauge",
    "CPUs of the NUMA node the kubelet's CPU manager can hand out exclusively.",
    ("numa_node",),
    "capacity",
)
ZONE_CPUS_ALLOCATED = _m(
    "zone_cpus_allocated",
    "gauge",
    "CPUs of the NUMA node handed out exclusively to containers.",
    ("numa_node",),
    "capacity",
)
ZONE_DEVICES_ALLOCATABLE = _m(
    "zone_devices_allocatable",
    "gauge",
    "Devices of an extended resource on the NUMA node (numa_node empty: the kubelet "
    "places them on none, or on several); a DRA driver's devices (its ResourceSlices' "
    "GPUs and slices) under the driver's name, on their GPU's NUMA node.",
    ("numa_node", "resource"),
    "capacity",
)
ZONE_DEVICES_FREE = _m(
    "zone_devices_free",
    "gauge",
    "Devices of an extended resource on the NUMA node not allocated to any container.",
    ("numa_node", "resource"),
    "capacity",
)
ZONE_MEMORY_ALLOCATABLE = _m(
    "zone_memory_allocatable_bytes",
    "gauge",
    "Memory of the NUMA node the kubelet's memory manager can hand out (present only "
    "with the memory manager).",
    ("numa_node",),
    "capacity",
)
ZONE_MEMORY_FREE = _m(
    "zone_memory_free_bytes",
    "gauge",
    "Memory of the NUMA node not yet handed out by the memory manager.",
    ("numa_node",),
    "capacity",
)


# -- moving pods' memory home in place (--memory-mover; numaguard/exporter/mover/orders.py) --
MEMORY_MOVES = _m(
    "memory_moves_total",
    "counter",
    "Requests to move a pod's memory home (its numaguard.io/move-memory annotation) "
    "carried out, by result: moved, partial (some pages stayed: see the failures), failed "
    "(the kernel refused the move: see the log), refused (see the refusals).",
    ("result",),
    "memory_mover",
)
MEMORY_MOVE_REFUSALS = _m(
    "memory_move_refusals_total",
    "counter",
    "Requests refused before any page moved, by reason: not_exclusive (no exclusive CPUs: "
    "no home), unknown_memory, kubelet (the Memory Manager's pinning unknown), "
    "nothing_remote, mems (cpuset.mems excludes its CPUs' nodes), unknown_mems, "
    "memory_manager (pinned elsewhere), no_free_memory, expired (a request of a Unix time "
    "over 10 minutes old when first seen, as after a restart), no_helper (the memory "
    "mover's helper not listening yet: asked again), and the helper's own: "
    "not_the_pod_s_cgroup, bad_order (an order it would not take: a defect, or a "
    "subverted exporter).",
    ("reason",),
    "memory_mover",
)
MEMORY_MOVED_PAGES = _m(
    "memory_moved_pages_total", "counter", "Pages moved home.", (), "memory_mover"
)
MEMORY_MOVED_BYTES = _m(
    "memory_moved_bytes_total", "counter", "Bytes moved home.", (), "memory_mover"
)
MEMORY_MOVE_FAILURES = _m(
    "memory_move_failures_total",
    "counter",
    "Pages that did not move (or whole calls refused), by the kernel's errno as reason: "
    "EACCES (a page other processes map too), EBUSY, ENOMEM (no room on the node), ESRCH "
    "(the process ended), EPERM (no CAP_SYS_PTRACE), ENOENT (a page numa_maps shows that "
    "move_pages cannot see: on Debian's Linux 6.1, measured, one NUMA balancing marked "
    "for a hinting fault).",
    ("reason",),
    "memory_mover",
)
MEMORY_MOVE_DURATION = _m(
    "memory_move_seconds_total",
    "counter",
    "Time spent moving, the rate's pauses included.",
    (),
    "memory_mover",
)


# -- the remediator's own metrics (served by numaguard-remediator, not the exporter) ------
REMEDIATOR_FINDINGS = _m(
    "remediator_findings", "gauge", "Open findings by kind.", ("kind",), "remediator"
)
REMEDIATOR_UNREMEDIABLE = _m(
    "remediator_unremediable_findings",
    "gauge",
    "Open findings no NUMA zone anywhere can take aligned.",
    (),
    "remediator",
)
REMEDIATOR_ACTIONS = _m(
    "remediator_actions_total",
    "counter",
    "Actions carried out, by kind (evict, resize, recommend, delete: a pod the kubelet "
    "refused) and result.",
    ("kind", "result"),
    "remediator",
)
REMEDIATOR_REFUSALS = _m(
    "remediator_refusals_total",
    "counter",
    "Actions refused, by the guard that refused.",
    ("guard",),
    "remediator",
)
REMEDIATOR_VERIFICATIONS = _m(
    "remediator_verifications_total",
    "counter",
    "Fixes checked after the fact, by outcome: held, no_gain (the finding cleared, but the "
    "workload gained less than policy.min_fix_gain), did_not_hold, unverified (no fresh "
    "evidence by the deadline), gave_up.",
    ("outcome",),
    "remediator",
)
REMEDIATOR_LANDINGS = _m(
    "remediator_landings_total",
    "counter",
    "Where evicted pods' replacements were scheduled, judged with their verification: "
    "planned (a node whose zone the plan found to fit), elsewhere_aligned (another node, "
    "and the fix held), elsewhere_misaligned (another node, and it did not).",
    ("outcome",),
    "remediator",
)
REMEDIATOR_FIX_GAIN = _m(
    "remediator_fix_gain_ratio",
    "histogram",
    "What fixes gained, by finding kind: the workload's GPU work (SM activity of its devices, "
    "weighted by their SMs) after / before, over the verification period on either side "
    "of the action; where no GPU activity is measured, its share of local memory after / "
    "before. Over 1: faster. Fixes whose gain could not be measured are not counted.",
    ("kind",),
    "remediator",
    (0.5, 0.8, 0.9, 1.0, 1.05, 1.1, 1.25, 1.5, 2.0, 3.0, 5.0, 10.0),
)
REMEDIATOR_ERRORS = _m(
    "remediator_cycle_errors_total",
    "counter",
    "Cycles that took no action because their data was doubtful, by reason.",
    ("reason",),
    "remediator",
)
REMEDIATOR_DROPPED_ROWS = _m(
    "remediator_dropped_rows_total",
    "counter",
    "Rows of Prometheus answers not used, by reason: missing_label, bad_value (not a "
    "finite, non-negative number), bad_label (a node, pod_uid, gpu_uuid or mig_uuid that "
    "is no name, as no exporter writes it), duplicate (a series answered more than once, "
    "as Prometheus never does: every copy).",
    ("reason",),
    "remediator",
)
REMEDIATOR_REJECTED = _m(
    "remediator_rejected_pods",
    "gauge",
    "A workload's pods the kubelet refused at admission for NUMA alignment and left "
    "Failed, on one node, by reason (TopologyAffinityError, SMTAlignmentError).",
    ("namespace", "workload", "node", "reason"),
    "remediator",
)
REMEDIATOR_DURATION = _m(
    "remediator_cycle_duration_seconds", "gauge", "Wall time of the last cycle.", (), "remediator"
)
REMEDIATOR_LEADER = _m(
    "remediator_leader", "gauge", "1 while this replica leads.", (), "remediator"
)
REMEDIATOR_PAUSED = _m(
    "remediator_paused", "gauge", "1 while remediation is paused.", (), "remediator"
)
REMEDIATOR_LAST_SUCCESS = _m(
    "remediator_last_success_timestamp_seconds",
    "gauge",
    "When a remediation cycle last completed.",
    (),
    "remediator",
)


def series_names() -> set[str]:
    """Every name a query (an alert's, a dashboard's, the remediator's) may select: each
    metric's, a histogram's _bucket, _sum, _count; never a detail metric's, which an
    exporter exports only with --detail."""
    return {name for spec in CATALOGUE.values() if not spec.detail for name in spec.series}
