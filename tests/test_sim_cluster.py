"""The simulated cluster's kubelet admits replacements under its Topology Manager policy."""

from __future__ import annotations

import pytest

from exporter.readers import parse_id_list
from simulator import presets
from simulator.cluster import SimulatedCluster
from simulator.host import FakeContainer, FakePod


def evict(sim: SimulatedCluster, node: str, pod: str):
    host = sim.nodes[node].host
    obj = {"metadata": {"uid": host.pod(pod).uid}, "spec": {"nodeName": node}}
    return sim.replace(obj)


def placement(sim: SimulatedCluster, name: str) -> tuple[set[int], int]:
    """(NUMA nodes of its CPUs, NUMA node of its GPU)."""
    host = next(n.host for n in sim.nodes.values() if any(p.name == name for p in n.host.pods))
    nvml = next(n.nvml for n in sim.nodes.values() if n.host is host)
    ctr = host.pod(name).containers[0]
    cpus = parse_id_list(ctr.cpus)
    nodes = {i for i, n in enumerate(host.nodes) if parse_id_list(n.cpus) & cpus}
    (uuid,) = ctr.devices["nvidia.com/gpu"]
    return nodes, next(g.numa_node for g in nvml.gpus if g.uuid == uuid)


def hold_gpu3(host, nvml):
    host.pods.append(
        FakePod(
            "hold",
            presets.pod_uid("hold"),
            "guaranteed",
            [
                FakeContainer(
                    "main",
                    "24-25",
                    {0: 1 << 30},
                    exclusive_cpus=True,
                    devices={"nvidia.com/gpu": [nvml.gpus[3].uuid]},
                )
            ],
            "ml",
        )
    )


@pytest.mark.parametrize(
    ("policy", "expected"),
    [
        ("single-numa-node", ({1}, 1)),  # aligned on socket 1 (GPU 7 and CPUs there)
        ("restricted", ({1}, 1)),
        ("best-effort", ({1}, 1)),
        ("none", ({0}, 1)),  # lowest CPUs (socket 0), first free GPU (7): misaligned
    ],
)
def test_admission_follows_the_topology_policy(tmp_path, policy, expected):
    sim = SimulatedCluster(str(tmp_path))
    host, nvml = presets.gpu_node()
    hold_gpu3(host, nvml)
    sim.add_node("a", host, nvml, policy)
    obj = evict(sim, "a", "trainer-remote")
    assert obj["metadata"]["name"] == "trainer-remote.1"
    assert obj["metadata"]["ownerReferences"][0]["name"] == "trainer-remote-rs"
    assert placement(sim, "trainer-remote.1") == expected
    # the job runs on its new GPU, as busy as its feeding lets it be
    (uuid,) = host.pod("trainer-remote.1").containers[0].devices["nvidia.com/gpu"]
    gpu = next(g for g in nvml.gpus if g.uuid == uuid)
    assert [p.pid for p in gpu.processes] == [
        host.pid(host.pod("trainer-remote.1"), host.pod("trainer-remote.1").containers[0])
    ]
    aligned = expected[0] == {expected[1]}
    assert gpu.activity.rates["sm"] == pytest.approx(0.8 if aligned else 0.8 * 0.15)


def test_no_aligned_room_is_refused_by_strict_policies_only(tmp_path):
    for policy, placed in (("single-numa-node", False), ("best-effort", True)):
        sim = SimulatedCluster(str(tmp_path / policy))
        host, nvml = presets.gpu_node()
        hold_gpu3(host, nvml)
        # socket 1 keeps its GPU 7 free but has only 2 free CPUs
        host.pods.append(
            FakePod(
                "busy",
                presets.pod_uid("busy"),
                "guaranteed",
                [FakeContainer("main", "42-61", {1: 1 << 30}, exclusive_cpus=True)],
                "ml",
            )
        )
        sim.add_node("a", host, nvml, policy)
        assert (evict(sim, "a", "trainer-remote") is not None) == placed
        assert bool(sim.rejected) != placed


def test_a_replacement_s_memory_follows_its_new_cpus(tmp_path):
    # trainer-remote's 32 GiB sit on NUMA node 0 with its CPUs; aligned to GPU 7 on
    # socket 1, its replacement's memory is first touched there, not copied from before
    sim = SimulatedCluster(str(tmp_path))
    host, nvml = presets.gpu_node()
    hold_gpu3(host, nvml)
    before = dict(host.pod("trainer-remote").containers[0].memory_by_node)
    sim.add_node("a", host, nvml, "single-numa-node")
    evict(sim, "a", "trainer-remote")
    after = host.pod("trainer-remote.1").containers[0].memory_by_node
    assert before == {0: 32 << 30} and after == {1: 32 << 30}


def test_an_eviction_rewrites_only_the_files_that_changed(tmp_path):
    sim = SimulatedCluster(str(tmp_path))
    host, nvml = presets.gpu_node()
    hold_gpu3(host, nvml)
    node = sim.add_node("a", host, nvml, "single-numa-node")
    topology = node.root.root / "sys/devices/system/node/node0/cpulist"
    uid = host.pod("trainer").uid  # an aligned pod the eviction leaves alone
    (other_pod,) = [
        p
        for p in node.root.root.glob("sys/fs/cgroup/**/cpuset.cpus.effective")
        if uid.replace("-", "_") in str(p) or uid in str(p)
    ][:1]
    stamps = (topology.stat().st_mtime_ns, other_pod.stat().st_mtime_ns)
    evict(sim, "a", "trainer-remote")
    assert (topology.stat().st_mtime_ns, other_pod.stat().st_mtime_ns) == stamps
