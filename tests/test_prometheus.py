"""A real Prometheus scrapes the real exporter (pod names from its watch of the real API
server): the target is up, a pod's remote memory ratio comes back through PromQL, and
promtool finds nothing to say about the exposition."""

from __future__ import annotations

import subprocess

import pytest

from numaguard.simulator.cluster.simulated import one_node
from numaguard.simulator.fakes import presets
from numaguard.simulator.fakes.nvml import FakeNvml
from numaguard.simulator.parts.processes import free_port, get
from numaguard.simulator.parts.prometheus import PrometheusServer, binary

pytestmark = [pytest.mark.prometheus, pytest.mark.cluster]


@pytest.fixture
async def exporter(control_plane):
    host = presets.far_memory()
    async with one_node(control_plane, host, FakeNvml(), "gpu-node-7") as (sim, url):
        yield url.removeprefix("http://"), sim.nodes["gpu-node-7"].root


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


async def test_prometheus_on_a_simulated_8_gpu_mig_node(control_plane):
    """The exporter process with the fake NVML node and the fake kubelet; PromQL finds
    per-slice utilization and the starved verdict."""
    host, nvml = presets.gpu_node()
    async with one_node(control_plane, host, nvml) as (_, url):
        target = url.removeprefix("http://")
        async with PrometheusServer([target], free_port()) as prom:
            sm = await prom.wait_for(
                'numaguard_mig_utilization_ratio{kind="sm", mig_profile="3g.40gb", gpu="1"}'
            )
            assert len(sm) == 1
            assert sm[0]["metric"]["mig_uuid"] == nvml.gpus[1].mig[0].uuid
            assert float(sm[0]["value"][1]) == pytest.approx(0.6, abs=1e-6)
            slices = await prom.query("count(numaguard_mig_info)")
            assert float(slices[0]["value"][1]) == 13
            # which pod holds the busiest slice, through a join on the holder series (once
            # the exporter's pod watch has named the holders)
            await prom.wait_for('numaguard_gpu_holder_info{pod="infer-c"}')
            busiest = await prom.query(
                "topk(1, numaguard_mig_utilization_ratio{kind='sm'}) "
                "* on (mig_uuid) group_left(pod) numaguard_gpu_holder_info{mig_uuid!=''}"
            )
            assert busiest[0]["metric"]["pod"] == "infer-c"
            starved = await prom.wait_for("numaguard_gpu_starved == 1")
            assert {(r["metric"]["pod"], r["metric"]["reason"]) for r in starved} == {
                ("trainer-remote", "device_remote")
            }
