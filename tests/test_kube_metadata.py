"""Pod names from the API server: the real kubernetes.aio client against the fake API
server, through list, watch, dropped watches, 410 Gone and server errors."""

from __future__ import annotations

import asyncio
import contextlib

import pytest

from exporter.sources.kube import PodMetadataWatch, api_client
from simulator import presets
from simulator.kubeapi import FakeApiServer, pod_objects

NODE = "gpu-node-1"


async def eventually(check, timeout=10.0):
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


@pytest.fixture
async def cluster(tmp_path):
    server = FakeApiServer()
    await server.start()
    host = presets.two_socket()
    for obj in pod_objects(host, NODE):
        server.put("pods", obj)
    other = pod_objects(presets.far_memory(), "other-node")[0]
    other["metadata"]["uid"] = "0000-other"
    server.put("pods", other)
    api = await api_client(server.kubeconfig(tmp_path / "kubeconfig"))
    watch = PodMetadataWatch(api, NODE)
    task = asyncio.create_task(watch.run())
    yield server, host, watch
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    await api.close()
    await server.stop()


async def test_names_come_from_a_node_scoped_list_and_watch(cluster):
    server, host, watch = cluster
    pods = await eventually(watch.current)
    aligned = host.pod("trainer-aligned")
    meta = pods[aligned.uid]
    assert (meta.namespace, meta.name) == ("ml", "trainer-aligned")
    assert meta.containers == {host.container_id(aligned, aligned.containers[0]): "main"}
    assert set(pods) == {p.uid for p in host.pods}  # the other node's pod is not ours
    assert any("fieldSelector=spec.nodeName%3Dgpu-node-1" in r for r in server.requests)

    new = pod_objects(presets.far_memory(), NODE)[0]
    server.put("pods", new)
    await eventually(lambda: new["metadata"]["uid"] in watch.current())
    server.delete("pods", "ml", "trainer-aligned")
    await eventually(lambda: aligned.uid not in watch.current())
    # changes came through the watch: one listing, no relist
    lists = [
        r for r in server.requests if r.startswith("GET /api/v1/pods") and "watch=true" not in r
    ]
    assert len(lists) == 1, server.requests


async def test_dropped_watch_resumes_and_410_relists(cluster):
    server, host, watch = cluster
    await eventually(watch.current)
    await server.drop_watches()
    new = pod_objects(presets.far_memory(), NODE)[0]
    server.put("pods", new)
    await eventually(lambda: new["metadata"]["uid"] in watch.current())

    # history compacted while the watch is down: the client gets 410 and lists again
    server.compact()
    await server.drop_watches()
    server.delete("pods", "default", "web")
    server.compact()
    await eventually(lambda: host.pod("web").uid not in watch.current())


async def test_server_errors_are_retried(tmp_path):
    server = FakeApiServer()
    await server.start()
    for obj in pod_objects(presets.two_socket(), NODE):
        server.put("pods", obj)
    server.fail_next(500, times=2)
    api = await api_client(server.kubeconfig(tmp_path / "kubeconfig"))
    watch = PodMetadataWatch(api, NODE)
    task = asyncio.create_task(watch.run())
    try:
        assert watch.current() is None
        pods = await eventually(watch.current, timeout=15)
        assert len(pods) == 3
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await api.close()
        await server.stop()
