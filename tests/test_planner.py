"""The remediator's functional core, without I/O: findings with hysteresis, sizing, and
the planner's fit check and every guard."""

from __future__ import annotations

import json
import re
from collections import Counter
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from numaguard.remediator.core import queries as q
from numaguard.remediator.core.actions import DRA, PodInfo
from numaguard.remediator.core.answers import Signals
from numaguard.remediator.core.capacity import Capacity
from numaguard.remediator.core.claims import ClaimRef, claim_profile, template_name, with_profile
from numaguard.remediator.core.evidence import Evidence
from numaguard.remediator.core.findings import Detection, FindingState, smallest_fit, update
from numaguard.remediator.core.guards import GUARDS
from numaguard.remediator.core.history import (
    MAX_HISTORY_BYTES,
    MAX_PENDING,
    Pending,
    WorkloadHistory,
)
from numaguard.remediator.core.kinds import KINDS
from numaguard.remediator.core.planner import plan
from numaguard.remediator.core.policy import Enforcement, Policy
from numaguard.remediator.core.queries import Windows
from numaguard.remediator.core.rejections import describe, storms
from numaguard.remediator.core.rounds import Round, Sizing, rounds
from numaguard.simulator.cluster.fleet import open_nodes
from numaguard.simulator.parts.prometheus import as_signals
from tests.conftest import examples
from tests.helpers.planner_rows import (
    GIB,
    NOW,
    cross_numa,
    healthy,
    instance,
    merge,
    needs,
    pod_info,
    rejected,
    run,
    signals,
    starved_row,
    zone,
)


def test_cross_numa_pod_is_evicted_to_an_aligned_zone():
    sig = signals(
        **merge(
            healthy("n1", "n2"),
            cross_numa("trainer"),
            needs("trainer", 8, 32),
            zone("n1", "0", 4, 100, devices={"nvidia.com/gpu": 1}),  # too few CPUs
            zone("n2", "1", 16, 200, devices={"nvidia.com/gpu": 1}),  # fits
        )
    )
    result = run(sig, [pod_info("trainer")])
    assert [(a.kind, a.pod.name, a.dry_run) for a in result.actions] == [
        ("evict", "trainer", False)
    ]
    assert "n2 NUMA node 1" in result.actions[0].detail
    assert not result.refusals


def test_no_aligned_capacity_anywhere_is_unremediable_not_evicted():
    sig = signals(
        **merge(
            healthy("n1"),
            cross_numa("trainer"),
            needs("trainer", 8, 32),
            zone("n1", "0", 16, 100),  # CPUs and memory, but no GPU on that node
            zone("n1", "1", 2, 100, devices={"nvidia.com/gpu": 1}),  # a GPU, too few CPUs
        )
    )
    result = run(sig, [pod_info("trainer")])
    assert not result.actions
    assert [(r.guard, r.finding.pod) for r in result.refusals] == [("no_fit", "trainer")]
    assert [f.pod for f in result.unremediable] == ["trainer"]


def test_one_free_zone_is_given_once():
    sig = signals(
        **merge(
            healthy("n1", "n2"),
            cross_numa("a"),
            cross_numa("b", node="n3"),
            needs("a", 8, 8),
            needs("b", 8, 8, node="n3"),
            zone("n2", "0", 8, 64, devices={"nvidia.com/gpu": 1}),
            healthy("n3"),
        )
    )
    result = run(sig, [pod_info("a"), pod_info("b", node="n3")])
    assert [a.pod.name for a in result.actions] == ["a"]
    assert [(r.finding.pod, r.guard) for r in result.refusals] == [("b", "no_fit")]


@pytest.mark.parametrize(
    ("guard", "pod", "policy"),
    [
        ("paused", pod_info("p"), Policy(paused=True)),
        ("pod_gone", None, Policy()),
        ("protected_namespace", pod_info("p", namespace="kube-system"), Policy()),
        ("opted_out", pod_info("p", annotations={"numaguard.io/remediate": "false"}), Policy()),
        ("mirror_pod", pod_info("p", mirror=True), Policy()),
        ("daemonset", pod_info("p", owner_kind="DaemonSet"), Policy()),
        ("bare_pod", pod_info("p", owner_kind="", owner_name="", workload=""), Policy()),
        ("system_critical", pod_info("p", priority=2_000_001_000), Policy()),
        ("system_critical", pod_info("p", priority_class="system-node-critical"), Policy()),
        ("local_storage", pod_info("p", local_storage=True), Policy()),
        ("resource_claims", pod_info("p", resources=frozenset({"resource.k8s.io"})), Policy()),
        ("too_young", pod_info("p", created=NOW - 60), Policy()),
    ],
)
def test_protected_pods_are_never_touched(guard, pod, policy):
    sig = signals(
        **merge(
            healthy("n1"),
            cross_numa("p"),
            needs("p", 1, 1),
            zone("n2", "0", 64, 512, devices={"nvidia.com/gpu": 8}),
            healthy("n2"),
        )
    )
    result = run(sig, [pod] if pod else [], policy)
    assert not result.actions
    assert [r.guard for r in result.refusals] == [guard]


def test_local_storage_allowed_by_policy_and_every_guard_is_named():
    sig = signals(
        **merge(
            healthy("n1", "n2"),
            cross_numa("p"),
            needs("p", 1, 1),
            zone("n2", "0", 64, 512, devices={"nvidia.com/gpu": 8}),
        )
    )
    result = run(sig, [pod_info("p", local_storage=True)], Policy(allow_local_storage=True))
    assert [a.kind for a in result.actions] == ["evict"]
    assert len(set(GUARDS)) == len(GUARDS)


def test_caps_hold_under_a_hundred_findings():
    parts = [
        zone(f"spare{i}", "0", 1000, 10_000, devices={"nvidia.com/gpu": 100}) for i in range(5)
    ]
    pods = []
    for i in range(100):
        node, ns = f"n{i % 10}", f"team{i % 4}"
        name = f"p{i}"
        parts += [cross_numa(name, node=node), needs(name, 1, 1, node=node)]
        # pairs of pods share a workload
        pods.append(pod_info(name, node=node, namespace=ns, workload=f"Deployment/{ns}/w{i // 2}"))
    parts.append(healthy(*(f"n{i}" for i in range(10)), *(f"spare{i}" for i in range(5))))
    for row in merge(*parts)["cross_numa_sustained"]:
        row["namespace"] = next(p.namespace for p in pods if p.uid == row["pod_uid"])
    policy = Policy(dry_run=False, max_per_cycle=8, max_per_node=1, max_per_namespace=2)
    result = run(signals(**merge(*parts)), pods, policy)
    evicted = [a.pod for a in result.actions]
    assert len(evicted) == 8  # 4 namespaces x 2
    assert max(Counter(p.node for p in evicted).values()) == 1
    assert max(Counter(p.namespace for p in evicted).values()) == 2
    assert max(Counter(p.workload for p in evicted).values()) == 1
    guards = Counter(r.guard for r in result.refusals)
    assert set(guards) <= {"cap_cycle", "cap_node", "cap_namespace", "cap_workload"}
    assert sum(guards.values()) == 92


def test_cooldown_backoff_and_giving_up():
    sig = signals(
        **merge(
            healthy("n1", "n2"),
            cross_numa("p"),
            needs("p", 1, 1),
            zone("n2", "0", 64, 512, devices={"nvidia.com/gpu": 8}),
        )
    )
    wl = "Deployment/ml/p"
    policy = Policy(dry_run=False, cooldown_seconds=100, backoff_factor=2, give_up_after=3)
    just_now = {wl: WorkloadHistory(last_action=NOW - 50)}
    assert [r.guard for r in run(sig, [pod_info("p")], policy, just_now).refusals] == ["cooldown"]
    after = {wl: WorkloadHistory(last_action=NOW - 150)}
    assert [a.kind for a in run(sig, [pod_info("p")], policy, after).actions] == ["evict"]
    # one fix did not hold: the cooldown doubles
    failed_once = {wl: WorkloadHistory(last_action=NOW - 150, failures=1)}
    assert [r.guard for r in run(sig, [pod_info("p")], policy, failed_once).refusals] == [
        "cooldown"
    ]
    gave_up = {wl: WorkloadHistory(last_action=NOW - 10**6, failures=3)}
    assert [r.guard for r in run(sig, [pod_info("p")], policy, gave_up).refusals] == ["gave_up"]
    waiting = Pending("cross_numa", "device_remote", NOW - 10**6, "uid-old")
    in_flight = {wl: WorkloadHistory(last_action=NOW - 10**6, pending=(waiting,))}
    assert [r.guard for r in run(sig, [pod_info("p")], policy, in_flight).refusals] == [
        "cap_workload"
    ]


def test_starved_by_placement_is_moved_by_cpu_only_advised():
    base = [
        healthy("n1", "n2"),
        needs("a", 1, 1),
        needs("b", 1, 1),
        zone("n2", "0", 64, 512, devices={"nvidia.com/gpu": 8}),
    ]
    sig = signals(
        **merge(*base, starved_row("a", "device_remote"), starved_row("b", "cpu_pressure"))
    )
    result = run(sig, [pod_info("a"), pod_info("b", node="n1")])
    assert sorted((a.kind, a.pod.name) for a in result.actions) == [
        ("evict", "a"),
        ("recommend", "b"),
    ]


def sizing_rows(sm: float, memory_gib: float) -> dict:
    ids = {
        "node": "n1",
        "mig_uuid": "MIG-1",
        "mig_profile": "3g.40gb",
        "gpu": "1",
        "gpu_uuid": "GPU-1",
    }
    holder = {
        "node": "n1",
        "mig_uuid": "MIG-1",
        "gpu": "1",
        "gpu_uuid": "GPU-1",
        "namespace": "ml",
        "pod": "infer",
        "pod_uid": "uid-infer",
        "container": "main",
        "resource": "nvidia.com/mig-3g.40gb",
        "source": "kubelet",
        "value": 1.0,
    }
    return {
        "slice_sm": [{**ids, "value": sm}],
        "slice_sm_peak": [{**ids, "value": sm}],
        "slice_memory_peak": [{**ids, "value": memory_gib * GIB}],
        "slice_memory_total": [{**ids, "value": 40 * GIB}],
        "slice_age": [{**ids, "value": 1.0}],
        "holders": [holder],
    }


def opted_in_infer() -> PodInfo:
    """infer, on a 3g.40gb slice, its Deployment annotated to be resized."""
    return pod_info(
        "infer",
        workload_annotations={"numaguard.io/auto-resize": "true"},
        resources=frozenset({"nvidia.com/mig-3g.40gb"}),
    )


def test_oversized_slice_resized_only_when_opted_in():
    sig = signals(
        **merge(
            healthy("n1", "n2"),
            sizing_rows(sm=0.1, memory_gib=6),
            zone("n2", "0", 0, 0, devices={"nvidia.com/mig-1g.10gb": 2}),
        )
    )
    opted = opted_in_infer()
    result = run(sig, [opted])
    assert [(a.kind, a.finding.recommended) for a in result.actions] == [("resize", "1g.10gb")]
    assert "3g.40gb -> 1g.10gb" in result.actions[0].detail
    result = run(sig, [replace(opted, workload_annotations={})])
    assert [(a.kind, a.finding.recommended) for a in result.actions] == [("recommend", "1g.10gb")]
    # opted in, but no such slice free anywhere: nothing to patch to
    sig = signals(**merge(healthy("n1"), sizing_rows(sm=0.1, memory_gib=6)))
    assert [r.guard for r in run(sig, [opted]).refusals] == ["no_fit"]


def test_saturated_slice_is_undersized():
    sig = signals(**merge(healthy("n1"), sizing_rows(sm=0.95, memory_gib=20)))
    result = run(sig, [pod_info("infer", resources=frozenset({"nvidia.com/mig-3g.40gb"}))])
    assert [(a.finding.kind, a.finding.recommended) for a in result.actions] == [
        ("undersized", "4g.40gb")
    ]


def test_smallest_fit_covers_use_with_headroom():
    family = ["1g.10gb", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"]
    sizing = Detection(headroom=0.25)
    # 3 slices at 10% = 0.3 slice of compute; 6 GB: 1g.10gb
    assert smallest_fit(family, "3g.40gb", 0.1, 6e9, sizing) == "1g.10gb"
    # 9 GB used needs 11.25 GB: 1g.20gb
    assert smallest_fit(family, "3g.40gb", 0.1, 9e9, sizing) == "1g.20gb"
    # 3 slices at 50% = 1.5, needs 1.875 slices: 2g.20gb
    assert smallest_fit(family, "3g.40gb", 0.5, 5e9, sizing) == "2g.20gb"


def test_findings_open_when_sustained_and_close_when_gone():
    row = {
        "node": "n1",
        "namespace": "ml",
        "pod": "p",
        "pod_uid": "uid-p",
        "reason": "cpu_span",
        "value": 1.0,
    }
    state = update(FindingState(), signals(cross_numa_seen=[row]))
    assert not state.open  # seen, not yet sustained: not a finding
    state = update(state, signals(cross_numa_sustained=[row], cross_numa_seen=[row]))
    assert [f.pod for f in state.open.values()] == ["p"]
    opened = next(iter(state.opened_at.values()))
    state = update(state, signals(cross_numa_seen=[row]))  # flapping: stays open
    assert [f.pod for f in state.open.values()] == ["p"]
    assert next(iter(state.opened_at.values())) == opened
    state = update(state, signals())  # no trace in the window: closed
    assert not state.open


def test_a_noisy_neighbour_of_lower_priority_is_evicted():
    feeder = {"node": "n1", "namespace": "ml", "pod": "feeder", "pod_uid": "uid-feeder"}
    noisy = {"node": "n1", "namespace": "batch", "pod": "noisy", "pod_uid": "uid-noisy"}
    quiet = {"node": "n1", "namespace": "batch", "pod": "quiet", "pod_uid": "uid-quiet"}
    elsewhere = {"node": "n1", "namespace": "batch", "pod": "far", "pod_uid": "uid-far"}
    shares = [
        {**feeder, "l3_domain": "0", "value": 0.1},
        {**noisy, "l3_domain": "0", "value": 0.7},
        {**quiet, "l3_domain": "0", "value": 0.1},
        {**elsewhere, "l3_domain": "1", "value": 0.9},  # not the feeder's L3
    ]
    sig = signals(
        **merge(
            healthy("n1", "n2"),
            starved_row("feeder", "cpu_pressure"),
            needs("feeder", 4, 8),
            {"llc_share": shares, "llc_age": [{**r, "value": 2.0} for r in shares]},
            needs("noisy", 2, 4),
            zone("n2", "0", 64, 512, devices={"nvidia.com/gpu": 8}),
        )
    )
    pods = [pod_info("feeder", priority=1000), pod_info("noisy", namespace="batch")]
    result = run(sig, pods)
    evicted = [(a.kind, a.pod.name) for a in result.actions if a.kind == "evict"]
    assert evicted == [("evict", "noisy")]
    (eviction,) = [a for a in result.actions if a.kind == "evict"]
    assert eviction.finding.feeder == "ml/feeder"
    # the same neighbour with the feeder's priority stays
    pods = [pod_info("feeder", priority=1000), pod_info("noisy", namespace="batch", priority=1000)]
    result = run(sig, pods)
    assert [(r.finding.pod, r.guard) for r in result.refusals] == [("noisy", "not_lower_priority")]


def without(part: dict, query: str, **match) -> dict:
    """``part`` less the rows of ``query`` whose labels match."""
    rows = [r for r in part[query] if any(r.get(k) != v for k, v in match.items())]
    return {**part, query: rows}


def replaced(part: dict, query: str, value, **match) -> dict:
    rows = [
        {**r, "value": value} if all(r.get(k) == v for k, v in match.items()) else r
        for r in part[query]
    ]
    return {**part, query: rows}


ROOM = zone("n2", "0", 64, 512, devices={"nvidia.com/gpu": 8})


@pytest.mark.parametrize(
    ("case", "health", "finding", "expected"),
    [
        # the exporter was SIGKILLed: its target is down, its verdicts linger in the window
        (
            "dead exporter",
            without(healthy("n1"), "targets_up"),
            cross_numa("p"),
            "no exporter target of n1 is up",
        ),
        (
            "no collector series",
            {"targets_up": healthy("n1")["targets_up"]},
            cross_numa("p"),
            "never succeeded",
        ),
        (
            "collector old",
            replaced(healthy("n1"), "collector_age", 95.0, collector="pod_placement"),
            cross_numa("p"),
            "last succeeded 95s ago",
        ),
        (
            "collector failing",
            replaced(healthy("n1"), "collector_success", 0, collector="host_numa"),
            cross_numa("p"),
            "is failing",
        ),
        ("verdict an hour old", healthy("n1"), cross_numa("p", age=3600.0), "3600s old"),
        ("age NaN", healthy("n1"), cross_numa("p", age="NaN"), "no recent sample"),
        ("age -Inf", healthy("n1"), cross_numa("p", age="-Inf"), "no recent sample"),
        ("age +Inf", healthy("n1"), cross_numa("p", age="+Inf"), "no recent sample"),
        ("age in the future", healthy("n1"), cross_numa("p", age=-20.0), "no recent sample"),
        (
            "collector age NaN",
            replaced(healthy("n1"), "collector_age", "NaN", collector="gpu"),
            starved_row("p", "device_remote"),
            "never succeeded",
        ),
        (
            "device finding without the kubelet",
            replaced(healthy("n1"), "collector_age", 900.0, collector="pod_resources"),
            cross_numa("p"),
            "pod_resources of n1 last succeeded 900s ago",
        ),
    ],
)
def test_a_finding_without_fresh_evidence_now_is_not_acted_on(case, health, finding, expected):
    sig = signals(**merge(health, finding, needs("p", 1, 1), ROOM, healthy("n2")))
    result = run(sig, [pod_info("p")])
    assert not result.actions, case
    assert [r.guard for r in result.refusals] == ["stale_data"], case
    assert expected in result.refusals[0].detail, (case, result.refusals[0].detail)


def test_a_cpu_span_needs_no_kubelet_but_a_device_finding_does():
    health = without(healthy("n1"), "collector_age", collector="pod_resources")
    sig = signals(
        **merge(health, cross_numa("p", reason="cpu_span"), needs("p", 1, 1), ROOM, healthy("n2"))
    )
    assert [a.kind for a in run(sig, [pod_info("p")]).actions] == ["evict"]


def forged(part: dict, by: str) -> dict:
    """The same rows, served by another scrape target than the node's exporter."""
    return {q: [{**r, "instance": by} for r in rows] for q, rows in part.items()}


@pytest.mark.parametrize(
    ("case", "parts", "pod", "expected"),
    [
        (
            "series from another target",
            [forged(cross_numa("p"), "tenant-pod:8080")],
            pod_info("p"),
            "series from tenant-pod:8080",
        ),
        (
            "two targets claim the node",
            [cross_numa("p"), forged(healthy("n1"), "tenant:80")],
            pod_info("p"),
            "2 targets claim",
        ),
        ("pod on another node", [cross_numa("p")], pod_info("p", node="n7"), "runs on n7"),
        ("pod not running", [cross_numa("p")], pod_info("p", phase="Pending"), "Pending"),
        (
            "owner uid mismatch",
            [cross_numa("p")],
            pod_info("p", mismatch="its owner reference's uid is not ReplicaSet p-rs's"),
            "owner reference's uid",
        ),
        (
            "device not the kubelet's",
            [starved_row("p", "device_remote", gpu_uuid="GPU-other")],
            pod_info("p"),
            "does not attribute GPU-other",
        ),
    ],
)
def test_evidence_the_api_server_or_kubelet_contradicts_is_refused(case, parts, pod, expected):
    sig = signals(**merge(healthy("n1"), *parts, needs("p", 1, 1), ROOM, healthy("n2")))
    result = run(sig, [pod])
    assert not result.actions, case
    assert [r.guard for r in result.refusals] == ["evidence_mismatch"], case
    assert expected in result.refusals[0].detail, (case, result.refusals[0].detail)


def test_device_remote_needs_a_device_the_kubelet_gave():
    held_by_process = needs("p", 1, 1)
    held_by_process["holders"][0]["source"] = "process"
    sig = signals(**merge(healthy("n1", "n2"), cross_numa("p"), held_by_process, ROOM))
    result = run(sig, [pod_info("p")])
    assert [r.guard for r in result.refusals] == ["evidence_mismatch"]


def test_a_resize_must_name_a_slice_that_exists_and_the_pod_holds():
    opted = opted_in_infer()
    room = zone("n2", "0", 0, 0, devices={"nvidia.com/mig-1g.10gb": 2})
    rows = sizing_rows(sm=0.1, memory_gib=6)
    assert [
        a.kind for a in run(signals(**merge(healthy("n1", "n2"), rows, room)), [opted]).actions
    ] == ["resize"]
    # the exporter reports no such slice: no finding at all
    no_slice = replaced(rows, "slice_memory_total", 40 * GIB)
    no_slice["slice_memory_total"] = [{**rows["slice_memory_total"][0], "mig_uuid": "MIG-9"}]
    result = run(signals(**merge(healthy("n1", "n2"), no_slice, room)), [opted])
    assert not result.actions and not result.refusals
    # the pod does not ask for that profile: the series lie about it
    other = replace(opted, resources=frozenset({"nvidia.com/mig-1g.10gb"}))
    result = run(signals(**merge(healthy("n1", "n2"), rows, room)), [other])
    assert [r.guard for r in result.refusals] == ["evidence_mismatch"]
    assert "requests neither nvidia.com/mig-3g.40gb nor a claim" in result.refusals[0].detail
    # the kubelet did not give it the slice
    not_held = {**rows, "holders": [{**rows["holders"][0], "source": "process"}]}
    result = run(signals(**merge(healthy("n1", "n2"), not_held, room)), [opted])
    assert [r.guard for r in result.refusals] == ["evidence_mismatch"]
    assert not result.actions


def test_caps_count_the_pods_node_not_the_series_label():
    # five findings whose series name five nodes, for pods all on n1
    parts = [ROOM, healthy("n2")]
    pods = []
    for i in range(5):
        node = f"m{i}"
        parts += [healthy(node), cross_numa(f"p{i}", node=node), needs(f"p{i}", 1, 1, node=node)]
        pods.append(pod_info(f"p{i}", node="n1", workload=f"Deployment/ml/w{i}"))
    result = run(signals(**merge(*parts)), pods, Policy(dry_run=False, max_per_node=1))
    assert not result.actions
    assert {r.guard for r in result.refusals} == {"evidence_mismatch"}
    # and among pods that are where their series say, one per node
    parts = [ROOM, healthy("n1", "n2")]
    for i in range(5):
        parts += [cross_numa(f"p{i}"), needs(f"p{i}", 1, 1)]
    pods = [pod_info(f"p{i}", workload=f"Deployment/ml/w{i}") for i in range(5)]
    result = run(signals(**merge(*parts)), pods, Policy(dry_run=False, max_per_node=1))
    assert len(result.actions) == 1
    assert Counter(r.guard for r in result.refusals) == {"cap_node": 4}


def test_rows_missing_a_label_or_with_bad_values_are_dropped_not_the_cycle():
    health = healthy("n1", "n2")
    health["collector_age"].append({"node": "n1", "value": 5.0})  # no collector label
    bad_room = {
        "zone_free_cpus": [{"node": "n3", "numa_node": "0", "value": "+Inf"}],
        "zone_free_memory": [{"node": "n3", "numa_node": "0", "value": 1e15}],
        "zone_free_devices": [
            {"node": "n3", "numa_node": "0", "resource": "nvidia.com/gpu", "value": 8}
        ],
    }
    small = needs("p", 1, 1)
    small["pod_memory"][0]["value"] = -1e308  # a forged "needs nothing"
    sig = signals(**merge(health, healthy("n3"), cross_numa("p"), small, bad_room))
    assert sig.dropped == {
        ("collector_age", "missing_label"): 1,
        ("zone_free_cpus", "bad_value"): 1,
        ("pod_memory", "bad_value"): 1,
    }
    result = run(sig, [pod_info("p")])
    # its only memory row dropped: how much it holds is unknown, not nothing
    assert [(r.guard, r.detail) for r in result.refusals] == [
        ("stale_data", "no exporter says how much memory the pod holds")
    ]
    # with its memory known: n3's zone has no CPU count left, and nothing else has room
    sig = signals(**merge(health, healthy("n3"), cross_numa("p"), needs("p", 1, 1), bad_room))
    result = run(sig, [pod_info("p")])
    assert [r.guard for r in result.refusals] == ["no_fit"]


@pytest.mark.parametrize(
    ("workload", "planned"),
    [
        # its replacement, of the same name, is made only once the pod is gone
        ("StatefulSet/ml/p", ["evict: fits aligned on n1 NUMA node 0"]),
        # its replacement is admitted while the pod still terminates on its CPUs
        ("Deployment/ml/p", []),
    ],
)
def test_the_pod_s_own_capacity_counts_only_when_freed_before_its_replacement(workload, planned):
    # 8 CPUs on each NUMA node of n1 (cpu_span); n1's node 0 has 8 more free: with the 8
    # the pod gives back there, 16 fit on node 0 of its own node, and nowhere else
    spread = needs("p", 8, 4)
    spread["pod_exclusive_cpus"].append({**spread["pod_exclusive_cpus"][0], "numa_node": "1"})
    spread["holders"] = []
    sig = signals(
        **merge(
            healthy("n1"),
            cross_numa("p", reason="cpu_span"),
            spread,
            zone("n1", "0", 8, 64),
            zone("n1", "1", 0, 64),
        )
    )
    result = run(sig, [pod_info("p", workload=workload)])
    assert [a.detail for a in result.actions] == planned
    if not planned:
        assert [(r.guard, r.detail) for r in result.refusals] == [
            ("no_fit", "no NUMA zone anywhere has 16 exclusive CPUs, 4.0 GiB")
        ]


def test_a_pdb_that_keeps_refusing_backs_off_then_is_reported():
    sig = signals(**merge(healthy("n1", "n2"), cross_numa("p"), needs("p", 1, 1), ROOM))
    wl = "Deployment/ml/p"
    policy = Policy(
        dry_run=False,
        cooldown_seconds=0,
        pdb_retry_seconds=100,
        pdb_blocked_after=3,
        pdb_backoff_max_seconds=250,
    )

    def guards(refusals: int, ago: float):
        h = {wl: WorkloadHistory(pdb_refusals=refusals, last_refusal=NOW - ago)}
        result = run(sig, [pod_info("p")], policy, h)
        return [r.guard for r in result.refusals] or [a.kind for a in result.actions]

    assert guards(1, 50) == ["cooldown"]  # 100 s after the first 429
    assert guards(1, 150) == ["evict"]
    assert guards(2, 150) == ["cooldown"]  # 200 s after the second
    assert guards(3, 240) == ["pdb_blocked"]  # 400 s, bounded to 250
    assert guards(3, 260) == ["evict"]  # asked again, at the bound


def test_history_survives_its_round_trip_and_refuses_garbage():
    h = WorkloadHistory(
        last_action=NOW,
        failures=2,
        pending=(Pending("cross_numa", "cpu_span", NOW, "u-1"),),
        pdb_refusals=1,
        last_refusal=NOW - 5,
    )
    assert WorkloadHistory.from_json(h.to_json()) == h
    for text in (
        "",
        "{}",
        "[1]",
        '{"last_action": "x"}',
        h.to_json().replace('"failures":2', '"failures":-1'),
        h.to_json().replace(f'"last_action":{NOW}', '"last_action":NaN'),
        h.to_json().replace('"failures":2', '"failures":2.5'),
        h.to_json().replace('"failures":2', '"failures":Infinity'),
        h.to_json().replace('"pdb_refusals":1,', ""),  # a field missing is not a reset
        "[" * 100_000,
    ):
        with pytest.raises(ValueError):
            WorkloadHistory.from_json(text)


@settings(max_examples=examples(300), deadline=None)
@given(
    st.text(max_size=40)
    | st.builds(
        lambda d: json.dumps(d),
        st.fixed_dictionaries(
            {
                "last_action": st.floats() | st.text(max_size=3) | st.integers(),
                "failures": st.integers() | st.floats(),
                "pending": st.lists(st.dictionaries(st.text(max_size=6), st.integers()), max_size=2)
                | st.integers(),
                "pdb_refusals": st.integers(),
                "last_refusal": st.floats(),
            }
        ),
    )
)
def test_any_history_text_is_read_or_refused_never_half_read(text):
    try:
        h = WorkloadHistory.from_json(text)
    except ValueError:
        return
    assert h.failures >= 0 and h.pdb_refusals >= 0 and h.last_action >= 0
    assert WorkloadHistory.from_json(h.to_json()) == h


@pytest.mark.parametrize("mode", ["act", "recommend", "ignore"])
def test_each_kind_is_acted_on_recommended_or_ignored_as_the_policy_says(mode):
    """Cross-NUMA evictions enforced or not, while a mis-sized slice of an opted-in
    workload stays advice (mis_sized=recommend), in one plan."""
    sig = signals(
        **merge(
            healthy("n1", "n2"),
            cross_numa("trainer"),
            needs("trainer", 8, 32),
            zone("n2", "1", 16, 200, devices={"nvidia.com/gpu": 1}),
            sizing_rows(sm=0.1, memory_gib=6),
            zone("n2", "0", 0, 0, devices={"nvidia.com/mig-1g.10gb": 2}),
        )
    )
    opted = opted_in_infer()
    enforcement = Enforcement(cross_numa=mode, mis_sized="recommend")
    result = run(sig, [pod_info("trainer"), opted], Policy(dry_run=False, enforcement=enforcement))
    decided = {(a.finding.kind, a.kind, a.dry_run) for a in result.actions}
    assert ("oversized", "recommend", True) in decided  # never a resize
    assert not result.refusals
    trainer = {d for d in decided if d[0] == "cross_numa"}
    if mode == "act":
        assert trainer == {("cross_numa", "evict", False)} and not result.ignored
    elif mode == "recommend":
        assert trainer == {("cross_numa", "recommend", True)} and not result.ignored
        (advice,) = [a.detail for a in result.actions if a.finding.kind == "cross_numa"]
        assert "one NUMA node" in advice
    else:
        assert trainer == set()
        assert [f.pod for f in result.ignored] == ["trainer"]


def test_an_ignored_kind_is_not_refused_even_on_doubtful_evidence():
    """ignore: no action and no refusal (no Event), stale data or not."""
    sig = signals(**merge(cross_numa("trainer"), needs("trainer", 8, 32)))  # no target up
    policy = Policy(dry_run=False)
    assert [r.guard for r in run(sig, [pod_info("trainer")], policy).refusals] == ["stale_data"]
    ignoring = replace(policy, enforcement=Enforcement(cross_numa="ignore"))
    result = run(sig, [pod_info("trainer")], ignoring)
    assert not result.actions and not result.refusals
    assert [f.kind for f in result.ignored] == ["cross_numa"]


def capacity_of(sig: Signals) -> Capacity:
    return Capacity.from_signals(sig, set(), Evidence(sig, 10.0))


def test_a_workload_s_refused_pods_beyond_the_newest_are_deleted_and_room_is_named():
    sig = signals(
        **merge(
            healthy("n1", "n2"),
            zone("n1", "0", 4, 100, devices={"nvidia.com/gpu": 1}),  # too few CPUs
            zone("n2", "1", 16, 200, devices={"nvidia.com/gpu": 1}),  # room, aligned
        )
    )
    pods = [rejected(f"t{i}", age=i) for i in range(7)]
    pods.append(rejected("kept-by-owner", age=99, annotations={"numaguard.io/remediate": "false"}))
    pods.append(rejected("other", workload="Deployment/ml/infer"))
    pods.append(rejected("bare", workload=""))  # nothing makes another: no storm
    pods.append(rejected("smt", reason="SMTAlignmentError"))
    found = {s.key: s for s in storms(pods, capacity_of(sig), Policy(dry_run=False))}
    assert set(found) == {
        ("Deployment/ml/trainer", "n1", "TopologyAffinityError"),
        ("Deployment/ml/trainer", "n1", "SMTAlignmentError"),
        ("Deployment/ml/infer", "n1", "TopologyAffinityError"),
    }
    storm = found[("Deployment/ml/trainer", "n1", "TopologyAffinityError")]
    assert [p.name for p in storm.pods[:3]] == ["t0", "t1", "t2"]  # newest first, kept
    assert [p.name for p in storm.delete] == ["t3", "t4", "t5", "t6"]
    assert storm.fit == ("n2", "1") and not storm.guard and not storm.dry_run
    text = describe(storm)
    assert "8 pods rejected by the kubelet on n1 (TopologyAffinityError)" in text
    assert "n2 NUMA node 1 has room for it aligned" in text and "deleting 4" in text
    assert not found[("Deployment/ml/infer", "n1", "TopologyAffinityError")].delete
    # no fresh node with room: said so; nothing deleted beyond the budget
    none = storms(pods, capacity_of(signals(**healthy("n1"))), Policy(dry_run=False))
    assert {s.fit for s in none} == {None}
    assert "no fresh node has room" in describe(none[0])
    capped = storms(pods, None, Policy(dry_run=False, max_rejected_deletes_per_cycle=2))
    assert sum(len(s.delete) for s in capped) == 2


@pytest.mark.parametrize(
    ("policy", "guard"),
    [
        (Policy(dry_run=False, paused=True), "paused"),
        (Policy(dry_run=False, protected_namespaces=("kube-system", "ml")), "protected_namespace"),
        (
            Policy(dry_run=False, enforcement=Enforcement(topology_affinity_error="recommend")),
            "recommend",
        ),
        (
            Policy(dry_run=False, enforcement=Enforcement(topology_affinity_error="ignore")),
            "ignored",
        ),
        (Policy(dry_run=False, max_rejected_deletes_per_cycle=0), "cap_cycle"),
    ],
)
def test_refused_pods_are_kept_under_each_guard(policy, guard):
    (storm,) = storms([rejected(f"t{i}", age=i) for i in range(6)], None, policy)
    assert storm.guard == guard and storm.delete == () and len(storm.pods) == 6


def test_a_refused_odd_cpu_count_is_told_the_counts_full_pcpus_only_admits():
    said = "Pod was rejected: SMT Alignment Error: requested {} cpus not multiple cpus per core = 2"
    for asked, advice in ((3, "ask 4 CPUs (or 2)"), (1, "ask 2 CPUs;")):
        pods = [rejected("t", reason="SMTAlignmentError", message=said.format(asked))]
        (storm,) = storms(pods, None, Policy())
        assert f"whole cores of 2 CPUs only, and {asked} CPUs are not: {advice}" in (
            describe(storm) + ";"
        )
        assert "room for it" not in describe(storm)  # refused wherever the option is on
    # too few whole cores free: the kubelet's count, and where there is room
    text = "SMT Alignment Error: not enough free physical CPUs: available physical CPUs = 2, "
    pods = [rejected("t", reason="SMTAlignmentError", message=text + "requested CPUs = 4")]
    (storm,) = storms(pods, None, Policy())
    assert "only 2 CPUs in whole free cores there, not 8 exclusive CPUs" in describe(storm)
    # words it cannot read: what the kubelet was asked is said, no count made up
    pods = [rejected("t", reason="SMTAlignmentError", message="cpus per core = " + "9" * 5000)]
    (storm,) = storms(pods, None, Policy())
    assert "no NUMA zone there has 8 exclusive CPUs" in describe(storm)


def test_a_dry_run_says_what_it_would_delete():
    (storm,) = storms([rejected(f"t{i}", age=i) for i in range(5)], None, Policy())
    assert storm.dry_run and len(storm.delete) == 2
    assert "would delete 2" in describe(storm)


def test_plan_output_shows_ignored_findings_and_refused_pods():
    from numaguard.remediator.core.cycle_report import CycleReport
    from numaguard.remediator.report import render

    sig = signals(**merge(healthy("n1"), cross_numa("trainer"), needs("trainer", 8, 32)))
    ignoring = Policy(dry_run=False, enforcement=Enforcement(cross_numa="ignore"))
    report = CycleReport(findings=list(update(FindingState(), sig).open.values()))
    report.plan = run(sig, [pod_info("trainer")], ignoring)
    report.storms = storms([rejected(f"t{i}", age=i) for i in range(5)], None, Policy())
    rows = [line.split()[:4] for line in render(report, "table").splitlines()[2:]]
    assert ["ml/trainer", "cross_numa:device_remote", "ignored", "policy"] in rows
    assert ["Deployment/ml/trainer", "rejected:TopologyAffinityError", "delete", "2"] in rows
    out = json.loads(render(report, "json"))
    assert out["ignored"] == [
        {"pod": "ml/trainer", "finding": "cross_numa", "reason": "device_remote"}
    ]
    (storm,) = out["rejected_pods"]
    assert storm["pods"] == 5 and storm["delete"] == ["t3", "t4"] and storm["fits_on"] is None


def test_a_policy_built_in_code_is_held_to_the_rules_a_config_file_is():
    with pytest.raises(ValueError, match=r"verify_deadline_seconds \(300\) must be at least"):
        Policy(verify_after_seconds=600, verify_deadline_seconds=300)
    with pytest.raises(ValueError, match=r"low_utilization \(0.95\) must be under saturated"):
        Detection(low_utilization=0.95)
    assert Policy(protected_namespaces=("ml", "ml")).protected_namespaces == ("kube-system", "ml")


def test_rounds_ask_only_about_what_earlier_rounds_named():
    """The rounds, driven by answers made here: each round's queries name only the pods,
    nodes and slices the answers before it named, and the finding opens as planning
    needs it."""
    asked = Round(Windows(), 'job="numaguard"', Detection(), Policy())
    composing = rounds(asked, FindingState(), Sizing())
    first = dict(next(composing))
    assert {"cross_numa_seen", "slice_candidates"} <= set(first)  # the first cycle sizes
    seen = cross_numa("a")
    second = composing.send(signals(slice_candidates=[], **seen))
    scoped_to = {name: expr for name, expr in second}
    assert 'pod_uid=~"uid-a"' in scoped_to["cross_numa_age"]
    assert "slice_memory_total" not in scoped_to  # no slice was named
    third = composing.send(signals(**healthy("n1")))
    assert {name for name, _ in third} == set(q.HOLDINGS)
    assert all('pod_uid=~"uid-a"' in expr for _, expr in third)
    zones_query = composing.send(signals(**needs("a", 4, 8)))
    assert [name for name, _ in zones_query] == ["zone_candidates"]
    candidate = {"node": "n2", "numa_node": "1", "value": 1.0}
    last = composing.send(signals(zone_candidates=[candidate]))
    assert all('node=~"n1|n2"' in expr for _, expr in last)
    with pytest.raises(StopIteration) as done:
        composing.send(signals(**healthy("n1", "n2")))
    found, state, sizing = done.value.value
    assert [(f.kind, f.pod_uid) for f in state.open.values()] == [("cross_numa", "uid-a")]
    assert sizing == Sizing(frozenset(), frozenset(), 1)
    assert set(found["targets_up"]["node"]) == {"n1", "n2"}


def test_a_history_is_closed_and_bounded():
    """What a tenant who can patch its workload may write there: only known kinds with
    their own reasons, a few pending entries, a few kilobytes; anything else is an
    unreadable history (refused, never a fresh start)."""
    entry = Pending("cross_numa", "cpu_span", NOW, "u-1")
    good = json.loads(WorkloadHistory(pending=(entry,)).to_json())
    for where, value, says in (
        ("kind", "bogus", "pending.0.kind"),
        ("reason", "bogus", "cross_numa has no reason 'bogus'"),
        ("reason", "llc", "cross_numa has no reason 'llc'"),
        ("pod_uid", "u" * 300, "at most 253 characters"),
    ):
        forged = {**good, "pending": [{**good["pending"][0], where: value}]}
        with pytest.raises(ValueError, match=re.escape(says)):
            WorkloadHistory.from_json(json.dumps(forged))
    many = {**good, "pending": good["pending"] * (MAX_PENDING + 1)}
    with pytest.raises(ValueError, match="at most 8 items"):
        WorkloadHistory.from_json(json.dumps(many))
    padded = json.dumps(good, indent=MAX_HISTORY_BYTES)
    with pytest.raises(ValueError, match="over 8192 bytes"):
        WorkloadHistory.from_json(padded)
    most = {**good, "pending": good["pending"] * MAX_PENDING}
    assert len(WorkloadHistory.from_json(json.dumps(most)).pending) == MAX_PENDING


def test_a_verdict_with_a_reason_no_exporter_writes_is_no_finding():
    forged = cross_numa("trainer", reason="bogus")
    state = update(FindingState(), signals(**merge(healthy("n1"), forged)), Detection())
    assert not state.open
    real = cross_numa("trainer", reason="cpu_span")
    state = update(FindingState(), signals(**merge(healthy("n1"), real)), Detection())
    assert [f.reason for f in state.open.values()] == ["cpu_span"]


def test_refused_pods_of_an_owner_that_is_no_known_workload_are_reported_never_deleted():
    """A Job's, a custom resource's, a missing owner's failed pods: counted and said, but
    only the surplus of a Deployment, StatefulSet or ReplicaSet found by uid is deleted."""
    pods = [rejected(f"j{i}", workload="Job/ml/train", owned=False, age=i) for i in range(6)]
    pods += [rejected(f"t{i}", age=i) for i in range(6)]
    found = {s.workload: s for s in storms(pods, None, Policy(dry_run=False))}
    assert (found["Job/ml/train"].guard, found["Job/ml/train"].delete) == ("unsupported_owner", ())
    assert len(found["Job/ml/train"].pods) == 6
    assert "none deleted (unsupported_owner)" in describe(found["Job/ml/train"])
    assert [p.name for p in found["Deployment/ml/trainer"].delete] == ["t3", "t4", "t5"]


@pytest.mark.parametrize("series", [1, 2])
def test_two_series_for_one_pod_and_reason_are_a_contradiction_not_evidence(series):
    """A forged cross_numa 1 beside the exporter's own 0 for the same pod and reason
    (under honor_labels, with one more label): two series, refused; one, acted on."""
    row = {"instance": instance("n1"), "pod_uid": "uid-trainer", "reason": "device_remote"}
    sig = signals(
        **merge(
            healthy("n1", "n2"),
            cross_numa("trainer"),
            needs("trainer", 8, 32),
            zone("n2", "1", 16, 200, devices={"nvidia.com/gpu": 1}),
            {"cross_numa_series": [{**row, "value": float(series)}]},
        )
    )
    result = run(sig, [pod_info("trainer")])
    if series == 1:
        assert [a.pod.name for a in result.actions] == ["trainer"]
    else:
        assert not result.actions
        assert [(r.guard, r.detail) for r in result.refusals] == [
            ("evidence_mismatch", "2 series say cross_numa device_remote of the pod")
        ]


@pytest.mark.parametrize(
    "extra, refused",
    [
        ({}, ""),
        # what the target adds to every series it exposes (discovery, relabelling)
        ({"service": "numaguard-exporter", "cluster": "gpu-a"}, ""),
        ({"container_id": "x"}, "container_id"),
        ({"service": "numaguard-exporter", "forged": "1", "gpu_uuid": "GPU-x"}, "forged, gpu_uuid"),
    ],
)
def test_a_verdict_with_labels_no_exporter_writes_is_a_contradiction(extra, refused):
    """The only series saying so, but with a label the catalogue does not declare for
    the verdict and its target does not add (its build_info does not carry): someone
    else wrote it, even under the exporter's job and instance."""
    target = {"service": "numaguard-exporter", "cluster": "gpu-a"}
    up = merge(healthy("n1", "n2"))
    up["targets_up"] = [{**row, **target} for row in up["targets_up"]]
    finding = cross_numa("trainer")
    finding["cross_numa_age"] = [{**row, **target, **extra} for row in finding["cross_numa_age"]]
    sig = signals(
        **merge(
            up,
            finding,
            needs("trainer", 8, 32),
            zone("n2", "1", 16, 200, devices={"nvidia.com/gpu": 1}),
        )
    )
    result = run(sig, [pod_info("trainer")])
    if not refused:
        assert [a.pod.name for a in result.actions] == ["trainer"]
    else:
        assert not result.actions
        assert [(r.guard, r.detail) for r in result.refusals] == [
            (
                "evidence_mismatch",
                "a series saying cross_numa device_remote has labels no exporter writes: "
                + refused,
            )
        ]


HOSTILE = st.sampled_from(["n1", "n2", "uid-trainer", "ml", "trainer", "0", "1"]) | st.text(
    alphabet='a-z0."\\\n{}=~|', max_size=6
)
ROW = st.dictionaries(
    st.sampled_from(["node", "instance", "namespace", "pod", "pod_uid", "reason", "gpu_uuid"]),
    HOSTILE,
).flatmap(
    lambda labels: st.builds(
        lambda value: {**labels, "value": value},
        st.sampled_from(["1", "0", "NaN", "-1", "x", "1e999", "3600"]),
    )
)


@settings(max_examples=examples(200), deadline=None)
@given(
    answers=st.dictionaries(
        st.sampled_from(
            [
                "cross_numa_sustained",
                "cross_numa_seen",
                "cross_numa_age",
                "cross_numa_series",
                "starved_sustained",
                "targets_up",
                "collector_age",
                "collector_success",
                "pod_exclusive_cpus",
                "zone_free_cpus",
            ]
        ),
        st.lists(ROW, max_size=4),
    )
)
def test_any_rows_prometheus_could_answer_are_planned_or_refused_never_raised(answers):
    """The whole path from answers to a plan, fed what a tenant under honor_labels can
    write (newlines, quotes, braces, made-up reasons, values no number): no exception,
    no finding of a reason no exporter writes, no action on a pod the API server does
    not know, and the next round's matchers can be written."""
    sig = as_signals(NOW, answers, {"n1": instance("n1")})
    state = update(FindingState(), sig, Detection())
    findings = list(state.open.values())
    assert all(f.reason in KINDS[f.kind].reasons for f in findings)
    for label in q.MATCHED:
        values = {getattr(f, label, "") for f in findings} - {""}
        q.scoped(["holders"], label, values, Windows(), q.DEFAULT_SELECTOR)
    result = plan(
        findings,
        {"uid-trainer": pod_info("trainer")},
        sig,
        Policy(dry_run=False),
        {},
        NOW,
        open_nodes(sig),
    )
    assert all(a.pod.uid == "uid-trainer" for a in result.actions)


def test_a_finding_that_cannot_be_planned_refuses_only_itself(monkeypatch):
    """Anything unexpected while planning one finding (here, its need cannot be read)
    is that finding's refusal; the others are planned."""
    sig = signals(
        **merge(
            healthy("n1", "n2"),
            cross_numa("a"),
            cross_numa("b"),
            needs("a", 8, 32),
            needs("b", 8, 32),
            zone("n2", "1", 16, 200, devices={"nvidia.com/gpu": 2}),
        )
    )
    need = Capacity.need

    def broken_for_a(self, finding):
        if finding.pod == "a":
            raise KeyError("numa_node")
        return need(self, finding)

    monkeypatch.setattr(Capacity, "need", broken_for_a)
    result = run(sig, [pod_info("a"), pod_info("b")], Policy(dry_run=False, max_per_node=2))
    assert [a.pod.name for a in result.actions] == ["b"]
    assert [(r.finding.pod, r.guard, r.detail) for r in result.refusals] == [
        ("a", "internal", "not planned: KeyError('numa_node')")
    ]


# -- MIG slices through DRA claims ---------------------------------------------------------


def claim_spec(profile: str, quote: str = '"') -> dict:
    expression = (
        f"device.attributes[{quote}gpu.nvidia.com{quote}].profile == {quote}{profile}{quote}"
    )
    request = {
        "deviceClassName": "mig.nvidia.com",
        "selectors": [{"cel": {"expression": expression}}],
    }
    return {"devices": {"requests": [{"name": "mig", "exactly": request}]}}


def test_a_claim_s_profile_is_read_and_swapped_and_nothing_else_changes():
    for quote in ('"', "'"):
        spec = claim_spec("3g.40gb", quote)
        spec["devices"]["constraints"] = [{"matchAttribute": "gpu.nvidia.com/parentUUID"}]
        assert claim_profile(spec) == "3g.40gb"
        swapped = with_profile(spec, "3g.40gb", "1g.10gb")
        assert claim_profile(swapped) == "1g.10gb" and claim_profile(spec) == "3g.40gb"
        expression = swapped["devices"]["requests"][0]["exactly"]["selectors"][0]["cel"]
        assert (
            expression["expression"]
            == claim_spec("1g.10gb", quote)["devices"]["requests"][0]["exactly"]["selectors"][0][
                "cel"
            ]["expression"]
        )
        assert swapped["devices"]["constraints"] == spec["devices"]["constraints"]
    # by capacity, or two profiles at once: no one profile to resize from
    by_size = {
        "cel": {
            "expression": "device.capacity['gpu.nvidia.com'].memory.isGreaterThan(quantity('10Gi'))"
        }
    }
    spec = claim_spec("1g.10gb")
    assert (
        claim_profile(
            {"devices": {"requests": [{"name": "x", "exactly": {"selectors": [by_size]}}]}}
        )
        == ""
    )
    spec["devices"]["requests"].append(claim_spec("2g.20gb")["devices"]["requests"][0])
    assert claim_profile(spec) == ""
    assert claim_profile({}) == "" and claim_profile({"devices": {"requests": [None]}}) == ""
    assert template_name("infer", "1g.10gb") == "infer-mig-1g-10gb"
    assert template_name("x" * 300, "1g.10gb+me").endswith("-mig-1g-10gb-me")
    assert len(template_name("x" * 300, "1g.10gb+me")) <= 253


def dra_infer(**kw) -> PodInfo:
    """infer on a 3g.40gb slice it gets through a claim (from a template, by default)."""
    claim = ClaimRef("gpu", template="infer-mig", profile="3g.40gb")
    kw = {"claims": (claim,), "resources": frozenset({DRA}), **kw}
    return replace(opted_in_infer(), **kw)


def dra_sizing(**profiles_free) -> Signals:
    rows = sizing_rows(sm=0.1, memory_gib=6)
    rows["holders"][0]["resource"] = "gpu.nvidia.com"
    free = [
        {"node": "n2", "gpu_uuid": "GPU-9", "mig_profile": p.replace("_", "."), "value": v}
        for p, v in profiles_free.items()
    ]
    return signals(**merge(healthy("n1", "n2"), rows, {"mig_profiles_free": free}))


def test_a_slice_from_a_claim_template_is_resized_where_counters_leave_room():
    pod = dra_infer()
    result = run(dra_sizing(**{"1g_10gb": 2}), [pod])
    assert [(a.kind, a.finding.recommended) for a in result.actions] == [("resize", "1g.10gb")]
    assert not result.refusals
    # no GPU's counters leave room for one: no_fit, named
    result = run(dra_sizing(**{"2g_20gb": 1}), [pod])
    assert [(r.guard, r.detail) for r in result.refusals] == [
        ("no_fit", "no GPU's DRA counters leave room for a 1g.10gb")
    ]
    # a shared claim is other pods' too: refused by name
    shared = ClaimRef("gpu", claim="team-gpu", profile="3g.40gb")
    result = run(dra_sizing(**{"1g_10gb": 2}), [dra_infer(claims=(shared,))])
    assert [(r.guard, r.detail) for r in result.refusals] == [
        ("shared_claim", "its slice is ResourceClaim team-gpu's, which other pods may share")
    ]
    # a claim of another profile is no evidence the pod holds this one
    other = ClaimRef("gpu", template="t", profile="7g.80gb")
    result = run(dra_sizing(**{"1g_10gb": 2}), [dra_infer(claims=(other,))])
    assert [r.guard for r in result.refusals] == ["evidence_mismatch"]
    # an exporter gone stale says nothing of its counters
    stale = dra_sizing(**{"1g_10gb": 2})
    stale = signals(
        **merge(
            healthy("n1"),
            {
                k: v.to_dict("records")
                for k, v in stale.frames.items()
                if k not in ("targets_up", "collector_age", "collector_success")
            },
        )
    )
    assert [r.guard for r in run(stale, [pod]).refusals] == ["no_fit"]


def test_one_cycle_places_one_resize_per_counted_room():
    """Two pods resized to 1g.10gb; the node's counters leave room for one: the other
    is refused this cycle, not sent to the same placement."""
    first = dra_infer()
    second = replace(
        dra_infer(), uid="uid-infer-2", name="infer-2", workload="Deployment/ml/infer-2"
    )
    sig = dra_sizing(**{"1g_10gb": 1})
    rows = {k: v.to_dict("records") for k, v in sig.frames.items()}
    for name in (
        "slice_sm",
        "slice_sm_peak",
        "slice_memory_peak",
        "slice_memory_total",
        "slice_age",
    ):
        rows[name] += [dict(r, mig_uuid="MIG-2") for r in rows[name]]
    rows["holders"] += [
        dict(rows["holders"][0], mig_uuid="MIG-2", pod="infer-2", pod_uid="uid-infer-2")
    ]
    result = run(signals(**rows), [first, second])
    assert [a.kind for a in result.actions] == ["resize"]
    assert [r.guard for r in result.refusals] == ["no_fit"]


def test_a_dra_slice_behind_an_extended_resource_is_resized_where_a_device_class_maps_it():
    """nvidia.com/mig-3g.40gb in its containers, which a DeviceClass maps: the scheduler
    made its claim, so room is on the counters, and the new resource must be mapped too."""
    mapped = frozenset({"nvidia.com/mig-3g.40gb", "nvidia.com/mig-1g.10gb"})
    pod = replace(opted_in_infer(), extended_claim="infer-0-gpu-abcde", mapped=mapped)
    rows = sizing_rows(sm=0.1, memory_gib=6)
    free = [{"node": "n2", "gpu_uuid": "GPU-9", "mig_profile": "1g.10gb", "value": 2}]
    sized = signals(**merge(healthy("n1", "n2"), rows, {"mig_profiles_free": free}))
    result = run(sized, [pod])
    assert [(a.kind, a.finding.recommended) for a in result.actions] == [("resize", "1g.10gb")]
    assert not result.refusals
    unmapped = replace(pod, mapped=frozenset({"nvidia.com/mig-3g.40gb"}))
    result = run(sized, [unmapped])
    assert [(r.guard, r.detail) for r in result.refusals] == [
        ("no_fit", "no DeviceClass maps nvidia.com/mig-1g.10gb (DRA)")
    ]
    full = signals(**merge(healthy("n1", "n2"), rows, {"mig_profiles_free": []}))
    result = run(full, [pod])
    assert [(r.guard, r.detail) for r in result.refusals] == [
        ("no_fit", "no GPU's DRA counters leave room for a 1g.10gb")
    ]
