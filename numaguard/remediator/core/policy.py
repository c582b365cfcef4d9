"""The policy (pure): every guard's setting and each finding kind's mode and least
gain, validated; what the remediator's flags and config file set."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args

from numaguard.remediator.core.kinds import (
    CORE_ISOLATION,
    CROSS_NUMA,
    GPU_LINK,
    KINDS,
    NOISY_NEIGHBOUR,
    OVERSIZED,
    STARVED,
    UNDERSIZED,
)
from numaguard.remediator.core.relayout import MigLayout
from numaguard.remediator.core.validation import (
    FORBID_EXTRA,
    Count,
    Factor,
    Flag,
    Names,
    NonNegative,
    Seconds,
)

# What to do about a kind of finding: act on it (evict or resize, under every guard and
# dry-run), only recommend (an Event and the log say what would help), or ignore it.
Mode = Literal["act", "recommend", "ignore"]
MODES: tuple[str, ...] = get_args(Mode)


@dataclass(frozen=True)
class Enforcement:
    """The mode of each kind of finding; mis_sized is both oversized and undersized."""

    __pydantic_config__ = FORBID_EXTRA

    cross_numa: Mode = "act"
    starved: Mode = "act"
    # no_p2p acts; split_containers and mig_slices are always recommendations
    gpu_link: Mode = "act"
    gpu_fragmentation: Mode = "recommend"  # advice only, whatever it says
    noisy_neighbour: Mode = "act"
    mis_sized: Mode = "act"
    # evicts only where the kubelet's option keeps the new layout whole (core/isolation.py)
    core_isolation: Mode = "act"
    # pods the kubelet refused for alignment (rejections.py): act deletes the surplus
    topology_affinity_error: Mode = "act"

    def of(self, kind: str) -> str:
        return getattr(self, KINDS[kind].enforced_as)


@dataclass(frozen=True)
class FixGain:
    """The least gain (outcome.py: the workload's GPU work, or share of local memory,
    after / before) a fix of each kind must show to count as paid off; 0: any. The
    defaults are the kinds' own (kinds.py)."""

    __pydantic_config__ = FORBID_EXTRA

    cross_numa: NonNegative = CROSS_NUMA.min_gain
    starved: NonNegative = STARVED.min_gain
    gpu_link: NonNegative = GPU_LINK.min_gain
    noisy_neighbour: NonNegative = NOISY_NEIGHBOUR.min_gain
    undersized: NonNegative = UNDERSIZED.min_gain
    oversized: NonNegative = OVERSIZED.min_gain
    core_isolation: NonNegative = CORE_ISOLATION.min_gain

    def of(self, kind: str) -> float:
        return getattr(self, kind)


@dataclass(frozen=True)
class Policy:
    __pydantic_config__ = FORBID_EXTRA

    dry_run: Flag = True
    paused: Flag = False
    max_per_cycle: Count = 5
    max_per_node: Count = 1
    max_per_namespace: Count = 2
    max_per_workload: Count = 1  # actions in flight (not yet verified) per workload
    cooldown_seconds: Seconds = 1800.0  # after an action on a workload
    backoff_factor: Factor = 2.0  # cooldown grows so after each fix that did not hold
    give_up_after: Count = 3  # failed fixes of a workload before it is left alone
    min_pod_age_seconds: Seconds = 600.0
    stale_after_seconds: Seconds = 30.0  # two scrape intervals
    protected_namespaces: Names = ("kube-system",)
    allow_local_storage: Flag = False
    pdb_retry_seconds: Seconds = 300.0  # after a 429, doubled at each one in a row ...
    pdb_backoff_max_seconds: Seconds = 21600.0  # ... up to this
    pdb_blocked_after: Count = 3  # 429s in a row before the finding is reported pdb_blocked
    verify_after_seconds: Seconds = 900.0  # how long a fix must be seen holding
    verify_deadline_seconds: Seconds = 3600.0  # no verdict by then: unverified
    enforcement: Enforcement = Enforcement()
    min_fix_gain: FixGain = FixGain()  # a fix that cleared its finding with less: no_gain
    keep_rejected_pods: Count = 3  # of a workload's pods rejected on a node, for diagnosis
    max_rejected_deletes_per_cycle: Count = 100  # they run nothing, but the API server does
    mig_layout: MigLayout = MigLayout()  # the GPU Operator's MIG manager (core/relayout.py)

    def __post_init__(self) -> None:
        """What holds across fields, here so that a Policy built in code is held to it
        as one from the config file is."""
        if self.verify_deadline_seconds < self.verify_after_seconds:
            raise ValueError(
                f"verify_deadline_seconds ({self.verify_deadline_seconds:g}) must be at least "
                f"verify_after_seconds ({self.verify_after_seconds:g})"
            )
        # kube-system is protected whatever the list says; each name once
        protected = tuple(dict.fromkeys(("kube-system", *self.protected_namespaces)))
        object.__setattr__(self, "protected_namespaces", protected)
