"""NVIDIA's DRA driver, as far as the API server sees it: the ResourceSlices it publishes
for a node's GPUs (driver ``gpu.nvidia.com``, one pool named after the node), and the
DeviceClasses its chart installs.

Two driver generations: up to v25.8 a MIG device is ``gpu-<minor>-mig-<profile id>-
<start>-<size>`` with the attribute ``pcieBusID``; from v25.12 it is ``gpu-<minor>-mig-
<profile without dots>-<profile id>-<start>`` with ``resource.kubernetes.io/pciBusID``
and ``numaNode``, and a static slice has capacities ``memorySlice<i>``. Static MIG
publishes the slices that exist (the whole GPU with MIG off); DynamicMIG (v25.12 on)
publishes per GPU a counter set ``gpu-<minor>-counter-set`` (the largest profile's
multiprocessors and memory, and ``memory-slice-<i>`` = 1 each) and every placement of
every profile as a device consuming its share, a UUID only on those made. From
Kubernetes 1.35 the counter sets go in a slice of their own; the devices, one slice per
GPU (at most 128 devices a slice).
"""

from __future__ import annotations

from collections.abc import Iterable

from numaguard.exporter.readers.dra import DraView, dra_view, read_resource_slice
from numaguard.simulator.fakes.gpu_models import Profile
from numaguard.simulator.fakes.nvml import FakeGpu, FakeNvml, FakeSlice

DRIVER = "gpu.nvidia.com"
API = "resource.k8s.io/v1"
MIG_CLASS = "mig.nvidia.com"


def mig_name(index: int, profile: Profile, start: int, generation: str = "v25.12") -> str:
    if generation == "v25.8":
        return f"gpu-{index}-mig-{profile.id}-{start}-{profile.memory_slices}"
    return f"gpu-{index}-mig-{profile.name.replace('.', '')}-{profile.id}-{start}"


def device_name(index: int, unit: FakeGpu | FakeSlice, generation: str = "v25.12") -> str:
    if isinstance(unit, FakeGpu):
        return f"gpu-{index}"
    return mig_name(index, unit.profile, unit.placement_start, generation)


class NotPrepared(Exception):
    """The kubelet plugin could not prepare a claim: the pod does not start."""


def prepare(nvml: FakeNvml, device: str) -> tuple[int, FakeGpu | FakeSlice, bool] | None:
    """What the driver's kubelet plugin does when a claim allocated ``device`` (a
    v25.12 name) is prepared: (GPU index, the GPU or the MIG slice at that placement,
    whether it was made now, under DynamicMIG). None: not a device of this node's GPUs;
    NotPrepared when the placement is another instance's."""
    for index, gpu in enumerate(nvml.gpus):
        if device == f"gpu-{index}":
            return index, gpu, False
        for profile in gpu.model.profiles:
            for start in profile.placements:
                if device != mig_name(index, profile, start):
                    continue
                there = next((s for s in gpu.mig or [] if s.placement_start == start), None)
                if there is not None and there.profile == profile:
                    return index, there, False
                if gpu.mig is None:
                    nvml.set_mig(index, [])  # the driver turns MIG mode on
                try:
                    return index, nvml.make_slice(index, profile.name, start), True
                except ValueError as err:  # another instance holds those memory slices
                    raise NotPrepared(f"{device}: {err}") from None
    return None


def counter_set(index: int) -> str:
    return f"gpu-{index}-counter-set"


def _text(value: str) -> dict:
    return {"string": value}


def _attributes(gpu: FakeGpu, generation: str) -> dict:
    if generation == "v25.8":
        return {"productName": _text(gpu.model.name), "pcieBusID": _text(gpu.pci_bus_id)}
    return {
        "productName": _text(gpu.model.name),
        "resource.kubernetes.io/pciBusID": _text(gpu.pci_bus_id.lower()[4:]),
        "resource.kubernetes.io/numaNode": {"int": gpu.numa_node},
    }


# The engine counters the driver publishes besides multiprocessors and memory. Their
# amounts here stand in (a profile's compute slices: they bind no more than its
# multiprocessors do); their names and number are the driver's.
_ENGINES = ("copy-engines", "decoders", "encoders", "jpeg-engines", "ofa-engines")


def _share(profile: Profile, start: int) -> dict:
    """What a GPU instance of ``profile`` at ``start`` takes of its GPU's counters."""
    counters = {"multiprocessors": profile.sm_count, "memory": f"{profile.memory_mib}Mi"}
    counters |= dict.fromkeys(_ENGINES, int(profile.name.split("g.")[0]))
    slices = range(start, start + profile.memory_slices)
    return {k: {"value": str(v)} for k, v in counters.items()} | {
        f"memory-slice-{i}": {"value": "1"} for i in slices
    }


def _mig_device(index: int, gpu: FakeGpu, profile: Profile, start: int, generation: str) -> dict:
    made = next(
        (s for s in gpu.mig or [] if s.profile == profile and s.placement_start == start), None
    )
    attributes = _attributes(gpu, generation) | {
        "type": _text("mig"),
        "parentUUID": _text(gpu.uuid),
        "profile": _text(profile.name),
    }
    if made is not None:
        attributes["uuid"] = _text(made.uuid)
    return {"name": mig_name(index, profile, start, generation), "attributes": attributes}


def _whole(index: int, gpu: FakeGpu, generation: str) -> dict:
    attributes = _attributes(gpu, generation) | {"type": _text("gpu"), "uuid": _text(gpu.uuid)}
    return {"name": f"gpu-{index}", "attributes": attributes}


def static_devices(index: int, gpu: FakeGpu, generation: str) -> list[dict]:
    """The GPU (MIG off) or the slices made on it."""
    if gpu.mig is None:
        return [_whole(index, gpu, generation)]
    devices = []
    for s in gpu.mig:
        device = _mig_device(index, gpu, s.profile, s.placement_start, generation)
        if generation != "v25.8":
            device["capacity"] = {
                f"memorySlice{i}": {"value": "1"}
                for i in range(s.placement_start, s.placement_start + s.profile.memory_slices)
            }
        devices.append(device)
    return devices


def dynamic_devices(index: int, gpu: FakeGpu) -> list[dict]:
    """The whole GPU and every placement of every profile, each consuming its share of
    the GPU's counter set (the whole GPU all of it)."""
    whole = _whole(index, gpu, "v25.12")
    whole["consumesCounters"] = [{"counterSet": counter_set(index), "counters": _all(gpu)}]
    devices = [whole]
    for profile in gpu.model.profiles:
        for start in profile.placements:
            device = _mig_device(index, gpu, profile, start, "v25.12")
            share = _share(profile, start)
            device["capacity"] = {k: share[k] for k in ("multiprocessors", "memory")}
            device["consumesCounters"] = [{"counterSet": counter_set(index), "counters": share}]
            devices.append(device)
    return devices


def _all(gpu: FakeGpu) -> dict:
    """The GPU's counters: its largest profile's share, every memory slice."""
    return _share(max(gpu.model.profiles, key=lambda p: p.memory_slices), 0)


def counters_of(index: int, gpu: FakeGpu) -> dict:
    return {"name": counter_set(index), "counters": _all(gpu)}


def _slice(node_name: str, name: str, count: int, generation: int, **spec) -> dict:
    return {
        "apiVersion": API,
        "kind": "ResourceSlice",
        "metadata": {"name": name},
        "spec": {
            "driver": DRIVER,
            "nodeName": node_name,
            "pool": {"name": node_name, "generation": generation, "resourceSliceCount": count},
            **spec,
        },
    }


def resource_slices(
    node_name: str,
    nvml: FakeNvml,
    gpus: list[int],
    *,
    generation: str = "v25.12",
    dynamic: bool | Iterable[int] = False,
    split: bool = True,
    pool_generation: int = 1,
) -> list[dict]:
    """The node's slices for the GPUs of ``gpus`` (indices), DynamicMIG on those
    ``dynamic`` names (all of them: True) or whose ``dynamic_mig`` is set. Static only:
    one slice of what exists. Dynamic (v25.12 on): ``split`` (Kubernetes 1.35 on) one
    slice of the counter sets and one of devices per GPU, else one slice per GPU holding
    both."""
    on = {i for i in gpus if dynamic is True or i in (dynamic or ()) or nvml.gpus[i].dynamic_mig}
    if not on:
        devices = [d for i in gpus for d in static_devices(i, nvml.gpus[i], generation)]
        name = f"{node_name}-{DRIVER}"
        return [_slice(node_name, name, 1, pool_generation, devices=devices)]
    if generation == "v25.8":
        raise ValueError("DynamicMIG came with driver v25.12")
    counted = len(gpus) + 1 if split else len(gpus)
    slices = []
    if split:
        sets = [counters_of(i, nvml.gpus[i]) for i in gpus if i in on]
        name = f"{node_name}-{DRIVER}-counters"
        slices.append(_slice(node_name, name, counted, pool_generation, sharedCounters=sets))
    for i in gpus:
        if i not in on:
            spec = {"devices": static_devices(i, nvml.gpus[i], generation)}
        else:
            spec = {"devices": dynamic_devices(i, nvml.gpus[i])}
        if not split and i in on:
            spec["sharedCounters"] = [counters_of(i, nvml.gpus[i])]
        name = f"{node_name}-{DRIVER}-gpu-{i}"
        slices.append(_slice(node_name, name, counted, pool_generation, **spec))
    return slices


def resource_slice(node_name: str, nvml: FakeNvml, gpus: list[int], generation="v25.12") -> dict:
    """The one static ResourceSlice for the GPUs of ``gpus``: the whole GPU when MIG is
    off, its slices when on."""
    (only,) = resource_slices(node_name, nvml, gpus, generation=generation)
    return only


def device_class(name: str = DRIVER, kind: str = "", extended_resource: str = "") -> dict:
    """The chart's DeviceClass: every device of the driver, or of one ``type`` (gpu or
    mig); ``extended_resource``: pods asking for it get a claim made for them."""
    expression = f'device.driver == "{DRIVER}"'
    if kind:
        expression += f' && device.attributes["{DRIVER}"].type == "{kind}"'
    spec: dict = {"selectors": [{"cel": {"expression": expression}}]}
    if extended_resource:
        spec["extendedResourceName"] = extended_resource
    return {"apiVersion": API, "kind": "DeviceClass", "metadata": {"name": name}, "spec": spec}


def profile_selector(profile: str) -> dict:
    return {"cel": {"expression": f'device.attributes["{DRIVER}"].profile == "{profile}"'}}


def mig_claim_spec(profile: str, device_class: str = MIG_CLASS) -> dict:
    """A ResourceClaimSpec asking for one MIG slice of ``profile`` by name."""
    request = {"deviceClassName": device_class, "selectors": [profile_selector(profile)]}
    return {"devices": {"requests": [{"name": "mig", "exactly": request}]}}


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


def view(node_name: str, nvml: FakeNvml, gpus: list[int], allocations=None, **published) -> DraView:
    """What the exporter's watch makes of the node's slices (for tests without an API
    server); ``published``: as resource_slices takes."""
    slices = resource_slices(node_name, nvml, gpus, **published)
    return dra_view(map(read_resource_slice, slices), allocations or {})
