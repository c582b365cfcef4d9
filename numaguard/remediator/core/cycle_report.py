"""What one remediation cycle found, planned, did and verified (pure): the controller
fills it, `plan` prints it, the demos and tests read it."""

from __future__ import annotations

from dataclasses import dataclass, field

from numaguard.remediator.core.actions import Action, Plan
from numaguard.remediator.core.findings import Finding
from numaguard.remediator.core.history import Pending
from numaguard.remediator.core.outcome import Gain
from numaguard.remediator.core.rejections import Storm
from numaguard.remediator.core.relayout import Recommendation, Step


@dataclass(frozen=True)
class Verification:
    workload: str
    kind: str  # of the finding the fix was for
    outcome: str  # held | no_gain | did_not_hold | unverified | gave_up
    gain: Gain | None  # None: judged without evidence (unverified)
    detail: str  # what was measured, as the Event says it
    landing: str = ""  # an eviction's: where its replacement went (history.landing)


@dataclass
class CycleReport:
    findings: list[Finding] = field(default_factory=list)
    plan: Plan | None = None
    results: list[tuple[Action, str]] = field(default_factory=list)
    verified: list[Verification] = field(default_factory=list)
    storms: list[Storm] = field(default_factory=list)  # pods the kubelet refused, grouped
    # MIG layouts that would serve the slices sizing wants, and the re-layout steps taken
    layouts: list[Recommendation] = field(default_factory=list)
    relayouts: list[tuple[Step, str]] = field(default_factory=list)
    error: str = ""
    leader: bool = True
    warning: str = ""  # the cycle ran, but something a person should fix made it blind
    at: float = 0.0  # when it planned
    dry_run: bool = True  # the mode it planned in
    paused: bool = False
    # each finding's evidence: the age of the newest sample saying so (finding.key ->
    # seconds; absent: none)
    ages: dict[tuple, float] = field(default_factory=dict)
    # the actions awaiting verification, by workload, as their histories say
    pending: list[tuple[str, Pending]] = field(default_factory=list)
    # the gain so far of those not judged this cycle, (workload, at, pod_uid) -> gain:
    # shown, never acted on (absent: nothing to compare yet)
    progress: dict[tuple[str, float, str], Gain] = field(default_factory=dict)
