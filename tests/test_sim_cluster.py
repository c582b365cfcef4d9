"""The simulated nodes' kubelet on the real control plane: it admits the pods the real
scheduler binds under its Topology Manager policy, and the real ReplicaSet and
StatefulSet controllers make the replacements of evicted pods."""

from __future__ import annotations

import types

import aiohttp
import pytest

from numaguard.exporter.readers import parse_id_list
from numaguard.remediator.actuator import Actuator
from numaguard.remediator.kube import Kube, api_client
from numaguard.simulator.cluster.simulated import SimulatedCluster
from numaguard.simulator.fakes import presets
from numaguard.simulator.fakes.host import FakePod
from numaguard.simulator.parts.processes import until
from tests.helpers.sim_cluster import busy_socket1, evict, hold_gpu3

pytestmark = pytest.mark.cluster


@pytest.fixture
async def sim_cluster(tmp_path, control_plane):
    made = []

    async def make(policy: str, *prepare) -> SimulatedCluster:
        sim = SimulatedCluster(str(tmp_path / policy), control_plane)
        host, nvml = presets.gpu_node()
        for step in prepare:
            step(host, nvml)
        sim.add_node("a", host, nvml, policy)
        made.append(sim)
        await sim.start()
        return sim

    yield make
    for sim in made:
        await sim.stop()


async def replacement(sim: SimulatedCluster, workload: str) -> FakePod | None:
    """Evict the workload's pod; its replacement once admitted, or None once the
    kubelet refused one."""
    admitted, rejected = len(sim.admitted), len(sim.rejected)
    assert await evict(sim, workload) == 201
    await sim.wait_until(
        lambda: (
            [n for n in sim.admitted[admitted:] if n.startswith(f"{workload}-")]
            or sim.rejected[rejected:]
        ),
        f"{workload} replaced",
    )
    if sim.rejected[rejected:]:
        return None
    return next(p for p in sim.running(f"{workload}-"))


def placement(sim: SimulatedCluster, pod: FakePod) -> tuple[set[int], int]:
    """(NUMA nodes of its CPUs, NUMA node of its GPU)."""
    node = sim.nodes["a"]
    cpus = parse_id_list(pod.containers[0].cpus)
    nodes = {i for i, n in enumerate(node.host.nodes) if parse_id_list(n.cpus) & cpus}
    (uuid,) = pod.containers[0].devices["nvidia.com/gpu"]
    return nodes, next(g.numa_node for g in node.nvml.gpus if g.uuid == uuid)


@pytest.mark.parametrize(
    ("policy", "expected"),
    [
        ("single-numa-node", ({1}, 1)),  # aligned on socket 1 (GPU 7 and CPUs there)
        ("restricted", ({1}, 1)),
        ("best-effort", ({1}, 1)),
        ("none", ({0}, 1)),  # lowest CPUs (socket 0), first free GPU (7): misaligned
    ],
)
async def test_admission_follows_the_topology_policy(sim_cluster, policy, expected):
    sim = await sim_cluster(policy, hold_gpu3)
    pod = await replacement(sim, "trainer-remote")
    obj = await sim.cp.get(sim.session, "Pod", "ml", pod.name)
    # made by the real ReplicaSet (of the real Deployment), bound by the real scheduler
    assert obj["metadata"]["ownerReferences"][0]["name"] == "trainer-remote-preset"
    assert obj["spec"]["nodeName"] == "a" and obj["status"]["phase"] == "Running"
    assert placement(sim, pod) == expected
    # the job runs on its new GPU, as busy as its feeding lets it be
    host, nvml = sim.nodes["a"].host, sim.nodes["a"].nvml
    (uuid,) = pod.containers[0].devices["nvidia.com/gpu"]
    gpu = next(g for g in nvml.gpus if g.uuid == uuid)
    assert [p.pid for p in gpu.processes] == [host.pid(pod, pod.containers[0])]
    aligned = expected[0] == {expected[1]}
    assert gpu.activity.rates["sm"] == pytest.approx(0.8 if aligned else 0.8 * 0.15)


@pytest.mark.parametrize(("policy", "placed"), [("single-numa-node", False), ("best-effort", True)])
async def test_no_aligned_room_is_refused_by_strict_policies_only(sim_cluster, policy, placed):
    sim = await sim_cluster(policy, hold_gpu3, busy_socket1)
    pod = await replacement(sim, "trainer-remote")
    assert (pod is not None) == placed
    if not placed:  # as the kubelet reports it
        name = sim.rejected[0]
        status = (await sim.cp.get(sim.session, "Pod", "ml", name))["status"]
        assert (status["phase"], status["reason"]) == ("Failed", "TopologyAffinityError")


async def test_a_replacement_is_admitted_while_the_evicted_pod_still_holds_its_cpus(
    sim_cluster,
):
    # as on a real kubelet (tests/test_kubenode_loop.py): the ReplicaSet makes the
    # replacement at once, and it is admitted beside the evicted pod still terminating.
    # Without a Topology Manager policy it is packed from NUMA node 0, the fuller: from
    # the evicted pod's CPUs 10-15, were they free
    sim = await sim_cluster("none")
    (before,) = sim.running("trainer-remote")
    held = parse_id_list(before.containers[0].cpus)
    pod = await replacement(sim, "trainer-remote")
    assert not parse_id_list(pod.containers[0].cpus) & held
    # then the evicted pod is gone, from the node and from the API server
    host = sim.nodes["a"].host
    await sim.wait_until(lambda: before not in host.pods, "the evicted pod gone")

    async def deleted():
        return await sim.cp.get(sim.session, "Pod", "ml", before.name) is None

    await until(deleted, "the evicted pod's object deleted")


async def test_a_replacement_s_memory_follows_its_new_cpus(sim_cluster):
    # trainer-remote's 32 GiB sit on NUMA node 0 with its CPUs; aligned to GPU 7 on
    # socket 1, its replacement's memory is first touched there, not copied from before
    sim = await sim_cluster("single-numa-node", hold_gpu3)
    (before,) = sim.running("trainer-remote")
    assert before.containers[0].memory_by_node == {0: 32 << 30}
    pod = await replacement(sim, "trainer-remote")
    assert pod.containers[0].memory_by_node == {1: 32 << 30}


async def test_an_eviction_rewrites_only_the_files_that_changed(sim_cluster):
    sim = await sim_cluster("single-numa-node", hold_gpu3)
    node = sim.nodes["a"]
    topology = node.root.root / "sys/devices/system/node/node0/cpulist"
    uid = node.host.pod("trainer").uid  # an aligned pod the eviction leaves alone
    (other_pod,) = [
        p
        for p in node.root.root.glob("sys/fs/cgroup/**/cpuset.cpus.effective")
        if uid.replace("-", "_") in str(p) or uid in str(p)
    ][:1]
    stamps = (topology.stat().st_mtime_ns, other_pod.stat().st_mtime_ns)
    await replacement(sim, "trainer-remote")
    assert (topology.stat().st_mtime_ns, other_pod.stat().st_mtime_ns) == stamps


async def test_a_statefulset_pod_comes_back_by_name_and_its_old_uid_is_refused(
    sim_cluster, tmp_path
):
    sim = await sim_cluster("single-numa-node")
    limits = {"cpu": "4", "memory": "8Gi", "nvidia.com/gpu": "1"}
    statefulset = {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": {"name": "db", "namespace": "ml"},
        "spec": {
            "replicas": 1,
            "serviceName": "db",
            "selector": {"matchLabels": {"app": "db"}},
            "template": {
                "metadata": {"labels": {"app": "db"}},
                "spec": {
                    "terminationGracePeriodSeconds": 5,
                    "containers": [
                        {
                            "name": "main",
                            "image": "db:1",
                            "resources": {"requests": limits, "limits": limits},
                        }
                    ],
                },
            },
        },
    }
    await sim.cp.create(sim.session, statefulset)
    await sim.wait_until(lambda: sim.running("db-0"), "db-0 running")
    (first,) = sim.running("db-0")
    # evicted as the remediator evicts, as the remediator's ServiceAccount
    kubeconfig = sim.cp.kubeconfig(
        tmp_path / "remediator", sim.cp.tokens["numaguard-remediator"], "numaguard-remediator"
    )
    client = await api_client(kubeconfig)
    try:
        actuator = Actuator(Kube(client), None, dry_run=False)
        old = types.SimpleNamespace(namespace="ml", name="db-0", uid=first.uid)
        assert await actuator._evict(old) == "evicted"
        # the real StatefulSet controller makes db-0 again, a new pod
        await sim.wait_until(
            lambda: [p for p in sim.running("db-0") if p.uid != first.uid], "db-0 recreated"
        )
        # an eviction naming the old pod's uid is not the new pod's: the API server
        # refuses it (409), so a second remediator acting on old data evicts nothing
        assert await evict(sim, "db-0", uid=first.uid) == 409
        assert await actuator._evict(old) == "gone"
        (again,) = sim.running("db-0")
        assert again.uid != first.uid
    finally:
        await client.close()


async def test_a_node_no_live_cluster_runs_is_forgotten_at_start(sim_cluster, control_plane):
    """A Node left by a cluster that could not stop would draw the scheduler's pods,
    never to be admitted: the next cluster removes it first."""
    async with aiohttp.ClientSession() as session:
        node = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "left-behind"}}
        await control_plane.create(session, node)
        await sim_cluster("single-numa-node")
        assert await control_plane.get(session, "Node", None, "left-behind") is None
        assert await control_plane.get(session, "Node", None, "a") is not None
