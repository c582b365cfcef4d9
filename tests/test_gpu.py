"""GPUs and MIG slices through the real pynvml, whose C library is the simulator's fake:
exact values per GPU and per slice, GPM utilization between cycles, slices coming and
going, GPUs without GPM, lost and hung GPUs, NVML errors on any call, and which pod uses
which device with the device_remote verdict."""

from __future__ import annotations

import asyncio
import sys
import threading
import time
from dataclasses import replace

import pynvml
import pytest
from aiohttp.test_utils import TestClient, TestServer

from numaguard.exporter.collection import Collection
from numaguard.exporter.server import Exporter
from numaguard.exporter.settings import Settings
from numaguard.exporter.sources.cgroups import CgroupSource
from numaguard.exporter.sources.gpu import NvmlSource
from numaguard.exporter.sources.host import HostSource
from numaguard.simulator.fakes import presets
from numaguard.simulator.fakes.gpu_models import BRANCHES, DriverBranch
from numaguard.simulator.fakes.host import GIB, MIB
from numaguard.simulator.fakes.nvml import FakeNvml
from numaguard.simulator.parts.processes import exporter_process, get, log_of, until
from tests.conftest import NODE, metadata_of, samples, series

INTERVAL = 15.0
KINDS = ("sm", "graphics", "sm_occupancy", "tensor", "dram_bandwidth")


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class GpuNode:
    """The preset GPU node, its fake NVML installed, and a collection over both."""

    def __init__(self, root, nvml: FakeNvml, clock: Clock, device_timeout: float) -> None:
        self.root, self.host, self.nvml, self.clock = root, root.host, nvml, clock
        self.source = NvmlSource(pynvml, str(root.root), device_timeout, clock)
        self.source.start()
        self.collection = Collection(
            NODE,
            {
                "host_numa": HostSource(str(root.root)),
                "pod_placement": CgroupSource(str(root.root)),
                "gpu": self.source,
            },
            metadata=lambda: metadata_of(self.host),
            clock=clock,
            detail=True,
        )

    async def cycle(self, advance: float = INTERVAL) -> dict:
        self.clock.now += advance
        await self.collection.run_once()
        return samples(self.collection.exposition.text)

    def uuid(self, gpu: int, mig: int | None = None) -> str:
        g = self.nvml.gpus[gpu]
        return g.uuid if mig is None else g.mig[mig].uuid


@pytest.fixture(params=sorted(BRANCHES))
def branch(request) -> DriverBranch:
    """Every GPU test runs on each driver branch the fake emulates."""
    return BRANCHES[request.param]


@pytest.fixture
def gpu_node(fake_root, branch):
    nodes = []

    def build(nvml_and_host=None, device_timeout: float = 5.0, clock=None) -> GpuNode:
        clock = clock or Clock()
        host, nvml = nvml_and_host(clock) if nvml_and_host else presets.gpu_node(clock)
        nvml.branch = branch
        root = fake_root(host)
        installed = nvml.installed()
        installed.__enter__()
        node = GpuNode(root, nvml, clock, device_timeout)
        nodes.append((node, installed))
        return node

    yield build
    for node, installed in nodes:
        node.nvml.release.set()
        node.source.close()
        installed.__exit__(None, None, None)


def versions(node: GpuNode) -> dict:
    b = node.nvml.branch
    return {"driver_version": b.driver_version, "nvml_version": b.nvml_version}


def gpu_labels(node: GpuNode, gpu: int) -> dict:
    return {"gpu": str(gpu), "gpu_uuid": node.uuid(gpu)}


def slice_labels(node: GpuNode, gpu: int, mig: int) -> dict:
    s = node.nvml.gpus[gpu].mig[mig]
    return {**gpu_labels(node, gpu), "mig_uuid": s.uuid, "mig_profile": s.profile.name}


async def test_gpus_and_slices_exactly(gpu_node):
    node = gpu_node()
    first = await node.cycle()
    # the first cycle has no interval yet: supported, but no utilization
    assert (
        first[series("numaguard_gpu_utilization_supported", **gpu_labels(node, 0), kind="sm")] == 1
    )
    assert not [k for k in first if k[0] == "numaguard_gpu_utilization_ratio"]
    got = await node.cycle()

    assert (
        got[
            series(
                "numaguard_gpu_info",
                **gpu_labels(node, 0),
                model="NVIDIA H100 80GB HBM3",
                pci_bus_id="0000:18:00.0",
                numa_node="0",
                mig_mode="disabled",
                **versions(node),
            )
        ]
        == 1
    )
    assert (
        got[
            series(
                "numaguard_gpu_info",
                **gpu_labels(node, 4),
                model="NVIDIA H100 80GB HBM3",
                pci_bus_id="0000:58:00.0",
                numa_node="1",
                mig_mode="disabled",
                **versions(node),
            )
        ]
        == 1
    )
    assert got[series("numaguard_gpu_up", **gpu_labels(node, 1))] == 1
    assert got[series("numaguard_gpu_power_watts", **gpu_labels(node, 0))] == 300.0
    assert got[series("numaguard_gpu_temperature_celsius", **gpu_labels(node, 0))] == 40.0
    assert got[series("numaguard_gpu_memory_total_bytes", **gpu_labels(node, 0))] == 81559 * MIB
    assert got[series("numaguard_gpu_memory_used_bytes", **gpu_labels(node, 0))] == 60 * GIB
    assert got[series("numaguard_gpu_processes", **gpu_labels(node, 0))] == 1
    assert got[series("numaguard_gpu_processes", **gpu_labels(node, 3))] == 0
    # with MIG on, processes are counted per slice, and there is one power series per GPU
    assert series("numaguard_gpu_processes", **gpu_labels(node, 1)) not in got
    assert len([k for k in got if k[0] == "numaguard_gpu_power_watts"]) == 8

    # GPU 1: 3g.40gb + 2g.20gb + 1g.10gb + 1g.10gb, where MIG lets them start: a 3g on
    # memory slice 0 or 4, a 1g never on the last (the MIG user guide's placements)
    expected = [
        ("3g.40gb", "1", "4", "4", 60, 40192),
        ("2g.20gb", "2", "0", "2", 32, 19968),
        ("1g.10gb", "3", "2", "1", 16, 9856),
        ("1g.10gb", "4", "3", "1", 16, 9856),
    ]
    for i, (profile, gi, start, size, sms, mib) in enumerate(expected):
        labels = slice_labels(node, 1, i)
        assert labels["mig_profile"] == profile
        info = series(
            "numaguard_mig_info",
            **labels,
            gi_id=gi,
            ci_id="0",
            placement_start=start,
            placement_size=size,
        )
        assert got[info] == 1
        assert got[series("numaguard_mig_multiprocessors", **labels)] == sms
        assert got[series("numaguard_mig_memory_total_bytes", **labels)] == mib * MIB
    infer_a = slice_labels(node, 1, 0)
    assert got[series("numaguard_mig_memory_used_bytes", **infer_a)] == 30 * GIB
    assert got[series("numaguard_mig_processes", **infer_a)] == 1
    assert got[series("numaguard_mig_processes", **slice_labels(node, 1, 1))] == 0
    util = {k: got[series("numaguard_mig_utilization_ratio", **infer_a, kind=k)] for k in KINDS}
    assert util == pytest.approx(
        {"sm": 0.6, "graphics": 0.7, "sm_occupancy": 0, "tensor": 0, "dram_bandwidth": 0},
        abs=1e-9,
    )
    infer_b = slice_labels(node, 1, 2)
    assert got[series("numaguard_mig_utilization_ratio", **infer_b, kind="sm")] == pytest.approx(
        0.02, abs=1e-9
    )
    # the whole GPU is its slices weighted by their SMs; never a slice value repeated
    whole = got[series("numaguard_gpu_utilization_ratio", **gpu_labels(node, 1), kind="sm")]
    assert whole == pytest.approx((0.6 * 60 + 0.02 * 16) / 132, abs=1e-9)
    assert got[
        series("numaguard_gpu_utilization_ratio", **gpu_labels(node, 0), kind="sm")
    ] == pytest.approx(0.9, abs=1e-9)
    assert all(
        got[series("numaguard_mig_utilization_supported", **infer_a, kind=k)] == 1 for k in KINDS
    )
    # 8 GPUs, 4 + 7 + 2 slices
    assert len([k for k in got if k[0] == "numaguard_gpu_info"]) == 8
    assert len([k for k in got if k[0] == "numaguard_mig_info"]) == 13
    health = node.collection.health["gpu"]
    assert health.success and sum(health.errors.values()) == 0


async def test_utilization_is_the_average_since_the_last_cycle(gpu_node):
    node = gpu_node()
    infer_a = node.nvml.gpus[1].mig[0]
    await node.cycle()
    infer_a.activity.set(sm=0.2, pcie_tx=100 * MIB)
    node.clock.now += 10
    infer_a.activity.set(sm=0.8, pcie_tx=400 * MIB)
    got = await node.cycle(advance=5)
    labels = slice_labels(node, 1, 0)
    # 15 s since the last sample: 10 s at 0.2, then 5 s at 0.8
    assert got[series("numaguard_mig_utilization_ratio", **labels, kind="sm")] == pytest.approx(
        (10 * 0.2 + 5 * 0.8) / 15, abs=1e-9
    )
    assert got[
        series("numaguard_mig_pcie_bytes_per_second", **labels, direction="tx")
    ] == pytest.approx((10 * 100 + 5 * 400) / 15 * MIB, rel=1e-9)


async def test_a_gpm_sample_too_close_for_nvml_is_waited_for_not_an_error(gpu_node):
    """NVML refuses GPM samples under 100 ms apart by the stamps it takes inside the call,
    a little after the source's own clock: a cycle 105 ms after the last one (by ours,
    95 ms by NVML's) measures against the older sample next time instead of failing."""
    lag = [0.01]  # NVML stamps the first samples 10 ms after the source's clock
    clock = Clock()
    node = gpu_node(lambda c: presets.gpu_node(lambda: c() + lag[0]), clock=clock)
    await node.cycle()
    await node.cycle()
    lag[0] = 0.0
    got = await node.cycle(advance=0.105)
    health = node.collection.health["gpu"]
    assert health.success and sum(health.errors.values()) == 0
    labels = slice_labels(node, 1, 0)
    assert series("numaguard_mig_utilization_ratio", **labels, kind="sm") not in got
    got = await node.cycle(advance=0.2)
    assert series("numaguard_mig_utilization_ratio", **labels, kind="sm") in got
    assert health.success and sum(health.errors.values()) == 0


async def test_slices_appear_and_disappear_between_cycles(gpu_node):
    node = gpu_node()
    await node.cycle()
    await node.cycle()
    old = [s.uuid for s in node.nvml.gpus[2].mig]
    node.nvml.set_mig(2, ["7g.80gb"])
    node.nvml.set_mig(3, ["4g.40gb", "2g.20gb", "1g.10gb"])  # MIG turned on at run time
    got = await node.cycle()
    mig_uuids = {dict(k[1]).get("mig_uuid") for k in got if k[0] == "numaguard_mig_info"}
    assert not mig_uuids & set(old)
    whole = slice_labels(node, 2, 0)
    assert (
        got[
            series(
                "numaguard_mig_info",
                **whole,
                gi_id="8",
                ci_id="0",
                placement_start="0",
                placement_size="8",
            )
        ]
        == 1
    )
    assert got[series("numaguard_mig_multiprocessors", **whole)] == 132
    # a new slice has no interval yet: supported, no value; then it has one
    assert got[series("numaguard_mig_utilization_supported", **whole, kind="sm")] == 1
    assert series("numaguard_mig_utilization_ratio", **whole, kind="sm") not in got
    assert len([k for k in got if k[0] == "numaguard_mig_info" and dict(k[1])["gpu"] == "3"]) == 3
    node.nvml.gpus[2].mig[0].activity.set(sm=0.5)
    got = await node.cycle()
    assert got[series("numaguard_mig_utilization_ratio", **whole, kind="sm")] == pytest.approx(
        0.5, abs=1e-9
    )
    # GPU 2's utilization went on across the repartition without a negative interval
    assert got[series("numaguard_gpu_utilization_ratio", **gpu_labels(node, 2), kind="sm")] >= 0
    # one GPM sample kept per GPU and per slice, the rest freed
    assert len(node.nvml._samples) == 8 + 4 + 1 + 3 + 2
    assert node.collection.health["gpu"].success


# What a UUID fixes (a GPU's name, PCI address and NUMA node; a slice's instance ids,
# profile, SM count and placement): asked of NVML once, not every cycle.
STATIC = (
    "nvmlDeviceGetName",
    "nvmlDeviceGetPciInfo_v3",
    "nvmlDeviceGetGpuInstanceId",
    "nvmlDeviceGetAttributes_v2",
    "nvmlGpuInstanceGetInfo",
    "nvmlDeviceGetGpuInstanceProfileInfoByIdV",
    # how GPUs reach each other: asked when the GPUs change
    "nvmlDeviceGetTopologyCommonAncestor",
    "nvmlDeviceGetP2PStatus",
    "nvmlDeviceGetNvLinkState",
)


def static_calls(nvml: FakeNvml, gpu: int) -> dict[str, int]:
    return {f: nvml.calls[f, gpu] for f in STATIC}


def info_series(got: dict) -> set:
    return {k for k in got if k[0] in ("numaguard_gpu_info", "numaguard_mig_info")}


async def test_what_a_uuid_fixes_is_asked_once_and_afresh_for_new_slices(gpu_node):
    node = gpu_node()
    first = await node.cycle()
    asked = {g: static_calls(node.nvml, g) for g in range(8)}
    assert asked[1]["nvmlDeviceGetAttributes_v2"] == len(node.nvml.gpus[1].mig)
    again = await node.cycle()
    assert {g: static_calls(node.nvml, g) for g in range(8)} == asked
    assert info_series(again) == info_series(first)
    assert node.nvml.calls["nvmlDeviceGetMemoryInfo", 1] > asked[1]["nvmlDeviceGetName"] * 2

    # MIG off and on with the same profiles: new slices, new UUIDs, asked afresh
    profiles = [s.profile.name for s in node.nvml.gpus[1].mig]
    old = {s.uuid for s in node.nvml.gpus[1].mig}
    node.nvml.set_mig(1, None)
    node.nvml.set_mig(1, profiles)
    assert not old & {s.uuid for s in node.nvml.gpus[1].mig}
    got = await node.cycle()
    assert node.nvml.calls["nvmlDeviceGetAttributes_v2", 1] == 2 * len(profiles)
    assert static_calls(node.nvml, 0) == asked[0]
    for i, sl in enumerate(node.nvml.gpus[1].mig):
        labels = slice_labels(node, 1, i)
        assert got[series("numaguard_mig_multiprocessors", **labels)] == sl.profile.sm_count
        info = [
            k for k in got if k[0] == "numaguard_mig_info" and dict(k[1])["mig_uuid"] == sl.uuid
        ]
        assert [dict(k[1])["gi_id"] for k in info] == [str(sl.gi_id)]
    assert not [k for k in got if dict(k[1]).get("mig_uuid") in old]


async def test_what_failed_to_be_learnt_is_asked_again(gpu_node):
    node = gpu_node()
    node.nvml.fail("nvmlDeviceGetAttributes_v2", 1)
    got = await node.cycle()
    labels = slice_labels(node, 1, 0)
    assert series("numaguard_mig_multiprocessors", **labels) not in got
    assert got[series("numaguard_collector_errors_total", collector="gpu", reason="nvml")] > 0
    node.nvml.failures.clear()
    got = await node.cycle()
    sm_count = node.nvml.gpus[1].mig[0].profile.sm_count
    assert got[series("numaguard_mig_multiprocessors", **labels)] == sm_count
    assert node.collection.health["gpu"].success
    asked = static_calls(node.nvml, 1)
    await node.cycle()
    assert static_calls(node.nvml, 1) == asked  # learnt now: not asked again


def a100_node(clock):
    host = presets.two_socket()
    host.pods = []
    nvml = FakeNvml(clock)
    nvml.add_gpu("A100-40GB", 0, ["3g.20gb", "3g.20gb"])
    nvml.add_gpu("A100-40GB", 1, None, 8 * GIB, graphics=0.3)
    return host, nvml


async def test_a100_slices_say_unsupported_never_zero(gpu_node):
    node = gpu_node(a100_node)
    await node.cycle()
    got = await node.cycle()
    for i in range(2):
        labels = slice_labels(node, 0, i)
        for kind in KINDS:
            assert got[series("numaguard_mig_utilization_supported", **labels, kind=kind)] == 0
        assert got[series("numaguard_mig_multiprocessors", **labels)] == 42
    assert not [
        k
        for k in got
        if k[0] in ("numaguard_mig_utilization_ratio", "numaguard_mig_pcie_bytes_per_second")
    ]
    mig_gpu = gpu_labels(node, 0)
    assert all(
        got[series("numaguard_gpu_utilization_supported", **mig_gpu, kind=k)] == 0 for k in KINDS
    )
    # MIG off without GPM: the utilization rates give graphics, nothing else
    plain = gpu_labels(node, 1)
    assert got[series("numaguard_gpu_utilization_ratio", **plain, kind="graphics")] == 0.3
    assert got[series("numaguard_gpu_utilization_supported", **plain, kind="graphics")] == 1
    assert got[series("numaguard_gpu_utilization_supported", **plain, kind="sm")] == 0
    assert series("numaguard_gpu_utilization_ratio", **plain, kind="sm") not in got
    assert node.collection.health["gpu"].success


async def test_a_gpu_lost_mid_cycle(gpu_node):
    node = gpu_node()
    await node.cycle()
    node.nvml.lose(3)
    got = await node.cycle()
    lost = gpu_labels(node, 3)
    assert got[series("numaguard_gpu_up", **lost)] == 0
    # still named from what it said before, with nothing else claimed about it
    assert (
        got[
            series(
                "numaguard_gpu_info",
                **lost,
                model="NVIDIA H100 80GB HBM3",
                pci_bus_id="0000:48:00.0",
                numa_node="0",
                mig_mode="disabled",
                **versions(node),
            )
        ]
        == 1
    )
    assert series("numaguard_gpu_power_watts", **lost) not in got
    assert sum(got[series("numaguard_gpu_up", **gpu_labels(node, i))] for i in range(8)) == 7
    assert got[series("numaguard_collector_errors_total", collector="gpu", reason="gpu_lost")] == 1
    assert got[series("numaguard_collector_success", collector="gpu")] == 0


# Every C function the source calls, with the GPU it is called for.
CALLED = [
    "nvmlDeviceGetName",
    "nvmlDeviceGetUUID",
    "nvmlDeviceGetPciInfo_v3",
    "nvmlDeviceGetMigMode",
    "nvmlDeviceGetMemoryInfo",
    "nvmlDeviceGetPowerUsage",
    "nvmlDeviceGetTemperature",
    "nvmlGpmQueryDeviceSupport",
    "nvmlGpmSampleAlloc",
    "nvmlGpmSampleGet",
    "nvmlGpmMigSampleGet",
    "nvmlGpmMetricsGet",
    "nvmlGpmSampleFree",
    "nvmlDeviceGetMaxMigDeviceCount",
    "nvmlDeviceGetMigDeviceHandleByIndex",
    "nvmlDeviceGetGpuInstanceId",
    "nvmlDeviceGetComputeInstanceId",
    "nvmlDeviceGetAttributes_v2",
    "nvmlDeviceGetGpuInstanceById",
    "nvmlGpuInstanceGetInfo",
    "nvmlDeviceGetGpuInstanceProfileInfoByIdV",
    "nvmlDeviceGetComputeRunningProcesses_v3",
    "nvmlDeviceGetUtilizationRates",
    "nvmlDeviceGetNumaNodeId",
    "nvmlDeviceGetTopologyCommonAncestor",
    "nvmlDeviceGetP2PStatus",
    "nvmlDeviceGetNvLinkState",
    "nvmlDeviceGetNvLinkRemoteDeviceType",
    "nvmlDeviceGetNvLinkRemotePciInfo_v2",
]


def mixed_node(clock):
    """The preset GPU node plus an A100 (no GPM, MIG off) whose PCI entry sysfs lacks,
    GPUs 3 and 7 joined by two NVLinks and GPU 0 on an NVSwitch: every NVML call the
    source can make is made."""
    host, nvml = presets.gpu_node(clock)
    nvml.add_gpu("A100-40GB", 1, None, GIB, graphics=0.3)
    nvml.gpus[3].nvlinks, nvml.gpus[7].nvlinks = [7, 7], [3, 3]
    nvml.gpus[0].nvlinks = ["00000000:A0:00.0"]
    return host, nvml


def called_on(branch: DriverBranch) -> list[str]:
    """CALLED as a driver of ``branch`` is asked: without ByIdV, the profiles by index."""
    called = [f for f in CALLED if f not in branch.lacks]
    if "nvmlDeviceGetGpuInstanceProfileInfoByIdV" in branch.lacks:
        called.append("nvmlDeviceGetGpuInstanceProfileInfoV")
    return called


BRANCH_CALLS = [(BRANCHES[b], f) for b in sorted(BRANCHES) for f in called_on(BRANCHES[b])]


def test_the_list_of_called_functions_is_complete(fake_root, branch):
    """Every function the source really calls is in CALLED, so the error tests cover all."""
    clock = Clock()
    host, nvml = mixed_node(clock)
    nvml.branch = branch
    root = fake_root(host)
    with nvml.installed():
        source = NvmlSource(pynvml, str(root.root), clock=clock)
        source.start()
        source.read()
        clock.now += 1
        source.read()
        source.close()
    called = {name for name, _ in nvml.calls}
    setup = {
        "nvmlInitWithFlags",
        "nvmlSystemGetDriverVersion",
        "nvmlSystemGetNVMLVersion",
        "nvmlShutdown",
    }
    enumeration = {"nvmlDeviceGetCount_v2", "nvmlDeviceGetHandleByIndex_v2"}
    assert called - setup - enumeration == set(called_on(branch))


@pytest.mark.parametrize(("branch", "function"), BRANCH_CALLS)
async def test_not_supported_on_any_call_is_no_error(gpu_node, function):
    node = gpu_node(mixed_node)
    node.nvml.fail(function, code=pynvml.NVML_ERROR_NOT_SUPPORTED)
    await node.cycle()
    got = await node.cycle()
    if function == "nvmlDeviceGetUUID":
        # a GPU that cannot say who it is cannot be reported; nothing is made up
        ups = [got[series("numaguard_gpu_up", gpu=str(i), gpu_uuid="")] for i in range(9)]
        assert ups == [0] * 9
        assert not [k for k in got if k[0] == "numaguard_gpu_info"]
    else:
        ups = [got[series("numaguard_gpu_up", **gpu_labels(node, i))] for i in range(9)]
        assert ups == [1] * 9
        assert len([k for k in got if k[0] == "numaguard_gpu_info"]) == 9
    assert node.collection.health["gpu"].errors["nvml"] == 0


@pytest.mark.parametrize(("branch", "function"), BRANCH_CALLS)
async def test_an_nvml_error_on_any_call_is_counted(gpu_node, function):
    node = gpu_node(mixed_node)
    node.nvml.fail(function, code=pynvml.NVML_ERROR_UNKNOWN)
    await node.cycle()
    got = await node.cycle()
    assert got[series("numaguard_collector_errors_total", collector="gpu", reason="nvml")] > 0
    assert got[series("numaguard_collector_success", collector="gpu")] == 0
    # the host side does not suffer
    assert got[series("numaguard_collector_success", collector="pod_placement")] == 1


async def test_hung_nvml_marks_that_gpu_down_and_metrics_keep_answering(gpu_node):
    node = gpu_node(device_timeout=0.3, clock=time.monotonic)
    await node.collection.run_once()  # known before it hangs
    calls_before = node.nvml.calls["nvmlDeviceGetPowerUsage", 2]
    node.nvml.hang("nvmlDeviceGetPowerUsage", 2)
    exporter = Exporter(Settings(interval_seconds=0.2), node.collection)
    async with TestClient(TestServer(exporter.app)) as client:
        loop_task = asyncio.create_task(exporter.run_cycles())
        try:
            timeouts = series("numaguard_collector_errors_total", collector="gpu", reason="timeout")

            async def served_past_two_timeouts():  # cycles went on with GPU 2 stuck
                started = time.monotonic()
                response = await client.get("/metrics")
                took = time.monotonic() - started
                if response.status != 200:  # no cycle rendered yet
                    return None
                got = samples(await response.read())
                return got.get(timeouts, 0) >= 2 and (response, took, got)

            response, took, got = await until(
                served_past_two_timeouts, "two cycles past the hung GPU served", 30
            )
            stuck_calls = node.nvml.calls["nvmlDeviceGetPowerUsage", 2] - calls_before
            node.nvml.release.set()
            up = series("numaguard_gpu_up", **gpu_labels(node, 2))

            async def back_up():
                return samples(await (await client.get("/metrics")).read()).get(up) == 1

            await until(back_up, "GPU 2 up again once its call returned", 30)
        finally:
            node.nvml.release.set()
            loop_task.cancel()
            await asyncio.gather(loop_task, return_exceptions=True)
    assert response.status == 200 and took < 0.5
    assert got[series("numaguard_gpu_up", **gpu_labels(node, 2))] == 0
    assert got[series("numaguard_gpu_up", **gpu_labels(node, 1))] == 1
    assert got[series("numaguard_collector_errors_total", collector="gpu", reason="timeout")] >= 2
    assert got[series("numaguard_collector_success", collector="host_numa")] == 1
    # the stuck call was not made again while it hung
    assert stuck_calls == 1


def test_gpus_are_read_in_turn_and_a_slow_one_holds_up_no_other(gpu_node):
    """One thread reads the GPUs one after another (parallel threads passed the GIL to
    and fro at every NVML call); when a read makes no progress for nvml_calls.HANDOFF_SECONDS, the
    GPUs after it go on in another thread, all within the one deadline."""
    node = gpu_node(device_timeout=1.5)
    threads: dict[int, int] = {}
    read_gpu = node.source._read_gpu

    def recorded(index: int):
        threads[index] = threading.get_ident()
        return read_gpu(index)

    node.source._read_gpu = recorded
    count = len(node.nvml.gpus)
    node.source.read()
    assert sorted(threads) == list(range(count)) and len(set(threads.values())) == 1
    threads.clear()
    node.nvml.hang("nvmlDeviceGetPowerUsage", 1)
    node.nvml.hang("nvmlDeviceGetPowerUsage", 2)
    started = time.monotonic()
    reading = node.source.read()
    took = time.monotonic() - started
    up = {g.index: g.up for g in reading.gpus}
    assert up == {i: i not in (1, 2) for i in range(count)}
    assert [i.reason for i in reading.issues] == ["timeout", "timeout"]
    # the GPUs before the first hung one, those between, those after: three threads
    assert len({threads[0], threads[1]}) == 1
    assert len({threads[1], threads[2], threads[3]}) == 3
    assert len({threads[i] for i in range(3, count)}) == 1
    assert took < 1.5 + 0.5  # one deadline, not one per hung GPU


async def test_each_driver_branch_says_what_it_supports(gpu_node):
    """What an older driver's library lacks is learnt once and left unknown, not an
    error: all GPUs up and the collector successful on every branch, MIG profiles named
    by index where there is no ByIdV (before R580), the NUMA node of a GPU whose sysfs
    entry says nothing taken from NVML from R550, unknown before."""
    node = gpu_node(mixed_node)
    await node.cycle()
    got = await node.cycle()
    branch = node.nvml.branch
    assert got[series("numaguard_collector_success", collector="gpu")] == 1
    assert node.collection.health["gpu"].errors["nvml"] == 0
    infos = {dict(k[1])["gpu"]: dict(k[1]) for k in got if k[0] == "numaguard_gpu_info"}
    assert len(infos) == 9
    assert {(i["driver_version"], i["nvml_version"]) for i in infos.values()} == {
        (branch.driver_version, branch.nvml_version)
    }
    has_numa_call = "nvmlDeviceGetNumaNodeId" not in branch.lacks
    assert infos["8"]["numa_node"] == ("1" if has_numa_call else "")  # the A100
    assert infos["0"]["numa_node"] == "0"  # from sysfs, on every branch
    for g, gpu in enumerate(node.nvml.gpus):
        assert got[series("numaguard_gpu_up", **gpu_labels(node, g))] == 1
        for m, _ in enumerate(gpu.mig or []):
            sms = got[series("numaguard_mig_multiprocessors", **slice_labels(node, g, m))]
            assert sms == gpu.mig[m].profile.sm_count
    a100 = gpu_labels(node, 8)
    assert got[series("numaguard_gpu_utilization_supported", **a100, kind="graphics")] == 1
    assert got[series("numaguard_gpu_utilization_supported", **a100, kind="sm")] == 0
    h100 = gpu_labels(node, 0)
    assert got[series("numaguard_gpu_utilization_supported", **h100, kind="sm")] == 1
    # the fallback is asked once per GPU, not every cycle
    by_index = sum(
        v for (f, _), v in node.nvml.calls.items() if f == "nvmlDeviceGetGpuInstanceProfileInfoV"
    )
    await node.cycle()
    again = sum(
        v for (f, _), v in node.nvml.calls.items() if f == "nvmlDeviceGetGpuInstanceProfileInfoV"
    )
    assert again == by_index and (by_index > 0) == (
        "nvmlDeviceGetGpuInstanceProfileInfoByIdV" in branch.lacks
    )


async def test_a_driver_without_v3_process_lists_is_asked_v2(gpu_node):
    """Before R510 there is no nvmlDeviceGetComputeRunningProcesses_v3, and pynvml's
    unversioned call raises NVMLLibraryMismatchError (not an NVMLError): the source asks
    _v2 and the devices' pods are found as before."""
    node = gpu_node()
    lacks = node.nvml.branch.lacks | {"nvmlDeviceGetComputeRunningProcesses_v3"}
    node.nvml.branch = replace(node.nvml.branch, name="no-v3", lacks=lacks)
    await node.cycle()
    got = await node.cycle()
    assert got[series("numaguard_collector_success", collector="gpu")] == 1
    holders = {dict(k[1])["pod"] for k in got if k[0] == "numaguard_gpu_holder_info"}
    assert {"trainer", "infer-a", "notebook-2", "dra-job"} <= holders
    # two cycles, each asking the count and then the list
    assert node.nvml.calls["nvmlDeviceGetComputeRunningProcesses_v2", 0] == 4
    assert not [k for k in node.nvml.calls if k[0] == "nvmlDeviceGetComputeRunningProcesses_v3"]


async def test_pods_on_devices_and_device_remote(gpu_node):
    node = gpu_node()
    await node.cycle()
    got = await node.cycle()
    host = node.host

    def holder(pod: str, gpu: int, mig: int | None, resource: str, numa: str):
        p = host.pod(pod)
        return series(
            "numaguard_gpu_holder_info",
            **gpu_labels(node, gpu),
            mig_uuid="" if mig is None else node.uuid(gpu, mig),
            resource=resource,
            numa_node=numa,
            namespace="ml",
            pod=pod,
            container="main",
            pod_uid=p.uid,
            container_id=host.container_id(p, p.containers[0]),
            source="process",
        )

    expected = {
        holder("trainer", 0, None, "nvidia.com/gpu", "0"),
        holder("trainer-remote", 4, None, "nvidia.com/gpu", "1"),
        holder("infer-a", 1, 0, "nvidia.com/mig-3g.40gb", "0"),
        holder("infer-b", 1, 2, "nvidia.com/mig-1g.10gb", "0"),
        holder("notebook-0", 2, 0, "nvidia.com/mig-1g.10gb", "0"),
        holder("notebook-1", 2, 1, "nvidia.com/mig-1g.10gb", "0"),
        holder("notebook-2", 2, 2, "nvidia.com/mig-1g.10gb", "0"),
        holder("infer-c", 5, 0, "nvidia.com/mig-4g.40gb", "1"),
        holder("dra-job", 6, None, "nvidia.com/gpu", "1"),
    }
    assert {k for k in got if k[0] == "numaguard_gpu_holder_info"} == expected
    verdicts = {
        dict(k[1])["pod"]: v
        for k, v in got.items()
        if k[0] == "numaguard_pod_cross_numa" and dict(k[1])["reason"] == "device_remote"
    }
    assert verdicts == {
        "trainer": 0,
        "trainer-remote": 1,
        "infer-a": 0,
        "infer-b": 0,
        "notebook-0": 0,
        "notebook-1": 0,
        "notebook-2": 0,
        "infer-c": 0,
        "dra-job": 0,
    }  # web holds no device, and infer-d runs nothing on its slice: without the kubelet,
    # no verdict


async def test_exporter_with_a_fake_gpu_node_file(fake_root, tmp_path):
    host, nvml = presets.gpu_node()
    root = fake_root(host)
    description = tmp_path / "gpus.json"
    description.write_text(nvml.description())
    args = ("--host-root", str(root.root), "--node-name", NODE, "--interval", "0.2")
    async with exporter_process(*args, gpus=str(description)) as (url, _):

        async def measured() -> dict:
            got = samples(await get(f"{url}/metrics"))
            return got if any(k[0] == "numaguard_mig_utilization_ratio" for k in got) else {}

        # a second cycle measured the slices' activity (GPM needs two samples)
        got = await until(measured, "the slices' activity measured")
    assert len([k for k in got if k[0] == "numaguard_mig_info"]) == 13
    infer_c = {
        "gpu": "5",
        "gpu_uuid": nvml.gpus[5].uuid,
        "mig_uuid": nvml.gpus[5].mig[0].uuid,
        "mig_profile": "4g.40gb",
    }
    assert got[series("numaguard_mig_utilization_ratio", **infer_c, kind="sm")] == pytest.approx(
        0.7, abs=1e-6
    )
    assert got[series("numaguard_collector_success", collector="gpu")] == 1


async def test_without_a_driver_the_exporter_runs_without_gpus(fake_root):
    root = fake_root(presets.two_socket())
    args = ("--host-root", str(root.root), "--node-name", NODE, "--interval", "0.2")
    async with exporter_process(*args) as (url, proc):
        got = samples(await get(f"{url}/metrics"))
        proc.terminate()
        proc.wait(timeout=10)
    assert not [k for k in got if k[0].startswith(("numaguard_gpu_", "numaguard_mig_"))]
    assert series("numaguard_collector_success", collector="gpu") not in got
    assert log_of(proc).count("no NVIDIA driver") == 1


async def test_on_a_gpu_node_without_a_driver_the_gpu_collector_fails_visibly(fake_root):
    """The DaemonSet's --gpu-backend nvml on this machine, which has no driver: not an
    exporter quietly without GPUs, but the gpu collector failing with reason driver
    (NumaguardCollectorFailing then fires)."""
    root = fake_root(presets.two_socket())
    args = ("--host-root", str(root.root), "--node-name", NODE, "--interval", "0.2")
    errors = series("numaguard_collector_errors_total", collector="gpu", reason="driver")

    async with exporter_process(*args, "--gpu-backend", "nvml") as (url, proc):

        async def failed_twice():
            got = samples(await get(f"{url}/metrics"))
            return got if got.get(errors, 0) >= 2 else None

        got = await until(failed_twice, "two cycles failing for the driver")
        proc.terminate()
        proc.wait(timeout=10)
    assert got[series("numaguard_collector_success", collector="gpu")] == 0
    assert log_of(proc).count("the gpu collector fails (reason driver)") == 1


async def test_a_bad_fake_gpu_file_is_a_clear_error(fake_root, tmp_path):
    root = fake_root(presets.two_socket())
    bad = tmp_path / "gpus.json"
    bad.write_text('{"gpus": [{"model": "Z80"}]}')
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "numaguard.simulator.fakes.gpu_exporter",
        str(bad),
        "--host-root",
        str(root.root),
        "--listen",
        "127.0.0.1:0",
        stderr=asyncio.subprocess.PIPE,
    )
    _, err = await asyncio.wait_for(proc.communicate(), 30)
    assert proc.returncode == 2
    assert f"cannot use the fake GPU node in {bad}" in err.decode()


async def test_a_gpu_node_whose_driver_is_not_loaded_yet_says_so_until_it_is(fake_root):
    """--gpu-backend nvml (the DaemonSet on GPU nodes): NVML that cannot be initialised
    is the gpu collector's failure, reason driver, each cycle, and no GPU series; once
    the driver loads (the GPU Operator's driver container came up after us) the next
    cycle reads the GPUs."""
    clock = Clock()
    host, nvml = presets.gpu_node(clock)
    root = fake_root(host)
    nvml.failures[("nvmlInitWithFlags", None)] = pynvml.NVML_ERROR_DRIVER_NOT_LOADED
    with nvml.installed():
        source = NvmlSource(pynvml, str(root.root), 5.0, clock)
        collection = Collection(NODE, {"gpu": source}, clock=clock)

        async def cycle() -> dict:
            clock.now += INTERVAL
            await collection.run_once()
            return samples(collection.exposition.text)

        for n in (1, 2):
            got = await cycle()
            assert got[series("numaguard_collector_success", collector="gpu")] == 0
            errors = series("numaguard_collector_errors_total", collector="gpu", reason="driver")
            assert got[errors] == n
            assert not [k for k in got if k[0].startswith(("numaguard_gpu_", "numaguard_mig_"))]
        del nvml.failures[("nvmlInitWithFlags", None)]
        got = await cycle()
        source.close()
    assert got[series("numaguard_collector_success", collector="gpu")] == 1
    info = [k for k in got if k[0] == "numaguard_gpu_info"]
    assert len(info) == len(nvml.gpus) == 8
