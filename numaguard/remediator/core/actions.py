"""What the planner hands on (pure): the pods it judged, as far as its guards need them,
the actions it planned and the refusals it recorded; and a workload's history once an
action was taken, as the actuator reports it."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from numaguard.remediator.core.claims import ClaimRef
from numaguard.remediator.core.findings import Finding
from numaguard.remediator.core.history import DONE, Pending, WorkloadHistory, measured_uid
from numaguard.remediator.core.kinds import MIGRATE_MEMORY
from numaguard.remediator.core.outcome import Activity
from numaguard.remediator.core.reach import Placement

DRA = "resource.k8s.io"  # in PodInfo.resources: the pod has ResourceClaims


@dataclass(frozen=True)
class PodInfo:
    """What the API server says about a pod, as far as the guards need it."""

    namespace: str
    name: str
    uid: str
    node: str
    created: float  # seconds since the epoch
    owner_kind: str = ""  # of the controller owner reference; "" for a bare pod
    owner_name: str = ""
    workload: str = ""  # kind/namespace/name of the top owner (Deployment, StatefulSet...)
    workload_annotations: dict[str, str] = field(default_factory=dict)
    annotations: dict[str, str] = field(default_factory=dict)
    priority: int = 0
    priority_class: str = ""
    local_storage: bool = False  # emptyDir or hostPath volumes
    mirror: bool = False  # a static pod's mirror
    phase: str = "Running"
    mismatch: str = ""  # why the API server's objects contradict each other (owner uids)
    history: WorkloadHistory | None = None  # as kept on its workload
    # extended resources its containers request (nvidia.com/gpu, nvidia.com/mig-...), and
    # DRA when it has ResourceClaims
    resources: frozenset[str] = frozenset()
    # where its replacement may be scheduled (its owner's template); None: unknown
    placement: Placement | None = None
    requests: dict[str, float] = field(default_factory=dict)  # its own, given back once gone
    # the matchLabels of the controller that makes its replacements (steering finds them
    # by it); empty when its selector has expressions
    selector: dict[str, str] = field(default_factory=dict)
    claims: tuple[ClaimRef, ...] = ()  # its ResourceClaims, with the profiles they select
    # the claim the scheduler made for its extended resources (a DeviceClass's
    # extendedResourceName: DRA behind nvidia.com/mig-*); "": a device plugin's
    extended_claim: str = ""
    # with one: the extended resources DeviceClasses map, cluster-wide
    mapped: frozenset[str] = frozenset()


@dataclass(frozen=True)
class Action:
    kind: str  # evict | resize | migrate_memory | recommend
    finding: Finding
    pod: PodInfo | None
    detail: str
    dry_run: bool
    # an eviction's: the nodes whose zones fit and that its replacement may reach,
    # roomiest first (where steering sends it)
    nodes: tuple[str, ...] = ()


@dataclass(frozen=True)
class Refusal:
    finding: Finding
    guard: str
    detail: str


@dataclass(frozen=True)
class Plan:
    actions: tuple[Action, ...]
    refusals: tuple[Refusal, ...]
    ignored: tuple[Finding, ...] = ()  # of kinds the policy says to ignore

    @property
    def unremediable(self) -> tuple[Finding, ...]:
        return tuple(r.finding for r in self.refusals if r.guard == "no_fit")


def after_action(
    h: WorkloadHistory | None,
    action: Action,
    result: str,
    now: float,
    before: Activity | None = None,
) -> WorkloadHistory:
    """The workload's history once ``action`` ended in ``result``; ``before``: what the
    pod whose activity judges the fix did before it."""
    h = h or WorkloadHistory()
    f = action.finding
    if result == DONE.get(action.kind):
        pending = Pending(
            f.kind,
            f.reason,
            now,
            action.pod.uid,
            f.recommended,
            measured_uid(f),
            before,
            action.nodes,
            action.kind == MIGRATE_MEMORY,
        )
        return replace(h, last_action=now, pending=(*h.pending, pending), pdb_refusals=0)
    if result == "pdb_blocked":
        return replace(h, pdb_refusals=h.pdb_refusals + 1, last_refusal=now)
    return h
