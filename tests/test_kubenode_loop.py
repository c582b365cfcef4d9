"""The remediation loop through a real kubelet: the exporter in the node VM reads the
real kernel and kubelet (simulator/kubenode.py), a real Prometheus scrapes it, the
remediator (its ServiceAccount, deploy/'s RBAC) evicts through the real API server, the
real ReplicaSet and scheduler make and place the replacement, and the real kubelet
admits it — aligned or not, as its Topology Manager policy decides — or refuses it.

One node, its kubelet restarted under each phase's policy. A kubelet under
``single-numa-node`` never admits a one-container pod across NUMA nodes (and, restarted
under it, refuses the running pods it would not admit now), so the fix that holds is
shown under ``best-effort``: the policy that admits a pod misaligned when no NUMA node
has room, and aligns its replacement once one has."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import aiohttp
import pytest
import pytest_asyncio

from numaguard.remediator.controller import Controller
from numaguard.remediator.core.policy import Policy
from numaguard.remediator.core.queries import Windows, expressions
from numaguard.remediator.kube import Kube, api_client
from numaguard.remediator.signals import Prometheus
from numaguard.simulator.controlplane import ControlPlane, path_of
from numaguard.simulator.kubenode import (
    KubeletPolicy,
    KubeNode,
    api_url,
    guaranteed_deployment,
    guaranteed_pod,
)
from numaguard.simulator.processes import free_port, until
from numaguard.simulator.prometheus import PrometheusServer
from tests.test_kubenode import SHAPE, exclusive_cpus
from tests.test_remediation import cycles_until

pytestmark = [
    pytest.mark.vm,
    pytest.mark.prometheus,
    pytest.mark.asyncio(loop_scope="module"),
    pytest.mark.timeout(1200),
]

NS = "vm-loop"
SLEEP = "sleep 2147483647"
WINDOW = "8s"  # the exporter collects every 2 s in an emulated guest
KEEP = 1  # refused pods kept for diagnosis
GRACE_SECONDS = 5


@dataclass
class Loop:
    cp: ControlPlane
    node: KubeNode
    prom: PrometheusServer
    session: aiohttp.ClientSession
    kube: Kube

    def controller(self, **policy) -> Controller:
        prometheus = Prometheus(self.prom.url, self.session, windows=Windows(WINDOW, WINDOW))
        settings = dict(
            dry_run=False,
            min_pod_age_seconds=0,
            stale_after_seconds=20,
            verify_after_seconds=10,
            verify_deadline_seconds=180,
            cooldown_seconds=2,
            keep_rejected_pods=KEEP,
        )
        return Controller(prometheus, self.kube, Policy(**{**settings, **policy}))

    async def pods(self, prefix: str, phase: str = "Running") -> list[dict]:
        return [
            p
            for p in await self.cp.items(self.session, "Pod", NS)
            if p["metadata"]["name"].startswith(prefix) and p["status"].get("phase") == phase
        ]

    async def running(self, prefix: str) -> dict:
        """The one pod named ``prefix...`` once it runs."""

        async def one():
            found = await self.pods(prefix)
            return found[0] if len(found) == 1 else None

        return await until(one, f"{prefix} Running", timeout=300, every=1)

    async def start(self, policy: str) -> None:
        """A clean slate: nothing of the last phase left, the kubelet under ``policy``."""
        for kind in ("Deployment", "Pod"):
            for obj in await self.cp.items(self.session, kind, NS):
                path = path_of(kind, NS, obj["metadata"]["name"]) + "?gracePeriodSeconds=0"
                await self.cp.request(self.session, "DELETE", path)

        async def gone():
            return not await self.cp.items(self.session, "Pod", NS)

        await until(gone, "the last phase's pods gone", timeout=300, every=1)
        if self.node.policy.topology != policy:
            await self.node.restart_kubelet(KubeletPolicy(policy, memory="None"))

    async def bare(self, name: str, cpus: int) -> dict:
        await self.cp.create(self.session, guaranteed_pod(name, NS, self.node.name, cpus, SLEEP))
        return await self.running(name)

    async def cpu_span_sustained(self) -> None:
        """A cpu_span verdict held a whole finding window, as the controller's query sees
        it: its next cycle opens the finding."""
        held = expressions(Windows(WINDOW, WINDOW), scope='reason="cpu_span"')
        await self.prom.wait_for(held["cross_numa_sustained"], 300)


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def loop(tmp_path_factory):
    job = tmp_path_factory.mktemp("kubenode-loop")
    async with contextlib.AsyncExitStack() as stack:
        cp = await stack.enter_async_context(ControlPlane())
        session = await stack.enter_async_context(aiohttp.ClientSession())
        await cp.install_numaguard(session)
        exporter_kubeconfig = cp.kubeconfig(
            job / "exporter.kubeconfig",
            cp.tokens["numaguard-exporter"],
            "numaguard-exporter",
            server=api_url(),
            server_name="kubernetes",
        )
        exporter = ("--kubeconfig", exporter_kubeconfig.replace(str(job), "/mnt"))
        exporter += ("--interval", "2", "--no-collector.gpu", "--no-collector.resctrl")
        node = await stack.enter_async_context(
            KubeNode(
                cp, job, policy=KubeletPolicy("none", memory="None"), exporter=exporter, shape=SHAPE
            )
        )
        prom = await stack.enter_async_context(
            PrometheusServer([node.exporter_url.removeprefix("http://")], free_port())
        )
        account = "numaguard-remediator"
        client = await api_client(
            cp.kubeconfig(job / "remediator.kubeconfig", cp.tokens[account], account)
        )
        stack.push_async_callback(client.close)
        await cp.create(
            session, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}}
        )
        yield Loop(cp, node, prom, session, Kube(client))


def deployment(name: str, cpus: int) -> dict:
    """One Guaranteed pod of ``cpus`` exclusive CPUs, a few seconds in terminating (its
    sleep, as PID 1, ignores SIGTERM): the real time between an eviction and the
    release of the evicted pod's CPUs, in which its replacement is admitted."""
    d = guaranteed_deployment(name, NS, cpus, SLEEP)
    d["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] = GRACE_SECONDS
    return d


def evictions(reports) -> list[str]:
    return [a.pod.name for r in reports for a, result in r.results if result == "evicted"]


async def test_under_none_the_replacement_comes_back_misaligned_and_it_gives_up(loop):
    # CPUs 1-3 of node 0 and 4-7 of node 1 free. The kubelet without a Topology Manager
    # policy packs CPUs from the node with the fewest free first: the fillers get 1 and
    # 2, the loader 3 and 4, across the two. Then the first filler leaves: node 1 has
    # room for the loader (5-7) and the remediator evicts — but the replacement comes
    # while the evicted loader still holds 3-4, so it is packed as 1 and 5: across again
    await loop.start("none")
    await loop.bare("filler-1", 1)
    await loop.bare("filler-2", 1)
    await loop.cp.create(loop.session, deployment("loader", 2))
    first = await loop.running("loader-")
    assert await exclusive_cpus(loop.node, first) == {"0": 1, "1": 1}
    await loop.cp.request(loop.session, "DELETE", path_of("Pod", NS, "filler-1"))
    await loop.cpu_span_sustained()
    controller = loop.controller(backoff_factor=2, give_up_after=2)
    reports = await cycles_until(
        controller,
        lambda rs: [v.outcome for r in rs for v in r.verified][-1:] == ["gave_up"],
        timeout=600,
    )
    assert [(v.workload, v.outcome) for r in reports for v in r.verified] == [
        (f"Deployment/{NS}/loader", "did_not_hold"),
        (f"Deployment/{NS}/loader", "gave_up"),
    ]
    assert len(evictions(reports)) == 2
    # the last replacement the real kubelet admitted was split as the first one
    last = await loop.running("loader-")
    assert last["metadata"]["uid"] != first["metadata"]["uid"]
    assert await exclusive_cpus(loop.node, last) == {"0": 1, "1": 1}
    # and it is left alone from then on, saying why
    report = await controller.cycle()
    assert not evictions([report])
    assert "gave_up" in {r.guard for r in report.plan.refusals}


async def test_under_best_effort_the_fix_holds_once_a_numa_node_has_room(loop):
    # the filler on node 0 (CPUs 1-2), the neighbour on node 1 (4-6): no NUMA node has
    # 2 free CPUs, and best-effort admits the trainer across both (3 and 7). Then the
    # neighbour leaves: node 1 has room, the remediator evicts, and the replacement is
    # admitted on node 1 beside what the evicted trainer still holds
    await loop.start("best-effort")
    await loop.bare("filler", 2)
    await loop.bare("neighbour", 3)
    await loop.cp.create(loop.session, deployment("trainer", 2))
    first = await loop.running("trainer-")
    assert await exclusive_cpus(loop.node, first) == {"0": 1, "1": 1}
    await loop.cp.request(loop.session, "DELETE", path_of("Pod", NS, "neighbour"))
    await loop.cpu_span_sustained()
    controller = loop.controller()
    reports = await cycles_until(controller, lambda rs: any(r.verified for r in rs), timeout=600)
    (verified,) = [v for r in reports for v in r.verified]
    assert (verified.workload, verified.kind, verified.outcome) == (
        f"Deployment/{NS}/trainer",
        "cross_numa",
        "held",
    ), verified.detail
    assert evictions(reports) == [first["metadata"]["name"]]
    replacement = await loop.running("trainer-")
    assert await exclusive_cpus(loop.node, replacement) == {"1": 2}
    verdicts = await loop.prom.query(
        f'numaguard_pod_cross_numa{{pod="{replacement["metadata"]["name"]}"}}'
    )
    assert {(r["metric"]["reason"], r["value"][1]) for r in verdicts} >= {("cpu_span", "0")}


async def test_under_single_numa_node_the_refused_pods_are_cleaned_up(loop):
    # free: CPU 3 on node 0, 7 on node 1; a 2-CPU pod fits the node (the scheduler
    # binds it) but no NUMA node: the kubelet refuses it, the ReplicaSet makes another
    await loop.start("single-numa-node")
    await loop.bare("filler", 2)
    await loop.bare("neighbour", 3)
    await loop.cp.create(loop.session, deployment("wide", 2))

    async def refused():
        failed = await loop.pods("wide-", "Failed")
        return len(failed) >= KEEP + 3 and failed

    for pod in await until(refused, "wide refused again and again", timeout=300, every=1):
        assert pod["status"]["reason"] == "TopologyAffinityError", pod["status"]
    await loop.cp.patch(loop.session, "Deployment", NS, "wide", {"spec": {"replicas": 0}})

    async def stopped():
        pods = await loop.cp.items(loop.session, "Pod", NS)
        wide = [p for p in pods if p["metadata"]["name"].startswith("wide-")]
        return all(p["status"].get("phase") == "Failed" for p in wide) and wide

    storm = await until(stopped, "no more wide pods coming", timeout=300, every=1)
    controller = loop.controller()
    report = await controller.cycle()
    (seen,) = report.storms
    assert (seen.workload, seen.node, seen.reason) == (
        f"Deployment/{NS}/wide",
        loop.node.name,
        "TopologyAffinityError",
    )
    assert len(seen.pods) == len(storm) and len(seen.delete) == len(storm) - KEEP

    async def cleaned():
        left = await loop.pods("wide-", "Failed")
        return left if len(left) == KEEP else None

    (left,) = await until(cleaned, "the surplus deleted", timeout=120, every=1)
    newest = max(storm, key=lambda p: p["metadata"]["creationTimestamp"])
    assert left["metadata"]["creationTimestamp"] == newest["metadata"]["creationTimestamp"]
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
