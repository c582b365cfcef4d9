"""The planner (pure): findings + cluster state + capacity + policy -> actions, each
refusal recorded with the name of the guard that refused it.

Every guard (docs/design.md) is here, in the order they are checked; an eviction is planned
only when some NUMA zone, on some node, can take the pod aligned (its exclusive CPUs,
its memory and its devices on one NUMA node), and that capacity is then counted as
taken for the rest of the cycle.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Literal, get_args

import numpy as np
import pandas as pd
from pydantic import TypeAdapter, ValidationError

from numaguard.exporter.readers.nvml import mig_resource
from numaguard.remediator.findings import Finding
from numaguard.remediator.kinds import (
    CROSS_NUMA,
    KINDS,
    NOISY_NEIGHBOUR,
    OVERSIZED,
    RESIZED,
    STARVED,
    UNDERSIZED,
)
from numaguard.remediator.outcome import Activity
from numaguard.remediator.signals import Signals
from numaguard.remediator.validation import (
    FORBID_EXTRA,
    Count,
    Factor,
    Flag,
    Names,
    NonNegative,
    Seconds,
    Text,
)

SYSTEM_CRITICAL_PRIORITY = 2_000_000_000
GUARDS = (
    "paused",
    "stale_data",
    "pod_gone",
    "evidence_mismatch",
    "protected_namespace",
    "opted_out",
    "mirror_pod",
    "daemonset",
    "bare_pod",
    "unsupported_owner",
    "system_critical",
    "local_storage",
    "resource_claims",
    "too_young",
    "gave_up",
    "pdb_blocked",
    "cooldown",
    "not_lower_priority",
    "no_fit",
    "cap_cycle",
    "cap_node",
    "cap_namespace",
    "cap_workload",
)
# Refusals that last until something outside the remediator changes (not a cooldown, a
# cap or a pod too young: those pass by themselves)
LASTING_GUARDS = frozenset(GUARDS) - {
    "paused",
    "stale_data",
    "pod_gone",
    "evidence_mismatch",
    "too_young",
    "cooldown",
    "cap_cycle",
    "cap_node",
    "cap_namespace",
    "cap_workload",
}
# Owners whose history numaguard can keep (an annotation on them), so that whoever leads
# next keeps every guard, with their API resource; pods of other owners are not acted on.
HISTORY_OWNERS = {
    "Deployment": "deployments",
    "StatefulSet": "statefulsets",
    "ReplicaSet": "replicasets",
}
# The collectors the capacity of a zone that would take a pod comes from (each kind's
# own are in its record, kinds.py)
CAPACITY_DEPENDS_ON = ("host_numa", "pod_resources")


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


# What to do about a kind of finding: act on it (evict or resize, under every guard and
# dry-run), only recommend (an Event and the log say what would help), or ignore it.
Mode = Literal["act", "recommend", "ignore"]
MODES: tuple[str, ...] = get_args(Mode)


@dataclass(frozen=True)
class Enforcement:
    """The mode of each kind of finding; mis_sized is both oversized and undersized."""

    __pydantic_config__ = FORBID_EXTRA

    cross_numa: Mode = "act"
    starved: Mode = "act"
    noisy_neighbour: Mode = "act"
    mis_sized: Mode = "act"
    # pods the kubelet refused for alignment (rejections.py): act deletes the surplus
    topology_affinity_error: Mode = "act"

    def of(self, kind: str) -> str:
        return getattr(self, KINDS[kind].enforced_as)


@dataclass(frozen=True)
class FixGain:
    """The least gain (outcome.py: the workload's GPU work, or share of local memory,
    after / before) a fix of each kind must show to count as paid off; 0: any. The
    defaults are the kinds' own (kinds.py)."""

    __pydantic_config__ = FORBID_EXTRA

    cross_numa: NonNegative = CROSS_NUMA.min_gain
    starved: NonNegative = STARVED.min_gain
    noisy_neighbour: NonNegative = NOISY_NEIGHBOUR.min_gain
    undersized: NonNegative = UNDERSIZED.min_gain
    oversized: NonNegative = OVERSIZED.min_gain

    def of(self, kind: str) -> float:
        return getattr(self, kind)


@dataclass(frozen=True)
class Policy:
    __pydantic_config__ = FORBID_EXTRA

    dry_run: Flag = True
    paused: Flag = False
    max_per_cycle: Count = 5
    max_per_node: Count = 1
    max_per_namespace: Count = 2
    max_per_workload: Count = 1  # actions in flight (not yet verified) per workload
    cooldown_seconds: Seconds = 1800.0  # after an action on a workload
    backoff_factor: Factor = 2.0  # cooldown grows so after each fix that did not hold
    give_up_after: Count = 3  # failed fixes of a workload before it is left alone
    min_pod_age_seconds: Seconds = 600.0
    stale_after_seconds: Seconds = 30.0  # two scrape intervals
    protected_namespaces: Names = ("kube-system",)
    allow_local_storage: Flag = False
    pdb_retry_seconds: Seconds = 300.0  # after a 429, doubled at each one in a row ...
    pdb_backoff_max_seconds: Seconds = 21600.0  # ... up to this
    pdb_blocked_after: Count = 3  # 429s in a row before the finding is reported pdb_blocked
    verify_after_seconds: Seconds = 900.0  # how long a fix must be seen holding
    verify_deadline_seconds: Seconds = 3600.0  # no verdict by then: unverified
    enforcement: Enforcement = Enforcement()
    min_fix_gain: FixGain = FixGain()  # a fix that cleared its finding with less: no_gain
    keep_rejected_pods: Count = 3  # of a workload's pods rejected on a node, for diagnosis
    max_rejected_deletes_per_cycle: Count = 100  # they run nothing, but the API server does


@dataclass(frozen=True)
class Pending:
    """An action waiting to be verified."""

    __pydantic_config__ = FORBID_EXTRA

    kind: Text  # the finding's kind
    reason: Text
    at: Seconds
    pod_uid: Text  # the pod acted on; its replacements have other uids
    recommended: Text = ""  # a resize's new profile
    # whose activity tells whether the fix paid off (the pod acted on, or the feeder a
    # noisy neighbour crowded out), and what it did before the action
    measured_uid: Text = ""
    before: Activity | None = None


@dataclass(frozen=True)
class WorkloadHistory:
    """What numaguard did to a workload and how it went: kept on the workload itself, so
    that a restarted or new leader keeps every guard."""

    __pydantic_config__ = FORBID_EXTRA

    last_action: Seconds = 0.0
    failures: Count = 0  # fixes that did not hold (or could not be verified), in a row
    pending: tuple[Pending, ...] = ()  # actions not yet verified
    pdb_refusals: Count = 0  # 429s in a row
    last_refusal: Seconds = 0.0

    @property
    def in_flight(self) -> int:
        return len(self.pending)

    def to_json(self) -> str:
        return json.dumps(
            {
                "last_action": self.last_action,
                "failures": self.failures,
                "pending": [asdict(p) for p in self.pending],
                "pdb_refusals": self.pdb_refusals,
                "last_refusal": self.last_refusal,
            },
            separators=(",", ":"),
            sort_keys=True,
        )

    @classmethod
    def from_json(cls, text: str) -> WorkloadHistory:
        """Raises ValueError on anything but what ``to_json`` writes (every field)."""
        try:
            data = json.loads(text)
        except RecursionError:  # nesting deeper than any history
            raise ValueError("unreadable history: nested too deep") from None
        keys = {f.name for f in fields(cls)}
        if not isinstance(data, dict) or set(data) != keys:
            raise ValueError(f"unreadable history: not an object with exactly {sorted(keys)}")
        try:
            return _HISTORY.validate_python(data)
        except ValidationError as err:
            first = err.errors()[0]
            where = ".".join(map(str, first["loc"])) or "the document"
            raise ValueError(f"unreadable history: {where}: {first['msg']}") from None


_HISTORY = TypeAdapter(WorkloadHistory)


@dataclass(frozen=True)
class Action:
    kind: str  # evict | resize | recommend
    finding: Finding
    pod: PodInfo | None
    detail: str
    dry_run: bool


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


def plan(
    findings: list[Finding],
    pods: dict[str, PodInfo],
    signals: Signals,
    policy: Policy,
    history: dict[str, WorkloadHistory],
    now: float,
) -> Plan:
    """``pods``: by UID, the pods the findings name that the API server knows;
    ``history``: by workload, as read from the workloads this cycle."""
    uids = {f.pod_uid for f in findings}
    evidence = Evidence(signals, policy.stale_after_seconds, uids)
    capacity = Capacity.from_signals(signals, uids, evidence)
    taken: Counter[str] = Counter()
    actions: list[Action] = []
    refusals: list[Refusal] = []
    acted: set[str] = set()  # one action per pod per cycle
    ignored: list[Finding] = []
    for finding in sorted(findings, key=_priority):
        mode = policy.enforcement.of(finding.kind)
        if mode == "ignore":
            ignored.append(finding)
            continue
        pod = pods.get(finding.pod_uid)
        intent = intent_of(finding)
        # doubtful evidence stops even a recommendation (an Event in the pod's namespace)
        guard, detail = ("paused", "paused") if policy.paused else evidence.doubt(finding, pod)
        if guard is not None:
            refusals.append(Refusal(finding, guard, detail))
            continue
        if (
            mode == "recommend"
            or intent == "recommend"
            or (intent == "resize" and not _opted_in(pod))
        ):
            actions.append(
                Action("recommend", finding, pod, KINDS[finding.kind].advice(finding), True)
            )
            continue
        if finding.pod_uid in acted:
            continue
        guard, detail = _guard(pod, policy, history, now)
        if guard is None and finding.kind == NOISY_NEIGHBOUR.name:
            feeder = pods.get(finding.feeder_uid)
            if feeder is None or pod.priority >= feeder.priority:
                guard = "not_lower_priority"
                detail = f"not of lower priority than the starved {finding.feeder}"
        if guard is None and intent == "evict":
            need = capacity.need(finding)
            target = capacity.fit(need, finding.pod_uid)
            if target is None:
                guard, detail = "no_fit", f"no NUMA zone anywhere has {need.describe()}"
        elif guard is None and intent == "resize":
            target = capacity.free_slice(finding.recommended)
            if target is None:
                guard, detail = "no_fit", f"no free {finding.recommended} slice in the cluster"
        if guard is None:
            guard, detail = _caps(pod, policy, history, taken)
        if guard is not None:
            refusals.append(Refusal(finding, guard, detail))
            continue
        if intent == "evict":
            capacity.move(finding.pod_uid, target, need)
            node, numa = capacity.name(target)
            detail = f"evict: fits aligned on {node} NUMA node {numa}"
        else:
            capacity.take_slice(target, finding.recommended)
            detail = f"resize {finding.profile} -> {finding.recommended} ({pod.workload})"
        for key in (f"node/{pod.node}", f"ns/{pod.namespace}", f"wl/{pod.workload}", "all"):
            taken[key] += 1
        acted.add(finding.pod_uid)
        actions.append(Action(intent, finding, pod, detail, policy.dry_run))
    return Plan(tuple(actions), tuple(refusals), tuple(ignored))


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
    if result in ("evicted", "resized"):
        pending = Pending(
            f.kind, f.reason, now, action.pod.uid, f.recommended, measured_uid(f), before
        )
        return replace(h, last_action=now, pending=(*h.pending, pending), pdb_refusals=0)
    if result == "pdb_blocked":
        return replace(h, pdb_refusals=h.pdb_refusals + 1, last_refusal=now)
    return h


def after_verification(h: WorkloadHistory, pending: Pending, outcome: str) -> WorkloadHistory:
    """The history once ``pending`` was judged: a fix that held resets the failures; one
    that did not hold, or could not be verified, adds one (longer cooldown, then give up)."""
    rest = tuple(p for p in h.pending if p != pending)
    return replace(h, pending=rest, failures=0 if outcome == "held" else h.failures + 1)


def measured_uid(f: Finding) -> str:
    """The pod whose activity says whether a fix of ``f`` paid off: the pod moved or
    resized (its replacements, after), or the feeder a noisy neighbour crowded out."""
    return getattr(f, KINDS[f.kind].measured)


def _priority(f: Finding) -> tuple:
    """By kind (kinds.py), then stable."""
    return (KINDS[f.kind].priority, f.node, f.namespace, f.pod, f.reason)


def intent_of(f: Finding) -> str:
    return KINDS[f.kind].intent_of(f.reason)


def _opted_in(pod: PodInfo | None) -> bool:
    return bool(
        pod
        and pod.workload.split("/")[0] in ("Deployment", "StatefulSet")
        and pod.workload_annotations.get("numaguard.io/auto-resize") == "true"
    )


def _guard(pod, policy, history, now) -> tuple[str | None, str]:
    if pod.namespace in policy.protected_namespaces:
        return "protected_namespace", pod.namespace
    if pod.annotations.get("numaguard.io/remediate") == "false":
        return "opted_out", "numaguard.io/remediate: false"
    if pod.mirror:
        return "mirror_pod", "a static pod"
    if pod.owner_kind == "DaemonSet":
        return "daemonset", pod.owner_name
    if not pod.owner_kind:
        return "bare_pod", "no controller would recreate it"
    if pod.workload.split("/")[0] not in HISTORY_OWNERS:
        return "unsupported_owner", f"{pod.workload}: history is kept on {sorted(HISTORY_OWNERS)}"
    if pod.priority >= SYSTEM_CRITICAL_PRIORITY or pod.priority_class.startswith("system-"):
        return "system_critical", pod.priority_class or str(pod.priority)
    if pod.local_storage and not policy.allow_local_storage:
        return "local_storage", "emptyDir or hostPath data would be lost"
    if DRA in pod.resources:
        # The scheduler allocates claims with no regard to NUMA, and a shared claim
        # keeps its devices: no eviction can be shown to bring the pod back aligned.
        return "resource_claims", "its devices come from DRA ResourceClaims"
    if now - pod.created < policy.min_pod_age_seconds:
        return "too_young", f"{now - pod.created:.0f}s old"
    h = history.get(pod.workload)
    if h is not None:
        if h.failures >= policy.give_up_after:
            return "gave_up", f"{h.failures} fixes did not hold"
        if h.pdb_refusals:
            wait = pdb_backoff(policy, h.pdb_refusals)
            if now - h.last_refusal < wait:
                guard = "pdb_blocked" if h.pdb_refusals >= policy.pdb_blocked_after else "cooldown"
                return guard, (
                    f"its PodDisruptionBudget refused {h.pdb_refusals} evictions in a row; "
                    f"next try in {wait - (now - h.last_refusal):.0f}s"
                )
        cooldown = policy.cooldown_seconds * policy.backoff_factor**h.failures
        if now - h.last_action < cooldown:
            return "cooldown", f"acted {now - h.last_action:.0f}s ago (cooldown {cooldown:.0f}s)"
    return None, ""


def pdb_backoff(policy: Policy, refusals: int) -> float:
    """How long after its last 429 a workload is asked again: doubling, bounded."""
    return min(policy.pdb_retry_seconds * 2 ** (refusals - 1), policy.pdb_backoff_max_seconds)


def _caps(pod, policy, history, taken) -> tuple[str | None, str]:
    if taken["all"] >= policy.max_per_cycle:
        return "cap_cycle", f"{policy.max_per_cycle} actions this cycle"
    if taken[f"node/{pod.node}"] >= policy.max_per_node:
        return "cap_node", f"{policy.max_per_node} on {pod.node} this cycle"
    if taken[f"ns/{pod.namespace}"] >= policy.max_per_namespace:
        return "cap_namespace", f"{policy.max_per_namespace} in {pod.namespace} this cycle"
    in_flight = (history.get(pod.workload) or WorkloadHistory()).in_flight
    if in_flight + taken[f"wl/{pod.workload}"] >= policy.max_per_workload:
        return "cap_workload", f"{policy.max_per_workload} in flight for {pod.workload}"
    return None, ""


class Evidence:
    """Is a finding backed by fresh, genuine data now? Positive evidence only: a node
    with no series saying its exporter is up and its collectors succeeded recently is
    stale, as is a verdict whose newest sample is old or missing."""

    def __init__(self, signals: Signals, stale_after: float, pods: set[str] = frozenset()) -> None:
        """``pods``: the UIDs whose devices will be asked about (the findings' pods)."""
        s = signals
        self.stale_after = stale_after
        self.targets: dict[str, set[str]] = {}  # node -> instances up now that speak for it
        for node, instance in _columns(s["targets_up"], "node", "instance"):
            self.targets.setdefault(node, set()).add(instance)
        key = ("node", "instance", "collector", "value")
        self.collector_age = {(n, i, c): v for n, i, c, v in _columns(s["collector_age"], *key)}
        self.collector_ok = {
            (n, i, c) for n, i, c, v in _columns(s["collector_success"], *key) if v == 1
        }
        holders = s["holders"]
        holders = holders[(holders["source"] == "kubelet") & holders["pod_uid"].isin(pods)]
        self.holders: dict[tuple, set[str]] = {}  # (node, pod uid) -> the kubelet's devices
        for node, uid, gpu, mig in _columns(holders, "node", "pod_uid", "gpu_uuid", "mig_uuid"):
            self.holders.setdefault((node, uid), set()).update((gpu, mig))
        self.slices = set(_columns(s["slice_memory_total"], "node", "mig_uuid"))
        # the age of the newest sample of each verdict, by its query and the fields of
        # a finding its kind's record names (Kind.age_of)
        self.ages: dict[tuple, float] = {}
        cross, starved, llc, slices = (
            k.age for k in (CROSS_NUMA, STARVED, NOISY_NEIGHBOUR, OVERSIZED)
        )
        for uid, reason, age in _columns(s[cross], "pod_uid", "reason", "value"):
            self._age((cross, uid, reason), age)
        rows = _columns(s[starved], "pod_uid", "reason", "gpu_uuid", "mig_uuid", "value")
        for uid, reason, gpu, mig, age in rows:
            self._age((starved, uid, reason, mig or gpu), age)
        for uid, domain, age in _columns(s[llc], "pod_uid", "l3_domain", "value"):
            self._age((llc, uid, f"l3:{domain}"), age)
        for mig, age in _columns(s[slices], "mig_uuid", "value"):
            self._age((slices, mig), age)

    def _age(self, key: tuple, age: float) -> None:
        self.ages[key] = min(age, self.ages.get(key, age))

    def instance(self, node: str) -> tuple[str | None, str]:
        """The one exporter target up now for ``node``, or why there is none."""
        up = self.targets.get(node, set())
        if len(up) != 1:
            return None, (
                f"no exporter target of {node} is up"
                if not up
                else f"{len(up)} targets claim to be {node}'s exporter: {sorted(up)}"
            )
        return next(iter(up)), ""

    def node_stale(self, node: str, collectors) -> str:
        """Why ``node``'s data from ``collectors`` cannot be acted on; "" when fresh."""
        instance, why = self.instance(node)
        if instance is None:
            return why
        for collector in collectors:
            key = (node, instance, collector)
            age = self.collector_age.get(key)
            if age is None:
                return f"collector {collector} of {node} has never succeeded"
            if age > self.stale_after:
                return f"collector {collector} of {node} last succeeded {age:.0f}s ago"
            if key not in self.collector_ok:
                return f"collector {collector} of {node} is failing"
        return ""

    def doubt(self, f: Finding, pod: PodInfo | None) -> tuple[str | None, str]:
        """(guard, why) when the finding must not be acted on; (None, "") otherwise."""
        instance, why = self.instance(f.node)
        if len(self.targets.get(f.node, ())) > 1:
            return "evidence_mismatch", why
        if instance is not None and f.instance != instance:
            return "evidence_mismatch", (
                f"series from {f.instance or 'no target'}, but {f.node}'s exporter is {instance}"
            )
        kind = KINDS[f.kind]
        collectors = kind.depends_on
        if f.reason in kind.device_reasons:
            collectors = (*collectors, "pod_resources")
        why = self.node_stale(f.node, collectors)
        if not why:
            age = self._sample_age(f)
            if age is None or age > self.stale_after:
                why = "no recent sample says so" if age is None else f"newest sample {age:.0f}s old"
        if why:
            return "stale_data", why
        if pod is None:
            return "pod_gone", "the API server does not know the pod"
        if pod.mismatch:
            return "evidence_mismatch", pod.mismatch
        if pod.phase != "Running":
            return "evidence_mismatch", f"the pod is {pod.phase or 'in no phase'}, not Running"
        if pod.node != f.node:
            return "evidence_mismatch", f"the pod runs on {pod.node or 'no node'}, not {f.node}"
        device_finding = f.reason in kind.device_reasons or (
            f.device and not f.device.startswith("l3:")
        )
        if not device_finding:
            return None, ""
        devices = self.holders.get((f.node, f.pod_uid), set())
        if (f.device and f.device not in devices) or not devices:
            return "evidence_mismatch", (
                f"the kubelet does not attribute {f.device or 'a device'} to the pod"
            )
        if not pod.resources:
            return "evidence_mismatch", "the pod requests no device"
        if f.kind in RESIZED:
            wanted = mig_resource(f.profile)
            if (f.node, f.device) not in self.slices:
                return "evidence_mismatch", f"no slice {f.device} on {f.node}"
            if wanted not in pod.resources:
                return "evidence_mismatch", f"the pod does not request {wanted}"
        return None, ""

    def _sample_age(self, f: Finding) -> float | None:
        kind = KINDS[f.kind]
        return self.ages.get((kind.age, *(getattr(f, name) for name in kind.age_of)))


def holdings(s: Signals, pods: set[str]) -> dict[str, dict]:
    """Pod uid -> {(node, numa node): [exclusive CPUs, memory, {resource: count}]}: what
    each of ``pods`` holds, per zone."""
    held: dict[str, dict] = {}

    def slot(uid: str, node: str, numa: str) -> list:
        return held.setdefault(uid, {}).setdefault((node, numa), [0.0, 0.0, Counter()])

    for name, i in (("pod_exclusive_cpus", 0), ("pod_memory", 1)):
        df = s[name]
        df = df[df["pod_uid"].isin(pods)].reindex(
            columns=["pod_uid", "node", "numa_node", "value"], fill_value=""
        )
        for uid, node, numa, value in df.itertuples(index=False):
            slot(uid, node, numa)[i] += value
    holders = s["holders"]
    holders = holders[holders["pod_uid"].isin(pods)].reindex(
        columns=["pod_uid", "node", "numa_node", "resource"], fill_value=""
    )
    for uid, node, numa, resource in holders.itertuples(index=False):
        slot(uid, node, numa)[2][resource] += 1
    return held


def need_of(held: dict[str, dict], uid: str) -> Need:
    """What the pod must find in one zone to run aligned: all it holds, together."""
    cpus, memory, devices = 0.0, 0.0, Counter()
    for c, m, d in held.get(uid, {}).values():
        cpus, memory = cpus + c, memory + m
        devices.update(d)
    return Need(cpus, memory, dict(devices))


def _columns(df: pd.DataFrame, *names: str):
    """Rows of ``df`` as tuples of the named columns ("" for a label no row had)."""
    return zip(*(df[n] if n in df else [""] * len(df) for n in names), strict=True)


@dataclass
class Need:
    cpus: float
    memory: float
    devices: dict[str, int]

    def describe(self) -> str:
        devices = ", ".join(f"{n} {r}" for r, n in sorted(self.devices.items()))
        return f"{self.cpus:g} exclusive CPUs, {self.memory / 2**30:.1f} GiB" + (
            f", {devices}" if devices else ""
        )


class Capacity:
    """Free capacity per (node, NUMA node), as the exporters of fresh nodes report it, as
    arrays: the fit check runs once per finding over every zone of the cluster."""

    def __init__(
        self,
        zones: list[tuple[str, str]],
        cpus: np.ndarray,
        memory: np.ndarray,
        devices: dict[str, np.ndarray],
        held: dict,
    ) -> None:
        self.zones = zones
        self.index = {z: i for i, z in enumerate(zones)}
        self.cpus = cpus
        self.memory = memory
        self.devices = devices  # resource -> free count per zone
        # pod uid -> {(node, numa node): [cpus, memory, {resource: count}]}: what it holds
        self.held = held

    @classmethod
    def from_signals(cls, s: Signals, pods: set[str], evidence: Evidence) -> Capacity:
        """``pods``: UIDs whose needs are wanted (the findings' pods). Zones of nodes whose
        data is stale are left out: no pod is sent to a node on old news."""
        key = ["node", "numa_node"]
        stale = {
            n
            for n in set(s["zone_free_cpus"]["node"])
            if evidence.node_stale(n, CAPACITY_DEPENDS_ON)
        }

        def aligned(name: str) -> pd.DataFrame:
            df = s[name]
            if "numa_node" not in df:
                return df.iloc[0:0].assign(numa_node="")
            return df[~df["node"].isin(stale) & (df["numa_node"] != "")]

        def by_zone(name: str) -> pd.Series:
            return aligned(name).groupby(key, sort=False)["value"].sum()

        zone_cpus, zone_memory = by_zone("zone_free_cpus"), by_zone("zone_free_memory")
        index = zone_cpus.index.intersection(zone_memory.index)
        devices: dict[str, np.ndarray] = {}
        dev = aligned("zone_free_devices")
        for resource, rows in dev.groupby("resource", sort=False):
            free = rows.groupby(key, sort=False)["value"].sum()
            devices[resource] = np.array(free.reindex(index, fill_value=0), dtype=float)
        held = holdings(s, pods)
        return cls(
            list(index),
            np.array(zone_cpus.reindex(index), dtype=float),
            np.array(zone_memory.reindex(index), dtype=float),
            devices,
            held,
        )

    def need(self, f: Finding) -> Need:
        return need_of(self.held, f.pod_uid)

    def _give_back(self, uid: str, sign: float) -> None:
        """Count what the pod holds as free (+1) or taken again (-1): once evicted, its
        own node's zones get it back."""
        for zone, (c, m, d) in self.held.get(uid, {}).items():
            i = self.index.get(zone)
            if i is None:
                continue
            self.cpus[i] += sign * c
            self.memory[i] += sign * m
            for resource, count in d.items():
                if resource in self.devices:
                    self.devices[resource][i] += sign * count

    def fit(self, need: Need, uid: str) -> int | None:
        """The zone that can take the pod (``uid``) aligned, counting what it gives back
        itself; the roomiest, so that fixes spread."""
        self._give_back(uid, +1)
        try:
            ok = (self.cpus >= need.cpus) & (self.memory >= need.memory)
            for resource, count in need.devices.items():
                free = self.devices.get(resource)
                if free is None:
                    return None
                ok &= free >= count
            candidates = np.flatnonzero(ok)
            if candidates.size == 0:
                return None
            # most free CPUs, then most free memory (bytes stay far below 1e12 per zone)
            score = self.cpus[candidates] * 1e12 + self.memory[candidates]
            return int(candidates[np.argmax(score)])
        finally:
            self._give_back(uid, -1)

    def move(self, uid: str, zone: int, need: Need) -> None:
        """The pod leaves its zones and takes ``zone``'s room, for the rest of the cycle."""
        self._give_back(uid, +1)
        self.cpus[zone] -= need.cpus
        self.memory[zone] -= need.memory
        for resource, count in need.devices.items():
            self.devices[resource][zone] -= count

    def free_slice(self, profile: str) -> int | None:
        free = self.devices.get(mig_resource(profile))
        if free is None:
            return None
        found = np.flatnonzero(free > 0)
        return int(found[0]) if found.size else None

    def take_slice(self, zone: int, profile: str) -> None:
        self.devices[mig_resource(profile)][zone] -= 1

    def name(self, zone: int) -> tuple[str, str]:
        return self.zones[zone]
