"""The model's memory-traffic part: resctrl readings -> bandwidth, remote-traffic ratios
and LLC shares per L3 domain, NUMA node and pod. Pure, like the rest of the model."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from numaguard.exporter.readers.resctrl import MonValues, Unreadable, sum_mon_values
from numaguard.exporter.records import L3Domain, ResctrlReading


@dataclass(slots=True)
class Traffic:
    """MBM/CMT counters of one place, and what they mean over the last interval."""

    total_bytes: int | None  # cumulative memory traffic (mbm_total_bytes)
    local_bytes: int | None  # of which to the local memory controller (mbm_local_bytes)
    occupancy_bytes: int | None  # LLC held now (llc_occupancy)
    bytes_per_second: float | None = None
    remote_ratio: float | None = None  # 1 - Δlocal/Δtotal


@dataclass(frozen=True, slots=True)
class L3State:
    id: int
    cpus: frozenset[int]
    sockets: tuple[int, ...]
    numa_nodes: tuple[int, ...]
    capacity_bytes: int | None
    traffic: Traffic


@dataclass(slots=True)
class PodTraffic:
    domains: Mapping[int, Traffic]  # counters and occupancy per L3 domain
    bytes_per_second: float | None  # over all domains
    remote_ratio: float | None
    llc_share: Mapping[int, float]  # occupancy / the domain's capacity


@dataclass(frozen=True, slots=True)
class ResctrlState:
    mode: str
    num_rmids: int | None
    rmids_used: int | None
    domains: tuple[L3State, ...]
    numa_nodes: Mapping[int, Traffic]
    pods: Mapping[str, PodTraffic]
    unmonitored: frozenset[str]
    unreadable_total: Mapping[str, int]
    rmid_exhaustions_total: int
    rmids_in_limbo: bool  # the kernel said the RMIDs not in use are in limbo
    mbm_counters: Mapping[int, tuple[int, int]]  # ABMC: domain -> (counters, free)
    partial_domains: frozenset[int]  # ABMC: domains whose totals miss a group's traffic

    @property
    def available(self) -> bool:
        return self.mode in ("manage", "read-only")


def build_resctrl(
    reading: ResctrlReading,
    l3: Mapping[int, L3Domain],
    node_of_cpu: Mapping[int, int],
    socket_of_cpu: Mapping[int, int],
    previous: ResctrlState | None,
    seconds: float | None,
) -> ResctrlState:
    """``seconds``: time since the previous snapshot (None on the first)."""
    before_domains = {d.id: d.traffic for d in previous.domains} if previous else {}
    domains = []
    for d, values in sorted(reading.domains.items()):
        cache = l3.get(d)
        cpus = cache.cpus if cache else frozenset()
        domains.append(
            L3State(
                id=d,
                cpus=cpus,
                sockets=tuple(sorted({socket_of_cpu[c] for c in cpus if c in socket_of_cpu})),
                numa_nodes=tuple(sorted({node_of_cpu[c] for c in cpus if c in node_of_cpu})),
                capacity_bytes=cache.size_bytes if cache else None,
                traffic=_traffic([values], [before_domains.get(d)], seconds),
            )
        )
    numa = _numa(reading, domains, previous, seconds)
    pods = {}
    for uid, group in reading.pods.items():
        before = previous.pods.get(uid) if previous else None
        ids = sorted(group)
        per_domain = {d: _traffic([group[d]], [None], None) for d in ids}
        overall = _traffic(
            [group[d] for d in ids],
            [before.domains.get(d) if before else None for d in ids],
            seconds,
        )
        capacity = {s.id: s.capacity_bytes for s in domains}
        pods[uid] = PodTraffic(
            domains=per_domain,
            bytes_per_second=overall.bytes_per_second,
            remote_ratio=overall.remote_ratio,
            llc_share={
                d: t.occupancy_bytes / capacity[d]
                for d, t in per_domain.items()
                if t.occupancy_bytes is not None and capacity.get(d)
            },
        )
    return ResctrlState(
        mode=reading.mode,
        num_rmids=reading.num_rmids,
        rmids_used=reading.rmids_used,
        domains=tuple(domains),
        numa_nodes=numa,
        pods=pods,
        unmonitored=reading.unmonitored,
        unreadable_total=reading.unreadable_total,
        rmid_exhaustions_total=reading.rmid_exhaustions_total,
        rmids_in_limbo=reading.rmids_in_limbo,
        mbm_counters=reading.mbm_counters,
        partial_domains=reading.partial_domains,
    )


def _numa(
    reading: ResctrlReading,
    domains: list[L3State],
    previous: ResctrlState | None,
    seconds: float | None,
) -> dict[int, Traffic]:
    """Per NUMA node: the Sub-NUMA directories when the kernel has them, else the L3
    domains that lie wholly in one node (a domain across nodes cannot be split)."""
    if reading.snc_nodes:
        parts = {node: [values] for node, values in reading.snc_nodes.items()}
    else:
        parts: dict[int, list[MonValues]] = {}
        for d in domains:
            if len(d.numa_nodes) == 1:
                parts.setdefault(d.numa_nodes[0], []).append(reading.domains[d.id])
    return {
        node: _traffic(
            [sum_mon_values(values)],
            [previous.numa_nodes.get(node) if previous else None],
            seconds,
        )
        for node, values in sorted(parts.items())
    }


def _traffic(now: list[MonValues], before: list[Traffic | None], seconds: float | None) -> Traffic:
    """Sum places' values; rate and ratio from the change since ``before`` (one entry
    per place). A value missing or unreadable anywhere makes the sum unknown; a place
    whose counter went backwards (its group was recreated) leaves the rate unknown."""
    summed = sum_mon_values(now)
    total, local, occupancy = (
        _number(summed.get(e)) for e in ("mbm_total_bytes", "mbm_local_bytes", "llc_occupancy")
    )
    rate = ratio = None
    if seconds and total is not None and before and all(b is not None for b in before):
        d_total = _delta(now, before, "mbm_total_bytes", "total_bytes")
        if d_total is not None:
            rate = d_total / seconds
            d_local = _delta(now, before, "mbm_local_bytes", "local_bytes")
            if d_local is not None and d_total:
                # local can lead total by a read's worth: keep the ratio in 0..1
                ratio = min(1.0, max(0.0, 1 - d_local / d_total))
    return Traffic(total, local, occupancy, rate, ratio)


def _delta(now: list[MonValues], before: list[Traffic], event: str, attr: str) -> int | None:
    change = 0
    for values, past in zip(now, before, strict=True):
        value, old = values.get(event), getattr(past, attr)
        if value is None or isinstance(value, Unreadable) or old is None or value < old:
            return None
        change += value - old
    return change


def _number(value: int | Unreadable | None) -> int | None:
    return None if value is None or isinstance(value, Unreadable) else value
