"""Whether a fix held (pure): judged on positive evidence only, from the answers to the
questions it asks, as detection is (core/rounds.py). A fix held when the pods that
replaced the one acted on have fresh series whose verdicts stayed 0 over the whole
verification period; it did not hold when they stayed 1. Neither, by the deadline:
unverified, which counts like a fix that did not hold. A fix that held with a measured
gain under the policy's minimum: no_gain, alike.

``verification`` is a generator: it yields its queries, is sent Prometheus's answers,
and returns the outcome (``progress``, alike, the gain so far of one not yet due);
``settled`` turns an outcome into the workload's next history and what is said of it."""

from __future__ import annotations

from collections.abc import Generator
from dataclasses import dataclass

from numaguard.contract.names import mig_resource
from numaguard.remediator.core import queries as q
from numaguard.remediator.core.actions import PodInfo
from numaguard.remediator.core.answers import Signals
from numaguard.remediator.core.evidence import Evidence
from numaguard.remediator.core.findings import Detection
from numaguard.remediator.core.history import (
    Pending,
    WorkloadHistory,
    after_verification,
    described,
    landing,
)
from numaguard.remediator.core.kinds import KINDS, NOISY_NEIGHBOUR, RESIZED
from numaguard.remediator.core.outcome import Activity, Gain, activities, gain, judged, mean
from numaguard.remediator.core.policy import Policy

_VERIFY_LABELS = ("node", "instance", "pod_uid")
# A replacement is a pod of the workload made after the action; creation times are the
# API server's, so allow for its clock being a little behind ours.
_CLOCK_SLACK_SECONDS = 2.0
# A gain so far is measured over a minute at least (half the period, when shorter):
# a few scrapes, not the first one.
_LEAST_PROGRESS_SECONDS = 60.0

# held | did_not_hold | unverified, or None: wait; what the pod that judges the fix did
# over the period, once the replacements' verdicts decided it; the replacements' nodes
Outcome = tuple[str | None, Activity | None, set[str]]
# the queries, and the labels each answer's rows must carry
Question = tuple[list[tuple[str, str]], dict[str, tuple[str, ...]]]


def due(history: WorkloadHistory, policy: Policy, now: float) -> list[Pending]:
    """The actions of ``history`` whose verification period is over, oldest first, no
    more than the policy lets be in flight (what a history holds beyond that, the
    remediator never wrote, and judging it costs nothing more)."""
    over = [x for x in history.pending if now - x.at >= policy.verify_after_seconds]
    return sorted(over, key=lambda x: x.at)[: policy.max_per_workload]


def replacements(pending: Pending, pods: list[PodInfo] | None) -> list[PodInfo]:
    """The running pods that judge ``pending``: those that replaced the pod acted on, or
    that pod itself when the fix kept it (its memory moved home in place)."""
    return [
        p
        for p in pods or []
        if (p.uid == pending.pod_uid) == pending.in_place
        and (pending.in_place or p.created >= pending.at - _CLOCK_SLACK_SECONDS)
        and p.phase == "Running"
    ]


def verification(
    pending: Pending,
    pods: list[PodInfo] | None,
    now: float,
    policy: Policy,
    detection: Detection,
    windows: q.Windows,
    selector: str,
) -> Generator[Question, Signals, Outcome]:
    """Judge ``pending`` from the workload's ``pods``: yields the queries, is sent their
    answers, returns the outcome."""
    late = now - pending.at >= policy.verify_deadline_seconds
    judging = replacements(pending, pods)
    if not judging:
        return ("unverified" if late else None), None, set()
    landed = {r.node for r in judging}
    period = policy.verify_after_seconds
    queries = q.verification_expressions(
        pending.kind, [r.uid for r in judging], f"{int(period)}s", selector
    )
    judges = _judges(pending, judging)
    activity = q.activity_expressions(judges, period, selector)
    # and whether the nodes of both can be believed: they may be any nodes
    nodes = q.scoped(q.NODE_EVIDENCE, "node", landed | {n for n, _ in judges}, windows, selector)
    required = {**q.REQUIRED_LABELS, **dict.fromkeys(queries, _VERIFY_LABELS)}
    signals = yield [*queries.items(), *activity, *nodes], required
    evidence = Evidence(signals, policy.stale_after_seconds)
    verdicts = [verdict(pending, r, signals, evidence, policy, detection) for r in judging]
    if "did_not_hold" in verdicts:
        outcome = "did_not_hold"
    elif all(v == "held" for v in verdicts):
        outcome = "held"
    else:
        return ("unverified" if late else None), None, landed
    return outcome, _measured(pending, judges, signals, evidence), landed


def progress(
    pending: Pending,
    pods: list[PodInfo] | None,
    now: float,
    policy: Policy,
    windows: q.Windows,
    selector: str,
) -> Generator[Question, Signals, Gain | None]:
    """The gain so far of ``pending`` while it waits to be judged: what its judges did
    since the action (a minute at least, or half the period; the whole period once it is
    over) against what was measured before it. Shown, never acted on: the outcome is the
    verification's. None: nothing to compare yet (no replacement running, no activity
    before, no fresh node, or no measure on both sides)."""
    elapsed = min(now - pending.at, policy.verify_after_seconds)
    judges = _judges(pending, replacements(pending, pods))
    least = min(_LEAST_PROGRESS_SECONDS, policy.verify_after_seconds / 2)
    if pending.before is None or not judges or elapsed < least:
        return None
    activity = q.activity_expressions(judges, elapsed, selector)
    nodes = q.scoped(q.NODE_EVIDENCE, "node", {n for n, _ in judges}, windows, selector)
    signals = yield [*activity, *nodes], dict(q.REQUIRED_LABELS)
    evidence = Evidence(signals, policy.stale_after_seconds)
    g = gain(pending.before, _measured(pending, judges, signals, evidence))
    return g if g.ratio is not None else None


def _judges(pending: Pending, judging: list[PodInfo]) -> list[tuple[str, str]]:
    """Whose activity measures the gain, (node, uid): the replacements, or the feeder
    a noisy neighbour crowded out, which stayed where it was."""
    if pending.kind == NOISY_NEIGHBOUR.name:
        return [(pending.before.node, pending.measured_uid)] if pending.before else []
    return [(r.node, r.uid) for r in judging]


def _measured(
    pending: Pending, judges: list[tuple[str, str]], signals: Signals, evidence: Evidence
) -> Activity | None:
    """The judges' activity as one, read only of nodes whose exporter is up and whose
    collectors are fresh."""
    instances = {
        node: evidence.instance(node)[0]
        for node, _ in judges
        if not evidence.node_stale(node, KINDS[pending.kind].depends_on)
    }
    measured = activities(signals, judges, instances)
    return mean([measured[uid] for _, uid in judges])


def verdict(
    pending: Pending,
    pod: PodInfo,
    signals: Signals,
    evidence: Evidence,
    policy: Policy,
    detection: Detection,
) -> str | None:
    """One replacement: held | did_not_hold | None (no fresh, whole-period evidence)."""
    instance, _ = evidence.instance(pod.node)
    if instance is None or evidence.node_stale(pod.node, KINDS[pending.kind].depends_on):
        return None

    def values(name: str) -> list[dict]:
        df = signals[name]
        rows = df[(df["pod_uid"] == pod.uid) & (df["node"] == pod.node)]
        return rows[rows["instance"] == instance].to_dict("records")

    ages = [r["value"] for r in values("age")]
    if not ages or min(ages) > policy.stale_after_seconds:
        return None
    throughout, peak = values("held_throughout"), values("peak")
    if not throughout or not peak:
        return None  # its series did not yet cover the whole period
    if pending.kind in RESIZED:
        wanted = mig_resource(pending.recommended)
        held = any(r.get("resource") == wanted for r in throughout)
        return "held" if held else "did_not_hold"
    limit = detection.llc_dominant_share if pending.kind == NOISY_NEIGHBOUR.name else 1
    if max(r["value"] for r in peak) < limit:
        return "held"  # no verdict of the finding's kind, of any reason, all period
    if max(r["value"] for r in throughout) >= limit:
        return "did_not_hold"  # one held at every scrape of the period
    return None


@dataclass(frozen=True, slots=True)
class Settled:
    """What a judged action comes to: its outcome (gave_up once the workload's failures
    reach the policy's limit), the gain measured, what the Event and log say, where its
    replacements landed against the plan ("" for none planned), the history after it."""

    outcome: str
    gain: Gain | None
    detail: str
    landing: str
    history: WorkloadHistory


def settled(
    pending: Pending,
    outcome: str,
    after: Activity | None,
    landed: set[str],
    history: WorkloadHistory,
    policy: Policy,
) -> Settled:
    g = gain(pending.before, after) if outcome != "unverified" else None
    outcome = judged(outcome, g, policy.min_fix_gain.of(pending.kind)) if g else outcome
    where = landing(pending, landed, outcome)
    history = after_verification(history, pending, outcome)
    if outcome != "held" and history.failures >= policy.give_up_after:
        outcome = "gave_up"
    detail = described(pending, g, after) if g else "no evidence by the deadline"
    return Settled(outcome, g, detail, where or "", history)
