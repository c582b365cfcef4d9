"""The remediator's own metrics (``/metrics`` of the controller); names, help and labels
from the metric catalogue, like every other numaguard metric."""

from __future__ import annotations

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
)

from numaguard.common.process import ProcessCollector
from numaguard.contract import catalogue as c
from numaguard.remediator.core.guards import GUARDS
from numaguard.remediator.core.history import LANDINGS
from numaguard.remediator.core.kinds import KINDS
from numaguard.remediator.core.relayout import PHASES


class Metrics:
    def __init__(self) -> None:
        disable_created_metrics()  # *_created series are not in the catalogue: noise
        r = self.registry = CollectorRegistry()
        ProcessCollector(registry=r)  # process_* (catalogue group "process")

        def make(spec: c.MetricSpec):
            if spec.kind == "histogram":
                return Histogram(
                    spec.name, spec.help, list(spec.labels), registry=r, buckets=spec.buckets
                )
            cls = Counter if spec.kind == "counter" else Gauge
            # prometheus_client adds the _total of a counter itself
            name = spec.name.removesuffix("_total") if spec.kind == "counter" else spec.name
            return cls(name, spec.help, list(spec.labels), registry=r)

        self.findings = make(c.REMEDIATOR_FINDINGS)
        self.unremediable = make(c.REMEDIATOR_UNREMEDIABLE)
        self.actions = make(c.REMEDIATOR_ACTIONS)
        self.refusals = make(c.REMEDIATOR_REFUSALS)
        self.verifications = make(c.REMEDIATOR_VERIFICATIONS)
        self.landings = make(c.REMEDIATOR_LANDINGS)
        self.fix_gain = make(c.REMEDIATOR_FIX_GAIN)
        self.errors = make(c.REMEDIATOR_ERRORS)
        self.dropped_rows = make(c.REMEDIATOR_DROPPED_ROWS)
        self.duration = make(c.REMEDIATOR_DURATION)
        self.leader = make(c.REMEDIATOR_LEADER)
        self.paused = make(c.REMEDIATOR_PAUSED)
        self.last_success = make(c.REMEDIATOR_LAST_SUCCESS)
        self.rejected = make(c.REMEDIATOR_REJECTED)
        self.relayouts = make(c.REMEDIATOR_MIG_RELAYOUTS)
        for guard in GUARDS:  # every guard and outcome starts at 0, so rate() sees the first
            self.refusals.labels(guard)
        for outcome in ("held", "no_gain", "did_not_hold", "unverified", "gave_up"):
            self.verifications.labels(outcome)
        for outcome in LANDINGS:
            self.landings.labels(outcome)
        for kind in KINDS:
            self.fix_gain.labels(kind)
        for phase in PHASES:
            self.relayouts.labels(phase)
        for reason in ("missing_label", "bad_value", "bad_label", "duplicate"):
            self.dropped_rows.labels(reason)
