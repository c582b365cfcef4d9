"""The gpu_link finding's plan (pure): a multi-GPU pod without P2P is evicted only to a
NUMA zone with its CPUs, memory and a free set of its GPUs joined at PXB or better; a
split or sliced pod, and one whose GPUs come from a ResourceClaim, get advice."""

from __future__ import annotations

import pytest

from numaguard.remediator.core.actions import DRA
from numaguard.remediator.core.policy import Enforcement, Policy
from tests.helpers.planner_rows import (
    breaks_pair,
    free_set,
    gpus_held,
    healthy,
    link_poor,
    merge,
    pod_info,
    run,
    signals,
    zone,
)

TWO_GPUS = {"nvidia.com/gpu": 2}


def trainer_and_a_pair(reason: str = "no_p2p"):
    """A 2-GPU trainer with a gpu_link finding on n1; n2 with room and an NVLink pair."""
    return signals(
        **merge(
            healthy("n1", "n2"),
            link_poor("trainer", reason),
            gpus_held("trainer", 2, 8, 32),
            zone("n2", "0", 32, 400, devices=TWO_GPUS),
            free_set("n2", "0", 2, "nvlink"),
        )
    )


def test_evicted_only_to_a_zone_whose_free_gpus_are_joined():
    sig = signals(
        **merge(
            healthy("n1", "n2", "n3"),
            link_poor("trainer"),
            gpus_held("trainer", 2, 8, 32),
            # the roomiest zone has two free GPUs, but only a SYS-joined pair anywhere
            zone("n2", "0", 32, 400, devices=TWO_GPUS),
            free_set("n2", "0", 2, "phb"),
            # a smaller one has a pair behind one PCIe switch
            zone("n3", "1", 16, 200, devices=TWO_GPUS),
            free_set("n3", "1", 2, "pix"),
        )
    )
    result = run(sig, [pod_info("trainer")])
    assert [(a.kind, a.nodes) for a in result.actions] == [("evict", ("n3",))]
    assert result.actions[0].detail == "evict: fits aligned on n3 NUMA node 1"


def test_no_joined_set_anywhere_is_no_fit_and_says_so():
    sig = signals(
        **merge(
            healthy("n1", "n2"),
            link_poor("trainer"),
            gpus_held("trainer", 2, 8, 32),
            zone("n2", "0", 32, 400, devices=TWO_GPUS),
            free_set("n2", "0", 2, "node"),
            free_set("n2", "", 2, "pix"),  # a pair joined across NUMA nodes: not aligned
        )
    )
    result = run(sig, [pod_info("trainer")])
    assert not result.actions
    ((guard, detail),) = [(r.guard, r.detail) for r in result.refusals]
    assert guard == "no_fit"
    assert detail == (
        "no NUMA zone anywhere has 8 exclusive CPUs, 32.0 GiB, 2 nvidia.com/gpu joined at pxb "
        "or better"
    )


def test_three_gpus_need_a_joined_set_of_four_and_one_zone_serves_one_pod():
    sig = signals(
        **merge(
            healthy("n1", "n2", "n4"),
            link_poor("a"),
            gpus_held("a", 3, 4, 16),
            link_poor("b", node="n4"),
            gpus_held("b", 3, 4, 16, node="n4"),
            zone("n2", "0", 64, 800, devices={"nvidia.com/gpu": 8}),
            free_set("n2", "0", 2, "nvlink"),
            free_set("n2", "0", 4, "nvlink"),
            free_set("n2", "0", 8, "sys"),
        )
    )
    result = run(sig, [pod_info("a"), pod_info("b", node="n4")])
    # a takes some of n2's GPUs: what they leave joined is unknown until n2 says again
    assert [(a.kind, a.pod.name) for a in result.actions] == [("evict", "a")]
    assert [(r.finding.pod, r.guard) for r in result.refusals] == [("b", "no_fit")]


@pytest.mark.parametrize(
    ("reason", "advice"),
    [
        ("split_containers", "put its GPUs in one container"),
        ("mig_slices", "give it full GPUs, or one larger slice"),
    ],
)
def test_a_split_or_sliced_pod_is_told_what_to_change_in_its_spec(reason, advice):
    result = run(trainer_and_a_pair(reason), [pod_info("trainer")])
    ((action,),) = [result.actions]
    assert (action.kind, action.dry_run) == ("recommend", True)
    assert action.detail.startswith(advice) and action.detail.endswith(f"(gpu_link: {reason})")


def test_gpus_of_a_resource_claim_get_the_pcie_root_constraint_as_advice():
    result = run(trainer_and_a_pair(), [pod_info("trainer", resources=frozenset({DRA}))])
    ((action,),) = [result.actions]
    assert action.kind == "recommend"
    assert "matchAttribute: resource.kubernetes.io/pcieRoot" in action.detail


def test_recommend_mode_only_advises():
    policy = Policy(dry_run=False, enforcement=Enforcement(gpu_link="recommend"))
    result = run(trainer_and_a_pair(), [pod_info("trainer")], policy)
    assert [(a.kind, a.detail) for a in result.actions] == [
        (
            "recommend",
            "recreate it where its GPUs are joined at PXB or better on one NUMA node "
            "(gpu_link: no_p2p)",
        )
    ]


def test_a_pod_breaking_a_pair_is_advised_to_move_only_while_a_pod_lacks_p2p():
    lone = merge(healthy("n1", "n2"), breaks_pair("inference", node="n2"))
    assert run(signals(**lone), [pod_info("inference", node="n2")]).actions == ()
    sig = signals(
        **merge(lone, link_poor("trainer"), gpus_held("trainer", 2, 8, 32))
    )  # and no joined set free anywhere: the trainer is no_fit
    result = run(sig, [pod_info("trainer"), pod_info("inference", node="n2")])
    assert [(r.finding.pod, r.guard) for r in result.refusals] == [("trainer", "no_fit")]
    ((action,),) = [result.actions]
    assert (action.kind, action.pod.name, action.dry_run) == ("recommend", "inference", True)
    assert action.detail.startswith("it holds half of the last GPU pair on its NUMA node of n2")
    # acting is not offered: a device plugin gives a one-GPU pod the first free GPU
    policy = Policy(dry_run=False, enforcement=Enforcement(gpu_fragmentation="act"))
    acted = run(sig, [pod_info("trainer"), pod_info("inference", node="n2")], policy)
    assert [a.kind for a in acted.actions] == ["recommend"]
