"""numaguard in the monitoring stack its users run: the real Prometheus Operator
(tests/operator/go.mod) turns deploy/'s ServiceMonitor and PrometheusRule, applied to the
real control plane as kustomize renders them, into the configuration a real Prometheus 3
then runs with, unchanged. Prometheus finds the exporters as it would in a cluster:
Kubernetes service discovery, through the EndpointSlices the real endpointslice
controller keeps for the exporter Service, whose pods are the simulated nodes' exporter
DaemonSet (each a real exporter process)."""

from __future__ import annotations

import contextlib
from pathlib import Path

import aiohttp
import pytest

from numaguard.remediator.controller import Controller
from numaguard.remediator.core.policy import Policy
from numaguard.remediator.core.queries import Windows
from numaguard.remediator.kube import Kube, api_client
from numaguard.remediator.signals import Prometheus
from numaguard.simulator.cluster.simulated import SimulatedCluster
from numaguard.simulator.fakes import presets
from numaguard.simulator.parts.controlplane import ControlPlane, path_of, rendered
from numaguard.simulator.parts.operator import PrometheusOperator, prometheus_resource
from numaguard.simulator.parts.processes import free_port, until
from numaguard.simulator.parts.prometheus import PrometheusServer, built_prometheus3
from tests.helpers.operator import JOB, MONITORING, WINDOW, quick

pytestmark = [pytest.mark.prometheus, pytest.mark.cluster]

NODE = "gpu-node-3"


class Stack:
    """The operator, deploy/'s monitoring objects, a simulated node running the exporter
    DaemonSet, and Prometheus running what the operator generated."""

    async def start(self, cp: ControlPlane, directory: Path) -> Stack:
        self.cp, self.directory = cp, directory
        self.exit = contextlib.AsyncExitStack()
        self.session = await self.exit.enter_async_context(aiohttp.ClientSession())
        self.operator = PrometheusOperator(cp, directory)
        self.operator.start()
        self.exit.callback(self.operator.stop)
        if await cp.get(self.session, "Namespace", None, MONITORING) is None:
            namespace = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": MONITORING}}
            await cp.create(self.session, namespace)
        monitoring = ("Service", "ServiceMonitor", "PrometheusRule")
        self.objects = quick([o for o in rendered() if o["kind"] in monitoring])
        token = directory / "prometheus.token"
        token.write_text(cp.admin_token)
        version = built_prometheus3().name.removeprefix("prometheus-")
        self.objects.append(prometheus_resource(cp, MONITORING, "k8s", token, version))
        for obj in self.objects:
            await cp.create(self.session, obj)
        self.exit.push_async_callback(self._delete_objects)

        self.sim = SimulatedCluster(str(directory / "cluster"), cp)
        host, nvml = presets.gpu_node()
        self.sim.add_node(NODE, host, nvml, "single-numa-node")
        self.sim.demand["trainer-remote"] = 0.8
        await self.sim.start()
        self.exit.push_async_callback(self.sim.stop)
        account = "numaguard-exporter"
        kubeconfig = cp.kubeconfig(directory / "exporter.kubeconfig", cp.tokens[account], account)
        account = "numaguard-remediator"
        self.remediator_kubeconfig = cp.kubeconfig(
            directory / "remediator.kubeconfig", cp.tokens[account], account
        )
        self.exporters = await self.sim.run_exporter_daemonset(
            self.exit, kubeconfig, "--interval", "1"
        )
        config = await self.operator.generated(self.session, MONITORING, "k8s", self._complete)
        self.prom = await self.exit.enter_async_context(
            PrometheusServer([], free_port(), version="3", config_file=str(config))
        )
        return self

    @staticmethod
    def _complete(config: dict) -> bool:
        jobs = {job["job_name"] for job in config.get("scrape_configs", [])}
        return JOB in jobs and bool(config.get("rule_files"))

    async def _delete_objects(self) -> None:
        for obj in self.objects:
            meta = obj["metadata"]
            await self.cp.request(
                self.session, "DELETE", path_of(obj["kind"], meta["namespace"], meta["name"])
            )

    async def stop(self) -> None:
        await self.exit.aclose()


@pytest.fixture
async def stack(tmp_path, control_plane):
    s = await Stack().start(control_plane, tmp_path)
    yield s
    await s.stop()


async def workloads_named(prom: PrometheusServer) -> list[dict]:
    """The verdict that trainer-remote's GPU hangs off the far socket, named as the
    exporter names it: the workload's own namespace, pod and uid, its node."""
    query = (
        'numaguard_pod_cross_numa{job="numaguard", reason="device_remote", '
        f'namespace="ml", pod="trainer-remote", node="{NODE}"}} == 1'
    )
    return await prom.wait_for(query)


async def test_the_operator_s_configuration_keeps_the_workloads_names(stack):
    prom = stack.prom
    (url,) = stack.exporters.values()
    # the target is the exporter pod's address and port, as its EndpointSlice lists it
    (up,) = await prom.wait_for('up{job="numaguard"} == 1')
    assert up["metric"] == {
        "__name__": "up",
        "job": "numaguard",
        "instance": url.removeprefix("http://"),
        "node": NODE,
    }
    (verdict,) = await workloads_named(prom)
    assert "container" not in verdict["metric"]  # a pod's verdict, not the exporter's container
    # nothing pushed aside, nothing of the exporter's pod on series about something else
    every = await prom.query('{job="numaguard"}')
    assert not [s["metric"] for s in every if any(k.startswith("exported_") for k in s["metric"])]
    for family in (
        "numaguard_build_info",
        "numaguard_gpu_info",
        "numaguard_numa_node_memory_total_bytes",
    ):
        named = [s["metric"] for s in every if s["metric"]["__name__"] == family]
        assert named, family
        assert not [m for m in named if {"namespace", "pod", "container"} & m.keys()], family

    # the PrometheusRule's rules are loaded, every one, and its alert fires with the
    # workload's names
    (shipped,) = [o for o in rendered() if o["kind"] == "PrometheusRule"]
    async with stack.session.get(f"{prom.url}/api/v1/rules") as r:
        groups = (await r.json())["data"]["groups"]
    loaded = sorted(rule["name"] for g in groups for rule in g["rules"])
    kept = [
        rule.get("record") or rule["alert"]
        for g in shipped["spec"]["groups"]
        for rule in g["rules"]
    ]
    assert loaded == sorted(kept)
    firing = 'ALERTS{alertname="NumaguardPodCrossNUMA", alertstate="firing"}'
    alerts = await prom.wait_for(firing)
    assert {(a["metric"]["namespace"], a["metric"]["pod"]) for a in alerts} == {
        ("ml", "trainer-remote")
    }

    # and the remediator (dry run, as its ServiceAccount) finds that pod and no other
    client = await api_client(stack.remediator_kubeconfig)
    try:
        prometheus = Prometheus(prom.url, stack.session, windows=Windows(WINDOW, WINDOW))
        policy = Policy(dry_run=True, min_pod_age_seconds=0, stale_after_seconds=10)
        controller = Controller(prometheus, Kube(client), policy)

        async def evicts():
            report = await controller.cycle()
            return [
                (a.pod.namespace, a.pod.name, r) for a, r in report.results if a.kind == "evict"
            ]

        assert await until(evicts, "an eviction planned", timeout=60, every=1) == [
            ("ml", "trainer-remote", "dry_run")
        ]
    finally:
        await client.close()


async def test_without_honor_labels_the_workloads_names_are_lost(stack):
    """The same stack, the ServiceMonitor's honorLabels taken out: the operator's
    configuration files the series' own node label under exported_node, which the
    test above refuses."""
    await workloads_named(stack.prom)
    monitor = await stack.cp.get(stack.session, "ServiceMonitor", "numaguard", "numaguard")
    for endpoint in monitor["spec"]["endpoints"]:
        del endpoint["honorLabels"]
    path = path_of("ServiceMonitor", "numaguard", "numaguard")
    await stack.cp.call(stack.session, "PUT", path, monitor)

    def dishonoured(config: dict) -> bool:
        (job,) = [j for j in config["scrape_configs"] if j["job_name"] == JOB]
        return not job.get("honor_labels")

    await stack.operator.generated(stack.session, MONITORING, "k8s", dishonoured)
    await stack.prom.reload()
    # the exporter's node label pushed aside by the target's: what the test above forbids
    query = f'numaguard_pod_cross_numa{{exported_node="{NODE}", pod="trainer-remote"}}'
    pushed = await stack.prom.wait_for(query)
    assert {s["metric"]["reason"] for s in pushed} == {"cpu_span", "memory_remote", "device_remote"}
