"""The remediation loop through a real kubelet (simulator/node_loop.py: the exporter in
the node VM, a real Prometheus, the remediator as its ServiceAccount, the real
ReplicaSet, scheduler and kubelet), one story per Topology Manager policy, each judged
by what the kernel (the pods' cgroups) and the API server say."""

from __future__ import annotations

import json
import sys

import pytest
import pytest_asyncio

from numaguard.simulator.kubenode import HELD_MIB
from numaguard.simulator.node_loop import (
    KEEP,
    NS,
    exclusive_cpus,
    fixed,
    misaligned_again,
    moved_home,
    node_loop,
    refused,
)
from tests.test_kubenode import PODRESOURCES, scrape

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


async def test_under_the_memory_manager_the_zones_memory_is_the_kubelet_s(loop):
    """The kubelet restarted under the Memory Manager's Static policy: the exporter's
    numaguard_zone_memory_* are what the real kubelet's GetAllocatableResources and List
    say, per NUMA node, with a Guaranteed pod's memory taken from its CPUs' node."""
    await loop.start("single-numa-node", memory="Static")
    pinned = await loop.bare("pinned", 1)
    ((home, _),) = (await exclusive_cpus(loop.node, pinned)).items()
    asked = await loop.node.sh(f"{sys.executable} -c '{PODRESOURCES}'")
    allocatable, listed = (json.loads(line) for line in asked.splitlines()[-2:])

    def per_node(blocks) -> dict[str, float]:
        out: dict[str, float] = {}
        for b in blocks:
            if b["memoryType"] == "memory":
                (n,) = b["topology"]["nodes"]
                out[str(n.get("ID", 0))] = out.get(str(n.get("ID", 0)), 0) + float(b["size"])
        return out

    total = per_node(allocatable["memory"])
    (pod,) = [p for p in listed["podResources"] if p["name"] == "pinned"]
    used = per_node(m for c in pod["containers"] for m in c.get("memory", []))
    # the pod's 256 MiB, on its CPU's NUMA node
    assert used == {home: 256 * 2**20}
    assert set(total) == {"0", "1"} and min(total.values()) > used[home]

    def zone(got, name):
        return {dict(k)["numa_node"]: v for (n, k), v in got.items() if n == name}

    free = {n: total[n] - used.get(n, 0) for n in total}
    got = await scrape(loop.node, lambda got: zone(got, "numaguard_zone_memory_free_bytes") == free)
    assert zone(got, "numaguard_zone_memory_allocatable_bytes") == total
