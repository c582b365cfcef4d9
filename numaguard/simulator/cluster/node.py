"""A simulated node: its host, GPUs and kubelet, and what that kubelet decides when it
admits a pod, under the CPU manager's ``static`` policy and the node's Topology Manager
policy (pure over the node's state):

* ``single-numa-node``: CPUs and devices on one NUMA node, or the pod is refused
  (``TopologyAffinityError``);
* ``restricted``: the same, but a pod that needs more CPUs than any NUMA node has is
  admitted across nodes (the narrowest hint there is, so a preferred one);
* ``best-effort``: aligned when it can, anywhere otherwise (silently misaligned);
* ``none``: CPUs as the CPU manager packs them without a hint, and the first free device,
  aligned or not.

Among the free devices a pod may get, full GPUs are chosen as NVIDIA's device plugin
prefers them (go-gpuallocator's best effort, fakes/gpu_allocator.py), slices in order.

On an SMT host, a NUMA node's CPUs are taken as the static policy's packed allocator
takes them: whole free cores while the pod needs a core's worth, then single threads
from the fullest cores (so an odd count shares a core). With the CPU manager option
``full-pcpus-only`` a count that is no multiple of the CPUs a core, or more than the free
CPUs outside the reserved CPUs' cores, is refused (``SMTAlignmentError``).

tests/test_kubelet_agreement.py holds these answers to the real kubelet's.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from numaguard.contract.reasons import ISOLATION_OPTIONS, OPTION_TRUE, SMT_SHARED
from numaguard.exporter.readers import parse_id_list
from numaguard.simulator.fakes.gpu_allocator import best_effort, pair_scores
from numaguard.simulator.fakes.host import FakeHost, FakeHostRoot, FakePod
from numaguard.simulator.fakes.nvml import FakeGpu, FakeNvml, FakeSlice
from numaguard.simulator.fakes.podresources import FakeKubelet

POLICIES = ("none", "best-effort", "restricted", "single-numa-node")


@dataclass
class SimNode:
    name: str
    host: FakeHost
    nvml: FakeNvml
    policy: str
    index: int = 0
    root: FakeHostRoot | None = None
    kubelet: FakeKubelet | None = None
    description: str = ""  # the fake NVML description file its exporter follows
    presets: dict[tuple[str, str], FakePod] = field(default_factory=dict)
    # its kubelet's PodResources names the devices of DRA claims (KEP-3695): on from 1.34
    claims_in_pod_resources: bool = False
    # the GPU Operator's MIG manager's config on it (cluster/mig_manager.py); "": none
    mig_config: str = ""
    mig_wedged: bool = False  # its MIG manager stops at pending for good

    def write(self) -> None:
        self.root.write()
        tmp = f"{self.description}.tmp"
        with open(tmp, "w") as f:
            f.write(self.nvml.description())
        os.replace(tmp, self.description)


def first_touch(node: SimNode, cpus: frozenset[int], total: int) -> dict[int, int]:
    """Where the kernel puts a new pod's memory: on the NUMA nodes of the CPUs that
    touch it first, in proportion to its CPUs there."""
    share = {
        i: len(parse_id_list(n.cpus) & cpus)
        for i, n in enumerate(node.host.nodes)
        if parse_id_list(n.cpus) & cpus
    }
    return {i: total * k // len(cpus) for i, k in share.items()}


class SMTAlignmentError(Exception):
    """The CPU manager's ``full-pcpus-only`` refusal, in the kubelet's words."""


def admit(node: SimNode, need: int, resources: dict[str, int]):
    """Exclusive CPUs and devices for a pod, as the CPU manager's static policy and the
    node's Topology Manager policy give them: (CPUs, {resource: device units}), or None
    when the pod is refused (TopologyAffinityError, or nothing free); raises
    SMTAlignmentError where full-pcpus-only refuses its count."""
    free = free_cpus(node)
    by_numa = {i: sorted(parse_id_list(n.cpus) & free) for i, n in enumerate(node.host.nodes)}
    units_by_numa = {i: take(node, resources, i) for i in by_numa}
    aligned = [i for i in by_numa if len(by_numa[i]) >= need and units_by_numa[i] is not None]
    if aligned and node.policy != "none":
        i = aligned[0]
        _whole_cores_only(node, need, free)
        cpus = take_by_topology(by_numa[i], node.host.cores(), need)
        return frozenset(cpus), units_by_numa[i]
    # more CPUs than any NUMA node has at all: the narrowest hint spans nodes and is
    # still the preferred one, which restricted admits (single-numa-node never)
    largest = max(len(parse_id_list(n.cpus)) for n in node.host.nodes)
    if node.policy == "single-numa-node" or (node.policy == "restricted" and need <= largest):
        return None  # TopologyAffinityError
    units = take(node, resources, None)
    if units is None or len(free) < need:
        return None
    _whole_cores_only(node, need, free)
    sizes = {i: len(parse_id_list(n.cpus)) for i, n in enumerate(node.host.nodes)}
    return packed(by_numa, sizes, need), units


def _whole_cores_only(node: SimNode, need: int, free: frozenset[int]) -> None:
    """Raises SMTAlignmentError where the kubelet's full-pcpus-only refuses ``need``
    CPUs: no multiple of the CPUs a core, or more than the free CPUs outside the
    reserved CPUs' cores (cpumanager/policy_static.go, enforceSMTAlignment)."""
    options = (node.host.kubelet_config or {}).get("cpuManagerPolicyOptions") or {}
    if not need or options.get(ISOLATION_OPTIONS[SMT_SHARED]) not in OPTION_TRUE:
        return
    per_core = node.host.threads_per_core
    if need % per_core:
        raise SMTAlignmentError(
            f"SMT Alignment Error: requested {need} cpus not multiple cpus per core = {per_core}"
        )
    cores = node.host.cores()
    reserved = frozenset().union(*(cores[c] for c in node.host.reserved_cpus))
    available = len(free - reserved)
    if need > available:
        raise SMTAlignmentError(
            "SMT Alignment Error: not enough free physical CPUs: available physical CPUs = "
            f"{available}, requested CPUs = {need}, CPUs per core = {per_core}"
        )


def take_by_topology(
    free: Iterable[int], cores: Mapping[int, frozenset[int]], need: int
) -> list[int]:
    """``need`` of one NUMA node's ``free`` CPUs as the static policy's packed allocator
    takes them (cpu_assignment.go): whole free cores while the pod needs a core's worth,
    then single threads, from the cores with the fewest free threads first (lowest CPU
    breaking ties). Without SMT: the lowest CPUs."""
    left = set(free)

    def by_fullness() -> list[frozenset[int]]:
        firsts = sorted({min(cores[c]) for c in left}, key=lambda k: (len(cores[k] & left), k))
        return [cores[k] for k in firsts]

    taken: list[int] = []
    for core in by_fullness():  # takeFullCores
        if core <= left and need - len(taken) >= len(core):
            taken += sorted(core)
            left -= core
    for core in by_fullness():  # takeRemainingCPUs
        for cpu in sorted(core & left):
            if len(taken) < need:
                taken.append(cpu)
    return taken


def packed(free: dict[int, list[int]], sizes: dict[int, int], need: int) -> frozenset[int]:
    """CPUs as the static policy takes them without a NUMA hint (the kubelet's
    takeByTopologyNUMAPacked, one thread a core): whole NUMA nodes first, those entirely
    free while the pod needs a node's worth or more; then the rest from the nodes with
    the fewest free CPUs first, lowest first."""
    fewest_first = sorted(free, key=lambda i: (len(free[i]), i))
    taken: list[int] = []
    for i in fewest_first:
        if len(free[i]) == sizes[i] and need - len(taken) >= sizes[i]:
            taken += free[i]
    rest = [cpu for i in fewest_first for cpu in free[i] if cpu not in taken]
    return frozenset(taken + rest[: need - len(taken)])


def free_cpus(node: SimNode) -> frozenset[int]:
    """CPUs the CPU manager can give exclusively: all but the reserved ones and those
    already given (the shared pool shrinks as it does)."""
    taken: set[int] = set()
    for p in node.host.pods:
        for c in p.containers:
            if c.exclusive_cpus:
                taken |= parse_id_list(c.cpus)
    return node.host.all_cpus - taken - node.host.reserved_cpus


def take(node: SimNode, resources: dict[str, int], numa: int | None):
    """{resource: the units a pod asking ``resources`` gets} of the free ones on NUMA
    node ``numa`` (None: any), or None when there are too few."""
    given = {}
    for resource, count in resources.items():
        free = free_units(node, resource, numa)
        if len(free) < count:
            return None
        if resource == "nvidia.com/gpu" and count > 1:  # the device plugin's preference
            indices = [node.nvml.gpus.index(g) for g in free]
            chosen = best_effort(indices, [], count, pair_scores(node.nvml))
            given[resource] = [node.nvml.gpus[i] for i in chosen]
        else:
            given[resource] = free[:count]
    return given


def free_units(node: SimNode, resource: str, numa: int | None) -> list:
    """The device units of ``resource`` no pod holds, on NUMA node ``numa`` (None: any)."""
    held = {
        i for p in node.host.pods for c in p.containers for ids in c.devices.values() for i in ids
    }
    claimed = {claim.device for p in node.host.pods for c in p.containers for claim in c.claims}
    out = []
    for index, gpu in enumerate(node.nvml.gpus):
        if (numa is not None and gpu.numa_node != numa) or f"gpu-{index}" in claimed:
            continue
        units = [gpu] if gpu.mig is None else gpu.mig
        out += [u for u in units if unit_resource(u) == resource and u.uuid not in held]
    return out


def keep_ids(host: FakeHost, pod: FakePod) -> None:
    """Fix a preset pod's container ids (and so its processes' PIDs) before the API
    server gives the pod its own uid."""
    for ctr in pod.containers:
        ctr.id = host.container_id(pod, ctr)


def unit_resource(unit: FakeGpu | FakeSlice) -> str:
    """The device plugin's (mixed strategy) resource name for a GPU or a slice."""
    if isinstance(unit, FakeGpu):
        return "nvidia.com/gpu"
    return f"nvidia.com/mig-{unit.profile.name}"


def advertised(node: SimNode) -> dict[str, int]:
    """Device plugin resources the node advertises (not the GPUs a DRA driver holds)."""
    claimed = {
        claim.device for p in node.presets.values() for c in p.containers for claim in c.claims
    }
    counts: dict[str, int] = {}
    for index, gpu in enumerate(node.nvml.gpus):
        if f"gpu-{index}" in claimed:
            continue
        for unit in [gpu] if gpu.mig is None else gpu.mig:
            counts[unit_resource(unit)] = counts.get(unit_resource(unit), 0) + 1
    return counts
