"""The simulated kubelet (simulator/cluster/node.py's admit, which the simulated clusters, the
demo and the decision benchmark run on) against the real one: the same pods, in the same
order, on nodes of the same shape under the same Topology Manager policy, and the same
answers — admitted or refused, and how many exclusive CPUs on each NUMA node. One real
node, its kubelet restarted under each policy with no pod left on it."""

from __future__ import annotations

import json

import aiohttp
import pytest
import pytest_asyncio

from numaguard.exporter.readers import format_id_list
from numaguard.simulator.cluster.node import POLICIES, SimNode, admit
from numaguard.simulator.demos.node_stories import SHAPE, cpu_nodes
from numaguard.simulator.fakes.host import FakeContainer, FakeHost, FakeNumaNode, FakePod
from numaguard.simulator.fakes.nvml import FakeNvml
from numaguard.simulator.parts.controlplane import ControlPlane, path_of
from numaguard.simulator.parts.processes import until
from numaguard.simulator.parts.vm_kubelet import SLEEP, KubeletPolicy, KubeNode, guaranteed_pod

# an emulated node: booting it and its kubelet takes minutes on a loaded machine
pytestmark = [
    pytest.mark.vm,
    pytest.mark.asyncio(loop_scope="module"),
    pytest.mark.timeout(1200),
]

RESERVED = frozenset({0})  # the real kubelet's reservedSystemCPUs
NS = "agreement"
# exclusive CPUs asked for, pod after pod, on a node whose CPUs 1-3 (NUMA node 0) and
# 4-7 (node 1) are free
SCENARIOS = {
    # 5, more than a node has: under none, node 1 whole and then 1 of node 0 (not the
    # lowest 5); under restricted, admitted across both (the narrowest hint there is);
    # under single-numa-node refused
    "wider than a node": (1, 5, 1),
    # the last 2 fit no node now, though a node has 4: refused unless best-effort or
    # none; under none, the 3 come across nodes, packed from the fuller one
    "no room left aligned": (2, 3, 2),
}


def simulated(policy: str, requests) -> list[str]:
    """What the simulated kubelet decides for each request, in order."""
    host = FakeHost(nodes=[FakeNumaNode("0-3", socket=0), FakeNumaNode("4-7", socket=1)], pods=[])
    host.kubelet_config = {"reservedSystemCPUs": format_id_list(RESERVED)}
    node = SimNode("sim", host, FakeNvml(), policy)
    out = []
    for i, need in enumerate(requests):
        given = admit(node, need, {})
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
async def node(tmp_path_factory):
    job = tmp_path_factory.mktemp("agreement")
    # the Memory Manager off: the simulated kubelet places CPUs and devices only
    policy = KubeletPolicy(memory="None")
    async with (
        ControlPlane() as cp,
        aiohttp.ClientSession() as session,
        KubeNode(cp, job, "vm-agreement", policy, shape=SHAPE) as node,
    ):
        namespace = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}}
        await cp.create(session, namespace)
        node.session = session
        yield node


async def checkpoint(node: KubeNode) -> dict:
    """The CPU manager's state: the shared pool, and each admitted pod's CPUs."""
    return json.loads(await node.sh("cat /var/lib/kubelet/cpu_manager_state"))


async def empty(node: KubeNode) -> None:
    """No pod left, and every exclusive CPU back with the CPU manager."""
    cp, session = node.cp, node.session
    for p in await cp.items(session, "Pod", NS):
        path = path_of("Pod", NS, p["metadata"]["name"]) + "?gracePeriodSeconds=0"
        await cp.request(session, "DELETE", path)

    async def gone():
        held = (await checkpoint(node)).get("entries")
        return not held and not await cp.items(session, "Pod", NS)

    await until(gone, "the node empty", timeout=300, every=1)


@pytest.mark.parametrize("scenario", SCENARIOS)
@pytest.mark.parametrize("policy", POLICIES)  # a kubelet restart each
async def test_the_simulated_kubelet_admits_as_the_real_one(policy, scenario, node):
    await empty(node)
    if node.policy.topology != policy:
        await node.restart_kubelet(KubeletPolicy(topology=policy, memory="None"))
    cp, session = node.cp, node.session
    real = []
    for i, need in enumerate(SCENARIOS[scenario]):
        made = await cp.create(session, guaranteed_pod(f"p{i}", NS, node.name, need, SLEEP, "64Mi"))
        uid = made["metadata"]["uid"]

        async def decided(i=i, uid=uid):
            """Refused, or given its CPUs: the CPU manager's checkpoint has them from
            admission on (its containers start later, slowly under emulation)."""
            p = await cp.get(session, "Pod", NS, f"p{i}")
            if p["status"].get("phase") == "Failed":
                return p["status"]
            given = (await checkpoint(node)).get("entries", {}).get(uid)
            return given and {"cpus": given["work"]}

        got = await until(decided, f"p{i} admitted or refused", timeout=300, every=1)
        if "cpus" not in got:
            real.append("refused")
            assert got["reason"] == "TopologyAffinityError", got
            continue
        cpus = cpu_nodes(got["cpus"])
        real.append(" ".join(f"node{n}={cpus.get(str(n), 0)}" for n in range(SHAPE.sockets)))
    assert simulated(policy, SCENARIOS[scenario]) == real, (
        f"simulated (left) and real (right) under {policy}"
    )
