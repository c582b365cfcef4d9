"""The planner (pure): findings + cluster state + capacity + policy -> actions, each
refusal recorded with the name of the guard that refused it.

Every guard is named in core/guards.py, in the order they are checked; an eviction is planned
only when some NUMA zone, on some node, can take the pod aligned (its exclusive CPUs,
its memory and its devices on one NUMA node), and that capacity is then counted as
taken for the rest of the cycle."""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Callable, Mapping
from typing import NamedTuple

import numpy as np

from numaguard.contract.names import AUTO_RESIZE_ANNOTATION, REQUEST_ANNOTATION, mig_resource
from numaguard.contract.reasons import SMT_SHARED
from numaguard.remediator.core.actions import DRA, Action, Plan, PodInfo, Refusal
from numaguard.remediator.core.answers import Signals
from numaguard.remediator.core.capacity import Capacity
from numaguard.remediator.core.claims import SHARED, TEMPLATE, mechanism
from numaguard.remediator.core.evidence import Evidence
from numaguard.remediator.core.findings import Finding, shared_pool_advice
from numaguard.remediator.core.guards import CAP_GUARDS, POD_GUARDS, Asked, first_refusal
from numaguard.remediator.core.history import WorkloadHistory
from numaguard.remediator.core.isolation import ROOM, node_advice, option_on, refused_advice
from numaguard.remediator.core.kinds import (
    CLAIM_LINK_ADVICE,
    CROSS_NUMA,
    KINDS,
    MIGRATE_MEMORY,
    NOISY_NEIGHBOUR,
)
from numaguard.remediator.core.needs import Need
from numaguard.remediator.core.policy import Policy
from numaguard.remediator.core.reach import NODES_PER_FINDING, NodeFacts, excluded


def plan(
    findings: list[Finding],
    pods: dict[str, PodInfo],
    signals: Signals,
    policy: Policy,
    history: dict[str, WorkloadHistory],
    now: float,
    nodes: Mapping[str, NodeFacts],
    prepared: Prepared | None = None,
) -> Plan:
    """``pods``: by UID, the pods the findings name that the API server knows;
    ``history``: by workload, as read from the workloads this cycle; ``nodes``: by
    name, the nodes ``nodes_to_check`` named that the API server knows (a zone on any
    other node is not reachable: nothing is known of it); ``prepared``: what
    ``prepare`` read off these signals for these findings, when the caller has it."""
    evidence, capacity = prepared or prepare(findings, signals, policy)
    reach = _Reach(nodes)
    taken: Counter[str] = Counter()
    actions: list[Action] = []
    refusals: list[Refusal] = []
    acted: set[str] = set()  # one action per pod per cycle
    ignored: list[Finding] = []

    def decide(finding: Finding) -> None:
        mode = policy.enforcement.of(finding.kind)
        if mode == "ignore":
            ignored.append(finding)
            return
        pod = pods.get(finding.pod_uid)
        intent = intent_of(finding)
        # doubtful evidence stops even a recommendation (an Event in the pod's namespace)
        guard, detail = ("paused", "paused") if policy.paused else evidence.doubt(finding, pod)
        if guard is not None:
            refusals.append(Refusal(finding, guard, detail))
            return
        kind = KINDS[finding.kind]
        # a pod without exclusive CPUs is in the shared pool: no zone can promise it one
        shared_pool = intent == "evict" and kind.fixes_placement and not capacity.need(finding).cpus
        # GPUs of a ResourceClaim: its spec, not a new pod, decides how they are joined
        claimed = intent == "evict" and kind.joined_gpus and DRA in pod.resources
        # a layout the kubelet repeats unless its option says otherwise: said, not evicted
        option = kind.needs_option.get(finding.reason, "")
        repeated = ""
        if option and not shared_pool:
            guard, repeated = _repeated(finding, option, evidence, capacity, hurt)
            if guard is not None:
                refusals.append(Refusal(finding, guard, repeated))
                return
        if (
            mode == "recommend"
            or intent == "recommend"
            or shared_pool
            or claimed
            or repeated
            or (intent == "resize" and not _opted_in(pod))
        ):
            advice = repeated or kind.advice(finding)
            if shared_pool:
                advice = shared_pool_advice(finding)
            elif claimed:
                advice = CLAIM_LINK_ADVICE.format(f=finding)
            actions.append(Action("recommend", finding, pod, advice, True))
            return
        if finding.pod_uid in acted:
            return
        # the node that would move the pod's memory home in place; None: evict instead
        mover = _mover(finding, pod, evidence, reasons) if intent == "evict" else None
        asked = Asked(
            pod,
            policy,
            history.get(pod.workload),
            now,
            mover is not None,
            taken,
            intent == "resize",
        )
        guard, detail = first_refusal(POD_GUARDS, asked)
        if guard is None and finding.kind == NOISY_NEIGHBOUR.name:
            feeder = pods.get(finding.feeder_uid)
            if feeder is None or pod.priority >= feeder.priority:
                guard = "not_lower_priority"
                detail = f"not of lower priority than the starved {finding.feeder}"
        home = None  # (the zone of the pod's CPUs, the bytes to move there)
        if guard is None and mover is not None:
            guard, detail, home = _room_at_home(capacity, finding, mover)
        elif guard is None and intent == "evict":
            need = capacity.need(finding)
            # a pod holding exclusive CPUs or devices holds memory too: none known is
            # unknown, not 0 (a shared-pool pod's memory is bound to no NUMA node)
            if not need.memory and (need.cpus or need.devices):
                guard, detail = "stale_data", "no exporter says how much memory the pod holds"
            else:
                kept = _kept_whole(finding, option, evidence, capacity, room) if option else None
                target, steer, detail = _fit(capacity, reach, pod, need, kept)
                guard = "no_fit" if target is None else None
        elif guard is None and intent == "resize":
            how, claim = mechanism(pod.resources, pod.claims, finding.profile)
            if how == SHARED:
                guard = "shared_claim"
                detail = f"its slice is ResourceClaim {claim.claim}'s, which other pods may share"
            elif how == TEMPLATE or pod.extended_claim:
                # a new claim: wherever a GPU's DRA counters leave room (for a DRA
                # extended resource, one a DeviceClass maps to the new profile)
                wanted = mig_resource(finding.recommended)
                target = next(
                    (
                        node
                        for node in capacity.placement_nodes(finding.recommended)
                        if node in reach.nodes
                        and pod.placement is not None
                        and reach.why_not(pod, node) is None
                    ),
                    None,
                )
                if how != TEMPLATE and wanted not in pod.mapped:
                    guard, detail = "no_fit", f"no DeviceClass maps {wanted} (DRA)"
                elif target is None:
                    guard = "no_fit"
                    detail = f"no GPU's DRA counters leave room for a {finding.recommended}"
            else:
                target = capacity.free_slice(finding.recommended)
                if target is None:
                    guard, detail = "no_fit", f"no free {finding.recommended} slice in the cluster"
        if guard is None:
            guard, detail = first_refusal(CAP_GUARDS, asked)
        if guard is not None:
            refusals.append(Refusal(finding, guard, detail))
            return
        if home is not None:
            intent, steer = MIGRATE_MEMORY, ()
            zone, remote = home
            capacity.memory[zone] -= remote
            numa = capacity.name(zone)[1]
            detail = f"move {remote / 2**20:.0f} MiB of memory home to NUMA node {numa}, in place"
        elif intent == "evict":
            capacity.move(freed_in_time(pod), target, need)
            if option:  # the room in whole cores, or in one cache, is taken too
                wanted = room[ROOM[finding.reason]]
                wanted[capacity.name(target)] = wanted.get(capacity.name(target), 0) - need.cpus
            node, numa = capacity.name(target)
            reach.move(pod, node)
            detail = f"evict: fits aligned on {node} NUMA node {numa}"
        else:
            steer = ()
            if how == TEMPLATE or pod.extended_claim:
                capacity.take_placement(target, finding.recommended)
            else:
                capacity.take_slice(target, finding.recommended)
            detail = f"resize {finding.profile} -> {finding.recommended} ({pod.workload})"
        for key in (f"node/{pod.node}", f"ns/{pod.namespace}", f"wl/{pod.workload}", "all"):
            taken[key] += 1
        acted.add(finding.pod_uid)
        actions.append(Action(intent, finding, pod, detail, policy.dry_run, steer))

    reasons: dict[str, set[str]] = defaultdict(set)  # pod uid -> its cross-NUMA reasons
    hurt: Counter[tuple[str, str]] = Counter()  # (node, reason) -> pods it holds that have it
    for f in findings:
        if f.kind == CROSS_NUMA.name:
            reasons[f.pod_uid].add(f.reason)
        if KINDS[f.kind].needs_option:
            hurt[(f.node, f.reason)] += 1
    # (node, NUMA node) -> the CPUs a zone can give in whole cores, or in one L3 cache
    room = {query: _zone_values(signals[query]) for query in ROOM.values()}
    for finding in sorted(findings, key=_priority):
        try:
            decide(finding)
        except Exception as err:  # whatever one finding holds refuses it alone
            refusals.append(Refusal(finding, "internal", f"not planned: {err!r}"))
    return Plan(tuple(actions), tuple(refusals), tuple(ignored))


class Prepared(NamedTuple):
    """What planning reads off the signals, once a cycle: the evidence about the
    findings' pods and nodes, and every zone's room with what those pods hold."""

    evidence: Evidence
    capacity: Capacity


def prepare(findings: list[Finding], signals: Signals, policy: Policy) -> Prepared:
    uids = {f.pod_uid for f in findings}
    evidence = Evidence(signals, policy.stale_after_seconds, uids)
    return Prepared(evidence, Capacity.from_signals(signals, uids, evidence))


def freed_in_time(pod: PodInfo) -> str:
    """The pod's uid when what it holds is free before its replacement is admitted
    (counted as given back), else "". A StatefulSet makes the replacement, of the same
    name, only once the pod is gone. A ReplicaSet makes it at once: the scheduler and the
    kubelet place it while the evicted pod still terminates, holding its exclusive CPUs,
    memory and devices (a real kubelet admitted a replacement onto other CPUs 23 s before
    the evicted container's were released)."""
    return pod.uid if pod.workload.split("/")[0] == "StatefulSet" else ""


def nodes_to_check(
    findings: list[Finding], pods: dict[str, PodInfo], prepared: Prepared, policy: Policy
) -> list[str]:
    """The nodes whose reachability ``plan`` needs: for each finding it may evict for,
    the NODES_PER_FINDING roomiest nodes with a zone that fits it, and its own; for a
    resize, those with the most room for the new profile on their DRA counters."""
    evicting = [
        f for f in findings if f.pod_uid in pods and intent_of(f) == "evict" and not policy.paused
    ]
    capacity = prepared.capacity
    # its own node too: room others' evictions free there this cycle may fit it
    wanted = dict.fromkeys(pods[f.pod_uid].node for f in evicting)
    for f in evicting:
        zones = capacity.fitting(capacity.need(f), freed_in_time(pods[f.pod_uid]))
        wanted.update(dict.fromkeys(capacity.nodes(zones)[:NODES_PER_FINDING]))
    # a resize through a claim template: the nodes whose GPUs' counters leave room
    for f in findings:
        if f.pod_uid in pods and intent_of(f) == "resize" and f.recommended:
            wanted.update(
                dict.fromkeys(capacity.placement_nodes(f.recommended)[:NODES_PER_FINDING])
            )
    return [n for n in wanted if n]


# nodes with a fitting zone judged per finding before it is no_fit
_JUDGED_PER_FINDING = 4 * NODES_PER_FINDING


class _Reach:
    """Which nodes a pod's replacement may be scheduled to, with the requests this
    cycle's evictions free and take counted."""

    def __init__(self, nodes: Mapping[str, NodeFacts]) -> None:
        self.nodes = nodes
        self.change: dict[str, Counter] = defaultdict(Counter)  # node -> requests freed
        self._numbers: np.ndarray | None = None

    def numbers(self, capacity: Capacity) -> np.ndarray:
        """The nodes looked up, as ``capacity`` numbers its nodes."""
        if self._numbers is None:
            known = [i for i, n in enumerate(capacity.node_names) if n in self.nodes]
            self._numbers = np.array(known, dtype=np.int64)
        return self._numbers

    def why_not(self, pod: PodInfo, node: str) -> str | None:
        facts = self.nodes[node]
        back = self.change[node].copy()
        if node == pod.node and freed_in_time(pod):
            back.update(pod.requests)  # its own, once it is gone
        return excluded(pod.placement, facts, back)

    def move(self, pod: PodInfo, node: str) -> None:
        if freed_in_time(pod):
            self.change[pod.node].update(pod.requests)
        self.change[node].subtract(pod.placement.requests)


def _may_move(f: Finding, pod: PodInfo) -> bool:
    """Whether moving the pod's memory home in place may fix ``f``: remote memory, with
    no move tried on this pod yet (one that was and did not hold is evicted)."""
    return (
        f.kind == CROSS_NUMA.name
        and f.reason == "memory_remote"
        and REQUEST_ANNOTATION not in pod.annotations
    )


def _mover(
    f: Finding, pod: PodInfo, evidence: Evidence, reasons: Mapping[str, set[str]]
) -> str | None:
    """The node whose exporter will move the pod's memory home in place, when that is the
    remedy: remote memory alone (CPUs and devices placed right), and the node's memory
    mover on and reporting now; None: evict instead."""
    if not _may_move(f, pod) or reasons.get(f.pod_uid, set()) != {"memory_remote"}:
        return None
    return None if evidence.mover_off(f.node) else f.node


def _room_at_home(
    capacity: Capacity, f: Finding, node: str
) -> tuple[str | None, str, tuple[int, float] | None]:
    """(guard, why, None), or (None, "", (the zone of the pod's CPUs, the bytes to move
    there)) when that zone's free memory takes what the pod holds elsewhere."""
    held = {numa: v for (n, numa), v in capacity.held.get(f.pod_uid, {}).items() if n == node}
    homes = [numa for numa, (cpus, _, _) in held.items() if cpus]
    if len(homes) != 1:
        return "stale_data", "no exporter says on which one NUMA node the pod's CPUs are", None
    (home,) = homes
    remote = sum(memory for numa, (_, memory, _) in held.items() if numa != home)
    zone = capacity.index.get((node, home))
    if not remote or zone is None:
        missing = "memory outside NUMA node" if not remote else "free memory on NUMA node"
        return "stale_data", f"no exporter says the pod's {missing} {home}", None
    if capacity.memory[zone] < remote:
        return (
            "no_free_memory",
            (
                f"NUMA node {home} of {node} has {capacity.memory[zone] / 2**20:.0f} MiB free, "
                f"not the {remote / 2**20:.0f} MiB to move home"
            ),
            None,
        )
    return None, "", (zone, remote)


def _repeated(
    f: Finding, option: str, evidence: Evidence, capacity: Capacity, hurt: Mapping
) -> tuple[str | None, str]:
    """(guard, why) when no exporter says how ``f``'s node hands out CPUs; else (None,
    what to do instead of an eviction that would repeat the layout, "" for none)."""
    options, per_core, why = evidence.cpu_manager(f.node)
    if options is None:
        return "stale_data", why
    if not option_on(options, option):
        return None, node_advice(f, hurt[(f.node, f.reason)])
    if f.reason != SMT_SHARED:
        return None, ""
    if per_core is None:
        return "stale_data", f"no exporter says how many CPUs a core of {f.node} has"
    cpus = capacity.need(f).cpus
    return None, refused_advice(f, cpus, per_core) if cpus % per_core else ""


def _kept_whole(
    f: Finding, option: str, evidence: Evidence, capacity: Capacity, room: Mapping
) -> tuple[Callable[[int], bool], str]:
    """Which zones a replacement gets a whole layout on: of a node whose kubelet runs
    ``option``, with room for all its CPUs in whole cores (or in one L3 cache); and how
    to say so."""
    cpus = capacity.need(f).cpus
    free = room[ROOM[f.reason]]

    def whole(zone: int) -> bool:
        node, _ = capacity.name(zone)
        options = evidence.cpu_manager(node)[0]
        return (
            options is not None
            and option_on(options, option)
            and (free.get(capacity.name(zone), 0) >= cpus)
        )

    where = "in whole cores" if f.reason == SMT_SHARED else "in one L3 cache"
    return whole, f"of a node whose kubelet runs {option} with {cpus:g} CPUs free {where}"


def _zone_values(df) -> dict[tuple[str, str], float]:
    """(node, NUMA node) -> value; the least where several series say it."""
    out: dict[tuple[str, str], float] = {}
    if df.empty or "numa_node" not in df:
        return out
    for node, numa, value in zip(df["node"], df["numa_node"], df["value"], strict=True):
        out[(node, numa)] = min(value, out.get((node, numa), value))
    return out


def _fit(
    capacity: Capacity,
    reach: _Reach,
    pod: PodInfo,
    need: Need,
    kept: tuple[Callable[[int], bool], str] | None = None,
) -> tuple[int | None, tuple[str, ...], str]:
    """The zone to plan the pod's replacement on (the roomiest that fits on a node it
    may reach, and that ``kept`` allows), the nodes to steer it to, or why there is none."""
    zones = capacity.fitting(need, freed_in_time(pod))
    if kept is not None and len(zones):
        zones = zones[np.array([kept[0](int(z)) for z in zones], dtype=bool)]
    if not len(zones):
        where = f" {kept[1]}" if kept is not None else " anywhere"
        return None, (), f"no NUMA zone{where} has {need.describe()}"
    if pod.placement is None:
        return None, (), "where its replacement may run is unknown: its owner's template is"
    # only zones of the nodes looked up can be reachable; of those, the roomiest are
    # judged until enough are found to steer to
    looked_up = np.isin(capacity.node_of[zones], reach.numbers(capacity))
    why: dict[str, str | None] = {}
    reachable: dict[str, int] = {}  # node -> its roomiest fitting zone
    for zone in zones[looked_up]:
        node = capacity.name(int(zone))[0]
        if node in why:
            continue
        if len(why) >= _JUDGED_PER_FINDING or len(reachable) >= NODES_PER_FINDING:
            break
        why[node] = reach.why_not(pod, node)
        if why[node] is None:
            reachable[node] = int(zone)
    if reachable:
        return next(iter(reachable.values())), tuple(reachable), ""
    unjudged = len(np.unique(capacity.node_of[zones])) - len(why)
    by_reason: dict[str, list[str]] = defaultdict(list)
    for node, reason in why.items():
        by_reason[reason].append(node)
    said = [
        f"{reason}: {', '.join(names[:5])}{f' and {len(names) - 5} more' if len(names) > 5 else ''}"
        for reason, names in sorted(by_reason.items())
    ]
    if unjudged:
        said.append(f"{unjudged} more not looked up")
    text = "; ".join(said)
    return None, (), f"{need.describe()} fits only where its replacement cannot run ({text})"


def _priority(f: Finding) -> tuple:
    """By kind (kinds.py), then stable."""
    return (KINDS[f.kind].priority, f.node, f.namespace, f.pod, f.reason)


def intent_of(f: Finding) -> str:
    return KINDS[f.kind].intent_of(f.reason)


def _opted_in(pod: PodInfo | None) -> bool:
    return bool(
        pod
        and pod.workload.split("/")[0] in ("Deployment", "StatefulSet")
        and pod.workload_annotations.get(AUTO_RESIZE_ANNOTATION) == "true"
    )
