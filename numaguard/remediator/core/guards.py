"""The planner's guards, one record each, in the order they are checked (pure).

A guard with a ``check`` is a predicate over one pod and what is known of it (``Asked``):
its detail when it refuses, else None. The others are decided by planning itself, where
the named step says (the evidence, the room to fit, the feeder's priority), and are here
so that every refusal's name, and whether it lasts, is declared in one list."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

from numaguard.contract.names import OPT_OUT
from numaguard.remediator.core.actions import DRA, PodInfo
from numaguard.remediator.core.history import WorkloadHistory
from numaguard.remediator.core.policy import Policy

SYSTEM_CRITICAL_PRIORITY = 2_000_000_000
# Owners whose history numaguard can keep (an annotation on them), so that whoever leads
# next keeps every guard, with their API resource; pods of other owners are not acted on.
HISTORY_OWNERS = {
    "Deployment": "deployments",
    "StatefulSet": "statefulsets",
    "ReplicaSet": "replicasets",
}


@dataclass(frozen=True, slots=True)
class Asked:
    """What a guard judges: the pod, the policy, its workload's history, the time, whether
    the fix keeps the pod running (its memory moved home in place: what only an eviction
    loses does not apply), and the actions this cycle has taken so far, by scope."""

    pod: PodInfo
    policy: Policy
    history: WorkloadHistory | None
    now: float
    in_place: bool = False
    taken: Counter[str] | None = None
    resize: bool = False  # the fix swaps the pod's MIG slice through its owner


@dataclass(frozen=True, slots=True)
class Guard:
    name: str
    # it lasts until something outside the remediator changes (not a cooldown, a cap or
    # a pod too young: those pass by themselves)
    lasting: bool
    check: Callable[[Asked], str | None] | None = None
    where: str = ""  # for a guard planning decides: the step that does
    lifts: str = ""  # what would lift it, as the decision page says it


def _protected(a: Asked) -> str | None:
    return a.pod.namespace if a.pod.namespace in a.policy.protected_namespaces else None


def _opted_out(a: Asked) -> str | None:
    return f"{OPT_OUT}: false" if a.pod.annotations.get(OPT_OUT) == "false" else None


def _mirror(a: Asked) -> str | None:
    return "a static pod" if a.pod.mirror else None


def _daemonset(a: Asked) -> str | None:
    return a.pod.owner_name if a.pod.owner_kind == "DaemonSet" else None


def _bare(a: Asked) -> str | None:
    return None if a.pod.owner_kind else "no controller would recreate it"


def _unsupported_owner(a: Asked) -> str | None:
    if a.pod.workload.split("/")[0] in HISTORY_OWNERS:
        return None
    return f"{a.pod.workload}: history is kept on {sorted(HISTORY_OWNERS)}"


def _system_critical(a: Asked) -> str | None:
    pod = a.pod
    if pod.priority >= SYSTEM_CRITICAL_PRIORITY or pod.priority_class.startswith("system-"):
        return pod.priority_class or str(pod.priority)
    return None


def _local_storage(a: Asked) -> str | None:
    if a.pod.local_storage and not a.policy.allow_local_storage and not a.in_place:
        return "emptyDir or hostPath data would be lost"
    return None


def _resource_claims(a: Asked) -> str | None:
    # The scheduler allocates claims with no regard to NUMA, and a shared claim keeps
    # its devices: no eviction can be shown to bring the pod back aligned.
    if DRA in a.pod.resources and not a.in_place and not a.resize:
        return "its devices come from DRA ResourceClaims"
    return None


def _too_young(a: Asked) -> str | None:
    age = a.now - a.pod.created
    return f"{age:.0f}s old" if age < a.policy.min_pod_age_seconds else None


def _gave_up(a: Asked) -> str | None:
    h = a.history
    if h is not None and h.failures >= a.policy.give_up_after:
        return f"{h.failures} fixes did not hold"
    return None


def pdb_backoff(policy: Policy, refusals: int) -> float:
    """How long after its last 429 a workload is asked again: doubling, bounded."""
    return min(policy.pdb_retry_seconds * 2 ** (refusals - 1), policy.pdb_backoff_max_seconds)


def _pdb_wait(a: Asked) -> str | None:
    """Its PodDisruptionBudget's refusals, while the back-off after them lasts."""
    h = a.history
    if h is None or not h.pdb_refusals:
        return None
    wait = pdb_backoff(a.policy, h.pdb_refusals)
    if a.now - h.last_refusal >= wait:
        return None
    return (
        f"its PodDisruptionBudget refused {h.pdb_refusals} evictions in a row; "
        f"next try in {wait - (a.now - h.last_refusal):.0f}s"
    )


def _pdb_blocked(a: Asked) -> str | None:
    blocked = a.history is not None and a.history.pdb_refusals >= a.policy.pdb_blocked_after
    return _pdb_wait(a) if blocked else None


def _cooldown(a: Asked) -> str | None:
    h = a.history
    if h is None:
        return None
    waiting = _pdb_wait(a)  # refused fewer times than makes it pdb_blocked
    if waiting:
        return waiting
    cooldown = a.policy.cooldown_seconds * a.policy.backoff_factor**h.failures
    if a.now - h.last_action < cooldown:
        return f"acted {a.now - h.last_action:.0f}s ago (cooldown {cooldown:.0f}s)"
    return None


def _cap_cycle(a: Asked) -> str | None:
    cap = a.policy.max_per_cycle
    return f"{cap} actions this cycle" if a.taken["all"] >= cap else None


def _cap_node(a: Asked) -> str | None:
    cap = a.policy.max_per_node
    return f"{cap} on {a.pod.node} this cycle" if a.taken[f"node/{a.pod.node}"] >= cap else None


def _cap_namespace(a: Asked) -> str | None:
    cap, ns = a.policy.max_per_namespace, a.pod.namespace
    return f"{cap} in {ns} this cycle" if a.taken[f"ns/{ns}"] >= cap else None


def _cap_workload(a: Asked) -> str | None:
    cap, workload = a.policy.max_per_workload, a.pod.workload
    in_flight = (a.history or WorkloadHistory()).in_flight
    if in_flight + a.taken[f"wl/{workload}"] >= cap:
        return f"{cap} in flight for {workload}"
    return None


# Every guard, in the order the planner checks them.
GUARD_LIST = (
    Guard("paused", False, where="plan: the Lease's pause annotation", lifts="unpausing"),
    Guard(
        "stale_data",
        False,
        where="evidence.Evidence.doubt, and the room a fix needs",
        lifts="fresh data: the node's exporter up and its collectors succeeding",
    ),
    Guard("pod_gone", False, where="evidence.Evidence.doubt", lifts="nothing: the pod is gone"),
    Guard(
        "evidence_mismatch",
        False,
        where="evidence.Evidence.doubt",
        lifts="the exporters, the API server and the kubelet agreeing",
    ),
    # a defect of numaguard's own while judging it (logged with its traceback)
    Guard("internal", False, where="plan, around each finding", lifts="a fix of numaguard's"),
    Guard("protected_namespace", True, _protected, lifts="policy.protected_namespaces"),
    Guard("opted_out", True, _opted_out, lifts=f"the pod's {OPT_OUT} annotation"),
    Guard("mirror_pod", True, _mirror, lifts="nothing: the kubelet owns a static pod"),
    Guard("daemonset", True, _daemonset, lifts="nothing: a DaemonSet's pod comes back in place"),
    Guard("bare_pod", True, _bare, lifts="a controller owning the pod"),
    Guard("unsupported_owner", True, _unsupported_owner, lifts="a Deployment or StatefulSet"),
    Guard("system_critical", True, _system_critical, lifts="nothing: never evicted"),
    Guard("local_storage", True, _local_storage, lifts="policy.allow_local_storage"),
    Guard("resource_claims", True, _resource_claims, lifts="claims the planner can follow"),
    Guard("too_young", False, _too_young, lifts="the pod reaching policy.min_pod_age_seconds"),
    Guard("gave_up", True, _gave_up, lifts="a person clearing the workload's history"),
    Guard("pdb_blocked", True, _pdb_blocked, lifts="its PodDisruptionBudget allowing one"),
    Guard("cooldown", False, _cooldown, lifts="the cooldown ending"),
    Guard(
        "not_lower_priority",
        True,
        where="plan: a noisy neighbour's feeder",
        lifts="a lower priority than the pod it crowds out",
    ),
    Guard(
        "no_free_memory",
        True,
        where="planner: the room at the pod's home",
        lifts="memory freed on its CPUs' NUMA node",
    ),
    Guard(
        "no_fit",
        True,
        where="planner: a zone that takes the pod aligned",
        lifts="a NUMA zone with the room it needs, on a node its replacement may reach",
    ),
    Guard(
        "shared_claim",
        True,
        where="planner: a resize whose slice is a shared claim's",
        lifts="a claim of the workload's own",
    ),
    Guard("cap_cycle", False, _cap_cycle, lifts="the next cycle"),
    Guard("cap_node", False, _cap_node, lifts="the next cycle"),
    Guard("cap_namespace", False, _cap_namespace, lifts="the next cycle"),
    Guard("cap_workload", False, _cap_workload, lifts="its action in flight verified"),
)
GUARDS = tuple(g.name for g in GUARD_LIST)
LIFTS = {g.name: g.lifts for g in GUARD_LIST}
LASTING_GUARDS = frozenset(g.name for g in GUARD_LIST if g.lasting)
_CAPS = ("cap_cycle", "cap_node", "cap_namespace", "cap_workload")
# the pod's own guards, checked before the room for it is looked for; the caps after
POD_GUARDS = tuple(g for g in GUARD_LIST if g.check is not None and g.name not in _CAPS)
CAP_GUARDS = tuple(g for g in GUARD_LIST if g.name in _CAPS)


def first_refusal(guards: tuple[Guard, ...], asked: Asked) -> tuple[str | None, str]:
    """(the first of ``guards`` that refuses, its detail), or (None, "")."""
    for guard in guards:
        detail = guard.check(asked)
        if detail is not None:
            return guard.name, detail
    return None, ""
