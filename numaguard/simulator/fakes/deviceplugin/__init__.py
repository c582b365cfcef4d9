"""A device plugin on the kubelet's real device plugin API (v1beta1, ``api.proto``), for
the node VM: it advertises the GPUs of a fake GPU node with their NUMA nodes as NVIDIA's
device plugin does under its ``mixed`` MIG strategy — a GPU with MIG off as
``nvidia.com/gpu`` (its UUID), each MIG slice as ``nvidia.com/mig-<profile>`` (its MIG
UUID), one registration per resource — so that the real kubelet's device manager and
Topology Manager allocate them. ``python -m numaguard.simulator.fakes.deviceplugin GPUS.json``
runs it beside a kubelet; GPUS.json is the fake NVML's description (simulator/fakes/nvml.py),
so the exporter's fake GPUs and the kubelet's devices are the same ones.

Like NVIDIA's plugin it registers again whenever the kubelet restarts (the kubelet
removes every socket in its device-plugins directory when it starts)."""

from __future__ import annotations

import asyncio
import json
import os
from dataclasses import dataclass

import grpc

from numaguard.contract.names import mig_resource
from numaguard.simulator.fakes.deviceplugin import api_pb2 as api
from numaguard.simulator.fakes.deviceplugin import api_pb2_grpc as rpc
from numaguard.simulator.fakes.nvml import FakeNvml

DIRECTORY = "/var/lib/kubelet/device-plugins"
KUBELET_SOCKET = "kubelet.sock"
RESOURCE = "nvidia.com/gpu"


@dataclass(frozen=True)
class Device:
    id: str  # the GPU's UUID, or the MIG slice's, as NVIDIA's plugin names them
    numa_node: int


def devices_of(description: str) -> dict[str, list[Device]]:
    """The devices of a fake NVML description, by the resource they are offered as."""
    out: dict[str, list[Device]] = {}
    for g in FakeNvml.from_description(description).gpus:
        if g.mig is None:
            out.setdefault(RESOURCE, []).append(Device(g.uuid, g.numa_node))
        for s in g.mig or []:
            out.setdefault(mig_resource(s.profile.name), []).append(Device(s.uuid, g.numa_node))
    return out


def endpoint(resource: str) -> str:
    """The plugin's socket for ``resource``, in the kubelet's device-plugins directory."""
    return f"numaguard-{resource.split('/')[-1]}.sock"


class Plugin(rpc.DevicePluginServicer):
    def __init__(self, devices: list[Device]) -> None:
        self.devices = devices

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
        """The devices it must take, then the available ones in the order advertised:
        deterministic, so that a test knows which GPU a pod gets where the kubelet's
        Topology Manager leaves the choice to the plugin."""
        order = {d.id: i for i, d in enumerate(self.devices)}
        responses = []
        for r in request.container_requests:
            chosen = list(r.must_include_deviceIDs)
            for device in sorted(r.available_deviceIDs, key=lambda i: order.get(i, len(order))):
                if len(chosen) >= r.allocation_size:
                    break
                if device not in chosen:
                    chosen.append(device)
            responses.append(api.ContainerPreferredAllocationResponse(deviceIDs=chosen))
        return api.PreferredAllocationResponse(container_responses=responses)

    async def Allocate(self, request, context):
        responses = []
        for r in request.container_requests:
            env = {"NVIDIA_VISIBLE_DEVICES": ",".join(r.devices_ids)}
            responses.append(api.ContainerAllocateResponse(envs=env))
        return api.AllocateResponse(container_responses=responses)

    async def PreStartContainer(self, request, context):
        return api.PreStartContainerResponse()


async def serve(devices: dict[str, list[Device]], directory: str = DIRECTORY) -> None:
    """A plugin for each resource, until cancelled."""
    await asyncio.gather(*(serve_one(r, d, directory) for r, d in devices.items()))


async def serve_one(resource: str, devices: list[Device], directory: str) -> None:
    """Serve and register, and again each time the kubelet comes back; until cancelled."""
    kubelet = os.path.join(directory, KUBELET_SOCKET)
    mine = os.path.join(directory, endpoint(resource))
    plugin = Plugin(devices)
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
        devices = devices_of(f.read())
    print(json.dumps({r: [vars(d) for d in ds] for r, ds in devices.items()}), flush=True)
    asyncio.run(serve(devices))
