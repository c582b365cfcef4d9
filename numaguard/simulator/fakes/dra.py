"""NVIDIA's DRA driver, as far as the API server sees it: the ResourceSlice it publishes
for a node's GPUs (driver ``gpu.nvidia.com``, one pool named after the node, a device
per GPU named ``gpu-<minor>`` and per MIG slice ``gpu-<minor>-mig-<profile id>-<start>-
<size>``, with the attributes the driver sets: ``type``, ``uuid``, ``parentUUID``,
``profile``, ``productName``, ``pcieBusID``), and the DeviceClass its chart installs.
"""

from __future__ import annotations

from numaguard.exporter.readers.dra import DraView, read_resource_slice
from numaguard.simulator.fakes.nvml import FakeGpu, FakeNvml, FakeSlice

DRIVER = "gpu.nvidia.com"
API = "resource.k8s.io/v1"


def device_name(index: int, unit: FakeGpu | FakeSlice) -> str:
    if isinstance(unit, FakeGpu):
        return f"gpu-{index}"
    size = unit.profile.memory_slices
    return f"gpu-{index}-mig-{unit.profile.id}-{unit.placement_start}-{size}"


def _device(index: int, gpu: FakeGpu, unit: FakeGpu | FakeSlice) -> dict:
    def text(value: str) -> dict:
        return {"string": value}

    attributes = {
        "uuid": text(unit.uuid),
        "productName": text(gpu.model.name),
        "pcieBusID": text(gpu.pci_bus_id),
    }
    if isinstance(unit, FakeSlice):
        attributes |= {
            "type": text("mig"),
            "parentUUID": text(gpu.uuid),
            "profile": text(unit.profile.name),
        }
    else:
        attributes["type"] = text("gpu")
    return {"name": device_name(index, unit), "attributes": attributes}


def resource_slice(node_name: str, nvml: FakeNvml, gpus: list[int]) -> dict:
    """The ResourceSlice for the GPUs of ``gpus`` (indices): the whole GPU when MIG is
    off, its slices when on."""
    devices = []
    for index in gpus:
        gpu = nvml.gpus[index]
        for unit in [gpu] if gpu.mig is None else gpu.mig:
            devices.append(_device(index, gpu, unit))
    return {
        "apiVersion": API,
        "kind": "ResourceSlice",
        "metadata": {"name": f"{node_name}-{DRIVER}"},
        "spec": {
            "driver": DRIVER,
            "nodeName": node_name,
            "pool": {"name": node_name, "generation": 1, "resourceSliceCount": 1},
            "devices": devices,
        },
    }


def device_class() -> dict:
    return {
        "apiVersion": API,
        "kind": "DeviceClass",
        "metadata": {"name": DRIVER},
        "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{DRIVER}"'}}]},
    }


def claim_object(namespace: str, name: str) -> dict:
    """A ResourceClaim for one of the driver's devices (its allocation is the status)."""
    request = {"deviceClassName": DRIVER}
    return {
        "apiVersion": API,
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": request}]}},
    }


def allocation(node_name: str, device: str) -> dict:
    """The status the scheduler gives a claim it allocated ``device`` of the node to."""
    result = {"request": "gpu", "driver": DRIVER, "pool": node_name, "device": device}
    return {"allocation": {"devices": {"results": [result]}}}


def view(node_name: str, nvml: FakeNvml, gpus: list[int], allocations=None) -> DraView:
    """What the exporter's watch makes of the node's slice (for tests without an API
    server)."""
    devices = read_resource_slice(resource_slice(node_name, nvml, gpus))
    return DraView({(d.driver, d.pool, d.name): d for d in devices}, allocations or {})
