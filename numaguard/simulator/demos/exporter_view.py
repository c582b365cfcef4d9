"""One node's exporter view: the exporter on a simulated 2-socket node with 11 H100 GPUs
(MIG mixed; two joined by an NVLink bridge), its pods on a real control plane (names
from its watch, as the exporter's ServiceAccount) and device allocations from a fake
kubelet over gRPC, while the node's counters move. Prints where to scrape it and a live
view of what it finds: remote memory and traffic, which pod holds which GPU or slice,
how busy it is, which GPUs are starved by their host, and which pod's GPUs cannot reach
each other peer to peer."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import tempfile
import time

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from numaguard.common import logs
from numaguard.exporter.readers import parse_id_list
from numaguard.exporter.readers.nvml import sysfs_pci_address
from numaguard.exporter.server import serve
from numaguard.exporter.settings import Settings
from numaguard.simulator.cluster.simulated import SimulatedCluster
from numaguard.simulator.fakes import presets
from numaguard.simulator.fakes.gpu_exporter import fake_gpus
from numaguard.simulator.fakes.host import GIB, MIB, FakeContainer, FakePod
from numaguard.simulator.fakes.nvml import Process
from numaguard.simulator.fakes.resctrl import FakeResctrl
from numaguard.simulator.parts.controlplane import ControlPlane

NODE = "demo-gpu-node-1"


def demo_node():
    """The preset GPU node, plus a cache whose memory the kernel put on the far node, GPU
    7 under NVIDIA's DynamicMIG, and a data-parallel job moving 2 GB/s over PCIe between
    GPU 3 and GPU 8, both on NUMA node 0 but under different host bridges (no P2P),
    while GPUs 9 and 10, joined by an NVLink bridge, are free on NUMA node 1."""
    host, nvml = presets.gpu_node()
    nvml.set_mig(7, [])  # GPU 7's slices made as DRA claims come (DynamicMIG)
    nvml.gpus[7].dynamic_mig = True
    far, *bridged = nvml.add_gpu("H100-80GB", 0), *(nvml.add_gpu("H100-80GB", 1) for _ in "ab")
    bridged[0].nvlinks, bridged[1].nvlinks = [10] * 12, [9] * 12
    for gpu in (far, *bridged):
        host.pci_devices[sysfs_pci_address(gpu.pci_bus_id)] = gpu.numa_node
    main = FakeContainer("main", "18-31,46-63", {0: 16 * GIB})
    job = FakePod("allreduce", presets.pod_uid("allreduce"), "burstable", [main], "ml")
    host.pods.append(job)
    for gpu in (nvml.gpus[3], far):
        main.devices.setdefault("nvidia.com/gpu", []).append(gpu.uuid)
        gpu.processes.append(Process(host.pid(job, main), 30 * GIB))
        gpu.memory_used_bytes = 30 * GIB
        gpu.activity.set(sm=0.35, graphics=0.4, pcie_tx=GIB, pcie_rx=GIB)
    host.pods.append(
        FakePod(
            "redis-cache",
            presets.pod_uid("redis-cache"),
            "guaranteed",
            [FakeContainer("redis", "42-43", {0: 4 * GIB, 1: 1 * GIB}, exclusive_cpus=True)],
            namespace="cache",
        )
    )
    return host, nvml


# pod -> (GiB moved per interval from L3 domain 0, 1; share of it local)
TRAFFIC = {
    "trainer": ((40, 0), 0.95),
    "trainer-remote": ((12, 0), 0.9),
    "infer-a": ((8, 0), 0.9),
    "redis-cache": ((0, 8), 0.2),
    "web": ((1, 1), 0.9),
}


def advance(host, kernel: FakeResctrl, tick: int) -> None:
    """One interval of life on the node: allocations, memory traffic (some remote), and
    the remote trainer's feeder stalling on CPU."""
    for pod, (per_domain, local) in TRAFFIC.items():
        for domain, gib in enumerate(per_domain):
            total = int(gib * GIB * (1 + 0.1 * (tick % 3)))
            kernel.add_traffic(host.pod(pod).uid, domain, total, int(total * local))
    kernel.set_occupancy(host.pod("trainer").uid, 0, 40 * MIB)
    kernel.set_occupancy(host.pod("redis-cache").uid, 1, 20 * MIB)
    feeder = host.pod("trainer-remote").containers[0]
    some, full = feeder.pressure.get("cpu", (0.0, 0.0))
    feeder.pressure["cpu"] = (some + 1.5 * (tick + 1), full + 0.5)
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
    # /proc/stat: pods' exclusive CPUs busy, the shared pool less so (100 ticks a CPU)
    exclusive = {
        cpu
        for p in host.pods
        for c in p.containers
        if c.exclusive_cpus
        for cpu in parse_id_list(c.cpus)
    }
    for cpu in host.all_cpus:
        busy, idle = host.cpu_ticks.get(cpu, (0, 0))
        step = 90 if cpu in exclusive else 60
        host.cpu_ticks[cpu] = (busy + step, idle + 100 - step)


async def live_view(url: str) -> str:
    async with aiohttp.ClientSession() as session, session.get(url) as r:
        text = await r.text()
    rows: dict[tuple[str, str], dict] = {}
    busy: dict[str, float] = {}  # device uuid -> SM activity
    held: list[tuple[tuple[str, str], str, str]] = []  # pod, device uuid, what it is
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            lb = s.labels
            pod = (lb.get("namespace", ""), lb.get("pod", ""))
            if s.name == "numaguard_pod_cross_numa" and s.value == 1:
                rows.setdefault(pod, {}).setdefault("flags", []).append(lb["reason"])
            elif s.name == "numaguard_pod_memory_remote_ratio":
                rows.setdefault(pod, {})["remote"] = s.value
            elif s.name == "numaguard_pod_remote_traffic_ratio":
                rows.setdefault(pod, {})["traffic"] = s.value
            elif s.name == "numaguard_pod_memory_bandwidth_bytes_per_second":
                rows.setdefault(pod, {})["bw"] = s.value / GIB
            elif s.name in ("numaguard_gpu_utilization_ratio", "numaguard_mig_utilization_ratio"):
                if lb["kind"] == "sm":
                    busy[lb.get("mig_uuid") or lb["gpu_uuid"]] = s.value
            elif s.name == "numaguard_gpu_holder_info":
                what = f"gpu{lb['gpu']}" + (
                    f" {lb['resource'].split('mig-')[1]}" if "mig-" in lb["resource"] else ""
                )
                held.append((pod, lb["mig_uuid"] or lb["gpu_uuid"], what))
            elif s.name == "numaguard_gpu_starved" and s.value == 1:
                rows.setdefault(pod, {}).setdefault("starved", []).append(lb["reason"])
            elif s.name == "numaguard_pod_gpu_link_poor" and s.value == 1:
                rows.setdefault(pod, {}).setdefault("flags", []).append(lb["reason"])
    for pod, uuid, what in held:
        rows.setdefault(pod, {})["device"] = what
        rows[pod]["util"] = busy.get(uuid)
    lines = [
        f"{'pod':<24}{'remote mem':>11}{'GiB/s':>7}{'remote traffic':>15}  "
        f"{'device':<14}{'SM busy':>8}  verdict"
    ]
    for (ns, name), row in sorted(rows.items()):
        if not name:
            continue
        flags = row.get("flags", [])
        if row.get("starved"):
            flags = [*flags, "STARVED by " + "+".join(row["starved"])]
        bw = f"{row['bw']:.1f}" if "bw" in row else "-"
        traffic = f"{row['traffic']:.0%}" if "traffic" in row else "-"
        util = f"{row['util']:.0%}" if row.get("util") is not None else "-"
        lines.append(
            f"{ns + '/' + name:<24}{row.get('remote', 0):>11.0%}{bw:>7}{traffic:>15}  "
            f"{row.get('device', '-'):<14}{util:>8}  {', '.join(flags) or 'aligned'}"
        )
    return "\n".join(lines)


async def main(seconds: float, port: int, interval: float) -> None:
    host, nvml = demo_node()
    # a short directory: the fake kubelet's unix socket lives in it
    with tempfile.TemporaryDirectory(prefix="ng-", dir="/tmp") as tmp:
        async with ControlPlane() as cp:
            async with aiohttp.ClientSession() as session:
                await cp.install_numaguard(session)
            sim = SimulatedCluster(tmp, cp)
            node = sim.add_node(NODE, host, nvml, "single-numa-node")
            await sim.start()
            try:
                await run(sim, node, seconds, port, interval)
            finally:
                await sim.stop()
    print("demo finished: the exporter shut down cleanly")


async def run(sim: SimulatedCluster, node, seconds: float, port: int, interval: float) -> None:
    root, host = node.root, node.host
    kernel = FakeResctrl(root.root, host).write()
    account = "numaguard-exporter"
    settings = Settings(
        host_root=str(root.root),
        host="127.0.0.1",
        port=port,
        node_name=NODE,
        interval_seconds=interval,
        kubeconfig=sim.cp.kubeconfig(
            f"{sim.directory}/kubeconfig", sim.cp.tokens[account], account
        ),
        resctrl_ops=kernel,
        pod_resources_socket=node.kubelet.socket_path,
    )
    fake_gpus(node.description).install()  # this process's NVML: the node's fake GPUs
    stop = asyncio.Event()
    server = asyncio.create_task(serve(settings, stop))
    url = f"http://127.0.0.1:{port}"
    print(f"numaguard exporter on a simulated 2-socket node with 11 H100 GPUs ({NODE})")
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
