"""The remediator's own metrics (``/metrics`` of the controller)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge

from remediator.planner import GUARDS

PREFIX = "numaguard_remediator_"


class Metrics:
    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        self.findings = Gauge(PREFIX + "findings", "Open findings by kind.", ["kind"], registry=r)
        self.unremediable = Gauge(
            PREFIX + "unremediable_findings",
            "Open findings no NUMA zone anywhere can take aligned.",
            registry=r,
        )
        self.actions = Counter(
            PREFIX + "actions",
            "Actions carried out, by kind (evict, resize, recommend) and result.",
            ["kind", "result"],
            registry=r,
        )
        self.refusals = Counter(
            PREFIX + "refusals",
            "Actions refused, by the guard that refused.",
            ["guard"],
            registry=r,
        )
        self.verifications = Counter(
            PREFIX + "verifications",
            "Fixes checked after the fact: held, did_not_hold, gave_up.",
            ["outcome"],
            registry=r,
        )
        self.errors = Counter(
            PREFIX + "cycle_errors",
            "Cycles that took no action because their data was doubtful, by reason.",
            ["reason"],
            registry=r,
        )
        self.duration = Gauge(
            PREFIX + "cycle_duration_seconds", "Wall time of the last cycle.", registry=r
        )
        self.leader = Gauge(PREFIX + "leader", "1 while this replica leads.", registry=r)
        self.paused = Gauge(PREFIX + "paused", "1 while remediation is paused.", registry=r)
        self.last_success = Gauge(
            PREFIX + "last_success_timestamp_seconds",
            "When a cycle last completed.",
            registry=r,
        )
        for guard in GUARDS:
            self.refusals.labels(guard)  # every guard starts at 0
