"""The MIG manager mode end to end: the remediator re-lays out a node's MIG slices
through the GPU Operator's MIG manager (simulated as nvidia-mig-manager follows its
label) when a resize finds no free slice of its profile, on the real control plane,
with deploy/'s RBAC and the node-writes admission policy, a real Prometheus scraping
both nodes' exporters. gpu-node-3 (presets.gpu_node): infer-d uses 12 GiB of its
3g.40gb slice, which a 1g.20gb holds, and no GPU has one; gpu-spare, the MIG manager's,
has one H100 in two 3g.40gb slices and no pod."""

from __future__ import annotations

import contextlib
from dataclasses import replace

import aiohttp
import pytest

from numaguard.remediator.controller import Controller
from numaguard.remediator.core.policy import Policy
from numaguard.remediator.core.queries import Windows, expressions
from numaguard.remediator.core.relayout import MigLayout
from numaguard.remediator.kube import Kube, api_client
from numaguard.remediator.signals import Prometheus
from numaguard.simulator.cluster.mig_manager import PAUSED
from numaguard.simulator.cluster.simulated import SimulatedCluster
from numaguard.simulator.fakes import presets
from numaguard.simulator.fakes.host import FakeHost, FakeNumaNode
from numaguard.simulator.fakes.nvml import FakeNvml, Process
from numaguard.simulator.parts.controlplane import path_of
from numaguard.simulator.parts.processes import free_port
from numaguard.simulator.parts.prometheus import PrometheusServer
from tests.helpers.remediation import component_kubeconfigs, cycles_until, forget_leases

pytestmark = [pytest.mark.prometheus, pytest.mark.cluster]

GIB = 1 << 30
NODE, SPARE = "gpu-node-3", "gpu-spare"
CONFIGS = """version: v1
mig-configs:
  all-3g.40gb:
    - {devices: all, mig-enabled: true, mig-devices: {"3g.40gb": 2}}
  all-1g.20gb:
    - {devices: all, mig-enabled: true, mig-devices: {"1g.20gb": 4}}
"""


@contextlib.asynccontextmanager
async def mig_cluster(cp, tmp_path, busy: bool = False, wedged: bool = False, dry_run=False):
    """The two nodes, their exporters, Prometheus, and a controller acting with the MIG
    manager mode's relabel on the MIG manager's nodes. ``busy``: a process outside any
    pod runs on a slice of gpu-spare; ``wedged``: its MIG manager stops at pending."""
    async with contextlib.AsyncExitStack() as stack:
        sim = SimulatedCluster(str(tmp_path / "cluster"), cp)
        host, nvml = presets.gpu_node()
        nvml.gpus[5].mig[1].memory_used_bytes = 12 * GIB  # infer-d's 3g.40gb
        node = sim.add_node(NODE, host, nvml, "single-numa-node")
        spare_host = FakeHost(
            nodes=[
                FakeNumaNode("0-7", socket=0, memory_total_bytes=64 * GIB),
                FakeNumaNode("8-15", socket=1, memory_total_bytes=64 * GIB),
            ]
        )
        spare_nvml = FakeNvml(node_id=1)
        spare_nvml.add_gpu("H100-80GB", 0, ["3g.40gb", "3g.40gb"])
        if busy:  # a client on the host: NVML refuses to destroy the slice
            spare_nvml.gpus[0].mig[0].processes.append(Process(4242, GIB))
        spare = sim.add_node(SPARE, spare_host, spare_nvml, "single-numa-node")
        spare.mig_config, spare.mig_wedged = "all-3g.40gb", wedged
        sim.demand["trainer-remote"] = 0.8
        await sim.start()
        stack.push_async_callback(sim.stop)
        stack.push_async_callback(forget_leases, cp, sim.session)
        await sim.ensure_namespace("gpu-operator")
        config_map = {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": "default-mig-parted-config", "namespace": "gpu-operator"},
            "data": {"config.yaml": CONFIGS},
        }
        await cp.create(sim.session, config_map)
        stack.push_async_callback(
            cp.request,
            sim.session,
            "DELETE",
            path_of("ConfigMap", "gpu-operator", "default-mig-parted-config"),
        )
        exporter_kubeconfig, kubeconfig, proxy = await component_kubeconfigs(cp, stack, tmp_path)
        urls = []
        for n in (node, spare):
            url, _ = await stack.enter_async_context(
                sim.exporter(n, exporter_kubeconfig, "--interval", "1")
            )
            urls.append(url.removeprefix("http://"))
        prom = await stack.enter_async_context(PrometheusServer(urls, free_port()))
        session = await stack.enter_async_context(aiohttp.ClientSession())
        client = await api_client(kubeconfig)
        stack.push_async_callback(client.close)
        annotations = {"numaguard.io/auto-resize": "true"}
        await cp.patch(
            sim.session, "Deployment", "ml", "infer-d", {"metadata": {"annotations": annotations}}
        )
        await prom.wait_for(expressions(Windows("4s", "4s"))["slice_sm"])
        policy = Policy(
            dry_run=dry_run,
            min_pod_age_seconds=0,
            stale_after_seconds=10,
            verify_after_seconds=8,
            max_per_node=3,
            mig_layout=MigLayout(
                mode="relabel", node_selector="nvidia.com/mig.config", pending_timeout_seconds=6
            ),
        )
        prometheus = Prometheus(prom.url, session, windows=Windows("4s", "4s"))
        controller = Controller(prometheus, Kube(client), policy)
        yield sim, controller, proxy, client


async def spare_node(sim) -> dict:
    return await sim.cp.get(sim.session, "Node", None, SPARE)


def node_writes(proxy) -> list:
    return [
        e for e in proxy.log if e.path.startswith(f"/api/v1/nodes/{SPARE}") and e.method != "GET"
    ]


def phases(reports) -> list[tuple[str, str]]:
    return [(step.phase, result) for r in reports for step, result in r.relayouts]


async def test_a_node_is_re_laid_out_for_a_resize_that_had_no_slice(tmp_path, control_plane):
    async with mig_cluster(control_plane, tmp_path) as (sim, controller, proxy, client):
        reports = await cycles_until(controller, lambda rs: ("done", "done") in phases(rs))
        # the resize had no free 1g.20gb: the config that has them is recommended
        first = next(r for r in reports if r.layouts)
        assert [(r.label, r.want) for r in first.layouts] == [
            ("numaguard-1x1g.20gb-6x1g.10gb", {"1g.20gb": 1})
        ]
        assert phases(reports) == [
            ("cordoned", "done"),
            ("relabelled", "done"),
            ("done", "done"),
        ]
        # the MIG manager applied it: four 1g.20gb slices; the node is back, its
        # operands restored, numaguard's annotation gone
        spare = sim.nodes[SPARE]
        assert [s.profile.name for s in spare.nvml.gpus[0].mig] == ["1g.20gb"] * 4
        obj = await spare_node(sim)
        labels = obj["metadata"]["labels"]
        assert labels["nvidia.com/mig.config"] == "all-1g.20gb"
        assert labels["nvidia.com/mig.config.state"] == "success"
        assert labels["nvidia.com/gpu.deploy.device-plugin"] == "true"
        assert not obj["spec"].get("unschedulable")
        assert "numaguard.io/mig-relayout" not in (obj["metadata"].get("annotations") or {})
        assert len(node_writes(proxy)) == 3  # cordon, relabel, uncordon: one patch each
        # and the resize goes ahead onto the new slices (in the cycle that uncordons the
        # node, planned before it, or a later one)

        def resized(rs):
            return [
                a for r in rs for a, res in r.results if a.kind == "resize" and res == "resized"
            ]

        if not resized(reports):
            reports += await cycles_until(controller, resized)
        (action,) = resized(reports)
        assert action.detail == "resize 3g.40gb -> 1g.20gb (Deployment/ml/infer-d)"
        await sim.wait_until(
            lambda: [
                p
                for p in sim.nodes[SPARE].host.pods
                if p.name.startswith("infer-d-")
                and "nvidia.com/mig-1g.20gb" in p.containers[0].devices
            ],
            "infer-d rolled out onto gpu-spare's 1g.20gb",
        )
        events = await sim.cp.items(sim.session, "Event", "default")
        said = [e["message"] for e in events if e["reason"] == "MigRelayout"]
        assert any(m.startswith("MIG re-layout: cordoned: all-1g.20gb holds 1") for m in said)
        # the admission policy holds the remediator's token to those fields
        for labels, said in (
            ({"team": "mine"}, "nvidia.com/mig.config"),
            ({"nvidia.com/mig.config.state": "failed"}, "only to pending"),
        ):
            denied = await Kube(client).call(
                "PATCH",
                f"/api/v1/nodes/{SPARE}",
                body={"metadata": {"labels": labels}},
                content_type="application/merge-patch+json",
            )
            assert denied.status in (403, 422) and said in denied.body["message"], labels


@pytest.mark.parametrize("how", ["failed", "wedged"])
async def test_a_re_layout_that_fails_or_wedges_is_left_cordoned(tmp_path, control_plane, how):
    """failed: a process on a slice (NVML_ERROR_IN_USE); wedged: pending for good
    (gpu-operator#2833). Either way the node stays cordoned for a person, the metric
    says so, and nothing else is re-laid out."""
    busy, wedged = how == "failed", how == "wedged"
    async with mig_cluster(control_plane, tmp_path, busy, wedged) as (sim, controller, proxy, _):
        reports = await cycles_until(controller, lambda rs: (how, "done") in phases(rs))
        assert phases(reports) == [("cordoned", "done"), ("relabelled", "done"), (how, "done")]
        obj = await spare_node(sim)
        assert obj["spec"]["unschedulable"] is True
        labels = obj["metadata"]["labels"]
        assert labels["nvidia.com/mig.config"] == "all-1g.20gb"
        assert labels["nvidia.com/mig.config.state"] == ("failed" if busy else "pending")
        if wedged:  # its operands stay paused, as the real one's did
            assert labels["nvidia.com/gpu.deploy.device-plugin"] == PAUSED
        # the slices as they were: NVML refused, or nothing was tried
        assert [s.profile.name for s in sim.nodes[SPARE].nvml.gpus[0].mig] == ["3g.40gb"] * 2
        samples = controller.metrics.registry.get_sample_value
        # counted from the nodes as the cycle read them, before its step
        assert samples("numaguard_remediator_mig_relayout_nodes", {"phase": how}) == 0
        for _ in range(2):
            report = await controller.cycle()
            assert report.relayouts == []  # nothing more, on it or any other node
        assert samples("numaguard_remediator_mig_relayout_nodes", {"phase": how}) == 1
        events = await sim.cp.items(sim.session, "Event", "default")
        # (Events in default outlive each cluster: this one's by its phase)
        (warning,) = [
            e
            for e in events
            if e["reason"] == "MigRelayout" and e["message"].startswith(f"MIG re-layout: {how}:")
        ]
        assert warning["type"] == "Warning"
        assert "left cordoned for a person" in warning["message"]
        assert len(node_writes(proxy)) == 3  # cordon, relabel, its phase: never uncordoned


async def test_a_dry_run_says_once_which_node_it_would_re_lay_out(tmp_path, control_plane):
    async with mig_cluster(control_plane, tmp_path, dry_run=True) as (sim, controller, proxy, _):
        reports = await cycles_until(controller, phases)
        assert phases(reports) == [("cordoned", "dry_run")]
        for _ in range(3):  # the same step each cycle: said once
            assert (await controller.cycle()).relayouts == []
        obj = await spare_node(sim)
        assert not obj["spec"].get("unschedulable")
        assert obj["metadata"]["labels"]["nvidia.com/mig.config"] == "all-3g.40gb"
        assert node_writes(proxy) == []
        events = await sim.cp.items(sim.session, "Event", "default")
        said = [e["message"] for e in events if e["message"].startswith("MIG re-layout: would")]
        assert said == [
            "MIG re-layout: would cordon: all-1g.20gb holds 1 of the wanted slices "
            "(1 1g.20gb); no GPU pod on it"
        ]
        # the default mode: the layout recommended, from the nodes' metadata alone
        controller.policy = replace(controller.policy, mig_layout=MigLayout())
        report = await controller.cycle()
        assert [(r.family, r.label, r.layout) for r in report.layouts] == [
            ("A100/H100-80GB", "numaguard-1x1g.20gb-6x1g.10gb", {"1g.20gb": 1, "1g.10gb": 6})
        ]
        assert report.relayouts == [] and report.error == ""
        listed = [e for e in proxy.log if e.method == "GET" and e.path.startswith("/api/v1/nodes?")]
        assert listed and all(e.status == 200 for e in listed)
