"""How GPUs reach each other (pure): the exporter's link table equals the matrix
`nvidia-smi topo -m` prints for well-known machines (simulator/fakes/gpu_topology.py),
NVML's levels agree with the ones the sysfs PCI tree gives (and a disagreement is
counted, never silent), and each pod holding several GPUs or slices gets its worst pair,
its P2P pairs and the link_poor verdict."""

from __future__ import annotations

import time
from dataclasses import replace

import pynvml
import pytest

from numaguard.exporter.model.devices import DeviceUse
from numaguard.exporter.model.links import FreeSet, free_sets, pairs, pod_links
from numaguard.exporter.readers import ParseError
from numaguard.exporter.readers.nvml import pci_chain, pci_level
from numaguard.exporter.sources.gpu import NvmlSource
from numaguard.simulator.fakes import gpu_topology, presets
from numaguard.simulator.fakes.host import (
    FakeHost,
    FakeHostRoot,
    FakeNumaNode,
)
from numaguard.simulator.fakes.nvml import FakeNvml
from tests.conftest import NODE, samples
from tests.helpers.gpu_node import gpu_collection, holding

TOPO_M = {
    "hgx": """
\tGPU0\tGPU1\tGPU2\tGPU3\tGPU4\tGPU5\tGPU6\tGPU7
GPU0\tX\tNV18\tNV18\tNV18\tNV18\tNV18\tNV18\tNV18
GPU1\tNV18\tX\tNV18\tNV18\tNV18\tNV18\tNV18\tNV18
GPU2\tNV18\tNV18\tX\tNV18\tNV18\tNV18\tNV18\tNV18
GPU3\tNV18\tNV18\tNV18\tX\tNV18\tNV18\tNV18\tNV18
GPU4\tNV18\tNV18\tNV18\tNV18\tX\tNV18\tNV18\tNV18
GPU5\tNV18\tNV18\tNV18\tNV18\tNV18\tX\tNV18\tNV18
GPU6\tNV18\tNV18\tNV18\tNV18\tNV18\tNV18\tX\tNV18
GPU7\tNV18\tNV18\tNV18\tNV18\tNV18\tNV18\tNV18\tX
""",
    "bridged": """
\tGPU0\tGPU1\tGPU2\tGPU3
GPU0\tX\tNV12\tSYS\tSYS
GPU1\tNV12\tX\tSYS\tSYS
GPU2\tSYS\tSYS\tX\tNV12
GPU3\tSYS\tSYS\tNV12\tX
""",
    "pcie": """
\tGPU0\tGPU1\tGPU2\tGPU3\tGPU4\tGPU5\tGPU6\tGPU7
GPU0\tX\tPIX\tPXB\tPXB\tSYS\tSYS\tSYS\tSYS
GPU1\tPIX\tX\tPXB\tPXB\tSYS\tSYS\tSYS\tSYS
GPU2\tPXB\tPXB\tX\tPIX\tSYS\tSYS\tSYS\tSYS
GPU3\tPXB\tPXB\tPIX\tX\tSYS\tSYS\tSYS\tSYS
GPU4\tSYS\tSYS\tSYS\tSYS\tX\tPIX\tPHB\tNODE
GPU5\tSYS\tSYS\tSYS\tSYS\tPIX\tX\tPHB\tNODE
GPU6\tSYS\tSYS\tSYS\tSYS\tPHB\tPHB\tX\tNODE
GPU7\tSYS\tSYS\tSYS\tSYS\tNODE\tNODE\tNODE\tX
""",
}


def machine(layout: str, tmp_path):
    """A host laid out as ``layout``, its sysfs written; (host, NVML, the GPUs read)."""
    host = FakeHost(nodes=[FakeNumaNode("0-7", socket=0), FakeNumaNode("8-15", socket=1)])
    nvml = FakeNvml()
    getattr(gpu_topology, layout)(nvml, host)
    FakeHostRoot(str(tmp_path), host).write()
    with nvml.installed():
        reading = NvmlSource(pynvml, str(tmp_path)).read()
    return host, nvml, reading


def topo_m(reading) -> str:
    joined = pairs(reading.gpus)
    names = [f"GPU{g.index}" for g in reading.gpus]
    rows = ["\t".join(["", *names])]
    for a in reading.gpus:
        cells = []
        for b in reading.gpus:
            if a.index == b.index:
                cells.append("X")
                continue
            p = joined[min(a.index, b.index), max(a.index, b.index)]
            cells.append(f"NV{p.nvlinks}" if p.level == "nvlink" else p.level.upper())
        rows.append("\t".join([f"GPU{a.index}", *cells]))
    return "\n" + "\n".join(rows) + "\n"


@pytest.mark.parametrize("layout", sorted(TOPO_M))
def test_the_link_table_is_what_topo_m_prints(layout, tmp_path):
    _, _, reading = machine(layout, tmp_path)
    assert reading.issues == []
    assert topo_m(reading) == TOPO_M[layout]
    # sysfs's tree says what NVML does, for every pair over PCIe
    assert not [p for p in pairs(reading.gpus).values() if p.pcie_disagrees]
    compared = [p for p in pairs(reading.gpus).values() if p.a.pci_chain and p.b.pci_chain]
    assert len(compared) == len(reading.gpus) * (len(reading.gpus) - 1) // 2


def test_a_level_sysfs_and_nvml_disagree_on_is_counted(tmp_path):
    """GPU 1's sysfs link moved under another host bridge: NVML still says PIX with
    GPU 0; the pairs sysfs now sees differently are counted."""
    host = FakeHost(nodes=[FakeNumaNode("0-7", socket=0), FakeNumaNode("8-15", socket=1)])
    nvml = FakeNvml()
    gpu_topology.pcie(nvml, host)
    address = "0000:28:00.0"
    host.pci_paths[address] = ("pci0000:40", "0000:41:00.0")
    FakeHostRoot(str(tmp_path), host).write()
    with nvml.installed():
        reading = NvmlSource(pynvml, str(tmp_path)).read()
    disagree = {(p.a.index, p.b.index) for p in pairs(reading.gpus).values() if p.pcie_disagrees}
    assert disagree == {(0, 1), (1, 2), (1, 3)}  # pix and pxb by NVML, node by sysfs
    assert pairs(reading.gpus)[0, 1].level == "pix"  # NVML's word stands


@pytest.mark.parametrize(
    "path",
    [
        "/sys/devices/pci0000:00",  # no device
        "/sys/devices/platform/foo/0000:18:00.0",
        "/sys/devices/pci0000:00/0000:18:00.0/extra",
        "/sys/devices/pci0000:00/not-a-bdf",
        "",
    ],
)
def test_a_path_that_is_no_pci_device_is_refused(path):
    with pytest.raises(ParseError):
        pci_chain(path)


def test_the_level_from_two_chains():
    root = ("pci0000:00",)
    switch = (*root, "0000:01:00.0", "0000:02:00.0")
    assert pci_level((*switch, "0000:03:00.0", "a"), (*switch, "0000:04:00.0", "b"), 0, 0) == "pix"
    assert pci_level((*root, "0000:01:00.0", "a"), (*root, "0000:05:00.0", "b"), 0, 0) == "phb"
    assert pci_level((*root, "a"), ("pci0000:80", "b"), 0, 0) == "node"
    assert pci_level((*root, "a"), ("pci0000:80", "b"), 0, 1) == "sys"
    assert pci_level((*root, "a"), ("pci0000:80", "b"), None, 1) is None


def use(gpu, mig, uid: str, container: str) -> DeviceUse:
    resource = f"nvidia.com/mig-{mig.profile}" if mig else "nvidia.com/gpu"
    return DeviceUse(gpu, mig, resource, uid, container, "ml", uid, container, "kubelet")


def test_an_hgx_pair_across_sockets_is_nvlink_and_p2p(tmp_path):
    _, _, reading = machine("hgx", tmp_path)
    gpus = reading.gpus
    (links,) = pod_links((use(gpus[0], None, "p", "c"), use(gpus[4], None, "p", "c")), pairs(gpus))
    assert (links.worst, links.p2p, links.verdicts) == (
        "nvlink",
        {"ok": 1, "no": 0},
        {"split_containers": False, "mig_slices": False, "no_p2p": False},
    )


def test_the_same_pair_on_pcie_cards_across_sockets_is_no_p2p(tmp_path):
    _, _, reading = machine("bridged", tmp_path)
    gpus = reading.gpus
    (links,) = pod_links((use(gpus[1], None, "p", "c"), use(gpus[2], None, "p", "c")), pairs(gpus))
    assert (links.worst, links.p2p, links.verdicts["no_p2p"]) == ("sys", {"ok": 0, "no": 1}, True)
    # a pair of unknown level (NVML and sysfs silent) decides nothing
    unknown = {k: p.__class__(p.a, p.b, None, None, 0, False) for k, p in pairs(gpus).items()}
    (links,) = pod_links((use(gpus[1], None, "p", "c"), use(gpus[2], None, "p", "c")), unknown)
    assert (links.worst, links.p2p) == (None, None) and "no_p2p" not in links.verdicts


async def test_each_multi_gpu_pod_gets_its_worst_pair_and_verdicts(tmp_path):
    now = [0.0]
    host, nvml = presets.linked_gpu_node(lambda: now[0])
    root = FakeHostRoot(str(tmp_path / "host"), host)
    root.write()
    async with gpu_collection(host, nvml, root, lambda: now[0]) as (collection, _):
        await collection.run_once()
        now[0] += 10
        await collection.run_once()
    got = samples(collection.exposition.text)

    def of(name: str, label: str) -> dict[str, dict[str, float]]:
        out: dict[str, dict[str, float]] = {}
        for (metric, labels), value in got.items():
            if metric == name:
                labels = dict(labels)
                out.setdefault(labels["pod"], {})[labels[label]] = value
        return out

    assert of("numaguard_pod_gpu_link", "level") == {
        "near": {"pix": 1},
        "far": {"sys": 1},
        "split": {"phb": 1},
    }
    assert of("numaguard_pod_gpu_p2p_pairs", "state") == {
        "near": {"ok": 1, "no": 0},
        "far": {"ok": 0, "no": 1},
        "split": {"ok": 0, "no": 1},
    }
    # slices are no pair of full GPUs: no level, no P2P count, only their own verdicts
    assert of("numaguard_pod_gpu_link_poor", "reason") == {
        "near": {"no_p2p": 0, "split_containers": 0, "mig_slices": 0},
        "far": {"no_p2p": 1, "split_containers": 0, "mig_slices": 0},
        "split": {"no_p2p": 1, "split_containers": 1, "mig_slices": 0},
        "sliced": {"split_containers": 0, "mig_slices": 1},
    }
    assert got[("numaguard_gpu_link_level_mismatch_pairs", frozenset({("node", NODE)}))] == 0

    # NVLink traffic where a GPU has NVLinks and GPM measures it; none made up elsewhere
    nvlink = {
        (dict(labels)["gpu"], dict(labels)["direction"]): value
        for (metric, labels), value in got.items()
        if metric == "numaguard_gpu_nvlink_bytes_per_second"
    }
    assert nvlink == {("4", "tx"): 3 << 30, ("4", "rx"): 1 << 30, ("5", "tx"): 0, ("5", "rx"): 0}
    supported = {
        dict(labels)["gpu"]: value
        for (metric, labels), value in got.items()
        if metric == "numaguard_gpu_nvlink_supported"
    }
    assert supported == {str(i): int(i in (4, 5)) for i in range(8)}


async def test_nvlink_traffic_without_gpm_comes_from_the_throughput_counters(tmp_path):
    """A100s (no GPM) in NVLink-bridged pairs: NVLink bytes a second from the field
    values' KiB counters between two cycles, asked only of GPUs with NVLinks."""
    now = [0.0]
    host = FakeHost(nodes=[FakeNumaNode("0-7", socket=0), FakeNumaNode("8-15", socket=1)])
    nvml = FakeNvml(lambda: now[0])
    gpu_topology.bridged(nvml, host, "A100-40GB")
    nvml.gpus[0].activity.set(nvlink_tx=2 << 30, nvlink_rx=1 << 30)
    root = FakeHostRoot(str(tmp_path / "host"), host)
    root.write()
    async with gpu_collection(host, nvml, root, lambda: now[0]) as (collection, _):
        await collection.run_once()
        first = samples(collection.exposition.text)
        now[0] += 10
        await collection.run_once()
    got = samples(collection.exposition.text)

    def by_gpu(scrape, name):
        return {
            (dict(labels)["gpu"], dict(labels).get("direction")): value
            for (metric, labels), value in scrape.items()
            if metric == name
        }

    # the first cycle has no interval yet: measurable, nothing measured
    assert by_gpu(first, "numaguard_gpu_nvlink_supported") == {(str(i), None): 1 for i in range(4)}
    assert by_gpu(first, "numaguard_gpu_nvlink_bytes_per_second") == {}
    assert by_gpu(got, "numaguard_gpu_nvlink_bytes_per_second") == {
        ("0", "tx"): 2 << 30,
        ("0", "rx"): 1 << 30,
        **{(str(i), d): 0 for i in (1, 2, 3) for d in ("tx", "rx")},
    }
    # no GPM on an A100: of its utilization kinds only NVML's own graphics one
    assert {
        dict(labels)["kind"]
        for (metric, labels), value in got.items()
        if metric == "numaguard_gpu_utilization_supported" and value == 1
    } == {"graphics"}


async def test_a_driver_without_the_throughput_fields_is_asked_once(tmp_path):
    now = [0.0]
    host = FakeHost(nodes=[FakeNumaNode("0-7", socket=0), FakeNumaNode("8-15", socket=1)])
    nvml = FakeNvml(lambda: now[0])
    gpu_topology.bridged(nvml, host, "A100-40GB")
    nvml.fields_missing = frozenset({138, 139})
    FakeHostRoot(str(tmp_path), host).write()
    source = NvmlSource(pynvml, str(tmp_path), clock=lambda: now[0])
    with nvml.installed():
        for _ in range(3):
            reading = source.read()
            now[0] += 10
    source.close()
    assert reading.issues == []
    assert [g.activity.nvlink_supported for g in reading.gpus] == [False] * 4
    assert nvml.calls["nvmlDeviceGetFieldValues", 0] == 1


async def test_a_failed_field_read_leaves_nvlink_traffic_unknown(tmp_path):
    """An error is no zero and no "unsupported": the series are left out, the error
    counted, and the next good cycles measure again."""
    now = [0.0]
    host = FakeHost(nodes=[FakeNumaNode("0-7", socket=0), FakeNumaNode("8-15", socket=1)])
    nvml = FakeNvml(lambda: now[0])
    gpu_topology.bridged(nvml, host, "A100-40GB")
    FakeHostRoot(str(tmp_path), host).write()
    source = NvmlSource(pynvml, str(tmp_path), clock=lambda: now[0])
    with nvml.installed():
        source.read()
        nvml.fail("nvmlDeviceGetFieldValues", 1)
        now[0] += 10
        broken = source.read()
        del nvml.failures["nvmlDeviceGetFieldValues", 1]
        readings = []
        for _ in range(2):
            now[0] += 10
            readings.append(source.read())
    source.close()
    assert [(i.reason, i.path) for i in broken.issues] == [
        ("nvml", "gpu1/nvmlDeviceGetFieldValues")
    ]
    assert broken.gpus[1].activity.nvlink_supported is None
    assert broken.gpus[1].activity.nvlink_bytes_per_second == {}
    assert broken.gpus[0].activity.nvlink_bytes_per_second == {"tx": 0.0, "rx": 0.0}
    # measured again at once, a rate from the cycle after
    assert readings[0].gpus[1].activity.nvlink_supported is True
    assert readings[1].gpus[1].activity.nvlink_bytes_per_second == {"tx": 0.0, "rx": 0.0}


def best_sets(scrape) -> dict[tuple[str, str], str]:
    """(numa_node, size) -> level, from numaguard_zone_gpu_free_set."""
    out = {}
    for (metric, labels), value in scrape.items():
        if metric == "numaguard_zone_gpu_free_set":
            labels = dict(labels)
            assert value == 1 and (labels["numa_node"], labels["size"]) not in out
            out[labels["numa_node"], labels["size"]] = labels["level"]
    return out


async def scrape(layout: str, pods: dict[str, list[int]], tmp_path):
    """The exposition of a ``layout`` machine whose ``pods`` hold those GPUs."""
    host = FakeHost(nodes=[FakeNumaNode("0-7", socket=0), FakeNumaNode("8-15", socket=1)])
    nvml = FakeNvml()
    getattr(gpu_topology, layout)(nvml, host)
    holding(host, nvml, pods)
    root = FakeHostRoot(str(tmp_path / "host"), host)
    root.write()
    async with gpu_collection(host, nvml, root, time.monotonic) as (collection, _):
        await collection.run_once()
    return samples(collection.exposition.text)


async def free_sets_of(layout: str, pods: dict[str, list[int]], tmp_path):
    return best_sets(await scrape(layout, pods, tmp_path))


async def test_the_best_free_set_of_each_size_per_numa_node(tmp_path):
    assert await free_sets_of("pcie", {}, tmp_path / "pcie") == {
        ("", "2"): "pix",
        ("0", "2"): "pix",  # GPUs 0 and 1 behind one switch
        ("1", "2"): "pix",
        ("", "4"): "pxb",
        ("0", "4"): "pxb",  # the four under the switch of switches
        ("1", "4"): "node",  # one of socket 1's GPUs is on a second host bridge
        ("", "8"): "sys",
    }
    # HGX: NVLink everywhere, across sockets too
    hgx = await free_sets_of("hgx", {"trainer": [0, 1, 2]}, tmp_path / "hgx")
    assert hgx == {
        ("", "2"): "nvlink",  # GPU 3, socket 0's only free one, with any of socket 1's
        ("1", "2"): "nvlink",
        ("", "4"): "nvlink",
        ("1", "4"): "nvlink",
    }


async def test_single_gpu_pods_on_each_nvlink_pair_leave_no_joined_pair(tmp_path):
    """k8s-device-plugin#546's shape: one single-GPU pod on each bridged pair; the two
    GPUs left are a SYS pair, and no NUMA node has two free."""
    spread = await free_sets_of("bridged", {"a": [0], "b": [2]}, tmp_path / "spread")
    assert spread == {("", "2"): "sys"}
    packed = await free_sets_of("bridged", {"a": [0], "b": [1]}, tmp_path / "packed")
    assert packed == {("", "2"): "nvlink", ("1", "2"): "nvlink"}


def test_a_pair_of_unknown_level_joins_no_set(tmp_path):
    _, _, reading = machine("bridged", tmp_path)
    joined = pairs(reading.gpus)
    unknown = {**joined, (0, 1): replace(joined[0, 1], level=None)}
    assert free_sets(list(reading.gpus), joined)[0] == FreeSet(None, 2, "nvlink")
    assert FreeSet(0, 2, "nvlink") not in free_sets(list(reading.gpus), unknown)
    assert FreeSet(1, 2, "nvlink") in free_sets(list(reading.gpus), unknown)


async def test_a_single_gpu_pod_holding_half_of_the_last_joined_pair_is_said(tmp_path):
    """Spread over both bridged pairs, each single-GPU pod keeps a pair from a 2-GPU pod;
    packed on one pair, neither does (the other pair is free)."""

    def breaks(scrape):
        return {
            dict(labels)["pod"]: value
            for (metric, labels), value in scrape.items()
            if metric == "numaguard_pod_gpu_fragmenting"
        }

    spread = await scrape("bridged", {"a": [0], "b": [2]}, tmp_path / "spread")
    assert breaks(spread) == {"a": 1, "b": 1}
    packed = await scrape("bridged", {"a": [0], "b": [1]}, tmp_path / "packed")
    assert breaks(packed) == {"a": 0, "b": 0}
    # PCIe cards: a 2-GPU pod gets no verdict; c and d each sit behind a switch with a
    # free GPU, on NUMA nodes where no two free GPUs are joined; e's GPU is NODE from all
    pcie = await scrape("pcie", {"pair": [0, 1], "c": [2], "d": [4], "e": [7]}, tmp_path / "p")
    assert breaks(pcie) == {"c": 1, "d": 1, "e": 0}


class Wrapped:
    """pynvml behind a wrapper that hands out a new function at each lookup, as a
    profiler's does (bench/cycle.py times every call so)."""

    def __getattr__(self, name: str):
        target = getattr(pynvml, name)
        if not (name.startswith("nvml") and callable(target)):
            return target

        def call(*args):
            return target(*args)

        call.__name__ = name
        return call


def test_the_links_are_asked_once_even_through_a_wrapper(tmp_path):
    _, nvml, _ = machine("hgx", tmp_path)
    source = NvmlSource(Wrapped(), str(tmp_path))
    with nvml.installed():
        first = source.read()
        asked = nvml.calls.copy()
        again = source.read()
    source.close()
    assert first.issues == [] and again.issues == []
    assert sum(n for (name, _), n in nvml.calls.items() if "NvLink" in name) == sum(
        n for (name, _), n in asked.items() if "NvLink" in name
    )
    assert {p.level for p in pairs(again.gpus).values()} == {"nvlink"}
