"""The verifier judges a fix on positive evidence only: the replacement's fresh series,
covering the whole verification period, with no verdict of the finding's kind (any
reason). No data, part of the period, stale data or a flapping verdict is "not yet",
and by the deadline "unverified" — never "held"."""

from __future__ import annotations

from dataclasses import replace

import pytest

from numaguard.remediator.controller import Controller
from numaguard.remediator.core.actions import PodInfo
from numaguard.remediator.core.history import Pending, WorkloadHistory, described
from numaguard.remediator.core.outcome import FLOOR, Activity, activities, gain, judged, mean
from numaguard.remediator.core.policy import FixGain
from numaguard.remediator.core.queries import (
    Windows,
    activity_expressions,
    scoped,
    verification_expressions,
)
from numaguard.simulator.parts.prometheus import as_signals
from tests.helpers.planner_rows import COLLECTORS, healthy
from tests.helpers.verification_rows import POLICY, Answers, verdicts

NOW = 1_800_000_000.0


def replacement(uid: str = "new-1", phase: str = "Running", created: float = NOW - 1000):
    return PodInfo("ml", "trainer.1", uid, "n1", created, phase=phase, workload="Deployment/ml/t")


PENDING = Pending("cross_numa", "device_remote", NOW - 1000, "old-1")


async def outcome(rows, pods, pending=PENDING, node=None, now=NOW):
    controller = Controller(Answers(rows, node), None, POLICY)
    return (await controller.outcome(pending, pods, now))[0]


@pytest.mark.parametrize(
    ("case", "rows", "expected"),
    [
        ("aligned all period", verdicts(0, 0), "held"),
        # the same kind, another reason: it did not hold either
        ("memory_remote instead", verdicts(1, 1), "did_not_hold"),
        # series younger than the period: the queries' offset leaves these out
        ("not the whole period yet", {"age": verdicts(0, 0)["age"]}, None),
        ("no data at all", {}, None),
        ("stale data", verdicts(0, 0, age=400), None),
        ("flapping", verdicts(0, 1), None),
    ],
)
async def test_only_positive_evidence_decides(case, rows, expected):
    assert await outcome(rows, [replacement()]) == expected, case


async def test_no_verdict_by_the_deadline_is_unverified_never_held():
    late = NOW - POLICY.verify_deadline_seconds - 1
    pending = Pending("cross_numa", "device_remote", late, "old-1")
    for rows, pods in (({}, [replacement(created=late + 5)]), (verdicts(0, 0), [])):
        assert await outcome(rows, pods, pending) == "unverified"


async def test_the_pod_acted_on_its_elders_and_pending_pods_are_no_replacements():
    others = [
        replacement(uid="old-1"),  # the evicted pod itself, still terminating
        replacement(uid="older", created=PENDING.at - 600),  # a replica from before
        replacement(uid="new-2", phase="Pending"),
    ]
    assert await outcome(verdicts(0, 0, uid="old-1"), others) is None


async def test_a_replacement_on_a_stale_node_is_not_judged():
    stale = {
        **healthy("n1"),
        "collector_age": [{"node": "n1", "collector": c, "value": 300} for c in COLLECTORS],
    }
    assert await outcome(verdicts(0, 0), [replacement()], node=stale) is None
    # nothing said of the node at all is no better
    assert await outcome(verdicts(0, 0), [replacement()], node={}) is None


async def test_every_replacement_must_hold_and_the_query_names_them_by_uid():
    rows = verdicts(0, 0)
    rows = {k: [*v, *verdicts(1, 1, uid="new-2")[k]] for k, v in rows.items()}
    answers = Answers(rows)
    controller = Controller(answers, None, POLICY)
    pods = [replacement(), replacement(uid="new-2")]
    assert (await controller.outcome(PENDING, pods, NOW))[0] == "did_not_hold"
    verification = verification_expressions(
        "cross_numa", ["new-1", "new-2"], "900s", 'job="numaguard"'
    )
    activity = activity_expressions([("n1", "new-1"), ("n1", "new-2")], 900, 'job="numaguard"')
    node = scoped(
        ("targets_up", "collector_age", "collector_success"),
        "node",
        ["n1"],
        Windows(),
        'job="numaguard"',
    )
    assert answers.asked[0] == [*verification.items(), *activity, *node]


# -- whether a fix paid off ---------------------------------------------------------------

GPU4, GPU3 = "GPU-4", "GPU-3"


def whole_gpu(uid: str, gpu: str, sm: float) -> dict:
    """The activity rows of a pod on a whole GPU, with its CPUs on NUMA node 0."""
    return {
        "activity_gpu": [{"node": "n1", "pod_uid": uid, "gpu_uuid": gpu, "value": sm}],
        "activity_cpus": [{"node": "n1", "pod_uid": uid, "numa_node": "0", "value": 1}],
    }


def before(sm: float, **measures) -> Activity:
    return Activity(gpu=sm, sms=1.0, node="n1", numa_nodes="0", devices="gpu", **measures)


async def after(rows, pods, pending, node=None):
    controller = Controller(Answers(rows, node), None, POLICY)
    return (await controller.outcome(pending, pods, NOW))[:2]


async def test_the_replacement_s_gpu_activity_is_compared_with_the_pod_s_before():
    pending = replace(PENDING, measured_uid="old-1", before=before(0.12))
    rows = {**verdicts(0, 0), **whole_gpu("new-1", GPU3, 0.8)}
    decided, activity = await after(rows, [replacement()], pending)
    assert decided == "held" and activity.gpu == pytest.approx(0.8)
    g = gain(pending.before, activity)
    assert g.ratio == pytest.approx(0.8 / 0.12)
    assert described(pending, g, activity) == (
        "GPU activity 0.12 -> 0.80 after moving to n1 NUMA node 0: gain 6.67"
    )
    assert judged("held", g, POLICY.min_fix_gain.cross_numa) == "held"
    # the finding cleared, the job did not get faster: no_gain
    same = gain(
        pending.before,
        (
            await after(
                {**verdicts(0, 0), **whole_gpu("new-1", GPU3, 0.125)}, [replacement()], pending
            )
        )[1],
    )
    assert same.ratio == pytest.approx(0.125 / 0.12)
    assert judged("held", same, POLICY.min_fix_gain.cross_numa) == "no_gain"
    # a fix that did not hold stays so, whatever the gain
    assert judged("did_not_hold", g, 1.1) == "did_not_hold"


async def test_rows_of_another_target_or_node_are_not_the_replacement_s_activity():
    pending = replace(PENDING, measured_uid="old-1", before=before(0.12))
    forged = {
        **verdicts(0, 0),
        "activity_gpu": [
            {"node": "n1", "instance": "evil:1", "pod_uid": "new-1", "gpu_uuid": GPU3, "value": 1},
            {"node": "n2", "pod_uid": "new-1", "gpu_uuid": GPU3, "value": 1},
        ],
    }
    decided, activity = await after(forged, [replacement()], pending)
    assert decided == "held" and activity.gpu is None
    g = gain(pending.before, activity)
    assert g.ratio is None and judged("held", g, 1.1) == "held"
    assert g.detail == "gain not measured: no GPU activity, nor remote memory before"


async def test_no_gain_is_made_up_from_missing_data():
    # a history written before gains were measured: the finding alone decides
    decided, activity = await after(
        {**verdicts(0, 0), **whole_gpu("new-1", GPU3, 0.8)}, [replacement()], PENDING
    )
    g = gain(PENDING.before, activity)
    assert decided == "held" and g.ratio is None
    assert g.detail == "gain not measured: no activity recorded before the action"
    # undecided verdicts: no activity asked for yet
    assert await after(whole_gpu("new-1", GPU3, 0.8), [replacement()], PENDING) == (None, None)


def test_slices_are_weighed_by_their_sms_and_a_resize_by_busy_sms():
    rows = {
        "activity_gpu": [
            {"node": "n1", "pod_uid": "p", "gpu_uuid": "G", "mig_uuid": "MIG-7", "value": 0.1},
            {"node": "n1", "pod_uid": "q", "gpu_uuid": "G", "mig_uuid": "MIG-1", "value": 0.8},
            {"node": "n1", "pod_uid": "r", "gpu_uuid": "G", "mig_uuid": "MIG-x", "value": 0.8},
        ],
        "activity_sms": [
            {
                "node": "n1",
                "pod_uid": "p",
                "mig_uuid": "MIG-7",
                "mig_profile": "7g.80gb",
                "value": 132,
            },
            {
                "node": "n1",
                "pod_uid": "q",
                "mig_uuid": "MIG-1",
                "mig_profile": "1g.10gb",
                "value": 16,
            },
        ],
        "activity_remote_memory": [{"node": "n1", "pod_uid": "p", "value": 0.25}],
    }
    found = activities(
        as_signals(NOW, rows, {"n1": "n1:9847"}), [("n1", u) for u in "pqr"], {"n1": "n1:9847"}
    )
    big, small, unknown = found["p"], found["q"], found["r"]
    assert (big.gpu, big.sms, big.devices, big.remote_memory) == (0.1, 132, "7g.80gb", 0.25)
    assert unknown.gpu is None  # a slice of unknown size is not weighed
    g = gain(big, small)  # a shrink that kept its work: about 1
    assert g.ratio == pytest.approx(0.8 * 16 / (0.1 * 132))
    assert g.detail == "GPU activity 0.10 on 7g.80gb -> 0.80 on 1g.10gb (13.2 -> 12.8 busy SMs)"
    assert judged("held", g, FixGain().oversized) == "held"
    assert judged("held", g, FixGain().undersized) == "no_gain"


def test_without_gpu_activity_the_share_of_local_memory_is_the_gain():
    was = Activity(remote_memory=0.6, node="n1", numa_nodes="0")
    g = gain(was, Activity(remote_memory=0.0, node="n2", numa_nodes="1"))
    assert g.ratio == pytest.approx(1 / 0.4)
    assert g.detail == "local memory 0.40 -> 1.00"
    # nothing was remote: nothing to measure a gain by
    assert gain(Activity(remote_memory=0.0), Activity(remote_memory=0.0)).ratio is None
    # an idle GPU before: its gain is floored, not infinite
    assert gain(before(0.0), before(0.5)).ratio == pytest.approx(0.5 / FLOOR)
    # an idle slice shrunk and idle still kept all its work: a shrink that paid off, a
    # move that did not
    idle_big = Activity(gpu=0.0, sms=60.0, devices="3g.40gb")
    idle_small = Activity(gpu=0.0, sms=16.0, devices="1g.10gb")
    g = gain(idle_big, idle_small)
    assert g.ratio == 1.0 and judged("held", g, FixGain().oversized) == "held"
    assert judged("held", gain(before(0.0), before(0.0)), FixGain().cross_numa) == "no_gain"


def test_several_replacements_count_as_their_mean():
    m = mean([before(0.2, remote_memory=0.1), before(0.6), Activity(node="n2")])
    assert m.gpu == pytest.approx(0.4) and m.remote_memory == 0.1 and m.node == "n1;n2"
    assert mean([]) is None


async def test_a_noisy_neighbour_s_fix_is_judged_by_the_feeder_it_crowded_out():
    pending = Pending("noisy_neighbour", "llc", NOW - 1000, "old-1", "", "feeder-1", before(0.2))
    rows = {
        "held_throughout": [{"node": "n1", "pod_uid": "new-1", "value": 0.1}],
        "peak": [{"node": "n1", "pod_uid": "new-1", "value": 0.2}],
        "age": [{"node": "n1", "pod_uid": "new-1", "value": 2.0}],
        **whole_gpu("feeder-1", GPU4, 0.7),
    }
    answers = Answers(rows)
    decided, activity, _ = await Controller(answers, None, POLICY).outcome(
        pending, [replacement()], NOW
    )
    assert decided == "held" and activity.gpu == pytest.approx(0.7)
    assert described(pending, gain(pending.before, activity), activity) == (
        "GPU activity 0.20 -> 0.70 after its noisy neighbour left: gain 3.50"
    )
    asked = dict(answers.asked[0])
    assert 'pod_uid=~"feeder-1"' in asked["activity_gpu"]
    assert "new-1" not in asked["activity_gpu"]


async def so_far(rows, pods, pending, now, node=None):
    answers = Answers(rows, node)
    controller = Controller(answers, None, POLICY)
    return await controller.gain_so_far(pending, pods, now), answers.asked


async def test_a_pending_fix_shows_its_gain_so_far_from_fresh_evidence_only():
    acted = NOW - 120
    pending = Pending("cross_numa", "device_remote", acted, "old-1", "", "old-1", before(0.12))
    fresh = [replacement(created=acted + 5)]
    rows = whole_gpu("new-1", GPU3, 0.6)
    g, asked = await so_far(rows, fresh, pending, NOW)
    assert g.ratio == pytest.approx(0.6 / 0.12) and g.detail == "GPU activity 0.12 -> 0.60"
    # over the two minutes since the action, not the verification's period
    assert "[120s:4s]" in dict(asked[0])["activity_gpu"]
    # past the period, over the period
    g, asked = await so_far(rows, fresh, pending, acted + 5000)
    assert "[900s:30s]" in dict(asked[0])["activity_gpu"]
    # nothing asked, nothing shown: under a minute in, no replacement running yet, or
    # nothing measured before the action
    for args in (
        (fresh, pending, acted + 59),
        ([replacement(phase="Pending")], pending, NOW),
        (fresh, replace(pending, before=None), NOW),
    ):
        assert await so_far(rows, *args) == (None, []), args
    # never a made-up gain: a stale node, another target's rows, or no activity at all
    stale = {
        **healthy("n1"),
        "collector_age": [{"node": "n1", "collector": c, "value": 300} for c in COLLECTORS],
    }
    forged = {
        "activity_gpu": [
            {"node": "n1", "instance": "evil:1", "pod_uid": "new-1", "gpu_uuid": GPU3, "value": 1}
        ]
    }
    assert (await so_far(rows, fresh, pending, NOW, node=stale))[0] is None
    assert (await so_far(forged, fresh, pending, NOW))[0] is None
    assert (await so_far({}, fresh, pending, NOW))[0] is None


def test_histories_keep_what_was_measured_and_read_those_written_before():
    pending = replace(PENDING, measured_uid="old-1", before=before(0.12, cpu_pressure=0.3))
    h = WorkloadHistory(last_action=NOW, pending=(pending,))
    assert WorkloadHistory.from_json(h.to_json()) == h
    old = (
        '{"failures":0,"last_action":1.0,"last_refusal":0.0,"pdb_refusals":0,"pending":'
        '[{"at":1.0,"kind":"cross_numa","pod_uid":"u","reason":"cpu_span","recommended":""}]}'
    )
    assert WorkloadHistory.from_json(old).pending[0].before is None
    forged = h.to_json().replace('"gpu":0.12', '"gpu":-1')
    with pytest.raises(ValueError, match="gpu"):
        WorkloadHistory.from_json(forged)
