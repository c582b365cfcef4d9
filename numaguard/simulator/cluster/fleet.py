"""A synthetic GPU cluster's exporter series, as a Prometheus holding them would have
scraped them: for the remediator's benchmark and the test that its rounds of queries
plan as the whole set does. Written as OpenMetrics with history, for
``promtool tsdb create-blocks-from openmetrics``; Prometheus then holds the cluster
without anything scraping it.

Each node: 2 NUMA zones of 48 CPUs, 4 GPUs (0-2 whole, 3 sliced into four 1g.20gb),
``pods_per_node`` pods — pods 0-2 hold the whole GPUs (pod 2 on even nodes only: odd
nodes keep a GPU free), the next four a slice each. ``cross_numa`` pods (whole-GPU holders)
are device_remote for the whole window, ``starved`` of them starved too, with a
neighbour holding most of their L3 domain; ``oversized`` slices idle; a ``tight``
share of the zones has almost no memory free.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cached_property
from typing import TextIO

from numaguard.contract import catalogue as c
from numaguard.remediator.core.actions import PodInfo
from numaguard.remediator.core.reach import NodeFacts, Placement

GIB = 1 << 30
SLICES, PROFILE = 4, "1g.20gb"  # a slice of an H100-80GB
COLLECTORS = ("host_numa", "pod_placement", "gpu", "pod_resources", "resctrl")


@dataclass(frozen=True)
class Fleet:
    nodes: int
    pods_per_node: int = 8
    cross_numa: int = 100
    starved: int = 20
    oversized: int = 10
    tight: float = 0.0  # the share of NUMA zones with almost no memory free
    finding_seconds: int = 600
    sizing_seconds: int = 3600
    step: int = 60  # seconds between the samples of a series
    job: str = "numaguard"
    seed: int = 7

    @staticmethod
    def node(n: int) -> str:
        return f"gpu-node-{n:05d}"

    @staticmethod
    def instance(n: int) -> str:
        return f"10.{(n >> 16) & 255}.{(n >> 8) & 255}.{n & 255}:9400"

    @staticmethod
    def uid(n: int, p: int) -> str:
        return f"{n:08x}-{p:04x}-4a00-8b00-{n * 64 + p:012x}"

    @cached_property
    def chosen(self) -> tuple[set, set, set]:
        """(cross-NUMA pods, starved pods, idle slices), as (node, index) pairs."""
        rng = random.Random(self.seed)
        holders = [(n, p) for n in range(self.nodes) for p in range(min(2, self.pods_per_node))]
        cross = rng.sample(holders, min(self.cross_numa, len(holders)))
        starved = set(rng.sample(cross, min(self.starved, len(cross))))
        slices = [(n, s) for n in range(self.nodes) for s in range(self.slices_held)]
        idle = set(rng.sample(slices, min(self.oversized, len(slices))))
        return set(cross), starved, idle

    @property
    def slices_held(self) -> int:
        return min(SLICES, max(0, self.pods_per_node - 3))

    @property
    def pods(self) -> int:
        return self.nodes * self.pods_per_node

    def write(self, end: float, out: TextIO, keep=lambda instance: True) -> None:
        """Every family, every series (of the exporter targets ``keep`` keeps: a shard's),
        its samples up to ``end`` (seconds)."""
        for spec, series in self._families():
            out.write(f"# TYPE {spec} gauge\n")
            for labels, history, values in series:
                if not keep(labels["instance"]):
                    continue
                inside = ",".join(f'{k}="{v}"' for k, v in labels.items() if v != "")
                steps = history // self.step
                for i in range(steps, -1, -1):
                    t = end - i * self.step
                    value = values(t) if callable(values) else values
                    out.write(f"{spec}{{{inside}}} {value} {t:.3f}\n")
        out.write("# EOF\n")

    def _families(self) -> Iterator[tuple[str, list]]:
        cross, starved, idle = self.chosen
        short, verdict, sizing = self.step, self.finding_seconds + 300, self.sizing_seconds + 300
        rng = random.Random(self.seed + 1)
        fam: dict[str, list] = {}

        def add(name: str, labels: dict, history: int, values) -> None:
            fam.setdefault(name, []).append((labels, history, values))

        for n in range(self.nodes):
            node = {"job": self.job, "instance": self.instance(n), "node": self.node(n)}
            add("up", {"job": self.job, "instance": self.instance(n)}, short, 1)
            add(c.BUILD_INFO.name, {**node, "version": "0.1.0", "python_version": "3.11"}, short, 1)
            for collector in COLLECTORS:
                ids = {**node, "collector": collector}
                add(c.COLLECTOR_SUCCESS.name, ids, short, 1)
                add(c.COLLECTOR_LAST_SUCCESS.name, ids, short, lambda t: f"{t - 5:.3f}")
            allocated = [0, 0]
            gpu_free = [0, 0 if n % 2 == 0 else 1]
            for p in range(self.pods_per_node):
                uid = self.uid(n, p)
                pod = {**node, "namespace": f"team-{n % 50}", "pod": f"job-{n}-{p}", "pod_uid": uid}
                container = {**pod, "container": "main", "container_id": f"c{n:x}{p:02x}"}
                zone = 0 if p < 2 else 1
                cpus = 8 if p < 3 else 4
                allocated[zone] += cpus
                is_cross = (n, p) in cross
                for reason in ("cpu_span", "memory_remote", "device_remote"):
                    on = int(is_cross and reason == "device_remote")
                    add(c.POD_CROSS_NUMA.name, {**pod, "reason": reason}, verdict, on)
                cpu_zone = 1 - zone if is_cross else zone
                add(c.POD_EXCLUSIVE_CPUS.name, {**pod, "numa_node": str(cpu_zone)}, short, cpus)
                add(
                    c.POD_MEMORY.name,
                    {**pod, "numa_node": str(cpu_zone)},
                    short,
                    rng.randint(1, 64) * GIB,
                )
                share = 0.6 if (n, 0) in starved and p == 3 else 0.1
                add(c.POD_LLC_SHARE.name, {**pod, "l3_domain": str(cpu_zone)}, short, share)
                if p < 3 and not (p == 2 and n % 2):
                    gpu = {"gpu": str(p), "gpu_uuid": f"GPU-{n:08x}-{p}", "mig_uuid": ""}
                    resource = "nvidia.com/gpu"
                    why = "device_remote" if (n, p) in starved else "cpu_throttled"
                    add(
                        c.GPU_STARVED.name,
                        {**node, **gpu, **_pod(pod), "reason": why},
                        verdict,
                        int((n, p) in starved),
                    )
                elif p >= 3 and p - 3 < self.slices_held:
                    s = p - 3
                    mig = f"MIG-{n:08x}-{s}"
                    gpu = {"gpu": "3", "gpu_uuid": f"GPU-{n:08x}-3", "mig_uuid": mig}
                    resource = f"nvidia.com/mig-{PROFILE}"
                    self._slice(
                        add, {**node, **gpu, "mig_profile": PROFILE}, (n, s) in idle, sizing, rng
                    )
                else:
                    continue
                add(
                    c.GPU_HOLDER.name,
                    {
                        **container,
                        **gpu,
                        "resource": resource,
                        "numa_node": str(zone),
                        "source": "kubelet",
                    },
                    short,
                    1,
                )
            for z in (0, 1):
                ids = {**node, "numa_node": str(z)}
                add(c.ZONE_CPUS_ALLOCATABLE.name, ids, short, 48)
                add(c.ZONE_CPUS_ALLOCATED.name, ids, short, allocated[z])
                free = rng.randint(0, 2) if rng.random() < self.tight else rng.randint(0, 512)
                add(c.NUMA_MEMORY_FREE.name, ids, short, free * GIB)
                add(
                    c.ZONE_DEVICES_FREE.name,
                    {**ids, "resource": "nvidia.com/gpu"},
                    short,
                    gpu_free[z],
                )
                free_slices = SLICES - self.slices_held if z == 1 else 0
                add(
                    c.ZONE_DEVICES_FREE.name,
                    {**ids, "resource": f"nvidia.com/mig-{PROFILE}"},
                    short,
                    free_slices,
                )
        yield from fam.items()

    def _slice(self, add, ids: dict, idle: bool, history: int, rng: random.Random) -> None:
        sm = 0.05 if idle else rng.uniform(0.35, 0.85)
        used = rng.randint(1, 4 if idle else 18) * GIB
        add(c.MIG_UTILIZATION.name, {**ids, "kind": "sm"}, history, round(sm, 3))
        add(c.MIG_MEMORY_USED.name, ids, history, used)
        add(c.MIG_MEMORY_TOTAL.name, ids, self.step, 20 * GIB)


def _pod(labels: dict) -> dict:
    return {k: labels[k] for k in ("namespace", "pod", "pod_uid")}


def open_nodes(signals) -> dict[str, NodeFacts]:
    """The API server's word on every node the exporters report zones of: Ready,
    schedulable, untainted, with room for more pods (as a fleet's nodes are)."""
    names = set(signals["zone_free_cpus"]["node"]) | set(signals["targets_up"]["node"])
    return {n: NodeFacts(n, allocatable={"pods": 250.0}) for n in names}


def pods_for(findings) -> dict[str, PodInfo]:
    """The API server's word on the finding pods, as for a fleet's pods: running where
    the series say, owned by a Deployment's ReplicaSet, old enough, asking for GPUs."""
    return {
        f.pod_uid: PodInfo(
            f.namespace,
            f.pod,
            f.pod_uid,
            f.node,
            0.0,
            owner_kind="ReplicaSet",
            owner_name=f"{f.pod}-rs",
            workload=f"Deployment/{f.namespace}/{f.pod}",
            resources=frozenset({"nvidia.com/gpu", f"nvidia.com/mig-{PROFILE}"}),
            placement=Placement(),
        )
        for f in findings
    }
