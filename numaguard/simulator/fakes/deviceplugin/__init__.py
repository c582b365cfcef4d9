"""A device plugin on the kubelet's real device plugin API (v1beta1, ``api.proto``), for
the node VM: it advertises the GPUs of a fake GPU node with their NUMA nodes as NVIDIA's
device plugin does under its ``mixed`` MIG strategy — a GPU with MIG off as
``nvidia.com/gpu`` (its UUID), each MIG slice as ``nvidia.com/mig-<profile>`` (its MIG
UUID), one registration per resource — so that the real kubelet's device manager and
Topology Manager allocate them. ``python -m numaguard.simulator.fakes.deviceplugin GPUS.json``
runs it beside a kubelet; GPUS.json is the fake NVML's description (simulator/fakes/nvml.py),
so the exporter's fake GPUs and the kubelet's devices are the same ones.

Like NVIDIA's plugin it registers again whenever the kubelet restarts (the kubelet
removes every socket in its device-plugins directory when it starts), and it prefers
full GPUs as NVIDIA's does (go-gpuallocator's best-effort policy: gpu_allocator.py);
slices, for which NVIDIA's turns that off, in the order advertised."""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Callable
from dataclasses import dataclass

import grpc

from numaguard.contract.names import mig_resource
from numaguard.simulator.fakes.deviceplugin import api_pb2 as api
from numaguard.simulator.fakes.deviceplugin import api_pb2_grpc as rpc
from numaguard.simulator.fakes.gpu_allocator import best_effort, pair_scores
from numaguard.simulator.fakes.nvml import FakeNvml

DIRECTORY = "/var/lib/kubelet/device-plugins"
KUBELET_SOCKET = "kubelet.sock"
RESOURCE = "nvidia.com/gpu"


@dataclass(frozen=True)
class Device:
    id: str  # the GPU's UUID, or the MIG slice's, as NVIDIA's plugin names them
    numa_node: int
    gpu: int | None = None  # a full GPU's index (its links are scored by it)


def devices_of(description: str) -> dict[str, list[Device]]:
    """The devices of a fake NVML description, by the resource they are offered as."""
    out: dict[str, list[Device]] = {}
    for i, g in enumerate(FakeNvml.from_description(description).gpus):
        if g.mig is None:
            out.setdefault(RESOURCE, []).append(Device(g.uuid, g.numa_node, i))
        for s in g.mig or []:
            out.setdefault(mig_resource(s.profile.name), []).append(Device(s.uuid, g.numa_node))
    return out


def endpoint(resource: str) -> str:
    """The plugin's socket for ``resource``, in the kubelet's device-plugins directory."""
    return f"numaguard-{resource.split('/')[-1]}.sock"


class Plugin(rpc.DevicePluginServicer):
    def __init__(self, devices: list[Device], score: Callable[[int, int], int] | None = None):
        self.devices = devices
        self.score = score  # of a pair of full GPUs, by index; None: in advertised order

    async def GetDevicePluginOptions(self, request, context):
        return api.DevicePluginOptions(get_preferred_allocation_available=True)

    async def ListAndWatch(self, request, context):
        yield api.ListAndWatchResponse(
            devices=[
                api.Device(
                    ID=d.id,
                    health="Healthy",
                    topology=api.TopologyInfo(nodes=[api.NUMANode(ID=d.numa_node)]),
                )
                for d in self.devices
            ]
        )
        await asyncio.Event().wait()  # the devices never change; the kubelet hangs up

    async def GetPreferredAllocation(self, request, context):
        """Full GPUs: go-gpuallocator's best-effort choice among those available. Slices:
        the devices it must take, then the available ones in the order advertised."""
        responses = [
            api.ContainerPreferredAllocationResponse(
                deviceIDs=self.preferred(
                    list(r.available_deviceIDs), list(r.must_include_deviceIDs), r.allocation_size
                )
            )
            for r in request.container_requests
        ]
        return api.PreferredAllocationResponse(container_responses=responses)

    def preferred(self, available: list[str], required: list[str], size: int) -> list[str]:
        order = {d.id: i for i, d in enumerate(self.devices)}
        available = sorted(available, key=lambda i: order.get(i, len(order)))
        gpu = {d.id: d.gpu for d in self.devices if d.gpu is not None}
        if self.score is not None and all(i in gpu for i in [*available, *required]):
            ids = {gpu[i]: i for i in [*available, *required]}
            indices = [gpu[i] for i in available]
            chosen = best_effort(indices, [gpu[i] for i in required], size, self.score)
            return [ids[g] for g in chosen]
        chosen = list(required)
        for device in available:
            if len(chosen) >= size:
                break
            if device not in chosen:
                chosen.append(device)
        return chosen

    async def Allocate(self, request, context):
        responses = []
        for r in request.container_requests:
            env = {"NVIDIA_VISIBLE_DEVICES": ",".join(r.devices_ids)}
            responses.append(api.ContainerAllocateResponse(envs=env))
        return api.AllocateResponse(container_responses=responses)

    async def PreStartContainer(self, request, context):
        return api.PreStartContainerResponse()


async def serve(devices: dict[str, list[Device]], directory: str = DIRECTORY, score=None) -> None:
    """A plugin for each resource, until cancelled; ``score``: of a pair of full GPUs."""
    await asyncio.gather(
        *(serve_one(r, d, directory, score if r == RESOURCE else None) for r, d in devices.items())
    )


async def serve_one(resource: str, devices: list[Device], directory: str, score=None) -> None:
    """Serve and register, and again each time the kubelet comes back; until cancelled."""
    kubelet = os.path.join(directory, KUBELET_SOCKET)
    mine = os.path.join(directory, endpoint(resource))
    plugin = Plugin(devices, score)
    while True:
        while not os.path.exists(kubelet):
            await asyncio.sleep(0.5)
        seen = os.stat(kubelet).st_ino
        if os.path.exists(mine):
            os.unlink(mine)
        server = grpc.aio.server()
        rpc.add_DevicePluginServicer_to_server(plugin, server)
        server.add_insecure_port(f"unix://{mine}")
        await server.start()
        try:
            async with grpc.aio.insecure_channel(f"unix://{kubelet}") as channel:
                await rpc.RegistrationStub(channel).Register(
                    api.RegisterRequest(
                        version="v1beta1",
                        endpoint=endpoint(resource),
                        resource_name=resource,
                        options=api.DevicePluginOptions(get_preferred_allocation_available=True),
                    ),
                    timeout=30,
                )
            print(f"registered {len(devices)} {resource} with the kubelet", flush=True)
            # a new kubelet makes a new socket (and removes ours): register with it
            while _inode(kubelet) == seen and os.path.exists(mine):
                await asyncio.sleep(0.5)
        except grpc.aio.AioRpcError as err:
            print(f"{resource}: registration failed, trying again: {err.details()}", flush=True)
            await asyncio.sleep(1)
        finally:
            await server.stop(None)


def _inode(path: str) -> int | None:
    try:
        return os.stat(path).st_ino
    except OSError:
        return None


def main(path: str) -> None:
    with open(path) as f:
        description = f.read()
    devices = devices_of(description)
    print(json.dumps({r: [vars(d) for d in ds] for r, ds in devices.items()}), flush=True)
    asyncio.run(serve(devices, score=pair_scores(FakeNvml.from_description(description))))
