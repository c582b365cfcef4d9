"""A TopologyAffinityError storm on the real control plane: a Deployment pinned to a node
whose Topology Manager (single-numa-node) has no aligned room keeps having its pods
refused by the kubelet, its real ReplicaSet making new ones; another node has room. The
remediator, as its ServiceAccount with deploy/'s RBAC, reports the storm, names the node
with room, and deletes the failed pods beyond the newest few — in dry-run, only says so."""

from __future__ import annotations

import contextlib

import aiohttp
import pytest

from numaguard.remediator.controller import Controller
from numaguard.remediator.core.policy import Policy
from numaguard.remediator.core.queries import Windows
from numaguard.remediator.kube import Kube, api_client
from numaguard.remediator.signals import Prometheus
from numaguard.simulator.cluster.simulated import SimulatedCluster
from numaguard.simulator.fakes import presets
from numaguard.simulator.parts.processes import free_port, until
from numaguard.simulator.parts.prometheus import PrometheusServer
from tests.helpers.sim_cluster import busy_socket1, evict, hold_gpu3

pytestmark = [pytest.mark.prometheus, pytest.mark.cluster]

KEEP = 2


def empty_gpu_node():
    """The GPU node's hardware with nothing running on it: all its room free."""
    host, nvml = presets.gpu_node(node_id=1)
    host.pods = []
    for gpu in nvml.gpus:
        gpu.processes.clear()
        for s in gpu.mig or []:
            s.processes.clear()
    return host, nvml


async def failed(sim: SimulatedCluster) -> list[dict]:
    pods = await sim.cp.items(sim.session, "Pod", "ml")
    return [
        p
        for p in pods
        if p["metadata"]["name"].startswith("trainer-remote-")
        and p["status"].get("reason") == "TopologyAffinityError"
    ]


async def test_a_topology_affinity_error_storm_is_reported_bounded_and_cleaned(
    tmp_path, control_plane
):
    cp = control_plane
    sim = SimulatedCluster(str(tmp_path / "cluster"), cp)
    host, nvml = presets.gpu_node()
    hold_gpu3(host, nvml)
    busy_socket1(host, nvml)  # no NUMA node of "a" has both a free GPU and 6 CPUs
    sim.node_pools["ml"] = "a"  # the team's workloads go to "a" only
    a = sim.add_node("a", host, nvml, "single-numa-node")
    b = sim.add_node("b", *empty_gpu_node(), "single-numa-node")
    async with contextlib.AsyncExitStack() as stack:
        await sim.start()
        stack.push_async_callback(sim.stop)
        kubeconfigs = {}
        for account in ("numaguard-exporter", "numaguard-remediator"):
            path = tmp_path / f"{account}.kubeconfig"
            kubeconfigs[account] = cp.kubeconfig(path, cp.tokens[account], account)
        urls = []
        for node in (a, b):
            url, _ = await stack.enter_async_context(
                sim.exporter(node, kubeconfigs["numaguard-exporter"], "--interval", "1")
            )
            urls.append(url.removeprefix("http://"))
        prom = await stack.enter_async_context(PrometheusServer(urls, free_port()))
        session = await stack.enter_async_context(aiohttp.ClientSession())
        client = await api_client(kubeconfigs["numaguard-remediator"])
        stack.push_async_callback(client.close)

        # the storm: each replacement is refused, and the ReplicaSet makes another
        assert await evict(sim, "trainer-remote") == 201
        await sim.wait_until(lambda: len(sim.rejected) >= KEEP + 4, "pods refused again and again")
        await cp.patch(sim.session, "Deployment", "ml", "trainer-remote", {"spec": {"replicas": 0}})

        async def stopped():
            """Its ReplicaSets have seen the scale-down and every pod of it has failed:
            no more are coming."""
            sets = [
                r
                for r in await cp.items(sim.session, "ReplicaSet", "ml")
                if r["metadata"]["name"].startswith("trainer-remote-")
            ]
            seen = all(
                not r["spec"]["replicas"]
                and r["status"].get("observedGeneration", 0) >= r["metadata"]["generation"]
                and not r["status"].get("replicas")
                for r in sets
            )
            pods = [
                p
                for p in await cp.items(sim.session, "Pod", "ml")
                if p["metadata"]["name"].startswith("trainer-remote-")
            ]
            return seen and all(p["status"].get("phase") == "Failed" for p in pods)

        await until(stopped, "the storm stopped")
        storm = await failed(sim)
        assert len(storm) >= KEEP + 4

        def controller(dry_run: bool) -> Controller:
            prometheus = Prometheus(prom.url, session, windows=Windows("4s", "4s"))
            policy = Policy(dry_run=dry_run, stale_after_seconds=10, keep_rejected_pods=KEEP)
            return Controller(prometheus, Kube(client), policy)

        # dry-run: reported, the node with room named, nothing deleted
        looking = controller(dry_run=True)

        async def room_found():
            report = await looking.cycle()
            return report.storms and report.storms[0].fit is not None and report

        report = await until(room_found, "the storm seen, with b's room", timeout=120)
        (seen,) = report.storms
        assert (seen.workload, seen.node, seen.reason) == (
            "Deployment/ml/trainer-remote",
            "a",
            "TopologyAffinityError",
        )
        assert len(seen.pods) == len(storm) and seen.fit[0] == "b"
        assert len(seen.delete) == len(storm) - KEEP and seen.dry_run
        labels = {
            "namespace": "ml",
            "workload": "Deployment/ml/trainer-remote",
            "node": "a",
            "reason": "TopologyAffinityError",
        }
        metric = looking.metrics.registry.get_sample_value
        assert metric("numaguard_remediator_rejected_pods", labels) == len(storm)
        assert len(await failed(sim)) == len(storm)
        # an Event each time what it says changed (the first cycles may not see b yet)
        events = [
            e
            for e in await cp.items(sim.session, "Event", "ml")
            if e["reason"] == "AdmissionRejections" and "b NUMA node" in e["message"]
        ]
        (event,) = events
        assert event["involvedObject"]["kind"] == "Deployment"
        assert event["involvedObject"]["name"] == "trainer-remote"
        assert f"would delete {len(storm) - KEEP}" in event["message"]
        assert "b NUMA node" in event["message"]

        # acting: all but the newest KEEP deleted, by the remediator's own account
        acting = controller(dry_run=False)
        report = await acting.cycle()
        (seen,) = report.storms
        assert len(seen.delete) == len(storm) - KEEP and not seen.dry_run
        left = await until(lambda: _left_when(sim, KEEP), "the surplus deleted", timeout=60)
        newest = sorted(storm, key=lambda p: p["metadata"]["creationTimestamp"])[-KEEP:]
        assert {p["metadata"]["uid"] for p in left} == {p.uid for p in seen.pods[:KEEP]}
        assert sorted(p["metadata"]["creationTimestamp"] for p in left) == sorted(
            p["metadata"]["creationTimestamp"] for p in newest
        )
        deleted = {"kind": "delete", "result": "deleted"}
        actions = acting.metrics.registry.get_sample_value
        assert actions("numaguard_remediator_actions_total", deleted) == len(storm) - KEEP
        # the next cycle finds only the kept ones, and deletes nothing more
        report = await acting.cycle()
        assert [len(s.pods) for s in report.storms] == [KEEP]
        assert report.storms[0].delete == ()


async def _left_when(sim: SimulatedCluster, keep: int) -> list[dict] | None:
    left = await failed(sim)
    return left if len(left) == keep else None


async def test_refused_pods_of_what_is_no_workload_are_reported_never_deleted(
    tmp_path, control_plane
):
    """Failed pods whose controller is a Job, a kind that does not exist, or a Node:
    the remediator (its own account, deploy/'s RBAC) reports them and deletes none."""
    cp = control_plane
    namespace = "tenant-jobs"
    async with contextlib.AsyncExitStack() as stack:
        session = await stack.enter_async_context(aiohttp.ClientSession())
        await cp.create(
            session, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}}
        )
        job = await cp.call(
            session,
            "POST",
            f"/apis/batch/v1/namespaces/{namespace}/jobs",
            {
                "apiVersion": "batch/v1",
                "kind": "Job",
                "metadata": {"name": "train", "namespace": namespace},
                "spec": {
                    "suspend": True,
                    "template": {
                        "spec": {
                            "restartPolicy": "Never",
                            "containers": [{"name": "c", "image": "registry.example/c:1"}],
                        }
                    },
                },
            },
        )
        owners = [
            ("batch/v1", "Job", "train", job["metadata"]["uid"]),
            ("example.com/v1", "Trainer", "t", "0f8fad5b-d9cb-469f-a165-70867728950e"),
        ]
        names = []
        for i in range(2 * (KEEP + 2)):
            version, kind, name, uid = owners[i % 2]
            ref = {"apiVersion": version, "kind": kind, "name": name, "uid": uid}
            pod = await cp.create(
                session,
                {
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "metadata": {
                        "name": f"refused-{i}",
                        "namespace": namespace,
                        "ownerReferences": [{**ref, "controller": True}],
                    },
                    "spec": {
                        "nodeName": "gone-node",  # bound: no scheduler, no kubelet
                        "containers": [{"name": "c", "image": "registry.example/c:1"}],
                    },
                },
            )
            status = {"phase": "Failed", "reason": "TopologyAffinityError", "message": "x"}
            await cp.patch(
                session, "Pod", namespace, pod["metadata"]["name"], {"status": status}, "status"
            )
            names.append(pod["metadata"]["name"])

        async def gone():
            for name in names:  # failed and never run: nothing to wait for
                await cp.request(session, "DELETE", f"/api/v1/namespaces/{namespace}/pods/{name}")
            await cp.request(session, "DELETE", f"/api/v1/namespaces/{namespace}")

        stack.push_async_callback(gone)
        prom = await stack.enter_async_context(PrometheusServer([], free_port()))
        client = await api_client(
            cp.kubeconfig(tmp_path / "remediator", cp.tokens["numaguard-remediator"])
        )
        stack.push_async_callback(client.close)
        prometheus = Prometheus(prom.url, session, windows=Windows("4s", "4s"))
        policy = Policy(dry_run=False, keep_rejected_pods=KEEP)
        controller = Controller(prometheus, Kube(client), policy)
        report = await controller.cycle()
        mine = {s.workload: s for s in report.storms if s.namespace == namespace}
        assert set(mine) == {f"Job/{namespace}/train", f"Trainer/{namespace}/t"}
        assert all(s.guard == "unsupported_owner" and not s.delete for s in mine.values())
        assert all(len(s.pods) == KEEP + 2 for s in mine.values())
        left = [p["metadata"]["name"] for p in await cp.items(session, "Pod", namespace)]
        assert sorted(left) == sorted(names)
