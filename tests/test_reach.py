"""Reachability and steering, pure: which nodes a replacement may be scheduled to (as
the scheduler's filters say), the no_fit refusal that names what excluded them, the
webhook configuration the remediator keeps, and the mutation its webhook answers with."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from numaguard.contract.names import STEER_ANNOTATION, STEERING_ANNOTATION
from numaguard.remediator.cluster import node_facts, placement_of, requests_of
from numaguard.remediator.controller import Controller
from numaguard.remediator.core.actions import Action
from numaguard.remediator.core.findings import FindingState, update
from numaguard.remediator.core.history import Pending, WorkloadHistory, landing
from numaguard.remediator.core.planner import plan
from numaguard.remediator.core.policy import Policy
from numaguard.remediator.core.reach import UNSCHEDULABLE_TAINT, NodeFacts, Placement, excluded
from numaguard.remediator.core.steering import (
    Steer,
    Target,
    configured,
    mutation,
    steerable,
    steered_to,
    webhook_name,
)
from tests.helpers.planner_rows import (
    NOW,
    cross_numa,
    healthy,
    merge,
    needs,
    pod_info,
    signals,
    zone,
)

GIB = float(1 << 30)


def test_the_mutation_and_the_paths_it_answers():
    pod = {"spec": {"containers": []}}
    assert mutation(pod, ("a", "b"), False) == [
        {
            "op": "add",
            "path": "/spec/affinity",
            "value": {
                "nodeAffinity": {
                    "preferredDuringSchedulingIgnoredDuringExecution": [
                        {
                            "weight": weight,
                            "preference": {
                                "matchFields": [
                                    {"key": "metadata.name", "operator": "In", "values": [n]}
                                ]
                            },
                        }
                        for n, weight in (("a", 100), ("b", 50))
                    ]
                }
            },
        }
    ]
    assert steered_to("/steer/required/200/a,b.example", 100.0) == (True, ("a", "b.example"))
    for path in (
        "/steer/always/200/a",
        "/steer/preferred/200/A_B",
        "/steer/preferred/200/",
        "/steer/preferred/a",  # as written before deadlines: no deadline, no steering
        "/steer/preferred/soon/a",
        "/other/x/200/y",
    ):
        assert steered_to(path, 100.0) is None, path
    assert steered_to("/steer/preferred/200/" + ",".join("n" * 8), 100.0) is not None
    assert steered_to("/steer/preferred/200/" + ",".join(f"n{i}" for i in range(9)), 100.0) is None
    # past its deadline an entry nobody removed steers nothing
    assert steered_to("/steer/required/200/a", 200.0) is None
    assert json.dumps(mutation(pod, ("a",), True)).count("metadata.name") == 1


def node(name="b", **kw) -> NodeFacts:
    return NodeFacts(
        name, **{"allocatable": {"cpu": 64.0, "memory": 256 * GIB, "pods": 110.0}, **kw}
    )


def test_the_scheduler_s_filters_in_the_order_an_event_names_them():
    free = Placement(requests={"cpu": 8.0, "pods": 1.0})
    assert excluded(free, node()) is None
    assert excluded(free, node(ready=False)) == "not Ready"
    assert excluded(free, node(unschedulable=True)) == "cordoned"
    tolerates_cordon = replace(
        free, tolerations=({"key": UNSCHEDULABLE_TAINT, "operator": "Exists"},)
    )
    assert excluded(tolerates_cordon, node(unschedulable=True)) is None
    pinned = replace(free, node_selector={"pool": "a"})
    assert excluded(pinned, node(labels={"pool": "b"})) == "nodeSelector pool=a"
    assert excluded(pinned, node(labels={"pool": "a"})) is None
    # requests: what the node's pods took, less what the evicted pod gives back
    busy = node(requested={"cpu": 60.0, "pods": 3.0})
    assert excluded(free, busy) == "requests cpu 8, 4 of allocatable left"
    assert excluded(free, busy, {"cpu": 4.0}) is None
    gpu = replace(free, requests={**free.requests, "nvidia.com/gpu": 1.0})
    assert excluded(gpu, node()) == "requests nvidia.com/gpu 1, 0 of allocatable left"


def test_taints_against_tolerations_as_the_api_matches_them():
    taint = {"key": "dedicated", "value": "infer", "effect": "NoSchedule"}
    tainted = node(taints=(taint,))
    said = "taint dedicated=infer:NoSchedule"
    for tolerations, ok in (
        ((), False),
        (({"key": "dedicated", "operator": "Exists"},), True),
        (({"key": "dedicated", "value": "infer"},), True),  # Equal is the default
        (({"key": "dedicated", "value": "train"},), False),
        (({"key": "dedicated", "operator": "Exists", "effect": "NoExecute"},), False),
        (({"operator": "Exists"},), True),  # an empty key with Exists: every taint
        (({"value": "infer"},), False),  # an empty key with Equal: none
    ):
        got = excluded(Placement(tolerations=tolerations), tainted)
        assert got == (None if ok else said), tolerations
    # PreferNoSchedule only scores
    soft = node(taints=({**taint, "effect": "PreferNoSchedule"},))
    assert excluded(Placement(), soft) is None


def test_required_node_affinity_terms_are_ored_and_their_requirements_anded():
    labels = {"zone": "z1", "gpus": "8"}

    def reach(*terms: dict) -> bool:
        return excluded(Placement(terms=terms), node("n7", labels=labels)) is None

    def expr(key, operator, *values):
        return {"key": key, "operator": operator, "values": list(values)}

    assert reach({"matchExpressions": [expr("zone", "In", "z1", "z2")]})
    assert not reach({"matchExpressions": [expr("zone", "NotIn", "z1")]})
    assert reach({"matchExpressions": [expr("zone", "Exists"), expr("gpus", "Gt", "4")]})
    assert not reach({"matchExpressions": [expr("zone", "Exists"), expr("gpus", "Lt", "4")]})
    assert reach({"matchExpressions": [expr("spot", "DoesNotExist")]})
    assert not reach({"matchExpressions": [expr("gpus", "Gt", "many")]})
    assert reach({"matchFields": [expr("metadata.name", "In", "n7")]})
    assert not reach({"matchFields": [expr("metadata.name", "In", "n8")]})
    assert reach(
        {"matchFields": [expr("metadata.name", "In", "n8")]},
        {"matchExpressions": [expr("zone", "In", "z1")]},
    )
    assert not reach({})  # an empty term matches no node
    assert excluded(Placement(terms=({},)), node()) == "required node affinity"


def test_whole_pod_requests_count_init_containers_sidecars_and_overhead():
    spec = {
        "initContainers": [
            {"name": "fetch", "resources": {"requests": {"cpu": "6"}}},
            {"name": "proxy", "restartPolicy": "Always", "resources": {"limits": {"cpu": "500m"}}},
        ],
        "containers": [
            {"name": "a", "resources": {"requests": {"cpu": "2", "memory": "1Gi"}}},
            {"name": "b", "resources": {"limits": {"cpu": "1", "nvidia.com/gpu": "1"}}},
        ],
        "overhead": {"cpu": "250m"},
    }
    # containers 3 + sidecar 0.5 = 3.5 < the init container's 6 (+ the sidecar before
    # it? no: it starts after), then the overhead
    assert requests_of(spec) == {
        "cpu": 6.25,
        "memory": float(GIB),
        "nvidia.com/gpu": 1.0,
        "pods": 1.0,
    }
    placement = placement_of(
        {**spec, "nodeSelector": {"pool": "a"}, "tolerations": [{"operator": "Exists"}]}
    )
    assert placement.node_selector == {"pool": "a"} and placement.terms is None
    assert len(placement.tolerations) == 1


def test_a_node_s_facts_from_its_object_and_pods():
    obj = {
        "metadata": {"name": "n1", "labels": {"pool": "a"}},
        "spec": {"unschedulable": True, "taints": [{"key": "k", "effect": "NoExecute"}]},
        "status": {
            "allocatable": {"cpu": "63500m", "memory": "250Gi", "pods": "110"},
            "conditions": [{"type": "Ready", "status": "Unknown"}],
        },
    }
    pod = {"spec": {"containers": [{"resources": {"requests": {"cpu": "2"}}}]}}
    facts = node_facts(obj, [pod, pod])
    assert facts.allocatable == {"cpu": 63.5, "memory": 250.0 * GIB, "pods": 110.0}
    assert facts.requested == {"cpu": 4.0, "pods": 2.0}
    assert not facts.ready and facts.unschedulable and facts.labels == {"pool": "a"}


def test_the_steering_configuration_keeps_only_what_awaits_verification():
    target = Target("numaguard-remediator", "PEM", url="https://127.0.0.1:8443")
    a = Steer("Deployment/ml/a", {"app": "a"}, ("n1", "n2"), False, until=100.0)
    b = Steer("StatefulSet/ml/b", {"app": "b"}, ("n3",), True, until=200.0)
    config = {"metadata": {"name": "numaguard-remediator"}}
    first = configured(config, target, 10.0, (a, b))
    assert [w["clientConfig"]["url"] for w in first["webhooks"]] == [
        "https://127.0.0.1:8443/steer/preferred/100/n1,n2",
        "https://127.0.0.1:8443/steer/required/200/n3",
    ]
    hook = first["webhooks"][0]
    assert hook["namespaceSelector"] == {"matchLabels": {"kubernetes.io/metadata.name": "ml"}}
    assert hook["failurePolicy"] == "Ignore" and hook["timeoutSeconds"] == 2
    assert (
        configured(first, target, 20.0, pending=frozenset({"Deployment/ml/a", "StatefulSet/ml/b"}))
        is None
    )
    # verified: a's entry leaves; past its deadline: b's too
    second = configured(first, target, 20.0, pending=frozenset({"StatefulSet/ml/b"}))
    assert [w["name"] for w in second["webhooks"]] == [webhook_name("StatefulSet/ml/b")]
    assert configured(second, target, 200.0)["webhooks"] == []
    # webhooks it did not write (no state for them) and an unreadable state are dropped
    forged = {**first, "webhooks": [*first["webhooks"], {"name": "x.example"}]}
    assert [w["name"] for w in configured(forged, target, 20.0)["webhooks"]] == [
        webhook_name(a.workload),
        webhook_name(b.workload),
    ]
    garbage = json.loads(json.dumps(first))
    garbage["metadata"]["annotations"][STEERING_ANNOTATION] = "[1"
    assert configured(garbage, target, 20.0)["webhooks"] == []


def test_what_cannot_be_steered_is_said():
    ok = Steer("Deployment/ml/a", {"app": "a"}, ("n1",), False, 1.0)
    assert steerable(ok) is None
    assert steerable(replace(ok, nodes=())) == "0 nodes (1 to 8 can be steered to)"
    assert steerable(replace(ok, nodes=("N_1",))) == "a node name that is no DNS subdomain"
    assert steerable(replace(ok, labels={})) == "its controller's selector has no matchLabels"
    assert steerable(replace(ok, labels={"app": "a'b"})) is not None


def test_a_planned_node_recorded_with_the_action_tells_where_the_replacement_landed():
    pending = Pending("cross_numa", "cpu_span", 1.0, "uid-a", nodes=("n1", "n2"))
    assert landing(pending, {"n2"}, "did_not_hold") == "planned"
    assert landing(pending, {"n3"}, "held") == "elsewhere_aligned"
    assert landing(pending, {"n3"}, "no_gain") == "elsewhere_aligned"
    assert landing(pending, {"n3"}, "did_not_hold") == "elsewhere_misaligned"
    assert landing(pending, {"n3"}, "unverified") is None
    assert landing(replace(pending, nodes=()), {"n1"}, "held") is None  # planned before
    history = WorkloadHistory(last_action=1.0, pending=(pending,))
    assert WorkloadHistory.from_json(history.to_json()) == history
    forged = history.to_json().replace('"n2"', '"n2\\nx"')
    with pytest.raises(ValueError, match="nodes"):
        WorkloadHistory.from_json(forged)


def test_a_node_an_eviction_this_cycle_filled_is_no_longer_reachable():
    """Two pods need 6 CPUs of requests; n2 has 8 left: the first is planned there and
    steered to it, the second is no_fit, named; a pod whose template is unknown is too."""
    sig = signals(
        **merge(
            healthy("n1", "n2"),
            cross_numa("a"),
            cross_numa("b"),
            cross_numa("c"),
            needs("a", 2, 1),
            needs("b", 2, 1),
            needs("c", 2, 1),
            zone("n1", "0", 0, 0),
            zone("n2", "1", 32, 200, devices={"nvidia.com/gpu": 3}),
        )
    )
    nodes = {
        "n1": NodeFacts("n1", allocatable={"cpu": 64.0, "pods": 110.0}),
        "n2": NodeFacts("n2", allocatable={"cpu": 10.0, "pods": 110.0}, requested={"cpu": 2.0}),
    }
    placement = Placement(requests={"cpu": 6.0, "pods": 1.0})
    pods = [
        pod_info("a", placement=placement, requests=placement.requests),
        pod_info("b", placement=placement, requests=placement.requests),
        pod_info("c", placement=None),
    ]
    findings = list(update(FindingState(), sig).open.values())
    result = plan(
        findings,
        {p.uid: p for p in pods},
        sig,
        Policy(dry_run=False, max_per_node=5),
        {},
        NOW,
        nodes,
    )
    (action,) = result.actions
    assert action.pod.name == "a" and action.nodes == ("n2",)
    refused = {r.finding.pod: r.detail for r in result.refusals}
    assert refused["b"].endswith("(requests cpu 6, 2 of allocatable left: n2)")
    assert refused["c"] == "where its replacement may run is unknown: its owner's template is"
    assert {r.guard for r in result.refusals} == {"no_fit"}


async def test_an_eviction_is_steered_before_it_is_made_and_only_where_it_can_be():
    calls = []

    class Actuator:  # the controller's writes, recorded
        async def steer(self, target, now, add=(), pending=None):
            calls.append(add)
            return "ok"

    controller = Controller(None, None, Policy(dry_run=False, verify_deadline_seconds=3600))
    controller.actuator = Actuator()
    controller.steering = Target("numaguard-remediator", "PEM", url="https://127.0.0.1:8443")
    labels = {"app": "a", "pod-template-hash": "h"}
    pod = pod_info("a", selector=labels, workload_annotations={STEER_ANNOTATION: "required"})
    await controller._steer(Action("evict", None, pod, "evict", False, ("n2", "n3")), 100.0)
    assert calls == [(Steer("Deployment/ml/a", labels, ("n2", "n3"), True, 3700.0),)]
    # a selector with expressions (none read), or steering off: nothing written
    await controller._steer(
        Action("evict", None, replace(pod, selector={}), "", False, ("n2",)), 1.0
    )
    controller.steering = None
    await controller._steer(Action("evict", None, pod, "", False, ("n2",)), 1.0)
    assert len(calls) == 1
