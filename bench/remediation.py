"""Benchmark: whole remediator cycles (queries, evidence checks, planning) against a real
Prometheus holding a synthetic cluster's series (docs/design.md: at 5,000 nodes / 40,000 pods
<= 3 s wall, <= 1 s of the remediator's CPU, answers <= 5 MB, <= 5 s of Prometheus CPU,
growing with the findings, not with the cluster).

The cluster (simulator.cluster.fleet) is written as OpenMetrics with an hour and a quarter of
history and backfilled with ``promtool tsdb create-blocks-from openmetrics``; Prometheus
2.42 and 3.x start on those blocks. Per cycle, side by side in the same run: the rounds
the controller asks (queries.py), and the whole query set of before (every pod, slice
and zone). The same findings at every size: what grows is the cluster. The API server's
part of a cycle (reading the finding pods) is not in these numbers.

As fleets run it, too: the same cluster split by exporter target over two Prometheus 3
shards (backfilled apart, each with its external labels), a Thanos sidecar beside each
and Thanos Query over them; the remediator reads the querier, scoped to the cluster.
Prometheus CPU is then the shards' sum, Thanos's (querier and sidecars) beside it. And
what the alert rules cost Prometheus at that size: each group's evaluation time, from
its own ``prometheus_rule_group_last_duration_seconds``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import os
import statistics
import subprocess
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import aiohttp
import yaml
from prometheus_client.parser import text_string_to_metric_families

from numaguard.remediator.controller import Controller
from numaguard.remediator.core.findings import FindingState, update
from numaguard.remediator.core.planner import plan
from numaguard.remediator.core.policy import Policy
from numaguard.remediator.core.queries import RECORDED
from numaguard.remediator.signals import Prometheus, Source
from numaguard.simulator.cluster.fleet import Fleet, open_nodes, pods_for
from numaguard.simulator.parts.processes import free_port, until
from numaguard.simulator.parts.prometheus import (
    PrometheusMissing,
    PrometheusServer,
    binary,
    tsdb_blocks,
)
from numaguard.simulator.parts.thanos import Query, Sidecar, ThanosMissing

RULES = Path(__file__).resolve().parent.parent / "alerts" / "numaguard.rules.yml"
SHARDS = 2
CLUSTER = "fleet"

TARGETS = {"wall_s": 3.0, "cpu_s": 1.0, "answer_mb": 5.0, "prometheus_cpu_s": 5.0}
# the whole set's answers at 5,000 nodes are far over the default 32 MiB budget: give
# both the room to finish, so that what each costs can be seen
ROOMY = Source(timeout_seconds=120.0, max_answer_bytes=1 << 30)
POLICY = Policy(dry_run=True)
WAYS = ("rounds", "sizing", "whole")


def backfill(fleet: Fleet, end: float, into: Path, keep=lambda instance: True) -> Path:
    into.mkdir(parents=True, exist_ok=True)
    text = into / "fleet.om"
    with text.open("w") as out:
        fleet.write(end, out, keep)
    return tsdb_blocks(text)


async def add_records(blocks: Path, end: float) -> None:
    """The recording rules' records of the last five minutes to ``end``, backfilled into
    ``blocks`` by promtool from a server on them: what a server evaluating the
    PrometheusRule holds, so that round one reads records, not every verdict's window."""
    out = blocks.parent / "records"
    async with PrometheusServer([], free_port(), version="3", blocks=blocks) as prom:
        await asyncio.to_thread(
            subprocess.run,
            [
                binary("promtool", "3"),
                *("tsdb", "create-blocks-from", "rules", "--quiet"),
                f"--start={int(end) - 300}",
                f"--end={int(end)}",
                "--eval-interval=60s",
                f"--url={prom.url}",
                f"--output-dir={out}",
                str(RULES),
            ],
            check=True,
            capture_output=True,
        )
    for block in out.iterdir():
        block.rename(blocks / block.name)


class Recorded(Prometheus):
    """A client of servers that hold the records (add_records): it reads them, as it
    does where it finds the rules evaluated as it would write them."""

    async def recorded(self, at: float) -> frozenset[str]:
        return frozenset(RECORDED)


def shard_of(instance: str) -> int:
    """The shard the Prometheus Operator's hashmod relabelling gives a target."""
    return int.from_bytes(hashlib.md5(instance.encode()).digest()[8:], "big") % SHARDS


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def cycle(way: str, engine: Engine, client: Prometheus, at: float) -> dict:
    """``rounds``: a cycle of a controller that looked for slices to size last cycle (as
    nine cycles in ten do); ``sizing``: one that looks for them now."""
    controller = Controller(client, None, POLICY)
    if way == "rounds":
        await controller._gather(at)
    client.bytes_read = client.rows_read = client.queries_made = 0
    prom_cpu, cpu, wall = engine.cpu(), time.process_time(), time.monotonic()
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
        "prometheus_cpu_s": engine.cpu()[0] - prom_cpu[0],
        "thanos_cpu_s": engine.cpu()[1] - prom_cpu[1],
        "answer_mb": client.bytes_read / 1e6,
        "series": client.rows_read,
        "queries": client.queries_made,
        "findings": len(findings),
        "plan": sorted((a.kind, a.finding.pod_uid) for a in result.actions),
    }


class Engine:
    """Where the series are asked: the Prometheus servers that hold them, and Thanos in
    front of them (none: they are asked directly)."""

    def __init__(self, url: str, servers: list[int], thanos: list[int] = ()) -> None:
        self.url, self.servers, self.thanos = url, servers, thanos

    def cpu(self) -> tuple[float, float]:
        """(the servers' CPU seconds, Thanos's: the querier's and the sidecars')."""
        return tuple(sum(cpu_seconds(pid) for pid in pids) for pids in (self.servers, self.thanos))


async def measure(
    engine: Engine, at: float, runs: int, ways=WAYS, source: Source = ROOMY, client=Prometheus
) -> dict[str, dict]:
    out = {}
    async with aiohttp.ClientSession() as session:
        client = client(engine.url, session, source)
        await cycle("sizing", engine, client, at)  # the blocks' index read once, for all
        for way in ways:
            cycles = [await cycle(way, engine, client, at) for _ in range(runs)]
            keys = (*TARGETS, "thanos_cpu_s")
            median = {k: statistics.median(c[k] for c in cycles) for k in keys}
            out[way] = {**cycles[-1], **median}
    return out


async def one_prometheus(
    version: str, blocks: Path, at: float, runs: int, client=Prometheus
) -> dict[str, dict]:
    async with PrometheusServer([], free_port(), version=version, blocks=blocks) as prom:
        return await measure(Engine(prom.url, [prom.pid]), at, runs, client=client)


async def through_thanos(
    shards: list[Path], directory: Path, at: float, runs: int, client=Prometheus
) -> dict:
    """The rounds through Thanos Query over the shards (the whole set of before is not
    asked: it is what fleets cannot afford of one server, let alone through a querier)."""
    async with contextlib.AsyncExitStack() as stack:
        servers, sidecars = [], []
        for i, blocks in enumerate(shards):
            config = directory / f"shard-{i}.yml"
            labels = {"cluster": CLUSTER, "prometheus": f"monitoring/k8s-shard-{i}"}
            config.write_text(yaml.safe_dump({"global": {"external_labels": labels}}))
            server = PrometheusServer(
                [], free_port(), version="3", config_file=str(config), blocks=blocks
            )
            prom = await stack.enter_async_context(server)
            sidecar = await Sidecar(prom.url, prom.data).start()
            stack.callback(sidecar.stop)
            servers.append(prom.pid)
            sidecars.append(sidecar)
        query = await Query([s.grpc_address for s in sidecars], "prometheus_replica").start()
        stack.callback(query.stop)
        engine = Engine(query.url, servers, [query.pid, *(s.pid for s in sidecars)])
        source = replace(ROOMY, cluster=CLUSTER)
        return await measure(engine, at, runs, WAYS[:2], source, client)


async def rule_cost(version: str, blocks: Path) -> dict[str, float]:
    """Each alert rule group's evaluation time, seconds, on the cluster's series (as soon
    as the server starts: the series end now, and go stale after five minutes), as the
    server's own /metrics says."""
    groups = len(yaml.safe_load(RULES.read_text())["groups"])
    async with (
        PrometheusServer(
            [], free_port(), "5s", rule_files=[str(RULES)], version=version, blocks=blocks
        ) as prom,
        aiohttp.ClientSession() as session,
    ):

        async def evaluated() -> dict[str, float] | None:
            async with session.get(f"{prom.url}/metrics") as r:
                text = await r.text()
            got = {
                s.labels["rule_group"].rsplit(";", 1)[-1]: s.value
                for f in text_string_to_metric_families(text)
                for s in f.samples
                if s.name == "prometheus_rule_group_last_duration_seconds" and s.value > 0
            }
            return got if len(got) >= groups else None

        return await until(evaluated, "every rule group evaluated", 120, every=1)


ROWS = ("wall_s", "cpu_s", "prometheus_cpu_s", "answer_mb", "series", "queries")


def print_rows(r: dict, z: dict, w: dict | None, rows=ROWS) -> None:
    for key in rows:
        target = TARGETS.get(key)
        worst = max(r[key], z[key])
        verdict = f"<= {target:g}: {'met' if worst <= target else 'NOT met'}" if target else ""
        whole = f"{w[key]:>10.3f}{z[key] / w[key] if w[key] else float('nan'):>8.3f}" if w else ""
        print(f"  {key:<32}{r[key]:>10.3f}{z[key]:>10.3f}{whole:>18}  {verdict}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--nodes", type=int, nargs="+", default=[1000, 5000])
    p.add_argument("--versions", nargs="+", default=["2", "3"])
    p.add_argument("--runs", type=int, default=3, help="cycles of each way (median)")
    p.add_argument("--cross-numa", type=int, default=150)
    p.add_argument("--starved", type=int, default=30)
    p.add_argument("--oversized", type=int, default=40)
    p.add_argument("--no-thanos", action="store_true", help="one Prometheus only")
    p.add_argument(
        "--records",
        action="store_true",
        help="the servers hold the recording rules' records too, and the remediator reads them",
    )
    args = p.parse_args()
    client = Recorded if args.records else Prometheus
    held = ", the rules' records backfilled" if args.records else ""
    print(f"{'measure':<34}{'rounds':>10}{'+sizing':>10}{'whole':>10}{'ratio':>8}  target")
    for nodes in args.nodes:
        fleet = Fleet(nodes, 8, args.cross_numa, args.starved, args.oversized)
        end = float(int(time.time()))
        with tempfile.TemporaryDirectory(prefix="numaguard-fleet-") as tmp:
            started = time.monotonic()
            blocks = backfill(fleet, end, Path(tmp) / "all")
            took = time.monotonic() - started
            rules = asyncio.run(rule_cost("3", blocks))  # before the series go stale
            if args.records:
                asyncio.run(add_records(blocks, end))
            plans = {}
            for version in args.versions:
                try:
                    result = asyncio.run(one_prometheus(version, blocks, end, args.runs, client))
                except PrometheusMissing as err:
                    print(f"# Prometheus {version}: {err}")
                    continue
                r, z, w = (result[way] for way in WAYS)
                plans[version] = r["plan"]
                same = r["plan"] == z["plan"] == w["plan"]
                print(
                    f"cluster: {nodes} nodes, {fleet.pods} pods, Prometheus {version}, "
                    f"{r['findings']} findings, backfilled in {took:.0f}s{held}; "
                    f"same plan every way: {'yes' if same else 'NO'}"
                )
                print_rows(r, z, w)
            print(
                f"  alert rules, Prometheus 3: {sum(rules.values()):.3f} s a round, all groups "
                f"({', '.join(f'{g} {d:.3f}' for g, d in sorted(rules.items()))})"
            )
            if args.no_thanos:
                continue
            shards = [
                backfill(fleet, end, Path(tmp) / f"shard-{i}", lambda t, i=i: shard_of(t) == i)
                for i in range(SHARDS)
            ]
            if args.records:
                for shard in shards:
                    asyncio.run(add_records(shard, end))
            try:
                result = asyncio.run(through_thanos(shards, Path(tmp), end, args.runs, client))
            except (PrometheusMissing, ThanosMissing) as err:
                print(f"# Thanos: {err}")
                continue
            r, z = result["rounds"], result["sizing"]
            same = r["plan"] == z["plan"] == plans.get("3", r["plan"])
            print(
                f"cluster: {nodes} nodes through Thanos Query over {SHARDS} Prometheus 3 shards, "
                f"{r['findings']} findings{held}; "
                f"same plan as one Prometheus: {'yes' if same else 'NO'}"
            )
            print_rows(r, z, None, (*ROWS, "thanos_cpu_s"))


if __name__ == "__main__":
    main()
