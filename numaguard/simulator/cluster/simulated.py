"""A simulated GPU cluster on a real control plane, for the remediator's tests, the demo
and the benchmarks.

The control plane is real (simulator.parts.controlplane: kube-apiserver, the controllers, the
NUMA-blind default scheduler); the simulator is every node's kubelet. Nodes are fake
hosts (cgroups, sysfs) with fake NVML GPUs and a fake PodResources kubelet each
(simulator.cluster.node, with what their kubelet admits). Here: the cluster's life — nodes
added, preset pods created, exporters run, everything removed at the end; the nodes'
kubelet is simulator.cluster.agent's NodeAgent, and the objects made for preset pods are
simulator.cluster.manifests'.

A preset's pods are the cluster's starting point: each is created bound to its node
(with the labels of its workload's ReplicaSet, which then adopts it, as does the
Deployment the ReplicaSet) and admitted where the preset put it: that is how a pod ends
up misaligned in the first place. Their replacements come from the real controllers.

A GPU job keeps its GPU busy only when fed from its own NUMA node: its device shows its
``demand`` when aligned and a fraction of it when not, so a fix can be seen to hold and
to pay off; an ``input_bound`` job shows its demand wherever it runs, so a fix that
clears its finding gains nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import tempfile
from collections.abc import AsyncIterator

import aiohttp

from numaguard.simulator.cluster.agent import NodeAgent
from numaguard.simulator.cluster.manifests import (
    PRESET_HASH,
    bound_pod,
    deployment,
    pod_template,
    replicaset,
    stem,
)
from numaguard.simulator.cluster.mig_manager import MigManager
from numaguard.simulator.cluster.node import (
    POLICIES,
    SimNode,
    keep_ids,
)
from numaguard.simulator.fakes import dra
from numaguard.simulator.fakes.host import FakeHost, FakeHostRoot, FakePod
from numaguard.simulator.fakes.nvml import FakeNvml
from numaguard.simulator.fakes.podresources import FakeKubelet
from numaguard.simulator.parts.controlplane import ApiError, ControlPlane, path_of, rendered
from numaguard.simulator.parts.processes import exporter_process, routable_address, until

# what a cluster leaves behind in its namespaces, deleted when it stops
WORKLOAD_KINDS = ("Deployment", "StatefulSet", "DaemonSet", "ReplicaSet")
LEFT_BEHIND = (
    *WORKLOAD_KINDS,
    "PodDisruptionBudget",
    "Event",
    "ResourceClaim",
    "ResourceClaimTemplate",
)


# control plane (by id) -> the names of the Nodes its simulated clusters now run
_LIVE: dict[int, set[str]] = {}


class SimulatedCluster(NodeAgent, MigManager):
    def __init__(self, directory: str, control_plane: ControlPlane) -> None:
        self.directory = directory
        self.cp = control_plane
        self.nodes: dict[str, SimNode] = {}
        self.demand: dict[str, float] = {}  # workload -> SM demand of its GPU job
        # workloads held back by something placement does not change (their input): as
        # busy wherever they run
        self.input_bound: set[str] = set()
        self.rejected: list[str] = []  # pods the Topology Manager refused
        self.admitted: list[str] = []  # pods admitted, in order
        self.namespaces: set[str] = set()
        # namespace -> the node its workloads are pinned to (a team's node pool)
        self.node_pools: dict[str, str] = {}
        self.session: aiohttp.ClientSession | None = None
        self._running: dict[str, tuple[SimNode, FakePod]] = {}  # uid -> where it runs
        # uid -> (where it runs, its ReplicaSet's uid, the object): evicted, still holding
        self._terminating: dict[str, tuple[SimNode, FakePod, str, dict]] = {}
        self.workload: dict[str, str] = {}  # uid -> its workload (app label) once admitted
        # uid -> (GPU index, UUID) of the MIG slices its claims made, destroyed with it
        self._made: dict[str, list[tuple[int, str]]] = {}
        self.unprepared: list[tuple[str, str]] = []  # (pod, why) its claims not prepared
        # (namespace, pod) -> the address its process really serves on, for its status
        self.addresses: dict[tuple[str, str], str] = {}
        self._tasks: list[asyncio.Task] = []
        self._timers: list[asyncio.TimerHandle] = []  # evicted pods' terminations
        self._changed = asyncio.Event()

    def add_node(self, name: str, host: FakeHost, nvml: FakeNvml, policy: str) -> SimNode:
        assert policy in POLICIES, policy
        node = SimNode(name, host, nvml, policy, index=len(self.nodes) + 1)
        d = f"{self.directory}/{name}"
        # only root may enter it, as the kubelet makes its pod-resources directory (0750),
        # which holds the kubelet's socket here too
        os.makedirs(d, mode=0o750, exist_ok=True)
        node.root = FakeHostRoot(f"{d}/host", host)
        node.description = f"{d}/gpus.json"
        for pod in host.pods:
            keep_ids(host, pod)
            node.presets[(pod.namespace, pod.name)] = pod
            for ctr in pod.containers:
                for claim in ctr.claims:
                    claim.pool = name  # NVIDIA's DRA driver names a node's pool after it
        host.pods = []  # the pods arrive as the agent admits them
        # the kubelet's configuration file, as kubeadm writes it: its Topology Manager too
        host.kubelet_config = {
            "apiVersion": "kubelet.config.k8s.io/v1beta1",
            "kind": "KubeletConfiguration",
            **(host.kubelet_config or {}),
            "topologyManagerPolicy": policy,
            "topologyManagerScope": "container",
        }
        node.write()
        self.nodes[name] = node
        return node

    # -- lifecycle ----------------------------------------------------------------------

    async def start(self, customise=None) -> None:
        """Register the nodes and create the presets' pods and workloads; returns once
        every pod is admitted and owned (see ``add_pods`` for ``customise``)."""
        self.session = aiohttp.ClientSession()
        await self._forget_stale_nodes()
        _LIVE.setdefault(id(self.cp), set()).update(self.nodes)
        for node in self.nodes.values():
            socket = f"{self.directory}/{node.name}/kubelet.sock"
            node.kubelet = await FakeKubelet(socket, node.host, node.nvml).start()
            await self.cp.create(self.session, self._node_object(node))
            # the API server taints a new Node not-ready; the node lifecycle controller
            # lifts it once the Node reports Ready, as this one does from the start
            await self.cp.patch(self.session, "Node", None, node.name, {"spec": {"taints": None}})
            await self.cp.create(self.session, self._node_lease(node))
            await self._publish_dra(node)
        self._tasks = [
            asyncio.create_task(self._agent()),
            asyncio.create_task(self._heartbeat()),
        ]
        if any(node.mig_config for node in self.nodes.values()):
            self._tasks.append(asyncio.create_task(self._mig_manager()))
        await self.add_pods(
            [(node, pod) for node in self.nodes.values() for pod in node.presets.values()],
            customise,
        )

    async def _publish_dra(self, node: SimNode) -> None:
        """As NVIDIA's DRA driver on the node would: its DeviceClass (once per cluster)
        and a ResourceSlice of the GPUs the presets' claims hold."""
        gpus = {
            int(claim.device.removeprefix("gpu-"))
            for pod in node.presets.values()
            for ctr in pod.containers
            for claim in ctr.claims
        }
        gpus |= {i for i, g in enumerate(node.nvml.gpus) if g.dynamic_mig}
        if not gpus:
            return
        for made in (dra.device_class(), dra.device_class(dra.MIG_CLASS, "mig")):
            with contextlib.suppress(ApiError):  # made by an earlier cluster: it stays
                await self.cp.create(self.session, made)
        for published in dra.resource_slices(node.name, node.nvml, sorted(gpus)):
            await self.cp.create(self.session, published)

    async def _allocate_claims(self, node: SimNode, pod: FakePod) -> None:
        """A preset pod comes bound, its claims allocated, as the scheduler leaves them."""
        for ctr in pod.containers:
            for claim in ctr.claims:
                with contextlib.suppress(ApiError):  # another of the presets' made it
                    await self.cp.create(self.session, dra.claim_object(pod.namespace, claim.claim))
                status = {"status": dra.allocation(node.name, claim.device)}
                await self.cp.patch(
                    self.session, "ResourceClaim", pod.namespace, claim.claim, status, "status"
                )

    async def add_pods(self, pods: list[tuple[SimNode, FakePod]], customise=None) -> None:
        """Create pods bound to their nodes, to be admitted where they are placed, with a
        Deployment and ReplicaSet per workload that adopt them; returns once they run and
        are owned. ``customise``: ``async (cluster, pod object)`` to change a pod before it
        is created (one left without the ReplicaSet's labels is not in its workload)."""
        for node, pod in pods:
            keep_ids(node.host, pod)
            node.presets[(pod.namespace, pod.name)] = pod
        for namespace in sorted({pod.namespace for _, pod in pods}):
            await self.ensure_namespace(namespace)
        workloads: dict[tuple[str, str], list[tuple[SimNode, FakePod]]] = {}
        for node, pod in pods:
            workloads.setdefault((pod.namespace, stem(pod.name)), []).append((node, pod))
        paused = []
        for (namespace, name), members in workloads.items():
            template = pod_template(members[0][1], name, self.node_pools.get(namespace))
            owned = 0
            for node, pod in members:
                await self._allocate_claims(node, pod)
                obj = bound_pod(pod, node.name, template)
                if customise is not None:
                    await customise(self, obj)
                owned += PRESET_HASH in obj["metadata"].get("labels", {}).values()
                await self.cp.create(self.session, obj)
            if not owned:
                continue
            await self.cp.create(self.session, replicaset(namespace, name, template, owned))
            # paused, a Deployment adopts the ReplicaSet but makes none of its own
            await self.cp.create(self.session, deployment(namespace, name, template, owned))
            paused.append((namespace, name))
        await self.wait_until(
            lambda: not any(node.presets for node in self.nodes.values()), "presets admitted"
        )
        await self.wait_for_api(self._all_adopted, "preset pods adopted by their Deployments")
        for namespace, name in paused:
            await self.cp.patch(
                self.session, "Deployment", namespace, name, {"spec": {"paused": False}}
            )

    async def _forget_stale_nodes(self) -> None:
        """Nodes no live simulated cluster of this control plane runs are left over by
        one that could not stop (a test that failed mid-way): the scheduler would send
        pods there, never to be admitted. They go, with what was bound to them."""
        live = _LIVE.get(id(self.cp), set())
        for node in await self.cp.items(self.session, "Node"):
            name = node["metadata"]["name"]
            if name not in live:
                await self.cp.request(self.session, "DELETE", path_of("Node", None, name))
                await self.cp.request(
                    self.session, "DELETE", path_of("Lease", "kube-node-lease", name)
                )

    async def stop(self) -> None:
        """Stop the agent and take everything this cluster made out of the control plane
        (its namespaces' contents, Nodes), so that the next cluster starts from a clean
        one. The namespaces stay, empty: deleting one takes the namespace controller
        seconds, and the next cluster likely wants it again."""
        _LIVE.get(id(self.cp), set()).difference_update(self.nodes)
        for timer in self._timers:
            timer.cancel()
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        if self.session is not None:
            for namespace in self.namespaces:
                for kind in LEFT_BEHIND:
                    await self.cp.request(self.session, "DELETE", path_of(kind, namespace))
            for node in self.nodes.values():
                for published in await self.cp.items(self.session, "ResourceSlice", None):
                    if published["spec"].get("nodeName") == node.name:
                        name = published["metadata"]["name"]
                        path = path_of("ResourceSlice", None, name)
                        await self.cp.request(self.session, "DELETE", path)
                await self.cp.request(self.session, "DELETE", path_of("Node", None, node.name))
                await self.cp.request(
                    self.session, "DELETE", path_of("Lease", "kube-node-lease", node.name)
                )
            await self.wait_for_api(self._emptied, "namespaces emptied")
            await self.session.close()
        for node in self.nodes.values():
            if node.kubelet:
                await node.kubelet.stop()

    async def ensure_namespace(self, namespace: str) -> None:
        """Create it and wait for its default ServiceAccount (pods need it)."""
        if namespace not in self.namespaces:
            self.namespaces.add(namespace)
            obj = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}}
            try:
                await self.cp.create(self.session, obj)
            except ApiError as err:
                if err.status != 409:
                    raise
        await self.wait_for_api(
            lambda s: self.cp.get(s, "ServiceAccount", namespace, "default"),
            f"ServiceAccount {namespace}/default",
        )

    async def wait_until(self, predicate, what: str, timeout: float = 120.0) -> None:
        """Return once ``predicate()`` holds, looking again whenever the agent acted."""
        try:
            async with asyncio.timeout(timeout):
                while True:
                    self._changed.clear()
                    if predicate():
                        return
                    await self._changed.wait()
        except TimeoutError:
            raise AssertionError(f"not {what} in {timeout:g}s") from None

    async def wait_for_api(self, check, what: str, timeout: float = 120.0):
        """Poll ``await check(session)`` until it is truthy; returns it."""
        return await until(lambda: check(self.session), what, timeout)

    async def _all_adopted(self, session) -> bool:
        for namespace in self.namespaces:
            for pod in await self.cp.items(session, "Pod", namespace):
                labels = pod["metadata"].get("labels") or {}
                if labels.get("pod-template-hash") and not pod["metadata"].get("ownerReferences"):
                    return False
            for rs in await self.cp.items(session, "ReplicaSet", namespace):
                if not rs["metadata"].get("ownerReferences"):
                    return False
        return True

    async def _emptied(self, session) -> bool:
        """No workload left (that could make pods again) and no pod: those there are
        deleted at once, as the kubelet would confirm."""
        for namespace in self.namespaces:
            for kind in WORKLOAD_KINDS:
                if await self.cp.items(session, kind, namespace):
                    return False
            pods = await self.cp.items(session, "Pod", namespace)
            for pod in pods:
                await self._force_delete(pod)
            if pods:
                return False
        return True

    async def _force_delete(self, pod: dict) -> None:
        meta = pod["metadata"]
        body = {"gracePeriodSeconds": 0, "preconditions": {"uid": meta["uid"]}}
        await self.cp.request(
            self.session, "DELETE", path_of("Pod", meta["namespace"], meta["name"]), body
        )

    def exporter(self, node: SimNode, kubeconfig: str, *args: str, **process):
        """The node's exporter process (see exporter_process), on its fake GPUs."""
        return exporter_process(
            *self.exporter_args(node, kubeconfig), *args, gpus=node.description, **process
        )

    def exporter_args(self, node: SimNode, kubeconfig: str) -> tuple[str, ...]:
        return (
            "--host-root",
            str(node.root.root),
            "--node-name",
            node.name,
            "--kubeconfig",
            kubeconfig,
            "--pod-resources-socket",
            node.kubelet.socket_path,
        )

    async def run_exporter_daemonset(
        self, stack, kubeconfig: str, *args: str, port_of=lambda address, node: None
    ) -> dict[str, str]:
        """Run deploy/'s exporter DaemonSet on every node, as its controller and the
        node's kubelet would: the DaemonSet object as rendered, a pod per node made from
        its template (bound to the node, owned by it) and the exporter as a process for
        each, serving on this machine's routable address, a port each (the nodes share
        one machine: the pod's containerPort says which); the agent reports the pod
        Running at that address, so the exporter Service's EndpointSlices list it as
        they would a real one (``port_of(address, node name)`` may choose the port).
        ``stack`` stops the processes. Returns node -> URL."""
        address = routable_address()
        (daemonset,) = [o for o in rendered() if o["kind"] == "DaemonSet"]
        namespace = daemonset["metadata"]["namespace"]
        self.namespaces.add(namespace)  # stop() takes the DaemonSet and its pods away
        # the GPU Operator's RuntimeClass, which the DaemonSet's pods ask for
        runtime = daemonset["spec"]["template"]["spec"]["runtimeClassName"]
        if await self.cp.get(self.session, "RuntimeClass", None, runtime) is None:
            handler = {"apiVersion": "node.k8s.io/v1", "kind": "RuntimeClass", "handler": runtime}
            await self.cp.create(self.session, {**handler, "metadata": {"name": runtime}})
        owner = await self.cp.create(self.session, daemonset)
        owned_by = {
            "apiVersion": "apps/v1",
            "kind": "DaemonSet",
            "name": owner["metadata"]["name"],
            "uid": owner["metadata"]["uid"],
            "controller": True,
            "blockOwnerDeletion": True,
        }
        urls, names = {}, set()
        for node in self.nodes.values():
            url, _ = await stack.enter_async_context(
                self.exporter(
                    node, kubeconfig, *args, address=address, port=port_of(address, node.name)
                )
            )
            pod = json.loads(json.dumps(daemonset["spec"]["template"]))
            name = f"{owner['metadata']['name']}-{node.index}"
            pod["metadata"] |= {"name": name, "namespace": namespace}
            pod["metadata"]["ownerReferences"] = [owned_by]
            pod["spec"]["nodeName"] = node.name
            (container,) = pod["spec"]["containers"]
            for port in container["ports"]:
                if port["name"] == "metrics":
                    port["containerPort"] = int(url.rsplit(":", 1)[1])
            self.addresses[(namespace, name)] = address
            await self.cp.create(self.session, {"apiVersion": "v1", "kind": "Pod", **pod})
            urls[node.name] = url
            names.add(name)
        await self.wait_until(lambda: names <= set(self.admitted), "exporter pods running")
        return urls

    def running(self, name_prefix: str = "") -> list[FakePod]:
        """The pods the nodes run now (whose names start with ``name_prefix``)."""
        return [p for _, p in self._running.values() if p.name.startswith(name_prefix)]


@contextlib.asynccontextmanager
async def one_node(
    control_plane: ControlPlane,
    host: FakeHost,
    nvml: FakeNvml,
    name: str = "gpu-node-3",
    policy: str = "single-numa-node",
    wrapper: tuple[str, ...] = (),
) -> AsyncIterator[tuple[SimulatedCluster, str]]:
    """A one-node simulated cluster with its exporter process scraping every second (run
    by ``wrapper``, see exporter_process): yields (the cluster, the exporter's URL)."""
    directory = tempfile.mkdtemp(prefix="ng", dir="/tmp")  # unix socket paths are short
    sim = SimulatedCluster(directory, control_plane)
    node = sim.add_node(name, host, nvml, policy)
    await sim.start()
    try:
        account = "numaguard-exporter"  # deploy/'s, installed by install_numaguard
        token = control_plane.tokens[account]
        kubeconfig = control_plane.kubeconfig(f"{directory}/kubeconfig", token, account)
        async with sim.exporter(node, kubeconfig, "--interval", "1", wrapper=wrapper) as (url, _):
            yield sim, url
    finally:
        await sim.stop()
        shutil.rmtree(directory, ignore_errors=True)
