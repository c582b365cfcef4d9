"""Core isolation findings in the planner (pure): a pod whose exclusive CPUs share a busy
core, or span more L3 caches than they need, is evicted only where the kubelet's option
keeps its replacement whole and a zone has the room; elsewhere the option, or the
request the option admits, is said."""

from __future__ import annotations

from numaguard.remediator.core.policy import Policy
from tests.helpers.planner_rows import GIB, healthy, merge, pod_info, run, signals, zone


def isolated(pod: str, cpus: float, reason: str = "smt_shared", node: str = "n1") -> dict:
    """A core_isolation finding's rows, and what the pod holds: CPUs and memory on NUMA
    node 0 of its node, no device."""
    ids = {"node": node, "namespace": "ml", "pod": pod, "pod_uid": f"uid-{pod}"}
    row = {**ids, "reason": reason, "value": 1.0}
    return {
        "core_isolation_sustained": [row],
        "core_isolation_seen": [row],
        "core_isolation_age": [{**row, "value": 1.0}],
        "pod_exclusive_cpus": [{**ids, "numa_node": "0", "value": cpus}],
        "pod_memory": [{**ids, "numa_node": "0", "value": 4 * GIB}],
    }


def kubelet(node: str, per_core: int = 2, policy: str = "static", **options: str) -> dict:
    """The node's kubelet's CPU manager as its exporter reads it from the config."""
    return {
        "cpu_manager": [{"node": node, "policy": policy, "reserved_cpus": "0", "value": 1.0}],
        "cpu_manager_options": [
            {"node": node, "option": o.replace("_", "-"), "setting": v, "value": 1.0}
            for o, v in options.items()
        ],
        "cpus_per_core": [{"node": node, "value": float(per_core)}],
    }


def room(node: str, numa: str, whole_cores: float = 0, one_cache: float = 0) -> dict:
    return {
        "zone_free_whole_cores": [{"node": node, "numa_node": numa, "value": whole_cores}],
        "zone_l3_most_free": [{"node": node, "numa_node": numa, "value": one_cache}],
    }


def no_devices(name: str, **kw):
    return pod_info(name, resources=frozenset(), **kw)


def test_a_node_without_full_pcpus_only_is_told_the_option_not_evicted():
    sig = signals(
        **merge(
            healthy("n1", "n2"),
            isolated("a", 4),
            isolated("b", 2),
            kubelet("n1"),  # no options: the layout would come back
            kubelet("n2", full_pcpus_only="true"),
            zone("n2", "0", 16, 64),
            room("n2", "0", whole_cores=16),
        )
    )
    result = run(sig, [no_devices("a"), no_devices("b")])
    assert [(a.kind, a.pod.name) for a in result.actions] == [
        ("recommend", "a"),
        ("recommend", "b"),
    ]
    text = result.actions[0].detail
    assert "runs without the CPU manager option full-pcpus-only" in text
    assert "2 pod(s) there" in text and "drain the node" in text
    assert not result.refusals


def test_with_the_option_a_shared_core_is_evicted_to_whole_free_cores():
    sig = signals(
        **merge(
            healthy("n1", "n2", "n3"),
            isolated("a", 4),
            kubelet("n1", full_pcpus_only="true"),  # changed without a drain
            kubelet("n2", full_pcpus_only="True"),  # as the kubelet reads it: true
            kubelet("n3"),  # the roomiest, but would share a core again
            zone("n3", "0", 64, 256),
            room("n3", "0", whole_cores=64),
            zone("n2", "0", 32, 64),
            room("n2", "0", whole_cores=2),  # 32 free CPUs, one whole core
            zone("n2", "1", 8, 64),
            room("n2", "1", whole_cores=4),
        )
    )
    result = run(sig, [no_devices("a")])
    assert [(a.kind, a.pod.name) for a in result.actions] == [("evict", "a")]
    assert "fits aligned on n2 NUMA node 1" in result.actions[0].detail


def test_the_room_in_whole_cores_is_given_once():
    sig = signals(
        **merge(
            healthy("n1", "n2"),
            isolated("a", 4),
            isolated("b", 4),
            kubelet("n1", full_pcpus_only="true"),
            kubelet("n2", full_pcpus_only="true"),
            zone("n2", "0", 32, 64),
            room("n2", "0", whole_cores=6),
        )
    )
    policy = Policy(dry_run=False, max_per_node=5, max_per_namespace=5)
    result = run(sig, [no_devices("a"), no_devices("b")], policy)
    assert [(a.kind, a.pod.name) for a in result.actions] == [("evict", "a")]
    ((pod, guard, detail),) = [(r.finding.pod, r.guard, r.detail) for r in result.refusals]
    assert (pod, guard) == ("b", "no_fit")
    assert "full-pcpus-only with 4 CPUs free in whole cores" in detail


def test_an_odd_request_is_told_the_size_full_pcpus_only_admits():
    sig = signals(
        **merge(
            healthy("n1", "n2"),
            isolated("a", 3),
            kubelet("n1", full_pcpus_only="true"),
            kubelet("n2", full_pcpus_only="true"),
            zone("n2", "0", 32, 64),
            room("n2", "0", whole_cores=32),
        )
    )
    result = run(sig, [no_devices("a")])
    ((action,),) = [result.actions]
    assert action.kind == "recommend"
    assert "would be refused (SMTAlignmentError); ask 4 CPUs" in action.detail


def test_what_no_exporter_says_of_the_kubelet_stops_even_the_advice():
    base = merge(healthy("n1", "n2"), isolated("a", 4), zone("n2", "0", 32, 64))
    for facts, why in (
        ({}, "does not read the kubelet's config"),
        (kubelet("n1", policy="none"), "runs the none CPU manager policy"),
    ):
        result = run(signals(**merge(base, facts)), [no_devices("a")])
        assert not result.actions
        ((guard, detail),) = [(r.guard, r.detail) for r in result.refusals]
        assert guard == "stale_data" and why in detail
    # the option on, but the CPUs a core unknown (or no count): whether its count is
    # admitted is unknown too
    uncounted = kubelet("n1", full_pcpus_only="true")
    uncounted["cpus_per_core"] = []
    for facts in (uncounted, kubelet("n1", per_core=0, full_pcpus_only="true")):
        result = run(signals(**merge(base, facts)), [no_devices("a")])
        assert [r.guard for r in result.refusals] == ["stale_data"]
        assert "how many CPUs a core of n1 has" in result.refusals[0].detail


def test_a_spread_over_caches_goes_to_one_cache_where_the_kubelet_prefers_it():
    option = {"prefer_align_cpus_by_uncorecache": "true"}
    sig = signals(
        **merge(
            healthy("n1", "n2"),
            isolated("a", 6, reason="l3_span"),
            kubelet("n1", **option),
            kubelet("n2", **option),
            zone("n2", "0", 32, 64),
            room("n2", "0", one_cache=4),  # 32 free, no cache with 6
            zone("n2", "1", 8, 64),
            room("n2", "1", one_cache=8),
        )
    )
    result = run(sig, [no_devices("a")])
    assert [(a.kind, a.pod.name) for a in result.actions] == [("evict", "a")]
    assert "n2 NUMA node 1" in result.actions[0].detail
    # without the option on its node: the option is said
    sig = signals(**merge(healthy("n1"), isolated("a", 6, reason="l3_span"), kubelet("n1")))
    (action,) = run(sig, [no_devices("a")]).actions
    assert action.kind == "recommend" and "prefer-align-cpus-by-uncorecache" in action.detail
