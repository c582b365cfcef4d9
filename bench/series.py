"""Benchmark: the series bill — how many series the exporter writes on the reference GPU
node (8 NUMA nodes, 224 CPUs, 150 pods, 8 GPUs x 7 MIG slices, resctrl groups per pod;
the kubelet's PodResources aside), by what they describe: per pod, per GPU, per MIG
slice, and the node's own. ``python -m bench.series``."""

from __future__ import annotations

import asyncio
import tempfile
from collections import Counter
from pathlib import Path

import pynvml
from prometheus_client.parser import text_string_to_metric_families

from numaguard.exporter.collection import Collection
from numaguard.exporter.sources.cgroups import CgroupSource
from numaguard.exporter.sources.gpu import NvmlSource
from numaguard.exporter.sources.host import HostSource
from numaguard.exporter.sources.resctrl import ResctrlSource
from numaguard.simulator import presets
from numaguard.simulator.host import FakeHostRoot
from numaguard.simulator.resctrl import FakeResctrl


def what(labels: dict[str, str]) -> str:
    """The thing a series describes: the most specific of slice, GPU, pod, node."""
    if labels.get("mig_uuid"):
        return "slice"
    if labels.get("gpu_uuid") or labels.get("gpu"):
        return "gpu"
    if labels.get("pod_uid"):
        return "pod"
    return "node"


async def bill() -> tuple[Counter, dict[str, int]]:
    host, nvml = presets.reference_gpu_node()
    with tempfile.TemporaryDirectory() as tmp, nvml.installed():
        root = FakeHostRoot(Path(tmp) / "host", host).write()
        resctrl = FakeResctrl(root.root, host, snc={0: [0, 1, 2, 3], 1: [4, 5, 6, 7]})
        resctrl.write()
        gpus = NvmlSource(pynvml, str(root.root), 5.0)
        gpus.start()
        sources = {
            "host_numa": HostSource(str(root.root)),
            "pod_placement": CgroupSource(str(root.root), page_size=host.page_size),
            "resctrl": ResctrlSource(str(root.root), "read-only", resctrl),
            "gpu": gpus,
        }
        collection = Collection("reference", sources)
        for _ in range(2):  # rates and ratios need a cycle before
            await collection.run_once()
        gpus.close()
        text = collection.exposition.text.decode()
    counts = Counter(
        what(sample.labels)
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    )
    sizes = {
        "pod": len(host.pods),
        "gpu": len(nvml.gpus),
        "slice": sum(len(g.mig) for g in nvml.gpus),
    }
    return counts, sizes


def main() -> None:
    counts, sizes = asyncio.run(bill())
    print(f"series bill, reference GPU node: {sum(counts.values())} series")
    for kind in ("pod", "gpu", "slice"):
        n = sizes[kind]
        print(f"  per {kind}: {counts[kind] / n:.1f} ({counts[kind]} for {n})")
    print(f"  the node's own: {counts['node']}")


if __name__ == "__main__":
    main()
