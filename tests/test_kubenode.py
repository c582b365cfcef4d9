"""The exporter on a real node: a real kubelet (static CPU manager) on a real two-socket
kernel runs real containers through containerd and runc (simulator/parts/vm_kubelet.py), and
the exporter, in the node as its DaemonSet runs, is judged against what the kernel and
the kubelet say: cpuset, memory.numa_stat, numa_maps, numastat, and the kubelet's own
PodResources answers."""

from __future__ import annotations

import aiohttp
import pytest
import pytest_asyncio

from numaguard.contract.names import mig_resource
from numaguard.simulator.demos.node_stories import (
    SHAPE,
    container_cgroup,
    cpu_nodes,
    exclusive_cpus,
)
from numaguard.simulator.fakes.nvml import FakeNvml
from numaguard.simulator.parts import vm
from numaguard.simulator.parts.controlplane import ControlPlane
from numaguard.simulator.parts.processes import until
from numaguard.simulator.parts.vm_kubelet import (
    FAR,
    HELD_MIB,
    HOLD,
    SLEEP,
    KubeletPolicy,
    KubeNode,
    exporter_kubeconfig,
    guaranteed_pod,
)
from tests.helpers.kubenode import (
    NS,
    NUMASTAT,
    SLICE,
    numastat,
    scrape,
)
from tests.helpers.numa_files import numa_maps_bytes, numa_stat_bytes

# an emulated node: booting it and its kubelet takes minutes on a loaded machine
pytestmark = [
    pytest.mark.vm,
    pytest.mark.asyncio(loop_scope="module"),
    pytest.mark.timeout(1200),
]

MIB = 1 << 20


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


async def container_facts(node: KubeNode, p: dict) -> dict:
    """What the kernel says about a pod's one container: its cgroup's cpuset and
    memory.numa_stat (cgroupfs driver: kubepods/pod<uid>/<id> for Guaranteed pods), and
    numa_maps and `numastat -p` of its process holding the memory (dd)."""
    cg = container_cgroup(p)
    numastat_bin = vm.parts_dir() / "root/usr/bin/numastat"
    out = await node.sh(
        f"cat {cg}/cpuset.cpus.effective; echo ==; cat {cg}/memory.numa_stat; echo ==\n"
        f"for pid in $(cat {cg}/cgroup.procs); do\n"
        f'  if [ "$(cat /proc/$pid/comm)" = dd ]; then cat /proc/$pid/numa_maps; echo ==;'
        f" {numastat_bin} -p $pid; fi\n"
        "done"
    )
    cpus, numa_stat, numa_maps, numastat_p = out.split("==\n")
    return {
        "cpus": cpus.strip(),
        "numa_stat": numa_stat_bytes(numa_stat),
        "numa_maps": numa_maps_bytes(numa_maps),
        "numastat_p": numastat_p,
    }


def verdict_labels(name: str, uid: str, reason: str) -> dict[str, str]:
    return {"node": "vm-node", "namespace": NS, "pod": name, "pod_uid": uid, "reason": reason}


def by(got: dict, name: str, uid: str, label: str) -> dict[str, float]:
    return {
        dict(labels)[label]: v
        for (n, labels), v in got.items()
        if n == name and ("pod_uid", uid) in labels
    }


async def test_verdicts_and_memory_match_the_real_kernel(node):
    uids = {name: node.pods[name]["metadata"]["uid"] for name in ("span", "far")}
    # named (the exporter has the API server's names), judged, and holding what they
    # hold: a cycle after both dd processes filled their buffers
    got = await scrape(
        node,
        lambda got: all(
            ("numaguard_pod_cross_numa", labels) in got
            and sum(by(got, "numaguard_pod_memory_bytes", uid, "numa_node").values())
            >= HELD_MIB * MIB
            for name, uid in uids.items()
            for labels in [frozenset(verdict_labels(name, uid, "cpu_span").items())]
        ),
    )
    after = numastat(await node.sh(NUMASTAT))
    span = await container_facts(node, node.pods["span"])
    far = await container_facts(node, node.pods["far"])

    # span: the real kubelet gave it CPUs of both nodes, and the exporter says so
    assert set(cpu_nodes(span["cpus"])) == {"0", "1"}
    assert by(got, "numaguard_pod_exclusive_cpus", uids["span"], "numa_node") == {
        k: float(v) for k, v in cpu_nodes(span["cpus"]).items()
    }
    assert by(got, "numaguard_pod_cross_numa", uids["span"], "reason")["cpu_span"] == 1

    # far: its CPU on one node, its memory where numactl bound it, on the other
    (cpu_node,) = cpu_nodes(far["cpus"])
    far_node = "1" if cpu_node == "0" else "0"
    assert by(got, "numaguard_pod_exclusive_cpus", uids["far"], "numa_node") == {cpu_node: 1.0}
    verdicts = by(got, "numaguard_pod_cross_numa", uids["far"], "reason")
    assert verdicts["cpu_span"] == 0 and verdicts["memory_remote"] == 1
    assert far["numa_maps"][far_node] >= HELD_MIB * MIB
    # numastat -p, the kernel's tool, puts the held MiB on the far node too
    total = next(r for r in far["numastat_p"].splitlines() if r.startswith("Total")).split()
    assert float(total[1 + int(far_node)]) >= HELD_MIB, far["numastat_p"]

    # the exporter's memory per NUMA node is the cgroup's (the processes hold still)
    for name, facts in (("span", span), ("far", far)):
        memory = by(got, "numaguard_pod_memory_bytes", uids[name], "numa_node")
        kernel = facts["numa_stat"]
        for n in ("0", "1"):
            assert abs(memory.get(n, 0) - kernel.get(n, 0)) <= 0.02 * HELD_MIB * MIB, (name, n)

    # the node's numastat: the far pod's memory was allocated on the far node for a
    # process on the other one (the kernel counts allocations: a transparent huge page,
    # 2 MiB, once); the exporter's counters are the kernel's, read between the two reads
    # here
    assert after[far_node]["other_node"] - node.before[far_node]["other_node"] >= (HELD_MIB // 2)
    for n in ("0", "1"):
        exported = got[
            "numaguard_numa_node_other_pages_total",
            frozenset({("node", "vm-node"), ("numa_node", n)}),
        ]
        assert node.before[n]["other_node"] <= exported <= after[n]["other_node"]


async def test_zones_agree_with_the_kubelet_s_podresources(node):
    """numaguard_zone_* against the real kubelet's GetAllocatableResources and List,
    asked here with grpc's generated stubs, not the exporter's client."""
    allocatable, listed = await node.pod_resources()
    cpus = ",".join(map(str, allocatable["cpuIds"]))
    held = ",".join(
        str(cpu)
        for p in listed["podResources"]
        for c in p["containers"]
        for cpu in c.get("cpuIds", [])
    )
    # the static CPU manager may give all but the reserved CPU 0; the pods hold 7
    assert cpu_nodes(cpus) == {"0": 3, "1": 4} and sum(cpu_nodes(held).values()) == 7

    def zone(got, name):
        return {dict(k)["numa_node"]: v for (n, k), v in got.items() if n == name}

    got = await scrape(node, lambda got: zone(got, "numaguard_zone_cpus_allocated"))
    assert zone(got, "numaguard_zone_cpus_allocatable") == {
        k: float(v) for k, v in cpu_nodes(cpus).items()
    }
    assert zone(got, "numaguard_zone_cpus_allocated") == {
        k: float(v) for k, v in cpu_nodes(held).items()
    }

    # the device plugin's devices per resource and NUMA node: the whole GPUs, one a
    # node, both given out; the MIG slices, both on node 1, one given out
    def devices(resource):
        out: dict[str, float] = {}
        for d in allocatable["devices"]:
            if d["resourceName"] == resource:
                numa_node = str(d["topology"]["nodes"][0].get("ID", 0))
                out[numa_node] = out.get(numa_node, 0.0) + len(d["deviceIds"])
        return out

    def zone_of(name, resource):
        return {
            dict(k)["numa_node"]: v
            for (n, k), v in got.items()
            if n == name and dict(k)["resource"] == resource
        }

    assert devices("nvidia.com/gpu") == {"0": 1.0, "1": 1.0}
    assert devices(mig_resource(SLICE)) == {"1": 2.0}
    given_out = {"nvidia.com/gpu": {"0": 0.0, "1": 0.0}, mig_resource(SLICE): {"1": 1.0}}
    for resource, free in given_out.items():
        assert zone_of("numaguard_zone_devices_allocatable", resource) == devices(resource)
        assert zone_of("numaguard_zone_devices_free", resource) == free
    # without the Memory Manager the kubelet gives no memory per NUMA node: none is
    # made up
    assert "memory" not in allocatable
    assert not zone(got, "numaguard_zone_memory_allocatable_bytes")
    assert not zone(got, "numaguard_zone_memory_free_bytes")


async def test_a_gpu_the_kubelet_gave_on_the_far_node_is_device_remote(node):
    """The real device manager's allocation (PodResources) puts gpu-far's GPU on node 1
    and its CPU on node 0; the exporter's fake NVML shows the same GPUs, and judges it."""
    _, listed = await node.pod_resources()
    given = {
        p["name"]: (d["deviceIds"], d["topology"]["nodes"])
        for p in listed["podResources"]
        for c in p["containers"]
        for d in c.get("devices", [])
    }
    (gpu,), topology = given["gpu-far"]
    assert [int(n.get("ID", 0)) for n in topology] == [1]
    assert given["holder"][1] == [{}]  # NUMA node 0: protobuf's JSON leaves 0 out
    uid = node.pods["gpu-far"]["metadata"]["uid"]
    assert await exclusive_cpus(node, node.pods["gpu-far"]) == {"0": 1}

    def held(got):
        return [
            dict(labels)
            for (name, labels), v in got.items()
            if name == "numaguard_gpu_holder_info" and ("pod_uid", uid) in labels
        ]

    got = await scrape(node, held)
    (holder,) = held(got)
    assert (holder["gpu_uuid"], holder["numa_node"], holder["source"]) == (gpu, "1", "kubelet")
    verdicts = by(got, "numaguard_pod_cross_numa", uid, "reason")
    assert verdicts == {"cpu_span": 0, "memory_remote": 0, "device_remote": 1}
    # span holds no GPU: no device verdict is made up for it
    assert "device_remote" not in by(
        got, "numaguard_pod_cross_numa", node.pods["span"]["metadata"]["uid"], "reason"
    )


async def test_a_mig_slice_the_kubelet_gave_is_the_one_the_exporter_names(node):
    """The real device manager gives sliced a MIG slice by its MIG UUID (the plugin's
    first, on NUMA node 1); the exporter, its NVML showing the same slices, names it."""
    _, listed = await node.pod_resources()
    ((resource, ids, topology),) = [
        (d["resourceName"], d["deviceIds"], d["topology"]["nodes"])
        for p in listed["podResources"]
        if p["name"] == "sliced"
        for c in p["containers"]
        for d in c.get("devices", [])
    ]
    gpu = node.gpus.gpus[2]
    assert (resource, ids, topology) == (mig_resource(SLICE), [gpu.mig[0].uuid], [{"ID": "1"}])
    uid = node.pods["sliced"]["metadata"]["uid"]

    def held(got):
        return [
            dict(labels)
            for (name, labels), v in got.items()
            if name == "numaguard_gpu_holder_info" and ("pod_uid", uid) in labels
        ]

    (holder,) = held(await scrape(node, held))
    assert {k: holder[k] for k in ("gpu_uuid", "mig_uuid", "resource", "numa_node", "source")} == {
        "gpu_uuid": gpu.uuid,
        "mig_uuid": gpu.mig[0].uuid,
        "resource": mig_resource(SLICE),
        "numa_node": "1",
        "source": "kubelet",
    }
