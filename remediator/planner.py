"""The planner (pure): findings + cluster state + capacity + policy -> actions, each
refusal recorded with the name of the guard that refused it.

Every guard of SPEC §5 is here, in the order they are checked; an eviction is planned
only when some NUMA zone, on some node, can take the pod aligned (its exclusive CPUs,
its memory and its devices on one NUMA node), and that capacity is then counted as
taken for the rest of the cycle.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from remediator.findings import Finding
from remediator.signals import Signals

# Starved for a placement reason: moving the pod fixes it. For the others (a CPU-bound
# feeder on an aligned pod) only a recommendation can.
_MOVABLE_STARVED = {"device_remote", "memory_remote", "remote_traffic"}
SYSTEM_CRITICAL_PRIORITY = 2_000_000_000
GUARDS = (
    "paused",
    "stale_data",
    "pod_gone",
    "protected_namespace",
    "opted_out",
    "mirror_pod",
    "daemonset",
    "bare_pod",
    "system_critical",
    "local_storage",
    "too_young",
    "gave_up",
    "cooldown",
    "not_lower_priority",
    "no_fit",
    "cap_cycle",
    "cap_node",
    "cap_namespace",
    "cap_workload",
)


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


@dataclass(frozen=True)
class Policy:
    dry_run: bool = True
    paused: bool = False
    max_per_cycle: int = 5
    max_per_node: int = 1
    max_per_namespace: int = 2
    max_per_workload: int = 1  # actions in flight (not yet verified) per workload
    cooldown_seconds: float = 1800.0  # after an action on a workload
    backoff_factor: float = 2.0  # cooldown grows so after each fix that did not hold
    give_up_after: int = 3  # failed fixes of a workload before it is left alone
    min_pod_age_seconds: float = 600.0
    stale_after_seconds: float = 30.0  # two scrape intervals
    protected_namespaces: tuple[str, ...] = ("kube-system",)
    allow_local_storage: bool = False


@dataclass
class WorkloadHistory:
    last_action: float = 0.0
    failures: int = 0  # fixes that did not hold, in a row
    in_flight: int = 0  # actions not yet verified


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
    """``pods``: by UID, the pods the findings name that the API server knows."""
    stale = stale_nodes(signals, policy.stale_after_seconds)
    capacity = Capacity.from_signals(signals, {f.pod_uid for f in findings})
    taken: Counter[str] = Counter()
    actions: list[Action] = []
    refusals: list[Refusal] = []
    acted: set[str] = set()  # one action per pod per cycle
    for finding in sorted(findings, key=_priority):
        pod = pods.get(finding.pod_uid)
        intent = _intent(finding)
        if policy.paused or finding.node in stale:  # not even a recommendation
            guard = "paused" if policy.paused else "stale_data"
            refusals.append(Refusal(finding, guard, stale.get(finding.node, "paused")))
            continue
        if intent == "recommend" or (intent == "resize" and not _opted_in(pod)):
            actions.append(Action("recommend", finding, pod, _advice(finding), True))
            continue
        if finding.pod_uid in acted:
            continue
        guard, detail = _guard(finding, pod, policy, history, now)
        if guard is None and finding.kind == "noisy_neighbour":
            feeder = pods.get(finding.feeder_uid)
            if feeder is None or pod.priority >= feeder.priority:
                guard = "not_lower_priority"
                detail = f"not of lower priority than the starved {finding.feeder}"
        if guard is None and intent == "evict":
            need = capacity.need(finding)
            target = capacity.fit(need)
            if target is None:
                guard, detail = "no_fit", f"no NUMA zone anywhere has {need.describe()}"
        elif guard is None and intent == "resize":
            target = capacity.free_slice(finding.recommended)
            if target is None:
                guard, detail = "no_fit", f"no free {finding.recommended} slice in the cluster"
        if guard is None:
            guard, detail = _caps(finding, pod, policy, history, taken)
        if guard is not None:
            refusals.append(Refusal(finding, guard, detail))
            continue
        if intent == "evict":
            capacity.take(target, need)
            node, numa = capacity.name(target)
            detail = f"evict: fits aligned on {node} NUMA node {numa}"
        else:
            capacity.take_slice(target, finding.recommended)
            detail = f"resize {finding.profile} -> {finding.recommended} ({pod.workload})"
        for key in (f"node/{finding.node}", f"ns/{pod.namespace}", f"wl/{pod.workload}", "all"):
            taken[key] += 1
        acted.add(finding.pod_uid)
        actions.append(Action(intent, finding, pod, detail, policy.dry_run))
    return Plan(tuple(actions), tuple(refusals))


def _priority(f: Finding) -> tuple:
    """Placement findings first (they cost throughput now), then sizing; stable."""
    order = {"cross_numa": 0, "starved": 1, "noisy_neighbour": 2, "undersized": 3, "oversized": 4}
    return (order.get(f.kind, 9), f.node, f.namespace, f.pod, f.reason)


def _intent(f: Finding) -> str:
    if f.kind in ("cross_numa", "noisy_neighbour") or (
        f.kind == "starved" and f.reason in _MOVABLE_STARVED
    ):
        return "evict"
    if f.kind in ("oversized", "undersized"):
        return "resize"
    return "recommend"


def _opted_in(pod: PodInfo | None) -> bool:
    return bool(
        pod
        and pod.workload.split("/")[0] in ("Deployment", "StatefulSet")
        and pod.workload_annotations.get("numaguard.io/auto-resize") == "true"
    )


def _advice(f: Finding) -> str:
    if f.kind in ("oversized", "undersized"):
        return f"use nvidia.com/mig-{f.recommended} instead of {f.profile} ({f.kind})"
    return f"GPU starved by {f.reason} on an aligned pod: give the feeder more CPU"


def _guard(f, pod, policy, history, now) -> tuple[str | None, str]:
    if pod is None:
        return "pod_gone", "the API server does not know the pod"
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
    if pod.priority >= SYSTEM_CRITICAL_PRIORITY or pod.priority_class.startswith("system-"):
        return "system_critical", pod.priority_class or str(pod.priority)
    if pod.local_storage and not policy.allow_local_storage:
        return "local_storage", "emptyDir or hostPath data would be lost"
    if now - pod.created < policy.min_pod_age_seconds:
        return "too_young", f"{now - pod.created:.0f}s old"
    h = history.get(pod.workload)
    if h is not None:
        if h.failures >= policy.give_up_after:
            return "gave_up", f"{h.failures} fixes did not hold"
        cooldown = policy.cooldown_seconds * policy.backoff_factor**h.failures
        if now - h.last_action < cooldown:
            return "cooldown", f"acted {now - h.last_action:.0f}s ago (cooldown {cooldown:.0f}s)"
    return None, ""


def _caps(f, pod, policy, history, taken) -> tuple[str | None, str]:
    if taken["all"] >= policy.max_per_cycle:
        return "cap_cycle", f"{policy.max_per_cycle} actions this cycle"
    if taken[f"node/{f.node}"] >= policy.max_per_node:
        return "cap_node", f"{policy.max_per_node} on {f.node} this cycle"
    if taken[f"ns/{pod.namespace}"] >= policy.max_per_namespace:
        return "cap_namespace", f"{policy.max_per_namespace} in {pod.namespace} this cycle"
    in_flight = (history.get(pod.workload) or WorkloadHistory()).in_flight
    if in_flight + taken[f"wl/{pod.workload}"] >= policy.max_per_workload:
        return "cap_workload", f"{policy.max_per_workload} in flight for {pod.workload}"
    return None, ""


def stale_nodes(signals: Signals, stale_after: float) -> dict[str, str]:
    """Nodes whose data must not be acted on: a collector that last succeeded too long
    ago, or failed in its last run."""
    out: dict[str, str] = {}
    age = signals["collector_age"]
    if not age.empty:
        for row in age[age["value"] > stale_after].itertuples(index=False):
            out[row.node] = f"{row.collector} last succeeded {row.value:.0f}s ago"
    ok = signals["collector_success"]
    if not ok.empty:
        for row in ok[ok["value"] == 0].itertuples(index=False):
            out.setdefault(row.node, f"collector {row.collector} is failing")
    return out


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
    """Free capacity per (node, NUMA node), as the exporters report it, as arrays: the
    fit check runs once per finding over every zone of the cluster."""

    def __init__(
        self,
        zones: list[tuple[str, str]],
        cpus: np.ndarray,
        memory: np.ndarray,
        devices: dict[str, np.ndarray],
        needs: dict,
    ) -> None:
        self.zones = zones
        self.cpus = cpus
        self.memory = memory
        self.devices = devices  # resource -> free count per zone
        self.needs = needs  # pod uid -> (cpus, memory, {resource: count})

    @classmethod
    def from_signals(cls, s: Signals, pods: set[str]) -> Capacity:
        """``pods``: UIDs whose needs are wanted (the findings' pods)."""
        key = ["node", "numa_node"]

        def by_zone(name: str) -> pd.Series:
            df = s[name]
            if df.empty or "numa_node" not in df:
                return pd.Series(dtype=float)
            df = df[df["numa_node"] != ""]
            return df.groupby(key, sort=False)["value"].sum()

        zone_cpus, zone_memory = by_zone("zone_free_cpus"), by_zone("zone_free_memory")
        index = zone_cpus.index.intersection(zone_memory.index)
        devices: dict[str, np.ndarray] = {}
        dev = s["zone_free_devices"]
        if not dev.empty and "numa_node" in dev:
            dev = dev[dev["numa_node"] != ""]
            for resource, rows in dev.groupby("resource", sort=False):
                free = rows.groupby(key, sort=False)["value"].sum()
                devices[resource] = np.array(free.reindex(index, fill_value=0), dtype=float)
        needs: dict[str, list] = {}
        for name, slot in (("pod_exclusive_cpus", 0), ("pod_memory", 1)):
            df = s[name]
            if "pod_uid" in df:
                df = df[df["pod_uid"].isin(pods)]
                for uid, value in zip(df["pod_uid"], df["value"], strict=True):
                    needs.setdefault(uid, [0.0, 0.0, Counter()])[slot] = value
        holders = s["holders"]
        if not holders.empty and "pod_uid" in holders:
            holders = holders[holders["pod_uid"].isin(pods)]
            for uid, resource in zip(holders["pod_uid"], holders["resource"], strict=True):
                needs.setdefault(uid, [0.0, 0.0, Counter()])[2][resource] += 1
        return cls(
            list(index),
            np.array(zone_cpus.reindex(index), dtype=float),
            np.array(zone_memory.reindex(index), dtype=float),
            devices,
            needs,
        )

    def need(self, f: Finding) -> Need:
        cpus, memory, devices = self.needs.get(f.pod_uid, (0.0, 0.0, Counter()))
        return Need(cpus, memory, dict(devices))

    def fit(self, need: Need) -> int | None:
        """The zone that can take the pod aligned; the roomiest, so that fixes spread."""
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

    def take(self, zone: int, need: Need) -> None:
        self.cpus[zone] -= need.cpus
        self.memory[zone] -= need.memory
        for resource, count in need.devices.items():
            self.devices[resource][zone] -= count

    def free_slice(self, profile: str) -> int | None:
        free = self.devices.get(f"nvidia.com/mig-{profile}")
        if free is None:
            return None
        found = np.flatnonzero(free > 0)
        return int(found[0]) if found.size else None

    def take_slice(self, zone: int, profile: str) -> None:
        self.devices[f"nvidia.com/mig-{profile}"][zone] -= 1

    def name(self, zone: int) -> tuple[str, str]:
        return self.zones[zone]
