"""The control loop: signals -> findings -> cluster state -> plan -> actuator, then the
verifier, once per interval, on the leader only. Doubtful data (Prometheus or the API
server not answering as they should) ends the cycle with no action."""

from __future__ import annotations

import contextlib
import logging
import time
from dataclasses import dataclass, field, replace

import aiohttp

from remediator.actuator import Actuator
from remediator.cluster import ClusterError, pods_of
from remediator.findings import Detection, Finding, FindingState, update
from remediator.kube import Kube
from remediator.leader import LeaderElector
from remediator.metrics import Metrics
from remediator.planner import Action, Plan, Policy, WorkloadHistory, plan
from remediator.signals import Prometheus, SignalsError

log = logging.getLogger(__name__)


@dataclass
class Pending:
    """An action waiting to be verified: did its workload's finding clear?"""

    workload: str
    kind: str
    reason: str
    at: float


@dataclass
class CycleReport:
    findings: list[Finding] = field(default_factory=list)
    plan: Plan | None = None
    results: list[tuple[Action, str]] = field(default_factory=list)
    verified: list[tuple[str, str]] = field(default_factory=list)  # (workload, outcome)
    error: str = ""
    leader: bool = True


class Controller:
    def __init__(
        self,
        prometheus: Prometheus,
        kube: Kube | None,
        policy: Policy,
        detection: Detection = Detection(),
        elector: LeaderElector | None = None,
        metrics: Metrics | None = None,
        verify_after_seconds: float = 900.0,
        clock=time.time,
    ) -> None:
        self.prometheus = prometheus
        self.kube = kube
        self.policy = policy
        self.detection = detection
        self.elector = elector
        self.metrics = metrics or Metrics()
        self.verify_after = verify_after_seconds
        self.clock = clock
        self.actuator = Actuator(kube, elector, clock) if kube else None
        self.state = FindingState()
        self.history: dict[str, WorkloadHistory] = {}
        self.pending: list[Pending] = []
        self.recommended: set[tuple] = set()  # said once per open finding, not each cycle
        self.refused: dict[tuple, str] = {}  # finding -> the guard its last Event named

    async def cycle(self, write: bool = True) -> CycleReport:
        """One cycle. ``write`` False: plan only (the ``plan`` command)."""
        started = time.monotonic()
        report = CycleReport()
        m = self.metrics
        if write and self.elector is not None:
            try:
                report.leader = await self.elector.acquire_or_renew()
            except (aiohttp.ClientError, OSError, TimeoutError) as err:
                report.leader = False  # cannot show we lead: we do not
                self._failed(report, "api_server", str(err) or type(err).__name__)
            m.leader.set(int(report.leader))
            m.paused.set(int(self.elector.paused))
            if not report.leader:
                return report
        try:
            signals = await self.prometheus.fetch(self.clock())
        except SignalsError as err:
            return self._failed(report, err.reason, str(err))
        self.state = update(self.state, signals, self.detection)
        report.findings = list(self.state.open.values())
        try:
            pods = await pods_of(self.kube, report.findings) if self.kube else {}
        except (ClusterError, aiohttp.ClientError, OSError, TimeoutError) as err:
            return self._failed(report, "api_server", str(err) or type(err).__name__)
        now = self.clock()
        policy = self.policy
        if self.elector is not None and self.elector.paused:
            policy = replace(policy, paused=True)
        if not write:
            policy = replace(policy, dry_run=True)
        report.plan = plan(report.findings, pods, signals, policy, self.history, now)
        for kind in ("cross_numa", "starved", "noisy_neighbour", "oversized", "undersized"):
            m.findings.labels(kind).set(sum(f.kind == kind for f in report.findings))
        m.unremediable.set(len(report.plan.unremediable))
        if write:
            await self._carry_out(report, pods, now)
            self._verify(report, pods, now)
        m.duration.set(time.monotonic() - started)
        m.last_success.set(self.clock())
        return report

    async def _carry_out(self, report: CycleReport, pods, now: float) -> None:
        open_keys = {f.key for f in report.findings}
        self.refused = {k: g for k, g in self.refused.items() if k in open_keys}
        for refusal in report.plan.refusals:
            self.metrics.refusals.labels(refusal.guard).inc()
            key = refusal.finding.key
            if self.actuator is None or self.refused.get(key) == refusal.guard:
                continue  # an Event when the reason changes, not one per cycle
            self.refused[key] = refusal.guard
            with contextlib.suppress(aiohttp.ClientError, OSError, TimeoutError):
                await self.actuator.refused(refusal, pods.get(refusal.finding.pod_uid))
        self.recommended &= open_keys
        for action in report.plan.actions:
            if action.kind == "recommend":
                if action.finding.key in self.recommended:
                    continue
                self.recommended.add(action.finding.key)
            try:
                result = await self.actuator.act(action) if self.actuator else "no_api"
            except (aiohttp.ClientError, OSError, TimeoutError) as err:
                log.warning(
                    "%s of %s/%s failed: %r",
                    action.kind,
                    action.finding.namespace,
                    action.finding.pod,
                    err,
                )
                result = "failed"
            report.results.append((action, result))
            self.metrics.actions.labels(action.kind, result).inc()
            if result == "pdb_blocked":  # 429: its budget says not now; ask again later
                self.history.setdefault(action.pod.workload, WorkloadHistory()).last_action = now
            if result in ("evicted", "resized"):
                h = self.history.setdefault(action.pod.workload, WorkloadHistory())
                h.last_action = now
                h.in_flight += 1
                self.pending.append(
                    Pending(action.pod.workload, action.finding.kind, action.finding.reason, now)
                )

    def _verify(self, report: CycleReport, pods, now: float) -> None:
        """A fix holds when, a verification period after it, its workload shows no
        finding of the same kind; otherwise the workload backs off, then is given up."""
        still = {
            (pods[f.pod_uid].workload, f.kind, f.reason)
            for f in report.findings
            if f.pod_uid in pods
        }
        waiting = []
        for p in self.pending:
            if now - p.at < self.verify_after:
                waiting.append(p)
                continue
            h = self.history.setdefault(p.workload, WorkloadHistory())
            h.in_flight = max(0, h.in_flight - 1)
            if (p.workload, p.kind, p.reason) in still:
                h.failures += 1
                outcome = "gave_up" if h.failures >= self.policy.give_up_after else "did_not_hold"
            else:
                h.failures = 0
                outcome = "held"
            self.metrics.verifications.labels(outcome).inc()
            report.verified.append((p.workload, outcome))
            log.info("verification of %s: %s", p.workload, outcome)
        self.pending = waiting

    def _failed(self, report: CycleReport, reason: str, detail: str) -> CycleReport:
        log.warning("cycle skipped, no action: %s", detail, extra={"reason": reason})
        self.metrics.errors.labels(reason).inc()
        report.error = f"{reason}: {detail}"
        return report
