"""The reference node's whole exposition (docs/design.md: 8 NUMA nodes, 8 GPUs of 7 MIG
slices, its kubelet and resctrl), as its exporter serves it by default after two
cycles, with what differs run to run masked: what the test compares with the file beside
this one, so that every change to a metric shows in review.

Regenerate with ``make golden`` (``python -m tests.golden.reference``)."""

from __future__ import annotations

import asyncio
import re
import sys
import tempfile
from pathlib import Path

import pynvml

from numaguard.exporter.collection import Collection
from numaguard.exporter.sources.cgroups import CgroupSource
from numaguard.exporter.sources.gpu import NvmlSource
from numaguard.exporter.sources.host import HostSource
from numaguard.exporter.sources.kubelet import PodResourcesSource
from numaguard.exporter.sources.resctrl import ResctrlSource
from numaguard.simulator import presets
from numaguard.simulator.host import FakeHostRoot, pod_metadata
from numaguard.simulator.kubelet import FakeKubelet
from numaguard.simulator.resctrl import FakeResctrl

GOLDEN = Path(__file__).with_name("reference-node.prom")
INTERVAL = 15.0  # seconds between the two cycles, as the exporter's default
# the samples whose values are the run's, not the node's: how long things took, when
MASKED = re.compile(
    r"^(numaguard_\w*_(duration_seconds|timestamp_seconds)|process_\w+|python_gc_\w+)(\{.*\})? "
)


class StepClock:
    """Monotonic time that moves only when told: the two cycles are INTERVAL apart."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


async def _exposition(tmp: str) -> str:
    clock = StepClock()
    host, nvml = presets.reference_gpu_node(clock)
    FakeHostRoot(tmp, host).write()
    kernel = FakeResctrl(tmp, host, snc={0: [0, 1, 2, 3], 1: [4, 5, 6, 7]}).write()
    kubelet = await FakeKubelet(f"{tmp}/kubelet.sock", host, nvml).start()
    pod_resources = PodResourcesSource(f"{tmp}/kubelet.sock")
    names = pod_metadata(host)
    with nvml.installed():
        gpus = NvmlSource(pynvml, tmp, clock=clock)
        gpus.start()
        collection = Collection(
            "reference",
            {
                "host_numa": HostSource(tmp),
                "pod_placement": CgroupSource(tmp, page_size=4096),
                "resctrl": ResctrlSource(tmp, "manage", kernel),
                "gpu": gpus,
                "pod_resources": pod_resources,
            },
            metadata=lambda: names,
            clock=clock,
        )
        try:
            await collection.run_once()
            clock.now += INTERVAL
            await collection.run_once()
            return collection.exposition.text.decode()
        finally:
            pod_resources.close()
            gpus.close()
            await kubelet.stop()


def masked(text: str) -> str:
    """The exposition with the run's own values (durations, times, the process's) masked."""
    return "".join(
        (m[0] + "<masked>\n" if (m := MASKED.match(line)) else line + "\n")
        for line in text.splitlines()
    )


def reference_exposition() -> str:
    with tempfile.TemporaryDirectory() as tmp:
        return masked(asyncio.run(_exposition(tmp)))


if __name__ == "__main__":
    GOLDEN.write_text(reference_exposition())
    print(f"wrote {GOLDEN}", file=sys.stderr)
