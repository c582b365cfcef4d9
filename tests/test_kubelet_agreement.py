"""The simulated kubelet (simulator/node.py's admit, which the simulated clusters, the
demo and the decision benchmark run on) against the real one: the same pods, in the same
order, on nodes of the same shape under the same Topology Manager policy, and the same
answers — admitted or refused, and how many exclusive CPUs on each NUMA node."""

from __future__ import annotations

import aiohttp
import pytest
import pytest_asyncio

from numaguard.exporter.readers import parse_id_list
from numaguard.simulator import vm
from numaguard.simulator.controlplane import ControlPlane
from numaguard.simulator.host import FakeContainer, FakeHost, FakeNumaNode, FakePod
from numaguard.simulator.kubenode import KubeletPolicy, KubeNode, guaranteed_pod
from numaguard.simulator.node import SimNode, admit
from numaguard.simulator.nvml import FakeNvml
from numaguard.simulator.processes import until

# an emulated node: booting it and its kubelet takes minutes on a loaded machine
pytestmark = [
    pytest.mark.vm,
    pytest.mark.asyncio(loop_scope="module"),
    pytest.mark.timeout(1200),
]

SHAPE = vm.Shape(cores=4)  # CPUs 0-3 on NUMA node 0, 4-7 on node 1
RESERVED = frozenset({0})  # the real kubelet's reservedSystemCPUs
NS = "agreement"
# exclusive CPUs asked for, pod after pod (CPUs 1-3 of node 0 and 4-7 of node 1 free):
# 1; 5, more than a node has (under none: node 1 whole, then 1 from node 0 — not the
# lowest 5; under single-numa-node refused); 1
SCENARIO = (1, 5, 1)


def simulated(policy: str, requests=SCENARIO) -> list[str]:
    """What the simulated kubelet decides for each request, in order."""
    host = FakeHost(nodes=[FakeNumaNode("0-3", socket=0), FakeNumaNode("4-7", socket=1)], pods=[])
    node = SimNode("sim", host, FakeNvml(), policy, reserved=RESERVED)
    out = []
    for i, need in enumerate(requests):
        given = admit(node, need, [])
        if given is None:
            out.append("refused")
            continue
        cpus, _ = given
        out.append(per_node(cpus))
        container = FakeContainer("work", ",".join(map(str, sorted(cpus))), exclusive_cpus=True)
        host.pods.append(FakePod(f"p{i}", f"uid-{i}", "guaranteed", [container]))
    return out


def per_node(cpus) -> str:
    """'node0=2 node1=0': exclusive CPUs on each NUMA node."""
    counts = [sum(1 for c in cpus if c // SHAPE.cores == n) for n in range(SHAPE.sockets)]
    return " ".join(f"node{n}={k}" for n, k in enumerate(counts))


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def control_plane_for_vm():
    async with ControlPlane() as cp:
        yield cp


@pytest.mark.parametrize("policy", ["none", "single-numa-node"])
async def test_the_simulated_kubelet_admits_as_the_real_one(policy, control_plane_for_vm, tmp_path):
    cp = control_plane_for_vm
    ns = f"{NS}-{policy}"
    real = []
    async with (
        # a node of its own: the control plane outlives each test's node and its pods
        KubeNode(cp, tmp_path, f"vm-{policy}", KubeletPolicy(topology=policy), shape=SHAPE) as node,
        aiohttp.ClientSession() as session,
    ):
        await cp.create(
            session, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}
        )
        for i, need in enumerate(SCENARIO):
            await cp.create(
                session,
                guaranteed_pod(f"p{i}", ns, node.name, need, "sleep 2147483647", "64Mi"),
            )

            async def decided(i=i):
                p = await cp.get(session, "Pod", ns, f"p{i}")
                return p if p["status"].get("phase") in ("Running", "Failed") else None

            p = await until(decided, f"p{i} admitted or refused", timeout=300, every=1)
            if p["status"]["phase"] == "Failed":
                real.append("refused")
                assert p["status"]["reason"] == "TopologyAffinityError", p["status"]
                continue
            cid = p["status"]["containerStatuses"][0]["containerID"].split("://")[1]
            cpus = await node.sh(
                f"cat /sys/fs/cgroup/kubepods/pod{p['metadata']['uid']}/{cid}/cpuset.cpus"
            )
            real.append(per_node(parse_id_list(cpus.strip())))
    assert simulated(policy) == real, f"simulated (left) and real (right) under {policy}"
