"""Benchmark: whole remediator cycles (queries, evidence checks, planning) against a real
Prometheus holding a synthetic cluster's series (docs/design.md: at 5,000 nodes / 40,000 pods
<= 3 s wall, <= 1 s of the remediator's CPU, answers <= 5 MB, <= 5 s of Prometheus CPU,
growing with the findings, not with the cluster).

The cluster (simulator.fleet) is written as OpenMetrics with an hour and a quarter of
history and backfilled with ``promtool tsdb create-blocks-from openmetrics``; Prometheus
2.42 and 3.x start on those blocks. Per cycle, side by side in the same run: the rounds
the controller asks (queries.py), and the whole query set of before (every pod, slice
and zone). The same findings at every size: what grows is the cluster. The API server's
part of a cycle (reading the finding pods) is not in these numbers.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import tempfile
import time
from pathlib import Path

import aiohttp

from numaguard.remediator.controller import Controller
from numaguard.remediator.core.findings import FindingState, update
from numaguard.remediator.core.planner import plan
from numaguard.remediator.core.policy import Policy
from numaguard.remediator.signals import Prometheus, Source
from numaguard.simulator.fleet import Fleet, open_nodes, pods_for
from numaguard.simulator.processes import free_port
from numaguard.simulator.prometheus import PrometheusMissing, PrometheusServer, tsdb_blocks

TARGETS = {"wall_s": 3.0, "cpu_s": 1.0, "answer_mb": 5.0, "prometheus_cpu_s": 5.0}
# the whole set's answers at 5,000 nodes are far over the default 32 MiB budget: give
# both the room to finish, so that what each costs can be seen
ROOMY = Source(timeout_seconds=120.0, max_answer_bytes=1 << 30)
POLICY = Policy(dry_run=True)
WAYS = ("rounds", "sizing", "whole")


def backfill(fleet: Fleet, end: float, into: Path) -> Path:
    text = into / "fleet.om"
    with text.open("w") as out:
        fleet.write(end, out)
    return tsdb_blocks(text)


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def cycle(way: str, prom: PrometheusServer, client: Prometheus, at: float) -> dict:
    """``rounds``: a cycle of a controller that looked for slices to size last cycle (as
    nine cycles in ten do); ``sizing``: one that looks for them now."""
    controller = Controller(client, None, POLICY)
    if way == "rounds":
        await controller._gather(at)
    client.bytes_read = client.rows_read = client.queries_made = 0
    prom_cpu, cpu, wall = cpu_seconds(prom.pid), time.process_time(), time.monotonic()
    if way in ("rounds", "sizing"):
        signals, state = await controller._gather(at)
    else:
        signals = await client.fetch(at)
        state = update(FindingState(), signals)
    findings = list(state.open.values())
    result = plan(findings, pods_for(findings), signals, POLICY, {}, at, open_nodes(signals))
    return {
        "wall_s": time.monotonic() - wall,
        "cpu_s": time.process_time() - cpu,
        "prometheus_cpu_s": cpu_seconds(prom.pid) - prom_cpu,
        "answer_mb": client.bytes_read / 1e6,
        "series": client.rows_read,
        "queries": client.queries_made,
        "findings": len(findings),
        "plan": sorted((a.kind, a.finding.pod_uid) for a in result.actions),
    }


async def measure(version: str, blocks: Path, at: float, runs: int) -> dict[str, dict]:
    out = {}
    async with (
        PrometheusServer([], free_port(), version=version, blocks=blocks) as prom,
        aiohttp.ClientSession() as session,
    ):
        client = Prometheus(prom.url, session, ROOMY)
        await cycle("sizing", prom, client, at)  # the blocks' index read once, for all
        for way in WAYS:
            cycles = [await cycle(way, prom, client, at) for _ in range(runs)]
            median = {k: statistics.median(c[k] for c in cycles) for k in TARGETS}
            out[way] = {**cycles[-1], **median}
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--nodes", type=int, nargs="+", default=[1000, 5000])
    p.add_argument("--versions", nargs="+", default=["2", "3"])
    p.add_argument("--runs", type=int, default=3, help="cycles of each way (median)")
    p.add_argument("--cross-numa", type=int, default=150)
    p.add_argument("--starved", type=int, default=30)
    p.add_argument("--oversized", type=int, default=40)
    args = p.parse_args()
    print(f"{'measure':<34}{'rounds':>10}{'+sizing':>10}{'whole':>10}{'ratio':>8}  target")
    for nodes in args.nodes:
        fleet = Fleet(nodes, 8, args.cross_numa, args.starved, args.oversized)
        end = float(int(time.time()))
        with tempfile.TemporaryDirectory(prefix="numaguard-fleet-") as tmp:
            started = time.monotonic()
            blocks = backfill(fleet, end, Path(tmp))
            took = time.monotonic() - started
            for version in args.versions:
                try:
                    result = asyncio.run(measure(version, blocks, end, args.runs))
                except PrometheusMissing as err:
                    print(f"# Prometheus {version}: {err}")
                    continue
                r, z, w = (result[way] for way in WAYS)
                same = r["plan"] == z["plan"] == w["plan"]
                print(
                    f"cluster: {nodes} nodes, {fleet.pods} pods, Prometheus {version}, "
                    f"{r['findings']} findings, backfilled in {took:.0f}s; "
                    f"same plan every way: {'yes' if same else 'NO'}"
                )
                for key in (
                    "wall_s",
                    "cpu_s",
                    "prometheus_cpu_s",
                    "answer_mb",
                    "series",
                    "queries",
                ):
                    ratio = z[key] / w[key] if w[key] else float("nan")
                    target = TARGETS.get(key)
                    worst = max(r[key], z[key])
                    verdict = (
                        f"<= {target:g}: {'met' if worst <= target else 'NOT met'}"
                        if target
                        else ""
                    )
                    print(
                        f"  {key:<32}{r[key]:>10.3f}{z[key]:>10.3f}{w[key]:>10.3f}{ratio:>8.3f}"
                        f"  {verdict}"
                    )


if __name__ == "__main__":
    main()
