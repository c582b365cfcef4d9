"""The remediator's functional core, without I/O: findings with hysteresis, sizing, and
the planner's fit check and every guard."""

from __future__ import annotations

from collections import Counter

import pandas as pd
import pytest

from remediator.findings import Detection, FindingState, smallest_fit, update
from remediator.planner import (
    GUARDS,
    PodInfo,
    Policy,
    WorkloadHistory,
    plan,
)
from remediator.queries import expressions
from remediator.signals import Signals

GIB = 1 << 30
NOW = 1_800_000_000.0


def signals(**frames: list[dict]) -> Signals:
    """Signals with the given rows per query; every other query answers nothing."""
    out = {name: pd.DataFrame({"value": pd.Series(dtype=float)}) for name in expressions()}
    for name, rows in frames.items():
        assert name in out, name
        out[name] = pd.DataFrame(rows)
    return Signals(NOW, out)


def healthy(*nodes: str) -> dict:
    return {
        "collector_age": [{"node": n, "collector": "pod_placement", "value": 5.0} for n in nodes],
        "collector_success": [
            {"node": n, "collector": "pod_placement", "value": 1.0} for n in nodes
        ],
    }


def zone(node: str, numa: str, cpus: float, memory_gib: float, devices=None) -> dict:
    return {
        "zone_free_cpus": [{"node": node, "numa_node": numa, "value": cpus}],
        "zone_free_memory": [{"node": node, "numa_node": numa, "value": memory_gib * GIB}],
        "zone_free_devices": [
            {"node": node, "numa_node": numa, "resource": r, "value": v}
            for r, v in (devices or {}).items()
        ],
    }


def merge(*parts: dict) -> dict:
    out: dict[str, list] = {}
    for part in parts:
        for k, v in part.items():
            out.setdefault(k, []).extend(v)
    return out


def cross_numa(pod: str, node: str = "n1", reason: str = "device_remote") -> dict:
    row = {
        "node": node,
        "namespace": "ml",
        "pod": pod,
        "pod_uid": f"uid-{pod}",
        "reason": reason,
        "value": 1.0,
    }
    return {"cross_numa_sustained": [row], "cross_numa_seen": [row]}


def needs(pod: str, cpus: float, memory_gib: float, gpu: str = "nvidia.com/gpu") -> dict:
    ids = {"node": "n1", "namespace": "ml", "pod": pod, "pod_uid": f"uid-{pod}"}
    return {
        "pod_exclusive_cpus": [{**ids, "value": cpus}],
        "pod_memory": [{**ids, "value": memory_gib * GIB}],
        "holders": [
            {**ids, "gpu_uuid": f"GPU-{pod}", "mig_uuid": "", "resource": gpu, "value": 1.0}
        ],
    }


def pod_info(name: str, **kw) -> PodInfo:
    defaults = dict(
        namespace="ml",
        name=name,
        uid=f"uid-{name}",
        node="n1",
        created=NOW - 3600,
        owner_kind="ReplicaSet",
        owner_name=f"{name}-rs",
        workload=f"Deployment/ml/{name}",
    )
    return PodInfo(**{**defaults, **kw})


def run(sig: Signals, pods: list[PodInfo], policy=None, history=None):
    policy = policy or Policy(dry_run=False)
    findings = list(update(FindingState(), sig).open.values())
    return plan(findings, {p.uid: p for p in pods}, sig, policy, history or {}, NOW)


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
            needs("b", 8, 8),
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


def test_stale_or_failing_collectors_mean_no_action():
    parts = [
        cross_numa("p"),
        needs("p", 1, 1),
        zone("n2", "0", 64, 512, devices={"nvidia.com/gpu": 8}),
        healthy("n2"),
    ]
    old = {"collector_age": [{"node": "n1", "collector": "gpu", "value": 95.0}]}
    failing = {"collector_success": [{"node": "n1", "collector": "pod_resources", "value": 0}]}
    for bad in (old, failing):
        result = run(signals(**merge(*parts, bad)), [pod_info("p")])
        assert not result.actions
        assert [r.guard for r in result.refusals] == ["stale_data"]


def test_caps_hold_under_a_hundred_findings():
    parts = [
        zone(f"spare{i}", "0", 1000, 10_000, devices={"nvidia.com/gpu": 100}) for i in range(5)
    ]
    pods = []
    for i in range(100):
        node, ns = f"n{i % 10}", f"team{i % 4}"
        name = f"p{i}"
        parts += [cross_numa(name, node=node), needs(name, 1, 1), healthy(node)]
        # pairs of pods share a workload
        pods.append(pod_info(name, node=node, namespace=ns, workload=f"Deployment/{ns}/w{i // 2}"))
    for i in range(5):
        parts.append(healthy(f"spare{i}"))
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
    in_flight = {wl: WorkloadHistory(last_action=NOW - 10**6, in_flight=1)}
    assert [r.guard for r in run(sig, [pod_info("p")], policy, in_flight).refusals] == [
        "cap_workload"
    ]


def starved_row(pod: str, reason: str) -> dict:
    row = {
        "node": "n1",
        "namespace": "ml",
        "pod": pod,
        "pod_uid": f"uid-{pod}",
        "reason": reason,
        "gpu": "0",
        "gpu_uuid": "GPU-1",
        "mig_uuid": "",
        "value": 1.0,
    }
    return {"starved_sustained": [row], "starved_seen": [row]}


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
        "value": 1.0,
    }
    return {
        "slice_sm": [{**ids, "value": sm}],
        "slice_sm_peak": [{**ids, "value": sm}],
        "slice_memory_peak": [{**ids, "value": memory_gib * GIB}],
        "slice_memory_total": [{**ids, "value": 40 * GIB}],
        "holders": [holder],
    }


def test_oversized_slice_resized_only_when_opted_in():
    sig = signals(
        **merge(
            healthy("n1", "n2"),
            sizing_rows(sm=0.1, memory_gib=6),
            zone("n2", "0", 0, 0, devices={"nvidia.com/mig-1g.10gb": 2}),
        )
    )
    opted = pod_info("infer", workload_annotations={"numaguard.io/auto-resize": "true"})
    result = run(sig, [opted])
    assert [(a.kind, a.finding.recommended) for a in result.actions] == [("resize", "1g.10gb")]
    assert "3g.40gb -> 1g.10gb" in result.actions[0].detail
    result = run(sig, [pod_info("infer")])
    assert [(a.kind, a.finding.recommended) for a in result.actions] == [("recommend", "1g.10gb")]
    # opted in, but no such slice free anywhere: nothing to patch to
    sig = signals(**merge(healthy("n1"), sizing_rows(sm=0.1, memory_gib=6)))
    assert [r.guard for r in run(sig, [opted]).refusals] == ["no_fit"]


def test_saturated_slice_is_undersized():
    sig = signals(**merge(healthy("n1"), sizing_rows(sm=0.95, memory_gib=20)))
    result = run(sig, [pod_info("infer")])
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
    sig = signals(
        **merge(
            healthy("n1", "n2"),
            starved_row("feeder", "cpu_pressure"),
            {
                "llc_share": [
                    {**feeder, "l3_domain": "0", "value": 0.1},
                    {**noisy, "l3_domain": "0", "value": 0.7},
                    {**quiet, "l3_domain": "0", "value": 0.1},
                    {**elsewhere, "l3_domain": "1", "value": 0.9},  # not the feeder's L3
                ]
            },
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
