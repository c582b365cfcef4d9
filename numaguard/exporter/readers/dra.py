"""Readers for Dynamic Resource Allocation objects and device-plugin ids: API objects
(decoded JSON) -> typed records. Pure.

A DRA device is named by (driver, pool, device) in ResourceSlices, in ResourceClaims'
allocations and in the kubelet's PodResources answers; which GPU or MIG slice it is, the
driver says in the device's attributes. NVIDIA's driver (``gpu.nvidia.com``) publishes
``uuid`` (GPU or MIG UUID), and for a MIG device ``parentUUID`` and ``profile``; a MIG
device it creates on demand (DynamicMIG) has no UUID before it exists, but its name
gives its placement on the parent: ``gpu-<minor>-mig-<profile id>-<start>-<size>`` up
to driver v25.8, ``gpu-<minor>-mig-<profile without dots>-<profile id>-<start>`` from
v25.12 (the size then from the memory slices it consumes).

Partitionable devices (KEP-4815): a pool's ``sharedCounters`` are counter sets (one per
GPU in NVIDIA's driver, from Kubernetes 1.35 in a slice of their own, with no devices),
and each device's ``consumesCounters`` what allocating it takes from them. The scheduler
allocates only from complete pools (every slice of the newest generation present), so
counters are read only from those.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from fractions import Fraction

from numaguard.exporter.readers import ParseError

# NVIDIA's DRA driver's MIG device names: up to v25.8 profile id, start and size; from
# v25.12 the profile without dots, its id and the start (the driver's ToCanonicalName)
_MIG_NAME_V25_8 = re.compile(r"gpu-\d+-mig-\d+-(\d+)-(\d+)")
_MIG_NAME = re.compile(r"gpu-\d+-mig-.+-\d+-(\d+)")
# a memory slice, as NVIDIA's driver names its counter (memory-slice-3) or KEP-4815's
# example and the driver's static devices' capacity (memorySlice3)
_MEMORY_SLICE = re.compile(r"memory-?slice-?(\d+)", re.IGNORECASE)
# GKE's device plugin: nvidia<index>, and nvidia<index>/gi<GPU instance> for a MIG slice
_GKE_ID = re.compile(r"nvidia(\d+)(?:/gi(\d+))?")
# The API server's limits (KEP-4815 as of 1.35): what it refuses, the reader refuses
MAX_COUNTER_SETS = 8  # per slice
MAX_COUNTERS = 32  # per counter set, and per device's consumption of one
MAX_CONSUMPTIONS = 2  # counter sets one device consumes from
# A quantity as the API server writes it back: a decimal with an SI or binary suffix, or
# an exponent. (The client library's parser would load the whole client: ~15 MB.)
_QUANTITY = re.compile(
    r"([+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+))(Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE]|[eE][+-]?[0-9]{1,3})?"
)
_SUFFIX = {
    "": 1,
    **{s: Fraction(1, 1000**i) for i, s in enumerate(("m", "u", "n"), 1)},
    **{s: 1024**i for i, s in enumerate(("Ki", "Mi", "Gi", "Ti", "Pi", "Ei"), 1)},
    **{s: 1000**i for i, s in enumerate(("k", "M", "G", "T", "P", "E"), 1)},
}


@dataclass(frozen=True, slots=True)
class DraDevice:
    driver: str
    pool: str
    name: str
    uuid: str  # the GPU's or MIG slice's; "" when the driver does not say
    parent_uuid: str  # a MIG device's GPU
    placement: tuple[int, int | None] | None  # a MIG device's (start, size); size None: unsaid
    profile: str = ""  # a MIG device's, as the driver names it (1g.10gb); "" when unsaid
    # counter set -> counter -> what allocating the device takes from it
    consumes: Mapping[str, Mapping[str, int]] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class PublishedSlice:
    """One ResourceSlice: its pool's place in it, counter sets and devices."""

    driver: str
    pool: str
    generation: int
    slice_count: int  # of the pool's generation
    counter_sets: Mapping[str, Mapping[str, int]]  # counter set -> counter -> capacity
    devices: tuple[DraDevice, ...]


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
    # (driver, pool, counter set) -> counter -> capacity, of complete pools only
    counter_sets: Mapping[tuple[str, str, str], Mapping[str, int]] = field(default_factory=dict)
    # claims the node's pods name that were not read yet: what they consume is unknown
    claims_unknown: int = 0


def read_resource_slice(obj: dict) -> PublishedSlice:
    """A ResourceSlice (``resource.k8s.io`` v1, v1beta2 or v1beta1, whose devices keep
    their attributes, capacity and counters under ``basic``)."""
    spec = _mapping(obj.get("spec"), "spec")
    driver = _text(spec.get("driver"), "spec.driver")
    pool = _mapping(spec.get("pool"), "spec.pool")
    counter_sets = _sets(spec.get("sharedCounters"), "name", "sharedCounters", MAX_COUNTER_SETS)
    return PublishedSlice(
        driver,
        _text(pool.get("name"), "spec.pool.name"),
        _count(pool.get("generation"), "spec.pool.generation", 0),
        _count(pool.get("resourceSliceCount"), "spec.pool.resourceSliceCount", 1),
        counter_sets,
        tuple(
            _device(driver, pool["name"], _mapping(d, "spec.devices[]"))
            for d in _list(spec.get("devices"), "spec.devices")
        ),
    )


def _device(driver: str, pool: str, device: dict) -> DraDevice:
    name = _text(device.get("name"), "device name")
    fields = device if "basic" not in device else _mapping(device["basic"], "basic")
    attributes = _mapping(fields.get("attributes") or {}, "attributes")
    capacity = _mapping(fields.get("capacity") or {}, "capacity")
    consumes = _sets(
        fields.get("consumesCounters"), "counterSet", f"{name} consumesCounters", MAX_CONSUMPTIONS
    )

    def string(key: str) -> str:
        # an attribute is named bare (the driver's domain) or fully qualified
        value = attributes.get(key) or attributes.get(f"{driver}/{key}") or {}
        text = value.get("string") if isinstance(value, dict) else None
        return text if isinstance(text, str) else ""

    return DraDevice(
        driver,
        pool,
        name,
        string("uuid"),
        string("parentUUID"),
        _placement(name, consumes, capacity),
        string("profile"),
        consumes,
    )


def _placement(name: str, consumes, capacity: dict) -> tuple[int, int | None] | None:
    """A MIG device's (start, size) on its GPU: by its name; the size, from v25.12 on,
    by the memory slices it consumes or (a static device) has."""
    m = _MIG_NAME_V25_8.fullmatch(name)
    if m:
        return int(m[1]), int(m[2])
    m = _MIG_NAME.fullmatch(name)
    if not m:
        return None
    start = int(m[1])
    for names in (*consumes.values(), capacity):
        slices = sorted(int(s[1]) for s in map(_MEMORY_SLICE.fullmatch, names) if s)
        if slices:
            whole = slices == list(range(slices[0], slices[0] + len(slices)))
            return start, len(slices) if whole and slices[0] == start else None
    return start, None


def is_memory_slice(counter: str) -> bool:
    return _MEMORY_SLICE.fullmatch(counter) is not None


def dra_view(
    slices: Iterable[PublishedSlice],
    allocations: Mapping[tuple[str, str], tuple[Allocated, ...]],
    claims_unknown: int = 0,
) -> DraView:
    """The node's devices (of each pool's newest generation) and counter sets (of its
    complete pools only: every slice of the newest generation there, each counter set
    defined once and every counter its devices consume defined, as the scheduler's
    allocator demands)."""
    pools: dict[tuple[str, str], list[PublishedSlice]] = {}
    for s in slices:
        pools.setdefault((s.driver, s.pool), []).append(s)
    devices: dict[tuple[str, str, str], DraDevice] = {}
    counter_sets: dict[tuple[str, str, str], Mapping[str, int]] = {}
    for (driver, pool), published in pools.items():
        newest = max(s.generation for s in published)
        published = [s for s in published if s.generation == newest]
        for s in published:
            devices.update(((driver, pool, d.name), d) for d in s.devices)
        sets = [(name, c) for s in published for name, c in s.counter_sets.items()]
        complete = len(published) == published[0].slice_count and all(
            s.slice_count == published[0].slice_count for s in published
        )
        defined = dict(sets)
        # a device consuming a counter no set defines breaks the pool for the allocator
        undefined = any(
            set(counters) - set(defined.get(n, ()))
            for s in published
            for d in s.devices
            for n, counters in d.consumes.items()
        )
        if complete and len(defined) == len(sets) and not undefined:
            counter_sets.update(((driver, pool, name), c) for name, c in sets)
    return DraView(devices, allocations, counter_sets, claims_unknown)


def parse_quantity(text) -> int:
    """A Kubernetes quantity that is a whole number (a counter's value): ``80Gi``,
    ``132``, ``1e3``."""
    m = _QUANTITY.fullmatch(text) if isinstance(text, str) else None
    if not m:
        raise ParseError(f"not a quantity: {str(text)[:40]!r}")
    suffix = m[2] or ""
    scale = Fraction(10) ** int(suffix[1:]) if suffix[:1] in ("e", "E") else _SUFFIX[suffix]
    value = Fraction(m[1]) * scale
    if value.denominator != 1 or abs(value) >= 2**63:
        raise ParseError(f"not a whole number a counter can hold: {text!r}")
    return int(value)


def _sets(value, key: str, where: str, most: int) -> dict[str, dict[str, int]]:
    """Counter sets by name (a slice's sharedCounters by ``name``, a device's
    consumesCounters by ``counterSet``), each named once, ``most`` at the most."""
    items = _list(value, where)
    if len(items) > most:
        raise ParseError(f"{where}: {len(items)} counter sets (at most {most})")
    out: dict[str, dict[str, int]] = {}
    for item in items:
        item = _mapping(item, f"{where}[]")
        name = _text(item.get(key), f"{where}[].{key}")
        if name in out:
            raise ParseError(f"{where}: counter set {name} twice")
        out[name] = _counters(item.get("counters"), name)
    return out


def _counters(value, where: str) -> dict[str, int]:
    counters = _mapping(value, f"{where} counters")
    if not counters or len(counters) > MAX_COUNTERS:
        raise ParseError(f"{where}: {len(counters)} counters (1 to {MAX_COUNTERS})")
    out = {}
    for name, counter in counters.items():
        value = parse_quantity(_mapping(counter, f"counter {name}").get("value"))
        if value < 0:
            raise ParseError(f"{where}: counter {name} is negative")
        out[_text(name, "counter name")] = value
    return out


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


def _list(value, what: str) -> list:
    if value is None:
        return []
    if not isinstance(value, list):
        raise ParseError(f"{what} is not a list")
    return value


def _count(value, what: str, least: int) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < least:
        raise ParseError(f"{what} is not a count of at least {least}")
    return value


def _text(value, what: str) -> str:
    if not isinstance(value, str) or not value:
        raise ParseError(f"{what} is not a name")
    return value
