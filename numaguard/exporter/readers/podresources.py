"""Readers for the kubelet's PodResources answers: protobuf messages -> typed records."""

from __future__ import annotations

from dataclasses import dataclass

from numaguard.exporter.readers import MAX_ID, ParseError


@dataclass(frozen=True, slots=True)
class Devices:
    resource: str  # nvidia.com/gpu, nvidia.com/mig-1g.10gb, ...
    ids: tuple[str, ...]
    numa_nodes: tuple[int, ...]  # empty when the device plugin gave no topology


@dataclass(frozen=True, slots=True)
class ClaimDevice:
    """A device a container got through a DRA ResourceClaim."""

    claim: str  # namespace/name
    driver: str
    pool: str
    device: str
    cdi_devices: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Memory:
    kind: str  # memory, hugepages-1Gi, ...
    size_bytes: int
    numa_nodes: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class ContainerResources:
    name: str
    devices: tuple[Devices, ...]
    exclusive_cpus: frozenset[int]  # empty: the container runs in the shared pool
    memory: tuple[Memory, ...]
    claims: tuple[ClaimDevice, ...]


@dataclass(frozen=True, slots=True)
class PodResources:
    namespace: str
    name: str
    containers: tuple[ContainerResources, ...]


@dataclass(frozen=True, slots=True)
class Allocatable:
    devices: tuple[Devices, ...]
    cpus: frozenset[int]
    memory: tuple[Memory, ...]


def read_list(response) -> tuple[PodResources, ...]:
    """A ListPodResourcesResponse."""
    return tuple(
        PodResources(
            _name(p.namespace, "namespace"),
            _name(p.name, "pod name"),
            tuple(
                ContainerResources(
                    _name(c.name, "container name"),
                    tuple(_devices(d) for d in c.devices),
                    _cpus(c.cpu_ids),
                    tuple(_memory(m) for m in c.memory),
                    tuple(
                        ClaimDevice(
                            f"{r.claim_namespace}/{r.claim_name}",
                            claim.driver_name,
                            claim.pool_name,
                            claim.device_name,
                            tuple(cdi.name for cdi in claim.cdi_devices),
                        )
                        for r in c.dynamic_resources
                        for claim in r.claim_resources
                    ),
                )
                for c in p.containers
            ),
        )
        for p in response.pod_resources
    )


def read_allocatable(response) -> Allocatable:
    """An AllocatableResourcesResponse."""
    return Allocatable(
        tuple(_devices(d) for d in response.devices),
        _cpus(response.cpu_ids),
        tuple(_memory(m) for m in response.memory),
    )


def _devices(d) -> Devices:
    return Devices(d.resource_name, tuple(d.device_ids), _nodes(d.topology))


def _memory(m) -> Memory:
    return Memory(m.memory_type, m.size, _nodes(m.topology))


def _nodes(topology) -> tuple[int, ...]:
    nodes = tuple(sorted({n.ID for n in topology.nodes}))
    if any(not 0 <= n < MAX_ID for n in nodes):
        raise ParseError(f"NUMA node ids out of range: {nodes[:8]}")
    return nodes


def _cpus(ids) -> frozenset[int]:
    cpus = frozenset(ids)
    if any(not 0 <= c < MAX_ID for c in cpus):
        raise ParseError("CPU ids out of range")
    return cpus


def _name(value: str, what: str) -> str:
    if not value:
        raise ParseError(f"empty {what}")
    return value
