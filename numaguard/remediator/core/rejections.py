"""Pods the kubelet refused at admission for NUMA alignment (pure).

A kubelet whose Topology Manager cannot align a pod (``TopologyAffinityError``), or whose
CPU manager cannot give it whole cores (``SMTAlignmentError``), leaves it ``Failed``; its
ReplicaSet makes another, which the NUMA-blind scheduler may send to the same node to
fail again, hundreds of times (kubernetes #84869, #84757), and nothing cleans them up.
Here they are grouped by workload, node and reason; the failed pods beyond the newest
few (kept for diagnosis) are deleted — they run nothing, so no disruption budget is at
stake — under the guards that apply to them, and a node with a NUMA zone that could take
the pod aligned is named.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from numaguard.contract.names import OPT_OUT
from numaguard.remediator.core.capacity import Capacity
from numaguard.remediator.core.needs import Need
from numaguard.remediator.core.policy import Policy

ADMISSION_REJECTIONS = ("TopologyAffinityError", "SMTAlignmentError")
_SMT = ADMISSION_REJECTIONS[1]
# the kubelet's SMTAlignmentError texts (cpumanager/policy_static.go): a CPU count that is
# no multiple of the CPUs a core, or too few whole cores free
_NOT_MULTIPLE = re.compile(r"requested (\d{1,6}) cpus not multiple cpus per core = (\d{1,6})")
_NO_WHOLE_CORES = re.compile(r"not enough free physical CPUs: available physical CPUs = (\d{1,6})")


@dataclass(frozen=True)
class RejectedPod:
    namespace: str
    name: str
    uid: str
    node: str
    reason: str  # one of ADMISSION_REJECTIONS
    created: float
    workload: str  # kind/namespace/name of its top owner; "" for a bare pod
    need: Need  # what it asked for, all of it on one NUMA node to be admitted
    annotations: dict[str, str] = field(default_factory=dict)
    # its owner chain resolved, by uid, to a Deployment, StatefulSet or ReplicaSet that
    # exists: only then do its surplus pods get deleted (a Job's, a custom resource's, a
    # missing owner's are reported, never deleted)
    owned: bool = False
    message: str = ""  # its status message, the kubelet's words


@dataclass(frozen=True)
class Storm:
    """A workload's pods rejected on one node for one reason."""

    workload: str
    node: str
    reason: str
    pods: tuple[RejectedPod, ...]  # newest first
    delete: tuple[RejectedPod, ...]  # the ones to delete this cycle
    guard: str  # why none of the surplus is deleted; "" when nothing holds them back
    fit: tuple[str, str] | None  # (node, NUMA node) whose zone could take it aligned
    dry_run: bool

    @property
    def namespace(self) -> str:
        return self.pods[0].namespace

    @property
    def key(self) -> tuple[str, str, str]:
        return (self.workload, self.node, self.reason)


def storms(rejected: list[RejectedPod], capacity: Capacity | None, policy: Policy) -> list[Storm]:
    """The workloads' rejected pods, and which of them to delete: all but the newest
    ``keep_rejected_pods`` of each, at most ``max_rejected_deletes_per_cycle`` in all.
    A bare pod is no storm (nothing makes another), and is left alone. Under
    ``ignore`` they are still counted (the metric), no more."""
    mode = policy.enforcement.topology_affinity_error
    groups: dict[tuple[str, str, str], list[RejectedPod]] = {}
    for pod in rejected:
        if pod.workload:
            groups.setdefault((pod.workload, pod.node, pod.reason), []).append(pod)
    budget = policy.max_rejected_deletes_per_cycle
    out = []
    for (workload, node, reason), pods in sorted(groups.items()):
        pods.sort(key=lambda p: (-p.created, p.name))
        surplus = [
            p for p in pods[policy.keep_rejected_pods :] if p.annotations.get(OPT_OUT) != "false"
        ]
        guard = ""
        if mode == "ignore":
            guard = "ignored"
        elif not pods[0].owned:
            guard = "unsupported_owner"
        elif policy.paused:
            guard = "paused"
        elif pods[0].namespace in policy.protected_namespaces:
            guard = "protected_namespace"
        elif mode == "recommend":
            guard = "recommend"
        elif surplus and not budget:
            guard = "cap_cycle"
        delete = () if guard else tuple(surplus[:budget])
        budget -= len(delete)
        # a refused pod holds nothing anywhere: no uid gives anything back
        zones = capacity.fitting(pods[0].need, "") if capacity is not None else ()
        fit = capacity.name(int(zones[0])) if len(zones) else None
        out.append(Storm(workload, node, reason, tuple(pods), delete, guard, fit, policy.dry_run))
    return out


def describe(storm: Storm) -> str:
    """What the Event on the workload says."""
    newest = storm.pods[0]
    text = f"{len(storm.pods)} pods rejected by the kubelet on {storm.node} ({storm.reason}): "
    if rounded := _rounded(newest):  # refused wherever the option is on: no room helps
        text += rounded
    else:
        cores = _NO_WHOLE_CORES.search(newest.message) if storm.reason == _SMT else None
        text += (
            f"only {cores[1]} CPUs in whole free cores there, not {newest.need.describe()}"
            if cores
            else f"no NUMA zone there has {newest.need.describe()}"
        )
        if storm.fit is not None:
            text += f"; {storm.fit[0]} NUMA node {storm.fit[1]} has room for it aligned"
        else:
            text += "; no fresh node has room for it aligned"
    if storm.delete:
        verb = "would delete" if storm.dry_run else "deleting"
        text += f"; {verb} {len(storm.delete)}, keeping the newest"
    elif storm.guard:
        text += f"; none deleted ({storm.guard})"
    return text


def _rounded(pod: RejectedPod) -> str:
    """For a CPU count the kubelet's full-pcpus-only option refuses: the counts it
    admits, from the kubelet's own words; "" otherwise."""
    m = _NOT_MULTIPLE.search(pod.message) if pod.reason == _SMT else None
    if m is None or int(m[2]) < 1:
        return ""
    asked, per_core = int(m[1]), int(m[2])
    up = -(-asked // per_core) * per_core
    down = f" (or {up - per_core})" if up > per_core else ""
    return (
        f"its full-pcpus-only CPU manager gives whole cores of {per_core} CPUs only, and "
        f"{asked} CPUs are not: ask {up} CPUs{down}"
    )
