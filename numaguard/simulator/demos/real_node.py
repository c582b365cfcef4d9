"""``make demo-node``: the remediation loop on a real node.

A real control plane (API server, controllers, scheduler) and one node in a QEMU guest:
Debian's kernel with two sockets and two NUMA nodes, the kubelet built from the pinned
Kubernetes module (static CPU manager, each story's Topology Manager policy),
containerd and runc; the exporter in the node reading the real kernel and kubelet; a
real Prometheus scraping it; the remediator acting live, as its ServiceAccount. Six
stories (simulator/demos/node_stories.py, gpu_story.py), each printing what the real kubelet
did: a split pod fixed under best-effort, a replacement that comes back split under none
until the remediator gives up, a pod's remote memory fixed under single-numa-node by an
eviction and then, with the exporter's memory mover on, in place, pods the kubelet
refuses under single-numa-node cleaned up, and a 2-GPU pod without P2P given the free
NVLink pair by the kubelet and the device plugin.
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from pathlib import Path

from numaguard.common import logs
from numaguard.simulator.demos.gpu_story import linked
from numaguard.simulator.demos.node_stories import (
    fixed,
    misaligned_again,
    moved_home,
    moved_in_place,
    node_loop,
    refused,
)


async def main() -> None:
    started = time.monotonic()
    # a short directory: the guest mounts it, and the kubelet's sockets live under it
    with tempfile.TemporaryDirectory(prefix="ng-node-", dir="/tmp") as job:
        print("booting the node VM and its kubelet (about a minute under emulation)...")
        async with node_loop(Path(job)) as loop:
            print(
                f"a real control plane ({loop.cp.url}), node {loop.node.name} Ready in "
                f"{time.monotonic() - started:.0f}s: 2 sockets x 4 CPUs, CPU 0 the "
                f"system's; its exporter {loop.node.exporter_url}/metrics, Prometheus "
                f"{loop.prom.url}\n",
                flush=True,
            )
            for story in (fixed, misaligned_again, moved_home, moved_in_place, refused, linked):
                began = time.monotonic()
                told = await story(loop)
                print("\n".join(told.said))
                print(f"  ({time.monotonic() - began:.0f}s)\n", flush=True)
    print(f"demo finished in {time.monotonic() - started:.0f}s")


def cli() -> None:
    argparse.ArgumentParser(description=__doc__).parse_args()
    logs.setup("text", "error")
    asyncio.run(main())


if __name__ == "__main__":
    cli()
