"""``make demo``: the exporter on a simulated 2-socket GPU node, with pod names from a
fake API server, while the node's counters move. Prints where to scrape it and a live
view of what it finds."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import tempfile
import time

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from exporter import logs
from exporter.server import Settings, serve
from simulator import presets
from simulator.host import GIB, MIB, FakeContainer, FakeHostRoot, FakePod
from simulator.kubeapi import FakeApiServer, pod_objects
from simulator.resctrl import FakeResctrl

NODE = "demo-gpu-node-1"


def demo_host():
    host = presets.two_socket()
    for ctr in host.pod("web").containers:
        ctr.cpus = "0-1,8-13,18-31"  # CPUs 6-7 become redis's own
    host.pods.append(
        FakePod(
            "redis-cache",
            presets.pod_uid("redis-cache"),
            "guaranteed",
            [
                FakeContainer("redis", "6-7", {0: 1 * GIB, 1: 4 * GIB}),
            ],
            namespace="cache",
        )
    )
    return host


# pod -> (GiB moved per interval from L3 domain 0, 1; share of it local)
TRAFFIC = {
    "trainer-aligned": ((40, 0), 0.95),
    "trainer-split": ((12, 12), 0.5),
    "redis-cache": ((8, 0), 0.2),
    "web": ((1, 1), 0.9),
}


def advance(host, kernel: FakeResctrl, tick: int) -> None:
    """One interval of life on the node: allocations and memory traffic, some remote."""
    for pod, (per_domain, local) in TRAFFIC.items():
        for domain, gib in enumerate(per_domain):
            total = int(gib * GIB * (1 + 0.1 * (tick % 3)))
            kernel.add_traffic(host.pod(pod).uid, domain, total, int(total * local))
    kernel.set_occupancy(host.pod("trainer-aligned").uid, 0, 40 * MIB)
    kernel.set_occupancy(host.pod("redis-cache").uid, 0, 20 * MIB)
    n0, n1 = host.nodes
    n0.numastat.update(
        numa_hit=n0.numastat["numa_hit"] + 9000,
        local_node=n0.numastat["local_node"] + 8000,
        other_node=n0.numastat["other_node"] + 1000 + 500 * (tick % 3),
    )
    n1.numastat.update(
        numa_hit=n1.numastat["numa_hit"] + 4000,
        local_node=n1.numastat["local_node"] + 3900,
        other_node=n1.numastat["other_node"] + 100,
    )
    n0.memory_free_bytes -= 64 << 20


async def live_view(url: str) -> str:
    async with aiohttp.ClientSession() as session, session.get(url) as r:
        text = await r.text()
    rows = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            pod = s.labels.get("pod")
            if s.name == "numaguard_pod_cross_numa" and s.value == 1:
                rows.setdefault((s.labels["namespace"], pod), {}).setdefault("flags", []).append(
                    s.labels["reason"]
                )
            elif s.name == "numaguard_pod_memory_remote_ratio":
                rows.setdefault((s.labels["namespace"], pod), {})["remote"] = s.value
            elif s.name == "numaguard_pod_remote_traffic_ratio":
                rows.setdefault((s.labels["namespace"], pod), {})["traffic"] = s.value
            elif s.name == "numaguard_pod_memory_bandwidth_bytes_per_second":
                rows.setdefault((s.labels["namespace"], pod), {})["bw"] = s.value / GIB
            elif s.name == "numaguard_numa_node_remote_alloc_ratio":
                rows.setdefault(("node", f"numa{s.labels['numa_node']}"), {})["alloc"] = s.value
    lines = [
        f"{'pod / NUMA node':<24}{'remote memory':>14}{'GiB/s':>8}{'remote traffic':>16}  verdict"
    ]
    for (ns, name), row in sorted(rows.items()):
        if ns == "node":
            lines.append(f"{name:<24}{row['alloc']:>13.1%}  (remote allocations last interval)")
        else:
            flags = ", ".join(row.get("flags", [])) or "aligned"
            bw = f"{row['bw']:.1f}" if "bw" in row else "-"
            traffic = f"{row['traffic']:.0%}" if "traffic" in row else "-"
            lines.append(
                f"{ns + '/' + name:<24}{row.get('remote', 0):>13.1%}{bw:>8}{traffic:>16}  {flags}"
            )
    return "\n".join(lines)


async def main(seconds: float, port: int, interval: float) -> None:
    host = demo_host()
    with tempfile.TemporaryDirectory(prefix="numaguard-demo-") as tmp:
        root = FakeHostRoot(f"{tmp}/host", host).write()
        kernel = FakeResctrl(root.root, host).write()
        api = FakeApiServer()
        await api.start()
        for obj in pod_objects(host, NODE):
            api.put("pods", obj)
        settings = Settings(
            host_root=str(root.root),
            host="127.0.0.1",
            port=port,
            node_name=NODE,
            interval_seconds=interval,
            kubeconfig=api.kubeconfig(f"{tmp}/kubeconfig"),
            resctrl_ops=kernel,
        )
        stop = asyncio.Event()
        server = asyncio.create_task(serve(settings, stop))
        url = f"http://127.0.0.1:{port}"
        print(f"numaguard exporter on a simulated 2-socket node ({NODE})")
        print(f"  metrics:   {url}/metrics\n  readiness: {url}/readyz")
        print(f"  host root: {root.root}  (edit files there to see the exporter react)")
        print(f"running for {seconds:g}s; Ctrl-C stops earlier\n", flush=True)
        deadline = time.monotonic() + seconds
        tick = 0
        try:
            while time.monotonic() < deadline and not stop.is_set() and not server.done():
                await asyncio.sleep(interval)
                advance(host, kernel, tick)
                root.write()
                kernel.write()
                tick += 1
                with contextlib.suppress(aiohttp.ClientError):
                    print(
                        f"--- after {tick * interval:g}s\n{await live_view(url + '/metrics')}\n",
                        flush=True,
                    )
        finally:
            stop.set()
            await server
            await api.stop()
    print("demo finished: the exporter shut down cleanly")


def cli() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--seconds", type=float, default=30.0, help="how long to run")
    p.add_argument("--port", type=int, default=9847, help="port for the exporter")
    p.add_argument("--interval", type=float, default=3.0, help="collection interval")
    args = p.parse_args()
    logs.setup("text", "warning")
    asyncio.run(main(args.seconds, args.port, args.interval))


if __name__ == "__main__":
    cli()
