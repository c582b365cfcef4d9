"""The remediation loop through a real kubelet (simulator/demos/node_stories.py: the exporter in
the node VM, a real Prometheus, the remediator as its ServiceAccount, the real
ReplicaSet, scheduler and kubelet), one story per Topology Manager policy, each judged
by what the kernel (the pods' cgroups) and the API server say."""

from __future__ import annotations

import pytest
import pytest_asyncio

from numaguard.contract.names import REQUEST_ANNOTATION
from numaguard.exporter.mover.helper import CAP_SYS_PTRACE
from numaguard.simulator.demos.gpu_story import linked
from numaguard.simulator.demos.node_stories import (
    KEEP,
    MOVE_RATE,
    NS,
    exclusive_cpus,
    fixed,
    misaligned_again,
    moved_home,
    moved_in_place,
    node_loop,
    refused,
)
from numaguard.simulator.parts.controlplane import path_of
from numaguard.simulator.parts.vm_kubelet import EXPORTER_PID, HELD_MIB, MOVER_PID
from tests.helpers.kubenode import scrape
from tests.helpers.numa_files import numa_maps_bytes
from tests.helpers.tenants import tenant_token

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


async def verdicts(loop, pod) -> set[tuple[str, str]]:
    """The pod's cross-NUMA verdicts, each the highest over the last 30 s: a scrape that
    ran past its timeout on the loaded VM leaves every series stale until the next one,
    so an instant query may land in that gap; 0 here means 0 at every sample."""
    rows = await loop.prom.query(
        f'max_over_time(numaguard_pod_cross_numa{{pod="{pod["metadata"]["name"]}"}}[30s])'
    )
    return {(r["metric"]["reason"], r["value"][1]) for r in rows}


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
    assert await verdicts(loop, replacement) >= {("cpu_span", "0")}


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
    assert await verdicts(loop, replacement) >= {("memory_remote", "0")}
    (event,) = [
        e
        for e in await loop.cp.items(loop.session, "Event", NS)
        if e["reason"] == "RemediationVerified" and e["involvedObject"]["name"] == "cache"
    ]
    assert event["message"].startswith("held: "), event["message"]
    assert f"gain {verified.gain.ratio:.2f}" in event["message"], event["message"]


async def test_remote_memory_is_moved_home_in_place_without_a_restart(loop):
    """The first remedy for remote memory, through the real kubelet and kernel: the
    same pod, container and processes, its pages on its CPU's NUMA node afterwards by
    /proc/<pid>/numa_maps, no faster than the mover's rate, verified with its gain; an
    opted-out pod, a move with no room and a dry run left alone, and a tenant's own
    request refused by the API server."""
    story = await moved_in_place(loop)
    ((pod, cpus),) = story.pods  # one pod: no eviction, no replacement
    name, uid = pod["metadata"]["name"], pod["metadata"]["uid"]
    assert cpus == {"0": 1}
    before, after = story.memory["before"], story.memory["after"]
    assert before["1"] > before.get("0", 0), before
    # the mover's own account: what it moved, and why each page it could not move stayed
    got = await scrape(loop.node, lambda got: total(got, "numaguard_memory_moved_bytes_total"))
    failures = {
        dict(labels)["reason"]: v
        for (n, labels), v in got.items()
        if n == "numaguard_memory_move_failures_total" and v
    }
    home = after.get("0", 0) >= 0.9 * HELD_MIB and after.get("1", 0) < 0.1 * HELD_MIB
    assert home, (after, failures, "\n".join(story.said))
    opted, full, dry, *acting = story.reports
    assert [r.guard for r in opted.plan.refusals] == ["opted_out"]
    # none: what the story saw, as the failure's message
    none = [("no refusal", "\n".join(story.said))]
    ((guard, detail),) = [(r.guard, r.detail) for r in full.plan.refusals] or none
    assert guard == "no_free_memory" and detail.startswith("NUMA node 0 of vm-node has"), detail
    assert [(a.kind, result) for a, result in dry.results] == [("migrate_memory", "dry_run")], (
        dry.plan.refusals
    )
    taken = [(a.kind, result) for r in acting for a, result in r.results]
    assert taken == [("migrate_memory", "requested")]
    # while the move awaits its verification the finding stays open a window: its
    # cooldown, the workload's cap, and, once the verdict is gone, no sample saying so
    after_move = {"cooldown", "cap_workload", "stale_data"}
    assert {r.guard for r in acting for r in r.plan.refusals} <= after_move
    (verified,) = [v for r in acting for v in r.verified]
    assert (verified.workload, verified.outcome) == (f"Deployment/{NS}/warm", "held")
    assert verified.gain.ratio > 1.5, verified.detail
    assert verified.detail.endswith(f"moved home in place: gain {verified.gain.ratio:.2f}")
    # the same pod, container and processes
    now = await loop.cp.get(loop.session, "Pod", NS, name)
    assert now["metadata"]["uid"] == uid
    (status,) = now["status"]["containerStatuses"]
    assert status["containerID"] == pod["status"]["containerStatuses"][0]["containerID"]
    assert status["restartCount"] == 0
    assert story.processes["after"] == story.processes["before"]
    assert now["metadata"]["annotations"][REQUEST_ANNOTATION].isdigit()
    # where the kernel says its pages are, process by process
    pages: dict[str, int] = {}
    for pid in story.processes["after"]:
        for node, size in numa_maps_bytes(await loop.node.sh(f"cat /proc/{pid}/numa_maps")).items():
            pages[node] = pages.get(node, 0) + size
    assert pages["0"] >= 0.9 * HELD_MIB * 2**20 and pages.get("1", 0) < 16 * 2**20, pages
    # no faster than the rate: the mover's own account of what it moved and how long
    moved = total(got, "numaguard_memory_moved_bytes_total")
    seconds = total(got, "numaguard_memory_move_seconds_total")
    assert moved >= 0.5 * HELD_MIB * 2**20 and seconds >= moved / MOVE_RATE, (moved, seconds)
    # one request carried out, all but what other processes map too (the busybox
    # binary's pages, when they are on node 1: EACCES) moved
    assert total(got, "numaguard_memory_moves_total") == 1
    assert total(got, "numaguard_memory_moves_total", result="failed") == 0
    assert set(failures) <= {"EACCES"}, failures
    # while it moved, the exporter held no capability; its helper CAP_SYS_PTRACE alone
    held = {
        process: await loop.node.sh(f"grep CapEff /proc/$(cat {pid_file})/status")
        for process, pid_file in (("exporter", EXPORTER_PID), ("helper", MOVER_PID))
    }
    assert {p: int(line.split()[1], 16) for p, line in held.items()} == {
        "exporter": 0,
        "helper": 1 << CAP_SYS_PTRACE,
    }, held
    # what a person watching is told
    events = await loop.cp.items(loop.session, "Event", NS)
    on_pod = [e for e in events if e["involvedObject"]["name"] == name]
    refusals = {e["message"].split(":")[0] for e in on_pod if e["reason"] == "RemediationRefused"}
    assert (
        {"opted_out", "no_free_memory"} <= refusals <= {"opted_out", "no_free_memory"} | after_move
    ), refusals
    told = {e["reason"]: e["message"] for e in on_pod}
    assert (
        told["RemediationRequested"].startswith("move ")
        and "in place" in told["RemediationRequested"]
    )
    assert told["DryRun"].startswith("would move ")
    (event,) = [
        e
        for e in events
        if e["reason"] == "RemediationVerified" and e["involvedObject"]["name"] == "warm"
    ]
    assert event["message"].startswith("held: local memory "), event["message"]
    assert f"gain {verified.gain.ratio:.2f}" in event["message"], event["message"]
    # a tenant that may patch the pods of its namespace cannot ask for a move
    token = await tenant_token(loop.cp, loop.session, NS)
    ask = {"metadata": {"annotations": {REQUEST_ANNOTATION: "1"}}}
    status, body = await loop.cp.request(
        loop.session, "PATCH", path_of("Pod", NS, name), ask, token
    )
    assert status == 403 and "only numaguard's remediator" in body["message"], body


def total(got: dict, name: str, **match: str) -> float:
    return sum(
        v
        for (n, labels), v in got.items()
        if n == name and all(dict(labels).get(k) == want for k, want in match.items())
    )


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
    allocatable, listed = await loop.node.pod_resources()

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


async def test_gpus_without_p2p_get_the_free_nvlink_pair_from_the_kubelet_and_plugin(loop):
    """The trainer's two GPUs reach each other through the host only while it moves
    data over PCIe; once the NVLink pair is free the remediator evicts it, and the real
    kubelet, asking the device plugin, gives its replacement the pair: its link verdict
    0, its GPUs busier."""
    story = await linked(loop)
    # the device plugin's preference gave the first pod asking 2 the joined pair ...
    assert story.gpus["blocker"] == [1, 2]
    (first, _), (replacement, _) = story.pods
    before, after = (
        story.gpus[first["metadata"]["name"]],
        story.gpus[replacement["metadata"]["name"]],
    )
    # ... so the trainer got two of the others, and its replacement the pair
    assert len(before) == 2 and not {1, 2} & set(before), story.said
    assert after == [1, 2], story.said
    acted = [
        (a.kind, a.finding.kind, a.finding.reason, res)
        for r in story.reports
        for a, res in r.results
    ]
    assert acted == [("evict", "gpu_link", "no_p2p", "evicted")], story.said
    ((workload, outcome),) = story.outcomes
    assert (workload, outcome) == (f"Deployment/{NS}/trainer", "held"), story.said
    (verified,) = [v for r in story.reports for v in r.verified]
    # SM activity 60 % on the pair against 30 % on the GPUs without P2P
    assert verified.gain.ratio == pytest.approx(2.0, rel=0.05), verified.detail
    name = replacement["metadata"]["name"]
    rows = await loop.prom.query(f'max_over_time(numaguard_pod_gpu_link_poor{{pod="{name}"}}[30s])')
    assert {(r["metric"]["reason"], r["value"][1]) for r in rows} >= {("no_p2p", "0")}
    levels = await loop.prom.query(
        f'max_over_time(numaguard_pod_gpu_link{{pod="{name}"}}[30s]) == 1'
    )
    assert {r["metric"]["level"] for r in levels} == {"nvlink"}
