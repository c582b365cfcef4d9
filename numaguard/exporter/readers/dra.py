"""Readers for Dynamic Resource Allocation objects and device-plugin ids: API objects
(decoded JSON) -> typed records. Pure.

A DRA device is named by (driver, pool, device) in ResourceSlices, in ResourceClaims'
allocations and in the kubelet's PodResources answers; which GPU or MIG slice it is, the
driver says in the device's attributes. NVIDIA's driver (``gpu.nvidia.com``) publishes
``uuid`` (GPU or MIG UUID), and for a MIG device ``parentUUID`` and ``profile``; a MIG
device it creates on demand has no UUID before it exists, but its name
(``gpu-<minor>-mig-<profile id>-<start>-<size>``) gives its placement on the parent.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from numaguard.exporter.readers import ParseError

# NVIDIA's DRA driver's MIG device names: profile id, placement start and size
_MIG_NAME = re.compile(r"gpu-\d+-mig-\d+-(\d+)-(\d+)")
# GKE's device plugin: nvidia<index>, and nvidia<index>/gi<GPU instance> for a MIG slice
_GKE_ID = re.compile(r"nvidia(\d+)(?:/gi(\d+))?")


@dataclass(frozen=True, slots=True)
class DraDevice:
    driver: str
    pool: str
    name: str
    uuid: str  # the GPU's or MIG slice's; "" when the driver does not say
    parent_uuid: str  # a MIG device's GPU
    placement: tuple[int, int] | None  # a MIG device's (start, size) by its name


@dataclass(frozen=True, slots=True)
class Allocated:
    """One device a ResourceClaim was allocated."""

    request: str
    driver: str
    pool: str
    device: str


@dataclass(frozen=True, slots=True)
class DraView:
    """What the API server says of this node's DRA devices and its pods' claims."""

    devices: Mapping[tuple[str, str, str], DraDevice]  # (driver, pool, device) ->
    allocations: Mapping[tuple[str, str], tuple[Allocated, ...]]  # (namespace, claim) ->


def read_resource_slice(obj: dict) -> tuple[DraDevice, ...]:
    """A ResourceSlice (``resource.k8s.io`` v1, v1beta2 or v1beta1, whose devices keep
    their attributes under ``basic``)."""
    spec = _mapping(obj.get("spec"), "spec")
    driver = _text(spec.get("driver"), "spec.driver")
    pool = _text(_mapping(spec.get("pool"), "spec.pool").get("name"), "spec.pool.name")
    devices = []
    for device in spec.get("devices") or ():
        device = _mapping(device, "spec.devices[]")
        name = _text(device.get("name"), "device name")
        attributes = device.get("attributes")
        if attributes is None:
            attributes = _mapping(device.get("basic") or {}, "basic").get("attributes")
        attributes = _mapping(attributes or {}, "attributes")

        def string(key: str, attributes=attributes) -> str:
            # an attribute is named bare (the driver's domain) or fully qualified
            value = attributes.get(key) or attributes.get(f"{driver}/{key}") or {}
            text = value.get("string") if isinstance(value, dict) else None
            return text if isinstance(text, str) else ""

        m = _MIG_NAME.fullmatch(name)
        devices.append(
            DraDevice(
                driver,
                pool,
                name,
                string("uuid"),
                string("parentUUID"),
                (int(m[1]), int(m[2])) if m else None,
            )
        )
    return tuple(devices)


def read_claim_allocation(obj: dict) -> tuple[Allocated, ...] | None:
    """A ResourceClaim's allocated devices; None while it is not allocated."""
    allocation = (obj.get("status") or {}).get("allocation")
    if not allocation:
        return None
    results = _mapping(allocation, "status.allocation").get("devices") or {}
    return tuple(
        Allocated(
            _text(r.get("request"), "request"),
            _text(r.get("driver"), "driver"),
            _text(r.get("pool"), "pool"),
            _text(r.get("device"), "device"),
        )
        for r in _mapping(results, "devices").get("results") or ()
        if isinstance(r, dict)
    )


def device_plugin_id(device_id: str) -> tuple[str, int | None, int | None]:
    """A device plugin's id for a GPU or slice -> (id, GPU index, GPU instance id).
    Time-slicing replicas (``GPU-<uuid>::3``, as on EKS) are their device; GKE names
    devices ``nvidia<index>`` and slices ``nvidia<index>/gi<id>``."""
    device_id = device_id.partition("::")[0]
    m = _GKE_ID.fullmatch(device_id)
    if m:
        return device_id, int(m[1]), int(m[2]) if m[2] is not None else None
    return device_id, None, None


def _mapping(value, what: str) -> dict:
    if not isinstance(value, dict):
        raise ParseError(f"{what} is not an object")
    return value


def _text(value, what: str) -> str:
    if not isinstance(value, str) or not value:
        raise ParseError(f"{what} is not a name")
    return value
