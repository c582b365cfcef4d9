"""The control loop: signals -> findings -> cluster state -> plan -> actuator, then the
verifier, once per interval, on the leader only. Doubtful data (Prometheus or the API
server not answering as they should) ends the cycle with no action.

Everything a guard needs to remember lives in the cluster (the workloads' history,
written by the actuator): this object keeps only what saves repeating an Event, the open
findings' hysteresis, and which slices to follow between two looks for slices to size."""

from __future__ import annotations

import contextlib
import logging
import time
from collections import deque
from collections.abc import Generator
from dataclasses import asdict, replace

import aiohttp

from numaguard.contract.names import STEER_ANNOTATION
from numaguard.remediator.actuator import RECORDED_FIRST, Actuator
from numaguard.remediator.cluster import (
    ClusterError,
    nodes_of,
    pending_workloads,
    pods_of,
    rejected_pods,
    workload_pods,
)
from numaguard.remediator.core import queries as q
from numaguard.remediator.core.actions import Action, PodInfo, after_action
from numaguard.remediator.core.answers import Signals
from numaguard.remediator.core.capacity import Capacity
from numaguard.remediator.core.cycle_report import CycleReport, Verification
from numaguard.remediator.core.evidence import Evidence
from numaguard.remediator.core.findings import Detection, Finding, FindingState
from numaguard.remediator.core.history import (
    DONE,
    Pending,
    WorkloadHistory,
    measured_uid,
)
from numaguard.remediator.core.kinds import KINDS
from numaguard.remediator.core.outcome import Activity, Gain, activities
from numaguard.remediator.core.planner import nodes_to_check, plan, prepare
from numaguard.remediator.core.policy import Policy
from numaguard.remediator.core.rejections import Storm, describe, storms
from numaguard.remediator.core.rounds import Round, Sizing, rounds
from numaguard.remediator.core.steering import Steer, Target, steerable
from numaguard.remediator.core.verification import (
    Outcome,
    due,
    progress,
    settled,
    verification,
)
from numaguard.remediator.kube import Kube
from numaguard.remediator.leader import LeaderElector
from numaguard.remediator.metrics import Metrics
from numaguard.remediator.relayouts import relayout
from numaguard.remediator.signals import Prometheus, SignalsError

log = logging.getLogger(__name__)
_TRANSPORT = (aiohttp.ClientError, OSError, TimeoutError)
RECENT_OUTCOMES = 50  # verifications the decision page keeps


class Controller:
    def __init__(
        self,
        prometheus: Prometheus,
        kube: Kube | None,
        policy: Policy,
        detection: Detection = Detection(),
        elector: LeaderElector | None = None,
        metrics: Metrics | None = None,
        clock=time.time,
    ) -> None:
        self.prometheus = prometheus
        self.kube = kube
        self.policy = policy
        self.detection = detection
        self.elector = elector
        self.metrics = metrics or Metrics()
        self.clock = clock
        self.actuator = Actuator(kube, elector, clock, policy.dry_run) if kube else None
        self.state = FindingState()
        # what the decision page shows: the last cycle's report, and the latest outcomes
        self.last_report: CycleReport | None = None
        self.outcomes: deque[tuple[float, Verification]] = deque(maxlen=RECENT_OUTCOMES)
        self.said: dict[tuple, str] = {}  # finding -> the Event last written about it
        # workloads whose verification was refused last cycle, and why (said once)
        self.verify_refused: dict[str, tuple[str, str]] = {}  # workload -> (guard, why)
        self.storms_said: dict[tuple, str] = {}  # a storm -> the Event last written on it
        self.layouts_said: dict[str, str] = {}  # a family or node -> what was last said
        self.sizing = Sizing()  # the slices to size, carried between looks for them
        # where the steering webhook is served (run --steer); None: replacements go
        # wherever the scheduler sends them
        self.steering: Target | None = None

    async def cycle(self, write: bool = True) -> CycleReport:
        """One cycle. ``write`` False: plan only (the ``plan`` command)."""
        started = time.monotonic()
        report = CycleReport(at=self.clock(), dry_run=self.policy.dry_run or not write)
        if write:
            self.last_report = report
        m = self.metrics
        if write and self.elector is not None:
            report.leader = self.elector.leading
            m.leader.set(int(report.leader))
            m.paused.set(int(self.elector.paused))
            if not report.leader:
                return report
        try:
            rejected = await rejected_pods(self.kube) if self.kube else []
        except (ClusterError, *_TRANSPORT) as err:
            return self._failed(report, "api_server", str(err) or type(err).__name__)
        try:
            signals, self.state = await self._gather(self.clock(), rejected)
        except SignalsError as err:
            return self._failed(report, err.reason, err.detail)
        for (query, reason), n in signals.dropped.items():
            m.dropped_rows.labels(reason).inc(n)
            log.warning(
                "%d rows of %s dropped: %s",
                n,
                query,
                reason,
                extra={"query": query, "reason": reason},
            )
        targets = signals["exporter_targets"]
        if len(targets) > 1:  # node and pod names of two clusters would be taken as one's
            clusters = sorted(targets["cluster"])  # (a row without one has it "")
            return self._failed(
                report,
                "clusters",
                f"the exporters' series come from {len(clusters)} clusters "
                f"({', '.join(repr(c) for c in clusters)}): set prometheus.cluster "
                "(--cluster) to the one this remediator acts on",
            )
        report.findings = list(self.state.open.values())
        if not targets["value"].sum():
            report.warning = (
                f"no exporter target matches the selector {self.prometheus.selector}: no "
                "finding can be made; set prometheus.selector (--selector) to the exporters' "
                "job, as `count by (job) (numaguard_build_info)` names it"
            )
            log.warning(report.warning, extra={"selector": self.prometheus.selector})
        try:
            pods = await pods_of(self.kube, report.findings) if self.kube else {}
        except (ClusterError, *_TRANSPORT) as err:
            return self._failed(report, "api_server", str(err) or type(err).__name__)
        now = self.clock()
        policy = self.policy
        if self.elector is not None and self.elector.paused:
            policy = replace(policy, paused=True)
        if not write:
            policy = replace(policy, dry_run=True)
        history = {p.workload: p.history for p in pods.values() if p.history}
        prepared = prepare(report.findings, signals, policy)
        report.paused = policy.paused
        for f in report.findings:
            age = prepared.evidence.sample_age(f)
            if age is not None:
                report.ages[f.key] = age
        try:
            wanted = nodes_to_check(report.findings, pods, prepared, policy)
            nodes = await nodes_of(self.kube, wanted) if self.kube and wanted else {}
        except (ClusterError, *_TRANSPORT) as err:
            return self._failed(report, "api_server", str(err) or type(err).__name__)
        report.plan = plan(report.findings, pods, signals, policy, history, now, nodes, prepared)
        evidence = Evidence(signals, policy.stale_after_seconds, set())
        report.storms = storms(rejected, Capacity.from_signals(signals, set(), evidence), policy)
        m.rejected.clear()
        for storm in report.storms:
            m.rejected.labels(storm.namespace, storm.workload, storm.node, storm.reason).set(
                len(storm.pods)
            )
        for kind in KINDS:
            m.findings.labels(kind).set(sum(f.kind == kind for f in report.findings))
        m.unremediable.set(len(report.plan.unremediable))
        if write and self.actuator is not None:
            await self._carry_out(report, pods, history, now)
            if self.actuator.stopping():  # SIGTERM: the rest waits for the next leader
                m.duration.set(time.monotonic() - started)
                return report
            await self._clear_storms(report.storms)
            try:
                await relayout(
                    self.kube,
                    self.actuator,
                    self.metrics,
                    self.layouts_said,
                    report,
                    pods,
                    policy,
                    now,
                )
            except (ClusterError, *_TRANSPORT) as err:
                self._failed(report, "mig_layout", str(err) or type(err).__name__)
            if not policy.paused and not policy.dry_run:  # a verification writes its outcome
                try:
                    await self._verify(report)
                    await self.actuator.collect_templates()  # those resizes replaced
                except (ClusterError, SignalsError, *_TRANSPORT) as err:
                    self._failed(report, "verification", str(err) or type(err).__name__)
        m.duration.set(time.monotonic() - started)
        m.last_success.set(self.clock())
        return report

    async def _gather(self, at: float, rejected=()) -> tuple[Signals, FindingState]:
        """The cycle's answers, asked round by round as core.rounds composes them, and
        the findings they leave open. Every round shares one answer budget."""
        p = self.prometheus
        budget = [p.max_answer_bytes]
        asked = Round(
            p.windows,
            p.selector,
            self.detection,
            self.policy,
            await p.recorded(at),
            [pod.need for pod in rejected],
        )
        composing = rounds(asked, self.state, self.sizing)
        queries = next(composing)
        while True:
            answers = await p.fetch_set(queries, at=at, budget=budget)
            try:
                queries = composing.send(answers)
            except StopIteration as done:
                found, state, self.sizing = done.value
                return found, state

    async def _carry_out(self, report: CycleReport, pods, history, now: float) -> None:
        open_keys = {f.key for f in report.findings}
        self.said = {k: v for k, v in self.said.items() if k in open_keys}
        for refusal in report.plan.refusals:
            self.metrics.refusals.labels(refusal.guard).inc()
            if self._said_before(refusal.finding, refusal.guard):
                continue  # an Event when the reason changes, not one per cycle
            pod = pods.get(refusal.finding.pod_uid)
            _log_decision("refused", refusal.finding, pod, refusal.guard, refusal.detail)
            with contextlib.suppress(*_TRANSPORT):
                await self.actuator.refused(refusal, pod)
        for finding in report.plan.ignored:
            if not self._said_before(finding, "ignored"):
                pod = pods.get(finding.pod_uid)
                _log_decision("ignored", finding, pod, "none", "policy.enforcement: ignore")
        acting = [a for a in report.plan.actions if not a.dry_run and a.kind != "recommend"]
        measured = await self._before(acting, now)
        for action in report.plan.actions:
            if action.dry_run and self._said_before(action.finding, action.kind):
                continue  # advice and dry runs: said once per open finding
            before = history.get(action.pod.workload)
            activity = measured.get(measured_uid(action.finding))
            intent = (
                None
                if action.dry_run
                else after_action(before, action, DONE[action.kind], now, activity)
            )
            if intent is not None and action.kind == "evict":
                await self._steer(action, now)
            try:
                result = await self.actuator.act(action, intent)
            except _TRANSPORT as err:
                log.warning("%s failed: %r", action.kind, err)
                result = "failed"
            if action.kind in RECORDED_FIRST and result not in (
                DONE[action.kind],
                "dry_run",
                "not_leader",
            ):
                # the intent may have been written (not when stopped before it: then
                # this writes the history as it was): put down what really happened
                with contextlib.suppress(*_TRANSPORT):
                    await self.actuator.record(
                        action.pod.workload, after_action(before, action, result, now)
                    )
            report.results.append((action, result))
            self.metrics.actions.labels(action.kind, result).inc()
            _log_decision(result, action.finding, action.pod, action.kind, action.detail)

    async def _steer(self, action: Action, now: float) -> None:
        """Before an eviction: its replacement is steered to the nodes the plan found,
        when steering is on (the API server then calls the webhook for it)."""
        if self.steering is None or not action.nodes:
            return
        pod = action.pod
        steer = Steer(
            pod.workload,
            pod.selector,
            action.nodes,
            pod.workload_annotations.get(STEER_ANNOTATION) == "required",
            now + self.policy.verify_deadline_seconds,
        )
        result = steerable(steer)
        if result is None:
            try:
                result = await self.actuator.steer(self.steering, now, add=(steer,))
            except _TRANSPORT as err:  # evicted unsteered: as with steering off
                result = f"failed: {err!r}"
        log.info(
            "steering %s to %s: %s",
            pod.workload,
            ",".join(action.nodes),
            result,
            extra={
                "decision": "steer",
                "workload": pod.workload,
                "nodes": list(action.nodes),
                "required": steer.required,
                "result": result,
            },
        )

    async def _before(self, actions: list[Action], now: float) -> dict[str, Activity]:
        """What the pods that will judge these actions did over the verification period
        before them; nothing when Prometheus cannot say now (the fix is then judged by
        its finding alone: no gain measured)."""
        pods = {(a.finding.node, measured_uid(a.finding)) for a in actions}
        if not pods:
            return {}
        instances = {a.finding.node: a.finding.instance for a in actions}
        queries = q.activity_expressions(
            pods, self.policy.verify_after_seconds, self.prometheus.selector
        )
        try:
            signals = await self.prometheus.fetch_set(queries, q.ACTIVITY_LABELS, now)
        except (SignalsError, *_TRANSPORT) as err:
            log.warning("activity before the actions not measured: %s", err)
            return {}
        return activities(signals, pods, instances)

    async def _clear_storms(self, storms: list[Storm]) -> None:
        """An Event on each workload whose pods the kubelet keeps refusing, when what it
        says changes; then the surplus failed pods deleted."""
        self.storms_said = {s.key: self.storms_said.get(s.key, "") for s in storms}
        for storm in storms:
            if storm.guard == "ignored":
                continue
            newest = storm.pods[0]
            text = describe(storm)
            if self.storms_said[storm.key] != text:
                self.storms_said[storm.key] = text
                log.info(
                    "%s: %s",
                    storm.workload,
                    text,
                    extra={
                        "decision": "rejected_pods",
                        "workload": storm.workload,
                        "node": storm.node,
                        "reason": storm.reason,
                        "rejected": len(storm.pods),
                        "deleting": len(storm.delete),
                        "dry_run": storm.dry_run,
                    },
                )
                pod = PodInfo(
                    newest.namespace,
                    newest.name,
                    newest.uid,
                    storm.node,
                    newest.created,
                    workload=storm.workload,
                )
                # on the workload; on the pod where its owner is no workload we know
                on_owner = storm.guard != "unsupported_owner"
                with contextlib.suppress(*_TRANSPORT):
                    await self.actuator.event(pod, "AdmissionRejections", text, "Warning", on_owner)
            if storm.dry_run:
                continue
            for pod in storm.delete:
                try:
                    result = await self.actuator.delete_rejected(pod)
                except _TRANSPORT as err:
                    log.warning("delete failed: %r", err)
                    result = "failed"
                self.metrics.actions.labels("delete", result).inc()
                log.info(
                    "%s %s/%s: rejected by the kubelet (%s)",
                    result,
                    pod.namespace,
                    pod.name,
                    pod.reason,
                    extra={
                        "decision": result,
                        "action": "delete",
                        "namespace": pod.namespace,
                        "pod": pod.name,
                        "pod_uid": pod.uid,
                        "node": pod.node,
                        "workload": pod.workload,
                        "reason": pod.reason,
                    },
                )

    def _said_before(self, finding: Finding, what: str) -> bool:
        if self.said.get(finding.key) == what:
            return True
        self.said[finding.key] = what
        return False

    async def _verify(self, report: CycleReport) -> None:
        """Judge the actions awaiting verification (core/verification.py judges; this
        reads the workloads and their pods, asks Prometheus and writes the outcomes)."""
        now = self.clock()
        refused: dict[str, tuple[str, str]] = {}
        pending = await pending_workloads(self.kube)
        report.pending = [
            (workload, p)
            for workload, (history, _) in sorted(pending.items())
            if history is not None
            for p in history.pending
        ]
        if self.steering is not None:  # steering ends with the wait for verification
            with contextlib.suppress(*_TRANSPORT):
                await self.actuator.steer(self.steering, now, pending=frozenset(pending))
        for workload, (history, obj) in pending.items():
            # each workload inside its own boundary: whatever is wrong with one (its
            # history unreadable, anything unexpected in judging it) is that workload's
            # refusal, and the others are still verified
            try:
                if history is None:
                    refused[workload] = ("evidence_mismatch", "its history is unreadable")
                    continue
                await self._verify_workload(workload, history, obj, report, now)
            except (ClusterError, *_TRANSPORT):
                raise  # the API server's trouble: the cycle's, not this workload's
            except Exception as err:  # numaguard's own defect, not the evidence's
                log.exception("verification of %s failed", workload)
                refused[workload] = ("internal", f"{type(err).__name__}: {err}")
        for workload, (guard, why) in refused.items():
            self.metrics.refusals.labels(guard).inc()
            if self.verify_refused.get(workload) != (guard, why):  # said once, until it changes
                log.warning(
                    "verification of %s refused: %s",
                    workload,
                    why,
                    extra={"workload": workload, "guard": guard, "detail": why},
                )
        self.verify_refused = refused

    async def _verify_workload(
        self, workload: str, history: WorkloadHistory, obj: dict, report: CycleReport, now: float
    ) -> None:
        p = self.policy
        if not history.pending:
            return
        pods = await workload_pods(self.kube, workload, obj)
        pending_now = due(history, p, now)
        changed, waiting = history, [x for x in history.pending if x not in pending_now]
        for pending in pending_now:
            outcome, after, landed = await self.outcome(pending, pods, now)
            if outcome is None:
                waiting.append(pending)  # not yet: the evidence is not in
                continue
            s = settled(pending, outcome, after, landed, changed, p)
            changed = s.history
            if s.landing:
                self.metrics.landings.labels(s.landing).inc()
            if s.gain and s.gain.ratio is not None:
                self.metrics.fix_gain.labels(pending.kind).observe(s.gain.ratio)
            self.metrics.verifications.labels(s.outcome).inc()
            verified = Verification(workload, pending.kind, s.outcome, s.gain, s.detail, s.landing)
            report.verified.append(verified)
            self.outcomes.append((now, verified))
            log.info(
                "verification of %s: %s (%s)",
                workload,
                s.outcome,
                s.detail,
                extra={
                    "workload": workload,
                    "outcome": s.outcome,
                    "finding": pending.kind,
                    "gain": s.gain.ratio if s.gain else None,
                    "min_gain": p.min_fix_gain.of(pending.kind),
                    "landing": s.landing or None,
                    "planned_nodes": list(pending.nodes),
                    "nodes": sorted(landed),
                    # every signal measured on either side, host-side ones too
                    "before": asdict(pending.before) if pending.before else None,
                    "after": asdict(after) if after else None,
                },
            )
        for pending in waiting:  # what those not judged yet have gained so far
            so_far = await self.gain_so_far(pending, pods, now)
            if so_far is not None:
                report.progress[(workload, pending.at, pending.pod_uid)] = so_far
        if changed is not history:
            await self._record_verification(workload, changed, report)

    async def _record_verification(
        self, workload: str, history: WorkloadHistory, report: CycleReport
    ) -> None:
        await self.actuator.record(workload, history)
        namespace, name = workload.split("/")[1:]
        mine = [v for v in report.verified if v.workload == workload]
        text = "; ".join(f"{v.outcome}: {v.detail}" for v in mine)
        owner = PodInfo(namespace, name, "", "", 0.0, workload=workload)
        with contextlib.suppress(*_TRANSPORT):
            await self.actuator.event(
                owner,
                "RemediationVerified",
                f"{text} ({history.failures} failed in a row)",
                "Normal" if mine[-1].outcome == "held" else "Warning",
                owner=True,
            )

    async def outcome(self, pending: Pending, pods: list[PodInfo] | None, now: float) -> Outcome:
        """core.verification's judgement of ``pending``, its questions answered by
        Prometheus."""
        judging = verification(pending, pods, now, self.policy, self.detection, *self._where())
        return await self._ask(judging, now)

    async def gain_so_far(
        self, pending: Pending, pods: list[PodInfo] | None, now: float
    ) -> Gain | None:
        """core.verification's gain so far of ``pending``, not judged yet."""
        return await self._ask(progress(pending, pods, now, self.policy, *self._where()), now)

    def _where(self) -> tuple[q.Windows, str]:
        return self.prometheus.windows, self.prometheus.selector

    async def _ask(self, judging: Generator, now: float):
        """Run one of core.verification's generators: its one question answered by
        Prometheus, its answer returned."""
        try:
            queries, required = next(judging)
            judging.send(await self.prometheus.fetch_set(queries, required, now))
        except StopIteration as done:
            return done.value
        raise AssertionError("a verification asks one question")

    def _failed(self, report: CycleReport, reason: str, detail: str) -> CycleReport:
        log.warning("cycle skipped, no action: %s", detail, extra={"reason": reason})
        self.metrics.errors.labels(reason).inc()
        report.error = f"{reason}: {detail}"
        return report


def _log_decision(result: str, f: Finding, pod: PodInfo | None, what: str, detail: str) -> None:
    log.info(
        "%s %s/%s: %s",
        result,
        f.namespace,
        f.pod,
        detail,
        extra={
            "decision": result,
            "action": what,
            "finding": f.kind,
            "reason": f.reason,
            "namespace": f.namespace,
            "pod": f.pod,
            "pod_uid": f.pod_uid,
            "node": f.node,
            "workload": pod.workload if pod else "",
        },
    )
