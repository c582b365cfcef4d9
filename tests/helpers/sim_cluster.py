"""Moves on the simulated cluster: evictions through the real Eviction API, and pods
that fill a GPU or a socket."""

from __future__ import annotations

from numaguard.simulator.cluster.simulated import SimulatedCluster
from numaguard.simulator.fakes import presets
from numaguard.simulator.fakes.host import FakeContainer, FakePod


async def evict(sim: SimulatedCluster, name: str, uid: str | None = None) -> int:
    """Ask the Eviction API (as the admin) to evict ml/``name``; its HTTP status."""
    pod = await sim.cp.get(sim.session, "Pod", "ml", name)
    return await sim.cp.evict(sim.session, "ml", name, uid or pod["metadata"]["uid"])


def hold_gpu3(host, nvml):
    host.pods.append(
        FakePod(
            "hold",
            presets.pod_uid("hold"),
            "guaranteed",
            [
                FakeContainer(
                    "main",
                    "24-25",
                    {0: 1 << 30},
                    exclusive_cpus=True,
                    devices={"nvidia.com/gpu": [nvml.gpus[3].uuid]},
                )
            ],
            "ml",
        )
    )


def busy_socket1(host, nvml):
    """Socket 1 keeps its GPU 7 free but has only 2 free CPUs."""
    host.pods.append(
        FakePod(
            "busy",
            presets.pod_uid("busy"),
            "guaranteed",
            [FakeContainer("main", "42-61", {1: 1 << 30}, exclusive_cpus=True)],
            "ml",
        )
    )
