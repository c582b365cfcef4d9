"""Run inside the node VM (tests/test_node_vm.py): two pods' containers laid out in
cgroup v2 as the kubelet's systemd driver and containerd lay them out — a Guaranteed
container whose exclusive CPUs sit on NUMA node 0 and whose memory the kernel is told to
place on node 1 (set_mempolicy MPOL_BIND, as `numactl --membind=1` does), and one whose
exclusive CPUs span both nodes — then the exporter as it ships, reading this kernel.
Writes to the folder it is given: the exporter's scrape, and each container's
memory.numa_stat and /proc/<pid>/numa_maps read just after; then the remote container's
memory moved home to node 0 in place (exporter/memory_mover.py), what the move says,
its numa_maps after and the exporter's next verdict."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time

from numaguard.simulator.parts.processes import exporter_process, get, until

CG = "/sys/fs/cgroup"
KUBEPODS = f"{CG}/kubepods.slice"
CONTROLLERS = "+cpuset +cpu +memory"
# name: (pod uid, container id, exclusive CPUs, the NUMA node its memory is bound to);
# node 0 has CPUs 0-1, node 1 CPUs 2-3
PODS = {
    "remote": ("11111111-2222-3333-4444-555555555555", "a" * 64, "0", 1),
    "span": ("66666666-7777-8888-9999-000000000000", "b" * 64, "1-2", None),
}
TOUCHED_MIB = 256
# the remote child's reservation: seen, one far page at the end of 0.25 TiB held the mover
# at full CPU for minutes, asking where each of its 64 Mi addresses is
RESERVED_GIB = 256
# the child: into its container's cgroup, its memory policy set, its memory touched
CHILD = """
import ctypes, os, sys
scope, bind, RESERVED_GIB = sys.argv[1], sys.argv[2], int(sys.argv[4])
with open(f"{scope}/cgroup.procs", "w") as f:
    f.write(str(os.getpid()))
if bind != "-":
    libc = ctypes.CDLL(None, use_errno=True)
    mask = ctypes.c_ulong(1 << int(bind))
    # set_mempolicy(MPOL_BIND, &mask, maxnode): syscall 238 on x86_64
    if libc.syscall(238, 2, ctypes.byref(mask), 64) != 0:
        sys.exit(f"set_mempolicy: errno {ctypes.get_errno()}")
memory = bytearray(int(sys.argv[3]) << 20)
memory[::4096] = b"\\x01" * (len(memory) // 4096)  # every page touched
if bind != "-":  # and 0.25 TiB reserved (MAP_NORESERVE), one far page of it touched
    import mmap
    flags = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | 0x4000
    reserved = mmap.mmap(-1, RESERVED_GIB << 30, flags=flags)
    reserved[-1:] = b"\\x01"
if bind != "-":  # the memory stays where it was put, the policy goes: as the kernel's own
    libc.syscall(238, 0, None, 0)  # set_mempolicy(MPOL_DEFAULT)
print("ready", flush=True)
sys.stdin.read()  # held until the test closes its stdin (or kills it)
"""


def step(what: str) -> None:
    """Where the run got to, in out.txt as it goes: what a timeout shows."""
    print(f"{time.monotonic():.1f} {what}", flush=True)


def write(path: str, text: str) -> None:
    with open(path, "w") as f:
        f.write(text)


def cgroup(path: str, cpus: str = "", mems: str = "", children: bool = False) -> None:
    os.makedirs(path, exist_ok=True)
    if cpus:
        write(f"{path}/cpuset.cpus", cpus)
    if mems:
        write(f"{path}/cpuset.mems", mems)
    if children:
        write(f"{path}/cgroup.subtree_control", CONTROLLERS)


async def main(out: str) -> None:
    write(f"{CG}/cgroup.subtree_control", CONTROLLERS)
    cgroup(KUBEPODS, children=True)
    # the shared pool: what the static CPU manager leaves when it gave CPUs 0-2 away
    cgroup(f"{KUBEPODS}/kubepods-burstable.slice", "3", "0-1")
    children, scopes = {}, {}
    for name, (uid, container, cpus, bind) in PODS.items():
        pod = f"{KUBEPODS}/kubepods-pod{uid.replace('-', '_')}.slice"
        cgroup(pod, children=True)
        scopes[name] = f"{pod}/cri-containerd-{container}.scope"
        cgroup(scopes[name], cpus, "0-1")
        children[name] = subprocess.Popen(
            [
                sys.executable,
                "-c",
                CHILD,
                scopes[name],
                str(bind) if bind is not None else "-",
                str(TOUCHED_MIB),
                str(RESERVED_GIB),
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
    for child in children.values():
        assert child.stdout.readline().strip() == "ready"
    step("both containers' memory touched")
    try:
        args = ("--node-name", "vm", "--interval", "2")
        args += ("--no-collector.gpu", "--no-collector.resctrl")
        async with exporter_process(*args) as (url, _):

            async def both_judged() -> str | None:
                text = (await get(f"{url}/metrics")).decode()
                verdicts = [
                    ln for ln in text.splitlines() if ln.startswith("numaguard_pod_cross_numa{")
                ]
                judged = all(any(uid in ln for ln in verdicts) for uid, *_ in PODS.values())
                return text if judged else None

            step("the exporter is up")
            # an emulated guest is slow: the timeout only ends a hang
            text = await until(both_judged, "both pods judged", timeout=600)
            step("both pods judged")
            write(f"{out}/metrics.txt", text)
            for name, child in children.items():
                with open(f"{scopes[name]}/memory.numa_stat") as f:
                    write(f"{out}/{name}.numa_stat", f.read())
                with open(f"/proc/{child.pid}/numa_maps") as f:
                    write(f"{out}/{name}.numa_maps", f.read())
            await move_home(out, children["remote"], url)
    finally:
        for child in children.values():
            child.kill()


# the remote pod's memory moved home by the mover's helper as its container runs it
# (uid 0, every capability dropped but the one it adds); first with CAP_SYS_NICE
# instead, which the kernel refuses
MOVE = """
import dataclasses, json, sys
from numaguard.exporter.mover.pages import Kernel, Pace, move_pod_memory
moved = move_pod_memory([sys.argv[1]], sys.argv[2], 0, Pace(MOVE_RATE), Kernel())
print(json.dumps({**dataclasses.asdict(moved), "failures": dict(moved.failures)}))
"""
MOVE_RATE = 64 << 20  # bytes a second: the 256 MiB take at least 4 s


async def move_home(out: str, child: subprocess.Popen, url: str) -> None:
    uid = PODS["remote"][0]
    pod = f"{KUBEPODS}/kubepods-pod{uid.replace('-', '_')}.slice"
    # as nodes tuned for GPU jobs run, and as the loop's in-place story does: with the
    # kernel's NUMA balancing on, Linux 6.1's move_pages cannot see a page it marked for a
    # hinting fault (ENOENT, docs/remediator.md), and how many it marks is timing
    with open("/proc/sys/kernel/numa_balancing", "w") as f:
        f.write("0")
    for cap in ("sys_nice", "sys_ptrace"):
        caps = f"-all,+{cap}"
        ran = subprocess.run(
            [
                *("setpriv", f"--bounding-set={caps}", "--inh-caps=-all", "--ambient-caps=-all"),
                *(sys.executable, "-c", f"MOVE_RATE = {MOVE_RATE}\n{MOVE}", pod, uid),
            ],
            capture_output=True,
            text=True,
            timeout=300,  # only ends a hang
        )
        step(f"moved with CAP_{cap.upper()}: exit {ran.returncode}")
        write(f"{out}/move.{cap}.json", ran.stdout)
        write(f"{out}/move.{cap}.stderr", ran.stderr)
    write(f"{out}/remote.alive", str(child.poll() is None))
    with open(f"/proc/{child.pid}/numa_maps") as f:
        write(f"{out}/remote.after.numa_maps", f.read())
    with open(f"{pod}/cri-containerd-{PODS['remote'][1]}.scope/memory.numa_stat") as f:
        write(f"{out}/remote.after.numa_stat", f.read())

    last = {}

    async def home() -> str | None:
        """The exporter's scrape once a cycle read the pod after the move: its memory
        on node 1 down to what stays (pages other processes map too)."""
        text = last["text"] = (await get(f"{url}/metrics")).decode()
        memory = {
            ln.split('numa_node="', 1)[1][0]: float(ln.rsplit(" ", 1)[1])
            for ln in text.splitlines()
            if ln.startswith("numaguard_pod_memory_bytes{") and uid in ln
        }
        touched = TOUCHED_MIB << 20  # a node without any is not shown
        at_home = memory.get("0", 0) >= touched and memory.get("1", 0) <= touched // 50
        return text if at_home else None

    try:
        write(f"{out}/metrics.after.txt", await until(home, "the remote pod seen at home", 120))
    finally:
        write(f"{out}/metrics.last.txt", last.get("text", ""))


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1]))
