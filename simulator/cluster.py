"""A simulated GPU cluster for the remediator's tests, the demo and the benchmarks.

Nodes are fake hosts (cgroups, sysfs, resctrl-less) with fake NVML GPUs and a fake
kubelet each; pods belong to Deployments on one fake API server. When a pod is evicted,
its ReplicaSet makes a replacement: a NUMA-blind scheduler picks a node, and that node's
kubelet admits it under its Topology Manager policy:

* ``single-numa-node`` / ``restricted``: CPUs and device on one NUMA node, or the pod
  fails admission (TopologyAffinityError) and is not placed;
* ``best-effort``: aligned when it can, anywhere otherwise (silently misaligned);
* ``none``: the lowest free CPUs and the first free device, aligned or not.

A GPU job keeps its GPU busy only when fed from its own NUMA node: its device shows its
``demand`` when aligned and a fraction of it when not, so a fix can be seen to hold.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import AsyncIterator
from dataclasses import dataclass

from exporter.readers import format_id_list, parse_id_list
from simulator import presets
from simulator.host import FakeContainer, FakeHost, FakeHostRoot, FakePod
from simulator.kubeapi import FakeApiServer, pod_objects
from simulator.kubelet import FakeKubelet
from simulator.nvml import FakeGpu, FakeNvml, FakeSlice, Process
from simulator.processes import exporter_process

POLICIES = ("none", "best-effort", "restricted", "single-numa-node")
STARVED_SHARE = 0.15  # what a job fed across sockets gets of its demand


@dataclass
class SimNode:
    name: str
    host: FakeHost
    nvml: FakeNvml
    policy: str
    root: FakeHostRoot | None = None
    kubelet: FakeKubelet | None = None
    description: str = ""  # the fake NVML description file its exporter follows

    def write(self) -> None:
        self.root.write()
        tmp = f"{self.description}.tmp"
        with open(tmp, "w") as f:
            f.write(self.nvml.description())
        os.replace(tmp, self.description)


class SimulatedCluster:
    def __init__(self, directory: str) -> None:
        self.directory = directory
        self.api = FakeApiServer()
        self.api.recreate = self.replace
        self.nodes: dict[str, SimNode] = {}
        self.demand: dict[str, float] = {}  # workload (pod name stem) -> SM demand
        self.generation = 0
        self.rejected: list[str] = []  # pods the Topology Manager refused

    def add_node(self, name: str, host: FakeHost, nvml: FakeNvml, policy: str) -> SimNode:
        assert policy in POLICIES, policy
        node = SimNode(name, host, nvml, policy)
        d = f"{self.directory}/{name}"
        os.makedirs(d, exist_ok=True)
        node.root = FakeHostRoot(f"{d}/host", host)
        node.description = f"{d}/gpus.json"
        node.write()
        self.nodes[name] = node
        return node

    async def start(self) -> None:
        await self.api.start()
        for node in self.nodes.values():
            socket = f"{self.directory}/{node.name}/kubelet.sock"
            node.kubelet = await FakeKubelet(socket, node.host, node.nvml).start()
            for obj in pod_objects(node.host, node.name):
                self.api.put("pods", owned(self.api, obj))

    async def stop(self) -> None:
        for node in self.nodes.values():
            if node.kubelet:
                await node.kubelet.stop()
        await self.api.stop()

    def exporter_args(self, node: SimNode, kubeconfig: str) -> tuple[str, ...]:
        return (
            "--host-root",
            str(node.root.root),
            "--node-name",
            node.name,
            "--kubeconfig",
            kubeconfig,
            "--gpu-backend",
            f"fake:{node.description}",
            "--pod-resources-socket",
            node.kubelet.socket_path,
        )

    # -- the ReplicaSet, the scheduler and the kubelet ---------------------------------

    def replace(self, evicted: dict) -> dict | None:
        """The evicted pod's replacement, placed as the cluster would place it."""
        old_node = self.nodes[evicted["spec"]["nodeName"]]
        old = next(p for p in old_node.host.pods if p.uid == evicted["metadata"]["uid"])
        stem = old.name.split(".")[0]
        self._remove(old_node, old)
        need_cpus = len(parse_id_list(old.containers[0].cpus))
        resources = list(old.containers[0].devices)
        self.generation += 1
        name = f"{stem}.{self.generation}"
        for node in self._by_room(need_cpus):
            placed = self._admit(node, need_cpus, resources)
            if placed is None:
                continue
            cpus, units = placed
            ctr = FakeContainer(
                "main",
                format_id_list(cpus),
                self._first_touch(node, cpus, sum(old.containers[0].memory_by_node.values())),
                exclusive_cpus=True,
                devices={r: [u.uuid] for r, u in zip(resources, units, strict=True)},
            )
            pod = FakePod(name, presets.pod_uid(name), "guaranteed", [ctr], old.namespace)
            for p in node.host.pods:  # the shared pool gives up the CPUs
                for c in p.containers:
                    if not c.exclusive_cpus:
                        c.cpus = format_id_list(parse_id_list(c.cpus) - cpus)
            node.host.pods.append(pod)
            self._run(node, pod, units, stem)
            node.write()
            obj = next(
                o for o in pod_objects(node.host, node.name) if o["metadata"]["name"] == name
            )
            return owned(self.api, obj)
        self.rejected.append(name)
        return None

    @staticmethod
    def _first_touch(node: SimNode, cpus: frozenset[int], total: int) -> dict[int, int]:
        """Where the kernel puts a new pod's memory: on the NUMA nodes of the CPUs that
        touch it first, in proportion to its CPUs there."""
        share = {
            i: len(parse_id_list(n.cpus) & cpus)
            for i, n in enumerate(node.host.nodes)
            if parse_id_list(n.cpus) & cpus
        }
        return {i: total * k // len(cpus) for i, k in share.items()}

    def _by_room(self, need: int) -> list[SimNode]:
        """The scheduler: NUMA-blind, it looks at the node's totals only."""
        return sorted(
            (n for n in self.nodes.values() if len(self.free_cpus(n)) >= need),
            key=lambda n: (-len(self.free_cpus(n)), n.name),
        )

    def _admit(self, node: SimNode, need: int, resources: list[str]):
        free = self.free_cpus(node)
        by_numa = {i: sorted(parse_id_list(n.cpus) & free) for i, n in enumerate(node.host.nodes)}
        units_by_numa = {i: [self._free_unit(node, r, i) for r in resources] for i in by_numa}
        aligned = [
            i
            for i in by_numa
            if len(by_numa[i]) >= need and all(u is not None for u in units_by_numa[i])
        ]
        if aligned and node.policy != "none":
            i = aligned[0]
            return frozenset(by_numa[i][:need]), units_by_numa[i]
        if node.policy in ("restricted", "single-numa-node"):
            return None  # TopologyAffinityError
        units = [self._free_unit(node, r, None) for r in resources]
        if any(u is None for u in units) or len(free) < need:
            return None
        return frozenset(sorted(free)[:need]), units

    def free_cpus(self, node: SimNode) -> frozenset[int]:
        """CPUs the CPU manager can give exclusively: all but those already given (the
        shared pool shrinks as it does)."""
        taken: set[int] = set()
        for p in node.host.pods:
            for c in p.containers:
                if c.exclusive_cpus:
                    taken |= parse_id_list(c.cpus)
        return node.host.all_cpus - taken

    def _free_unit(self, node: SimNode, resource: str, numa: int | None):
        held = {
            i
            for p in node.host.pods
            for c in p.containers
            for ids in c.devices.values()
            for i in ids
        }
        claimed = {claim.device for p in node.host.pods for c in p.containers for claim in c.claims}
        for index, gpu in enumerate(node.nvml.gpus):
            if (numa is not None and gpu.numa_node != numa) or f"gpu-{index}" in claimed:
                continue
            units = [gpu] if gpu.mig is None else gpu.mig
            for unit in units:
                name = (
                    "nvidia.com/gpu"
                    if isinstance(unit, FakeGpu)
                    else f"nvidia.com/mig-{unit.profile.name}"
                )
                if name == resource and unit.uuid not in held:
                    return unit
        return None

    def _remove(self, node: SimNode, pod: FakePod) -> None:
        pids = {node.host.pid(pod, c) for c in pod.containers}
        for gpu in node.nvml.gpus:
            for unit in [gpu, *(gpu.mig or [])]:
                if any(p.pid in pids for p in unit.processes):
                    unit.processes = [p for p in unit.processes if p.pid not in pids]
                    unit.activity.set(**dict.fromkeys(unit.activity.rates, 0.0))
        node.host.pods.remove(pod)
        node.write()

    def _run(self, node: SimNode, pod: FakePod, units, stem: str) -> None:
        """Start the job's process on its devices, as busy as its feeding allows."""
        ctr = pod.containers[0]
        cpu_nodes = {
            i
            for i, n in enumerate(node.host.nodes)
            if parse_id_list(n.cpus) & parse_id_list(ctr.cpus)
        }
        for unit in units:
            gpu = (
                unit
                if isinstance(unit, FakeGpu)
                else next(g for g in node.nvml.gpus if unit in (g.mig or []))
            )
            demand = self.demand.get(stem, 0.8)
            sm = demand if gpu.numa_node in cpu_nodes else demand * STARVED_SHARE
            unit.processes.append(Process(node.host.pid(pod, ctr), 8 << 30))
            unit.activity.set(sm=sm, graphics=min(1.0, sm * 1.1))
            if isinstance(unit, FakeSlice):
                unit.memory_used_bytes = 8 << 30


def owned(api: FakeApiServer, obj: dict) -> dict:
    """Give a pod a Deployment and a ReplicaSet, as ``kubectl create deployment`` would:
    pods ``name`` and ``name.N`` belong to Deployment ``name``; owner references carry
    their owners' uids."""
    name = obj["metadata"]["name"].split(".")[0]
    namespace = obj["metadata"]["namespace"]
    labels = {"app": name}
    if (namespace, name) not in api.objects["deployments"]:
        deployment = api.put(
            "deployments",
            {
                "apiVersion": "apps/v1",
                "kind": "Deployment",
                "metadata": {"name": name, "namespace": namespace, "annotations": {}},
                "spec": {
                    "selector": {"matchLabels": labels},
                    "template": {"metadata": {"labels": labels}, "spec": {"containers": []}},
                },
            },
        )
        api.put(
            "replicasets",
            {
                "apiVersion": "apps/v1",
                "kind": "ReplicaSet",
                "metadata": {
                    "name": f"{name}-rs",
                    "namespace": namespace,
                    "ownerReferences": [_reference(deployment)],
                },
                "spec": {"selector": {"matchLabels": labels}},
            },
        )
    replicaset = api.objects["replicasets"][(namespace, f"{name}-rs")]
    obj["metadata"]["labels"] = labels
    obj["metadata"]["ownerReferences"] = [_reference(replicaset)]
    return obj


def _reference(owner: dict) -> dict:
    meta = owner["metadata"]
    return {
        "apiVersion": owner["apiVersion"],
        "kind": owner["kind"],
        "name": meta["name"],
        "uid": meta["uid"],
        "controller": True,
    }


@contextlib.asynccontextmanager
async def one_node(
    host: FakeHost, nvml: FakeNvml, name: str = "gpu-node-3", policy: str = "single-numa-node"
) -> AsyncIterator[tuple[SimulatedCluster, str]]:
    """A one-node simulated cluster with its exporter process scraping every second:
    yields (the cluster, the exporter's URL)."""
    directory = tempfile.mkdtemp(prefix="ng", dir="/tmp")  # unix socket paths are short
    sim = SimulatedCluster(directory)
    node = sim.add_node(name, host, nvml, policy)
    await sim.start()
    try:
        kubeconfig = sim.api.kubeconfig(f"{directory}/kubeconfig")
        async with exporter_process(*sim.exporter_args(node, kubeconfig), "--interval", "1") as (
            url,
            _,
        ):
            yield sim, url
    finally:
        await sim.stop()
        shutil.rmtree(directory, ignore_errors=True)
