"""A real Kubernetes node in the node VM (simulator/parts/vm.py): the kubelet built from the
same pinned ``k8s.io/kubernetes`` module as the control plane, containerd 2.x built from
its module, Debian's runc and CNI plugins, on the guest's real two-socket kernel, joined
to a ControlPlane as a Node with its own client certificate.

The guest reaches the API server, and nothing else, through QEMU's user-mode network;
the host reaches the guest's exporter through a forwarded port. Images are made here from
Debian's binaries (static busybox, numactl) and imported into containerd from tarballs:
no registry is reached. The kubelet's policies are the test's (KubeletPolicy).
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import re
import subprocess
import sys
import tarfile
from dataclasses import dataclass
from pathlib import Path

import aiohttp

from numaguard.simulator import CHECKOUT
from numaguard.simulator.fakes.deviceplugin import RESOURCE, devices_of
from numaguard.simulator.fakes.nvml import FakeNvml
from numaguard.simulator.parts import vm
from numaguard.simulator.parts.controlplane import ControlPlane
from numaguard.simulator.parts.controlplane import parts_dir as k8s_parts
from numaguard.simulator.parts.processes import cache, free_port, until, wait_ok

API_PORT = 6443  # where the guest reaches the API server (vm.HOST)
EXPORTER_PORT = 9400
PAUSE, WORKLOAD = "numaguard.local/pause:1", "numaguard.local/workload:1"


def api_url() -> str:
    """Where the guest reaches the API server."""
    return f"https://{vm.HOST}:{API_PORT}"


def exporter_kubeconfig(cp: ControlPlane, job: Path) -> str:
    """The exporter's kubeconfig (its ServiceAccount's token, the API server as the
    guest reaches it) written into ``job``; its path inside the guest."""
    account = "numaguard-exporter"
    path = cp.kubeconfig(
        job / "exporter.kubeconfig",
        cp.tokens[account],
        account,
        server=api_url(),
        server_name="kubernetes",  # a name the API server's certificate has
    )
    return path.replace(str(job), "/mnt")  # where the guest mounts the job


def containerd_dir() -> Path:
    """containerd, its runc shim and ctr, as make node-vm builds them."""
    found = sorted(cache().glob("containerd-v*/.built"), key=lambda p: p.stat().st_mtime)
    if not found:
        raise vm.VmMissing("no containerd built: run `make node-vm`")
    return found[-1].parent


@dataclass(frozen=True)
class KubeletPolicy:
    """The kubelet's resource managers: the CPU manager is static throughout (CPU 0 kept
    for the system), the rest is each test's."""

    topology: str = "none"  # none | best-effort | restricted | single-numa-node
    scope: str = "container"  # container | pod
    memory: str = "Static"  # the Memory Manager's policy: Static | None
    # the CPU manager's options (cpuManagerPolicyOptions): full-pcpus-only, ...
    cpu_options: tuple[tuple[str, str], ...] = ()


RESERVED_MEMORY_MIB = 256  # kubeReserved, held on NUMA node 0 (the Memory Manager's)
EVICTION_MIB = 100


def kubelet_config(policy: KubeletPolicy) -> dict:
    config = {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "cgroupDriver": "cgroupfs",
        "containerRuntimeEndpoint": "unix:///run/containerd/containerd.sock",
        "failSwapOn": False,
        "resolvConf": "",
        "readOnlyPort": 0,
        # nothing reaches the kubelet's own API from outside the guest
        "authentication": {"anonymous": {"enabled": False}, "webhook": {"enabled": False}},
        "authorization": {"mode": "AlwaysAllow"},
        "cpuManagerPolicy": "static",
        "reservedSystemCPUs": "0",
        "topologyManagerPolicy": policy.topology,
        "topologyManagerScope": policy.scope,
        "memoryManagerPolicy": policy.memory,
        "kubeReserved": {"memory": f"{RESERVED_MEMORY_MIB}Mi"},
        "evictionHard": {
            "memory.available": f"{EVICTION_MIB}Mi",
            # the guest's disk is a tmpfs: no image GC or evictions over it
            "nodefs.available": "0%",
            "imagefs.available": "0%",
            "nodefs.inodesFree": "0%",
        },
        "imageGCHighThresholdPercent": 100,
        "syncFrequency": "5s",
        "nodeStatusUpdateFrequency": "5s",
    }
    if policy.cpu_options:
        config["cpuManagerPolicyOptions"] = dict(policy.cpu_options)
    if policy.memory == "Static":
        total = RESERVED_MEMORY_MIB + EVICTION_MIB
        config["reservedMemory"] = [{"numaNode": 0, "limits": {"memory": f"{total}Mi"}}]
    return config


def containerd_config(parts: Path) -> str:
    runtime = "plugins.'io.containerd.cri.v1.runtime'"
    return f"""version = 3
root = "/var/lib/containerd"
state = "/run/containerd"
[grpc]
  address = "/run/containerd/containerd.sock"
[plugins.'io.containerd.cri.v1.images']
  snapshotter = "native"  # the guest's disk is an overlay: no overlay snapshots on it
[[plugins.'io.containerd.transfer.v1.local'.unpack_config]]
  platform = "linux/amd64"
  snapshotter = "native"
[plugins.'io.containerd.cri.v1.images'.pinned_images]
  sandbox = "{PAUSE}"
[{runtime}.containerd]
  default_runtime_name = "runc"
[{runtime}.containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"
[{runtime}.containerd.runtimes.runc.options]
  BinaryName = "{parts / "root/usr/sbin/runc"}"
  SystemdCgroup = false
[{runtime}.cni]
  bin_dirs = ["{parts / "root/usr/lib/cni"}"]
  conf_dir = "/etc/cni/net.d"
  use_internal_loopback = true
"""


CNI = {
    "cniVersion": "1.0.0",
    "name": "pods",
    "plugins": [
        {
            "type": "bridge",
            "bridge": "cni0",
            "isGateway": True,
            "ipMasq": False,
            "ipam": {"type": "host-local", "ranges": [[{"subnet": "10.88.0.0/16"}]]},
        }
    ],
}


def image(name: str, entrypoint: list[str], parts: Path) -> bytes:
    """A docker-archive image (as `docker save` writes, `ctr images import` reads): one
    layer of Debian's static busybox and numactl with the libraries it links."""
    layer = io.BytesIO()
    numactl = parts / "root/usr/bin/numactl"
    files = {"bin/busybox": parts / "busybox", "usr/bin/numactl": numactl}
    ldd = subprocess.run(["ldd", str(numactl)], capture_output=True, text=True, check=True)
    for line in ldd.stdout.splitlines():
        path = line.split("=>")[-1].split("(")[0].strip()
        if path.startswith("/"):
            files[path.lstrip("/")] = Path(os.path.realpath(path))
    with tarfile.open(fileobj=layer, mode="w") as tar:
        for inside, source in sorted(files.items()):
            info = tar.gettarinfo(str(source), inside)
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            info.mtime = 0
            with open(source, "rb") as f:
                tar.addfile(info, f)
        applets = subprocess.run(
            [str(parts / "busybox"), "--list"], capture_output=True, text=True, check=True
        ).stdout.split()
        for tool in applets:
            if tool == "busybox":
                continue
            link = tarfile.TarInfo(f"bin/{tool}")
            link.type, link.linkname = tarfile.SYMTYPE, "busybox"
            tar.addfile(link)
    blob = layer.getvalue()
    config = json.dumps(
        {
            "architecture": "amd64",
            "os": "linux",
            "config": {"Entrypoint": entrypoint, "Env": ["PATH=/usr/bin:/bin"]},
            "rootfs": {
                "type": "layers",
                "diff_ids": ["sha256:" + hashlib.sha256(blob).hexdigest()],
            },
        }
    ).encode()
    manifest = json.dumps(
        [{"Config": "config.json", "RepoTags": [name], "Layers": ["layer.tar"]}]
    ).encode()
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as tar:
        for inside, data in (
            ("layer.tar", blob),
            ("config.json", config),
            ("manifest.json", manifest),
        ):
            info = tarfile.TarInfo(inside)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return out.getvalue()


# What the workload image runs. SLEEP: nothing. HOLD: holds HELD_MIB, that dd reads from
# /dev/zero into one buffer and blocks writing to a pipe nobody reads. FAR (before a
# command): binds its memory to the NUMA node its first CPU is not on.
SLEEP = "sleep 2147483647"
HELD_MIB = 128
HOLD = f"dd if=/dev/zero bs={HELD_MIB}M count=1 | {SLEEP}"
FAR = (
    "cpu=$(cut -d, -f1 /sys/fs/cgroup/cpuset.cpus.effective | cut -d- -f1); far=1; "
    "[ -e /sys/devices/system/cpu/cpu$cpu/node1 ] && far=0; numactl --membind=$far "
)


def guaranteed_pod(
    name: str,
    namespace: str,
    node: str,
    cpus: int,
    command: str,
    memory: str = "256Mi",
    gpus: int = 0,
) -> dict:
    """A Guaranteed pod bound to ``node``, running ``command`` (sh) in the workload
    image: whole CPUs, so the static CPU manager gives it exclusive ones; ``gpus``
    nvidia.com/gpu from the node's device plugin."""
    spec = {"nodeName": node, **guaranteed_spec(cpus, command, memory, gpus)}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace},
        "spec": spec,
    }


def guaranteed_deployment(
    name: str, namespace: str, cpus: int, command: str, memory: str = "64Mi", gpus: int = 0
) -> dict:
    """A Deployment of one such pod, placed by the scheduler."""
    labels = {"app": name}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": guaranteed_spec(cpus, command, memory, gpus),
            },
        },
    }


def guaranteed_spec(cpus: int, command: str, memory: str, gpus: int = 0) -> dict:
    limits = {"cpu": str(cpus), "memory": memory}
    if gpus:
        limits[RESOURCE] = str(gpus)
    return {
        "terminationGracePeriodSeconds": 1,
        "automountServiceAccountToken": False,
        "containers": [
            {
                "name": "work",
                "image": WORKLOAD,
                "imagePullPolicy": "Never",
                "args": [command],
                "resources": {"limits": limits, "requests": limits},
            }
        ],
    }


# the kubelet's PodResources answers, asked in the guest with grpc's generated stubs:
# GetAllocatableResources, then List, each a line of JSON
_PODRESOURCES = """
import grpc
from google.protobuf.json_format import MessageToDict
from numaguard.exporter.sources.podresources import api_pb2 as api, api_pb2_grpc as rpc
stub = rpc.PodResourcesListerStub(
    grpc.insecure_channel("unix:///var/lib/kubelet/pod-resources/kubelet.sock"))
# a busy emulated kubelet can take longer than the 20 s gRPC gives a connection
wait = dict(wait_for_ready=True, timeout=180)
print(__import__("json").dumps(MessageToDict(
    stub.GetAllocatableResources(api.AllocatableResourcesRequest(), **wait))))
print(__import__("json").dumps(MessageToDict(stub.List(api.ListPodResourcesRequest(), **wait))))
"""

FRESH_MEMORY_STATE = "/run/numaguard-fresh-memory-state"  # in the guest: see NODE_SCRIPT
EXPORTER_PID = "/run/numaguard-exporter.pid"  # in the guest: the exporter's process
MOVER_PID = "/run/numaguard-memory-mover.pid"  # and the memory mover's helper's
MOVER_SOCKET = "/run/numaguard/memory-mover.sock"
# each process with the capabilities its container has (deploy/components/memory-mover):
# the exporter none, the helper CAP_SYS_PTRACE alone
CAPABILITIES = "setpriv --inh-caps=-all --ambient-caps=-all --bounding-set=-all"
HUNG_SECONDS = vm.HUNG_SECONDS  # a guest CPU stuck this long (its console says): hung
_STUCK = re.compile(r"soft lockup - CPU#\d+ stuck for (\d+)s")

# The guest's run.sh: containerd, the images, the commands the host sends, the kubelet,
# and the exporter when the host asks for one.
NODE_SCRIPT = """
J=/mnt
export PATH={containerd}:{parts}/root/usr/sbin:$PATH
# Go's idle threads spin for work on every vCPU; on an emulated guest on a small host
# that spinning is most of the node's CPU (the kubelet, containerd and its shims)
export GOMAXPROCS=2
mkdir -p /etc/cni/net.d && cp $J/cni.conflist /etc/cni/net.d/10-pods.conflist
containerd --config $J/containerd.toml > $J/containerd.log 2>&1 &
until [ -S /run/containerd/containerd.sock ]; do sleep 0.2; done
for image in $J/images/*.tar; do
  ctr -n k8s.io images import --snapshotter native $image >> $J/containerd.log 2>&1 || exit 1
done
# what the host asks to run here: exec/N.sh -> N.out, N.rc
while :; do
  for f in $J/exec/*.sh; do
    [ -e "$f" ] || continue
    sh "$f" > "${{f%.sh}}.out" 2>&1; echo $? > "$f.rc"; mv "$f.rc" "${{f%.sh}}.rc"; rm "$f"
  done
  sleep 0.5
done &
# the kubelet, started again should it exit, as its service manager would; the Memory
# Manager's checkpoint removed first when the host changes its policy
while :; do
  [ -e {fresh} ] && rm -f /var/lib/kubelet/memory_manager_state {fresh}
  {kubelet} --config=$J/kubelet.yaml --kubeconfig=$J/kubelet.kubeconfig \\
    --hostname-override={name} --node-ip={guest} >> $J/kubelet.log 2>&1 &
  echo $! > /run/kubelet.pid; wait $!
  echo "numaguard-node: the kubelet exited ($?); starting it again" >> $J/kubelet.log
  sleep 1
done &
# the GPUs: the fake GPU node's, advertised to the kubelet by the device plugin
if [ -e $J/gpus.json ]; then
  {python} -m numaguard.simulator.fakes.deviceplugin $J/gpus.json > $J/deviceplugin.log 2>&1 &
  exporter="numaguard.simulator.fakes.gpu_exporter $J/gpus.json"  # the fake NVML behind pynvml
else
  exporter=numaguard.exporter
fi
# the exporter as its DaemonSet runs it: once the kubelet's PodResources socket is there
if [ -e $J/exporter.args ]; then
  until [ -S /var/lib/kubelet/pod-resources/kubelet.sock ]; do sleep 0.5; done
  {python} -m $exporter $(cat $J/exporter.args) > $J/exporter.log 2>&1 &
  echo $! > {exporter_pid}
fi
wait
"""


class KubeNode:
    """``async with KubeNode(cp, job) as node``: the node VM booted, its kubelet
    registered and the Node Ready. ``exporter``: the exporter's arguments, to run it in
    the guest (served on ``exporter_url``). ``gpus``: a fake GPU node whose GPUs and MIG
    slices the device plugin offers the kubelet and the exporter's NVML shows."""

    def __init__(
        self,
        cp: ControlPlane,
        job: Path,
        name: str = "vm-node",
        policy: KubeletPolicy = KubeletPolicy(),
        exporter: tuple[str, ...] | None = None,
        shape: vm.Shape | None = None,
        gpus: FakeNvml | None = None,
    ) -> None:
        self.cp, self.job, self.name, self.shape = cp, job, name, shape or vm.Shape()
        self.policy = policy
        self.exporter = exporter
        self.gpus = gpus
        self.exporter_url = ""
        self._exporter_args: tuple[str, ...] = ()
        self._stack = contextlib.AsyncExitStack()
        self._commands = 0
        self.heartbeat: vm.Heartbeat | None = None

    async def __aenter__(self) -> KubeNode:
        parts, job = vm.parts_dir(), self.job
        for folder in ("images", "exec"):
            (job / folder).mkdir(parents=True, exist_ok=True)
        for name, entry in (
            (PAUSE, ["/bin/busybox", "sleep", "2147483647"]),
            (WORKLOAD, ["/bin/busybox", "sh", "-c"]),
        ):
            (job / "images" / f"{name.split('/')[-1].replace(':', '-')}.tar").write_bytes(
                image(name, entry, parts)
            )
        (job / "containerd.toml").write_text(containerd_config(parts))
        (job / "cni.conflist").write_text(json.dumps(CNI))
        (job / "kubelet.yaml").write_text(json.dumps(kubelet_config(self.policy)))
        if self.gpus is not None:
            (job / "gpus.json").write_text(self.gpus.description())
        self.cp.node_kubeconfig(job / "kubelet.kubeconfig", self.name, api_url())
        forwarded: tuple[tuple[int, int], ...] = ()
        if self.exporter is not None:
            port = free_port()
            forwarded = ((port, EXPORTER_PORT),)
            self.exporter_url = f"http://127.0.0.1:{port}"
            args = ("--listen", f"0.0.0.0:{EXPORTER_PORT}", "--node-name", self.name)
            args += ("--pod-resources-socket", "/var/lib/kubelet/pod-resources/kubelet.sock")
            args += ("--kubelet-config", "/mnt/kubelet.yaml")  # the one the kubelet runs on
            self._exporter_args = (*args, *self.exporter)
            (job / "exporter.args").write_text(" ".join(self._exporter_args))
        script = NODE_SCRIPT.format(
            containerd=containerd_dir(),
            parts=parts,
            python=sys.executable,
            kubelet=k8s_parts() / "kubelet",
            name=self.name,
            guest=vm.GUEST,
            fresh=FRESH_MEMORY_STATE,
            exporter_pid=EXPORTER_PID,
        )
        api_port = int(self.cp.url.rsplit(":", 1)[1])
        net = vm.Net(to_host=((API_PORT, api_port),), from_host=forwarded)
        for boot in (1, 2):
            self.heartbeat = vm.Heartbeat(job)
            self.qemu = await self._stack.enter_async_context(
                vm.booted(f"cd {CHECKOUT}\n{script}", job, self.shape, net)
            )
            try:
                await self.ready()
                if self.gpus is not None:
                    await self.devices_advertised()
                if self.exporter_url:
                    await wait_ok(f"{self.exporter_url}/readyz", 300, self._ended)
                return self
            except BaseException:
                hung = self._hung()
                await self._stack.aclose()
                if boot == 2 or not hung:
                    raise
                print(f"{self.name}: {hung}; booting it again", file=sys.stderr)
        raise AssertionError("unreachable")

    def _hung(self) -> str | None:
        """Why the guest is hung, when its console or its silence says so: now and then
        (once in about ten boots on a 2-core machine) QEMU's TCG stops a guest's CPUs for
        good."""
        stuck = [int(s) for s in _STUCK.findall(self.log("console.txt"))]
        if stuck and max(stuck) >= HUNG_SECONDS:
            return f"the node VM hung: a CPU stuck for {max(stuck)}s"
        if self.heartbeat is not None and self.heartbeat.silent() >= HUNG_SECONDS:
            return f"the node VM hung: no heartbeat for {HUNG_SECONDS}s"
        return None

    def _ended(self) -> str | None:
        if self.qemu.returncode is None:
            return self._hung()
        return f"the node VM ended: {self.log('console.txt')}"

    async def __aexit__(self, *exc) -> None:
        await self._stack.aclose()

    def log(self, name: str = "kubelet.log") -> str:
        path = self.job / name
        return path.read_text(errors="replace")[-4000:] if path.exists() else ""

    async def ready(self, timeout: float = 600.0) -> dict:
        """Wait for the Node to be Ready; returns it."""

        async def node_ready():
            if self._ended():
                raise RuntimeError(self._ended())
            async with aiohttp.ClientSession() as session:
                node = await self.cp.get(session, "Node", None, self.name)
            for c in (node or {}).get("status", {}).get("conditions", []):
                if (c["type"], c["status"]) == ("Ready", "True"):
                    return node
            return None

        try:
            node = await until(node_ready, f"node {self.name} Ready", timeout=timeout, every=1)
        except AssertionError as e:
            raise AssertionError(
                f"{e}\nkubelet: {self.log()}\ncontainerd: {self.log('containerd.log')}"
            ) from None
        # The kubelet registers its Node tainted not-ready; the node lifecycle controller
        # lifts the taint once the Node is Ready. The test control plane runs no such
        # controller (the simulated nodes post no heartbeats), so it is lifted here.
        taints = node["spec"].get("taints", [])
        kept = [t for t in taints if t["key"] != "node.kubernetes.io/not-ready"]
        if kept != taints:
            async with aiohttp.ClientSession() as session:
                patch = {"spec": {"taints": kept or None}}
                node = await self.cp.patch(session, "Node", None, self.name, patch)
        return node

    async def devices_advertised(self, timeout: float = 300.0) -> None:
        """Wait until the Node offers the GPUs and MIG slices the device plugin registered."""
        counts = {r: str(len(d)) for r, d in devices_of(self.gpus.description()).items()}

        async def offered():
            async with aiohttp.ClientSession() as session:
                node = await self.cp.get(session, "Node", None, self.name)
            allocatable = node["status"].get("allocatable", {})
            return all(allocatable.get(r) == n for r, n in counts.items())

        try:
            await until(offered, f"{counts} on {self.name}", timeout=timeout, every=1)
        except AssertionError as e:
            raise AssertionError(f"{e}\ndevice plugin: {self.log('deviceplugin.log')}") from None

    async def restart_kubelet(self, policy: KubeletPolicy, timeout: float = 300.0) -> None:
        """Restart the kubelet under ``policy``, as an administrator changing the node's
        Topology Manager policy does; returns once the new one is healthy. Its CPU
        manager state is kept, and it admits its running pods again under the new
        policy: those it would refuse now fail (TopologyAffinityError). A change of
        Memory Manager policy starts its state afresh, as the kubelet requires of an
        administrator (it refuses a checkpoint of another policy)."""
        fresh = policy.memory != self.policy.memory
        self.policy = policy
        (self.job / "kubelet.yaml").write_text(json.dumps(kubelet_config(policy)))
        if fresh:
            await self.sh(f"touch {FRESH_MEMORY_STATE}")
        before = (await self.sh("cat /run/kubelet.pid")).strip()
        await self.sh(f"kill {before}")
        healthz = f"{vm.parts_dir() / 'busybox'} wget -qO- http://127.0.0.1:10248/healthz"

        async def healthy():
            pid = (await self.sh("cat /run/kubelet.pid")).strip()
            return pid != before and (await self.sh(f"{healthz} || true")).strip() == "ok"

        await until(healthy, "the kubelet healthy again", timeout=timeout, every=1)
        if self.gpus is not None:
            # until the device plugin has registered again and listed its devices, the
            # kubelet refuses a pod asking for one (UnexpectedAdmissionError: "no
            # healthy devices"), though the Node still shows them allocatable
            wanted = {r: len(d) for r, d in devices_of(self.gpus.description()).items()}

            async def devices_back():
                allocatable, _ = await self.pod_resources()
                listed: dict[str, int] = {}
                for d in allocatable.get("devices", []):
                    listed[d["resourceName"]] = listed.get(d["resourceName"], 0) + len(
                        d["deviceIds"]
                    )
                return listed == wanted

            await until(devices_back, "the devices listed again", timeout=timeout, every=1)

    async def pod_resources(self) -> tuple[dict, dict]:
        """What the kubelet's PodResources API answers now: GetAllocatableResources and
        List."""
        # longer than the script's own two waits: a failed call says why itself
        asked = await self.sh(f"{sys.executable} -c '{_PODRESOURCES}'", timeout=400)
        allocatable, listed = (json.loads(line) for line in asked.splitlines()[-2:])
        return allocatable, listed

    async def restart_exporter(self, *extra: str, confined: bool = False) -> None:
        """Restart the guest's exporter with ``extra`` arguments besides its own, as a
        DaemonSet rolled out with other flags would (``confined``: with no capability, as
        its container runs it); returns once the new one is ready."""
        assert self.exporter_url, "the node runs no exporter"
        (self.job / "exporter.args").write_text(" ".join((*self._exporter_args, *extra)))
        module = "numaguard.exporter"
        if self.gpus is not None:
            module = "numaguard.simulator.fakes.gpu_exporter /mnt/gpus.json"
        await self.sh(
            f"{_ended(EXPORTER_PID)}; {CAPABILITIES if confined else ''} "
            f"{sys.executable} -m {module} $(cat /mnt/exporter.args) "
            f">> /mnt/exporter.log 2>&1 & echo $! > {EXPORTER_PID}"
        )
        await wait_ok(f"{self.exporter_url}/readyz", 300, self._ended)

    async def memory_mover(self, rate: int | None) -> None:
        """The memory mover's helper as its container runs it (uid 0, CAP_SYS_PTRACE
        alone) on MOVER_SOCKET at ``rate`` bytes a second, or none (``rate`` None);
        returns once it listens."""
        await self.sh(f"[ ! -e {MOVER_PID} ] || {{ {_ended(MOVER_PID)}; rm {MOVER_PID}; }}")
        if rate is None:
            return
        await self.sh(
            f"mkdir -p {os.path.dirname(MOVER_SOCKET)}; {CAPABILITIES},+sys_ptrace "
            f"{sys.executable} -m numaguard.exporter.mover --host-root=/ "
            f"--socket={MOVER_SOCKET} --rate={rate} >> /mnt/memory-mover.log 2>&1 & "
            f"echo $! > {MOVER_PID}"
        )
        await until(self._listening, "the memory mover's helper listening", 300, every=0.5)

    async def _listening(self) -> bool:
        return (await self.sh(f"[ -S {MOVER_SOCKET} ] && echo yes || echo no")).strip() == "yes"

    async def sh(self, script: str, timeout: float = 300.0) -> str:
        """Run ``script`` (sh) on the node as root; its output. AssertionError when it
        fails."""
        self._commands += 1
        at = self.job / "exec" / str(self._commands)
        at.with_suffix(".tmp").write_text(script)
        at.with_suffix(".tmp").rename(at.with_suffix(".sh"))  # whole, or not at all
        rc = at.with_suffix(".rc")

        async def ran() -> bool:
            hung = self._hung()
            if hung is not None:
                raise AssertionError(f"{hung}, running {script!r}")
            return rc.exists()

        await until(ran, f"the node ran {script!r}", timeout)
        out = at.with_suffix(".out").read_text(errors="replace")
        assert rc.read_text().strip() == "0", f"{script!r} on the node failed: {out}"
        return out


def _ended(pid_file: str) -> str:
    """sh: end the process ``pid_file`` names, and wait until it has."""
    return f"pid=$(cat {pid_file}); kill $pid; while kill -0 $pid 2>/dev/null; do sleep 0.2; done"
