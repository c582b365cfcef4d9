"""NVIDIA's device plugin's choice of GPUs, as go-gpuallocator's best-effort policy makes
it (``gpuallocator/besteffort_policy.go``): every pair of GPUs scores its links (by PCIe
level: 10 across sockets, 20 on one NUMA node, 30 under one host bridge, 40 across
PCIe switches, 50 behind one, 60 on one board; and 100 per NVLink between them); of all
ways to split the available GPUs into sets of the size asked (padded with empty places
to divide evenly), the one with the highest total, and of its sets holding the required
GPUs, the highest-scoring. Not the greedy best set: the split keeps pairs for later pods.

The kubelet asks this (GetPreferredAllocation) among the GPUs its Topology Manager left
available on the NUMA node it chose; it is a preference, which the kubelet may ignore."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from itertools import combinations

import pynvml as N

from numaguard.simulator.fakes.nvml import FakeNvml

# go-gpuallocator's P2PLink scores, by NVML's topology level between two GPUs
_PCIE_SCORE = {
    N.NVML_TOPOLOGY_INTERNAL: 60,
    N.NVML_TOPOLOGY_SINGLE: 50,
    N.NVML_TOPOLOGY_MULTIPLE: 40,
    N.NVML_TOPOLOGY_HOSTBRIDGE: 30,
    N.NVML_TOPOLOGY_NODE: 20,
    N.NVML_TOPOLOGY_SYSTEM: 10,
}
_MOST_NVLINKS = 12  # go-gpuallocator knows one to twelve links between two GPUs


def pair_scores(nvml: FakeNvml) -> Callable[[int, int], int]:
    """The score of each pair of the fake node's GPUs, by index."""

    def score(a: int, b: int) -> int:
        direct = nvml.gpus[a].nvlinks.count(b)
        return _PCIE_SCORE[nvml.level(a, b)] + 100 * min(direct, _MOST_NVLINKS)

    return score


def best_effort(
    available: list[int], required: list[int], size: int, score: Callable[[int, int], int]
) -> list[int]:
    """The GPUs (indices) to give a container asking ``size`` of them, ``required`` among
    them; [] when they cannot be given."""
    if size <= 0 or len(available) < size or len(required) > size:
        return []
    if size == 1:
        return list(required) or available[:1]
    best, best_total = None, -1
    for partition in _partitions(available, size):
        if not any(set(required) <= set(s) and None not in s for s in partition):
            continue
        total = sum(_set_score(s, score) for s in partition)
        if total > best_total:
            best, best_total = partition, total
    sets = [s for s in best or () if set(required) <= set(s)]
    if not sets:
        return []
    return list(max(sets, key=lambda s: _set_score(s, score)))  # the first of equals


def _set_score(gpus, score) -> int:
    return sum(score(a, b) for a, b in combinations(gpus, 2) if a is not None and b is not None)


def _partitions(devices: list[int], size: int) -> Iterator[list[tuple]]:
    """Every split of ``devices``, padded with None to divide by ``size``, into sets of
    ``size`` (each set's first device in increasing order, so no split twice); a set
    holds none of the padding or all of it, as go-gpuallocator prunes."""
    padded: list[int | None] = [*devices, *[None] * (-len(devices) % size)]
    padding = padded.count(None)

    def split(rest: list, accum: list[tuple]) -> Iterator[list[tuple]]:
        if len(rest) == size:
            yield [*accum, tuple(rest)]
            return
        first, others = rest[0], rest[1:]
        for chosen in combinations(others, size - 1):
            group = (first, *chosen)
            if group.count(None) not in (0, padding):
                continue
            left = [d for d in rest if d not in group]
            yield from split(left, [*accum, group])

    yield from split(padded, [])
