"""The remediator's PromQL: every expression of every round parses, uses only metric
names from the exporter's catalogue (``up``, and the recording rules alerts/ installs),
selects only the exporters' own series, and names pods, slices and nodes only as
themselves, in bounded batches."""

from __future__ import annotations

import pytest

from numaguard.contract import catalogue as c
from numaguard.contract.catalogue import series_names
from numaguard.remediator.core import queries as q
from numaguard.remediator.core.needs import Need
from numaguard.remediator.core.queries import Windows, expressions, verification_expressions
from tests.helpers.promql import metric_names, selectors

NEEDS = [
    Need(8.0, 2.0**34, {"nvidia.com/gpu": 1}),
    Need(0.0, 0.0, {"nvidia.com/mig-1g.10gb": 1}),
    Need(0.0, 2.0**34, {"nvidia.com/gpu": 3}, joined=3),
]


def rounds(selector: str = q.DEFAULT_SELECTOR) -> list[str]:
    """Every expression any round can ask."""
    w = Windows()
    out = [
        *q.detection(w, selector, frozenset(), (0.3, 0.9, 0.95)),
        *q.detection(w, selector, frozenset(q.RECORDED), (0.3, 0.9, 0.95)),
        *q.scoped(expressions(), "pod_uid", ["a-1", "b-2"], w, selector),
        *q.scoped(expressions(), "node", ["gpu-node-1.example.com"], w, selector),
        *q.zone_candidates(NEEDS, 6, ("host_numa", "pod_resources"), 30.0, selector),
    ]
    return [expr for _, expr in out]


def test_every_query_parses_and_names_only_catalogue_metrics():
    """... and never a detail metric: the remediator works with the exporters' default."""
    exported = series_names()
    for expr in [*expressions().values(), *rounds()]:
        names = metric_names(expr)
        assert names, expr
        assert names <= {*exported, *q.RECORDED.values(), "up"}, (expr, names - exported)
    for kind in ("cross_numa", "starved", "noisy_neighbour", "oversized"):
        for expr in verification_expressions(kind, ["a-1", "b-2"], "900s").values():
            assert metric_names(expr) <= exported
    for _, expr in q.activity_expressions([("n1", "a-1"), ("n2", "b-2")], 900):
        assert metric_names(expr) and metric_names(expr) <= exported, expr


@pytest.mark.parametrize("selector", ['job="numaguard"', 'job="gpu-exporters",cluster="a"'])
def test_every_selector_reads_only_the_exporters_series(selector):
    expected = {tuple(m.strip().split("=", 1)) for m in selector.split(",")}
    queries = [
        *expressions(selector=selector).values(),
        *rounds(selector),
        *verification_expressions("cross_numa", ["a-1"], "60s", selector).values(),
        *(e for _, e in q.activity_expressions([("n1", "a-1")], 60, selector)),
    ]
    for expr in queries:
        for s in selectors(expr):
            have = {
                (m.name, f'"{m.value}"') for m in s.matchers.matchers if str(m.op).endswith("Equal")
            }
            assert expected <= have, (expr, s)


def test_names_are_matched_as_themselves_in_bounded_batches():
    uids = [f"uid-{i:04d}" for i in range(450)]
    batches = q.matching("pod_uid", [*uids, uids[0]])
    assert len(batches) == 3  # 200 + 200 + 50, each name once
    named = [b.removeprefix('pod_uid=~"').removesuffix('"').split("|") for b in batches]
    assert sorted(n for batch in named for n in batch) == uids and max(map(len, named)) == q.BATCH
    # a dot is a dot, not any character
    assert q.matching("node", ["n1.example"]) == ['node=~"n1\\\\.example"']
    assert q.matching("node", []) == []
    for forged in ['x"} or vector(1) or {a="', "a|b", "a.*", ""]:
        with pytest.raises(ValueError):
            q.matching("node", [forged])
    with pytest.raises(ValueError):
        q.zone_candidates([Need(1.0, 1.0, {'x"}': 1})], 6, ("host_numa",), 30.0)


def test_scoped_expressions_scope_every_exporter_series():
    """... but a GPU's traffic, which no pod labels: it is joined to the scoped pods'
    holder series, so the answer still names only them."""
    for expr in (e for _, e in q.scoped(expressions(), "pod_uid", ["a-1"], Windows(), "")):
        for s in selectors(expr):
            matchers = {(m.name, m.value) for m in s.matchers.matchers}
            unscoped = s.name in ("up", c.GPU_PCIE.name)
            assert unscoped or ("pod_uid", "a-1") in matchers, (expr, s)


def test_a_joined_need_asks_for_zones_with_a_set_of_free_gpus_joined_for_p2p():
    (query,) = q.zone_candidates([NEEDS[2]], 6, ("host_numa",), 30.0)
    # three GPUs fit a set of four joined as well
    assert 'numaguard_zone_gpu_free_set{job="numaguard",numa_node!="",size="4",' in query[1]
    assert 'level=~"nvlink|pix|pxb"' in query[1]
    assert q.zone_candidates([Need(0.0, 1.0, {"nvidia.com/gpu": 9}, joined=9)], 6, (), 30.0) == []


def test_one_zone_query_per_kind_of_room_whatever_the_number_of_pods():
    many = [Need(8.0, float(m), {"nvidia.com/gpu": 1}) for m in range(1000)]
    assert len(q.zone_candidates(many, 6, ("host_numa",), 30.0)) == 1
    assert len(q.zone_candidates([*many, *NEEDS], 6, ("host_numa",), 30.0)) == 3


def test_verification_names_pods_by_uid_only():
    with pytest.raises(ValueError):
        verification_expressions("cross_numa", ['x"} or vector(1) or {a="'], "60s")
    with pytest.raises(ValueError):
        q.activity_expressions([("n1", 'x"} or vector(1) or {a="')], 60)
    with pytest.raises(ValueError):
        q.activity_expressions([('n1"}', "a-1")], 60)


def test_activity_is_asked_of_the_pods_and_their_nodes_only_in_batches():
    pods = [(f"node-{i % 7}", f"uid-{i:04d}") for i in range(450)]
    asked = q.activity_expressions(pods, 900)
    assert len(asked) == 3 * len(q.ACTIVITY_LABELS)  # three batches of 200 at most
    for _, expr in asked:
        for s in selectors(expr):
            names = {m.name for m in s.matchers.matchers}
            assert "pod_uid" in names or "node" in names, (expr, s)
    # a subquery of some 30 steps over the period, however long
    assert "[900s:30s]" in dict(asked)["activity_gpu"]
    assert "[12s:1s]" in dict(q.activity_expressions(pods[:1], 12))["activity_gpu"]
