"""Pod names from the API server: the exporter's watch (over plain aiohttp, as
the exporter's ServiceAccount) against the real API server, through list, watch, dropped
watches, 410 Gone and server errors from the fault proxy."""

from __future__ import annotations

import asyncio
import contextlib
import json
import subprocess
import sys

import aiohttp
import pytest

from numaguard.common.apiserver import KubeconfigError, connect
from numaguard.exporter.sources.kube import PodMetadataWatch
from numaguard.simulator.cluster.simulated import SimulatedCluster
from numaguard.simulator.fakes import presets
from numaguard.simulator.fakes.nvml import FakeNvml

pytestmark = pytest.mark.cluster

NODE = "gpu-node-1"


async def eventually(check, timeout=30.0):
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        try:
            result = check()
            if result:
                return result
        except (KeyError, TypeError):
            pass
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError("condition not met in time")
        await asyncio.sleep(0.05)


def lists(proxy) -> list[str]:
    return [
        e.path for e in proxy.log if "watch=" not in e.path and e.path.startswith("/api/v1/pods")
    ]


@pytest.fixture
async def cluster(tmp_path, control_plane):
    """Node gpu-node-1 with two_socket's pods, another node with one pod, and the
    exporter's watch of gpu-node-1 through a fault proxy. Yields (cluster, proxy, watch,
    start): ``start()`` starts the watch."""
    cp = control_plane
    sim = SimulatedCluster(str(tmp_path / "cluster"), cp)
    node = sim.add_node(NODE, presets.two_socket(), FakeNvml(), "none")
    other = presets.far_memory()
    other.pods = [other.pod("cache")]
    sim.add_node("other-node", other, FakeNvml(), "none")
    tasks = []
    async with contextlib.AsyncExitStack() as stack:
        await sim.start()
        stack.push_async_callback(sim.stop)
        proxy = await stack.enter_async_context(cp.fault_proxy())
        account = "numaguard-exporter"
        kubeconfig = cp.kubeconfig(
            tmp_path / "kubeconfig", cp.tokens[account], account, server=proxy.url
        )
        api = connect(kubeconfig)
        stack.push_async_callback(api.close)
        watch = PodMetadataWatch(api, NODE)

        def start():
            tasks.append(asyncio.create_task(watch.run()))

        try:
            yield sim, node, proxy, watch, start
        finally:
            for task in tasks:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task


def newcomer(node):
    """One more pod for the node, created through the API server."""
    pod = presets.far_memory().pod("cache")
    pod.name, pod.namespace = "newcomer", "ml"
    return [(node, pod)]


async def test_names_come_from_a_node_scoped_list_and_watch(cluster):
    sim, node, proxy, watch, start = cluster
    start()
    pods = await eventually(watch.current)
    aligned = node.host.pod("trainer-aligned")
    meta = pods[aligned.uid]
    assert (meta.namespace, meta.name) == ("ml", "trainer-aligned")
    assert meta.containers == {node.host.container_id(aligned, aligned.containers[0]): "main"}
    assert set(pods) == {p.uid for p in node.host.pods}  # the other node's pod is not ours
    assert all("fieldSelector=spec.nodeName%3Dgpu-node-1" in path for path in lists(proxy))

    await sim.add_pods(newcomer(node))
    new = node.host.pod("newcomer")
    await eventually(lambda: new.uid in watch.current())
    await sim.cp.request(sim.session, "DELETE", f"/api/v1/namespaces/ml/pods/{aligned.name}")
    await eventually(lambda: aligned.uid not in watch.current())
    # changes came through the watch: one listing, no relist
    assert len(lists(proxy)) == 1, proxy.log


async def test_dropped_watch_resumes_and_410_relists(cluster):
    sim, node, proxy, watch, start = cluster
    start()
    await eventually(watch.current)
    await proxy.drop_watches()
    await sim.add_pods(newcomer(node))
    await eventually(lambda: node.host.pod("newcomer").uid in watch.current())
    assert len(lists(proxy)) == 1  # resumed from its version

    # the version it resumes from is compacted away: 410, and it lists again
    proxy.expire_watches = 1
    await proxy.drop_watches()
    web = node.host.pod("web")
    await sim.cp.request(sim.session, "DELETE", "/api/v1/namespaces/default/pods/web")
    await eventually(lambda: web.uid not in watch.current())
    assert len(lists(proxy)) == 2


async def test_server_errors_are_retried(cluster):
    _, node, proxy, watch, start = cluster
    proxy.fail_next(500, times=2)
    start()
    assert watch.current() is None
    pods = await eventually(watch.current)
    assert set(pods) == {p.uid for p in node.host.pods} and len(pods) == 3
    assert [e.status for e in proxy.log[:3]] == [500, 500, 200]


def test_the_exporter_never_loads_the_kubernetes_package_nor_grpcio():
    """Its three kinds of API call go over aiohttp: the kubernetes package (~23 MiB of
    RSS to import) is the remediator's alone; pydantic (~9 MiB with its kin) is loaded
    only to check a --web.config.file; the kubelet is asked through grpclib, not grpcio
    (~10 MiB more, and threads of its own)."""
    probe = (
        "import sys\n"
        "import numaguard.exporter.cli, numaguard.exporter.server, numaguard.common.webconfig\n"
        "import numaguard.exporter.sources.kubelet\n"
        "loaded = {m.split('.')[0] for m in sys.modules}\n"
        "print(sorted(loaded & {'kubernetes', 'pydantic', 'grpc'}))\n"
    )
    run = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "[]"


def write_kubeconfig(path, cp, user: dict, **cluster) -> str:
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": "c",
                "cluster": {"server": cp.url, "certificate-authority": "ca.crt", **cluster},
            }
        ],
        "users": [{"name": "u", "user": user}],
        "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
        "current-context": "x",
    }
    (path / "ca.crt").write_bytes(cp.ca_file.read_bytes())
    (path / "kubeconfig").write_text(json.dumps(config))
    return str(path / "kubeconfig")


async def test_a_token_file_beside_the_kubeconfig_is_read_and_reread(tmp_path, control_plane):
    """Paths relative to the kubeconfig, as kubectl takes them; the token file is read
    again once a minute has passed (bound ServiceAccount tokens rotate)."""
    cp = control_plane
    (tmp_path / "token").write_text("not-yet-a-token\n")
    api = connect(write_kubeconfig(tmp_path, cp, {"tokenFile": "token"}))
    try:
        path = "/api/v1/pods?fieldSelector=spec.nodeName%3Dnone&limit=1"
        async with api.request("GET", path, 10) as r:
            assert r.status == 401
        (tmp_path / "token").write_text(cp.tokens["numaguard-exporter"] + "\n")
        async with api.request("GET", path, 10) as r:
            assert r.status == 401  # read less than a minute ago: not yet again
        api._token_read -= 61
        async with api.request("GET", path, 10) as r:
            assert r.status == 200
    finally:
        await api.close()


async def test_tls_server_name_is_the_name_the_certificate_is_checked_for(tmp_path, control_plane):
    """The API server at an address its certificate does not name (the node VM reaches
    it through a forwarded port): refused, unless the kubeconfig's tls-server-name names
    what the certificate does."""
    cp = control_plane
    user = {"token": cp.tokens["numaguard-exporter"]}
    path = "/api/v1/pods?fieldSelector=spec.nodeName%3Dnone&limit=1"
    at_ip = cp.url.replace("127.0.0.1", "localhost")  # a name its certificate lacks
    for name, answers in (("", None), ("kubernetes", 200)):
        extra = {"tls-server-name": name} if name else {}
        api = connect(write_kubeconfig(tmp_path, cp, user, server=at_ip, **extra))
        try:
            if answers is None:
                with pytest.raises(aiohttp.ClientConnectorCertificateError):
                    async with api.request("GET", path, 10):
                        pass
            else:
                async with api.request("GET", path, 10) as r:
                    assert r.status == answers
        finally:
            await api.close()


@pytest.mark.parametrize(
    ("user", "says"),
    [
        ({"exec": {"command": "aws"}}, "uses exec, which the exporter does not run"),
        ({"auth-provider": {"name": "gcp"}}, "uses auth-provider"),
        ({"client-certificate": "missing.crt", "client-key": "missing.key"}, "No such file"),
    ],
)
def test_a_kubeconfig_it_cannot_use_is_a_clear_error(tmp_path, control_plane, user, says):
    with pytest.raises(KubeconfigError, match=says):
        connect(write_kubeconfig(tmp_path, control_plane, user))
