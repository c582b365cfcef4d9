"""Benchmark: one remediator planning cycle over a simulated 5,000-node / 40,000-pod
cluster (docs/design.md: <= 1 s of CPU), measured as process CPU time, median of several runs;
the queries and answers of a whole cycle are bench/remediation.py's.

The signals are the frames the whole query set returns for such a cluster (8 pods per
node, 2 NUMA zones per node, 4 GPUs per node, one MIG-sliced), built directly as pandas
frames; 2% of the pods are cross-NUMA and 1% starved, so that the planner has ~1,200
findings to check against ~10,000 zones and every guard.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

from numaguard.remediator.core.actions import PodInfo
from numaguard.remediator.core.answers import Signals
from numaguard.remediator.core.findings import FindingState, update
from numaguard.remediator.core.planner import plan
from numaguard.remediator.core.policy import Policy
from numaguard.remediator.core.queries import expressions
from numaguard.remediator.core.reach import Placement
from numaguard.simulator.cluster.fleet import open_nodes
from numaguard.simulator.parts.prometheus import as_signals

GIB = 1 << 30
TARGET_CPU_S = 1.0


def cluster(nodes: int, pods_per_node: int, seed: int = 7) -> tuple[Signals, dict[str, PodInfo]]:
    rng = random.Random(seed)
    frames: dict[str, list[dict]] = {name: [] for name in expressions()}
    infos: dict[str, PodInfo] = {}
    now = time.time()
    for n in range(nodes):
        node = f"node-{n:05d}"
        frames["targets_up"].append({"node": node, "value": 1.0})
        for collector in ("host_numa", "pod_placement", "gpu", "pod_resources", "resctrl"):
            frames["collector_age"].append({"node": node, "collector": collector, "value": 5.0})
            frames["collector_success"].append({"node": node, "collector": collector, "value": 1.0})
        for z in ("0", "1"):
            ids = {"node": node, "numa_node": z}
            frames["zone_free_cpus"].append({**ids, "value": float(rng.randint(0, 48))})
            frames["zone_free_memory"].append({**ids, "value": rng.randint(0, 512) * GIB})
            frames["zone_free_devices"].append(
                {**ids, "resource": "nvidia.com/gpu", "value": float(rng.randint(0, 2))}
            )
            frames["zone_free_devices"].append(
                {**ids, "resource": "nvidia.com/mig-1g.10gb", "value": float(rng.randint(0, 3))}
            )
        for p in range(pods_per_node):
            name, uid = f"job-{n}-{p}", f"uid-{n}-{p}"
            ids = {"node": node, "namespace": f"team-{n % 50}", "pod": name, "pod_uid": uid}
            numa = {"numa_node": str(p % 2)}
            frames["pod_exclusive_cpus"].append(
                {**ids, **numa, "value": float(rng.choice((0, 4, 8)))}
            )
            frames["pod_memory"].append({**ids, **numa, "value": rng.randint(1, 64) * GIB})
            gpu = f"GPU-{n}-{p % 4}"
            frames["holders"].append(
                {
                    **ids,
                    "gpu": str(p % 4),
                    "gpu_uuid": gpu,
                    "numa_node": str((p + 1) % 2),
                    "resource": "nvidia.com/gpu",
                    "source": "kubelet",
                    "value": 1.0,
                }
            )
            roll = rng.random()
            if roll < 0.02:
                row = {**ids, "reason": "device_remote", "value": 1.0}
                kind = "cross_numa"
            elif roll < 0.03:
                row = {**ids, "reason": "cpu_pressure", "gpu": "0", "gpu_uuid": gpu, "value": 1.0}
                kind = "starved"
            if roll < 0.03:
                frames[f"{kind}_sustained"].append(row)
                frames[f"{kind}_seen"].append(row)
                frames[f"{kind}_age"].append({**row, "value": 2.0})
            infos[uid] = PodInfo(
                namespace=ids["namespace"],
                name=name,
                uid=uid,
                node=node,
                created=now - rng.randint(0, 7200),
                owner_kind="ReplicaSet",
                owner_name=f"{name}-rs",
                workload=f"Deployment/{ids['namespace']}/w{n % 700}",
                resources=frozenset({"nvidia.com/gpu"}),
                placement=Placement(),
            )
    instances = {f"node-{n:05d}": f"10.1.{n // 250}.{n % 250}:9847" for n in range(nodes)}
    return as_signals(now, frames, instances), infos


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--nodes", type=int, default=5000)
    p.add_argument("--pods-per-node", type=int, default=8)
    p.add_argument("--runs", type=int, default=5)
    args = p.parse_args()
    signals, pods = cluster(args.nodes, args.pods_per_node)
    policy = Policy(dry_run=False, max_per_cycle=50, max_per_node=1, max_per_namespace=5)
    times = []
    for _ in range(args.runs):
        start = time.process_time()
        state = update(FindingState(), signals)
        findings = list(state.open.values())
        named = {f.pod_uid: pods[f.pod_uid] for f in findings}  # what the cluster view reads
        result = plan(findings, named, signals, policy, {}, signals.at, open_nodes(signals))
        times.append(time.process_time() - start)
    cpu = statistics.median(times)
    print(
        f"cluster: {args.nodes} nodes, {len(pods)} pods, {len(findings)} findings, "
        f"{len(result.actions)} actions, {len(result.refusals)} refusals"
    )
    print(f"{'measure':<44}{'value':>10}  target")
    print(
        f"{'planning cycle CPU s (median)':<44}{cpu:>10.3f}  <= {TARGET_CPU_S:g} s: "
        f"{'met' if cpu <= TARGET_CPU_S else 'NOT met'}"
    )


if __name__ == "__main__":
    main()
