"""A cycle's questions to Prometheus, round by round (pure): each round asks only about
what the rounds before it named, so the answers grow with the findings, not with the
cluster. ``rounds`` is a generator: it yields each round's queries and is sent their
answers; the controller does the asking (its one I/O), and a test can drive it with
answers of its own.

1. the verdicts (and, every ``sizing_every_cycles``, the slices to size);
2. what the verdicts' pods, slices and nodes need to be findings (ages, sustained
   windows not recorded by a rule, slices' use, LLC where GPUs starve);
3. what the finding pods hold; 4. the zones that could take them (and the pods the
   kubelet refused); 5. those zones' room, whether the nodes named can be believed,
   which of the nodes of pods with remote memory can move it home in place, and, where
   cores are shared or caches spanned, how those nodes' kubelets hand out CPUs.
"""

from __future__ import annotations

from collections.abc import Generator, Iterable
from dataclasses import dataclass, replace

from numaguard.contract.names import mig_resource
from numaguard.remediator.core import queries as q
from numaguard.remediator.core.answers import Signals, merged
from numaguard.remediator.core.capacity import CAPACITY_DEPENDS_ON, holdings, need_of
from numaguard.remediator.core.findings import Detection, FindingState, update
from numaguard.remediator.core.kinds import CORE_ISOLATION, KINDS, PLACEMENT, STARVED
from numaguard.remediator.core.needs import Need
from numaguard.remediator.core.planner import intent_of
from numaguard.remediator.core.policy import Policy


@dataclass(frozen=True)
class Sizing:
    """The slices whose sizing window said too large or too small when last looked for
    (None: not yet), their GPUs (whose models size them), and how many cycles ago."""

    slices: frozenset[str] | None = None
    gpus: frozenset[str] = frozenset()
    since: int = 0


@dataclass(frozen=True)
class Round:
    """What the rounds are asked with, besides the answers."""

    windows: q.Windows
    selector: str
    detection: Detection
    policy: Policy
    recorded: frozenset[str] = frozenset()  # expressions Prometheus records for us
    rejected: Iterable[Need] = ()  # the needs of pods the kubelet refused


Rounds = Generator[q.Queries, Signals, tuple[Signals, FindingState, Sizing]]


def rounds(asked: Round, state: FindingState, sizing: Sizing) -> Rounds:
    """Yields each round's queries, is sent their answers; returns every answer merged,
    the findings they leave open, and what to size from now on."""
    w, selector, d = asked.windows, asked.selector, asked.detection

    def scoped(names, label: str, values) -> q.Queries:
        return q.scoped(names, label, values, w, selector)

    size_now = sizing.slices is None or sizing.since >= w.sizing_every_cycles
    thresholds = (d.low_utilization, d.saturated, d.memory_full) if size_now else None
    found = yield q.detection(w, selector, asked.recorded, thresholds)
    if size_now:
        candidates = found["slice_candidates"]
        sizing = Sizing(
            frozenset(candidates["mig_uuid"]),
            frozenset(candidates.get("gpu_uuid", ())) - {""},
        )
    sizing = replace(sizing, since=sizing.since + 1)

    before = list(state.open.values())
    second: q.Queries = []
    for kind in PLACEMENT:
        sustained, seen = kind.sustained, kind.seen
        still = {f.pod_uid for f in before if f.kind == kind.name}
        named = {n for name in (sustained, seen) for n in found[name]["pod_uid"]}
        names = [kind.age]
        if sustained not in found.frames:  # no record of it: judged here
            names.append(sustained)
        second += scoped(names, "pod_uid", named | still)
        if seen not in found.frames:  # what keeps open findings open
            second += scoped([seen], "pod_uid", still)
    starved = {f.node for f in before if f.kind == STARVED.name}
    starved |= {n for name in (STARVED.sustained, STARVED.seen) for n in found[name]["node"]}
    second += scoped((*q.SLICES, "holders"), "mig_uuid", sizing.slices)
    second += scoped(["gpu_models"], "gpu_uuid", sizing.gpus)
    second += scoped(q.LLC, "node", starved)
    found = merged(found, (yield second))
    state = update(state, found, d)
    findings = list(state.open.values())

    uids = {f.pod_uid for f in findings}
    found = merged(found, (yield scoped(q.HOLDINGS, "pod_uid", uids)))
    held, needs = holdings(found, uids), []
    for f in findings:
        if intent_of(f) == "evict":
            needs.append(need_of(held, f.pod_uid, KINDS[f.kind].joined_gpus))
        elif intent_of(f) == "resize":
            needs.append(Need(0.0, 0.0, {mig_resource(f.recommended): 1}))
    needs += asked.rejected  # where the kubelet would have admitted them
    policy = asked.policy
    # a resize through a claim template fits wherever a GPU's DRA counters leave room
    profiles = {f.recommended for f in findings if intent_of(f) == "resize" and f.recommended}
    zones = yield [
        *q.zone_candidates(
            needs,
            policy.max_per_cycle + 1,
            CAPACITY_DEPENDS_ON,
            policy.stale_after_seconds,
            selector,
        ),
        *scoped(["mig_profiles_free"], "mig_profile", {p for p in profiles if q.is_name(p)}),
    ]

    nodes = {f.node for f in findings} | set(zones["zone_candidates"]["node"])
    nodes |= set(zones["mig_profiles_free"]["node"])
    # whose exporters could move remote memory home in place
    movers = {f.node for f in findings if f.reason == "memory_remote"}
    isolated = any(f.kind == CORE_ISOLATION.name for f in findings)
    evidence = yield [
        *scoped((*q.ZONES, *q.NODE_EVIDENCE), "node", nodes),
        *scoped(["mover_age"], "node", movers),
        *scoped(q.ISOLATION, "node", nodes if isolated else ()),
    ]
    return merged(found, zones, evidence), state, sizing
