"""The typed records the readers' results are gathered into and the model consumes:
what each source read this cycle. Pure data: sources fill them, the model reads them,
and neither the model nor the collectors import a source."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from numaguard.exporter.readers.cgroup import CpuThrottling, Pressure
from numaguard.exporter.readers.cpu import CpuTime
from numaguard.exporter.readers.kubeletconfig import KubeletConfig
from numaguard.exporter.readers.numa import NodeMeminfo
from numaguard.exporter.readers.nvml import GPM_UTILIZATION
from numaguard.exporter.readers.podresources import Allocatable, PodResources
from numaguard.exporter.readers.resctrl import MonValues

UTILIZATION_KINDS = tuple(GPM_UTILIZATION)


# Why a file could not be used; the collection adds "timeout" and "internal".
# not_regular: a FIFO, device or socket where a kernel file should be (sysfs, procfs and
# cgroupfs files are all regular): never opened for reading, it could block or not end
READ_FAILURES = ("missing", "permission", "io", "parse", "oversized", "not_regular")


@dataclass(frozen=True, slots=True)
class Issue:
    reason: str  # one of READ_FAILURES, a source's own (Collector.errors), "timeout" or "internal"
    path: str
    detail: str = ""


@dataclass(slots=True)
class ContainerReading:
    pod_uid: str
    container_id: str
    runtime: str  # containerd | cri-o | docker | "" when the cgroup name does not say
    qos_class: str
    cpus: frozenset[int] | None
    memory_by_node: dict[int, int] | None  # bytes
    throttling: CpuThrottling | None
    pressure: dict[str, Pressure]  # by resource; empty where PSI is absent
    tasks_file: str  # the cgroup file listing its thread ids (read by the resctrl source)


@dataclass(frozen=True, slots=True)
class PodsReading:
    containers: tuple[ContainerReading, ...]
    shared_pool: frozenset[int] | None  # CPUs of the shared pool, when known
    issues: list[Issue] = field(default_factory=list)
    over_limit: int = 0  # pods found, when more than the source may read: none read


@dataclass(frozen=True, slots=True)
class Activity:
    """What a GPU or slice did over the last interval."""

    utilization: Mapping[str, float]  # kind -> 0..1, only kinds measured this cycle
    supported: Mapping[str, bool]  # kind -> whether the device can measure it at all
    pcie_bytes_per_second: Mapping[str, float]  # tx / rx
    # all NVLinks together, tx / rx: a whole GPU's (GPM, else NVML's field values), empty
    # where not measured this cycle; whether they can be measured (None: unknown)
    nvlink_bytes_per_second: Mapping[str, float] = field(default_factory=dict)
    nvlink_supported: bool | None = None


# a device whose utilization NVML cannot give
UNSUPPORTED = Activity({}, dict.fromkeys(UTILIZATION_KINDS, False), {}, {}, False)


@dataclass(frozen=True, slots=True)
class Holder:
    """A pod container with a process on a device (from NVML's process list)."""

    pod_uid: str
    container_id: str


@dataclass(slots=True)
class SliceRecord:
    uuid: str
    profile: str  # 1g.10gb
    gi_id: int
    ci_id: int
    sm_count: int | None
    placement_start: int | None  # in memory slices of 8
    placement_size: int | None
    memory_total_bytes: int | None
    memory_used_bytes: int | None
    activity: Activity
    processes: int | None
    holders: tuple[Holder, ...]


@dataclass(frozen=True, slots=True)
class LinkRecord:
    """How a GPU reaches one of the GPUs after it (by index), as NVML says; None where
    NVML would not say."""

    peer: int
    level: str | None  # PCIe: pix | pxb | phb | node | sys (contract.reasons.LINK_LEVELS)
    p2p_read: int | None  # nvmlGpuP2PStatus_t: 0 is OK
    p2p_write: int | None
    p2p_nvlink: int | None
    nvlinks: int | None  # NVLinks joining the two directly


@dataclass(slots=True)
class GpuRecord:
    index: int
    uuid: str
    name: str
    pci_address: str  # sysfs form, 0000:18:00.0; "" when unknown
    numa_node: int | None
    up: bool
    down_reason: str  # "" when up; gpu_lost | timeout | nvml
    mig_enabled: bool | None = None
    memory_total_bytes: int | None = None
    memory_used_bytes: int | None = None
    power_watts: float | None = None
    temperature_celsius: float | None = None
    activity: Activity = UNSUPPORTED
    processes: int | None = None  # with MIG on: see the slices
    holders: tuple[Holder, ...] = ()
    slices: tuple[SliceRecord, ...] = ()
    # its root complex and the bridges down to it, from sysfs (readers.nvml.pci_chain)
    pci_chain: tuple[str, ...] | None = None
    links: tuple[LinkRecord, ...] = ()  # to each GPU after it
    nvswitch_links: int | None = None  # its NVLinks to NVSwitches (0: none); None unknown
    nvlinks: int | None = None  # its active NVLinks of any kind; None unknown


@dataclass(frozen=True, slots=True)
class GpuReading:
    gpus: tuple[GpuRecord, ...]
    issues: list[Issue] = field(default_factory=list)
    driver_version: str = ""  # "" when NVML would not say
    nvml_version: str = ""


@dataclass(frozen=True, slots=True)
class NumaNodeReading:
    id: int
    cpus: frozenset[int] | None
    distances: tuple[int, ...] | None
    meminfo: NodeMeminfo | None
    numastat: dict[str, int] | None


@dataclass(frozen=True, slots=True)
class L3Domain:
    """One L3 cache instance: resctrl names its monitoring directory mon_L3_<id>."""

    id: int
    cpus: frozenset[int]
    size_bytes: int


@dataclass(frozen=True, slots=True)
class HostReading:
    nodes: tuple[NumaNodeReading, ...]
    socket_of_cpu: dict[int, int]
    l3_domains: dict[int, L3Domain]
    balancing: dict[str, int]  # vmstat NUMA-balancing counters; empty when absent
    issues: list[Issue] = field(default_factory=list)
    core_of_cpu: dict[int, frozenset[int]] = field(default_factory=dict)  # its core's CPUs
    smt_active: bool | None = None  # None: the kernel does not say
    cpu_times: dict[int, CpuTime] | None = None  # /proc/stat; None: not read


@dataclass(frozen=True, slots=True)
class KubeletReading:
    pods: tuple[PodResources, ...] | None  # None: the kubelet did not answer (see issues)
    allocatable: Allocatable | None  # None also for kubelets without GetAllocatableResources
    issues: list[Issue] = field(default_factory=list)
    config: KubeletConfig | None = None  # its config file's; None: not read


@dataclass(frozen=True, slots=True)
class ResctrlReading:
    mode: str  # the mode in effect: manage | read-only | off | unavailable
    num_rmids: int | None = None
    rmids_used: int | None = None
    # whole-node values per L3 domain, and per NUMA node under Sub-NUMA Clustering
    domains: dict[int, MonValues] = field(default_factory=dict)
    snc_nodes: dict[int, MonValues] = field(default_factory=dict)
    # pod uid -> L3 domain -> what its monitoring group read
    pods: dict[str, dict[int, MonValues]] = field(default_factory=dict)
    unmonitored: frozenset[str] = frozenset()  # pod uids left without a group
    # cumulative since start: values the kernel would not give, by reason, and
    # group creations refused for want of RMIDs
    unreadable_total: dict[str, int] = field(default_factory=dict)
    rmid_exhaustions_total: int = 0
    # the kernel said this cycle (EBUSY) that the RMIDs not in use wait in limbo: freed,
    # but still counting cache lines of the group that had them
    rmids_in_limbo: bool = False
    # ABMC only: L3 domain -> (assignable counters, of which free), and the domains
    # whose totals leave out some group's traffic for want of a counter
    mbm_counters: dict[int, tuple[int, int]] = field(default_factory=dict)
    partial_domains: frozenset[int] = frozenset()
    issues: list[Issue] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class PodMeta:
    """What the API server says about a pod: names, and container id -> container name;
    its DRA ResourceClaims, by the claim object's name, with the containers using each;
    and the request to move its memory home it carries, if any (mover/orders.py)."""

    namespace: str
    name: str
    containers: Mapping[str, str] = field(default_factory=dict)
    claims: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    move_memory: str = ""
