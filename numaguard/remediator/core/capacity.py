"""Capacity (pure): what each NUMA zone of the fresh nodes can still give, what each
finding's pod holds and needs on one zone, and the fit check over every zone."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pandas as pd

from numaguard.contract.names import mig_resource
from numaguard.contract.reasons import FREE_SET_SIZES, JOINED_LEVELS
from numaguard.remediator.core.answers import Signals
from numaguard.remediator.core.evidence import Evidence
from numaguard.remediator.core.findings import Finding
from numaguard.remediator.core.kinds import KINDS
from numaguard.remediator.core.needs import Need, set_size

# The collectors the capacity of a zone that would take a pod comes from (each kind's
# own are in its record, kinds.py)
CAPACITY_DEPENDS_ON = ("host_numa", "pod_resources")


def holdings(s: Signals, pods: set[str]) -> dict[str, dict]:
    """Pod uid -> {(node, numa node): [exclusive CPUs, memory, {resource: count}]}: what
    each of ``pods`` holds, per zone."""
    held: dict[str, dict] = {}

    def slot(uid: str, node: str, numa: str) -> list:
        return held.setdefault(uid, {}).setdefault((node, numa), [0.0, 0.0, Counter()])

    for name, i in (("pod_exclusive_cpus", 0), ("pod_memory", 1)):
        df = s[name]
        df = df[df["pod_uid"].isin(pods)].reindex(
            columns=["pod_uid", "node", "numa_node", "value"], fill_value=""
        )
        for uid, node, numa, value in df.itertuples(index=False):
            slot(uid, node, numa)[i] += value
    holders = s["holders"]
    holders = holders[holders["pod_uid"].isin(pods)].reindex(
        columns=["pod_uid", "node", "numa_node", "resource"], fill_value=""
    )
    for uid, node, numa, resource in holders.itertuples(index=False):
        slot(uid, node, numa)[2][resource] += 1
    return held


def need_of(held: dict[str, dict], uid: str, joined: bool = False) -> Need:
    """What the pod must find in one zone to run aligned: all it holds, together;
    ``joined``: its full GPUs as a set joined well enough for P2P."""
    cpus, memory, devices = 0.0, 0.0, Counter()
    for c, m, d in held.get(uid, {}).values():
        cpus, memory = cpus + c, memory + m
        devices.update(d)
    slices = mig_resource("")
    gpus = sum(n for r, n in devices.items() if not r.startswith(slices)) if joined else 0
    return Need(cpus, memory, dict(devices), gpus)


class Capacity:
    """Free capacity per (node, NUMA node), as the exporters of fresh nodes report it, as
    arrays: the fit check runs once per finding over every zone of the cluster."""

    def __init__(
        self,
        zones: list[tuple[str, str]],
        cpus: np.ndarray,
        memory: np.ndarray,
        devices: dict[str, np.ndarray],
        held: dict,
        placements: dict[str, dict[str, float]] | None = None,
        joined: dict[int, np.ndarray] | None = None,
    ) -> None:
        self.zones = zones
        # node -> MIG profile -> how many more its GPUs' DRA counters allow
        self.placements = placements or {}
        self.index = {z: i for i, z in enumerate(zones)}
        # each zone's node, as a number (node_names[n]): nodes are picked per finding
        # among thousands of zones, in arrays
        self.node_names = list(dict.fromkeys(node for node, _ in zones))
        number = {n: i for i, n in enumerate(self.node_names)}
        self.node_of = np.array([number[node] for node, _ in zones], dtype=np.int64)
        self.cpus = cpus
        self.memory = memory
        self.devices = devices  # resource -> free count per zone
        # pod uid -> {(node, numa node): [cpus, memory, {resource: count}]}: what it holds
        self.held = held
        # set size -> per zone, whether a free set of that many GPUs is joined at
        # P2P_UP_TO or better there (exporters report it per NUMA node)
        self.joined = joined or {}

    @classmethod
    def from_signals(cls, s: Signals, pods: set[str], evidence: Evidence) -> Capacity:
        """``pods``: UIDs whose needs are wanted (the findings' pods). Zones of nodes whose
        data is stale are left out: no pod is sent to a node on old news."""
        key = ["node", "numa_node"]
        stale = {
            n
            for n in set(s["zone_free_cpus"]["node"])
            if evidence.node_stale(n, CAPACITY_DEPENDS_ON)
        }

        def aligned(name: str) -> pd.DataFrame:
            df = s[name]
            if "numa_node" not in df:
                return df.iloc[0:0].assign(numa_node="")
            return df[~df["node"].isin(stale) & (df["numa_node"] != "")]

        def by_zone(name: str) -> pd.Series:
            return aligned(name).groupby(key, sort=False)["value"].sum()

        zone_cpus, zone_memory = by_zone("zone_free_cpus"), by_zone("zone_free_memory")
        index = zone_cpus.index.intersection(zone_memory.index)
        devices: dict[str, np.ndarray] = {}
        dev = aligned("zone_free_devices")
        for resource, rows in dev.groupby("resource", sort=False):
            free = rows.groupby(key, sort=False)["value"].sum()
            devices[resource] = np.array(free.reindex(index, fill_value=0), dtype=float)
        held = holdings(s, pods)
        placements: dict[str, dict[str, float]] = {}
        free = s["mig_profiles_free"]
        if not free.empty:
            fresh = free[[not evidence.node_stale(n, ("gpu",)) for n in free["node"]]]
            for (node, profile), value in (
                fresh.groupby(["node", "mig_profile"])["value"].sum().items()
            ):
                placements.setdefault(node, {})[profile] = float(value)
        sets = aligned("zone_gpu_free_sets").reindex(columns=["node", "numa_node", "size", "level"])
        good = sets[sets["level"].isin(JOINED_LEVELS)]
        joined = {}
        for size in FREE_SET_SIZES:
            rows = good[good["size"] == str(size)]
            there = set(zip(rows["node"], rows["numa_node"], strict=True))
            joined[size] = np.array([zone in there for zone in index], dtype=bool)
        return cls(
            list(index),
            np.array(zone_cpus.reindex(index), dtype=float),
            np.array(zone_memory.reindex(index), dtype=float),
            devices,
            held,
            placements,
            joined,
        )

    def need(self, f: Finding) -> Need:
        return need_of(self.held, f.pod_uid, KINDS[f.kind].joined_gpus)

    def _give_back(self, uid: str, sign: float) -> None:
        """Count what the pod holds as free (+1) or taken again (-1): once evicted, its
        own node's zones get it back."""
        for zone, (c, m, d) in self.held.get(uid, {}).items():
            i = self.index.get(zone)
            if i is None:
                continue
            self.cpus[i] += sign * c
            self.memory[i] += sign * m
            for resource, count in d.items():
                if resource in self.devices:
                    self.devices[resource][i] += sign * count

    def fitting(self, need: Need, uid: str) -> np.ndarray:
        """The zones that can take the pod aligned, counting what ``uid`` (the pod's,
        when it is gone before its replacement comes; else "") holds as free; roomiest
        first, so that fixes spread."""
        self._give_back(uid, +1)
        try:
            ok = (self.cpus >= need.cpus) & (self.memory >= need.memory)
            for resource, count in need.devices.items():
                free = self.devices.get(resource)
                if free is None:
                    return np.array([], dtype=np.int64)
                ok &= free >= count
            if need.joined:
                size = set_size(need.joined)
                if size is None:
                    return np.array([], dtype=np.int64)
                ok &= self.joined[size]
            candidates = np.flatnonzero(ok)
            # most free CPUs, then most free memory (bytes stay far below 1e12 per zone)
            score = self.cpus[candidates] * 1e12 + self.memory[candidates]
            return candidates[np.argsort(-score, kind="stable")]
        finally:
            self._give_back(uid, -1)

    def nodes(self, zones: np.ndarray) -> list[str]:
        """The distinct nodes of ``zones``, in their order."""
        numbers = self.node_of[zones]
        _, first = np.unique(numbers, return_index=True)
        return [self.node_names[n] for n in numbers[np.sort(first)]]

    def move(self, uid: str, zone: int, need: Need) -> None:
        """The pod leaves its zones and takes ``zone``'s room, for the rest of the cycle."""
        self._give_back(uid, +1)
        self.cpus[zone] -= need.cpus
        self.memory[zone] -= need.memory
        for resource, count in need.devices.items():
            self.devices[resource][zone] -= count
        for joined in self.joined.values():  # what its GPUs leave is unknown until said
            joined[zone] = False

    def free_slice(self, profile: str) -> int | None:
        free = self.devices.get(mig_resource(profile))
        if free is None:
            return None
        found = np.flatnonzero(free > 0)
        return int(found[0]) if found.size else None

    def placement_nodes(self, profile: str) -> list[str]:
        """The fresh nodes whose GPUs' DRA counters leave room for a ``profile``, the
        roomiest first."""
        room = [(-free.get(profile, 0.0), node) for node, free in self.placements.items()]
        return [node for more, node in sorted(room) if more <= -1]

    def take_placement(self, node: str, profile: str) -> None:
        """One ``profile`` placed on ``node``: what else fits there is unknown until its
        exporter says again (a placement may block others), so nothing else does."""
        left = self.placements[node].get(profile, 0.0) - 1
        self.placements[node] = dict.fromkeys(self.placements[node], 0.0) | {profile: left}

    def take_slice(self, zone: int, profile: str) -> None:
        self.devices[mig_resource(profile)][zone] -= 1

    def name(self, zone: int) -> tuple[str, str]:
        return self.zones[zone]
