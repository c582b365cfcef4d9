"""The remediator's decisions as a person reviews them (pure): the last cycle's findings,
each with its evidence (the verdict and how old its newest sample is) and what the
planner decided — the action with its target, or the guard that refused it and what
would lift it — the pods the kubelet refused, the actions awaiting verification with
their deadlines and gain so far, the latest outcomes, and the mode. What the leader's
``/decisions`` page draws, and serves as JSON."""

from __future__ import annotations

from collections.abc import Iterable

from numaguard.remediator.core.cycle_report import CycleReport, Verification
from numaguard.remediator.core.guards import LIFTS
from numaguard.remediator.core.outcome import Gain
from numaguard.remediator.core.policy import Policy
from numaguard.remediator.core.rejections import describe


def decisions(
    report: CycleReport, outcomes: Iterable[tuple[float, Verification]], policy: Policy
) -> dict:
    plan = report.plan
    decided: dict[tuple, dict] = {}
    if plan is not None:
        for action in plan.actions:
            decided[action.finding.key] = {
                "decision": action.kind,
                "detail": action.detail,
                "dry_run": action.dry_run,
                "nodes": list(action.nodes),
            }
        for refusal in plan.refusals:
            decided[refusal.finding.key] = {
                "decision": "refused",
                "guard": refusal.guard,
                "detail": refusal.detail,
                "lifts": LIFTS.get(refusal.guard, ""),
            }
        for finding in plan.ignored:
            decided[finding.key] = {"decision": "ignored", "detail": "policy.enforcement"}
    return {
        "at": report.at,
        "mode": {
            "leader": report.leader,
            "dry_run": report.dry_run,
            "paused": report.paused,
        },
        "error": report.error,
        "warning": report.warning,
        "findings": [
            {
                "kind": f.kind,
                "reason": f.reason,
                "namespace": f.namespace,
                "pod": f.pod,
                "pod_uid": f.pod_uid,
                "node": f.node,
                "device": f.device,
                "instance": f.instance,
                # the verdict's newest sample: how old (None: none says it now)
                "evidence_age_seconds": report.ages.get(f.key),
                **decided.get(f.key, {"decision": "not planned", "detail": ""}),
            }
            for f in sorted(report.findings, key=lambda f: (f.kind, f.namespace, f.pod))
        ],
        "rejected": [
            {
                "workload": s.workload,
                "node": s.node,
                "reason": s.reason,
                "pods": len(s.pods),
                "deleting": len(s.delete),
                "held_back": s.guard,
                "said": describe(s),
            }
            for s in report.storms
        ],
        "pending": [
            {
                "workload": workload,
                "kind": p.kind,
                "reason": p.reason,
                "acted_at": p.at,
                "judged_from": p.at + policy.verify_after_seconds,
                "deadline": p.at + policy.verify_deadline_seconds,
                "in_place": p.in_place,
                **_so_far(report.progress.get((workload, p.at, p.pod_uid))),
            }
            for workload, p in report.pending
        ],
        "outcomes": [
            {
                "at": at,
                "workload": v.workload,
                "kind": v.kind,
                "outcome": v.outcome,
                "gain": v.gain.ratio if v.gain else None,
                "detail": v.detail,
            }
            for at, v in reversed(list(outcomes))
        ],
    }


def _so_far(g: Gain | None) -> dict:
    """A pending action's gain so far, and what it compares: none until measured."""
    return {"gain_so_far": g.ratio if g else None, "gain_so_far_detail": g.detail if g else ""}
