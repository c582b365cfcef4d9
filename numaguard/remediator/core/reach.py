"""Reachability (pure): whether a pod made from its owner's template may run on a node,
as the kube-scheduler's filters decide it — nodeSelector, required node affinity, taints
against tolerations, a cordoned or not Ready node, and the whole pod's requests within
what the node's allocatable has left. A zone fits only on a node the replacement can
reach; the planner asks this of every node whose zone would fit."""

from __future__ import annotations

from dataclasses import dataclass, field

# Nodes with a fitting zone looked up per finding, roomiest first, and the most a
# replacement is steered to: the API requests follow the findings, not the cluster
NODES_PER_FINDING = 8
# taints the scheduler filters on; PreferNoSchedule only scores
_FILTERING_EFFECTS = ("NoSchedule", "NoExecute")
UNSCHEDULABLE_TAINT = "node.kubernetes.io/unschedulable"


@dataclass(frozen=True)
class Placement:
    """Where a pod made from a template may be scheduled, and what it asks of the node."""

    node_selector: dict[str, str] = field(default_factory=dict)
    # required node affinity's nodeSelectorTerms (any one must match); None: no affinity
    terms: tuple[dict, ...] | None = None
    tolerations: tuple[dict, ...] = ()
    requests: dict[str, float] = field(default_factory=lambda: {"pods": 1.0})


@dataclass(frozen=True)
class NodeFacts:
    """What the API server says about a node, as far as reachability needs it."""

    name: str
    labels: dict[str, str] = field(default_factory=dict)
    taints: tuple[dict, ...] = ()
    unschedulable: bool = False
    ready: bool = True
    allocatable: dict[str, float] = field(default_factory=dict)
    requested: dict[str, float] = field(default_factory=dict)  # by the pods bound to it


def excluded(
    placement: Placement, node: NodeFacts, given_back: dict[str, float] | None = None
) -> str | None:
    """Why a pod of ``placement`` cannot be scheduled to ``node`` (the constraint, as
    an Event says it), or None. ``given_back``: requests on the node that will be
    free by then (the evicted pod's own, on its own node)."""
    if not node.ready:
        return "not Ready"
    if node.unschedulable and not _tolerated(
        placement.tolerations, {"key": UNSCHEDULABLE_TAINT, "effect": "NoSchedule"}
    ):
        return "cordoned"
    for key, value in placement.node_selector.items():
        if node.labels.get(key) != value:
            return f"nodeSelector {key}={value}"
    if placement.terms is not None and not any(_term(t, node) for t in placement.terms):
        return "required node affinity"
    for taint in node.taints:
        if taint.get("effect") in _FILTERING_EFFECTS and not _tolerated(
            placement.tolerations, taint
        ):
            value = f"={taint['value']}" if taint.get("value") else ""
            return f"taint {taint.get('key')}{value}:{taint.get('effect')}"
    back = given_back or {}
    for resource, need in sorted(placement.requests.items()):
        free = node.allocatable.get(resource, 0.0) - node.requested.get(resource, 0.0)
        free += back.get(resource, 0.0)
        if need > free:
            return f"requests {resource} {need:g}, {max(free, 0):g} of allocatable left"
    return None


def _tolerated(tolerations: tuple[dict, ...], taint: dict) -> bool:
    """As the API's Toleration.ToleratesTaint: effect empty or equal; an empty key with
    Exists tolerates every taint; Exists matches the key, Equal (the default) its value."""
    for t in tolerations:
        if t.get("effect") and t.get("effect") != taint.get("effect"):
            continue
        operator = t.get("operator") or "Equal"
        if not t.get("key"):
            if operator == "Exists":
                return True
            continue
        if t["key"] != taint.get("key"):
            continue
        if operator == "Exists" or (t.get("value") or "") == (taint.get("value") or ""):
            return True
    return False


def _term(term: dict, node: NodeFacts) -> bool:
    """One nodeSelectorTerm: every expression and field must match; an empty term
    matches no node (as the API defines it)."""
    expressions = term.get("matchExpressions") or []
    fields = term.get("matchFields") or []
    if not expressions and not fields:
        return False
    return all(_requirement(r, node.labels) for r in expressions) and all(
        _requirement(r, {"metadata.name": node.name}) for r in fields
    )


def _requirement(r: dict, labels: dict[str, str]) -> bool:
    key, operator, values = r.get("key"), r.get("operator"), r.get("values") or []
    present = key in labels
    if operator == "In":
        return present and labels[key] in values
    if operator == "NotIn":
        return not present or labels[key] not in values
    if operator == "Exists":
        return present
    if operator == "DoesNotExist":
        return not present
    if operator in ("Gt", "Lt") and present and len(values) == 1:
        try:
            have, bound = int(labels[key]), int(values[0])
        except ValueError:
            return False
        return have > bound if operator == "Gt" else have < bound
    return False
