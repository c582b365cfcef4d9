"""--nrt on the real control plane with the NodeResourceTopology CRD (the scheduler-plugins
project's, fetched by make): the exporter, as its ServiceAccount with deploy/components/nrt's
RBAC, publishes its node's object; its zones are the exporter's numaguard_zone_* series
and follow them when a pod goes; a pod that the rule of NodeResourceTopologyMatch
(single-numa-node: one zone with all it asks) fits there is admitted by the node's
kubelet on such a zone. Without --nrt nothing is published."""

from __future__ import annotations

import contextlib

import pytest
from prometheus_client.parser import text_string_to_metric_families

from numaguard.simulator.cluster.simulated import SimulatedCluster, one_node
from numaguard.simulator.fakes import presets
from numaguard.simulator.parts.controlplane import ApiError, nrt_crd, path_of, rendered
from numaguard.simulator.parts.processes import get, until

pytestmark = pytest.mark.cluster

NODE = "gpu-node-3"
GPU = "nvidia.com/gpu"


async def grant_nrt(cp, session) -> None:
    """The CRD, and what deploy/components/nrt adds for the exporter beyond the base: its
    grant, and the policy holding each exporter to its own node's object."""
    await cp.install_crd(session, nrt_crd())
    for obj in rendered("nrt"):
        if obj["metadata"]["name"].startswith("numaguard-exporter-nrt"):
            with contextlib.suppress(ApiError):  # another test made it
                await cp.create(session, obj)


@contextlib.asynccontextmanager
async def exporter_token_on(cp, session, node: str):
    """The exporter's token as its DaemonSet pod on ``node`` has it: bound to that pod,
    and so to the node (the pod only stands in: nothing runs it; it goes at the end)."""
    pod = await cp.create(
        session,
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"generateName": "numaguard-exporter-", "namespace": "numaguard"},
            "spec": {
                "nodeName": node,
                "serviceAccountName": "numaguard-exporter",
                "containers": [{"name": "exporter", "image": "registry.example/numaguard:1"}],
            },
        },
    )
    try:
        yield await cp.service_account_token(session, "numaguard", "numaguard-exporter", pod=pod)
    finally:
        path = path_of("Pod", "numaguard", pod["metadata"]["name"])
        await cp.request(session, "DELETE", path, {"gracePeriodSeconds": 0})


def zones_of_series(metrics: bytes) -> dict[str, dict[str, tuple[int, int]]]:
    """numa node -> resource -> (allocatable, available), as the exporter's series say."""
    got: dict[tuple, float] = {}
    for family in text_string_to_metric_families(metrics.decode()):
        for s in family.samples:
            if s.name.startswith("numaguard_zone_") and s.labels.get("numa_node"):
                got[(s.name, s.labels["numa_node"], s.labels.get("resource", ""))] = s.value
    zones: dict[str, dict[str, tuple[int, int]]] = {}
    for (name, numa, resource), value in got.items():
        zone = zones.setdefault(f"node-{numa}", {})
        if name == "numaguard_zone_cpus_allocatable":
            allocated = got[("numaguard_zone_cpus_allocated", numa, "")]
            zone["cpu"] = (int(value), int(value - allocated))
        elif name == "numaguard_zone_devices_allocatable":
            free = got[("numaguard_zone_devices_free", numa, resource)]
            zone[resource] = (int(value), int(free))
        elif name == "numaguard_zone_memory_allocatable_bytes":
            free = got[("numaguard_zone_memory_free_bytes", numa, "")]
            zone["memory"] = (int(value), int(free))
    return zones


def zones_of_object(obj: dict) -> dict[str, dict[str, tuple[int, int]]]:
    return {
        z["name"]: {r["name"]: (int(r["allocatable"]), int(r["available"])) for r in z["resources"]}
        for z in obj["zones"]
    }


def fitting(obj: dict, need: dict[str, int]) -> set[str]:
    """NodeResourceTopologyMatch's single-numa-node rule over the object: the zones with
    all the pod asks for available."""
    return {
        name
        for name, resources in zones_of_object(obj).items()
        if all(resources.get(r, (0, 0))[1] >= n for r, n in need.items())
    }


async def test_the_published_topology_is_the_exporter_s_zones_and_follows_them(
    tmp_path, control_plane
):
    cp = control_plane
    sim = SimulatedCluster(str(tmp_path / "cluster"), cp)
    node = sim.add_node(NODE, *presets.gpu_node(), "single-numa-node")
    async with contextlib.AsyncExitStack() as stack:
        await sim.start()
        stack.push_async_callback(sim.stop)
        await grant_nrt(cp, sim.session)
        account = "numaguard-exporter"
        token = await stack.enter_async_context(exporter_token_on(cp, sim.session, NODE))
        kubeconfig = cp.kubeconfig(tmp_path / "exporter.kubeconfig", token, account)
        url, _ = await stack.enter_async_context(
            sim.exporter(node, kubeconfig, "--interval", "1", "--nrt")
        )

        async def published_as_series():
            obj = await cp.get(sim.session, "NodeResourceTopology", None, NODE)
            series = zones_of_series(await get(f"{url}/metrics"))
            return obj is not None and series and zones_of_object(obj) == series and obj

        obj = await until(published_as_series, "the object equal to the zone series", 60)
        health = await until(
            lambda: _sample(url, "numaguard_nrt_current"), "the exporter saying it is current"
        )
        assert health == 1.0
        attributes = {a["name"]: a["value"] for a in obj["attributes"]}
        assert attributes == {
            "topologyManagerPolicy": "single-numa-node",
            "topologyManagerScope": "container",
            "cpuManagerPolicy": "static",
        }
        (zero,) = [z for z in obj["zones"] if z["name"] == "node-0"]
        assert zero["type"] == "Node"
        assert {c["name"]: c["value"] for c in zero["costs"]} == {"node-0": 10, "node-1": 21}
        cpu = next(r for r in zero["resources"] if r["name"] == "cpu")
        assert int(cpu["capacity"]) == 32  # the NUMA node's CPUs

        # trainer (8 exclusive CPUs and GPU 0 on NUMA node 0) goes: node-0 has them back
        before = zones_of_object(obj)["node-0"]
        await cp.patch(sim.session, "Deployment", "ml", "trainer", {"spec": {"replicas": 0}})

        async def freed():
            now = await published_as_series()
            return now and zones_of_object(now)["node-0"]["cpu"][1] == before["cpu"][1] + 8 and now

        obj = await until(freed, "the object following trainer's CPUs back", 60)
        after = zones_of_object(obj)["node-0"]
        assert after[GPU][1] == before[GPU][1] + 1

        # the rule over the object says where trainer fits; the kubelet puts it there
        zones = fitting(obj, {"cpu": 8, GPU: 1})
        assert zones
        await cp.patch(sim.session, "Deployment", "ml", "trainer", {"spec": {"replicas": 1}})
        await sim.wait_until(lambda: sim.running("trainer-"), "trainer admitted again")
        (pod,) = sim.running("trainer-")
        cpus = {int(c) for part in pod.containers[0].cpus.split(",") for c in _span(part)}
        numa = {0 if c < 32 else 1 for c in cpus}
        assert {f"node-{n}" for n in numa} <= zones and len(numa) == 1


async def _sample(url: str, name: str) -> float | None:
    for family in text_string_to_metric_families((await get(f"{url}/metrics")).decode()):
        for s in family.samples:
            if s.name == name:
                return s.value
    return None


def _span(part: str) -> range:
    lo, _, hi = part.partition("-")
    return range(int(lo), int(hi or lo) + 1)


async def test_without_nrt_nothing_is_published(control_plane):
    async with one_node(control_plane, *presets.gpu_node(), name="gpu-node-5") as (sim, url):
        await grant_nrt(control_plane, sim.session)

        async def cycles():  # a few cycles' worth of zones seen
            return zones_of_series(await get(f"{url}/metrics"))

        await until(cycles, "zone series")
        await until(cycles, "zone series again")
        assert await _sample(url, "numaguard_nrt_current") is None  # no such series
        # --nrt as an account its RBAC does not let write the object: said, and nothing made
        node, cp = sim.nodes["gpu-node-5"], control_plane
        account = "numaguard-remediator"
        kubeconfig = cp.kubeconfig(f"{sim.directory}/other.kubeconfig", cp.tokens[account], account)
        async with sim.exporter(node, kubeconfig, "--interval", "1", "--nrt") as (other, _):

            async def not_current():
                return await _sample(other, "numaguard_nrt_current") == 0.0

            await until(not_current, "the exporter saying its topology is not published")
        assert await cp.get(sim.session, "NodeResourceTopology", None, "gpu-node-5") is None

        assert (
            await control_plane.get(sim.session, "NodeResourceTopology", None, "gpu-node-5") is None
        )


async def test_an_exporter_s_token_writes_only_its_own_node_s_topology(tmp_path, control_plane):
    """A token taken from the exporter on one node (bound to its pod there, as the
    DaemonSet's projected token is): the API server refuses it another node's object,
    to create or to replace, and lets it write its own."""
    cp = control_plane
    sim = SimulatedCluster(str(tmp_path / "cluster"), cp)
    for i, name in enumerate(("nrt-a", "nrt-b")):
        host, nvml = presets.gpu_node(node_id=i)
        host.pods = []  # nodes, no more: the objects are written by hand here
        sim.add_node(name, host, nvml, "single-numa-node")
    async with contextlib.AsyncExitStack() as stack:
        await sim.start()
        stack.push_async_callback(sim.stop)
        await grant_nrt(cp, sim.session)
        stolen = await stack.enter_async_context(exporter_token_on(cp, sim.session, "nrt-a"))

        def topology(node: str) -> dict:
            return {
                "apiVersion": "topology.node.k8s.io/v1alpha2",
                "kind": "NodeResourceTopology",
                "metadata": {"name": node},
                "zones": [],
            }

        def at(node: str | None = None) -> str:
            return path_of("NodeResourceTopology", None, node)

        other = await cp.request(sim.session, "POST", at(), topology("nrt-b"), stolen)
        assert other[0] == 403, other
        assert "only the NodeResourceTopology of the node it runs on" in str(other[1])
        own = await cp.request(sim.session, "POST", at(), topology("nrt-a"), stolen)
        assert own[0] == 201, own
        # replacing: its own yes, another's (made by someone allowed to) no
        await cp.create(sim.session, topology("nrt-b"))
        for node, allowed in (("nrt-a", 200), ("nrt-b", 403)):
            current = await cp.get(sim.session, "NodeResourceTopology", None, node)
            put = await cp.request(sim.session, "PUT", at(node), current, stolen)
            assert put[0] == allowed, (node, put)
        for node in ("nrt-a", "nrt-b"):
            await cp.request(sim.session, "DELETE", at(node))


def test_the_object_says_nothing_it_does_not_know():
    """No zones from the kubelet: no object (never one saying the node has no room);
    memory only where the memory manager reports it; available never below zero."""
    from dataclasses import replace

    from numaguard.exporter.model import NodeSnapshot
    from numaguard.exporter.model.placement import Topology
    from numaguard.exporter.model.zones import Zone
    from numaguard.exporter.publishers.nrt_object import node_resource_topology
    from numaguard.exporter.readers.kubeletconfig import CpuManager, KubeletConfig

    topology = Topology((0, 1), {0: 0, 1: 0, 2: 1, 3: 1}, {}, {0: {0: 10, 1: 21}}, {})
    snap = NodeSnapshot(NODE, 0.0, topology, (), {}, None, (), False, None)
    assert node_resource_topology(snap) is None
    zones = (
        Zone(0, 2, 1, {GPU: 2}, {GPU: 0}, None, None),
        Zone(1, 2, 3, {}, {}, 8 << 30, 1 << 30),  # more handed out than allocatable
        Zone(None, None, None, {"example.com/nic": 1}, {"example.com/nic": 1}, None, None),
    )
    assert "attributes" not in node_resource_topology(replace(snap, zones=zones))
    manager = CpuManager("static", {"full-pcpus-only": "true", "a": "1"}, frozenset({0, 1, 64}))
    config = KubeletConfig("restricted", "pod", manager)
    obj = node_resource_topology(replace(snap, zones=zones, kubelet_config=config))
    assert obj["attributes"] == [
        {"name": "topologyManagerPolicy", "value": "restricted"},
        {"name": "topologyManagerScope", "value": "pod"},
        {"name": "cpuManagerPolicy", "value": "static"},
        {"name": "cpuManagerPolicyOptions", "value": "full-pcpus-only=true,a=1"},
        {"name": "reservedSystemCPUs", "value": "0-1,64"},
    ]
    assert [z["name"] for z in obj["zones"]] == ["node-0", "node-1"]  # no NUMA node: out
    zero, one = obj["zones"]
    assert zero["resources"] == [
        {"name": "cpu", "capacity": 2, "allocatable": 2, "available": 1},
        {"name": GPU, "capacity": 2, "allocatable": 2, "available": 0},
    ]
    assert zero["costs"] == [{"name": "node-0", "value": 10}, {"name": "node-1", "value": 21}]
    assert one["resources"][0]["available"] == 0
    assert one["resources"][1]["name"] == "memory" and "costs" not in one
