"""Benchmark: scrape latency under 50 concurrent scrapers, and CPU per scrape, for the
numaguard exporter and node_exporter (Debian ``prometheus-node-exporter``, its
``meminfo_numa`` collector only) serving the same fake host root, measured in one run.

Our scrapes are answered from the bytes of the last collection cycle; node_exporter reads
and renders its collector on every scrape. Both serve the SPEC §7 reference node.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiohttp
import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from simulator import presets
from simulator.host import FakeHostRoot
from simulator.processes import exporter_process, free_port, wait_ok

SCRAPERS = 50
NODE_EXPORTER = "prometheus-node-exporter"


async def hammer(url: str, scrapers: int, per_scraper: int) -> tuple[list[float], int]:
    """Latencies (ms) of ``scrapers`` clients each scraping ``per_scraper`` times."""
    latencies: list[float] = []
    size = 0

    async def one(session: aiohttp.ClientSession) -> None:
        nonlocal size
        for _ in range(per_scraper):
            start = time.perf_counter()
            async with session.get(url) as r:
                body = await r.read()
            latencies.append((time.perf_counter() - start) * 1000)
            size = len(body)

    # as Prometheus does: ask for gzip; the bytes are not inflated here, so that the
    # scrapers' own CPU does not crowd the servers out of this small machine
    async with aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=scrapers),
        auto_decompress=False,
        headers={"Accept-Encoding": "gzip"},
    ) as session:
        await asyncio.gather(*(one(session) for _ in range(scrapers)))
    return latencies, size


async def measure(url: str, pid: int, scrapers: int, per_scraper: int) -> dict:
    await hammer(url, 5, 2)  # warm
    process = psutil.Process(pid)
    before = process.cpu_times()
    latencies, size = await hammer(url, scrapers, per_scraper)
    after = process.cpu_times()
    cpu = (after.user - before.user) + (after.system - before.system)
    q = statistics.quantiles(latencies, n=100)
    return {
        "p50": q[49],
        "p99": q[98],
        "cpu_ms_per_scrape": cpu * 1000 / len(latencies),
        "bytes": size,
    }


async def run(per_scraper: int) -> dict:
    shm = "/dev/shm" if os.path.isdir("/dev/shm") else None
    with tempfile.TemporaryDirectory(dir=shm) as tmp:
        root = FakeHostRoot(tmp, presets.reference_node()).write()
        results = {}
        args = (
            "--host-root",
            str(root.root),
            "--gpu-backend",
            "none",
            "--resctrl-mode",
            "off",
            "--log-level",
            "error",
        )
        async with exporter_process(*args) as (url, proc):
            results["numaguard"] = await measure(f"{url}/metrics", proc.pid, SCRAPERS, per_scraper)
        binary = shutil.which(NODE_EXPORTER)
        if binary is None:
            raise SystemExit(
                f"{NODE_EXPORTER} not found: apt-get install {NODE_EXPORTER} ('make bench' does it)"
            )
        port = free_port()
        ne = subprocess.Popen(
            [
                binary,
                "--collector.disable-defaults",
                "--collector.meminfo_numa",
                f"--path.sysfs={root.root}/sys",
                f"--path.procfs={root.root}/proc",
                f"--web.listen-address=127.0.0.1:{port}",
                "--log.level=error",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            await wait_ok(f"http://127.0.0.1:{port}/metrics")
            results["node_exporter"] = await measure(
                f"http://127.0.0.1:{port}/metrics", ne.pid, SCRAPERS, per_scraper
            )
        finally:
            ne.terminate()
            ne.wait(timeout=10)
    return results


def rows(per_scraper: int = 20) -> list[tuple]:
    r = asyncio.run(run(per_scraper))
    ours, peer = r["numaguard"], r["node_exporter"]
    return [
        (f"scrape p50 ms, {SCRAPERS} concurrent scrapers", ours["p50"], peer["p50"], None),
        (
            f"scrape p99 ms, {SCRAPERS} concurrent scrapers",
            ours["p99"],
            peer["p99"],
            ("<= 5 ms", ours["p99"] <= 5.0),
        ),
        (
            "CPU ms per scrape",
            ours["cpu_ms_per_scrape"],
            peer["cpu_ms_per_scrape"],
            ("<= node_exporter", ours["cpu_ms_per_scrape"] <= peer["cpu_ms_per_scrape"]),
        ),
        ("exposition bytes (gzip)", ours["bytes"], peer["bytes"], None),
    ]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--per-scraper", type=int, default=20)
    args = p.parse_args()
    print(f"{'measure':<44}{'numaguard':>12}{'node_exp.':>12}{'ratio':>8}  target")
    for name, ours, peer, target in rows(args.per_scraper):
        verdict = f"{target[0]}: {'met' if target[1] else 'NOT met'}" if target else ""
        print(f"{name:<44}{ours:>12.2f}{peer:>12.2f}{ours / peer:>8.2f}  {verdict}")


if __name__ == "__main__":
    main()
