"""Steering on the real control plane: the remediator's webhook, served over TLS as
``run --steer`` serves it, its configuration written through the actuator with the
remediator's own token and deploy/'s RBAC; the real API server calls it, the real
ReplicaSet controller makes the replacements and the real scheduler places them."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
import resource
import secrets
import signal
import ssl
import subprocess
import sys
import time

import aiohttp
import pytest
from aiohttp import web

from numaguard.remediator import steering
from numaguard.remediator.actuator import Actuator
from numaguard.remediator.cluster import nodes_of, pods_of
from numaguard.remediator.core.findings import FindingState, update
from numaguard.remediator.core.planner import nodes_to_check, plan, prepare
from numaguard.remediator.core.policy import Policy
from numaguard.remediator.core.steering import Steer, Target, configured
from numaguard.remediator.kube import Kube, api_client
from numaguard.simulator.parts.controlplane import ApiError, path_of, rendered
from numaguard.simulator.parts.processes import free_port, until
from numaguard.simulator.parts.prometheus import as_signals
from tests.helpers.planner_rows import healthy, instance, merge, zone

# a webhook path's deadline, far off
DEADLINE = int(time.time()) + 86400
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
        self.actuator = Actuator(Kube(self.client), None, dry_run=False)
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
        ((path),) = calls
        assert path.startswith("/steer/preferred/") and path.endswith("/steer-c"), path
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


def statefulset(name: str, namespace: str) -> dict:
    """A StatefulSet whose pods are replaced from its template only when deleted."""
    template = deployment(name, namespace)["spec"]
    return {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {**template, "serviceName": name, "updateStrategy": {"type": "OnDelete"}},
    }


def cross_numa_rows(pod: dict, node: str) -> dict:
    """The exporter's word on a pod whose exclusive CPUs span both NUMA nodes."""
    meta = pod["metadata"]
    ids = {"node": node, "namespace": meta["namespace"], "pod": meta["name"]}
    ids["pod_uid"] = meta["uid"]
    verdict = {**ids, "reason": "cpu_span", "value": 1.0}
    return {
        "cross_numa_sustained": [verdict],
        "cross_numa_seen": [verdict],
        "cross_numa_age": [{**verdict, "value": 1.0}],
        "pod_exclusive_cpus": [{**ids, "numa_node": n, "value": 1.0} for n in ("0", "1")],
        "pod_memory": [{**ids, "numa_node": "0", "value": float(1 << 30)}],
    }


async def test_only_zones_the_replacement_can_reach_fit(stack):
    """Every pod runs on steer-a, whose zones are full; zones fit on steer-b (tainted)
    and steer-c (cordoned). A pod pinned by nodeSelector, one that does not tolerate the
    taint, and one whose StatefulSet template changed since it started get no_fit naming
    what excluded each node; the pod that tolerates the taint is planned to steer-b."""
    cp, session, ns = stack.cp, stack.session, stack.namespace
    for name in ("steer-b", "steer-c"):  # until every pod runs on steer-a
        await cp.patch(session, "Node", None, name, {"spec": {"unschedulable": True}})
    objects = {name: deployment(name, ns) for name in ("pinned", "untolerating", "tolerating")}
    spec = lambda name: objects[name]["spec"]["template"]["spec"]  # noqa: E731
    spec("pinned")["nodeSelector"] = {"kubernetes.io/hostname": "steer-a"}
    spec("tolerating")["tolerations"] = [{"key": "dedicated", "operator": "Exists"}]
    objects["templated"] = statefulset("templated", ns)
    for obj in objects.values():
        await cp.create(session, obj)
    pods = {name: await stack.bound(name) for name in objects}
    assert {p["spec"]["nodeName"] for p in pods.values()} == {"steer-a"}
    taint = {"key": "dedicated", "value": "infer", "effect": "NoSchedule"}
    await cp.patch(
        session, "Node", None, "steer-b", {"spec": {"unschedulable": False, "taints": [taint]}}
    )
    # its replacement will be made from the template as it is now, not as the pod was
    await cp.patch(
        session,
        "StatefulSet",
        ns,
        "templated",
        {"spec": {"template": {"spec": {"nodeSelector": {"pool": "b"}}}}},
    )
    for pod in pods.values():
        name = pod["metadata"]["name"]
        await cp.patch(session, "Pod", ns, name, {"status": {"phase": "Running"}}, sub="status")
    frames = merge(
        healthy("steer-a", "steer-b", "steer-c"),
        zone("steer-a", "0", 0, 0),
        zone("steer-a", "1", 0, 0),
        zone("steer-b", "0", 16, 64),
        zone("steer-c", "0", 16, 64),
        *(cross_numa_rows(p, "steer-a") for p in pods.values()),
    )
    now = time.time()
    sig = as_signals(now, frames, {n: instance(n) for n in NODES})
    findings = list(update(FindingState(), sig).open.values())
    assert len(findings) == 4
    kube = Kube(stack.client)  # the remediator's token: deploy/'s RBAC reads the nodes
    policy = Policy(dry_run=False, min_pod_age_seconds=0, max_per_node=4)
    infos = await pods_of(kube, findings)

    async def planned(names: set[str]):
        mine = [f for f in findings if f.pod.split("-")[0] in names]
        prepared = prepare(mine, sig, policy)
        wanted = nodes_to_check(mine, infos, prepared, policy)
        assert sorted(wanted) == ["steer-a", "steer-b", "steer-c"]
        return plan(mine, infos, sig, policy, {}, now, await nodes_of(kube, wanted), prepared)

    result = await planned({"pinned", "untolerating", "templated"})
    refused = {r.finding.pod.split("-")[0]: r for r in result.refusals}
    assert {name: r.guard for name, r in refused.items()} == dict.fromkeys(
        ("pinned", "untolerating", "templated"), "no_fit"
    )
    said = {name: r.detail.split("(")[-1] for name, r in refused.items()}
    assert said == {
        "pinned": "cordoned: steer-c; nodeSelector kubernetes.io/hostname=steer-a: steer-b)",
        "untolerating": "cordoned: steer-c; taint dedicated=infer:NoSchedule: steer-b)",
        "templated": "cordoned: steer-c; nodeSelector pool=b: steer-b)",
    }
    (action,) = (await planned({"tolerating"})).actions
    assert action.pod.name.startswith("tolerating") and action.nodes == ("steer-b",)


async def test_run_steer_makes_its_certificate_and_every_replica_serves_it(tmp_path, control_plane):
    """Two `remediator run --steer` processes as deploy/'s ServiceAccount: the leader
    makes the certificate Secret, and both replicas answer AdmissionReviews over TLS
    that the Secret's CA verifies — whichever one the API server reaches."""
    cp = control_plane
    account = "numaguard-remediator"
    kubeconfig = cp.kubeconfig(tmp_path / "kubeconfig", cp.tokens[account], account)
    ports = [free_port(), free_port()]
    procs = [
        steering_replica(
            kubeconfig,
            f"replica-{i}",
            "steer-test",
            port,
            free_port(),
            "--log-level",
            "error",
            stderr=subprocess.DEVNULL,
        )
        for i, port in enumerate(ports)
    ]
    review = {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {"uid": "u1", "operation": "CREATE", "object": {"spec": {}}},
    }
    try:
        async with aiohttp.ClientSession() as session:

            async def filled():
                got = await cp.get(session, "Secret", "numaguard", "numaguard-remediator-webhook")
                return steering.from_secret(got or {})

            ca = (await until(filled, "the certificate in its Secret"))["ca.crt"]
            context = ssl.create_default_context(cadata=ca)

            async def answers(port: int) -> dict | None:
                try:
                    url = f"https://127.0.0.1:{port}/steer/preferred/{DEADLINE}/steer-a"
                    async with session.post(url, json=review, ssl=context) as r:
                        return await r.json()
                except aiohttp.ClientError:
                    return None

            for port in ports:
                answer = (await until(lambda p=port: answers(p), "the webhook served"))["response"]
                assert answer["uid"] == "u1" and answer["allowed"] is True
                patch = json.loads(base64.b64decode(answer["patch"]))
                assert patch[0]["path"] == "/spec/affinity"
                # an entry past its deadline, which nobody removed, steers nothing
                url = f"https://127.0.0.1:{port}/steer/preferred/{int(time.time()) - 1}/steer-a"
                async with session.post(url, json=review, ssl=context) as r:
                    assert (await r.json())["response"] == {"uid": "u1", "allowed": True}
            # an entry the leader wrote (no cycle prunes it: with no Prometheus each one
            # ends before verification): it leaves with the leader, lest the API server
            # call a webhook nobody serves for each new pod of that workload
            config = await cp.get(
                session, "MutatingWebhookConfiguration", None, "numaguard-remediator"
            )
            target = Target("numaguard-remediator", ca, url=f"https://127.0.0.1:{ports[0]}")
            entry = Steer("Deployment/ml/trainer", {"app": "t"}, ("steer-a",), False, DEADLINE)
            written = configured(config, target, time.time(), (entry,))
            await cp.call(
                session,
                "PUT",
                path_of("MutatingWebhookConfiguration", None, "numaguard-remediator"),
                written,
            )
        for proc in procs:
            proc.send_signal(signal.SIGTERM)
        assert [proc.wait(timeout=30) for proc in procs] == [0, 0]
        async with aiohttp.ClientSession() as session:
            config = await cp.get(
                session, "MutatingWebhookConfiguration", None, "numaguard-remediator"
            )
            assert config.get("webhooks", []) == []
    finally:
        await stopped(cp, procs, "steer-test")


def steering_replica(
    kubeconfig: str, identity: str, lease: str, port: int, metrics: int, *args: str, **popen
) -> subprocess.Popen:
    """`remediator run --steer` as a replica of deploy/'s Deployment, its webhook on
    ``port``, with no Prometheus (so no findings)."""
    return subprocess.Popen(
        [
            sys.executable,
            *("-m", "numaguard.remediator", "run", "--kubeconfig", kubeconfig),
            *("--prometheus", f"http://127.0.0.1:{free_port()}"),
            *("--listen", f"127.0.0.1:{metrics}", "--identity", identity),
            *("--lease-namespace", "numaguard", "--lease-name", lease),
            *("--retry-period", "0.5", "--interval", "1", *args),
            "--steer",
            *("--webhook-listen", f"127.0.0.1:{port}"),
            *("--webhook-url", f"https://127.0.0.1:{port}"),
        ],
        **popen,
    )


async def stopped(cp, procs: list[subprocess.Popen], lease: str) -> None:
    """The replicas ended (killed if still running), their Lease gone and the
    certificate's Secret as the install makes it."""
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    async with aiohttp.ClientSession() as session:
        await empty_certificate(cp, session)
        await cp.request(session, "DELETE", path_of("Lease", "numaguard", lease))


async def empty_certificate(cp, session) -> None:
    """The certificate Secret as the install makes it: empty, for the next leader."""
    (secret,) = [o for o in rendered("steering") if o["kind"] == "Secret"]
    meta = secret["metadata"]
    await cp.request(session, "DELETE", path_of("Secret", meta["namespace"], meta["name"]))
    await cp.create(session, secret)


async def _closed(reader: asyncio.StreamReader) -> None:
    """Once the server has closed the connection (what it said before, if anything,
    read and dropped; a reset is a close too)."""
    with contextlib.suppress(OSError, ssl.SSLError):
        while await reader.read(1 << 16):
            pass


def _memory_of(pid: int) -> int:
    """A process's resident bytes now."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) << 10
    raise AssertionError(f"no VmRSS for {pid}")


async def test_a_pod_on_the_network_cannot_take_the_webhook_down(tmp_path, control_plane):
    """Seen against a leader: 300 connections each sending all but the last byte of a
    4 MB review took it from 129 to 1,510 MiB; 1,100 idle connections took its 1,024
    descriptors for as long as they stayed, failing every webhook call and scrape and
    writing 718,079 log lines. Now the port holds --web.max-connections, reads a few
    bodies at once, each within the webhook's timeout, and says a failed accept once."""
    cp = control_plane
    account = "numaguard-remediator"
    kubeconfig = cp.kubeconfig(tmp_path / "kubeconfig", cp.tokens[account], account)
    port, metrics = free_port(), free_port()
    log = tmp_path / "remediator.log"

    def descriptors_as_the_pod_had_them() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (1024, 1024))

    with open(log, "wb") as out:
        proc = steering_replica(
            kubeconfig,
            "attacked",
            "attacked",
            port,
            metrics,
            stderr=out,
            preexec_fn=descriptors_as_the_pod_had_them,
        )
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, 4096)), hard))
    insecure = ssl.create_default_context()
    insecure.check_hostname, insecure.verify_mode = False, ssl.CERT_NONE
    review = json.dumps(
        {
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "request": {"uid": "u1", "operation": "CREATE", "object": {"spec": {}}},
        }
    )
    held: list[asyncio.StreamWriter] = []
    try:
        async with aiohttp.ClientSession() as session:

            async def answers() -> bool:
                try:
                    url = f"https://127.0.0.1:{port}/steer/preferred/{DEADLINE}/steer-a"
                    headers = {"Content-Type": "application/json"}
                    async with session.post(url, data=review, headers=headers, ssl=insecure) as r:
                        return (await r.json())["response"]["uid"] == "u1"
                except (aiohttp.ClientError, ValueError, KeyError):
                    return False

            async def scraped() -> bool:
                try:
                    async with session.get(f"http://127.0.0.1:{metrics}/metrics") as r:
                        return r.status == 200
                except aiohttp.ClientError:
                    return False

            await until(answers, "the webhook served", 60)
            before = peak = _memory_of(proc.pid)
            # bodies that never end: all but the last byte of the largest review, on as
            # many connections as it takes to tell a read per connection from a few
            size, crowd = steering.MAX_REVIEW_BYTES - 64, 40
            head = (
                f"POST /steer/preferred/{DEADLINE}/steer-a HTTP/1.1\r\nHost: x\r\n"
                f"Content-Type: application/json\r\nContent-Length: {size}\r\n\r\n"
            ).encode()
            ended = []
            for _ in range(crowd):
                reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=insecure)
                writer.write(head + b" " * (size - 1))
                held.append(writer)
                ended.append(asyncio.create_task(_closed(reader)))
                peak = max(peak, _memory_of(proc.pid))

            async def all_let_go() -> bool:  # each read in turn, or refused (408), and closed
                nonlocal peak
                peak = max(peak, _memory_of(proc.pid))
                return all(t.done() for t in ended)

            await until(all_let_go, "every endless body let go", 60)
            assert await answers() and await scraped()
            # what each connection buffers (TLS and HTTP, under 1 MiB), and the bodies
            # read at once (twice: the bytes grow as they come)
            bound = crowd * (1 << 20) + 2 * steering.REVIEWS_READ_AT_ONCE * size
            grown = peak - before
            assert grown < bound, f"{grown >> 20} MiB more for {crowd} bodies that never end"
            for writer in held:
                writer.close()
            held.clear()
            # idle connections, more than the descriptors the process may open
            for _ in range(1100):
                with contextlib.suppress(OSError):
                    held.append((await asyncio.open_connection("127.0.0.1", port))[1])
            fds = len(os.listdir(f"/proc/{proc.pid}/fd"))
            assert fds < 1024 - 256, f"{fds} descriptors open"
            assert await answers() and await scraped()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    finally:
        for writer in held:
            writer.close()
        await stopped(cp, [proc], "attacked")
    said = log.read_text().count("socket.accept() out of system resource")
    assert said < 10, f"{said} lines for failed accepts"


async def test_the_remediator_s_token_writes_only_its_own_kind_of_webhook(control_plane):
    """With RBAC alone its token could point an entry of its webhook configuration at a
    server of its own and mutate any pod that entry selects, kube-system's included. The
    steering component's policy holds each entry to the remediator's own Service (or a
    loopback URL), pod creations in one namespace outside kube-*, never blocking."""
    cp = control_plane
    token = cp.tokens["numaguard-remediator"]
    path = path_of("MutatingWebhookConfiguration", None, "numaguard-remediator") + "?dryRun=All"
    entry = Steer("Deployment/ml/trainer", {"app": "trainer"}, ("n1",), False, DEADLINE)
    service = {"namespace": "numaguard", "name": "numaguard-remediator-webhook", "port": 443}
    async with aiohttp.ClientSession() as session:
        config = await cp.get(session, "MutatingWebhookConfiguration", None, "numaguard-remediator")

        def written(target: Target, **change) -> dict:
            out = configured(config, target, time.time(), (entry,))
            out["webhooks"][0].update(change)
            return out

        async def put(body: dict) -> tuple[int, str]:
            status, answer = await cp.request(session, "PUT", path, body, token)
            return status, answer.get("message", "")

        ours = Target("numaguard-remediator", "PEM", service=service)
        theirs = Target("numaguard-remediator", "PEM", url="https://attacker.example/")
        refused = {
            "another server": written(theirs),
            "another namespace's Service": written(
                Target("numaguard-remediator", "PEM", service={**service, "namespace": "ml"})
            ),
            "every resource": written(
                ours,
                rules=[
                    {
                        "apiGroups": ["*"],
                        "apiVersions": ["*"],
                        "operations": ["CREATE", "UPDATE"],
                        "resources": ["*"],
                    }
                ],
            ),
            "kube-system": written(
                ours,
                namespaceSelector={"matchLabels": {"kubernetes.io/metadata.name": "kube-system"}},
            ),
            "every namespace": written(ours, namespaceSelector={}),
            "blocking": written(ours, failurePolicy="Fail"),
        }

        async def in_force() -> bool:  # the API server loads a policy within seconds
            return (await put(refused["another server"]))[0] == 403

        await until(in_force, "the steering policy in force", 60)
        for what, body in refused.items():
            status, message = await put(body)
            assert status == 403 and "numaguard's remediator" in message, (what, message)
        for target in (ours, Target("numaguard-remediator", "PEM", url="https://127.0.0.1:8443")):
            status, message = await put(written(target))
            assert status == 200, (target, message)
