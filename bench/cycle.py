"""Benchmark: one exporter collection cycle on the reference node (docs/design.md), against the
cost of merely reading the same files, measured side by side in one run.

Reference node (built by the fake-host builder): 8 NUMA nodes, 224 CPUs, 150 pods /
300 containers and each pod's sandbox cgroup, named as the API server names them (the
sandboxes are then not read), one resctrl monitoring group per pod under Sub-NUMA Clustering, 8 GPUs
with 7 MIG slices each through the simulator's NVML library, and the kubelet's
PodResources API served over gRPC by the simulator's kubelet in a process of its own.
CPU time is process time (all threads), the median of many cycles.

The GPU and kubelet sources are also set against the raw calls they make: CPU spent
inside pynvml's functions (the fake driver answering in place of libnvidia-ml), and the
two gRPC calls made bare with grpcio.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import os
import statistics
import subprocess
import sys
import tempfile
import time
from types import SimpleNamespace

import aiohttp
import psutil
import pynvml

import bench.series as series_bill
import numaguard.exporter.sources as sources
from numaguard.common.process import one_malloc_arena, settle_garbage_collector
from numaguard.exporter.collection import Collection
from numaguard.exporter.sources.cgroups import CgroupSource
from numaguard.exporter.sources.gpu import NvmlSource
from numaguard.exporter.sources.host import HostSource
from numaguard.exporter.sources.kubelet import PodResourcesSource
from numaguard.exporter.sources.podresources import api_pb2, api_pb2_grpc
from numaguard.exporter.sources.resctrl import ResctrlSource
from numaguard.simulator.cluster.simulated import SimulatedCluster
from numaguard.simulator.fakes import presets
from numaguard.simulator.fakes.host import KUBELET_CONFIG, FakeHostRoot, pod_metadata
from numaguard.simulator.fakes.resctrl import FakeResctrl
from numaguard.simulator.parts.controlplane import ControlPlane
from numaguard.simulator.parts.processes import exporter_process, get

TARGET_CPU_MS = 50.0
TARGET_RATIO = 3.0
INTERVAL_S = 15.0


def files_read_by_one_cycle(collection: Collection, loop) -> list[str]:
    """The paths a cycle reads, recorded by wrapping the one function that reads files."""
    seen: list[str] = []
    original = sources.read_text

    def recording(path: str) -> str:
        seen.append(path)
        return original(path)

    loop.run_until_complete(collection.run_once())  # the first also reads what is then cached
    sources.read_text = recording
    try:
        loop.run_until_complete(collection.run_once())
    finally:
        sources.read_text = original
    return seen


def read_only(paths: list[str]) -> None:
    """The least Python can do to read the files: open, one read, close."""
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.read(fd, 65536)
        finally:
            os.close(fd)


def pread_kept(fds: list[int]) -> None:
    """Reading the same files from descriptors kept open, as the exporter does."""
    for fd in fds:
        os.pread(fd, 65536, 0)


# This machine's own kernel files, by kind, as a node's exporter reads them: what one
# read costs there against the same bytes on tmpfs says what the bench tree leaves out.
REAL_KERNEL_FILES = {
    "cgroup": [
        "/sys/fs/cgroup/memory/memory.numa_stat",
        "/sys/fs/cgroup/memory/memory.stat",
        "/sys/fs/cgroup/cpu/cpu.stat",
        "/sys/fs/cgroup/cpuset/cpuset.effective_cpus",
        "/sys/fs/cgroup/memory.numa_stat",
        "/sys/fs/cgroup/cpu.stat",
        "/sys/fs/cgroup/cpu.pressure",
        "/sys/fs/cgroup/cpuset.cpus.effective",
    ],
    "proc": ["/proc/vmstat", "/proc/self/cgroup", "/proc/1/cgroup", "/proc/self/stat"],
    "sysfs": [
        "/sys/devices/system/node/node0/meminfo",
        "/sys/devices/system/node/node0/numastat",
        "/sys/devices/system/node/node0/cpulist",
        "/sys/devices/system/node/node0/distance",
        "/sys/devices/system/cpu/cpu0/topology/physical_package_id",
    ],
}


def per_read_us(paths: list[str], repeats: int, kept: bool) -> float:
    fds = [os.open(p, os.O_RDONLY) for p in paths] if kept else []
    try:
        start = time.process_time()
        for _ in range(repeats):
            if kept:
                pread_kept(fds)
            else:
                read_only(paths)
        return (time.process_time() - start) * 1e6 / (repeats * len(paths))
    finally:
        for fd in fds:
            os.close(fd)


def real_kernel_costs(tmp: str, repeats: int = 2000) -> dict[str, tuple]:
    """kind -> (files, real us, tmpfs us, real kept us, tmpfs kept us) per read."""
    out = {}
    for kind, candidates in REAL_KERNEL_FILES.items():
        real = [p for p in candidates if os.access(p, os.R_OK)]
        if not real:
            continue
        copies = []
        for i, path in enumerate(real):
            with open(path, "rb") as f:
                data = f.read()
            copy = f"{tmp}/real-{kind}-{i}"
            with open(copy, "wb") as f:
                f.write(data)
            copies.append(copy)
        out[kind] = (
            len(real),
            per_read_us(real, repeats, False),
            per_read_us(copies, repeats, False),
            per_read_us(real, repeats, True),
            per_read_us(copies, repeats, True),
        )
    return out


async def exporter_rss_mib() -> tuple[float, float]:
    """RSS of a real exporter process serving the reference node after a few cycles,
    without GPUs or kubelet and with them; its pods on a real control plane, their names
    from its watch, as in a cluster."""
    host, nvml = presets.reference_gpu_node()
    with tempfile.TemporaryDirectory(prefix="ng", dir="/tmp") as tmp:  # short socket paths
        async with ControlPlane() as cp:
            async with aiohttp.ClientSession() as session:
                await cp.install_numaguard(session)
            sim = SimulatedCluster(tmp, cp)
            node = sim.add_node("reference", host, nvml, "none")
            await sim.start()
            try:
                FakeResctrl(node.root.root, host, snc={0: [0, 1, 2, 3], 1: [4, 5, 6, 7]}).write()
                account = "numaguard-exporter"
                kubeconfig = cp.kubeconfig(f"{tmp}/kubeconfig", cp.tokens[account], account)
                args = (
                    *("--host-root", str(node.root.root), "--node-name", "reference"),
                    *("--interval", "0.5", "--log-level", "warning", "--kubeconfig", kubeconfig),
                )
                without = await process_rss_mib(*args, "--gpu-backend", "none")
                kubelet = node.kubelet.socket_path
                return without, await process_rss_mib(
                    *args, "--pod-resources-socket", kubelet, gpus=node.description
                )
            finally:
                await sim.stop()


async def process_rss_mib(*args: str, gpus: str | None = None) -> float:
    """The median RSS over ten seconds of cycles and scrapes, after five of warming up:
    one sample swings by several MiB with where the last cycle's garbage stands."""
    async with exporter_process(*args, gpus=gpus) as (url, proc):
        samples = []
        for i in range(30):
            await get(f"{url}/metrics")
            if i >= 10:
                samples.append(psutil.Process(proc.pid).memory_info().rss / (1 << 20))
            await asyncio.sleep(0.5)
        return statistics.median(samples)


class TimedNvml(SimpleNamespace):
    """pynvml with every ``nvml*`` function timed (CPU of the calling thread)."""

    def __init__(self) -> None:
        super().__init__()
        self.inside: list[float] = []

    def __getattr__(self, name: str):
        target = getattr(pynvml, name)
        if not (name.startswith("nvml") and callable(target)):
            return target

        @functools.wraps(target)  # the source learns missing functions by name
        def timed(*args):
            start = time.thread_time()
            try:
                return target(*args)
            finally:
                self.inside.append(time.thread_time() - start)

        return timed


def raw_kubelet_calls(socket: str) -> None:
    """The two calls the kubelet source makes, with nothing done with the answers, made
    by grpcio (its C core's threads included in the CPU)."""
    import grpc

    with grpc.insecure_channel(f"unix://{socket}") as channel:
        stub = api_pb2_grpc.PodResourcesListerStub(channel)
        stub.List(api_pb2.ListPodResourcesRequest(), timeout=5)
        stub.GetAllocatableResources(api_pb2.AllocatableResourcesRequest(), timeout=5)


def cpu_ms(fn, repeats: int) -> list[float]:
    out = []
    for _ in range(repeats):
        start = time.process_time()
        fn()
        out.append((time.process_time() - start) * 1000)
    return out


class IntervalClock:
    """Monotonic time, moved on by the exporter's interval at each cycle: the GPUs'
    activity counters (GPM) are measured between cycles, which NVML does only 100 ms
    apart or more, as every cycle on a node is; back to back, cycles would skip it."""

    def __init__(self) -> None:
        self.offset = 0.0

    def __call__(self) -> float:
        return time.monotonic() + self.offset

    def next(self) -> None:
        self.offset += INTERVAL_S


def interleaved(repeats: int, *fns) -> list[list[float]]:
    """CPU ms of each function, called in turn ``repeats`` times."""
    out: list[list[float]] = [[] for _ in fns]
    for _ in range(repeats):
        for fn, times in zip(fns, out, strict=True):
            start = time.process_time()
            fn()
            times.append((time.process_time() - start) * 1000)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--cycles", type=int, default=40)
    p.add_argument("--no-rss", action="store_true", help="skip the RSS measurement")
    args = p.parse_args()
    # tmpfs, like the kernel's own sysfs/cgroupfs: no disk writeback noise in the timings
    shm = "/dev/shm" if os.path.isdir("/dev/shm") else None
    with tempfile.TemporaryDirectory(dir=shm) as tmp:
        clock = IntervalClock()  # GPU activity between cycles, as at a 15 s interval
        host, nvml = presets.reference_gpu_node(clock)
        FakeHostRoot(tmp, host).write()
        names = pod_metadata(host)
        # Sub-NUMA Clustering, 4 nodes per socket's L3, as on the reference 8-node box
        kernel = FakeResctrl(tmp, host, snc={0: [0, 1, 2, 3], 1: [4, 5, 6, 7]}).write()
        socket = f"{tmp}/kubelet.sock"
        kubelet = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "numaguard.simulator.fakes.podresources",
                socket,
                "--preset",
                "reference_gpu_node",
            ],
            stdout=subprocess.PIPE,
        )
        assert kubelet.stdout.readline().strip() == b"ready"
        nvml.install()
        gpus = NvmlSource(pynvml, tmp, clock=clock)
        gpus.start()
        # the GPU row's own source: timing every NVML call costs, and not in the cycle
        timed = TimedNvml()
        timed_gpus = NvmlSource(timed, tmp)
        timed_gpus.start()
        pod_resources = PodResourcesSource(socket, config=f"{tmp}/{KUBELET_CONFIG}")
        collection = Collection(
            "reference",
            {
                "host_numa": HostSource(tmp),
                "pod_placement": CgroupSource(tmp, page_size=4096),
                "resctrl": ResctrlSource(tmp, "manage", kernel),
                "gpu": gpus,
                "pod_resources": pod_resources,
            },
            # the pods' names, as the watch has them in a cluster: each pod's sandbox
            # cgroup (the tree has them, as a node does) is then not read
            metadata=lambda: names,
        )
        one_malloc_arena()  # the exporter process's settings
        settle_garbage_collector()
        loop = asyncio.new_event_loop()  # one, as in the exporter: the kubelet's channel is on it
        paths = files_read_by_one_cycle(collection, loop)
        monitored = len(kernel.group_names())

        fds = [os.open(p, os.O_RDONLY) for p in paths]
        # interleaved, a cycle of each in turn: a shared machine's speed drifts
        ours, render, baseline, kept = interleaved(
            args.cycles,
            lambda: clock.next() or loop.run_until_complete(collection.run_once()),
            lambda: collection.render(collection.snapshot),
            lambda: read_only(paths),
            lambda: pread_kept(fds),
        )
        for fd in fds:
            os.close(fd)
        kernel_costs = real_kernel_costs(tmp)
        timed_gpus.read()  # what a UUID fixes is asked once, as in the cycle
        timed.inside.clear()
        gpu_read = cpu_ms(timed_gpus.read, args.cycles)
        nvml_raw = sum(timed.inside) * 1000 / args.cycles
        kubelet_read = cpu_ms(lambda: loop.run_until_complete(pod_resources.read()), args.cycles)
        kubelet_raw = cpu_ms(lambda: raw_kubelet_calls(socket), args.cycles)
        pod_resources.close()
        loop.close()
        gpus.close()
        timed_gpus.close()
        snap = collection.snapshot
        kubelet.terminate()
        kubelet.wait()
    cpu_rss_mib, rss_mib = (0.0, 0.0) if args.no_rss else asyncio.run(exporter_rss_mib())

    ours_ms, base_ms, render_ms = (statistics.median(x) for x in (ours, baseline, render))
    kept_ms = statistics.median(kept)
    gpu_ms = statistics.mean(gpu_read)  # the raw side is a total over the same reads
    kubelet_ms, kubelet_raw_ms = statistics.median(kubelet_read), statistics.median(kubelet_raw)
    slices = sum(len(g.slices) for g in snap.gpus.gpus)
    ratio = ours_ms / base_ms
    overhead = ours_ms / 1000 / INTERVAL_S * 100
    containers = sum(len(p.containers) for p in snap.pods)
    print(
        f"reference node: {len(snap.numa_nodes)} NUMA nodes, "
        f"{len(snap.topology.node_of_cpu)} CPUs, "
        f"{len(snap.pods)} pods / {containers} containers ({monitored} with resctrl groups), "
        f"{len(snap.gpus.gpus)} GPUs / {slices} MIG slices, {len(paths)} files"
    )
    print(f"{'measure':<44}{'numaguard':>12}{'peer':>12}{'ratio':>8}  target")
    default, detail = series_bill.totals()
    print(
        f"{'series by default vs with --detail':<44}{default:>12,}{detail:>12,}"
        f"{default / detail:>8.2f}  <= {series_bill.TARGET:,} by default: "
        f"{'met' if default <= series_bill.TARGET else 'NOT met'}"
    )
    print(
        f"{'cycle CPU ms (median) vs reading the files':<44}{ours_ms:>12.2f}{base_ms:>12.2f}"
        f"{ratio:>8.2f}  <= {TARGET_RATIO:g}x: {'met' if ratio <= TARGET_RATIO else 'NOT met'}"
    )
    print(
        f"{'cycle CPU ms (median)':<44}{ours_ms:>12.2f}{'':>12}{'':>8}  <= {TARGET_CPU_MS:g} ms: "
        f"{'met' if ours_ms <= TARGET_CPU_MS else 'NOT met'}"
    )
    print(
        f"{'cycle CPU ms vs pread on kept descriptors':<44}{ours_ms:>12.2f}{kept_ms:>12.2f}"
        f"{ours_ms / kept_ms:>8.2f}"
    )
    print(f"{'  of which rendering the exposition, ms':<44}{render_ms:>12.2f}")
    print(
        f"{'GPU source CPU ms vs inside NVML calls':<44}{gpu_ms:>12.2f}{nvml_raw:>12.2f}"
        f"{gpu_ms / nvml_raw:>8.2f}"
    )
    print(
        f"{'kubelet source CPU ms vs bare grpcio calls':<44}{kubelet_ms:>12.2f}"
        f"{kubelet_raw_ms:>12.2f}{kubelet_ms / kubelet_raw_ms:>8.2f}"
    )
    print(
        f"{'overhead at a 15 s interval, % of a core':<44}{overhead:>12.3f}{'':>20}  <= 0.5%: "
        f"{'met' if overhead <= 0.5 else 'NOT met'}"
    )
    for kind, (n, real, fake, real_kept, fake_kept) in kernel_costs.items():
        print(
            f"{f'us a read, this machine {kind} ({n}) vs tmpfs':<44}{real:>12.2f}{fake:>12.2f}"
            f"{real / fake:>8.2f}"
        )
        print(
            f"{'  the same from kept descriptors':<44}{real_kept:>12.2f}{fake_kept:>12.2f}"
            f"{real_kept / fake_kept:>8.2f}"
        )
    # On a node every file is a kernel one: the cycle costs what it does here plus, per
    # file, what a kernel file costs more than tmpfs to read from a kept descriptor.
    if kernel_costs:
        extra_us = statistics.mean(r[3] - r[4] for r in kernel_costs.values())
        node_ms = ours_ms + len(paths) * extra_us / 1000
        print(
            f"{'est. cycle CPU ms on a node (real files)':<44}{node_ms:>12.2f}{'':>20}  "
            f"(+{extra_us:.2f} us a file)"
        )
    if args.no_rss:
        print("exporter process RSS: not measured (--no-rss)")
        return
    print(
        f"{'exporter process RSS, MiB':<44}{rss_mib:>12.1f}{'':>20}  <= 80: "
        f"{'met' if rss_mib <= 80 else 'NOT met'}"
    )
    print(
        f"{'  the same node without GPUs or kubelet, MiB':<44}{cpu_rss_mib:>12.1f}{'':>20}  <= 80: "
        f"{'met' if cpu_rss_mib <= 80 else 'NOT met'}"
    )


if __name__ == "__main__":
    main()
