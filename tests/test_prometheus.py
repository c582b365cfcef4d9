"""A real Prometheus scrapes the real exporter (with names from the fake API server):
the target is up, a pod's remote memory ratio comes back through PromQL, and promtool
finds nothing to say about the exposition."""

from __future__ import annotations

import subprocess

import pytest

from simulator import presets
from simulator.kubeapi import FakeApiServer, pod_objects
from simulator.processes import exporter_process, free_port, get
from simulator.prometheus import PrometheusServer, binary


@pytest.fixture
async def exporter(fake_root, tmp_path):
    root = fake_root(presets.far_memory())
    api = FakeApiServer()
    await api.start()
    for obj in pod_objects(root.host, "gpu-node-7"):
        api.put("pods", obj)
    args = (
        "--host-root",
        str(root.root),
        "--node-name",
        "gpu-node-7",
        "--interval",
        "1",
        "--kubeconfig",
        api.kubeconfig(tmp_path / "kubeconfig"),
    )
    try:
        async with exporter_process(*args) as (url, _):
            yield url.removeprefix("http://"), root
    finally:
        await api.stop()


async def test_prometheus_scrapes_and_answers_promql(exporter):
    target, root = exporter
    async with PrometheusServer([target], free_port()) as prom:
        up = await prom.wait_for('up{job="numaguard"} == 1')
        assert up[0]["metric"]["instance"] == target
        result = await prom.wait_for(
            'numaguard_pod_memory_remote_ratio{namespace="cache", pod="cache"}'
        )
        assert len(result) == 1
        assert result[0]["metric"]["node"] == "gpu-node-7"
        assert result[0]["metric"]["pod_uid"] == root.host.pod("cache").uid
        assert float(result[0]["value"][1]) == pytest.approx(0.8, abs=1e-9)
        flagged = await prom.query("numaguard_pod_cross_numa == 1")
        assert {(r["metric"]["pod"], r["metric"]["reason"]) for r in flagged} == {
            ("cache", "memory_remote")
        }


async def test_promtool_check_metrics_is_silent(exporter):
    target, _ = exporter
    body = await get(f"http://{target}/metrics")
    check = subprocess.run(
        [binary("promtool"), "check", "metrics"], input=body, capture_output=True
    )
    assert check.returncode == 0, check.stderr.decode()
    assert check.stdout.decode() == "" and check.stderr.decode() == ""
