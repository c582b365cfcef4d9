"""DRA counters (pure): what each counter set of the node's partitionable devices holds
(KEP-4815; one per GPU under NVIDIA's DynamicMIG), what its allocated devices consume,
how many more devices of each MIG profile fit, and where it disagrees with NVML.

As the scheduler's allocator sees it: a device can be allocated while every counter it
consumes has that much left, so "how many more 2g.35gb fit" is the largest set of the
GPU's free 2g.35gb placements whose shares fit together in what is left — exact, by
search (a GPU has a handful of placements per profile).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from numaguard.exporter.readers.dra import DraDevice, DraView
from numaguard.exporter.records import GpuRecord

# steps of the search for one profile on one counter set before it gives up (unknown):
# forged slices with a hundred placements must not stall the cycle
SEARCH_STEPS = 20_000
MISMATCHES = ("claimed_without_instance", "instance_without_claim")

Counters = Mapping[str, int]


@dataclass(frozen=True, slots=True)
class CounterSetState:
    driver: str
    name: str
    gpu_uuid: str  # the GPU whose devices consume it, as the driver says; "" unsaid
    capacity: Counters
    consumed: Counters | None  # None: some claim of the node's pods not read yet
    profiles_free: Mapping[str, int] | None  # profile -> how many more fit; None: unknown
    profiles_max: Mapping[str, int]  # profile -> how many fit on it when nothing is used
    # kind -> memory slices where claims and NVML's GPU instances disagree; None: NVML
    # does not know the GPU's instances, or the claims are not all known
    mismatches: Mapping[str, int] | None


def counter_states(
    dra: DraView | None, gpus: Mapping[str, GpuRecord]
) -> tuple[CounterSetState, ...]:
    """One state per counter set of the node's complete pools; ``gpus`` by UUID."""
    if dra is None or not dra.counter_sets:
        return ()
    allocated = {(a.driver, a.pool, a.device) for claim in dra.allocations.values() for a in claim}
    by_set: dict[tuple[str, str, str], list[DraDevice]] = {}
    for (driver, pool, _), device in dra.devices.items():
        for name in device.consumes:
            by_set.setdefault((driver, pool, name), []).append(device)
    missing = {(d, p) for d, p, n in allocated if (d, p, n) not in dra.devices}
    states = []
    for key, capacity in sorted(dra.counter_sets.items()):
        driver, pool, name = key
        devices = by_set.get(key, [])
        taken = [d for d in devices if (driver, pool, d.name) in allocated]
        # an allocated device the pool no longer names consumes what is unknown
        known = dra.claims_unknown == 0 and (driver, pool) not in missing
        consumed = _sum(capacity, (d.consumes[name] for d in taken)) if known else None
        gpu_uuid = _gpu_of(devices)
        free_devices = [d for d in devices if (driver, pool, d.name) not in allocated]
        most = _most_per_profile(name, capacity, {}, devices) or {}
        free = _most_per_profile(name, capacity, consumed, free_devices) if known else None
        states.append(
            CounterSetState(
                driver,
                name,
                gpu_uuid,
                capacity,
                consumed,
                None if free is None else dict.fromkeys(most, 0) | free,  # all placements taken: 0
                most,
                _mismatches(taken, gpus.get(gpu_uuid)) if known else None,
            )
        )
    return tuple(states)


def _gpu_of(devices: list[DraDevice]) -> str:
    """The whole GPU's UUID (a device of no parent), else its slices' parent's."""
    whole = next((d.uuid for d in devices if d.uuid and not d.parent_uuid), "")
    return whole or next((d.parent_uuid for d in devices if d.parent_uuid), "")


def _sum(capacity: Counters, shares) -> dict[str, int]:
    total = dict.fromkeys(capacity, 0)
    for share in shares:
        for counter, amount in share.items():
            total[counter] = total.get(counter, 0) + amount
    return total


def _most_per_profile(
    name: str, capacity: Counters, consumed: Counters | None, devices: list[DraDevice]
) -> dict[str, int] | None:
    """Profile -> the most of its devices that can still be allocated together; None
    when the search would not end in its budget."""
    left = {k: v - (consumed or {}).get(k, 0) for k, v in capacity.items()}
    profiles: dict[str, list[Counters]] = {}
    for d in devices:
        if d.profile and d.placement is not None and set(d.consumes) == {name}:
            profiles.setdefault(d.profile, []).append(d.consumes[name])
    out = {}
    for profile, shares in sorted(profiles.items()):
        most = _most(shares, left)
        if most is None:
            return None
        out[profile] = most
    return out


def _most(shares: list[Counters], left: Counters) -> int | None:
    """The largest number of ``shares`` that fit in ``left`` together (branch and bound)."""
    best, steps = 0, 0

    def fits(share: Counters, room: dict[str, int]) -> bool:
        return all(room.get(k, 0) >= v for k, v in share.items())

    def go(i: int, room: dict[str, int], count: int) -> None:
        nonlocal best, steps
        steps += 1
        if steps > SEARCH_STEPS or count + len(shares) - i <= best:
            return
        if i == len(shares):
            best = count
            return
        if fits(shares[i], room):
            go(i + 1, {k: v - shares[i].get(k, 0) for k, v in room.items()}, count + 1)
        go(i + 1, room, count)

    go(0, dict(left), 0)
    return None if steps > SEARCH_STEPS else best


def _mismatches(taken: list[DraDevice], gpu: GpuRecord | None) -> dict[str, int] | None:
    """Memory slices claimed (by allocated MIG devices) with no live GPU instance on
    them, and the reverse. None when either side is not known."""
    if gpu is None or not gpu.up or gpu.mig_enabled is None:
        return None
    claimed: set[int] = set()
    for d in taken:
        if d.placement is not None:
            start, size = d.placement
            if size is None:
                return None
            claimed.update(range(start, start + size))
    made: set[int] = set()
    for s in gpu.slices:
        if s.placement_start is None or s.placement_size is None:
            return None
        made.update(range(s.placement_start, s.placement_start + s.placement_size))
    return dict(zip(MISMATCHES, (len(claimed - made), len(made - claimed)), strict=True))
