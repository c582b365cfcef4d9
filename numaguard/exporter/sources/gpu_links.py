"""How a GPU reaches the GPUs after it, through NVML: the topology level of each pair,
P2P read, write and NVLink status, and its NVLinks (to a peer GPU, counted per peer, or
to an NVSwitch). Asked when the node's GPUs change, never each cycle; a driver without a
call leaves what it gives unknown. And NVLink traffic where GPM cannot measure it."""

from __future__ import annotations

from numaguard.exporter.readers import ParseError
from numaguard.exporter.readers.nvml import (
    ALL_LINKS,
    NVLINK_FIELDS,
    counter_rates,
    nvlink_counters,
    nvml_level,
    nvml_text,
)
from numaguard.exporter.records import Issue, LinkRecord
from numaguard.exporter.sources.nvml_calls import Caller, Lost


def links_of(nvml, call: Caller, index: int, handle, uuid: str, peers: tuple, cache: dict):
    """Its links to each GPU after it, its NVLinks to NVSwitches and its active NVLinks
    of any kind (None: unknown), as asked when the GPUs last changed: NVML's topology
    does not change under a running node. ``peers``: the UUIDs of the GPUs after it as
    last read ("" where unknown); ``cache``: GPU index -> (the UUIDs of it and of the
    GPUs after it, what was asked)."""
    known = cache.get(index)
    if known is not None and all(peers) and known[0] == (uuid, *peers):
        return known[1]  # nothing asked of NVML: the same GPUs as when it was
    try:
        return _links_of(nvml, call, index, len(peers), handle, uuid, cache)
    except Lost:  # a peer fell off the bus (its own read says so): unknown this cycle
        return (), None, None


def _links_of(n, call: Caller, index: int, after: int, handle, uuid: str, cache: dict):
    peers = []  # (index, handle, uuid)
    for j in range(index + 1, index + 1 + after):
        other = call.optional(n.nvmlDeviceGetHandleByIndex, j)
        peer_uuid = other and call.optional(n.nvmlDeviceGetUUID, other)
        if not peer_uuid:
            return (), None, None  # the peers not known: asked again next cycle
        peers.append((j, other, peer_uuid))
    key = (uuid, *(p[2] for p in peers))
    bus_ids = {}
    for j, other, _ in peers:
        pci = call.optional(n.nvmlDeviceGetPciInfo, other)
        if pci is None:
            return (), None, None
        bus_ids[nvml_text(pci.busId).lower()] = j
    failed = len(call.issues)
    to_peer, nvswitch_links, active = _nvlinks(n, call, handle, bus_ids)
    links = []
    for j, other, _ in peers:
        level = call.optional(n.nvmlDeviceGetTopologyCommonAncestor, handle, other)
        try:
            level = None if level is None else nvml_level(level)
        except ParseError as err:
            call.issues.append(Issue("parse", f"{call.where}/topology", str(err)))
            level = None
        # plain ints: pynvml passes the index to C as it is (its READ is a tuple)
        read, write, nvlink = (
            call.optional(n.nvmlDeviceGetP2PStatus, handle, other, caps) for caps in (0, 1, 2)
        )
        count = None if to_peer is None else to_peer.get(j, 0)
        links.append(LinkRecord(j, level, read, write, nvlink, count))
    found = (tuple(links), nvswitch_links, active)
    if len(call.issues) == failed:  # known for good; an error is asked again
        cache[index] = (key, found)
    return found


def _nvlinks(n, call: Caller, handle, peers: dict[str, int]):
    """({peer index: NVLinks to it}, NVLinks to NVSwitches, active NVLinks), all None
    when unknown. Every link is asked until NVML says there is none past it
    (INVALID_ARGUMENT); a GPU without NVLink says NOT_SUPPORTED at the first, as
    go-gpuallocator expects."""
    to_peer: dict[int, int] = {}
    switch = active = 0
    unknown = None, None, None
    # looked up once: which one failed is told by identity (a wrapper, as a profiler's,
    # may hand out a new function object at each lookup)
    state_of = n.nvmlDeviceGetNvLinkState
    kind_of = n.nvmlDeviceGetNvLinkRemoteDeviceType
    far_end = n.nvmlDeviceGetNvLinkRemotePciInfo
    for link in range(n.NVML_NVLINK_MAX_LINKS):
        fn = state_of
        try:
            if call.lacks(fn):
                return unknown
            if not fn(handle, link):
                continue
            active += 1
            fn = kind_of
            if call.lacks(fn):
                return unknown
            if fn(handle, link) == n.NVML_NVLINK_DEVICE_TYPE_SWITCH:
                switch += 1
                continue
            fn = far_end
            far = nvml_text(fn(handle, link).busId).lower()
        except n.NVMLError_NotSupported:
            if fn is state_of:
                return ({}, 0, 0) if link == 0 else (to_peer, switch, active)
            return unknown
        except n.NVMLError_InvalidArgument:
            if fn is state_of:
                break  # past the GPU's links
            call.issues.append(Issue("nvml", f"{call.where}/nvlink{link}", "Invalid Argument"))
            return unknown
        except n.NVMLError_GpuIsLost:
            raise Lost from None
        except (n.NVMLError_FunctionNotFound, n.NVMLLibraryMismatchError):
            call.learn_missing(fn.__name__)  # an older driver: unknown, no error
            return unknown
        except n.NVMLError as err:
            call.issues.append(Issue("nvml", f"{call.where}/nvlink{link}", str(err)))
            return unknown
        if far in peers:
            to_peer[peers[far]] = to_peer.get(peers[far], 0) + 1
    return to_peer, switch, active


# a field's nvmlReturn from a driver that has no such field
_NO_FIELD = (2, 3)  # NVML_ERROR_INVALID_ARGUMENT, NVML_ERROR_NOT_SUPPORTED


def nvlink_field_rates(nvml, call: Caller, handle, uuid: str, last: dict):
    """(whether measured, None when unknown; bytes a second by direction) over all of a
    GPU's NVLinks from the throughput field values, against the counters the last cycle
    read (``last``: GPU uuid -> them, or None once its driver said it has no such field:
    not asked again)."""
    if uuid in last and last[uuid] is None:
        return False, {}
    wanted = [(field, ALL_LINKS) for field in NVLINK_FIELDS.values()]
    values = call.optional(nvml.nvmlDeviceGetFieldValues, handle, wanted)
    if values is None:
        return None, {}
    answers = [(v.fieldId, v.nvmlReturn, v.valueType, v.value.ullVal, v.timestamp) for v in values]
    if all(code in _NO_FIELD for _, code, *_ in answers):
        last[uuid] = None
        return False, {}
    try:
        counters = nvlink_counters(answers)
    except ParseError as err:
        call.issues.append(Issue("parse", f"{call.where}/nvlink_fields", str(err)))
        last.pop(uuid, None)
        return None, {}
    if len(counters) < len(NVLINK_FIELDS):  # a field failed this time: known next cycle
        for field, code, *_ in answers:
            if code != 0:
                call.issues.append(Issue("nvml", f"{call.where}/field{field}", f"NVML code {code}"))
        last.pop(uuid, None)
        return None, {}
    rates = counter_rates(last.get(uuid) or {}, counters)
    last[uuid] = counters
    return True, rates
