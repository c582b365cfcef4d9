"""The kubelet's PodResources API over real gRPC (the simulator's kubelet on a unix
socket): device and CPU attribution for nvidia.com/gpu, nvidia.com/mig-* and DRA claims,
capacity per NUMA zone, and a kubelet that is missing, slow, failing or restarted."""

from __future__ import annotations

import asyncio
import shutil
import socket
import tempfile
from dataclasses import replace
from pathlib import Path

import grpc
import pynvml
import pytest

from numaguard.contract.reasons import STARVED_THRESHOLDS
from numaguard.exporter.collection import Collection
from numaguard.exporter.model.thresholds import Thresholds
from numaguard.exporter.readers.dra import Allocated
from numaguard.exporter.sources.cgroups import CgroupSource
from numaguard.exporter.sources.gpu import NvmlSource
from numaguard.exporter.sources.host import HostSource
from numaguard.exporter.sources.kubelet import PodResourcesSource
from numaguard.simulator.fakes import dra, presets
from numaguard.simulator.fakes.host import GIB, FakeClaim, FakeContainer, FakePod
from numaguard.simulator.fakes.podresources import FakeKubelet
from tests.conftest import NODE, metadata_of, samples, series


class Clock:
    now = 0.0

    def __call__(self) -> float:
        return self.now


class Node:
    def __init__(self, root, nvml, clock: Clock, socket: str, timeout: float) -> None:
        self.root, self.host, self.nvml, self.clock = root, root.host, nvml, clock
        self.gpus = NvmlSource(pynvml, str(root.root), clock=clock)
        self.gpus.start()
        self.kubelet_source = PodResourcesSource(socket, timeout)
        self.collection = Collection(
            NODE,
            {
                "host_numa": HostSource(str(root.root)),
                "pod_placement": CgroupSource(str(root.root)),
                "gpu": self.gpus,
                "pod_resources": self.kubelet_source,
            },
            metadata=lambda: metadata_of(self.host),
            # GPU 6 is the DRA driver's: its ResourceSlice names what gpu-6 is
            dra=lambda: dra.view("node-0", nvml, [6]),
            clock=clock,
            detail=True,
        )

    async def cycle(self) -> dict:
        self.clock.now += 15
        await self.collection.run_once()
        return samples(self.collection.exposition.text)

    def holders(self, got: dict) -> dict[tuple[str, str], tuple[str, str, str]]:
        """(pod, device uuid) -> (resource, numa_node, source)."""
        out = {}
        for name, labels in got:
            if name == "numaguard_gpu_holder_info":
                lb = dict(labels)
                device = lb["mig_uuid"] or lb["gpu_uuid"]
                out[lb["pod"], device] = (lb["resource"], lb["numa_node"], lb["source"])
        return out


@pytest.fixture
async def node(fake_root):
    short = tempfile.mkdtemp(prefix="kl", dir="/tmp")  # unix socket paths are short
    socket = f"{short}/kubelet.sock"
    clock = Clock()  # the GPUs' and the exporter's
    host, nvml = presets.gpu_node(clock)
    root = fake_root(host)
    kubelet = FakeKubelet(socket, host, nvml)
    with nvml.installed():
        await kubelet.start()
        n = Node(root, nvml, clock, socket, timeout=0.5)
        n.kubelet = kubelet
        try:
            yield n
        finally:
            n.kubelet_source.close()
            n.gpus.close()
            await kubelet.stop()
            shutil.rmtree(short, ignore_errors=True)


def verdicts(got: dict, reason: str) -> dict[str, float]:
    return {
        dict(k[1])["pod"]: v
        for k, v in got.items()
        if k[0] == "numaguard_pod_cross_numa" and dict(k[1])["reason"] == reason
    }


async def test_devices_attributed_by_the_kubelet(node):
    got = await node.cycle()
    got = await node.cycle()
    g = node.nvml.gpus
    assert node.holders(got) == {
        ("trainer", g[0].uuid): ("nvidia.com/gpu", "0", "kubelet"),
        ("trainer-remote", g[4].uuid): ("nvidia.com/gpu", "1", "kubelet"),
        ("infer-a", g[1].mig[0].uuid): ("nvidia.com/mig-3g.40gb", "0", "kubelet"),
        ("infer-b", g[1].mig[2].uuid): ("nvidia.com/mig-1g.10gb", "0", "kubelet"),
        ("notebook-0", g[2].mig[0].uuid): ("nvidia.com/mig-1g.10gb", "0", "kubelet"),
        ("notebook-1", g[2].mig[1].uuid): ("nvidia.com/mig-1g.10gb", "0", "kubelet"),
        ("notebook-2", g[2].mig[2].uuid): ("nvidia.com/mig-1g.10gb", "0", "kubelet"),
        ("infer-c", g[5].mig[0].uuid): ("nvidia.com/mig-4g.40gb", "1", "kubelet"),
        # allocated, nothing running on it yet: only the kubelet can tell
        ("infer-d", g[5].mig[1].uuid): ("nvidia.com/mig-3g.40gb", "1", "kubelet"),
        # a DRA claim: the resource is the claim's driver
        ("dra-job", g[6].uuid): ("gpu.nvidia.com", "1", "kubelet"),
    }
    trainer = node.host.pod("trainer")
    holder = series(
        "numaguard_gpu_holder_info",
        gpu="0",
        gpu_uuid=g[0].uuid,
        mig_uuid="",
        resource="nvidia.com/gpu",
        numa_node="0",
        namespace="ml",
        pod="trainer",
        container="main",
        pod_uid=trainer.uid,
        container_id=node.host.container_id(trainer, trainer.containers[0]),
        source="kubelet",
    )
    assert got[holder] == 1
    assert verdicts(got, "device_remote") == {
        "trainer": 0,
        "trainer-remote": 1,
        "infer-a": 0,
        "infer-b": 0,
        "notebook-0": 0,
        "notebook-1": 0,
        "notebook-2": 0,
        "infer-c": 0,
        "infer-d": 0,
        "dra-job": 0,
    }
    assert got[series("numaguard_collector_success", collector="pod_resources")] == 1


async def test_capacity_per_numa_zone(node):
    got = await node.cycle()

    def zone(name: str, **labels) -> float | None:
        return got.get(series(f"numaguard_zone_{name}", **labels))

    assert zone("cpus_allocatable", numa_node="0") == 32
    assert zone("cpus_allocatable", numa_node="1") == 32
    # trainer 8, infer-a 2, trainer-remote 6, infer-b 2 | infer-c 4, dra-job 4, infer-d 2
    assert zone("cpus_allocated", numa_node="0") == 18
    assert zone("cpus_allocated", numa_node="1") == 10
    devices = {
        (dict(k[1])["numa_node"], dict(k[1])["resource"]): (
            v,
            got[series("numaguard_zone_devices_free", **dict(k[1]))],
        )
        for k, v in got.items()
        if k[0] == "numaguard_zone_devices_allocatable"
    }
    assert devices == {
        ("0", "nvidia.com/gpu"): (2, 1),  # GPUs 0 and 3; 0 is the trainer's
        ("0", "nvidia.com/mig-3g.40gb"): (1, 0),
        ("0", "nvidia.com/mig-2g.20gb"): (1, 1),
        ("0", "nvidia.com/mig-1g.10gb"): (9, 5),  # infer-b and three notebooks
        ("1", "nvidia.com/gpu"): (2, 1),  # GPUs 4 and 7 (6 is DRA's)
        ("1", "gpu.nvidia.com"): (1, 0),  # GPU 6, by its ResourceSlice: dra-job's
        ("1", "nvidia.com/mig-4g.40gb"): (1, 0),
        ("1", "nvidia.com/mig-3g.40gb"): (1, 0),
    }
    assert zone("memory_allocatable_bytes", numa_node="0") == 512 * GIB
    assert zone("memory_free_bytes", numa_node="1") == 512 * GIB


async def test_exclusive_cpus_come_from_the_kubelet(node):
    # Guaranteed, CPUs on both nodes, disjoint from the shared pool
    split = FakePod(
        "split",
        "0f000000-0000-4000-8000-000000000001",
        "guaranteed",
        [FakeContainer("main", "30-33", {0: GIB}, exclusive_cpus=True)],
        "ml",
    )
    node.host.pods.append(split)
    node.root.write()
    got = await node.cycle()
    assert verdicts(got, "cpu_span")["split"] == 1
    # the kubelet says it holds no exclusive CPUs: measured, no cpu_span verdict at all
    split.containers[0].exclusive_cpus = False
    got = await node.cycle()
    assert "split" not in verdicts(got, "cpu_span")
    assert verdicts(got, "memory_remote")["split"] == 0


async def test_missing_kubelet_falls_back_to_processes(node):
    await node.kubelet.stop()
    got = await node.cycle()
    got = await node.cycle()
    holders = node.holders(got)
    assert {source for _, _, source in holders.values()} == {"process"}
    # a device that runs nothing cannot be seen by its processes
    assert ("infer-d", node.nvml.gpus[5].mig[1].uuid) not in holders
    assert verdicts(got, "device_remote")["trainer-remote"] == 1
    assert not [k for k in got if k[0].startswith("numaguard_zone_")]
    assert (
        got[series("numaguard_collector_errors_total", collector="pod_resources", reason="missing")]
        == 2
    )
    assert got[series("numaguard_collector_success", collector="pod_resources")] == 0


async def test_slow_kubelet_times_out_then_recovers(node):
    node.kubelet.delay = 1.0  # past the 0.5 s deadline
    got = await node.cycle()
    assert (
        got[series("numaguard_collector_errors_total", collector="pod_resources", reason="timeout")]
        == 1
    )
    assert {s for _, _, s in node.holders(got).values()} == {"process"}
    node.kubelet.delay = 0
    got = await node.cycle()
    assert got[series("numaguard_collector_success", collector="pod_resources")] == 1
    assert {s for _, _, s in node.holders(got).values()} == {"kubelet"}


async def test_restarted_kubelet_is_found_again(node):
    got = await node.cycle()
    assert got[series("numaguard_collector_success", collector="pod_resources")] == 1
    await node.kubelet.stop()
    got = await node.cycle()
    assert got[series("numaguard_collector_success", collector="pod_resources")] == 0
    await node.kubelet.start()  # a new socket file at the same path
    got = await node.cycle()
    assert got[series("numaguard_collector_success", collector="pod_resources")] == 1
    assert ("infer-d", node.nvml.gpus[5].mig[1].uuid) in node.holders(got)


async def test_kubelet_errors_and_old_kubelets(node):
    node.kubelet.fail = grpc.StatusCode.UNAVAILABLE
    got = await node.cycle()
    assert (
        got[series("numaguard_collector_errors_total", collector="pod_resources", reason="kubelet")]
        == 1
    )
    node.kubelet.fail = None
    node.kubelet.allocatable_implemented = False  # before 1.23: List only
    got = await node.cycle()
    assert got[series("numaguard_collector_success", collector="pod_resources")] == 1
    assert {s for _, _, s in node.holders(got).values()} == {"kubelet"}
    assert not [k for k in got if k[0].startswith("numaguard_zone_")]


async def test_something_else_on_the_kubelet_socket(node):
    """A socket left by a dead kubelet, a peer that speaks something other than HTTP/2
    and one that never answers: each is a failed read with its reason, the collector
    carries on, and the kubelet is found again once it is back."""
    await node.kubelet.stop()

    def errors(got: dict, reason: str) -> float:
        errors = series(
            "numaguard_collector_errors_total", collector="pod_resources", reason=reason
        )
        return got[errors]

    async def peer(answer: bytes | None) -> asyncio.Server:
        async def talk(reader, writer):
            if answer is None:
                await reader.read()  # never answers, until the client goes
            else:
                writer.write(answer)
                await writer.drain()
            writer.close()

        return await asyncio.start_unix_server(talk, node.kubelet.socket_path)

    stale = socket.socket(socket.AF_UNIX)
    stale.bind(node.kubelet.socket_path)  # bound, never listening: connection refused
    stale.close()
    got = await node.cycle()
    assert errors(got, "kubelet") == 1
    Path(node.kubelet.socket_path).unlink()
    http1 = b"HTTP/1.1 400 Bad Request\r\n\r\n"
    for answer, reason, count in ((http1, "kubelet", 2), (None, "timeout", 1)):
        server = await peer(answer)
        try:
            got = await node.cycle()
        finally:
            server.close()
            await server.wait_closed()
        assert errors(got, reason) == count
        assert got[series("numaguard_collector_success", collector="pod_resources")] == 0
        # the devices are still attributed, by their processes
        assert {s for _, _, s in node.holders(got).values()} == {"process"}
        Path(node.kubelet.socket_path).unlink()
    await node.kubelet.start()
    got = await node.cycle()
    assert got[series("numaguard_collector_success", collector="pod_resources")] == 1
    assert {s for _, _, s in node.holders(got).values()} == {"kubelet"}


async def test_answers_are_read_again_only_when_they_change(node):
    source = node.kubelet_source
    first = await source.read()
    again = await source.read()
    # the same bytes: last cycle's reading, not parsed again
    assert again.pods is first.pods and again.allocatable is first.allocatable
    gone = first.pods[0].name
    node.host.pods = [p for p in node.host.pods if p.name != gone]
    changed = await source.read()
    assert {p.name for p in changed.pods} == {p.name for p in first.pods} - {gone}


@pytest.mark.parametrize(
    "folder",
    ["numaguard/exporter/sources/podresources", "numaguard/simulator/fakes/deviceplugin"],
)
def test_generated_grpc_modules_are_current(tmp_path, folder):
    """The committed api_pb2*.py are what protoc makes of api.proto (run: make proto)."""
    from numaguard.exporter.sources.podresources.__main__ import (
        MODULES,
        ROOT,
        generate,
    )

    generate(str(tmp_path), ROOT / folder)
    for name in MODULES:
        fresh = (tmp_path / folder / name).read_text()
        committed = (ROOT / folder / name).read_text()
        assert fresh == committed, f"{folder}/{name} is stale: run make proto"


def starved(got: dict) -> dict[tuple[str, str], float]:
    return {
        (dict(k[1])["pod"], dict(k[1])["reason"]): v
        for k, v in got.items()
        if k[0] == "numaguard_gpu_starved"
    }


async def test_a_gpu_starved_by_a_remote_and_pressured_host(node):
    feeder = node.host.pod("trainer-remote").containers[0]
    feeder.throttling = (1000, 10, 0.1)
    feeder.pressure = {"cpu": (5.0, 1.0), "memory": (1.0, 0.5)}
    node.root.write()
    first = await node.cycle()
    # no interval yet, so no utilization: nothing decided
    assert not starved(first)
    # over the next 15 s: 6 s stalled on CPU (0.4), 5% of periods throttled, no memory stall
    feeder.throttling = (2000, 60, 0.6)
    feeder.pressure = {"cpu": (11.0, 2.0), "memory": (1.0, 0.5)}
    node.root.write()
    got = await node.cycle()
    verdicts = starved(got)
    assert {r: v for (p, r), v in verdicts.items() if p == "trainer-remote"} == {
        "device_remote": 1,  # its GPU (sm 0.1) hangs off node 1, its CPUs are on node 0
        "memory_remote": 0,
        "cpu_throttled": 0,
        "cpu_pressure": 1,
        "memory_pressure": 0,
    }
    # busy GPUs are never starved, whatever their host does
    assert {v for (p, _), v in verdicts.items() if p in ("trainer", "infer-c", "dra-job")} == {0}
    # nothing runs on infer-d's slice: no verdict
    assert not [p for p, _ in verdicts if p == "infer-d"]
    series_ = series(
        "numaguard_gpu_starved",
        gpu="4",
        gpu_uuid=node.nvml.gpus[4].uuid,
        mig_uuid="",
        namespace="ml",
        pod="trainer-remote",
        pod_uid=node.host.pod("trainer-remote").uid,
        reason="device_remote",
    )
    assert got[series_] == 1
    # the GPU gets busy: no longer starved, though the host is as bad as before
    node.nvml.gpus[4].activity.set(sm=0.9)
    feeder.pressure = {"cpu": (17.0, 3.0), "memory": (1.0, 0.5)}
    node.root.write()
    await node.cycle()
    got = await node.cycle()
    assert {v for (p, _), v in starved(got).items() if p == "trainer-remote"} == {0}


async def test_gke_and_time_sliced_device_ids_are_their_devices(node):
    """GKE's device plugin names GPUs nvidia<index> and MIG slices nvidia<index>/gi<id>;
    time-slicing (as on EKS) hands out replicas <uuid>::<n> of one device."""
    g = node.nvml.gpus
    trainer, infer_a = node.host.pod("trainer"), node.host.pod("infer-a")
    remote = node.host.pod("trainer-remote")
    trainer.containers[0].devices = {"nvidia.com/gpu": ["nvidia0"]}
    infer_a.containers[0].devices = {"nvidia.com/mig-3g.40gb": [f"nvidia1/gi{g[1].mig[0].gi_id}"]}
    remote.containers[0].devices = {"nvidia.com/gpu": [f"{g[4].uuid}::2"]}
    await node.cycle()
    holders = node.holders(await node.cycle())
    assert holders[("trainer", g[0].uuid)] == ("nvidia.com/gpu", "0", "kubelet")
    assert holders[("infer-a", g[1].mig[0].uuid)] == ("nvidia.com/mig-3g.40gb", "0", "kubelet")
    assert holders[("trainer-remote", g[4].uuid)] == ("nvidia.com/gpu", "1", "kubelet")


async def test_a_dra_device_is_what_its_resource_slice_says_never_a_guess(node):
    g = node.nvml.gpus
    view = dra.view("node-0", node.nvml, [2, 6])
    node.collection.dra = lambda: view
    job = node.host.pod("dra-job").containers[0]
    # a MIG device the driver made on demand: no UUID in its slice, its placement in
    # its name; the slice's parent is GPU 2 and it sits where notebook-1's slice does
    made = dra.device_name(2, g[2].mig[1])
    key = next(k for k in view.devices if k[2] == made)
    device = view.devices.pop(key)
    view.devices[(*key[:2], "gpu-2-mig-made")] = replace(device, name="gpu-2-mig-made", uuid="")
    job.claims = [FakeClaim("gpu-claim", "gpu-2-mig-made", pool="node-0")]
    await node.cycle()
    holders = node.holders(await node.cycle())
    assert holders[("dra-job", g[2].mig[1].uuid)] == ("gpu.nvidia.com", "0", "kubelet")
    # a device no slice names: not the kubelet's to attribute (its process still is)
    job.claims = [FakeClaim("gpu-claim", "gpu-6-unknown", pool="node-0")]
    holders = node.holders(await node.cycle())
    assert holders[("dra-job", g[6].uuid)] == ("nvidia.com/gpu", "1", "process")
    # without the node's slices at all: the same, never the old gpu-<index> guess
    node.collection.dra = lambda: None
    job.claims = [FakeClaim("gpu-claim", "gpu-6", pool="node-0")]
    holders = node.holders(await node.cycle())
    assert holders[("dra-job", g[6].uuid)] == ("nvidia.com/gpu", "1", "process")


async def test_claims_the_kubelet_does_not_report_come_from_the_api_server(node):
    """A kubelet without PodResources' DRA support says nothing of claims: the pod's
    claim, as the API server allocated it, names the device, for the containers that
    use the claim."""
    g = node.nvml.gpus
    job = node.host.pod("dra-job")
    job.containers[0].claims = []  # the kubelet does not report it
    g[6].processes = []  # and nothing runs yet
    allocated = (Allocated("gpu", "gpu.nvidia.com", "node-0", "gpu-6"),)
    view = dra.view("node-0", node.nvml, [6], {(job.namespace, "gpu-claim"): allocated})
    node.collection.dra = lambda: view
    metadata = metadata_of(node.host)
    metadata[job.uid] = replace(metadata[job.uid], claims={"gpu-claim": ("main",)})
    node.collection.metadata = lambda: metadata
    await node.cycle()
    got = await node.cycle()
    assert node.holders(got)[("dra-job", g[6].uuid)] == ("gpu.nvidia.com", "1", "claim")
    assert verdicts(got, "device_remote")["dra-job"] == 0  # GPU 6 and its CPUs: node 1
    # its CPUs moved to node 0: the claimed GPU is remote
    job.containers[0].cpus = "24-27"
    node.root.write()
    got = await node.cycle()
    assert verdicts(got, "device_remote")["dra-job"] == 1


def test_a_starved_threshold_not_given_keeps_its_default_and_an_unknown_one_is_refused():
    given = Thresholds(starved={"cpu_throttled": 0.25})
    assert dict(given.starved) == {**STARVED_THRESHOLDS, "cpu_throttled": 0.25}
    with pytest.raises(ValueError, match="device_remote"):  # a verdict decides it, no threshold
        Thresholds(starved={"device_remote": 0.5})
