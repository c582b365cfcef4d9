"""Steering on the real control plane: the remediator's webhook, served over TLS as
``run --steer`` serves it, its configuration written through the actuator with the
remediator's own token and deploy/'s RBAC; the real API server calls it, the real
ReplicaSet controller makes the replacements and the real scheduler places them."""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import time

import aiohttp
import pytest
from aiohttp import web

from numaguard.remediator import steering
from numaguard.remediator.actuator import Actuator
from numaguard.remediator.core.steering import Steer, Target
from numaguard.remediator.kube import Kube, api_client
from numaguard.simulator.controlplane import ApiError, path_of
from numaguard.simulator.processes import free_port, until

pytestmark = pytest.mark.cluster

NODES = ("steer-a", "steer-b", "steer-c")
CONFIGURATION = "numaguard-remediator"  # deploy/components/steering's


def node(name: str) -> dict:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}},
        "status": {
            "allocatable": {"cpu": "64", "memory": "256Gi", "pods": "110"},
            "capacity": {"cpu": "64", "memory": "256Gi", "pods": "110"},
            "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady"}],
        },
    }


def deployment(name: str, namespace: str) -> dict:
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
                "spec": {
                    "containers": [
                        {
                            "name": "main",
                            "image": "example.invalid/trainer:1",
                            "resources": {"requests": {"cpu": "1", "memory": "1Gi"}},
                        }
                    ],
                    "terminationGracePeriodSeconds": 0,
                },
            },
        },
    }


class Stack:
    """Nodes with no kubelet (the scheduler binds to them; nothing runs), a namespace,
    the webhook served on 127.0.0.1, and the remediator's actuator."""

    async def start(self, cp, tmp_path):
        self.cp, self.tmp_path = cp, tmp_path
        self.stack = contextlib.AsyncExitStack()
        self.session = await self.stack.enter_async_context(aiohttp.ClientSession())
        for name in NODES:
            await cp.create(self.session, node(name))
            self.stack.push_async_callback(self._delete, path_of("Node", None, name))
            # as the node lifecycle controller lifts the not-ready taint of a Ready node
            await cp.patch(self.session, "Node", None, name, {"spec": {"taints": None}})
        # each test its own namespaces, emptied at the end (no kubelet ends their pods)
        self.namespace = f"steer-{secrets.token_hex(4)}"
        self.other = f"{self.namespace}-other"
        for namespace in (self.namespace, self.other):
            await cp.create(
                self.session,
                {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}},
            )
            self.stack.push_async_callback(self._empty, namespace)
        kubeconfig = cp.kubeconfig(
            tmp_path / "remediator.kubeconfig",
            cp.tokens["numaguard-remediator"],
            "numaguard-remediator",
        )
        self.client = await api_client(kubeconfig)
        self.stack.push_async_callback(self.client.close)
        self.actuator = Actuator(Kube(self.client), None)
        self.material = steering.certificate(["127.0.0.1"])
        self.port = free_port()
        self.runner = await steering.serve(self.material, "127.0.0.1", self.port)
        self.stack.push_async_callback(self._stop_webhook)
        self.target = Target(
            CONFIGURATION, self.material["ca.crt"], url=f"https://127.0.0.1:{self.port}"
        )
        self.stack.push_async_callback(
            self.actuator.steer, self.target, time.time(), (), frozenset()
        )
        return self

    async def _delete(self, path: str, force: bool = False) -> None:
        now = {"apiVersion": "v1", "kind": "DeleteOptions", "gracePeriodSeconds": 0}
        with contextlib.suppress(ApiError):
            await self.cp.request(self.session, "DELETE", path, now if force else None)

    async def _empty(self, namespace: str) -> None:
        await self._delete(path_of("Namespace", None, namespace))
        for pod in await self.cp.items(self.session, "Pod", namespace):
            await self._delete(path_of("Pod", namespace, pod["metadata"]["name"]), force=True)

    async def _stop_webhook(self) -> None:
        if self.runner is not None:
            await self.runner.cleanup()
            self.runner = None

    async def pods(self, app: str, namespace: str = "") -> list[dict]:
        namespace = namespace or self.namespace
        return await self.cp.items(self.session, "Pod", namespace, labelSelector=f"app={app}")

    async def replace(self, app: str, namespace: str = "") -> dict:
        """Delete the workload's pod (as an eviction does, at once: no kubelet runs it)
        and return its replacement once the scheduler bound it."""
        namespace = namespace or self.namespace
        (old,) = await self.pods(app, namespace)
        uid = old["metadata"]["uid"]
        await self._delete(path_of("Pod", namespace, old["metadata"]["name"]), force=True)
        return await self.bound(app, namespace, lambda p: p["metadata"]["uid"] != uid)

    async def bound(self, app: str, namespace: str = "", which=lambda p: True) -> dict:
        found: list[dict] = []

        async def done() -> bool:
            found[:] = [
                p
                for p in await self.pods(app, namespace)
                if which(p)
                and p["spec"].get("nodeName")
                and not p["metadata"].get("deletionTimestamp")
            ]
            return bool(found)

        await until(done, f"a pod of {app} bound", timeout=60)
        return found[0]

    async def configuration(self) -> dict:
        return await self.cp.get(self.session, "MutatingWebhookConfiguration", None, CONFIGURATION)

    def steer(self, app: str, nodes: tuple[str, ...], required=False) -> Steer:
        workload = f"Deployment/{self.namespace}/{app}"
        return Steer(workload, {"app": app}, nodes, required, time.time() + 600)

    async def stop(self):
        await self.stack.aclose()


@pytest.fixture
async def stack(control_plane, tmp_path):
    s = await Stack().start(control_plane, tmp_path)
    yield s
    await s.stop()


async def test_replacements_land_on_the_steered_node_and_steering_ends_with_the_wait(stack):
    cp = stack.cp
    await cp.create(stack.session, deployment("trainer", stack.namespace))
    await stack.bound("trainer")
    # the remediator's own token, deploy/'s RBAC: it writes its own configuration
    assert (
        await stack.actuator.steer(
            stack.target, time.time(), (stack.steer("trainer", ("steer-c",)),)
        )
        == "ok"
    )
    config = await stack.configuration()
    (hook,) = config["webhooks"]
    assert hook["failurePolicy"] == "Ignore" and hook["timeoutSeconds"] == 2
    assert hook["objectSelector"] == {"matchLabels": {"app": "trainer"}}
    landed = []
    for _ in range(4):  # three nodes: by chance, four in a row on one is 1 in 27
        pod = await stack.replace("trainer")
        landed.append(pod["spec"]["nodeName"])
        preferred = pod["spec"]["affinity"]["nodeAffinity"][
            "preferredDuringSchedulingIgnoredDuringExecution"
        ]
        assert preferred == [
            {
                "weight": 100,
                "preference": {
                    "matchFields": [
                        {"key": "metadata.name", "operator": "In", "values": ["steer-c"]}
                    ]
                },
            }
        ]
    assert landed == ["steer-c"] * 4
    # verified (no longer pending): its entry leaves, and replacements are left alone
    await stack.actuator.steer(stack.target, time.time(), pending=frozenset())
    assert (await stack.configuration()).get("webhooks", []) == []
    pod = await stack.replace("trainer")
    assert "affinity" not in pod["spec"]


async def test_required_steering_narrows_the_pods_own_required_terms(stack):
    cp = stack.cp
    obj = deployment("pinned", stack.namespace)
    obj["spec"]["template"]["spec"]["affinity"] = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {"matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "Exists"}]}
                ]
            }
        }
    }
    await cp.create(stack.session, obj)
    await stack.bound("pinned")
    await stack.actuator.steer(
        stack.target, time.time(), (stack.steer("pinned", ("steer-a", "steer-b"), required=True),)
    )
    pod = await stack.replace("pinned")
    terms = pod["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"
    ]["nodeSelectorTerms"]
    assert [t["matchFields"][0]["values"] for t in terms] == [["steer-a"], ["steer-b"]]
    assert all(t["matchExpressions"][0]["key"] == "kubernetes.io/hostname" for t in terms)
    assert pod["spec"]["nodeName"] in ("steer-a", "steer-b")


async def test_a_stopped_or_slow_webhook_never_blocks_pod_creation(stack):
    """failurePolicy Ignore and a 2 s timeout: a replacement is made, unsteered, with
    the webhook stopped or hung; pods of other workloads never reach it at all."""
    cp = stack.cp
    await cp.create(stack.session, deployment("trainer", stack.namespace))
    await stack.bound("trainer")
    await stack.actuator.steer(stack.target, time.time(), (stack.steer("trainer", ("steer-c",)),))
    await stack._stop_webhook()  # connection refused
    pod = await stack.replace("trainer")
    assert "affinity" not in pod["spec"]
    calls = []
    released = asyncio.Event()

    async def hang(request: web.Request) -> web.Response:
        calls.append(request.path)
        await released.wait()  # far beyond the 2 s the API server waits
        return web.Response(status=500)

    app = web.Application()
    app.add_routes([web.post("/{tail:.*}", hang)])
    runner = web.AppRunner(app, handle_signals=False)
    await runner.setup()
    await web.TCPSite(
        runner, "127.0.0.1", stack.port, ssl_context=steering.ssl_context(stack.material)
    ).start()
    try:
        pod = await stack.replace("trainer")
        assert "affinity" not in pod["spec"]
        assert calls == ["/steer/preferred/steer-c"]
        # another namespace, and another workload of the same one: never called
        await cp.create(stack.session, deployment("trainer", stack.other))
        await cp.create(stack.session, deployment("other", stack.namespace))
        await stack.bound("trainer", stack.other)
        await stack.bound("other")
        assert len(calls) == 1
    finally:
        released.set()
        await runner.cleanup()
        for namespace, name in ((stack.other, "trainer"), (stack.namespace, "other")):
            await stack._delete(path_of("Deployment", namespace, name))


async def test_the_remediator_may_write_no_other_webhook_configuration(stack):
    other = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "MutatingWebhookConfiguration",
        "metadata": {"name": "someone-elses"},
        "webhooks": [],
    }
    await stack.cp.create(stack.session, other)
    try:
        forged = Target("someone-elses", stack.material["ca.crt"], url="https://127.0.0.1:1")
        assert (
            await stack.actuator.steer(forged, time.time(), (stack.steer("x", ("steer-a",)),))
            == "failed"
        )
        kept = await stack.cp.get(
            stack.session, "MutatingWebhookConfiguration", None, "someone-elses"
        )
        assert kept.get("webhooks", []) == []
    finally:
        await stack._delete(path_of("MutatingWebhookConfiguration", None, "someone-elses"))
