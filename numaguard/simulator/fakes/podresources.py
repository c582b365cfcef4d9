"""A fake kubelet serving the real PodResources v1 gRPC API on a unix socket.

It answers ``List``, ``GetAllocatableResources`` and ``Get`` from a FakeHost (what each
container was given: exclusive CPUs, device plugin devices, DRA claim devices) and a
FakeNvml (the GPUs and slices a device plugin would advertise, with their NUMA nodes).
It can be slowed down, made to fail, stopped and started again on the same socket, as
a kubelet restart does.
"""

from __future__ import annotations

import asyncio
import os

import grpc

from numaguard.exporter.readers import parse_id_list
from numaguard.exporter.sources.podresources import api_pb2 as pb
from numaguard.exporter.sources.podresources import api_pb2_grpc
from numaguard.simulator.fakes.host import FakeHost
from numaguard.simulator.fakes.nvml import FakeNvml


class FakeKubelet(api_pb2_grpc.PodResourcesListerServicer):
    def __init__(self, socket_path: str, host: FakeHost, nvml: FakeNvml | None = None) -> None:
        self.socket_path = socket_path
        self.host = host
        self.nvml = nvml
        self.delay = 0.0  # seconds before each answer
        self.fail: grpc.StatusCode | None = None  # answer this status instead
        self.allocatable_implemented = True  # False: a kubelet older than 1.23
        self.calls = 0
        self._server: grpc.aio.Server | None = None

    async def start(self) -> FakeKubelet:
        if os.path.exists(self.socket_path):
            os.unlink(self.socket_path)  # what a restarting kubelet does
        self._server = grpc.aio.server()
        api_pb2_grpc.add_PodResourcesListerServicer_to_server(self, self._server)
        self._server.add_insecure_port(f"unix://{self.socket_path}")
        await self._server.start()
        return self

    async def stop(self) -> None:
        if self._server is not None:
            await self._server.stop(grace=None)
            self._server = None
        if os.path.exists(self.socket_path):
            os.unlink(self.socket_path)

    # -- the service ------------------------------------------------------------------

    async def List(self, request, context):
        await self._answering(context)
        return pb.ListPodResourcesResponse(pod_resources=[self._pod(p) for p in self.host.pods])

    async def GetAllocatableResources(self, request, context):
        await self._answering(context)
        if not self.allocatable_implemented:
            await context.abort(grpc.StatusCode.UNIMPLEMENTED, "unknown method")
        memory = [
            pb.ContainerMemory(
                memory_type="memory",
                size=n.memory_total_bytes,
                topology=_topology([i]),
            )
            for i, n in enumerate(self.host.nodes)
        ]
        return pb.AllocatableResourcesResponse(
            devices=self._advertised(),
            cpu_ids=sorted(self.host.all_cpus - self.host.reserved_cpus),
            memory=memory,
        )

    async def Get(self, request, context):
        await self._answering(context)
        for p in self.host.pods:
            if (p.namespace, p.name) == (request.pod_namespace, request.pod_name):
                return pb.GetPodResourcesResponse(pod_resources=self._pod(p))
        await context.abort(grpc.StatusCode.NOT_FOUND, "pod not found")

    async def _answering(self, context) -> None:
        self.calls += 1
        if self.delay:
            await asyncio.sleep(self.delay)
        if self.fail is not None:
            await context.abort(self.fail, "injected failure")

    # -- what it says -----------------------------------------------------------------

    def _pod(self, pod) -> pb.PodResources:
        containers = []
        for c in pod.containers:
            devices = [
                pb.ContainerDevices(
                    resource_name=resource, device_ids=ids, topology=_topology(self._numa(ids))
                )
                for resource, ids in c.devices.items()
            ]
            claims = [
                pb.DynamicResource(
                    claim_name=claim.claim,
                    claim_namespace=pod.namespace,
                    claim_resources=[
                        pb.ClaimResource(
                            driver_name=claim.driver,
                            pool_name=claim.pool,
                            device_name=claim.device,
                            cdi_devices=[pb.CDIDevice(name=f"k8s.{claim.driver}/{claim.device}")],
                        )
                    ],
                )
                for claim in c.claims
            ]
            containers.append(
                pb.ContainerResources(
                    name=c.name,
                    devices=devices,
                    cpu_ids=sorted(parse_id_list(c.cpus)) if c.exclusive_cpus else [],
                    memory=[
                        pb.ContainerMemory(
                            memory_type="memory",
                            size=sum(c.memory_by_node.values()),
                            topology=_topology(c.memory_pinned),
                        )
                    ]
                    if c.memory_pinned
                    else [],
                    dynamic_resources=claims,
                )
            )
        return pb.PodResources(name=pod.name, namespace=pod.namespace, containers=containers)

    def _advertised(self) -> list[pb.ContainerDevices]:
        """What the NVIDIA device plugin (mixed strategy) advertises: whole GPUs with MIG
        off as nvidia.com/gpu, slices as nvidia.com/mig-<profile>; not the GPUs a DRA
        driver manages."""
        out = []
        claimed = {claim.device for p in self.host.pods for c in p.containers for claim in c.claims}
        for index, gpu in enumerate(self.nvml.gpus if self.nvml else []):
            if f"gpu-{index}" in claimed:
                continue  # a GPU handed out by DRA is not the device plugin's
            units = (
                [("nvidia.com/gpu", gpu.uuid)]
                if gpu.mig is None
                else [(f"nvidia.com/mig-{s.profile.name}", s.uuid) for s in gpu.mig]
            )
            for resource, uuid in units:
                out.append(
                    pb.ContainerDevices(
                        resource_name=resource,
                        device_ids=[uuid],
                        topology=_topology([gpu.numa_node]),
                    )
                )
        return out

    def _numa(self, ids: list[str]) -> list[int]:
        nodes = set()
        for gpu in self.nvml.gpus if self.nvml else []:
            if gpu.uuid in ids or any(s.uuid in ids for s in gpu.mig or []):
                nodes.add(gpu.numa_node)
        return sorted(nodes)


def _topology(nodes: list[int]) -> pb.TopologyInfo:
    return pb.TopologyInfo(nodes=[pb.NUMANode(ID=n) for n in nodes])


async def _serve(socket_path: str, preset: str) -> None:
    from numaguard.simulator.fakes import presets

    host, nvml = presets.PRESETS[preset]()
    kubelet = await FakeKubelet(socket_path, host, nvml).start()
    print("ready", flush=True)
    try:
        await asyncio.Event().wait()
    finally:
        await kubelet.stop()


if __name__ == "__main__":
    import argparse

    p = argparse.ArgumentParser(description="Serve a preset GPU node's PodResources.")
    p.add_argument("socket")
    p.add_argument("--preset", default="gpu_node", choices=("gpu_node", "reference_gpu_node"))
    args = p.parse_args()
    asyncio.run(_serve(args.socket, args.preset))
