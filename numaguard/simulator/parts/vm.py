"""A real node for the tests: Debian's kernel booted by QEMU with two sockets and two NUMA
nodes (distances 10/21), its root the host's own file system, read-only over 9p under a
tmpfs overlay, so the guest runs this checkout and its virtualenv as they are and writes
nothing back; a job folder shared read-write holds the script the guest runs and what it
writes back. simulator/parts/vm_kubelet.py runs a kubelet, containerd and runc in it.

The parts — Debian's ``linux-image-amd64`` kernel and the modules 9p, the overlay and the
network need, an initramfs around Debian's static busybox, and Debian's runc, CNI plugins
and numactl — are built once into a cache outside the work tree keyed by the kernel's
version and what goes in (``make node-vm``; ``python -m numaguard.simulator.parts.vm build``).
KVM is used when a probe shows it works; nested KVM hangs on some machines after the
kernel's decompressor, so the probe has a timeout and TCG is the fallback (a 2-socket
guest boots in seconds either way)."""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from numaguard.simulator.parts.processes import cache

KERNEL_PACKAGE = "linux-image-amd64"  # Debian's: its Depends names the current kernel
# Debian's, for the node's container runtime (containerd is built from its module: make
# node-vm), the pods' network and numastat; unpacked into the parts' root/
NODE_PACKAGES = ("runc", "containernetworking-plugins", "numactl")
# loaded in this order, each pass loading what the one before made possible
MODULES = (
    "drivers/virtio/virtio_ring",
    "drivers/virtio/virtio",
    "drivers/virtio/virtio_pci_modern_dev",
    "drivers/virtio/virtio_pci_legacy_dev",
    "drivers/virtio/virtio_pci",
    "fs/netfs/netfs",
    "fs/fscache/fscache",
    "net/9p/9pnet",
    "net/9p/9pnet_virtio",
    "fs/9p/9p",
    "fs/overlayfs/overlay",
    # user-mode networking (the kubelet's way to the API server), and what pods' CNI
    # bridge and veth pairs need
    "net/core/failover",
    "drivers/net/net_failover",
    "drivers/net/virtio_net",
    "net/llc/llc",
    "net/802/stp",
    "net/bridge/bridge",
    "drivers/net/veth",
)
_9P = "trans=virtio,version=9p2000.L,msize=262144"
# QEMU's user-mode network: the guest's address, its gateway, and the address at which
# the guest reaches what the host forwards (Net.to_host)
GUEST, GATEWAY, HOST = "10.0.2.15", "10.0.2.2", "10.0.2.100"
# The guest's /init: the host's root read-only over 9p under a tmpfs overlay (the guest
# writes where it likes, nothing reaches the host; uncached: cached, its files fill the
# guest's page cache, which the kernel reclaims to put a pod's memory on a NUMA node the
# loop's stories fill), the guest's own /proc, /sys, /dev (with a tmpfs at /dev/shm: the
# script's TMPDIR and HOME) and cgroup v2 over it, the job folder at /mnt, the network
# when QEMU gave one; then /mnt/run.sh, its exit status in /mnt/rc; then power off.
# "probe" on the command line: power off.
INIT = f"""#!/bin/busybox sh
/bin/busybox --install -s /bin
mount -t proc proc /proc; mount -t sysfs sys /sys; mount -t devtmpfs dev /dev
grep -q numaguard.probe /proc/cmdline && poweroff -f
for pass in 1 2 3 4; do
  for m in $(ls /lib/mod); do
    name=${{m%.ko}}; grep -q "^${{name#*-}} " /proc/modules || insmod /lib/mod/$m 2>/dev/null
  done
done
mount -t 9p -o {_9P},ro hostroot /lower || echo "numaguard-vm: no host root"
mount -t tmpfs -o mode=755 rw /rw; mkdir /rw/upper /rw/work
mount -t overlay -o lowerdir=/lower,upperdir=/rw/upper,workdir=/rw/work root /host \
  || echo "numaguard-vm: no overlay root"
mount -t proc proc /host/proc; mount -t sysfs sys /host/sys; mount -t devtmpfs dev /host/dev
mount -t cgroup2 cgroup2 /host/sys/fs/cgroup
mkdir -p /host/dev/shm; mount -t tmpfs shm /host/dev/shm
mount -t 9p -o {_9P} job /host/mnt || echo "numaguard-vm: no job folder"
ifconfig lo 127.0.0.1 up; hostname numaguard-vm
if [ -e /sys/class/net/eth0 ]; then
  ip addr add {GUEST}/24 dev eth0; ip link set eth0 up; ip route add default via {GATEWAY}
fi
export TMPDIR=/dev/shm HOME=/dev/shm PYTHONDONTWRITEBYTECODE=1  # the guest's own
chroot /host /bin/sh -c 'cd /mnt && sh ./run.sh > out.txt 2>&1; echo $? > rc'
poweroff -f
"""


class VmMissing(RuntimeError):
    pass


def kernel_package() -> str:
    """The kernel package ``linux-image-amd64`` depends on now (apt's lists)."""
    out = subprocess.run(
        ["apt-cache", "depends", KERNEL_PACKAGE], capture_output=True, text=True, check=True
    ).stdout
    for line in out.splitlines():
        if "Depends:" in line and "linux-image-" in line:
            return line.split()[-1]
    raise VmMissing(f"apt knows no kernel {KERNEL_PACKAGE} depends on: run apt-get update")


def parts_dir() -> Path:
    """The newest built parts; VmMissing when none is built."""
    built = sorted(cache().glob("node-vm-*/.built"), key=lambda p: p.stat().st_mtime)
    if not built or shutil.which("qemu-system-x86_64") is None:
        raise VmMissing("no node VM parts: run `make node-vm` (qemu-system-x86, Debian's kernel)")
    return built[-1].parent


def build() -> Path:
    """Download Debian's kernel and static busybox, and make the initramfs: into the
    cache, keyed by the kernel's version; nothing when already built."""
    try:
        package = kernel_package()
    except (VmMissing, subprocess.CalledProcessError):  # no lists yet: fetch them once
        subprocess.run(["apt-get", "update", "-qq"], check=True)
        package = kernel_package()
    # keyed by the kernel and by what goes into the initramfs
    made = hashlib.sha256((INIT + "".join(MODULES + NODE_PACKAGES)).encode()).hexdigest()[:8]
    out = cache() / f"node-vm-{package.removeprefix('linux-image-')}-{made}"
    if (out / ".built").exists():
        return out
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        subprocess.run(
            [
                "apt-get",
                "download",
                "-qq",
                "-o",
                "APT::Sandbox::User=root",
                package,
                "busybox-static",
                *NODE_PACKAGES,
            ],
            cwd=work,
            check=True,
        )
        out.mkdir(parents=True, exist_ok=True)
        for deb in work.glob("*.deb"):
            node = deb.name.split("_")[0] in NODE_PACKAGES
            subprocess.run(
                ["dpkg-deb", "-x", str(deb), str(out / "root" if node else work / "x")], check=True
            )
        root = work / "initramfs"
        for d in ("bin", "lib/mod", "proc", "sys", "dev", "host", "lower", "rw"):
            (root / d).mkdir(parents=True)
        shutil.copy(work / "x/bin/busybox", root / "bin/busybox")
        shutil.copy(work / "x/bin/busybox", out / "busybox")  # the host's relay: Net
        (modules,) = (work / "x/lib/modules").iterdir()
        for i, name in enumerate(MODULES):
            shutil.copy(
                modules / "kernel" / f"{name}.ko", root / f"lib/mod/{i:02d}-{Path(name).name}.ko"
            )
        (root / "init").write_text(INIT)
        (root / "init").chmod(0o755)
        listing = subprocess.run(
            ["find", "."], cwd=root, capture_output=True, text=True, check=True
        ).stdout
        archive = subprocess.run(
            [str(root / "bin/busybox"), "cpio", "-o", "-H", "newc"],
            cwd=root,
            input=listing.encode(),
            capture_output=True,
            check=True,
        ).stdout
        (out / "initrd.gz").write_bytes(gzip.compress(archive, 1))
        (vmlinuz,) = (work / "x/boot").glob("vmlinuz-*")
        shutil.copy(vmlinuz, out / "vmlinuz")
    (out / ".built").write_text(package + "\n")
    return out


@dataclass(frozen=True)
class Shape:
    """The guest's machine: sockets, each one NUMA node with its cores and memory."""

    sockets: int = 2
    cores: int = 2
    # threads a core: QEMU numbers them first (CPUs 0 and 1 share core 0), then cores,
    # then dies, each die an L3 cache of its own. TCG shows both only with an Intel vendor
    # (an AMD-vendor guest lacks topoext)
    threads: int = 1
    dies: int = 1
    # per NUMA node: a test's own allocations move a 1 GiB node's free memory by over 2 %
    memory_mib: int = 2048
    distance: int = 21


@dataclass(frozen=True)
class Net:
    """The guest's only network, QEMU's user-mode one, restricted: the guest reaches
    nothing but ``to_host`` (its port at HOST -> a port on the host's loopback, relayed
    per connection), and the host reaches the guest at ``from_host`` (a port on the host's
    loopback -> the guest's port)."""

    to_host: tuple[tuple[int, int], ...] = ()
    from_host: tuple[tuple[int, int], ...] = ()

    def args(self, parts: Path) -> list[str]:
        netdev = "user,id=n0,restrict=on"
        for guest, host in self.to_host:
            netdev += f",guestfwd=tcp:{HOST}:{guest}-cmd:{parts / 'busybox'} nc 127.0.0.1 {host}"
        for host, guest in self.from_host:
            netdev += f",hostfwd=tcp:127.0.0.1:{host}-:{guest}"
        return ["-netdev", netdev, "-device", "virtio-net-pci,netdev=n0"]


def qemu_args(
    parts: Path, shape: Shape, accel: str, job: Path | None, probe=False, net: Net | None = None
) -> list[str]:
    per_socket = shape.dies * shape.cores * shape.threads
    cpus = shape.sockets * per_socket
    cpu = "max"
    if accel != "tcg":
        cpu = "host"
    elif shape.threads > 1 or shape.dies > 1:
        cpu = "max,vendor=GenuineIntel,l3-cache=on"
    dies = f"dies={shape.dies}," if shape.dies > 1 else ""
    smp = f"sockets={shape.sockets},{dies}cores={shape.cores},threads={shape.threads}"
    # TCG on one host thread: with a thread per vCPU, 8 vCPUs on a small loaded host spin
    # on locks whose holders are descheduled; one story of the loop took 405 s and 12 CPU
    # minutes that way, 294 s and 5 alone
    accel_arg = f"{accel},thread=single" if accel == "tcg" else accel
    args = [
        "qemu-system-x86_64",
        *("-machine", "pc", "-accel", accel_arg, "-cpu", cpu),
        *("-m", f"{shape.memory_mib * shape.sockets}M"),
        *("-smp", f"{cpus},{smp}"),
    ]
    for n in range(shape.sockets):
        first = n * per_socket
        args += [
            *("-object", f"memory-backend-ram,id=m{n},size={shape.memory_mib}M"),
            *("-numa", f"node,nodeid={n},cpus={first}-{first + per_socket - 1},memdev=m{n}"),
        ]
    for a in range(shape.sockets):
        for b in range(a + 1, shape.sockets):
            args += ["-numa", f"dist,src={a},dst={b},val={shape.distance}"]
    # an emulated CPU leaks nothing to guard against: the guest's mitigations (and its
    # fifth page-table level) only cost emulated instructions
    line = "console=ttyS0 quiet panic=-1 mitigations=off no5lvl"
    line += " numaguard.probe" if probe else ""
    args += [
        *("-kernel", str(parts / "vmlinuz"), "-initrd", str(parts / "initrd.gz")),
        *("-append", line, "-display", "none", "-serial", "stdio", "-no-reboot"),
        *("-fsdev", "local,id=root,path=/,security_model=none,readonly=on,multidevs=remap"),
        *("-device", "virtio-9p-pci,fsdev=root,mount_tag=hostroot"),
        *(net.args(parts) if net else ["-nic", "none"]),
    ]
    if job is not None:
        args += [
            *("-fsdev", f"local,id=job,path={job},security_model=none"),
            *("-device", "virtio-9p-pci,fsdev=job,mount_tag=job"),
        ]
    return args


_ACCEL: str | None = None


async def accel(parts: Path, probe_seconds: float = 20.0) -> str:
    """kvm when a guest boots under it within ``probe_seconds``, else tcg: asked once
    per host kernel, the answer kept beside the parts."""
    global _ACCEL
    known = parts / f"accel-{os.uname().release}"
    if _ACCEL is None and known.exists():
        _ACCEL = known.read_text().strip()
    if _ACCEL is None:
        _ACCEL = "tcg"
        if os.access("/dev/kvm", os.R_OK | os.W_OK):
            rc, _ = await _qemu(qemu_args(parts, Shape(), "kvm", None, probe=True), probe_seconds)
            _ACCEL = "kvm" if rc == 0 else "tcg"
        known.write_text(_ACCEL + "\n")
    return _ACCEL


async def _qemu(args: list[str], timeout: float) -> tuple[int | None, str]:
    """Run QEMU to its end: (its exit status, None past ``timeout``; the console)."""
    proc = await asyncio.create_subprocess_exec(
        *args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
    )
    try:
        console, _ = await asyncio.wait_for(proc.communicate(), timeout)
        return proc.returncode, console.decode(errors="replace")
    except TimeoutError:
        proc.kill()
        console, _ = await proc.communicate()
        return None, console.decode(errors="replace")
    finally:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()


@dataclass(frozen=True)
class Ran:
    rc: int | None  # the script's exit status; None: it did not finish
    output: str  # what it printed
    console: str  # the guest's console
    files: Path  # the job folder, with what the script wrote there
    ended: str  # how the last boot ended: "powered off", hung or timed out


# While its script runs the guest writes its uptime to this file of the job folder every
# few seconds; a guest silent for HUNG_SECONDS, boot included, is hung: now and then
# QEMU's TCG stops a guest's CPUs for good, and with every CPU stopped the guest's own
# watchdog prints nothing either.
HEARTBEAT = "alive"
HUNG_SECONDS = 180
_BEAT = f"(while :; do cat /proc/uptime > /mnt/{HEARTBEAT}; sleep 5; done) &\n"


class Heartbeat:
    """How long, by the host's clock, the guest's heartbeat has not changed."""

    def __init__(self, job: Path, clock=time.monotonic) -> None:
        self.path, self.clock = job / HEARTBEAT, clock
        self.path.unlink(missing_ok=True)
        self._seen: str | None = None
        self._since = clock()

    def silent(self) -> float:
        beat = self.path.read_text() if self.path.exists() else None
        if beat != self._seen:
            self._seen, self._since = beat, self.clock()
        return self.clock() - self._since


async def run(script: str, job: Path, shape: Shape = Shape(), timeout: float = 600.0) -> Ran:
    """Boot the node, run ``script`` (sh, in the job folder, seen as /mnt) as root in
    it, and power off; ``job`` is a folder of the caller's. A guest that hangs is booted
    once more (the script runs again from the start); ``timeout`` is each boot's."""
    job.mkdir(parents=True, exist_ok=True)
    for boot in (1, 2):
        for name in ("out.txt", "rc"):
            (job / name).unlink(missing_ok=True)
        ended = await _watched(script, job, shape, timeout)
        if not ended.startswith("hung") or boot == 2:
            break
        print(f"node VM {ended}; booting it again", file=sys.stderr)
    rc = (job / "rc").read_text().strip() if (job / "rc").exists() else ""
    output = (job / "out.txt").read_text() if (job / "out.txt").exists() else ""
    console = (job / "console.txt").read_text(errors="replace")
    return Ran(int(rc) if rc.isdigit() else None, output, console, job, ended)


async def _watched(script: str, job: Path, shape: Shape, timeout: float) -> str:
    """Run the guest to its end, its hang or ``timeout``: which of them."""
    beat = Heartbeat(job)
    deadline = time.monotonic() + timeout
    async with booted(script, job, shape) as proc:
        waiter = asyncio.ensure_future(proc.wait())
        while True:
            done, _ = await asyncio.wait({waiter}, timeout=2)
            if done:
                return "powered off"
            if beat.silent() >= HUNG_SECONDS:
                return f"hung: no heartbeat for {HUNG_SECONDS}s"
            if time.monotonic() >= deadline:
                return f"timed out after {timeout:.0f}s"


@contextlib.asynccontextmanager
async def booted(script: str, job: Path, shape: Shape = Shape(), net: Net | None = None):
    """Boot the node running ``script`` as ``run`` does, and leave it running: yields
    QEMU's process (its console in job/console.txt, its heartbeat in job/alive);
    killed on exit."""
    parts = parts_dir()
    job.mkdir(parents=True, exist_ok=True)
    (job / "run.sh").write_text(_BEAT + script)
    with open(job / "console.txt", "wb") as console:
        proc = await asyncio.create_subprocess_exec(
            *qemu_args(parts, shape, await accel(parts), job, net=net),
            stdout=console,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
    try:
        yield proc
    finally:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        await proc.wait()


if __name__ == "__main__":
    if sys.argv[1:] != ["build"]:
        sys.exit("usage: python -m numaguard.simulator.parts.vm build")
    print(build())
