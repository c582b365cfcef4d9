"""What each NUMA node can still give (the remediator's fit check), and moving pods'
memory home in place."""

from __future__ import annotations

from numaguard.contract.catalogue.spec import (
    declare,
)

# -- what each NUMA node can still give (the remediator's fit check) ---------------------
ZONE_CPUS_ALLOCATABLE = declare(
    "zone_cpus_allocatable",
    "gauge",
    "CPUs of the NUMA node the kubelet's CPU manager can hand out exclusively.",
    ("numa_node",),
    "capacity",
)
ZONE_CPUS_ALLOCATED = declare(
    "zone_cpus_allocated",
    "gauge",
    "CPUs of the NUMA node handed out exclusively to containers.",
    ("numa_node",),
    "capacity",
)
ZONE_CPUS_FREE_WHOLE_CORES = declare(
    "zone_cpus_free_whole_cores",
    "gauge",
    "Free CPUs of the NUMA node whose core's every thread is free: what the CPU manager "
    "can still give a pod as whole cores (full-pcpus-only). Only on SMT nodes.",
    ("numa_node",),
    "capacity",
)
ZONE_L3_MOST_FREE_CPUS = declare(
    "zone_l3_most_free_cpus",
    "gauge",
    "The most free CPUs of any one L3 cache of the NUMA node: the largest pod the CPU "
    "manager can still give one cache (prefer-align-cpus-by-uncorecache). Only where a "
    "NUMA node has several L3 caches.",
    ("numa_node",),
    "capacity",
)
ZONE_DEVICES_ALLOCATABLE = declare(
    "zone_devices_allocatable",
    "gauge",
    "Devices of an extended resource on the NUMA node (numa_node empty: the kubelet "
    "places them on none, or on several); a DRA driver's devices (its ResourceSlices' "
    "GPUs and slices) under the driver's name, on their GPU's NUMA node.",
    ("numa_node", "resource"),
    "capacity",
)
ZONE_DEVICES_FREE = declare(
    "zone_devices_free",
    "gauge",
    "Devices of an extended resource on the NUMA node not allocated to any container.",
    ("numa_node", "resource"),
    "capacity",
)
ZONE_MEMORY_ALLOCATABLE = declare(
    "zone_memory_allocatable_bytes",
    "gauge",
    "Memory of the NUMA node the kubelet's memory manager can hand out (present only "
    "with the memory manager).",
    ("numa_node",),
    "capacity",
)
ZONE_MEMORY_FREE = declare(
    "zone_memory_free_bytes",
    "gauge",
    "Memory of the NUMA node not yet handed out by the memory manager.",
    ("numa_node",),
    "capacity",
)

ZONE_GPU_FREE_SET = declare(
    "zone_gpu_free_set",
    "gauge",
    "1 for the best link level a set of size full GPUs not yet handed out reaches on "
    "the NUMA node (numa_node empty: anywhere on the node): its worst pair, nvlink, pix, "
    "pxb, phb, node or sys as nvidia-smi topo -m names them. NCCL does P2P only up to pxb. "
    "Sizes 2, 4 and 8 (a pod of 3 fits a set of 4 as well joined). Absent where no such "
    "set is free, or the kubelet's allocations are unknown; GPUs of a device plugin only.",
    ("numa_node", "size", "level"),
    "capacity",
)


# -- moving pods' memory home in place (--memory-mover; numaguard/exporter/mover/orders.py) --
MEMORY_MOVES = declare(
    "memory_moves_total",
    "counter",
    "Requests to move a pod's memory home (its numaguard.io/move-memory annotation) "
    "carried out, by result: moved, partial (some pages stayed: see the failures), failed "
    "(the kernel refused the move: see the log), refused (see the refusals).",
    ("result",),
    "memory_mover",
)
MEMORY_MOVE_REFUSALS = declare(
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
MEMORY_MOVED_PAGES = declare(
    "memory_moved_pages_total", "counter", "Pages moved home.", (), "memory_mover"
)
MEMORY_MOVED_BYTES = declare(
    "memory_moved_bytes_total", "counter", "Bytes moved home.", (), "memory_mover"
)
MEMORY_MOVE_FAILURES = declare(
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
MEMORY_MOVE_DURATION = declare(
    "memory_move_seconds_total",
    "counter",
    "Time spent moving, the rate's pauses included.",
    (),
    "memory_mover",
)
KUBELET_CPU_MANAGER_INFO = declare(
    "kubelet_cpu_manager_info",
    "gauge",
    "The kubelet's CPU manager, as its configuration file (--kubelet-config) says: its "
    "policy (none, static) and reservedSystemCPUs (empty: not set); value 1. Absent when "
    "the file is not there.",
    ("policy", "reserved_cpus"),
    "capacity",
)
KUBELET_CPU_MANAGER_OPTION = declare(
    "kubelet_cpu_manager_option",
    "gauge",
    "Each cpuManagerPolicyOptions entry of the kubelet's configuration file, with its "
    "value as written (full-pcpus-only: true, ...); value 1. An option it does not set is "
    "at the kubelet's default.",
    ("option", "setting"),
    "capacity",
)
