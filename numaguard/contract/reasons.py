"""The reasons of the exporter's verdicts: why a pod counts as cross-NUMA, and why and
when a GPU counts as starved by its host. The exporter decides them (model/), the
catalogue's help names them, and the remediator reads which of them moving a pod can
fix."""

from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType


@dataclass(frozen=True, slots=True)
class StarvedReason:
    """Why a GPU may be starved by its host: low utilization while this holds."""

    name: str
    measure: str  # what is compared with its threshold; for a verdict, which one
    default: float | None  # the threshold; None: the pod's cross-NUMA verdict decides
    movable: bool  # moving the pod to an aligned NUMA zone fixes it


# the reasons of numaguard_pod_cross_numa, each a verdict of the model
CROSS_NUMA_REASONS = ("cpu_span", "memory_remote", "device_remote")

STARVED_REASONS = (
    StarvedReason("device_remote", "the pod's cross-NUMA verdict device_remote", None, True),
    StarvedReason("memory_remote", "the pod's cross-NUMA verdict memory_remote", None, True),
    StarvedReason("cpu_throttled", "share of the pod's CFS periods throttled", 0.1, False),
    StarvedReason(
        "cpu_pressure",
        "share of time some task of the pod stalled waiting for CPU (PSI)",
        0.2,
        False,
    ),
    StarvedReason(
        "memory_pressure", "share of time some task of the pod stalled on memory (PSI)", 0.1, False
    ),
    StarvedReason(
        "remote_traffic",
        "share of the pod's memory traffic that crossed to another NUMA node (resctrl)",
        0.5,
        True,
    ),
)
# the reasons decided by a host signal against a threshold, with their defaults
STARVED_THRESHOLDS = MappingProxyType(
    {r.name: r.default for r in STARVED_REASONS if r.default is not None}
)

# the reasons of numaguard_pod_gpu_link_poor: why a pod's GPUs cannot reach each other
# peer to peer (exporter model/links.py decides them)
NO_P2P, SPLIT_CONTAINERS, MIG_SLICES = LINK_POOR_REASONS = (
    "no_p2p",
    "split_containers",
    "mig_slices",
)
# How two GPUs reach each other, best first: nvidia-smi topo -m's names (lowercase), which
# NCCL's NCCL_P2P_LEVEL uses too. NCCL uses P2P only up to pxb by default
# (src/graph/paths.cc, p2pLevel = PATH_PXB): the levels joined well enough for it.
LINK_LEVELS = ("nvlink", "pix", "pxb", "phb", "node", "sys")
P2P_UP_TO = "pxb"
JOINED_LEVELS = LINK_LEVELS[: LINK_LEVELS.index(P2P_UP_TO) + 1]
# the sizes of the free GPU sets the exporter reports: a pod of 3 fits a set of 4 as well
FREE_SET_SIZES = (2, 4, 8)
# numaguard_pod_gpu_fragmenting's reason: a single-GPU pod holds half of the only joined
# pairs left on its NUMA node
BREAKS_PAIR = "breaks_pair"
# a pod whose full GPUs move less than this over PCIe (bytes a second, both directions,
# all its GPUs) is not worth an eviction for a better-joined set: an idle pair loses nothing
LINK_TRAFFIC_BYTES_PER_SECOND = 1e9

# the reasons of numaguard_pod_core_isolation (exporter model/isolation.py): a pod's
# exclusive CPUs share a core with threads not its own, or span more L3 caches than
# their count needs
SMT_SHARED, L3_SPAN = "smt_shared", "l3_span"
# whose a thread beside a pod's exclusive CPU is: the kubelet's reserved CPUs, another
# container's exclusive CPUs, or the shared pool
SHARED_WITH = ("reserved", "exclusive", "shared_pool")
# the busy share above which a thread beside a pod's exclusive CPUs, not its own, counts
# as a noisy neighbour in the core: an idle sibling does no harm
SIBLING_BUSY_RATIO = 0.5
# the kubelet's CPU manager option that keeps each reason from happening: whole cores
# only (GA in 1.33), and a pod's CPUs in as few L3 caches as it can (beta in 1.34)
ISOLATION_OPTIONS = {SMT_SHARED: "full-pcpus-only", L3_SPAN: "prefer-align-cpus-by-uncorecache"}
# the texts the kubelet reads as true for a CPU manager option (Go's strconv.ParseBool)
OPTION_TRUE = frozenset({"1", "t", "T", "TRUE", "true", "True"})
