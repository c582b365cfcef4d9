"""The real node's kubelet and exporter as the tests reach them: its PodResources socket
and a scrape of the exporter in the guest."""

from __future__ import annotations

import aiohttp
import pytest_asyncio

from numaguard.contract.names import mig_resource
from numaguard.simulator.demos.node_stories import (
    SHAPE,
)
from numaguard.simulator.fakes.nvml import FakeNvml
from numaguard.simulator.parts.controlplane import ControlPlane
from numaguard.simulator.parts.processes import get, until
from numaguard.simulator.parts.vm_kubelet import (
    FAR,
    HOLD,
    SLEEP,
    KubeletPolicy,
    KubeNode,
    exporter_kubeconfig,
    guaranteed_pod,
)
from tests.conftest import samples

NS = "vm-test"


SLICE = "1g.10gb"


# the guest's own view of its NUMA pages, read together
NUMASTAT = (
    "for n in /sys/devices/system/node/node[0-9]*; do echo ${n##*node} $(cat $n/numastat); done"
)


PODRESOURCES = """
import grpc
from google.protobuf.json_format import MessageToDict
from numaguard.exporter.sources.podresources import api_pb2 as api, api_pb2_grpc as rpc
stub = rpc.PodResourcesListerStub(
    grpc.insecure_channel("unix:///var/lib/kubelet/pod-resources/kubelet.sock"))
print(__import__("json").dumps(MessageToDict(
    stub.GetAllocatableResources(api.AllocatableResourcesRequest()))))
print(__import__("json").dumps(MessageToDict(stub.List(api.ListPodResourcesRequest()))))
"""


def numastat(text: str) -> dict[str, dict[str, int]]:
    out = {}
    for line in text.splitlines():
        node, *fields = line.split()
        out[node] = {k: int(v) for k, v in zip(fields[::2], fields[1::2], strict=True)}
    return out


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def node(tmp_path_factory):
    """The node (topology policy none, no Memory Manager: a container's own memory
    binding is the kernel's to honour), its exporter, three GPUs offered by the device
    plugin (whole ones on NUMA nodes 0 and 1, and one on node 1 in two MIG slices), and
    pods: ``span`` (5 exclusive CPUs: more than one node has), ``far`` (1 CPU, its
    memory bound to the other node), ``holder`` (shared CPUs and the first GPU),
    ``gpu-far`` (the last CPU, on node 0, and the whole GPU left, on node 1) and
    ``sliced`` (shared CPUs and a MIG slice), with the node's numastat read before they
    started."""
    job = tmp_path_factory.mktemp("kubenode")
    async with ControlPlane() as cp, aiohttp.ClientSession() as session:
        await cp.install_numaguard(session)
        exporter = ("--kubeconfig", exporter_kubeconfig(cp, job), "--interval", "2")
        exporter += ("--no-collector.resctrl",)
        policy = KubeletPolicy(topology="none", memory="None")
        gpus = FakeNvml()
        for numa_node in (0, 1):
            gpus.add_gpu("H100-80GB", numa_node)
        gpus.add_gpu("H100-80GB", 1, mig=[SLICE, SLICE])
        async with KubeNode(cp, job, policy=policy, exporter=exporter, shape=SHAPE, gpus=gpus) as n:
            await cp.create(
                session, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}}
            )
            n.before = numastat(await n.sh(NUMASTAT))
            n.pods = {}
            for name, cpus, command in (("span", 5, HOLD), ("far", 1, FAR + HOLD)):
                await cp.create(session, guaranteed_pod(name, NS, n.name, cpus, command))
                n.pods[name] = await running(cp, session, name)
            # the first GPU (the plugin prefers them in order), on shared CPUs: no CPU
            # asked for, all 7 given out
            holder = guaranteed_pod("holder", NS, n.name, 1, SLEEP, gpus=1)
            gpu_only = {"nvidia.com/gpu": "1"}
            holder["spec"]["containers"][0]["resources"] = {
                "limits": gpu_only,
                "requests": gpu_only,
            }
            await cp.create(session, holder)
            n.pods["holder"] = await running(cp, session, "holder")
            await cp.create(session, guaranteed_pod("gpu-far", NS, n.name, 1, SLEEP, gpus=1))
            n.pods["gpu-far"] = await running(cp, session, "gpu-far")
            # a MIG slice of the third GPU, on shared CPUs
            sliced = guaranteed_pod("sliced", NS, n.name, 1, SLEEP)
            a_slice = {mig_resource(SLICE): "1"}
            sliced["spec"]["containers"][0]["resources"] = {
                "limits": a_slice,
                "requests": a_slice,
            }
            await cp.create(session, sliced)
            n.pods["sliced"] = await running(cp, session, "sliced")
            n.gpus = gpus
            n.session = session
            yield n


async def running(cp: ControlPlane, session, name: str) -> dict:
    async def started():
        p = await cp.get(session, "Pod", NS, name)
        assert p["status"].get("phase") != "Failed", f"{name}: {p['status']}"
        return p if p["status"].get("phase") == "Running" else None

    return await until(started, f"{name} Running", timeout=300, every=1)


async def scrape(node: KubeNode, ready) -> dict:
    """The exporter's samples once ``ready(samples)`` holds (it collects every 2 s; the
    guest is emulated, so the wait only ends a hang)."""

    last = []

    async def judged():
        last[:] = [await get(f"{node.exporter_url}/metrics")]
        got = samples(last[0])
        return got if ready(got) else None

    try:
        return await until(judged, "the exporter judged the pods", timeout=300, every=1)
    except AssertionError as e:
        pods = [ln for ln in last[0].decode().splitlines() if ln.startswith("numaguard_pod_")]
        raise AssertionError(f"{e}: {pods}") from None
