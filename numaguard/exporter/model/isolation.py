"""Core isolation (pure): whether a pod's exclusive CPUs are its own down to the core and
the L3 cache. The static CPU manager without ``full-pcpus-only`` gives a container an odd
count of CPUs on an SMT node as whole cores and one thread; that thread's sibling stays in
the shared pool or goes to another container as its "exclusive" CPU, and the two share
the core's caches and execution units. And a pod's CPUs may span more L3 caches than its
size needs where a NUMA node has several (AMD's CCXs)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from numaguard.contract.reasons import L3_SPAN, SHARED_WITH, SMT_SHARED
from numaguard.exporter.readers.cpu import CpuTime
from numaguard.exporter.records import L3Domain

RESERVED, EXCLUSIVE, SHARED_POOL = SHARED_WITH


@dataclass(frozen=True, slots=True)
class CoreIsolation:
    """Of one pod holding exclusive CPUs: the threads beside its CPUs that are not its
    own, by whose they are (SHARED_WITH; {} when none); how busy they were over the
    last interval (None: none, or not measured); the L3 caches its CPUs span and the
    fewest that could hold them (None: the caches are not known); and its verdicts,
    only for reasons the data decides."""

    shared: Mapping[str, int]
    sibling_busy: float | None
    l3_domains: int | None
    l3_fewest: int | None
    verdicts: Mapping[str, bool]


def core_isolation(
    own: frozenset[int],
    exclusive_elsewhere: frozenset[int],
    cores: Mapping[int, frozenset[int]],
    shared_pool: frozenset[int] | None,
    allocatable: frozenset[int] | None,
    l3: Mapping[int, L3Domain],
    l3_finer_than_numa: bool,
    times: tuple[Mapping[int, CpuTime], Mapping[int, CpuTime]] | None,
) -> CoreIsolation:
    """``own``: the pod's exclusive CPUs; ``exclusive_elsewhere``: other pods' (those
    read); ``allocatable``: the CPUs the kubelet may hand out (the rest are reserved);
    ``times``: /proc/stat of the last cycle and of this one."""
    verdicts: dict[str, bool] = {}
    shared: dict[str, int] = {}
    busy = None
    known = all(c in cores for c in own) and shared_pool is not None and allocatable is not None
    # without SMT no core is shared: numaguard_node_smt_active says so once for the node
    if known and any(len(core) > 1 for core in cores.values()):
        foreign = frozenset().union(*(cores[c] for c in own)) - own
        for cpu in foreign:
            whose = _whose(cpu, exclusive_elsewhere, shared_pool, allocatable)
            shared[whose] = shared.get(whose, 0) + 1
        verdicts[SMT_SHARED] = bool(foreign)
        busy = _busy(foreign, times) if foreign and times else None
    spanned = fewest = None
    if l3 and all(any(c in d.cpus for d in l3.values()) for c in own):
        spanned = sum(1 for d in l3.values() if d.cpus & own)
        # what each cache could give a pod: its CPUs the kubelet may hand out
        usable = [len(d.cpus & allocatable) if allocatable else len(d.cpus) for d in l3.values()]
        fewest = _fewest(len(own), sorted(usable, reverse=True))
        if l3_finer_than_numa:  # else a span of caches is one of NUMA nodes: cpu_span says it
            verdicts[L3_SPAN] = spanned > fewest
    return CoreIsolation(shared, busy, spanned, fewest, verdicts)


def _whose(
    cpu: int, elsewhere: frozenset[int], pool: frozenset[int], allocatable: frozenset[int]
) -> str:
    # the kubelet never hands out a reserved CPU; it may still be in the shared pool
    if cpu not in allocatable:
        return RESERVED
    if cpu in elsewhere or cpu not in pool:  # out of the pool: the CPU manager gave it
        return EXCLUSIVE
    return SHARED_POOL


def _busy(
    cpus: frozenset[int], times: tuple[Mapping[int, CpuTime], Mapping[int, CpuTime]]
) -> float | None:
    """Busy share of ``cpus``' time between two readings; None where one is missing,
    went back (the kernel's idle and iowait accounting is loose) or no time passed."""
    before, after = times
    busy = total = 0
    for cpu in cpus:
        if cpu not in before or cpu not in after:
            return None
        db = after[cpu].busy - before[cpu].busy
        dt = after[cpu].total - before[cpu].total
        if db < 0 or dt < 0 or db > dt:
            return None
        busy, total = busy + db, total + dt
    return busy / total if total else None


def _fewest(count: int, sizes: list[int]) -> int:
    """The fewest caches, largest first, whose CPUs add up to ``count``."""
    held = used = 0
    for size in sizes:
        if held >= count:
            break
        held, used = held + size, used + 1
    return max(used, 1)
