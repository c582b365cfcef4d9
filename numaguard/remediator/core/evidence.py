"""Evidence (pure): whether a finding is backed by fresh, genuine data now, from the
exporters' own series, and whether the API server's pod is the one the series name."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pandas as pd

from numaguard.contract import catalogue as c
from numaguard.contract.names import mig_resource
from numaguard.remediator.core.answers import Signals
from numaguard.remediator.core.claims import mechanism
from numaguard.remediator.core.findings import Finding
from numaguard.remediator.core.kinds import (
    CORE_ISOLATION,
    CROSS_NUMA,
    GPU_FRAGMENTATION,
    GPU_LINK,
    KINDS,
    NOISY_NEIGHBOUR,
    OVERSIZED,
    PLACEMENT,
    RESIZED,
    STARVED,
)

if TYPE_CHECKING:
    from numaguard.remediator.core.actions import PodInfo


class Evidence:
    """Is a finding backed by fresh, genuine data now? Positive evidence only: a node
    with no series saying its exporter is up and its collectors succeeded recently is
    stale, as is a verdict whose newest sample is old or missing."""

    def __init__(self, signals: Signals, stale_after: float, pods: set[str] = frozenset()) -> None:
        """``pods``: the UIDs whose devices will be asked about (the findings' pods)."""
        s = signals
        self.stale_after = stale_after
        self.targets: dict[str, set[str]] = {}  # node -> instances up now that speak for it
        # instance -> the labels it adds to each series (job, instance, what discovery and
        # relabelling give it): its build_info's, less those the exporter writes
        self.target_labels: dict[str, frozenset[str]] = {}
        own = {*c.BUILD_INFO.labels, "node"}
        for labels in labelled(s["targets_up"]):
            node, instance = labels.get("node", ""), labels.get("instance", "")
            self.targets.setdefault(node, set()).add(instance)
            self.target_labels[instance] = frozenset(labels) - own
        key = ("node", "instance", "collector", "value")
        self.collector_age = {(n, i, c): v for n, i, c, v in columns(s["collector_age"], *key)}
        self.collector_ok = {
            (n, i, c) for n, i, c, v in columns(s["collector_success"], *key) if v == 1
        }
        # (node, instance) -> the age of the newest sample of its memory mover's totals
        self.mover_age = dict(
            ((n, i), v) for n, i, v in columns(s["mover_age"], "node", "instance", "value")
        )
        # (node, instance) -> its kubelet's CPU manager policy, its options as written,
        # and the node's CPUs a core, as its exporter says them now
        self.cpu_policy = {
            (n, i): p for n, i, p in columns(s["cpu_manager"], "node", "instance", "policy")
        }
        self.cpu_options: dict[tuple[str, str], dict[str, str]] = {}
        rows = columns(s["cpu_manager_options"], "node", "instance", "option", "setting")
        for n, i, option, setting in rows:
            self.cpu_options.setdefault((n, i), {})[option] = setting
        self.cpus_per_core = {
            (n, i): v for n, i, v in columns(s["cpus_per_core"], "node", "instance", "value")
        }
        holders = s["holders"]
        holders = holders[(holders["source"] == "kubelet") & holders["pod_uid"].isin(pods)]
        self.holders: dict[tuple, set[str]] = {}  # (node, pod uid) -> the kubelet's devices
        for node, uid, gpu, mig in columns(holders, "node", "pod_uid", "gpu_uuid", "mig_uuid"):
            self.holders.setdefault((node, uid), set()).update((gpu, mig))
        self.slices = set(columns(s["slice_memory_total"], "node", "mig_uuid"))
        # the age of the newest sample of each verdict, by its query and the fields of
        # a finding its kind's record names (Kind.age_of)
        self.ages: dict[tuple, float] = {}
        cross, starved, llc, slices = (
            k.age for k in (CROSS_NUMA, STARVED, NOISY_NEIGHBOUR, OVERSIZED)
        )
        for by_pod in (cross, GPU_LINK.age, GPU_FRAGMENTATION.age, CORE_ISOLATION.age):
            for uid, reason, age in columns(s[by_pod], "pod_uid", "reason", "value"):
                self._age((by_pod, uid, reason), age)
        rows = columns(s[starved], "pod_uid", "reason", "gpu_uuid", "mig_uuid", "value")
        for uid, reason, gpu, mig, age in rows:
            self._age((starved, uid, reason, mig or gpu), age)
        # (kind, pod, reason) -> labels on a series saying so now that neither the
        # catalogue declares for its metric nor its target adds: someone else wrote it
        self.foreign: dict[tuple, set[str]] = {}
        for kind in PLACEMENT:
            for labels in labelled(s[kind.age]):
                target = self.target_labels.get(labels.get("instance", ""), frozenset())
                declared = {*kind.verified_by.labels, "node", "job", "instance", *target}
                if extra := set(labels) - declared:
                    key = (kind.name, labels.get("pod_uid", ""), labels.get("reason", ""))
                    self.foreign.setdefault(key, set()).update(extra)
        for uid, domain, age in columns(s[llc], "pod_uid", "l3_domain", "value"):
            self._age((llc, uid, f"l3:{domain}"), age)
        for mig, age in columns(s[slices], "mig_uuid", "value"):
            self._age((slices, mig), age)
        # how many series say each verdict now: (kind, target, pod, reason, device) -> n
        self.series: dict[tuple, float] = {}
        for kind in PLACEMENT:
            key = ("instance", "pod_uid", "reason", "gpu_uuid", "mig_uuid", "value")
            for instance, uid, reason, gpu, mig, n in columns(s[kind.series], *key):
                self.series[(kind.name, instance, uid, reason, mig or gpu)] = n

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

    def mover_off(self, node: str) -> str:
        """Why ``node``'s exporter cannot move a pod's memory now; "" when it can: its
        target is up and its memory mover's totals are fresh."""
        instance, why = self.instance(node)
        if instance is None:
            return why
        age = self.mover_age.get((node, instance))
        if age is None:
            return f"the exporter of {node} does not run --memory-mover"
        if age > self.stale_after:
            return f"the memory mover of {node} last reported {age:.0f}s ago"
        return ""

    def cpu_manager(self, node: str) -> tuple[dict[str, str] | None, int | None, str]:
        """(the options ``node``'s kubelet runs its static CPU manager with, its CPUs a
        core, "") as its one exporter target says now; (None, None, why) when it says no
        static policy or nothing: then no option is known to be off, nor on."""
        instance, why = self.instance(node)
        if instance is None:
            return None, None, why
        policy = self.cpu_policy.get((node, instance))
        if policy is None:
            return None, None, f"the exporter of {node} does not read the kubelet's config"
        if policy != "static":
            return None, None, f"the kubelet of {node} runs the {policy} CPU manager policy"
        per_core = self.cpus_per_core.get((node, instance))
        known = per_core is not None and per_core >= 1 and per_core == int(per_core)
        whole = int(per_core) if known else None  # a count to divide by, or none
        return self.cpu_options.get((node, instance), {}), whole, ""

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
            age = self.sample_age(f)
            if age is None or age > self.stale_after:
                why = "no recent sample says so" if age is None else f"newest sample {age:.0f}s old"
        if why:
            return "stale_data", why
        n = self.series.get((f.kind, f.instance, f.pod_uid, f.reason, f.device), 0)
        if n > 1:  # one exporter writes one: the others are someone else's
            return "evidence_mismatch", f"{n:g} series say {f.kind} {f.reason} of the pod"
        if extra := self.foreign.get((f.kind, f.pod_uid, f.reason)):
            return "evidence_mismatch", (
                f"a series saying {f.kind} {f.reason} has labels no exporter writes: "
                + ", ".join(sorted(extra))
            )
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
            how, _ = mechanism(pod.resources, pod.claims, f.profile)
            if how is None:
                return "evidence_mismatch", (
                    f"the pod requests neither {wanted} nor a claim selecting {f.profile}"
                )
        return None, ""

    def sample_age(self, f: Finding) -> float | None:
        """How old the newest sample saying ``f`` is; None: no sample says it."""
        kind = KINDS[f.kind]
        return self.ages.get((kind.age, *(getattr(f, name) for name in kind.age_of)))


def columns(df: pd.DataFrame, *names: str):
    """Rows of ``df`` as tuples of the named columns ("" for a label no row had)."""
    return zip(*(df[n] if n in df else [""] * len(df) for n in names), strict=True)


def labelled(df: pd.DataFrame):
    """Each row's labels that have a value, by name (a frame fills "" where a row had none)."""
    names = [n for n in df.columns if n != "value"]
    for values in zip(*(df[n] for n in names), strict=True):
        yield {n: v for n, v in zip(names, values, strict=True) if v != ""}
