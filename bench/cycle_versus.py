"""Benchmark: this checkout's exporter cycle against another checkout's (an earlier
revision or release), on one reference-node tree, measured in the same run.

The tree is written once by this checkout's simulator (with the pods' sandbox cgroups,
as a node has them) and copied for the other, so both read the same files. Each side
runs in a process of its own, with its own simulator's NVML library, kubelet and resctrl
kernel, in alternating rounds; a round is the median process CPU of --cycles cycles.
Checkouts from before the ``numaguard`` namespace (top-level ``exporter``), or from when
setup.py mapped top-level folders into it, work too: the oldest then gets no pod names
and reads every cgroup, sandboxes included, as it did.

    git worktree add /tmp/before <rev> && python bench/cycle_versus.py /tmp/before
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent

# Run in the measuring process, with either checkout first on sys.path.
MEASURE = r"""
import asyncio, statistics, subprocess, sys, time
tree, cycles, layout = sys.argv[1], int(sys.argv[2]), sys.argv[3]
if layout == "namespace":
    from numaguard.exporter import collection as col
    from numaguard.exporter.sources import cgroups, gpu, host, kubelet, resctrl
    from numaguard.simulator.fakes import presets
    from numaguard.simulator.fakes.host import pod_metadata
    from numaguard.simulator.fakes.resctrl import FakeResctrl
    simulator = "numaguard.simulator"
else:
    from exporter import collection as col
    from exporter.sources import cgroups, gpu, host, kubelet, resctrl
    from simulator import presets
    from simulator.fakes.resctrl import FakeResctrl
    simulator = "simulator"
import pynvml

offset = [0.0]  # moved on by 15 s a cycle: GPU activity is measured every cycle


def clock():
    return time.monotonic() + offset[0]


node, nvml = presets.reference_gpu_node(clock)
kernel = FakeResctrl(tree, node, snc={0: [0, 1, 2, 3], 1: [4, 5, 6, 7]}).write()
socket = f"{tree}/kubelet.sock"
served = subprocess.Popen(
    [sys.executable, "-m", f"{simulator}.kubelet", socket, "--preset", "reference_gpu_node"],
    stdout=subprocess.PIPE,
)
assert served.stdout.readline().strip() == b"ready"
nvml.install()
gpus = gpu.NvmlSource(pynvml, tree, clock=clock)
gpus.start()
pod_resources = kubelet.PodResourcesSource(socket)
sources = {
    "host_numa": host.HostSource(tree),
    "pod_placement": cgroups.CgroupSource(tree, page_size=4096),
    "resctrl": resctrl.ResctrlSource(tree, "manage", kernel),
    "gpu": gpus,
    "pod_resources": pod_resources,
}
extra = {}
if layout == "namespace":
    names = pod_metadata(node)
    extra["metadata"] = lambda: names
collection = col.Collection("reference", sources, **extra)
# the exporter process's settings, as the checkout has them
settle_garbage_collector = lambda: None  # noqa: E731
try:
    if layout == "namespace":
        from numaguard.common.process import one_malloc_arena, settle_garbage_collector
    else:
        from exporter.cli import _one_malloc_arena as one_malloc_arena
except ImportError:
    from numaguard.exporter.cli import _one_malloc_arena as one_malloc_arena
one_malloc_arena()
settle_garbage_collector()
loop = asyncio.new_event_loop()
for _ in range(3):
    loop.run_until_complete(collection.run_once())
times = []
for _ in range(cycles):
    offset[0] += 15.0
    start = time.process_time()
    loop.run_until_complete(collection.run_once())
    times.append((time.process_time() - start) * 1000)
snap = collection.snapshot
series = collection.exposition.text.count(b"\n") - collection.exposition.text.count(b"\n#")
print(col.__file__, statistics.median(times), sum(len(p.containers) for p in snap.pods), series)
pod_resources.close()
loop.close()
gpus.close()
served.terminate()
served.wait()
"""


def layout_of(checkout: Path) -> str:
    return "namespace" if (checkout / "numaguard" / "__init__.py").is_file() else "top-level"


def importable(checkout: Path, into: Path) -> Path:
    """A directory that, first on sys.path, makes the checkout's code the one imported
    (ahead of an installed numaguard): the checkout itself where its folders are the
    import paths, else (setup.py's mapped folders) those folders linked under it."""
    if layout_of(checkout) == "top-level" or (checkout / "numaguard" / "exporter").is_dir():
        return checkout
    package = into / "numaguard"
    package.mkdir(parents=True)
    shutil.copy(checkout / "numaguard" / "__init__.py", package)
    for folder in ("exporter", "simulator"):
        (package / folder).symlink_to(checkout / folder)
    return into


def measure(checkout: Path, path: Path, tree: str, cycles: int) -> tuple[float, int, int]:
    run = subprocess.run(
        [sys.executable, "-c", MEASURE, tree, str(cycles), layout_of(checkout)],
        env=dict(os.environ, PYTHONPATH=str(path)),
        cwd=tree,
        capture_output=True,
        text=True,
    )
    if run.returncode:
        sys.exit(f"measuring {checkout} failed:\n{run.stderr[-3000:]}")
    source, ms, containers, series = run.stdout.split()[-4:]
    if not Path(source).resolve().is_relative_to(checkout):
        sys.exit(f"measuring {checkout} ran the code in {source}")
    return float(ms), int(containers), int(series)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("other", type=Path, help="the other checkout (e.g. a git worktree)")
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--cycles", type=int, default=30)
    args = p.parse_args()
    sys.path.insert(0, str(ROOT))
    from numaguard.simulator.fakes import presets
    from numaguard.simulator.fakes.host import FakeHostRoot

    sides = {"this checkout": ROOT, str(args.other): args.other.resolve()}
    shm = "/dev/shm" if os.path.isdir("/dev/shm") else None
    with tempfile.TemporaryDirectory(dir=shm) as base:
        FakeHostRoot(f"{base}/0", presets.reference_gpu_node()[0]).write()
        shutil.copytree(f"{base}/0", f"{base}/1", symlinks=True)
        paths = [importable(c, Path(base, f"code{i}")) for i, c in enumerate(sides.values())]
        rounds: dict[str, list[float]] = {name: [] for name in sides}
        shape = {}
        for _ in range(args.rounds):
            for i, (name, checkout) in enumerate(sides.items()):
                ms, containers, series = measure(checkout, paths[i], f"{base}/{i}", args.cycles)
                rounds[name].append(ms)
                shape[name] = (containers, series)
    ours, theirs = (statistics.median(r) for r in rounds.values())
    print(f"{'cycle CPU ms (median of round medians)':<44}{'ours':>10}{'other':>10}{'ratio':>8}")
    print(f"{'':<44}{ours:>10.2f}{theirs:>10.2f}{ours / theirs:>8.2f}")
    for name, (containers, series) in shape.items():
        print(f"  {name}: {containers} containers, {series} series; rounds {rounds[name]}")


if __name__ == "__main__":
    main()
