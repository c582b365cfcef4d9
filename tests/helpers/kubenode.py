"""The real node's kubelet and exporter as the tests reach them: its PodResources socket
and a scrape of the exporter in the guest."""

from __future__ import annotations

from numaguard.simulator.parts.processes import get, until
from numaguard.simulator.parts.vm_kubelet import (
    KubeNode,
)
from tests.conftest import samples

NS = "vm-test"


SLICE = "1g.10gb"


# the guest's own view of its NUMA pages, read together
NUMASTAT = (
    "for n in /sys/devices/system/node/node[0-9]*; do echo ${n##*node} $(cat $n/numastat); done"
)


def numastat(text: str) -> dict[str, dict[str, int]]:
    out = {}
    for line in text.splitlines():
        node, *fields = line.split()
        out[node] = {k: int(v) for k, v in zip(fields[::2], fields[1::2], strict=True)}
    return out


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
