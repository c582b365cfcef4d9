"""The remediation loop through a real kubelet (simulator/node_loop.py: the exporter in
the node VM, a real Prometheus, the remediator as its ServiceAccount, the real
ReplicaSet, scheduler and kubelet), one story per Topology Manager policy, each judged
by what the kernel (the pods' cgroups) and the API server say."""

from __future__ import annotations

import pytest
import pytest_asyncio

from numaguard.simulator.kubenode import HELD_MIB
from numaguard.simulator.node_loop import (
    KEEP,
    NS,
    fixed,
    misaligned_again,
    moved_home,
    node_loop,
    refused,
)

pytestmark = [
    pytest.mark.vm,
    pytest.mark.prometheus,
    pytest.mark.asyncio(loop_scope="module"),
    pytest.mark.timeout(1200),
]


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def loop(tmp_path_factory):
    async with node_loop(tmp_path_factory.mktemp("kubenode-loop")) as loop:
        yield loop


def uids(story) -> list[str]:
    return [p["metadata"]["uid"] for p, _ in story.pods]


async def test_under_none_the_replacement_comes_back_misaligned_and_it_gives_up(loop):
    story = await misaligned_again(loop)
    assert story.outcomes == [
        (f"Deployment/{NS}/loader", "did_not_hold"),
        (f"Deployment/{NS}/loader", "gave_up"),
    ]
    # each pod the real kubelet ran was split across the NUMA nodes, the replacements
    # while what the evicted one held was not free: CPU 1 and 5, then 3 and 4
    assert [cpus for _, cpus in story.pods] == [{"0": 1, "1": 1}] * 3
    assert len(set(uids(story))) == 3
    assert story.evicted == [p["metadata"]["name"] for p, _ in story.pods[:2]]
    # and it is left alone from then on, saying why
    last = story.reports[-1]
    assert not last.results
    assert "gave_up" in {r.guard for r in last.plan.refusals}


async def test_under_best_effort_the_fix_holds_once_a_numa_node_has_room(loop):
    story = await fixed(loop)
    ((workload, outcome),) = story.outcomes
    assert (workload, outcome) == (f"Deployment/{NS}/trainer", "held")
    (first, split), (replacement, aligned) = story.pods
    assert story.evicted == [first["metadata"]["name"]]
    assert (split, aligned) == ({"0": 1, "1": 1}, {"1": 2})
    verdicts = await loop.prom.query(
        f'numaguard_pod_cross_numa{{pod="{replacement["metadata"]["name"]}"}}'
    )
    assert {(r["metric"]["reason"], r["value"][1]) for r in verdicts} >= {("cpu_span", "0")}


async def test_under_single_numa_node_remote_memory_is_fixed_and_held(loop):
    story = await moved_home(loop)
    ((workload, outcome),) = story.outcomes
    assert (workload, outcome) == (f"Deployment/{NS}/cache", "held")
    (first, cpus), (replacement, cpus_after) = story.pods
    assert story.evicted == [first["metadata"]["name"]]
    # the kubelet gave the cache CPU 1, on NUMA node 0; with node 0 filled, the kernel
    # put most of its memory on node 1; its replacement's is beside its CPU, on one
    # NUMA node, as the pods' cgroups (memory.numa_stat) say
    assert cpus == {"0": 1} and len(cpus_after) == 1
    before = story.memory[first["metadata"]["name"]]
    assert before["1"] > before.get("0", 0), before
    ((home, _),) = cpus_after.items()
    after = story.memory[replacement["metadata"]["name"]]
    assert after.get(home, 0) >= 0.9 * HELD_MIB, after
    # the verifier judged it from the exporter's reading of the real kernel, with the
    # gain in local memory in its Event
    (verified,) = [v for r in story.reports for v in r.verified]
    assert verified.gain.ratio > 1.5 and "local memory" in verified.detail, verified.detail
    verdicts = await loop.prom.query(
        f'numaguard_pod_cross_numa{{pod="{replacement["metadata"]["name"]}"}}'
    )
    assert {(r["metric"]["reason"], r["value"][1]) for r in verdicts} >= {("memory_remote", "0")}
    (event,) = [
        e
        for e in await loop.cp.items(loop.session, "Event", NS)
        if e["reason"] == "RemediationVerified" and e["involvedObject"]["name"] == "cache"
    ]
    assert event["message"].startswith("held: "), event["message"]
    assert f"gain {verified.gain.ratio:.2f}" in event["message"], event["message"]


async def test_under_single_numa_node_the_refused_pods_are_cleaned_up(loop):
    story = await refused(loop)
    (split, cpus), *storm = story.pods
    # the kubelet, restarted under single-numa-node, refused its one split pod, and ran
    # the aligned filler and neighbour on
    assert cpus == {"0": 1, "1": 1}
    for name in ("filler", "neighbour"):
        assert (await loop.running(name))["metadata"]["name"] == name
    pods = {p["metadata"]["name"]: p for p in await loop.cp.items(loop.session, "Pod", NS)}
    assert pods["split"]["metadata"]["uid"] == split["metadata"]["uid"]
    assert pods["split"]["status"]["reason"] == "TopologyAffinityError"
    # every pod of wide it refused too, and all but the newest were deleted
    assert all(p["status"]["reason"] == "TopologyAffinityError" for p, _ in storm)
    (report,) = story.reports
    (seen,) = report.storms
    assert (seen.workload, seen.node, seen.reason) == (
        f"Deployment/{NS}/wide",
        loop.node.name,
        "TopologyAffinityError",
    )
    assert len(seen.pods) == len(storm) and len(seen.delete) == len(storm) - KEEP
    newest = max(storm, key=lambda p: p[0]["metadata"]["creationTimestamp"])[0]
    left = [n for n in pods if n.startswith("wide-")]
    assert left == [newest["metadata"]["name"]]
    (event,) = [
        e
        for e in await loop.cp.items(loop.session, "Event", NS)
        if e["reason"] == "AdmissionRejections"
    ]
    assert event["involvedObject"]["kind"] == "Deployment"
    assert event["message"].startswith(
        f"{len(storm)} pods rejected by the kubelet on {loop.node.name} "
        "(TopologyAffinityError): no NUMA zone there has 2 exclusive CPUs"
    ), event["message"]
    assert f"deleting {len(storm) - KEEP}" in event["message"]
