"""The remediation loop through a real kubelet, for the tests and ``make demo-node``: the
exporter in the node VM (simulator/parts/vm_kubelet.py) reads the real kernel and kubelet, a real
Prometheus scrapes it, the remediator (its ServiceAccount, deploy/'s RBAC) evicts
through the real API server, the real ReplicaSet and scheduler make and place the
replacement, and the real kubelet admits it — aligned or not, as its Topology Manager
policy decides — or refuses it.

One node, its kubelet restarted under each story's policy (CPUs 1-3 on NUMA node 0 and
4-7 on node 1 can be given; 0 is the system's). A kubelet under ``single-numa-node``
never admits a one-container pod across NUMA nodes, and restarted under it refuses the
running pods it would not admit now; so a split pod's fix is shown under
``best-effort``, the policy that admits a pod misaligned when no NUMA node has room and
aligns its replacement once one has. Under ``single-numa-node`` the fix that holds is
of memory: the kernel, not the kubelet, placed it on the far node (without the Memory
Manager nothing confines it to the CPUs' node). With the exporter's memory mover on, the
same memory is moved home in place, the pod left running.

What the real kubelet showed: the ReplicaSet makes the replacement at once, and the
kubelet admits it while the evicted pod still terminates on its exclusive CPUs — they
are never the replacement's (the planner's ``freed_in_time``)."""

from __future__ import annotations

import contextlib
import json
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp

from numaguard.contract.catalogue import MEMORY_MOVES, NUMA_MEMORY_FREE
from numaguard.contract.names import OPT_OUT
from numaguard.exporter.readers import parse_id_list
from numaguard.remediator.controller import Controller
from numaguard.remediator.core.cycle_report import CycleReport
from numaguard.remediator.core.policy import Policy
from numaguard.remediator.core.queries import Windows, expressions
from numaguard.remediator.kube import Kube, api_client
from numaguard.remediator.signals import Prometheus
from numaguard.simulator.fakes.deviceplugin import RESOURCE
from numaguard.simulator.fakes.nvml import FakeNvml
from numaguard.simulator.parts import vm
from numaguard.simulator.parts.controlplane import ControlPlane, path_of
from numaguard.simulator.parts.processes import free_port, until
from numaguard.simulator.parts.prometheus import PrometheusServer
from numaguard.simulator.parts.vm_kubelet import (
    HELD_MIB,
    HOLD,
    MOVER_SOCKET,
    SLEEP,
    KubeletPolicy,
    KubeNode,
    exporter_kubeconfig,
    guaranteed_deployment,
    guaranteed_pod,
)

# CPUs 0-3 on NUMA node 0, 4-7 on node 1. (Three cores a socket hang QEMU 7.2's TCG
# guest before its kernel prints.)
SHAPE = vm.Shape(cores=4)
NS = "vm-loop"
NUMA_BALANCING = "/proc/sys/kernel/numa_balancing"
# the memory mover's helper's rate when on, bytes a second: slow enough that moving
# some 100 MiB takes seconds to measure
MOVE_RATE = 32 * 2**20
WINDOW = "8s"  # the exporter collects every 2 s in an emulated guest
KEEP = 1  # refused pods kept for diagnosis
GB_S = 1e9  # a GPU's traffic each way, bytes a second
# how long an evicted pod terminates (its sleep, as PID 1, ignores SIGTERM): the real
# time in which its replacement is admitted
GRACE_SECONDS = 5
FULL = (("filler", 2), ("neighbour", 3))  # node 0 left with 1 free CPU, node 1 with 1
# A tmpfs whose pages the kernel must put on NUMA node 0, filled until LEFT_MIB of the
# node's memory is free: a little above the node's low watermark (56 MiB in this guest),
# below which the kernel puts what a process on node 0 asks for on node 1.
FILLED = "/run/numaguard-filled"
LEFT_MIB = 80
FILL_NODE_0 = (
    f"free=$(awk '/MemFree/ {{print int($4 / 1024)}}' /sys/devices/system/node/node0/meminfo)"
    f" && mkdir -p {FILLED} && mount -t tmpfs -o mpol=bind:0 filled {FILLED}"
    f" && dd if=/dev/zero of={FILLED}/pages bs=1M count=$((free - {LEFT_MIB})) 2>/dev/null"
    f" && echo $((free - {LEFT_MIB}))"
)


def linked_gpus() -> FakeNvml:
    """NUMA node 1's five GPUs, offered by the device plugin in this order: 1 and 2
    joined by an NVLink bridge (NV12), each other one on a host bridge of its own (NODE
    to every GPU: no P2P). The unjoined ones move 2 GB/s over PCIe at 30 % SM activity,
    as a job staging its all-reduce through host memory does; the pair is busier, its
    traffic on NVLink."""
    gpus = FakeNvml()
    for i in range(5):
        if i in (1, 2):
            gpu = gpus.add_gpu("H100-80GB", 1, sm=0.6, nvlink_tx=GB_S, nvlink_rx=GB_S)
            gpu.pci_root = "0000:80"
        else:
            gpu = gpus.add_gpu("H100-80GB", 1, sm=0.3, pcie_tx=GB_S, pcie_rx=GB_S)
            gpu.pci_root = f"0000:{0x90 + 0x10 * i:02x}"
    gpus.gpus[1].nvlinks, gpus.gpus[2].nvlinks = [2] * 12, [1] * 12
    return gpus


def cpu_nodes(cpulist: str, cores: int = SHAPE.cores) -> dict[str, int]:
    """CPUs per NUMA node of a cpuset (the VM's CPUs are numbered node by node)."""
    out: dict[str, int] = {}
    for cpu in parse_id_list(cpulist):
        out[str(cpu // cores)] = out.get(str(cpu // cores), 0) + 1
    return out


def container_cgroup(pod: dict) -> str:
    """The cgroup of a Guaranteed pod's one container, in the guest (cgroupfs driver)."""
    cid = pod["status"]["containerStatuses"][0]["containerID"].split("://")[1]
    return f"/sys/fs/cgroup/kubepods/pod{pod['metadata']['uid']}/{cid}"


async def exclusive_cpus(node: KubeNode, pod: dict) -> dict[str, int]:
    """CPUs per NUMA node of a Guaranteed pod's one container, from its cgroup."""
    return cpu_nodes((await node.sh(f"cat {container_cgroup(pod)}/cpuset.cpus")).strip())


def deployment(
    name: str, cpus: int, command: str = SLEEP, memory: str = "64Mi", gpus: int = 0
) -> dict:
    d = guaranteed_deployment(name, NS, cpus, command, memory, gpus)
    d["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] = GRACE_SECONDS
    return d


@dataclass
class Story:
    """What happened: each pod of the workload the kubelet ran, with its exclusive CPUs
    per NUMA node as its cgroup says, in order; the remediator's cycles; and what a
    person watching would be told."""

    pods: list[tuple[dict, dict[str, int]]] = field(default_factory=list)
    reports: list[CycleReport] = field(default_factory=list)
    said: list[str] = field(default_factory=list)
    memory: dict[str, dict[str, int]] = field(default_factory=dict)  # MiB per node, by pod
    gpus: dict[str, list[int]] = field(default_factory=dict)  # the GPUs given, by pod
    processes: dict[str, list[str]] = field(default_factory=dict)  # a container's PIDs

    @property
    def evicted(self) -> list[str]:
        return [a.pod.name for r in self.reports for a, res in r.results if res == "evicted"]

    @property
    def outcomes(self) -> list[tuple[str, str]]:
        return [(v.workload, v.outcome) for r in self.reports for v in r.verified]


@dataclass
class NodeLoop:
    cp: ControlPlane
    node: KubeNode
    prom: PrometheusServer
    session: aiohttp.ClientSession
    kube: Kube
    mover_on: bool = False  # the exporter runs --memory-mover
    gpus_on: bool = False  # and its GPU collector

    async def mover(self, on: bool) -> None:
        """The exporter's memory mover on or off (the exporter restarted if need be): on,
        as deploy/components/memory-mover runs it, the exporter with no capability and
        the helper beside it with CAP_SYS_PTRACE alone."""
        if on != self.mover_on:
            await self.node.memory_mover(MOVE_RATE if on else None)
            self.mover_on = on
            await self._restart_exporter()

    async def gpu_collector(self, on: bool) -> None:
        """The exporter's GPU collector on or off (the exporter restarted if need be):
        off for the stories of CPUs and memory, whose emulated guest needs the time its
        fake NVML's reads would take."""
        if on != self.gpus_on:
            self.gpus_on = on
            await self._restart_exporter()

    async def _restart_exporter(self) -> None:
        extra = ("--memory-mover", f"--memory-mover.socket={MOVER_SOCKET}") * self.mover_on
        extra += ("--collector.gpu",) * self.gpus_on
        await self.node.restart_exporter(*extra, confined=self.mover_on)

    def controller(self, **policy) -> Controller:
        prometheus = Prometheus(self.prom.url, self.session, windows=Windows(WINDOW, WINDOW))
        settings = dict(
            dry_run=False,
            min_pod_age_seconds=0,
            stale_after_seconds=20,
            verify_after_seconds=10,
            verify_deadline_seconds=180,
            cooldown_seconds=2,
            keep_rejected_pods=KEEP,
        )
        return Controller(prometheus, self.kube, Policy(**{**settings, **policy}))

    async def pods(self, prefix: str, phase: str = "Running") -> list[dict]:
        return [
            p
            for p in await self.cp.items(self.session, "Pod", NS)
            if p["metadata"]["name"].startswith(prefix) and p["status"].get("phase") == phase
        ]

    async def running(self, prefix: str) -> dict:
        """The one pod named ``prefix...`` once it runs."""

        async def one():
            found = [
                p for p in await self.pods(prefix) if not p["metadata"].get("deletionTimestamp")
            ]
            return found[0] if len(found) == 1 else None

        return await until(one, f"{prefix} Running", timeout=300, every=1)

    async def placed(self, story: Story, prefix: str) -> dict:
        """The workload's running pod, its CPUs (and GPUs) recorded in the story."""
        pod = await self.running(prefix)
        cpus = await exclusive_cpus(self.node, pod)
        story.pods.append((pod, cpus))
        story.said.append(f"  the kubelet runs {pod['metadata']['name']} on {show(cpus)}")
        limits = [c["resources"].get("limits") or {} for c in pod["spec"]["containers"]]
        if any(RESOURCE in lim for lim in limits):  # each ask of the guest costs it seconds
            await self.given(story, pod)
        return pod

    async def given(self, story: Story, pod: dict) -> list[int]:
        """The GPUs (indices) the kubelet's device manager gave ``pod``, as its
        PodResources API says, recorded in the story where it holds any."""
        _, listed = await self.node.pod_resources()
        uuids = [
            uuid
            for p in listed.get("podResources", [])
            if (p["namespace"], p["name"]) == (NS, pod["metadata"]["name"])
            for c in p.get("containers", [])
            for d in c.get("devices", [])
            for uuid in d["deviceIds"]
        ]
        index = {gpu.uuid: i for i, gpu in enumerate(self.node.gpus.gpus)}
        gpus = sorted(index[u] for u in uuids)
        if gpus:
            story.gpus[pod["metadata"]["name"]] = gpus
            names = " and ".join(map(str, gpus))
            story.said.append(f"  {pod['metadata']['name']} is given GPUs {names}")
        return gpus

    async def released(self, uid: str) -> None:
        """Wait until the kubelet's CPU manager has taken the pod's exclusive CPUs back
        (its checkpoint holds no entry for it): only after its containers are gone."""

        async def free():
            state = json.loads(await self.node.sh("cat /var/lib/kubelet/cpu_manager_state"))
            return uid not in state.get("entries", {})

        await until(free, f"pod {uid}'s CPUs released", timeout=300, every=1)

    async def delete(self, name: str) -> None:
        """Delete a bare pod and wait until what it held is free."""
        uid = (await self.cp.get(self.session, "Pod", NS, name))["metadata"]["uid"]
        await self.cp.request(self.session, "DELETE", path_of("Pod", NS, name))
        await self.released(uid)

    async def cycles(self, story: Story, controller: Controller, done) -> None:
        """The controller's cycles until ``done(story)``. After an eviction the next
        cycle waits for the evicted pod's CPUs to be free again, as a remediator's
        cooldown (minutes) would; its replacement is admitted before that."""

        async def cycle():
            report = await controller.cycle()
            story.reports.append(report)
            for action, result in report.results:
                story.said.append(f"  remediator: {action.detail} -> {result}")
                if result == "evicted":
                    await self.released(action.pod.uid)
                    await self.placed(story, action.pod.workload.rsplit("/", 1)[1] + "-")
            for v in report.verified:
                story.said.append(f"  verified {v.workload}: {v.outcome} ({v.detail})")
            return done(story)

        await until(cycle, "the loop done", timeout=600, every=1)

    async def start(self, policy: str, memory: str = "None") -> None:
        """A clean slate: nothing of the last story left, the kubelet under the Topology
        Manager's ``policy`` and the Memory Manager's ``memory``."""
        for kind in ("Deployment", "Pod"):
            for obj in await self.cp.items(self.session, kind, NS):
                path = path_of(kind, NS, obj["metadata"]["name"]) + "?gracePeriodSeconds=0"
                await self.cp.request(self.session, "DELETE", path)

        async def gone():
            return not await self.cp.items(self.session, "Pod", NS)

        await until(gone, "the last story's pods gone", timeout=300, every=1)
        await self.node.sh(f"umount {FILLED} 2>/dev/null; true")  # a failed story's tmpfs
        # and their containers with them: a pod the API server no longer has may still
        # hold memory the kubelet frees later, on a NUMA node a story has just filled
        # a glob, not find: find fails when the kubelet removes a cgroup mid-walk
        pods = "/sys/fs/cgroup/kubepods/pod* /sys/fs/cgroup/kubepods/*/pod*"
        cgroups = f'for d in {pods}; do [ -d "$d" ] && echo "$d"; done; true'

        async def released():
            return not (await self.node.sh(cgroups)).strip()

        await until(released, "the last story's containers gone", timeout=300, every=1)
        if self.node.policy != KubeletPolicy(policy, memory=memory):
            await self.node.restart_kubelet(KubeletPolicy(policy, memory=memory))

    async def bare(self, name: str, cpus: int, gpus: int = 0) -> dict:
        pod = guaranteed_pod(name, NS, self.node.name, cpus, SLEEP, gpus=gpus)
        await self.cp.create(self.session, pod)
        return await self.running(name)

    async def sustained(self, reason: str) -> None:
        """A cross-NUMA verdict for ``reason`` held a whole finding window, as the
        controller's query sees it: its next cycle opens the finding."""
        held = expressions(Windows(WINDOW, WINDOW), scope=f'reason="{reason}"')
        await self.prom.wait_for(held["cross_numa_sustained"], 300)

    async def memory(self, story: Story, pod: dict, key: str = "") -> dict[str, int]:
        """MiB of the pod's container's anonymous memory per NUMA node, from its cgroup's
        memory.numa_stat, once it holds what HOLD takes (recorded in the story under
        ``key``, by default the pod's name)."""
        cg = container_cgroup(pod)

        async def held():
            for line in (await self.node.sh(f"cat {cg}/memory.numa_stat")).splitlines():
                kind, *nodes = line.split()
                if kind == "anon":
                    mib = {n[1:].split("=")[0]: int(n.split("=")[1]) >> 20 for n in nodes}
                    return mib if sum(mib.values()) >= HELD_MIB * 0.9 else None
            return None

        mib = await until(held, f"{pod['metadata']['name']}'s memory held", timeout=120)
        story.memory[key or pod["metadata"]["name"]] = mib
        story.said.append(f"  its memory: {show_memory(mib)}")
        return mib


def show_memory(mib: dict[str, int]) -> str:
    return ", ".join(f"{n} MiB on NUMA node {k}" for k, n in sorted(mib.items()) if n)


def show(cpus: dict[str, int]) -> str:
    return ", ".join(
        f"{n} CPU{'s' if n > 1 else ''} of NUMA node {k}" for k, n in sorted(cpus.items())
    )


@contextlib.asynccontextmanager
async def node_loop(job: Path):
    """A control plane with numaguard installed, the node VM under ``none`` with its
    GPUs (linked_gpus) and exporter, a Prometheus scraping it, and the remediator's
    client."""
    async with contextlib.AsyncExitStack() as stack:
        cp = await stack.enter_async_context(ControlPlane())
        session = await stack.enter_async_context(aiohttp.ClientSession())
        await cp.install_numaguard(session, ("no-dry-run", "steering", "memory-mover"))
        exporter = ("--kubeconfig", exporter_kubeconfig(cp, job), "--interval", "2")
        exporter += ("--no-collector.gpu", "--no-collector.resctrl")  # gpu_collector() turns it on
        policy = KubeletPolicy("none", memory="None")
        node = await stack.enter_async_context(
            KubeNode(cp, job, policy=policy, exporter=exporter, shape=SHAPE, gpus=linked_gpus())
        )
        prom = await stack.enter_async_context(
            PrometheusServer([node.exporter_url.removeprefix("http://")], free_port())
        )
        account = "numaguard-remediator"
        kubeconfig = cp.kubeconfig(job / "remediator.kubeconfig", cp.tokens[account], account)
        client = await api_client(kubeconfig)
        stack.push_async_callback(client.close)
        namespace = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}}
        await cp.create(session, namespace)
        yield NodeLoop(cp, node, prom, session, Kube(client))


async def misaligned_again(loop: NodeLoop) -> Story:
    """Under ``none``: the kubelet packs CPUs from the NUMA node with the fewest free
    first. The fillers get CPUs 1 and 2, the loader 3 and 4, across the two nodes. The
    first filler leaves; node 1 has room for the loader (5-7) and the remediator evicts,
    but the replacement comes while the evicted loader still holds 3-4, and is packed as
    1 and 5: across again. Then 3 and 4. The remediator backs off, and gives up."""
    story = Story(said=["under none:"])
    await loop.start("none")
    await loop.bare("filler-1", 1)
    await loop.bare("filler-2", 1)
    await loop.cp.create(loop.session, deployment("loader", 2))
    await loop.placed(story, "loader-")
    await loop.delete("filler-1")
    story.said.append("  filler-1 (CPU 1) deleted: NUMA node 1 has room for the loader")
    await loop.sustained("cpu_span")
    controller = loop.controller(backoff_factor=2, give_up_after=2)
    await loop.cycles(story, controller, lambda s: [o for _, o in s.outcomes][-1:] == ["gave_up"])

    async def on_fresh_data() -> CycleReport | None:
        """A cycle that judged the pod on fresh data (a loaded machine's exporter may
        lag a cycle behind: that one says stale_data, and proves nothing here)."""
        report = await controller.cycle()
        if report.plan is None:  # a cycle skipped (its data doubtful): judged nothing
            return None
        return report if all(r.guard != "stale_data" for r in report.plan.refusals) else None

    # left alone from then on, saying why
    report = await until(on_fresh_data, "a cycle on fresh data", timeout=300, every=5)
    story.reports.append(report)
    story.said += [f"  refused: {r.guard}: {r.detail}" for r in report.plan.refusals]
    return story


async def fixed(loop: NodeLoop) -> Story:
    """Under ``best-effort``: the filler on node 0 (CPUs 1-2), the neighbour on node 1
    (4-6): no NUMA node has 2 free CPUs, so the trainer is admitted across both (3 and
    7). The neighbour leaves: node 1 has room, the remediator evicts, and the
    replacement is admitted on node 1 beside what the evicted trainer still holds."""
    story = Story(said=["under best-effort:"])
    await loop.start("best-effort")
    for name, cpus in FULL:
        await loop.bare(name, cpus)
    await loop.cp.create(loop.session, deployment("trainer", 2))
    await loop.placed(story, "trainer-")
    await loop.delete("neighbour")
    story.said.append("  the neighbour (CPUs 4-6) deleted: NUMA node 1 has room")
    await loop.sustained("cpu_span")
    await loop.cycles(story, loop.controller(), lambda s: s.outcomes)
    return story


async def moved_home(loop: NodeLoop) -> Story:
    """Under ``single-numa-node``: something outside Kubernetes (a tmpfs bound to NUMA
    node 0) holds all but LEFT_MIB of node 0's memory. The kubelet admits the cache on
    node 0's CPU 1, and the kernel, finding node 0 at its watermark, puts most of the
    cache's memory on node 1. The tmpfs goes; the remediator evicts, the kubelet admits
    the replacement on one NUMA node, and its memory is beside its CPU."""
    story = Story(said=["under single-numa-node:"])
    await loop.start("single-numa-node")
    await loop.mover(False)  # else the memory would be moved home in place
    taken = (await loop.node.sh(FILL_NODE_0)).strip()
    story.said.append(f"  a tmpfs outside Kubernetes takes {taken} MiB of NUMA node 0's memory")
    await loop.cp.create(loop.session, deployment("cache", 1, HOLD, memory=f"{2 * HELD_MIB}Mi"))
    await loop.memory(story, await loop.placed(story, "cache-"))
    await loop.sustained("memory_remote")
    await loop.node.sh(f"umount {FILLED}")
    story.said.append("  the tmpfs is removed: NUMA node 0 has room again")
    controller = loop.controller()
    await loop.cycles(story, controller, lambda s: len(s.pods) > 1)
    await loop.memory(story, story.pods[-1][0])
    await loop.cycles(story, controller, lambda s: s.outcomes)
    return story


async def moved_in_place(loop: NodeLoop) -> Story:
    """Under ``single-numa-node``, as in moved_home, a pod's memory mostly on NUMA node 1
    beside its CPU on node 0, now with the exporter's memory mover on. The pod is
    opted out: left alone. The opt-out lifted, node 0 is still full: left alone, the
    move having no room. The tmpfs goes: a dry run says what it would do; then the
    remediator asks the node, the exporter moves the pages of the running container home
    at its rate, and the fix is verified on the same pod."""
    story = Story(said=["under single-numa-node, the exporter's memory mover on:"])
    await loop.start("single-numa-node")
    await loop.mover(True)
    # as on nodes tuned for GPU jobs: the kernel's own NUMA balancing off (with it on,
    # this 6.1 kernel's move_pages cannot see a page it marked: docs/remediator.md)
    await loop.node.sh(f"echo 0 > {NUMA_BALANCING}")
    story.said.append("  the kernel's NUMA balancing off")
    try:
        await _in_place(loop, story)
    finally:
        await loop.node.sh(f"echo 1 > {NUMA_BALANCING}")
    return story


async def _in_place(loop: NodeLoop, story: Story) -> None:
    taken = (await loop.node.sh(FILL_NODE_0)).strip()
    story.said.append(f"  a tmpfs outside Kubernetes takes {taken} MiB of NUMA node 0's memory")
    # not moved_home's "cache": its Events outlive it
    warm = deployment("warm", 1, HOLD, memory=f"{2 * HELD_MIB}Mi")
    template = warm["spec"]["template"]["metadata"]
    template.setdefault("annotations", {})[OPT_OUT] = "false"
    await loop.cp.create(loop.session, warm)
    pod = await loop.placed(story, "warm-")
    await loop.memory(story, pod, "before")
    procs = f"cat {container_cgroup(pod)}/cgroup.procs"
    story.processes["before"] = (await loop.node.sh(procs)).split()
    await loop.sustained("memory_remote")

    async def once(what: str, **policy) -> CycleReport:
        report = await loop.controller(**policy).cycle()
        story.reports.append(report)
        for r in report.plan.refusals:
            story.said.append(f"  {what}: refused, {r.guard}: {r.detail}")
        for action, result in report.results:
            story.said.append(f"  {what}: {action.detail} -> {result}")
        return report

    await once("opted out")
    name = pod["metadata"]["name"]
    lifted = {"metadata": {"annotations": {OPT_OUT: None}}}
    await loop.cp.patch(loop.session, "Pod", NS, name, lifted)
    # as the remediator will read it: less free on node 0 than the pod holds on node 1
    remote = story.memory["before"]["1"] * 2**20
    await loop.prom.wait_for(f'{NUMA_MEMORY_FREE.name}{{numa_node="0"}} < {remote}', 120)
    await once("opt-out lifted, NUMA node 0 full")
    await loop.node.sh(f"umount {FILLED}")
    story.said.append("  the tmpfs is removed: NUMA node 0 has room again")
    # as the remediator will read it: node 0's free memory, scraped since
    room = f'{NUMA_MEMORY_FREE.name}{{numa_node="0"}} > {2 * HELD_MIB * 2**20}'
    await loop.prom.wait_for(room, 120)
    await once("dry run", dry_run=True)
    # judged over a period the move fits in: on the loaded emulated guest it has taken
    # 15 s, past the 10 s the other stories give a replacement
    await loop.cycles(story, loop.controller(verify_after_seconds=60), lambda s: s.outcomes)
    # and the verdict may clear before the last pages move: "after" is once the mover
    # says the move is over
    await loop.prom.wait_for(f"sum({MEMORY_MOVES.name}) >= 1", 300)
    await loop.memory(story, pod, "after")
    story.processes["after"] = (await loop.node.sh(procs)).split()


async def refused(loop: NodeLoop) -> Story:
    """Under ``best-effort`` a pod across both nodes (CPUs 3 and 7) beside the filler
    and the neighbour; the kubelet restarted under ``single-numa-node`` refuses it. Then
    a 2-CPU Deployment fits the node (the scheduler binds it) but no NUMA node: each of
    its pods is refused, the ReplicaSet makes another, and the remediator deletes all
    but the newest."""
    story = Story(said=["under single-numa-node:"])
    await loop.start("best-effort")
    for name, cpus in FULL:
        await loop.bare(name, cpus)
    split = await loop.bare("split", 2)
    story.pods.append((split, await exclusive_cpus(loop.node, split)))
    await loop.node.restart_kubelet(KubeletPolicy("single-numa-node", memory="None"))

    async def failed():
        p = await loop.cp.get(loop.session, "Pod", NS, "split")
        return p if p["status"].get("phase") == "Failed" else None

    split = await until(failed, "split refused on restart", timeout=300, every=1)
    story.said.append(
        f"  split ({show(story.pods[0][1])}), restarted under single-numa-node: "
        f"{split['status']['reason']}"
    )
    await loop.cp.create(loop.session, deployment("wide", 2))

    async def storm():
        failed = await loop.pods("wide-", "Failed")
        return len(failed) >= KEEP + 3 and failed

    await until(storm, "wide refused again and again", timeout=300, every=1)
    await loop.cp.patch(loop.session, "Deployment", NS, "wide", {"spec": {"replicas": 0}})

    async def stopped():
        """Its ReplicaSet has seen the scale-down, and every pod of it has failed and is
        not being deleted (the ReplicaSet deletes one still pending): none come or go."""
        sets = [
            r
            for r in await loop.cp.items(loop.session, "ReplicaSet", NS)
            if r["metadata"]["name"].startswith("wide-")
        ]
        seen = all(
            not r["spec"]["replicas"]
            and r["status"].get("observedGeneration", 0) >= r["metadata"]["generation"]
            and not r["status"].get("replicas")
            for r in sets
        )
        pods = await loop.cp.items(loop.session, "Pod", NS)
        wide = [p for p in pods if p["metadata"]["name"].startswith("wide-")]
        settled = all(
            p["status"].get("phase") == "Failed" and not p["metadata"].get("deletionTimestamp")
            for p in wide
        )
        return seen and settled and wide

    rejected = await until(stopped, "no more wide pods coming", timeout=300, every=1)
    story.said.append(f"  wide: {len(rejected)} pods refused, then scaled to 0")
    story.pods += [(p, {}) for p in rejected]
    report = await loop.controller().cycle()
    story.reports.append(report)
    for s in report.storms:
        story.said.append(
            f"  remediator: {s.workload}: {len(s.pods)} refused, deleting {len(s.delete)}"
        )

    async def cleaned():
        left = await loop.pods("wide-", "Failed")
        return left if len(left) == KEEP else None

    left = await until(cleaned, "the surplus deleted", timeout=120, every=1)
    story.said.append(f"  left for diagnosis: {', '.join(p['metadata']['name'] for p in left)}")
    return story
