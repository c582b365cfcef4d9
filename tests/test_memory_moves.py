"""The remediator's first remedy for remote memory (pure): where the pod's node can move
its memory home in place (its exporter runs --memory-mover and reports now), and the
pod's CPUs are right, the planner asks for that instead of an eviction, under every
guard that protects a running pod; it evicts instead where a move cannot work or was
tried on that pod already. The move is recorded first and judged on the same pod."""

from __future__ import annotations

import pytest

from numaguard.contract.names import REQUEST_ANNOTATION
from numaguard.remediator.controller import Controller
from numaguard.remediator.core.actions import after_action
from numaguard.remediator.core.history import Pending, WorkloadHistory, described
from numaguard.remediator.core.kinds import MIGRATE_MEMORY
from numaguard.remediator.core.outcome import Activity, gain, judged
from numaguard.remediator.core.policy import Policy
from tests.helpers.planner_rows import (
    NOW,
    cross_numa,
    healthy,
    merge,
    needs,
    pod_info,
    run,
    signals,
    starved_row,
    zone,
)
from tests.helpers.verification_rows import POLICY, Answers, verdicts

MIB = 1 << 20


def holds(pod: str, local_mib: float, remote_mib: float, node: str = "n1") -> dict:
    """The pod's one exclusive CPU on NUMA node 0, and its memory on nodes 0 and 1."""
    ids = {"node": node, "namespace": "ml", "pod": pod, "pod_uid": f"uid-{pod}"}
    return {
        "pod_exclusive_cpus": [{**ids, "numa_node": "0", "value": 1.0}],
        "pod_memory": [
            {**ids, "numa_node": "0", "value": local_mib * MIB},
            {**ids, "numa_node": "1", "value": remote_mib * MIB},
        ],
    }


def mover(node: str = "n1", age: float = 3.0) -> dict:
    return {"mover_age": [{"node": node, "value": age}]}


def remote(pod: str = "cache", free_gib: float = 8, *parts: dict) -> dict:
    """A pod with 256 MiB home and 768 MiB on the far node, on n1, whose NUMA node 0
    has ``free_gib`` free; n2 has room for all of it (an eviction would fit)."""
    return merge(
        healthy("n1", "n2"),
        cross_numa(pod, reason="memory_remote"),
        holds(pod, 256, 768),
        zone("n1", "0", 4, free_gib),
        zone("n1", "1", 0, 64),
        zone("n2", "0", 8, 64),
        *parts,
    )


def cache(**kw):
    return pod_info("cache", **{"resources": frozenset(), **kw})


def test_remote_memory_is_moved_home_in_place_where_the_node_can():
    result = run(signals(**remote("cache", 8, mover())), [cache()])
    (action,) = result.actions
    assert (action.kind, action.pod.name, action.dry_run) == (MIGRATE_MEMORY, "cache", False)
    assert action.detail == "move 768 MiB of memory home to NUMA node 0, in place"
    assert action.nodes == () and not result.refusals
    # a dry run says what it would do, and does nothing
    (dry,) = run(signals(**remote("cache", 8, mover())), [cache()], Policy()).actions
    assert (dry.kind, dry.dry_run) == (MIGRATE_MEMORY, True)


@pytest.mark.parametrize(
    ("case", "parts", "pod"),
    [
        # the node's exporter does not run --memory-mover, or has not reported lately
        ("no mover", (), cache()),
        ("mover stale", (mover(age=300),), cache()),
        ("another node's mover", (mover("n2"),), cache()),
        # a move was asked of this pod before: it did not hold, or it would not be open
        ("moved before", (mover(),), cache(annotations={REQUEST_ANNOTATION: "1799990000"})),
        # its CPUs span both NUMA nodes too: moving memory cannot fix that
        ("cpus split", (mover(), cross_numa("cache", reason="cpu_span")), cache()),
    ],
)
def test_where_a_move_cannot_work_the_pod_is_evicted(case, parts, pod):
    result = run(signals(**remote("cache", 8, *parts)), [pod])
    assert [a.kind for a in result.actions] == ["evict"], (case, result)
    assert "n2 NUMA node 0" in result.actions[0].detail


def shared_pool(pod: str, parts: dict) -> dict:
    """``parts`` with the pod's exclusive CPUs taken away: a Burstable pod of the shared
    pool, measured on node 0's CPUs but held there by no kubelet."""
    cpus = [r for r in parts["pod_exclusive_cpus"] if r["pod"] != pod]
    return {**parts, "pod_exclusive_cpus": cpus}


@pytest.mark.parametrize("parts", [(), (mover(),)], ids=["evicting", "moving"])
def test_a_shared_pool_pod_gets_a_recommendation_never_an_eviction(parts):
    """Seen on a real cluster: Burstable pods evicted for remote memory, "fits aligned on
    NUMA node 1"; no zone can promise a pod of the shared pool anything."""
    result = run(signals(**shared_pool("cache", remote("cache", 8, *parts))), [cache()])
    assert [(a.kind, a.dry_run) for a in result.actions] == [("recommend", True)]
    assert "shared CPU pool" in result.actions[0].detail
    assert "Guaranteed QoS" in result.actions[0].detail and not result.refusals
    # a GPU starved by where it hangs, on a pod of the shared pool: the same
    gpu_pod = merge(
        healthy("n1", "n2"),
        needs("feeder", 0, 1),
        starved_row("feeder", "device_remote"),
        zone("n2", "0", 64, 512, devices={"nvidia.com/gpu": 8}),
    )
    result = run(signals(**gpu_pod), [pod_info("feeder")])
    assert [(a.kind, a.finding.kind) for a in result.actions] == [("recommend", "starved")]
    assert "shared CPU pool" in result.actions[0].detail


def test_no_room_at_home_is_the_named_guard_not_an_eviction():
    result = run(signals(**remote("cache", 0.5, mover())), [cache()])
    assert not result.actions
    ((guard, detail),) = [(r.guard, r.detail) for r in result.refusals]
    assert guard == "no_free_memory"
    assert detail == "NUMA node 0 of n1 has 512 MiB free, not the 768 MiB to move home"


def test_two_moves_to_one_numa_node_are_counted_against_its_free_memory():
    parts = merge(
        remote("cache", 1.2, mover()),
        cross_numa("other", reason="memory_remote"),
        holds("other", 0, 768),
    )
    result = run(signals(**parts), [cache(), pod_info("other", resources=frozenset())])
    assert [(a.kind, a.pod.name) for a in result.actions] == [(MIGRATE_MEMORY, "cache")]
    assert [(r.guard, r.finding.pod) for r in result.refusals] == [("no_free_memory", "other")]


@pytest.mark.parametrize(
    ("pod", "guard"),
    [
        (cache(annotations={"numaguard.io/remediate": "false"}), "opted_out"),
        (cache(namespace="kube-system"), "protected_namespace"),
        (cache(created=NOW - 60), "too_young"),
        (cache(owner_kind="DaemonSet"), "daemonset"),
        (cache(owner_kind="", owner_name="", workload=""), "bare_pod"),
    ],
)
def test_a_move_is_held_to_the_guards_of_an_eviction(pod, guard):
    result = run(signals(**remote("cache", 8, mover())), [pod])
    assert not result.actions
    assert [r.guard for r in result.refusals] == [guard]


def test_what_only_an_eviction_loses_does_not_stop_a_move():
    """Local data and DRA claims stay with a pod that keeps running."""
    for pod in (cache(local_storage=True), cache(resources=frozenset({"resource.k8s.io"}))):
        result = run(signals(**remote("cache", 8, mover())), [pod])
        assert [a.kind for a in result.actions] == [MIGRATE_MEMORY]


def test_caps_and_cooldowns_count_a_move_as_an_action():
    sig = signals(**remote("cache", 8, mover()))
    policy = Policy(dry_run=False, cooldown_seconds=100)
    recent = {"Deployment/ml/cache": WorkloadHistory(last_action=NOW - 50)}
    assert [r.guard for r in run(sig, [cache()], policy, recent).refusals] == ["cooldown"]
    capped = run(sig, [cache()], Policy(dry_run=False, max_per_node=0))
    assert [r.guard for r in capped.refusals] == ["cap_node"]


def test_the_move_is_recorded_to_be_judged_on_the_same_pod():
    (action,) = run(signals(**remote("cache", 8, mover())), [cache()]).actions
    before = Activity(node="n1", numa_nodes="0", remote_memory=0.75)
    h = after_action(None, action, "requested", NOW, before)
    (pending,) = h.pending
    assert (pending.kind, pending.reason, pending.pod_uid, pending.in_place) == (
        "cross_numa",
        "memory_remote",
        "uid-cache",
        True,
    )
    assert h.last_action == NOW
    assert WorkloadHistory.from_json(h.to_json()) == h
    # a request the API server refused records nothing
    assert after_action(None, action, "failed", NOW).pending == ()
    with pytest.raises(ValueError, match="in_place"):
        WorkloadHistory.from_json(h.to_json().replace('"in_place":true', '"in_place":"yes"'))


MOVED = Pending(
    "cross_numa",
    "memory_remote",
    NOW - 1000,
    "uid-cache",
    measured_uid="uid-cache",
    before=Activity(node="n1", numa_nodes="0", remote_memory=0.75),
    in_place=True,
)


def the_pod(uid: str = "uid-cache", created: float = NOW - 5000, phase: str = "Running"):
    return cache(uid=uid, created=created, phase=phase)


def local(uid: str, remote_share: float) -> dict:
    ids = {"node": "n1", "pod_uid": uid}
    return {
        "activity_remote_memory": [{**ids, "value": remote_share}],
        "activity_cpus": [{**ids, "numa_node": "0", "value": 1}],
    }


async def test_a_move_is_verified_on_the_pod_itself_with_its_gain():
    rows = {**verdicts(0, 0, uid="uid-cache"), **local("uid-cache", 0.02)}
    controller = Controller(Answers(rows), None, POLICY)
    # the pod made before the action is the one judged; another pod of the workload is not
    others = [the_pod(), the_pod("uid-other", NOW - 10)]
    decided, after, _ = await controller.outcome(MOVED, others, NOW)
    assert decided == "held" and after.remote_memory == pytest.approx(0.02)
    g = gain(MOVED.before, after)
    assert g.ratio == pytest.approx(0.98 / 0.25)
    assert described(MOVED, g, after) == (
        "local memory 0.25 -> 0.98 after its memory moved home in place: gain 3.92"
    )
    assert judged(decided, g, POLICY.min_fix_gain.cross_numa) == "held"
    asked = dict(controller.prometheus.asked[0])
    assert 'pod_uid=~"uid-cache"' in asked["held_throughout"]
    assert "uid-other" not in asked["held_throughout"]


async def test_a_move_that_did_not_hold_or_left_memory_remote_counts_as_failed():
    rows = {**verdicts(1, 1, uid="uid-cache"), **local("uid-cache", 0.75)}
    controller = Controller(Answers(rows), None, POLICY)
    decided, _, _ = await controller.outcome(MOVED, [the_pod()], NOW)
    assert decided == "did_not_hold"
    # held, with hardly any memory brought home: no_gain
    rows = {**verdicts(0, 0, uid="uid-cache"), **local("uid-cache", 0.74)}
    controller = Controller(Answers(rows), None, POLICY)
    decided, after, _ = await controller.outcome(MOVED, [the_pod()], NOW)
    g = gain(MOVED.before, after)
    assert judged(decided, g, POLICY.min_fix_gain.cross_numa) == "no_gain"


async def test_a_moved_pod_that_is_gone_is_unverified_by_the_deadline():
    controller = Controller(Answers({}), None, POLICY)
    assert (await controller.outcome(MOVED, [], NOW))[0] is None
    late = NOW + POLICY.verify_deadline_seconds
    assert (await controller.outcome(MOVED, [the_pod("uid-new", NOW)], late))[0] == "unverified"
