"""Benchmark: the series bill — how many series the exporter writes on the reference GPU
node (8 NUMA nodes, 224 CPUs, 150 pods / 300 containers named as the API server names
them, resctrl groups per pod, 8 GPUs x 7 MIG slices, the kubelet's PodResources served
by the simulator's kubelet), by default and with --detail, by what they describe: per
pod, per GPU, per MIG slice, and the node's own. ``python -m bench.series``."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import tempfile
from collections import Counter

import pynvml
from prometheus_client.parser import text_string_to_metric_families

from numaguard.exporter.collection import Collection
from numaguard.exporter.readers.dra import Allocated
from numaguard.exporter.sources.cgroups import CgroupSource
from numaguard.exporter.sources.gpu import NvmlSource
from numaguard.exporter.sources.host import HostSource
from numaguard.exporter.sources.kubelet import PodResourcesSource
from numaguard.exporter.sources.resctrl import ResctrlSource
from numaguard.simulator.fakes import dra, presets
from numaguard.simulator.fakes.host import KUBELET_CONFIG, FakeHostRoot, pod_metadata
from numaguard.simulator.fakes.resctrl import FakeResctrl

PRESET = ("--preset", "reference_gpu_node")
TARGET = 3000  # series on the reference node by default
KIB_PER_SERIES = 4  # Prometheus' memory per active series, roughly


def what(labels: dict[str, str]) -> str:
    """The thing a series describes: the most specific of slice, GPU, pod, node."""
    if labels.get("mig_uuid"):
        return "slice"
    if labels.get("gpu_uuid") or labels.get("gpu"):
        return "gpu"
    if labels.get("pod_uid"):
        return "pod"
    return "node"


class StepClock:
    """Time that a cycle moves on by the exporter's interval: the GPUs' activity (GPM)
    is measured between cycles, never back to back; the same every run (the golden
    exposition, tests/golden/, is this one)."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def expositions(
    details: tuple[bool, ...] = (False, True), dynamic_mig: bool = False
) -> dict[bool, str]:
    """The reference node's exposition text after two cycles 15 s apart, by whether
    --detail is on; ``dynamic_mig``: its GPUs under NVIDIA's DRA DynamicMIG, each of
    their slices made for a claim."""
    clock = StepClock()
    host, nvml = presets.reference_gpu_node(clock)
    view = None
    if dynamic_mig:
        claims = {
            ("ml", f"claim-{g}-{s.placement_start}"): (
                Allocated("mig", dra.DRIVER, "reference", dra.device_name(g, s)),
            )
            for g, gpu in enumerate(nvml.gpus)
            for s in gpu.mig or []
        }
        view = dra.view("reference", nvml, list(range(len(nvml.gpus))), claims, dynamic=True)
    with tempfile.TemporaryDirectory(prefix="ng", dir="/tmp") as tmp, nvml.installed():
        FakeHostRoot(tmp, host).write()
        kernel = FakeResctrl(tmp, host, snc={0: [0, 1, 2, 3], 1: [4, 5, 6, 7]}).write()
        socket = f"{tmp}/kubelet.sock"
        kubelet = subprocess.Popen(
            [sys.executable, "-m", "numaguard.simulator.fakes.podresources", socket, *PRESET],
            stdout=subprocess.PIPE,
        )
        try:
            assert kubelet.stdout.readline().strip() == b"ready"
            names = pod_metadata(host)
            return {
                detail: asyncio.run(_text(tmp, host, kernel, socket, names, clock, detail, view))
                for detail in details
            }
        finally:
            kubelet.terminate()
            kubelet.wait()


async def _text(tmp, host, kernel, socket, names, clock: StepClock, detail: bool, view=None) -> str:
    gpus = NvmlSource(pynvml, tmp, clock=clock)
    gpus.start()
    pod_resources = PodResourcesSource(socket, config=f"{tmp}/{KUBELET_CONFIG}")
    collection = Collection(
        "reference",
        {
            "host_numa": HostSource(tmp),
            "pod_placement": CgroupSource(tmp, page_size=host.page_size),
            "resctrl": ResctrlSource(tmp, "manage", kernel),
            "gpu": gpus,
            "pod_resources": pod_resources,
        },
        metadata=lambda: names,
        clock=clock,
        detail=detail,
        dra=lambda: view,
        timeout_seconds=300,  # what is exposed, never how fast: a loaded machine times out none
    )
    try:
        for _ in range(2):  # rates and ratios need a cycle before
            clock.now += 15.0
            await collection.run_once()
    finally:
        pod_resources.close()
        gpus.close()
    return collection.exposition.text.decode()


def bill(text: str) -> tuple[Counter, Counter]:
    """Series by what they describe, and by family."""
    kinds, families = Counter(), Counter()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            kinds[what(sample.labels)] += 1
            families[sample.name] += 1
    return kinds, families


def sizes() -> dict[str, int]:
    """How many pods, GPUs and MIG slices the reference node has."""
    host, nvml = presets.reference_gpu_node()
    return {
        "pod": len(host.pods),
        "gpu": len(nvml.gpus),
        "slice": sum(len(g.mig) for g in nvml.gpus),
    }


def totals() -> tuple[int, int]:
    """Series on the reference node: by default, and with --detail."""
    texts = expositions()
    return tuple(sum(bill(texts[detail])[0].values()) for detail in (False, True))


def main() -> None:
    texts = expositions()
    bills = {detail: bill(text) for detail, text in texts.items()}
    (default, default_families), (full, full_families) = bills[False], bills[True]
    total, total_full = sum(default.values()), sum(full.values())
    n = sizes()
    print(
        f"series bill, reference GPU node ({n['pod']} pods, {n['gpu']} GPUs, "
        f"{n['slice']} MIG slices)"
    )
    print(f"{'':<24}{'default':>10}{'--detail':>10}  target")
    verdict = "met" if total <= TARGET else "NOT met"
    print(f"{'series':<24}{total:>10,}{total_full:>10,}  <= {TARGET:,} by default: {verdict}")
    for kind, count in n.items():
        print(f"{'per ' + kind:<24}{default[kind] / count:>10.1f}{full[kind] / count:>10.1f}")
    print(f"{'the node own':<24}{default['node']:>10}{full['node']:>10}")
    print(
        f"{'Prometheus memory, MiB':<24}{total * KIB_PER_SERIES / 1024:>10.1f}"
        f"{total_full * KIB_PER_SERIES / 1024:>10.1f}  (at ~{KIB_PER_SERIES} KiB per series)"
    )
    dynamic = sum(bill(expositions((False,), dynamic_mig=True)[False])[0].values())
    print(
        f"{'under DynamicMIG':<24}{dynamic:>10,}{'':>10}  its 8 GPUs' DRA counters, free "
        f"profiles, mismatches: +{dynamic - total} (+{(dynamic - total) / n['gpu']:.0f} a GPU)"
    )
    print("by family (default / --detail), the largest:")
    for name, n in full_families.most_common(25):
        print(f"  {name:<58}{default_families.get(name, 0):>7}{n:>7}")


if __name__ == "__main__":
    main()
