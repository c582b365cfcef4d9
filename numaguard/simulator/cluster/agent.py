"""The simulated nodes' kubelet: registers a Node (and its Lease) per host, watches the
pods the scheduler binds to them, admits each as the node's kubelet would
(simulator.cluster.node.admit), starts its GPU job, and reports it Running — or Failed, with
TopologyAffinityError, when the node's Topology Manager refuses it (SMTAlignmentError, when
its CPU manager's full-pcpus-only does). A mixin of
SimulatedCluster, whose state (the nodes, the API session, the workloads' demand) it
works on."""

from __future__ import annotations

import asyncio
import contextlib
from datetime import UTC, datetime

import aiohttp

from numaguard.exporter.readers import format_id_list, parse_id_list
from numaguard.exporter.readers.dra import read_claim_allocation
from numaguard.exporter.sources.kube import pod_meta
from numaguard.simulator.cluster.manifests import parse_quantity
from numaguard.simulator.cluster.mig_manager import mig_manager_labels
from numaguard.simulator.cluster.node import (
    SimNode,
    SMTAlignmentError,
    admit,
    advertised,
    first_touch,
    free_cpus,
)
from numaguard.simulator.fakes import dra
from numaguard.simulator.fakes.host import FakeClaim, FakeContainer, FakePod
from numaguard.simulator.fakes.nvml import FakeGpu, FakeSlice, Process
from numaguard.simulator.parts.controlplane import ApiError

# a refused pod's status message, as the kubelet writes it (kubelet.go, rejectPod)
_REJECTED = "Pod was rejected: "
_TOPOLOGY_LOCALITY = "Resources cannot be allocated with Topology locality"

STARVED_SHARE = 0.15  # what a job fed across sockets gets of its demand


# How long an evicted pod of a ReplicaSet keeps its exclusive CPUs, memory and devices
# when no replacement is admitted on its node first. A real kubelet admits the
# replacement (which the ReplicaSet makes at once) while the evicted container still
# terminates: the replacement never gets what the evicted pod held. A StatefulSet's
# replacement comes only once the pod is gone, which is what stopping it at once models.
TERMINATION_SECONDS = 3.0


def _replica_set(pod: dict) -> str:
    """The uid of the ReplicaSet that controls the pod; "" for any other owner."""
    for ref in pod["metadata"].get("ownerReferences") or ():
        if ref.get("controller") and ref.get("kind") == "ReplicaSet":
            return ref.get("uid", "")
    return ""


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class NodeAgent:
    def _node_object(self, node: SimNode) -> dict:
        memory = sum(n.memory_total_bytes for n in node.host.nodes)
        capacity = {
            "cpu": str(len(node.host.all_cpus)),
            "memory": str(memory),
            "pods": "250",
        }
        for resource, count in advertised(node).items():
            capacity[resource] = str(count)
        labels = {
            "kubernetes.io/hostname": node.name,
            "kubernetes.io/os": "linux",
            "kubernetes.io/arch": "amd64",
        }
        if node.nvml.gpus:  # as GPU Feature Discovery labels a GPU node
            labels |= {
                "nvidia.com/gpu.present": "true",
                "nvidia.com/gpu.count": str(len(node.nvml.gpus)),
                "nvidia.com/gpu.product": node.nvml.gpus[0].model.name.replace(" ", "-"),
                "nvidia.com/mig.strategy": "mixed",
            }
            labels |= mig_manager_labels(node)
        now = _now()
        return {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": node.name, "labels": labels},
            "status": {
                "capacity": capacity,
                "allocatable": capacity,
                "addresses": [
                    {"type": "InternalIP", "address": f"10.0.{node.index}.1"},
                    {"type": "Hostname", "address": node.name},
                ],
                "conditions": [
                    {
                        "type": "Ready",
                        "status": "True",
                        "reason": "KubeletReady",
                        "message": "kubelet is posting ready status",
                        "lastHeartbeatTime": now,
                        "lastTransitionTime": now,
                    }
                ],
            },
        }

    @staticmethod
    def _node_lease(node: SimNode) -> dict:
        return {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {"name": node.name, "namespace": "kube-node-lease"},
            "spec": {
                "holderIdentity": node.name,
                "leaseDurationSeconds": 40,
                "renewTime": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
            },
        }

    async def _heartbeat(self) -> None:
        """Renew each node's Lease, as a kubelet does every 10 s."""
        while True:
            await asyncio.sleep(10)
            for node in self.nodes.values():
                renew = self._node_lease(node)["spec"]["renewTime"]
                with contextlib.suppress(ApiError, aiohttp.ClientError):
                    await self.cp.patch(
                        self.session,
                        "Lease",
                        "kube-node-lease",
                        node.name,
                        {"spec": {"renewTime": renew}},
                    )

    async def _agent(self) -> None:
        """List and watch every pod; act on those bound to our nodes."""
        version = ""
        while True:
            try:
                if not version:
                    listing = await self.cp.call(self.session, "GET", "/api/v1/pods")
                    listed = {pod["metadata"]["uid"] for pod in listing["items"]}
                    for uid in set(self._running) - listed:  # deleted while not watching
                        self._stop_pod(*self._running.pop(uid))
                    for pod in listing["items"]:
                        await self._on_pod("ADDED", pod)
                    version = listing["metadata"]["resourceVersion"]
                version = await self._watch(version)
            except (aiohttp.ClientError, ApiError, OSError, TimeoutError):
                await asyncio.sleep(0.2)  # the next list or watch will do
            except asyncio.CancelledError:
                raise

    async def _watch(self, version: str) -> str:
        return await self.cp.watch(self.session, "/api/v1/pods", version, self._on_pod)

    async def _on_pod(self, type_: str, pod: dict) -> None:
        meta, spec = pod["metadata"], pod["spec"]
        node = self.nodes.get(spec.get("nodeName", ""))
        uid = meta["uid"]
        if node is None:
            return
        if type_ == "DELETED" or meta.get("deletionTimestamp"):
            owner = _replica_set(pod)
            if type_ != "DELETED" and owner and uid in self._running:
                node_, preset = self._running.pop(uid)
                self._terminating[uid] = (node_, preset, owner, pod)
                loop = asyncio.get_running_loop()
                self._timers.append(loop.call_later(TERMINATION_SECONDS, self._release_soon, uid))
                return
            if uid in self._running:
                self._stop_pod(*self._running.pop(uid))
            if uid in self._terminating:
                self._stop_pod(*self._terminating.pop(uid)[:2])
            if type_ != "DELETED":
                await self._force_delete(pod)  # the kubelet confirms the containers are gone
            self._changed.set()
            return
        if uid in self._running or pod["status"].get("phase") in ("Failed", "Succeeded"):
            return
        preset = node.presets.pop((meta["namespace"], meta["name"]), None)
        if preset is not None:
            preset.uid = uid
            self._start_pod(node, preset)
        else:
            try:
                claimed = await self._prepare(node, pod)
            except dra.NotPrepared as err:  # as a kubelet: the pod waits, not started
                self.unprepared.append((meta["name"], str(err)))
                return
            try:
                placed = self._place(node, pod, claimed)
                refusal = ("TopologyAffinityError", _TOPOLOGY_LOCALITY)
            except SMTAlignmentError as err:
                placed, refusal = None, ("SMTAlignmentError", str(err))
            if placed is None:
                reason, why = refusal
                status = {"phase": "Failed", "reason": reason, "message": _REJECTED + why}
                await self._patch_status(pod, status)
                self.rejected.append(meta["name"])
                await self._release_replaced(pod)
                self._changed.set()
                return
            preset = placed
        self._running[uid] = (node, preset)
        self.workload[uid] = (meta.get("labels") or {}).get("app", "")
        await self._patch_status(pod, self._running_status(node, preset))
        self.admitted.append(meta["name"])
        await self._release_replaced(pod)
        self._changed.set()

    async def _release_replaced(self, replacement: dict) -> None:
        """The evicted pods the ``replacement`` was made for let go of what they hold, now
        that it has been admitted or refused."""
        owner = _replica_set(replacement)
        for uid, (*_, of, _pod) in list(self._terminating.items()):
            if owner and of == owner:
                await self._release(uid)

    def _release_soon(self, uid: str) -> None:
        task = asyncio.ensure_future(self._release(uid))
        self._tasks.append(task)

    async def _release(self, uid: str) -> None:
        """An evicted pod's containers are gone: what it held is free, its object deleted."""
        if uid not in self._terminating:
            return
        node, preset, _, pod = self._terminating.pop(uid)
        self._stop_pod(node, preset)
        with contextlib.suppress(aiohttp.ClientError, ApiError, OSError, TimeoutError):
            await self._force_delete(pod)
        self._changed.set()

    async def _patch_status(self, pod: dict, status: dict) -> None:
        meta = pod["metadata"]
        with contextlib.suppress(ApiError):  # deleted meanwhile: the watch will say so
            await self.cp.patch(
                self.session, "Pod", meta["namespace"], meta["name"], {"status": status}, "status"
            )

    def _running_status(self, node: SimNode, pod: FakePod) -> dict:
        now = _now()
        ip = self.addresses.get((pod.namespace, pod.name))
        ip = ip or f"10.244.{node.index}.{len(self.admitted) % 250 + 2}"
        ready = [
            {"type": t, "status": "True", "lastTransitionTime": now}
            for t in ("PodScheduled", "Initialized", "ContainersReady", "Ready")
        ]
        statuses = []
        for ctr in pod.containers:
            image = f"registry.example/{ctr.name}:1.0"
            runtime = node.host.runtime_scheme
            statuses.append(
                {
                    "name": ctr.name,
                    "containerID": f"{runtime}://{node.host.container_id(pod, ctr)}",
                    "image": image,
                    "imageID": f"{image}@sha256:{'0' * 64}",
                    "ready": True,
                    "restartCount": 0,
                    "started": True,
                    "state": {"running": {"startedAt": now}},
                }
            )
        return {
            "phase": "Running",
            "conditions": ready,
            "hostIP": f"10.0.{node.index}.1",
            "podIP": ip,
            "podIPs": [{"ip": ip}],
            "startTime": now,
            "containerStatuses": statuses,
        }

    def _start_pod(self, node: SimNode, pod: FakePod) -> None:
        node.host.pods.append(pod)
        node.write()

    async def _prepare(
        self, node: SimNode, pod: dict
    ) -> list[tuple[FakeClaim, FakeGpu | FakeSlice]]:
        """The devices the pod's ResourceClaims were allocated on this node, as NVIDIA's
        DRA kubelet plugin prepares them: a DynamicMIG slice made now (and destroyed
        when the pod stops). dra.NotPrepared when one cannot be."""
        _, meta = pod_meta(pod)
        units = []
        for name in meta.claims:
            claim = await self.cp.get(self.session, "ResourceClaim", meta.namespace, name)
            for allocated in read_claim_allocation(claim or {}) or ():
                if (allocated.driver, allocated.pool) != (dra.DRIVER, node.name):
                    continue
                prepared = dra.prepare(node.nvml, allocated.device)
                if prepared is None:
                    continue
                index, unit, made = prepared
                if made:
                    self._made.setdefault(pod["metadata"]["uid"], []).append((index, unit.uuid))
                claimed = FakeClaim(name, allocated.device, allocated.driver, allocated.pool)
                units.append((claimed, unit))
        return units

    def _place(self, node: SimNode, obj: dict, claimed=()) -> FakePod | None:
        """Admit a pod as the kubelet would: exclusive CPUs and devices by policy, its
        memory where its CPUs first touch it; its GPU job started, on its claims'
        devices (``claimed``) too."""
        container = obj["spec"]["containers"][0]
        requests = container.get("resources", {}).get("requests", {})
        limits = container.get("resources", {}).get("limits", {})
        # what a DeviceClass's extended resource gave through the claim the scheduler
        # made is the claim's device, not a device plugin's
        extended = (obj["status"].get("extendedResourceClaimStatus") or {}).get("requestMappings")
        by_claim = {m.get("resourceName") for m in extended or ()}
        resources = {
            r: int(limits[r])
            for r in sorted(limits)
            if r.startswith("nvidia.com/") and r not in by_claim
        }
        qos = obj["status"].get("qosClass", "BestEffort").lower()
        exclusive = qos == "guaranteed" and str(requests.get("cpu", "")).isdigit()
        need = int(requests["cpu"]) if exclusive else 0
        placed = admit(node, need, resources)
        if placed is None:
            return None
        cpus, units = placed
        if not exclusive:
            cpus = free_cpus(node)
        memory = parse_quantity(requests.get("memory", "0"))
        ctr = FakeContainer(
            container["name"],
            format_id_list(cpus),
            first_touch(node, cpus, memory),
            exclusive_cpus=exclusive,
            devices={r: [u.uuid for u in given] for r, given in units.items()},
            claims=[c for c, _ in claimed] if node.claims_in_pod_resources else [],
        )
        meta = obj["metadata"]
        pod = FakePod(meta["name"], meta["uid"], qos, [ctr], meta["namespace"])
        if exclusive:
            for p in node.host.pods:  # the shared pool gives up the CPUs
                for c in p.containers:
                    if not c.exclusive_cpus:
                        c.cpus = format_id_list(parse_id_list(c.cpus) - cpus)
        node.host.pods.append(pod)
        workload = (meta.get("labels") or {}).get("app", meta["name"])
        devices = [u for given in units.values() for u in given]
        self._run(node, pod, [*devices, *(u for _, u in claimed)], workload)
        node.write()
        return pod

    def _stop_pod(self, node: SimNode, pod: FakePod) -> None:
        pids = {node.host.pid(pod, c) for c in pod.containers}
        for gpu in node.nvml.gpus:
            for unit in [gpu, *(gpu.mig or [])]:
                if any(p.pid in pids for p in unit.processes):
                    unit.processes = [p for p in unit.processes if p.pid not in pids]
                    unit.activity.set(**dict.fromkeys(unit.activity.rates, 0.0))
        for index, uuid in self._made.pop(pod.uid, ()):  # the driver unprepares its claims
            node.nvml.destroy_slice(index, uuid)
        node.host.pods.remove(pod)
        node.write()

    def _run(self, node: SimNode, pod: FakePod, units, workload: str) -> None:
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
            demand = self.demand.get(workload, 0.8)
            fed = gpu.numa_node in cpu_nodes or workload in self.input_bound
            sm = demand if fed else demand * STARVED_SHARE
            unit.processes.append(Process(node.host.pid(pod, ctr), 8 << 30))
            unit.activity.set(sm=sm, graphics=min(1.0, sm * 1.1))
            if isinstance(unit, FakeSlice):
                unit.memory_used_bytes = 8 << 30
