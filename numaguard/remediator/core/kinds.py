"""Each kind of finding, in one record (pure): what its evidence rests on, when it is
planned, what fixing it means, how the policy names it, what a fix must gain, what it
advises, and which queries find it, date it and verify it. The findings, queries,
planner, controller and outcome read these records; none spells a kind's traits itself.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from numaguard.contract import catalogue as c
from numaguard.contract.names import mig_resource
from numaguard.contract.reasons import (
    BREAKS_PAIR,
    CROSS_NUMA_REASONS,
    ISOLATION_OPTIONS,
    LINK_POOR_REASONS,
    MIG_SLICES,
    NO_P2P,
    SPLIT_CONTAINERS,
    STARVED_REASONS,
)

# The action that moves a pod's remote memory home in place (its node's exporter does,
# asked by an annotation on the pod): the remedy for remote memory where it can work
MIGRATE_MEMORY = "migrate_memory"
_RECREATE = "recreate it with CPUs, memory and devices on one NUMA node ({f.kind}: {f.reason})"


@dataclass(frozen=True)
class Kind:
    name: str
    priority: int  # planned in this order: placement first (it costs throughput now)
    depends_on: tuple[str, ...]  # collectors that must be fresh on the pod's node
    # evict | resize | recommend; ``recommend_for``: reasons for which it is recommend
    intent: str
    enforced_as: str  # its field in policy.enforcement
    min_gain: float  # the default of its field in policy.min_fix_gain
    advice: Callable[..., str]  # of a Finding (findings.py): what the recommendation says
    age: str  # the query saying how old the newest sample saying so is
    age_of: tuple[str, ...]  # the finding's fields that name its row there
    verified_by: c.MetricSpec  # the verdict verification reads for a replacement
    measured: str = "pod_uid"  # the finding's field naming the pod whose activity is the gain
    sustained: str = ""  # round one's queries, for the verdicts the exporter writes
    seen: str = ""
    # how many series say the verdict now, per exporter target, pod, reason (and device):
    # more than one is a contradiction, never evidence
    series: str = ""
    recommend_for: frozenset[str] = frozenset()
    # reasons about a device: the kubelet must attribute it to the pod, fresh
    device_reasons: frozenset[str] = frozenset()
    # every reason a finding of this kind may have; a series with another is no evidence
    reasons: frozenset[str] = frozenset()
    # its eviction is for a new NUMA placement: only a pod holding exclusive CPUs gets one
    fixes_placement: bool = False
    # its eviction is for GPUs that reach each other: the pod's full GPUs must find a free
    # set joined at P2P_UP_TO or better on one NUMA node
    joined_gpus: bool = False
    # reason -> the kubelet CPU manager option without which its eviction would repeat
    # the layout: the pod's node and its replacement's must run with it
    needs_option: Mapping[str, str] = field(default_factory=dict)

    def intent_of(self, reason: str) -> str:
        return "recommend" if reason in self.recommend_for else self.intent


CROSS_NUMA = Kind(
    "cross_numa",
    priority=0,
    depends_on=("host_numa", "pod_placement"),
    intent="evict",
    enforced_as="cross_numa",
    min_gain=1.1,
    advice=lambda f: _RECREATE.format(f=f),
    age="cross_numa_age",
    age_of=("pod_uid", "reason"),
    verified_by=c.POD_CROSS_NUMA,
    sustained="cross_numa_sustained",
    seen="cross_numa_seen",
    series="cross_numa_series",
    device_reasons=frozenset({"device_remote"}),
    reasons=frozenset(CROSS_NUMA_REASONS),
    fixes_placement=True,
)
STARVED = Kind(
    "starved",
    priority=1,
    depends_on=("pod_placement", "gpu", "pod_resources"),
    intent="evict",
    enforced_as="starved",
    min_gain=1.1,
    advice=lambda f: (
        _RECREATE.format(f=f)
        if f.reason not in STARVED.recommend_for
        else f"GPU starved by {f.reason} on an aligned pod: give the feeder more CPU"
    ),
    age="starved_age",
    age_of=("pod_uid", "reason", "device"),
    verified_by=c.GPU_STARVED,
    sustained="starved_sustained",
    seen="starved_seen",
    series="starved_series",
    # a CPU-bound feeder on an aligned pod: moving it fixes nothing
    recommend_for=frozenset(r.name for r in STARVED_REASONS if not r.movable),
    reasons=frozenset(r.name for r in STARVED_REASONS),
    fixes_placement=True,
)
# The fix for a split pod or for slices is in the workload's spec: what each says
_LINK_ADVICE = {
    NO_P2P: "recreate it where its GPUs are joined at PXB or better on one NUMA node",
    SPLIT_CONTAINERS: "put its GPUs in one container: NCCL cannot use CUDA IPC or NVLink "
    "between GPUs in different containers",
    MIG_SLICES: "give it full GPUs, or one larger slice: MIG slices do no P2P, not even two "
    "of one GPU",
}
# under DRA the scheduler picks a claim's GPUs by its selectors and constraints alone: a
# new pod gets a joined set only if the claim asks for one
CLAIM_LINK_ADVICE = (
    "add `constraints: [{{matchAttribute: resource.kubernetes.io/pcieRoot}}]` to its "
    "ResourceClaim (or its template) so that its GPUs share a PCIe root (gpu_link: {f.reason})"
)
GPU_LINK = Kind(
    "gpu_link",
    priority=2,
    depends_on=("gpu", "pod_resources"),
    intent="evict",
    enforced_as="gpu_link",
    min_gain=1.0,
    advice=lambda f: f"{_LINK_ADVICE[f.reason]} (gpu_link: {f.reason})",
    age="gpu_link_age",
    age_of=("pod_uid", "reason"),
    verified_by=c.POD_GPU_LINK_POOR,
    sustained="gpu_link_sustained",
    seen="gpu_link_seen",
    series="gpu_link_series",
    recommend_for=frozenset({SPLIT_CONTAINERS, MIG_SLICES}),
    # the kubelet must attribute the GPUs to the pod: its need is what it holds
    device_reasons=frozenset({NO_P2P}),
    reasons=frozenset(LINK_POOR_REASONS),
    joined_gpus=True,
)
# Advice only: NVIDIA's device plugin gives a pod of one GPU the first free one
# (go-gpuallocator scores nothing for one), so evicting it may land it on a pair again
GPU_FRAGMENTATION = Kind(
    "gpu_fragmentation",
    priority=6,
    depends_on=("gpu", "pod_resources"),
    intent="recommend",
    enforced_as="gpu_fragmentation",
    min_gain=0.0,
    advice=lambda f: (
        f"it holds half of the last GPU pair on its NUMA node of {f.node} joined well enough "
        "for P2P, which a multi-GPU pod without P2P needs: move it, or give multi-GPU "
        f"workloads nodes of their own (gpu_fragmentation: {f.reason})"
    ),
    age="gpu_fragmentation_age",
    age_of=("pod_uid", "reason"),
    verified_by=c.POD_GPU_FRAGMENTING,
    sustained="gpu_fragmentation_sustained",
    seen="gpu_fragmentation_seen",
    series="gpu_fragmentation_series",
    reasons=frozenset({BREAKS_PAIR}),
)
NOISY_NEIGHBOUR = Kind(
    "noisy_neighbour",
    priority=3,
    depends_on=("pod_placement", "resctrl", "gpu", "pod_resources"),
    intent="evict",
    enforced_as="noisy_neighbour",
    min_gain=1.05,
    advice=lambda f: f"move it off the L3 cache it crowds {f.feeder} out of (policy: recommend)",
    age="llc_age",
    age_of=("pod_uid", "device"),
    verified_by=c.POD_LLC_SHARE,
    measured="feeder_uid",  # the feeder it crowded out shows the gain
    reasons=frozenset({"llc"}),
)

# A pod's exclusive CPUs that share a core with a busy thread not its own, or span more L3
# caches than they need: the kubelet's CPU manager lays them out so, and does so again for
# a replacement unless its option says otherwise (core/isolation.py decides which)
CORE_ISOLATION = Kind(
    "core_isolation",
    priority=7,
    depends_on=("host_numa", "pod_placement", "pod_resources"),
    intent="evict",
    enforced_as="core_isolation",
    min_gain=1.05,
    advice=lambda f: f"recreate it on whole cores of one L3 cache (core_isolation: {f.reason})",
    age="core_isolation_age",
    age_of=("pod_uid", "reason"),
    verified_by=c.POD_CORE_ISOLATION,
    sustained="core_isolation_sustained",
    seen="core_isolation_seen",
    series="core_isolation_series",
    reasons=frozenset(ISOLATION_OPTIONS),
    fixes_placement=True,
    needs_option=ISOLATION_OPTIONS,
)


def _resize(kind: str, priority: int, min_gain: float) -> Kind:
    return Kind(
        kind,
        priority=priority,
        depends_on=("gpu", "pod_resources"),
        intent="resize",
        enforced_as="mis_sized",
        min_gain=min_gain,
        advice=lambda f: f"use {mig_resource(f.recommended)} instead of {f.profile} ({f.kind})",
        age="slice_age",
        age_of=("device",),
        verified_by=c.GPU_HOLDER,
        reasons=frozenset({kind}),
    )


UNDERSIZED = _resize("undersized", 4, 1.1)
# a shrink pays off by giving SMs back without slowing the job down much
OVERSIZED = _resize("oversized", 5, 0.9)

KINDS = {
    k.name: k
    for k in (
        CROSS_NUMA,
        STARVED,
        GPU_LINK,
        NOISY_NEIGHBOUR,
        OVERSIZED,
        UNDERSIZED,
        GPU_FRAGMENTATION,
        CORE_ISOLATION,
    )
}
# the kinds whose verdicts the exporter writes: found from their sustained and seen queries
PLACEMENT = tuple(k for k in KINDS.values() if k.seen)
RESIZED = tuple(k.name for k in KINDS.values() if k.intent == "resize")
