"""Remediation scenarios end to end: the exporter on the simulated GPU node (fake NVML,
fake kubelet over gRPC), a real Prometheus scraping it, the real control plane (API
server, Deployment/ReplicaSet/disruption controllers, scheduler) with the simulator as
the node's kubelet, and the remediator's controller. The exporter and the remediator
run as their ServiceAccounts with deploy/'s RBAC, each through a fault proxy."""

from __future__ import annotations

import asyncio
import calendar
import contextlib
import json
import logging
import re
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from numaguard.exporter.readers.nvml import sysfs_pci_address
from numaguard.remediator.controller import Controller
from numaguard.remediator.core.claims import template_name, with_profile
from numaguard.remediator.core.mig import geometry
from numaguard.remediator.core.policy import Enforcement, Policy
from numaguard.remediator.core.queries import Windows, expressions
from numaguard.remediator.kube import Kube, api_client
from numaguard.remediator.signals import Prometheus
from numaguard.simulator.cluster.simulated import SimulatedCluster
from numaguard.simulator.fakes import dra, presets
from numaguard.simulator.fakes.host import FakeContainer, FakeHost, FakeNumaNode, FakePod
from numaguard.simulator.fakes.nvml import FakeNvml, Process
from numaguard.simulator.parts.controlplane import ControlPlane
from numaguard.simulator.parts.processes import free_port, get, until
from numaguard.simulator.parts.prometheus import PrometheusServer
from tests.helpers.control_plane import allowed
from tests.helpers.remediation import component_kubeconfigs, cycles_until, forget_leases

pytestmark = [pytest.mark.prometheus, pytest.mark.cluster]

NODE = "gpu-node-3"


class Cluster:
    """One simulated GPU node with its exporter, scraped by a real Prometheus."""

    async def start(self, cp, tmp_path, prepare=None, policy="single-numa-node", other_jobs=None):
        self.cp = cp
        self.sim = SimulatedCluster(str(tmp_path / "cluster"), cp)
        host, nvml = presets.gpu_node()
        if prepare:
            prepare(host, nvml)
        self.node = self.sim.add_node(NODE, host, nvml, policy)
        self.host, self.nvml = host, nvml
        self.sim.demand["trainer-remote"] = 0.8
        self.stack = contextlib.AsyncExitStack()
        await self.sim.start()
        self.stack.push_async_callback(self.sim.stop)
        self.stack.push_async_callback(forget_leases, cp, self.sim.session)
        exporter_kubeconfig, self.kubeconfig, self.proxy = await component_kubeconfigs(
            cp, self.stack, tmp_path
        )
        url, self.exporter = await self.stack.enter_async_context(
            self.sim.exporter(self.node, exporter_kubeconfig, "--interval", "1")
        )
        self.prom = await self.stack.enter_async_context(
            PrometheusServer([url.removeprefix("http://")], free_port(), other_jobs=other_jobs)
        )
        self.session = await self.stack.enter_async_context(aiohttp.ClientSession())
        self.client = await api_client(self.kubeconfig)
        self.stack.push_async_callback(self.client.close)
        return self

    async def cross_numa_sustained(self, window: str = "4s") -> None:
        """Wait until the trainer's device_remote verdict held a whole finding window, as
        the controller's own query sees it: its first cycle then opens the finding."""
        held = expressions(Windows(window, window), scope='reason="device_remote"')
        await self.prom.wait_for(held["cross_numa_sustained"])

    def controller(self, window="4s", **policy) -> Controller:
        prometheus = Prometheus(self.prom.url, self.session, windows=Windows(window, window))
        settings = dict(
            dry_run=False, min_pod_age_seconds=0, stale_after_seconds=10, verify_after_seconds=8
        )
        return Controller(prometheus, Kube(self.client), Policy(**{**settings, **policy}))

    async def get(self, kind: str, name: str, namespace: str = "ml") -> dict | None:
        return await self.cp.get(self.sim.session, kind, namespace, name)

    async def patch(self, kind: str, name: str, patch: dict, namespace: str = "ml") -> dict:
        return await self.cp.patch(self.sim.session, kind, namespace, name, patch)

    async def events(self, namespace: str = "ml") -> list[dict]:
        return await self.cp.items(self.sim.session, "Event", namespace)

    def evictions(self, status: int | None = None) -> list[tuple[str, str, int]]:
        """The remediator's evictions as the API server answered them."""
        return [e for e in self.proxy.evictions() if status in (None, e[2])]

    async def history(self, workload: str) -> dict:
        annotations = (await self.get("Deployment", workload))["metadata"]["annotations"]
        return json.loads(annotations["numaguard.io/history"])

    async def stop(self):
        await self.stack.aclose()


@pytest.fixture
async def cluster(tmp_path, control_plane):
    clusters = []

    async def make(prepare=None, policy="single-numa-node", other_jobs=None):
        c = await Cluster().start(control_plane, tmp_path, prepare, policy, other_jobs)
        clusters.append(c)
        return c

    yield make
    for c in clusters:
        await c.stop()


async def test_cross_socket_pod_is_evicted_once_and_comes_back_aligned(cluster):
    c = await cluster(policy="single-numa-node")
    await c.cross_numa_sustained()
    # a period long enough for the gain so far to be shown while it waits (from half of it)
    controller = c.controller(verify_after_seconds=20)
    reports = await cycles_until(controller, lambda rs: any(r.verified for r in rs))
    assert c.evictions(201) == [("ml", "trainer-remote", 201)]  # once, whatever the cycles saw
    acted = [(a.kind, a.pod.name, result) for r in reports for a, result in r.results]
    assert [a for a in acted if a[0] != "recommend"] == [("evict", "trainer-remote", "evicted")]
    # the idle slices get one recommendation each, not one per cycle
    recommended = [a[1] for a in acted if a[0] == "recommend"]
    assert sorted(recommended) == sorted(set(recommended))
    assert "infer-d" in recommended
    (verified,) = [v for r in reports for v in r.verified]
    assert (verified.workload, verified.kind, verified.outcome) == (
        "Deployment/ml/trainer-remote",
        "cross_numa",
        "held",
    )
    # the real ReplicaSet made the replacement, the scheduler bound it, and the node's
    # kubelet (single-numa-node) admitted it aligned
    (replacement,) = c.sim.running("trainer-remote-")
    verdict = await c.prom.query(f'numaguard_pod_cross_numa{{pod="{replacement.name}"}}')
    assert {(r["metric"]["reason"], r["value"][1]) for r in verdict} >= {("device_remote", "0")}
    evicted = {
        e["involvedObject"]["kind"] for e in await c.events() if e["reason"] == "RemediationEvicted"
    }
    assert evicted == {"Pod", "Deployment"}  # on the pod and on its owner
    # and it paid off: its GPU, fed across sockets at 0.1, is busy at its demand (0.8)
    # on the replacement's aligned GPU, as Prometheus saw both over the period
    assert 6 < verified.gain.ratio < 9, verified.detail
    assert re.fullmatch(
        rf"GPU activity 0\.1\d -> 0\.[78]\d after moving to {NODE} NUMA node 0: gain \d\.\d\d",
        verified.detail,
    ), verified.detail
    (said,) = [e for e in await c.events() if e["reason"] == "RemediationVerified"]
    assert said["involvedObject"]["kind"] == "Deployment"
    assert said["message"] == f"held: {verified.detail} (0 failed in a row)"
    observed = controller.metrics.fix_gain.labels("cross_numa")._sum.get()
    assert observed == pytest.approx(verified.gain.ratio)
    # while it waited, each cycle measured the gain so far as the verifier then did
    so_far = [g for r in reports for (w, _, _), g in r.progress.items() if w == verified.workload]
    assert so_far and 6 < so_far[-1].ratio < 9, so_far
    assert so_far[-1].detail.startswith("GPU activity 0.1"), so_far


async def test_a_fix_that_cleared_its_finding_without_a_gain_is_no_gain(cluster, caplog):
    caplog.set_level(logging.INFO, "numaguard.remediator.controller")
    c = await cluster(policy="single-numa-node")
    # the trainer's input holds it back wherever it runs: aligned, it is no busier
    c.sim.input_bound.add("trainer-remote")
    c.sim.demand["trainer-remote"] = 0.1
    await c.cross_numa_sustained()
    controller = c.controller(cooldown_seconds=3600)
    reports = await cycles_until(controller, lambda rs: any(r.verified for r in rs))
    (verified,) = [v for r in reports for v in r.verified]
    assert verified.outcome == "no_gain" and 0.8 < verified.gain.ratio < 1.1, verified
    # the replacement is aligned: the finding cleared, yet it counts as a failure
    (replacement,) = c.sim.running("trainer-remote-")
    verdict = await c.prom.query(f'numaguard_pod_cross_numa{{pod="{replacement.name}"}} == 1')
    assert verdict == []
    history = await c.history("trainer-remote")
    assert history["failures"] == 1 and history["pending"] == []
    (said,) = [e for e in await c.events() if e["reason"] == "RemediationVerified"]
    assert said["type"] == "Warning" and said["message"].startswith("no_gain: GPU activity 0.1")
    assert controller.metrics.verifications.labels("no_gain")._value.get() == 1
    # the log has every signal of both sides: the replacement kept its CPUs' NUMA node
    # (0) and got a whole GPU there, and its memory is all local
    (logged,) = [r for r in caplog.records if getattr(r, "outcome", None) == "no_gain"]
    assert (logged.before["numa_nodes"], logged.after["numa_nodes"]) == ("0", "0")
    assert logged.before["devices"] == logged.after["devices"] == "gpu"
    assert logged.after["remote_memory"] == 0.0 and logged.min_gain == 1.1


async def test_no_aligned_capacity_means_no_eviction(cluster):
    def fill(host, nvml):
        # the two free GPUs go to aligned pods that hold them without running anything,
        # and hold-b takes NUMA node 1's free CPUs: trainer-remote's own GPU there is no
        # use to it either
        for gpu, name, cpus, numa in ((3, "hold-a", "24-25", 0), (7, "hold-b", "42-61", 1)):
            host.pods.append(
                FakePod(
                    name,
                    presets.pod_uid(name),
                    "guaranteed",
                    [
                        FakeContainer(
                            "main",
                            cpus,
                            {numa: 1 << 30},
                            exclusive_cpus=True,
                            devices={"nvidia.com/gpu": [nvml.gpus[gpu].uuid]},
                        )
                    ],
                    "ml",
                )
            )

    c = await cluster(fill)
    await c.prom.wait_for('numaguard_zone_devices_free{resource="nvidia.com/gpu"} == 0')
    await c.cross_numa_sustained()
    controller = c.controller()
    reports = []
    for _ in range(8):
        reports.append(await controller.cycle())
        await asyncio.sleep(1)
    assert c.evictions() == []
    refused = {(r.finding.pod, r.guard) for rep in reports if rep.plan for r in rep.plan.refusals}
    assert ("trainer-remote", "no_fit") in refused
    assert controller.metrics.unremediable._value.get() >= 1
    # one Event per finding (cross_numa and starved) says so, not one per cycle
    refused = [
        e
        for e in await c.events()
        if e["reason"] == "RemediationRefused" and e["involvedObject"]["name"] == "trainer-remote"
    ]
    assert [e["message"].split(":")[0] for e in refused] == ["no_fit", "no_fit"]
    about = {e["message"].rsplit("(finding: ", 1)[1].split()[0] for e in refused}
    assert about == {"cross_numa", "starved"}  # each Event names its finding


async def test_a_pdb_at_its_limit_gets_429_and_is_not_hammered(cluster):
    c = await cluster()
    pdb = {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {"name": "trainer-remote", "namespace": "ml"},
        "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "trainer-remote"}}},
    }
    await c.cp.create(c.sim.session, pdb)

    async def counted(_):  # the real disruption controller keeps the budget's status
        status = (await c.get("PodDisruptionBudget", "trainer-remote")).get("status", {})
        return status.get("currentHealthy") == 1 and status.get("observedGeneration") == 1

    await c.sim.wait_for_api(counted, "the PDB's status from the disruption controller")
    status = (await c.get("PodDisruptionBudget", "trainer-remote"))["status"]
    assert status["disruptionsAllowed"] == 0 and status["desiredHealthy"] == 1
    await c.cross_numa_sustained()
    controller = c.controller(cooldown_seconds=3600)
    results = []
    for _ in range(6):
        report = await controller.cycle()
        results += [result for _, result in report.results]
        await asyncio.sleep(1)
    # the API server's Eviction API refused it (429), once: then it held off
    assert c.evictions() == [("ml", "trainer-remote", 429)]
    assert [r for r in results if r != "recommended"] == ["pdb_blocked"]
    refused = {r.guard for rep in [report] for r in rep.plan.refusals}
    assert "cooldown" in refused
    # the refusal is on the Deployment: a restarted remediator backs off too
    assert (await c.history("trainer-remote"))["pdb_refusals"] == 1
    report = await c.controller(cooldown_seconds=3600).cycle()
    assert c.evictions() == [("ml", "trainer-remote", 429)]
    assert "cooldown" in {r.guard for r in report.plan.refusals}


async def test_stale_data_and_a_dead_prometheus_mean_no_action(cluster):
    c = await cluster()
    await c.cross_numa_sustained()
    controller = c.controller(stale_after_seconds=0.001)  # every sample is too old
    report = await controller.cycle()
    assert report.results == [] and c.evictions() == []
    assert {r.guard for r in report.plan.refusals} == {"stale_data"}
    dead = Prometheus(f"http://127.0.0.1:{free_port()}", c.session, retries=0)
    controller.prometheus = dead
    report = await controller.cycle()
    # said once: "unreachable: http://...", not "unreachable: unreachable: http://..."
    assert report.error.startswith("unreachable: http://127.0.0.1:") and report.plan is None
    assert c.evictions() == []


async def test_an_opted_in_oversized_slice_is_resized_and_others_only_advised(cluster):
    c = await cluster()
    # infer-d holds a 3g.40gb slice and uses none of it; its Deployment opted in
    annotations = {"numaguard.io/auto-resize": "true"}
    before = await c.patch("Deployment", "infer-d", {"metadata": {"annotations": annotations}})
    (container,) = before["spec"]["template"]["spec"]["containers"]
    assert container["resources"]["limits"]["nvidia.com/mig-3g.40gb"] == "1"
    # a whole sizing window of the slices' activity, as the controller's query sees it
    await c.prom.wait_for(expressions(Windows("4s", "4s"))["slice_sm"])
    controller = c.controller(max_per_node=3)  # the eviction of trainer-remote is one
    report = await controller.cycle()
    done = {(a.kind, a.pod.name): (a.detail, result) for a, result in report.results}
    assert done[("resize", "infer-d")] == (
        "resize 3g.40gb -> 1g.10gb (Deployment/ml/infer-d)",
        "resized",
    )
    after = await c.get("Deployment", "infer-d")
    want = {
        kind: {
            ("nvidia.com/mig-1g.10gb" if k == "nvidia.com/mig-3g.40gb" else k): v
            for k, v in amounts.items()
        }
        for kind, amounts in container["resources"].items()
    }
    assert after["spec"]["template"]["spec"]["containers"][0]["resources"] == want
    # the real Deployment controller rolls it out: the new pod runs on a 1g.10gb slice
    await c.sim.wait_until(
        lambda: [
            p.containers[0].devices
            for p in c.sim.running("infer-d-")
            if "nvidia.com/mig-1g.10gb" in p.containers[0].devices
        ],
        "infer-d rolled out onto a 1g.10gb slice",
    )
    # the notebooks sit on the smallest profile already: nothing to say about them (an
    # oversized slice whose Deployment did not opt in is only advised: see the first test)
    assert not [k for k in done if k[1].startswith("notebook")]


async def test_only_the_leader_acts_and_a_successor_does_not_repeat(cluster):
    c = await cluster()
    await c.cross_numa_sustained()
    from numaguard.remediator.leader import LeaderElector

    now = [0.0]  # the replicas' monotonic clock, driven by the test
    first, second = c.controller(), c.controller()
    for controller, identity in ((first, "replica-a"), (second, "replica-b")):
        controller.elector = controller.actuator.elector = LeaderElector(
            controller.actuator.kube,
            "numaguard",
            "lease",
            identity,
            lease_duration=15,
            renew_deadline=10,
            retry_period=2,
            monotonic=lambda: now[0],
        )
    assert await first.elector.try_acquire_or_renew()
    assert not await second.elector.try_acquire_or_renew()
    a = await first.cycle()
    b = await second.cycle()
    assert a.leader and not b.leader
    assert [r for _, r in a.results if r != "recommended"] == ["evicted"]
    assert b.results == []
    # the leader dies; once the Lease has not changed for its duration the other takes
    # over, and reads what the first did from the workload: no second eviction
    now[0] += 16
    assert await second.elector.try_acquire_or_renew()
    b = await second.cycle()
    assert b.leader
    assert c.evictions(201) == [("ml", "trainer-remote", 201)]
    assert [r for _, r in b.results if r not in ("recommended",)] == []
    # both took the Lease through the API server, as the Role in deploy/ lets them
    lease_writes = {(e.method, e.status) for e in c.proxy.writes() if "/leases" in e.path}
    assert {("POST", 201), ("PUT", 200)} <= lease_writes


async def test_plan_prints_what_it_would_do_and_writes_nothing(cluster, tmp_path):
    c = await cluster()
    await c.cross_numa_sustained()
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "numaguard.remediator",
        "plan",
        "--prometheus",
        c.prom.url,
        "--kubeconfig",
        c.kubeconfig,
        "--finding-window",
        "4s",
        "--min-pod-age",
        "0",
        "--output",
        "json",
        "--log-level",
        "warning",
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 0, err.decode()
    answer = json.loads(out)
    evict = [a for a in answer["actions"] if a["kind"] == "evict"]
    assert evict == [
        {
            "kind": "evict",
            "pod": "ml/trainer-remote",
            "finding": "cross_numa",
            "reason": "device_remote",
            "dry_run": True,
            "detail": evict[0]["detail"],
        }
    ]
    assert c.proxy.writes() == []


async def test_api_server_errors_mean_no_action(cluster, monkeypatch):
    c = await cluster()
    await c.cross_numa_sustained()
    controller = c.controller()
    c.proxy.fail_next(500, times=50)
    report = await controller.cycle()
    assert report.error.startswith("api_server") and report.results == []
    assert controller.metrics.errors.labels("api_server")._value.get() == 1
    assert c.evictions() == []
    # an API server slower than the request timeout: the cycle ends, nothing is done
    c.proxy.clear()
    monkeypatch.setattr("numaguard.remediator.kube.REQUEST_TIMEOUT_SECONDS", 1.0)
    c.proxy.delay = 2.0
    report = await controller.cycle()
    assert report.error.startswith("api_server") and report.results == []
    assert c.evictions() == []
    monkeypatch.undo()
    c.proxy.clear()
    report = await controller.cycle()
    assert [r for _, r in report.results if r != "recommended"] == ["evicted"]


async def test_a_fix_that_does_not_hold_backs_off_then_stops(cluster):
    def take_gpu3(host, nvml):
        # GPU 3 is taken: the first free GPU is then GPU 7, on the other socket
        host.pods.append(
            FakePod(
                "hold-a",
                presets.pod_uid("hold-a"),
                "guaranteed",
                [
                    FakeContainer(
                        "main",
                        "24-25",
                        {0: 1 << 30},
                        exclusive_cpus=True,
                        devices={"nvidia.com/gpu": [nvml.gpus[3].uuid]},
                    )
                ],
                "ml",
            )
        )

    # a kubelet without a Topology Manager policy takes the lowest CPUs (socket 0) and
    # the first free GPU (socket 1): every replacement is as misaligned as the last
    c = await cluster(take_gpu3, policy="none")
    await c.cross_numa_sustained()
    controller = c.controller(cooldown_seconds=2, backoff_factor=2, give_up_after=2)
    reports = await cycles_until(
        controller,
        lambda rs: (
            [(v.workload, v.outcome) for r in rs for v in r.verified][-1:]
            == [("Deployment/ml/trainer-remote", "gave_up")]
        ),
        timeout=240,
    )
    outcomes = [v.outcome for r in reports for v in r.verified]
    assert outcomes == ["did_not_hold", "gave_up"]
    assert len(c.evictions(201)) == 2
    # and from then on it is left alone, saying why, even by a remediator that restarted
    # (the history is on the Deployment, not in memory)
    restarted = c.controller(cooldown_seconds=2, backoff_factor=2, give_up_after=2)
    for _ in range(3):
        report = await restarted.cycle()
        await asyncio.sleep(1)
    assert c.evictions(201)[2:] == []
    assert "gave_up" in {r.guard for r in report.plan.refusals}
    assert (await c.history("trainer-remote"))["failures"] == 2


@contextlib.asynccontextmanager
async def base_rbac_only(cp: ControlPlane, session):
    """The remediator with deploy/base's RBAC alone: the enforce overlay's binding gone
    (until the authorizer has seen it go), then put back."""
    path = "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings/numaguard-remediator-enforce"
    binding = await cp.call(session, "GET", path)

    async def may_evict() -> bool:
        account = "numaguard-remediator"
        return await allowed(cp, session, account, "", "pods/eviction", "create", "ml")

    async def may_not_evict() -> bool:
        return not await may_evict()

    await cp.call(session, "DELETE", path)
    try:
        await until(may_not_evict, "the enforce binding gone from the authorizer")
        yield
    finally:
        kept = {k: binding[k] for k in ("apiVersion", "kind", "roleRef", "subjects")}
        await cp.create(session, {**kept, "metadata": {"name": binding["metadata"]["name"]}})
        await until(may_evict, "the enforce binding back")  # the next test may evict


async def test_run_in_dry_run_records_and_stops_cleanly(cluster, tmp_path):
    c = await cluster()
    await c.cross_numa_sustained()
    # a dry run needs no more than deploy/base grants
    await c.stack.enter_async_context(base_rbac_only(c.cp, c.sim.session))
    port = free_port()
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "numaguard.remediator",
        "run",
        "--prometheus",
        c.prom.url,
        "--kubeconfig",
        c.kubeconfig,
        "--finding-window",
        "3s",
        "--min-pod-age",
        "0",
        "--interval",
        "1",
        "--listen",
        f"127.0.0.1:{port}",
        "--lease-namespace",
        "numaguard",
        "--identity",
        "replica-a",
        "--log-level",
        "warning",
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        metrics = ""
        for _ in range(30):
            await asyncio.sleep(1)
            with contextlib.suppress(aiohttp.ClientError):
                async with c.session.get(f"http://127.0.0.1:{port}/metrics") as r:
                    metrics = await r.text()
            if 'numaguard_remediator_actions_total{kind="evict",result="dry_run"}' in metrics:
                break
        proc.send_signal(signal.SIGTERM)
        _, err = await asyncio.wait_for(proc.communicate(), 20)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert proc.returncode == 0, err.decode()[-2000:]
    assert 'numaguard_remediator_actions_total{kind="evict",result="dry_run"}' in metrics
    assert "numaguard_remediator_leader 1.0" in metrics
    from numaguard.contract.catalogue import CATALOGUE

    served = {
        f.name + ("_total" if f.type == "counter" else "")
        for f in text_string_to_metric_families(metrics)
    }
    assert served == {n for n, s in CATALOGUE.items() if s.group in ("remediator", "process")}
    assert c.evictions() == []  # dry-run: Events only
    reasons = {e["reason"] for e in await c.events()}
    assert "DryRun" in reasons
    # the README's review command, as it is written, by the real kubectl: it finds them
    # (they are in the pods' own namespace, not numaguard's)
    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text()
    (review,) = {tuple(ln.split()) for ln in readme.splitlines() if ln.endswith("reason=DryRun")}
    admin = c.cp.kubeconfig(tmp_path / "admin.kubeconfig", c.cp.admin_token)
    listed = subprocess.run(
        [str(c.cp.bin / "kubectl"), f"--kubeconfig={admin}", *review[1:], "-o", "json"],
        check=True,
        capture_output=True,
        text=True,
    )
    found = json.loads(listed.stdout)["items"]
    assert found and {(e["reason"], e["involvedObject"]["namespace"]) for e in found} == {
        ("DryRun", "ml")
    }
    # it held the Lease, and released it when it stopped
    lease = await c.get("Lease", "numaguard-remediator", "numaguard")
    assert lease["spec"]["holderIdentity"] == "" and lease["metadata"]["resourceVersion"]


async def test_an_unreachable_api_server_means_no_action(cluster, tmp_path):
    c = await cluster()
    await c.cross_numa_sustained()
    dead = tmp_path / "dead-kubeconfig"
    with open(c.kubeconfig) as f:
        dead.write_text(f.read().replace(c.proxy.url, f"https://127.0.0.1:{free_port()}"))
    client = await api_client(str(dead))
    try:
        controller = c.controller()
        controller.kube = controller.actuator.kube = Kube(client)
        report = await controller.cycle()
    finally:
        await client.close()
    assert report.error.startswith("api_server") and report.results == []
    assert c.evictions() == []


# when the exporter's cycle last read the pods' cgroups: a new value, a new cycle
LAST_PLACEMENT = re.compile(
    rb'numaguard_collector_last_success_timestamp_seconds\{[^}]*collector="pod_placement"'
    rb"[^}]*\} (\S+)"
)


def crowded_node(clock=time.monotonic):
    """256 CPUs on 2 NUMA nodes; 100 Guaranteed pods whose two exclusive CPUs sit one on
    each node (cpu_span), paired into 50 Deployments across 10 namespaces; a shared-pool
    pod; and an aligned GPU feeder that is CPU-throttled."""
    host = FakeHost(
        nodes=[
            FakeNumaNode("0-127", socket=0, memory_total_bytes=512 << 30),
            FakeNumaNode("128-255", socket=1, memory_total_bytes=512 << 30),
        ]
    )
    for i in range(100):
        name = f"w{i // 2}.{i % 2}"
        host.pods.append(
            FakePod(
                name,
                presets.pod_uid(name),
                "guaranteed",
                [FakeContainer("main", f"{i},{128 + i}", {0: 1 << 30}, exclusive_cpus=True)],
                f"team-{(i // 2) % 10}",
            )
        )
    host.pods.append(
        FakePod(
            "web",
            presets.pod_uid("web"),
            "burstable",
            [FakeContainer("app", "100-127,228-255", {0: 1 << 30})],
        )
    )
    nvml = FakeNvml(clock)
    gpu = nvml.add_gpu("H100-80GB", 0, None, 8 << 30, sm=0.1, graphics=0.1)
    host.pci_devices[sysfs_pci_address(gpu.pci_bus_id)] = 0
    feeder = FakePod(
        "feeder",
        presets.pod_uid("feeder"),
        "guaranteed",
        [
            FakeContainer(
                "main",
                "96-99",
                {0: 4 << 30},
                exclusive_cpus=True,
                devices={"nvidia.com/gpu": [gpu.uuid]},
            )
        ],
        "ml",
    )
    host.pods.append(feeder)
    gpu.processes.append(Process(host.pid(feeder, feeder.containers[0]), 8 << 30))
    return host, nvml


async def protect(sim: SimulatedCluster, pod: dict) -> None:
    """Make the crowded node's special pods what their names say, as they are created."""
    meta, spec = pod["metadata"], pod["spec"]
    how = SPECIAL.get(meta["name"], ("", ""))[0]
    if how in ("bare", "daemonset"):
        meta["labels"] = {}  # not the ReplicaSet's
    if how == "daemonset":
        agent = await sim.cp.create(
            sim.session,
            {
                "apiVersion": "apps/v1",
                "kind": "DaemonSet",
                "metadata": {"name": "agent", "namespace": meta["namespace"]},
                "spec": {
                    "selector": {"matchLabels": {"app": "agent"}},
                    "template": {
                        "metadata": {"labels": {"app": "agent"}},
                        "spec": {"containers": [{"name": "agent", "image": "agent:1"}]},
                    },
                },
            },
        )
        owner = {"apiVersion": "apps/v1", "kind": "DaemonSet", "controller": True}
        meta["ownerReferences"] = [{**owner, "name": "agent", "uid": agent["metadata"]["uid"]}]
    elif how == "opted_out":
        meta["annotations"] = {"numaguard.io/remediate": "false"}
    elif how == "critical":
        spec["priorityClassName"] = "system-node-critical"
    elif how == "scratch":
        spec["volumes"] = [{"name": "tmp", "emptyDir": {}}]


SPECIAL = {  # pod -> (how it is special, the guard that must refuse it)
    "w0.0": ("bare", "bare_pod"),
    "w1.0": ("daemonset", "daemonset"),
    "w2.0": ("opted_out", "opted_out"),
    "late": ("young", "too_young"),
    "w4.0": ("critical", "system_critical"),
    "w5.0": ("scratch", "local_storage"),
}


def created(pod: dict) -> float:
    stamp = time.strptime(pod["metadata"]["creationTimestamp"], "%Y-%m-%dT%H:%M:%SZ")
    return calendar.timegm(stamp)


async def test_guards_and_caps_hold_under_a_hundred_findings(tmp_path, control_plane):
    sim = SimulatedCluster(str(tmp_path / "cluster"), control_plane)
    host, nvml = crowded_node()
    late = host.pod("w3.0")  # w3.0's place goes to a pod made later: a young one
    host.pods.remove(late)
    late.name = "late"
    node = sim.add_node(NODE, host, nvml, "single-numa-node")
    async with contextlib.AsyncExitStack() as stack:
        await sim.start(protect)
        stack.push_async_callback(sim.stop)
        exporter_kubeconfig, kubeconfig, proxy = await component_kubeconfigs(
            control_plane, stack, tmp_path
        )
        url, _ = await stack.enter_async_context(
            sim.exporter(node, exporter_kubeconfig, "--interval", "1")
        )
        feeder_pod = host.pod("feeder")
        feeder = feeder_pod.containers[0]

        # the feeder's CPU quota is too small for its data loader: its counters move between
        # any two of the exporter's reads, each cycle's (a read that saw no new period has no
        # verdict; a whole-host write took over a second on a loaded machine: one file's now)
        async def throttle():
            cycle = None
            while True:
                periods, throttled, seconds = feeder.throttling
                feeder.throttling = (periods + 100, throttled + 50, seconds + 0.5)
                node.root.write_container(feeder_pod, feeder)

                async def next_cycle(seen=cycle):
                    found = LAST_PLACEMENT.search(await get(url + "/metrics"))
                    return found and found[1] != seen and found[1]

                cycle = await until(next_cycle, "the exporter's next cycle", every=0.1)

        ticker = asyncio.create_task(throttle())
        stack.callback(ticker.cancel)
        prom = await stack.enter_async_context(
            PrometheusServer([url.removeprefix("http://")], free_port())
        )
        session = await stack.enter_async_context(aiohttp.ClientSession())
        client = await api_client(kubeconfig)
        stack.push_async_callback(client.close)
        await prom.wait_for(
            # named series: before the pod names arrive the series carry none
            'count(numaguard_pod_cross_numa{reason="cpu_span", pod=~"w.+"} == 1) >= 99'
        )
        (old,) = await control_plane.items(
            sim.session, "Pod", "team-0", fieldSelector="metadata.name=w0.1"
        )

        async def seconds_later(_):  # creation times are in whole seconds
            return time.time() - created(old) >= 4

        await sim.wait_for_api(seconds_later, "4 s after the first pods")
        await sim.add_pods([(node, late)])
        young = await control_plane.get(sim.session, "Pod", "team-3", "late")
        await prom.wait_for(
            'numaguard_pod_cross_numa{reason="cpu_span", pod="late"} offset 5s == 1'
        )
        await prom.wait_for('numaguard_gpu_starved{reason="cpu_throttled"} offset 5s == 1')
        # old enough: the pods made at the start; too young: the late one
        now = time.time()
        min_age = now - (created(old) + created(young)) / 2
        controller = Controller(
            Prometheus(prom.url, session, windows=Windows("4s", "4s")),
            Kube(client),
            Policy(
                dry_run=False,
                max_per_cycle=8,
                max_per_node=100,
                max_per_namespace=2,
                stale_after_seconds=10,
                min_pod_age_seconds=min_age,
            ),
        )
        report = await controller.cycle()
    assert len([f for f in report.findings if f.kind == "cross_numa"]) == 100
    refused = {r.finding.pod: r.guard for r in report.plan.refusals}
    for pod, (_, guard) in SPECIAL.items():
        assert refused[pod] == guard, pod
    evicted = [a.pod for a, result in report.results if result == "evicted"]
    assert len(evicted) == 8
    assert max(Counter(p.namespace for p in evicted).values()) <= 2
    assert len({p.workload for p in evicted}) == 8  # one per Deployment
    assert not set(SPECIAL) & {p.name for p in evicted}
    caps = Counter(g for g in refused.values() if g.startswith("cap_"))
    assert set(caps) <= {"cap_cycle", "cap_namespace", "cap_workload"} and caps
    # the throttled feeder is aligned: advice, never an eviction
    feeder_actions = [(a.kind, r) for a, r in report.results if a.finding.pod == "feeder"]
    assert feeder_actions == [("recommend", "recommended")], [
        r for r in report.plan.refusals if r.finding.pod == "feeder"
    ]
    assert len(proxy.evictions()) == 8 and [e for e in proxy.evictions() if e[1] == "feeder"] == []


async def test_a_dead_exporter_s_lingering_verdicts_are_not_acted_on(cluster):
    c = await cluster()
    # a whole (longer) finding window of it
    await c.prom.wait_for('numaguard_pod_cross_numa{reason="device_remote"} offset 16s == 1', 120)
    c.exporter.kill()  # SIGKILL: no goodbye; its verdicts stay inside the window
    c.exporter.wait()
    await c.prom.wait_for('up{job="numaguard"} == 0')
    controller = c.controller(window="15s")
    report = await controller.cycle()
    assert c.evictions() == [] and report.results == []
    trainer = [r for r in report.plan.refusals if r.finding.pod == "trainer-remote"]
    assert trainer and {r.guard for r in trainer} == {"stale_data"}
    assert all("no exporter target of gpu-node-3 is up" in r.detail for r in trainer)


class Tenant:
    """A tenant's pod serving series it wrote itself, scraped by a kubernetes-pods style
    job with honor_labels: what it says about job and node is kept."""

    def __init__(self, text: str) -> None:
        self.text = text

    async def __aenter__(self):
        from aiohttp import web

        async def metrics(_):
            return web.Response(text=self.text)

        app = web.Application()
        app.router.add_get("/metrics", metrics)
        self.runner = web.AppRunner(app)
        await self.runner.setup()
        self.port = free_port()
        await web.TCPSite(self.runner, "127.0.0.1", self.port).start()
        return self

    async def __aexit__(self, *exc):
        await self.runner.cleanup()

    @property
    def job(self) -> dict:
        """The scrape job that reads it: kubernetes-pods style, keeping its labels."""
        return {
            "job_name": "kubernetes-pods",
            "honor_labels": True,
            "static_configs": [{"targets": [f"127.0.0.1:{self.port}"]}],
        }


async def test_series_forged_by_another_target_evict_nothing(cluster, tmp_path):
    # trainer is aligned; a tenant claims it is cross-NUMA, once in its own job and once
    # under the exporters' job, and that infer-d's slice is idle (for a resize)
    async with Tenant("") as tenant:
        c = await cluster(other_jobs=[tenant.job])
        uid = (await c.get("Pod", "trainer"))["metadata"]["uid"]  # what a tenant can read
        labels = f'node="{NODE}",namespace="ml",pod="trainer",pod_uid="{uid}",reason="cpu_span"'
        # and a pod uid with a newline in it: no matcher can quote it (it ended every
        # cycle before any action); its row is dropped, the cycle goes on
        bad = labels.replace(f'pod_uid="{uid}"', 'pod_uid="a\\nb"')
        tenant.text = (
            f"numaguard_pod_cross_numa{{{labels}}} 1\n"
            f'numaguard_pod_cross_numa{{job="numaguard",{labels},container_id="x"}} 1\n'
            f'numaguard_pod_cross_numa{{job="numaguard",{bad},container_id="y"}} 1\n'
        )
        await c.patch(
            "Deployment",
            "trainer",
            {"metadata": {"annotations": {"numaguard.io/auto-resize": "true"}}},
        )
        # a whole finding window of each
        for series in (
            'numaguard_pod_cross_numa{pod="trainer",job="numaguard",container_id="x"}',
            'numaguard_pod_cross_numa{pod="trainer",job="kubernetes-pods"}',
            'numaguard_pod_cross_numa{reason="device_remote"}',
            'numaguard_pod_cross_numa{container_id="y"}',
        ):
            await c.prom.wait_for(f"{series} offset 5s == 1", 120)
        controller = c.controller(max_per_node=5)
        report = await controller.cycle()
    assert not report.error
    assert controller.metrics.dropped_rows.labels("bad_label")._value.get() > 0
    # the series of another job are never read; those under the exporters' job come from
    # a target that is not gpu-node-3's exporter
    forged_findings = [f for f in report.findings if f.pod == "trainer"]
    assert [f.instance for f in forged_findings] == [f"127.0.0.1:{tenant.port}"]
    refused = {(r.finding.pod, r.guard) for r in report.plan.refusals}
    assert ("trainer", "evidence_mismatch") in refused
    assert [e[1] for e in c.evictions()] == ["trainer-remote"]  # the real one only


async def test_a_forged_1_beside_the_exporter_s_own_0_evicts_nothing(cluster):
    """Under honor_labels a tenant forges job and instance as the real exporter's, and
    says the aligned trainer's cpu_span is 1 with one label more, while the exporter's
    own series for the same pod and reason says 0: two series, a contradiction."""
    async with Tenant("") as tenant:
        c = await cluster(other_jobs=[tenant.job])
        (up,) = await c.prom.wait_for('up{job="numaguard"} == 1')
        exporter = up["metric"]["instance"]
        uid = (await c.get("Pod", "trainer"))["metadata"]["uid"]
        labels = (
            f'job="numaguard",instance="{exporter}",node="{NODE}",namespace="ml",'
            f'pod="trainer",pod_uid="{uid}",reason="cpu_span"'
        )
        tenant.text = f'numaguard_pod_cross_numa{{{labels},container_id="x"}} 1\n'
        own = f'numaguard_pod_cross_numa{{pod_uid="{uid}",reason="cpu_span",container_id=""}}'
        assert [r["value"][1] for r in await c.prom.wait_for(own)] == ["0"]
        forged = 'numaguard_pod_cross_numa{pod="trainer",container_id="x"}'
        await c.prom.wait_for(f"{forged} offset 5s == 1", 120)
        report = await c.controller(max_per_node=5).cycle()
    found = [(f.instance, f.reason) for f in report.findings if f.pod == "trainer"]
    assert found == [(exporter, "cpu_span")]  # it reads as the exporter's own
    refused = [(r.guard, r.detail) for r in report.plan.refusals if r.finding.pod == "trainer"]
    assert refused == [("evidence_mismatch", "2 series say cross_numa cpu_span of the pod")]
    assert "trainer" not in [e[1] for e in c.evictions()]


async def test_a_tenant_s_forged_history_refuses_only_its_own_workload(cluster):
    """A tenant patches its own Deployments as pending with histories no remediator
    writes: an unknown kind (which raised inside verification and froze it for every
    workload), and a thousand valid entries (which made every cycle take 40 s). Each is
    that workload's refusal; the trainer's eviction is still verified, in a cycle of
    ordinary length."""
    c = await cluster(policy="single-numa-node")
    entry = {"kind": "cross_numa", "reason": "cpu_span", "at": 1.0, "pod_uid": "x"}
    entry |= {"recommended": "", "measured_uid": "", "before": None}
    history = {"last_action": 1.0, "failures": 0, "pdb_refusals": 0, "last_refusal": 0.0}
    forged = {
        "infer-a": {**history, "pending": [{**entry, "kind": "bogus"}]},
        "infer-b": {**history, "pending": [entry] * 1000},
    }
    for name, text in forged.items():
        await c.patch(
            "Deployment",
            name,
            {
                "metadata": {
                    "labels": {"numaguard.io/pending": "true"},
                    "annotations": {"numaguard.io/history": json.dumps(text)},
                }
            },
        )
    await c.cross_numa_sustained()
    controller = c.controller()
    took: list[float] = []
    cycle = controller.cycle

    async def timed(*args, **kwargs):
        started = time.monotonic()
        try:
            return await cycle(*args, **kwargs)
        finally:
            took.append(time.monotonic() - started)

    controller.cycle = timed
    reports = await cycles_until(controller, lambda rs: any(r.verified for r in rs))
    (verified,) = [v for r in reports for v in r.verified]
    assert (verified.workload, verified.outcome) == ("Deployment/ml/trainer-remote", "held")
    assert set(controller.verify_refused) == {"Deployment/ml/infer-a", "Deployment/ml/infer-b"}
    # the evidence's fault, not numaguard's: counted as evidence_mismatch, not internal
    assert {guard for guard, _ in controller.verify_refused.values()} == {"evidence_mismatch"}
    assert max(took) < 10, took  # one pending entry verified, not a thousand
    for name in forged:  # left as the tenant wrote them: refused, never a fresh start
        assert await c.history(name) == json.loads(json.dumps(forged[name]))


async def test_sigterm_between_the_record_and_the_eviction_undoes_the_record(cluster):
    """SIGTERM lands after the history recording the eviction was written and before the
    eviction: the eviction is not made, the history is put back as it was (no pending
    action, no pending label), nothing else is written, and the next leader acts as if
    nothing happened."""
    c = await cluster(policy="single-numa-node")
    await c.cross_numa_sustained()
    controller = c.controller()
    stopping = [False]
    record = controller.actuator.record

    async def record_then_sigterm(workload, history):
        result = await record(workload, history)
        stopping[0] = True  # the signal arrives right after the first write
        return result

    controller.actuator.record = record_then_sigterm
    controller.actuator.stopping = lambda: stopping[0]
    report = await until(_acted(controller), "the cycle reaching its eviction", 120)
    assert [(a.pod.name, r) for a, r in report.results] == [("trainer-remote", "stopped")]
    assert c.evictions() == []
    deployment = await c.get("Deployment", "trainer-remote")
    assert (
        json.loads(deployment["metadata"]["annotations"]["numaguard.io/history"])["pending"] == []
    )
    assert "numaguard.io/pending" not in deployment["metadata"].get("labels", {})
    assert not report.verified  # verification waits for the next leader
    # the next leader: no cooldown, no action in flight, acts at once
    successor = c.controller()
    report = await until(_acted(successor), "the successor's eviction", 120)
    assert [(a.pod.name, r) for a, r in report.results] == [("trainer-remote", "evicted")]


def _acted(controller):
    async def cycle():
        report = await controller.cycle()
        acted = [(a, r) for a, r in report.results if a.kind == "evict"]
        if acted:
            report.results = acted
            return report
        return None

    return cycle


def resizes_of(reports, pod: str) -> list:
    """(action, result) of each resize of ``pod`` the cycles made."""
    return [
        (a, r)
        for rep in reports
        for a, r in rep.results
        if a.kind == "resize" and a.pod.name == pod
    ]


def dra_infer(template: str) -> dict:
    """A Deployment whose pod gets its MIG slice from a ResourceClaimTemplate, opted in
    to resizes."""
    container = {
        "name": "main",
        "image": "registry.example/main:1.0",
        "resources": {"claims": [{"name": "gpu"}]},
    }
    spec = {
        "containers": [container],
        "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": template}],
        "nodeSelector": {"kubernetes.io/hostname": NODE},
        "automountServiceAccountToken": False,
    }
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {
            "name": "dra-infer",
            "namespace": "ml",
            "annotations": {"numaguard.io/auto-resize": "true"},
        },
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"app": "dra-infer"}},
            "template": {"metadata": {"labels": {"app": "dra-infer"}}, "spec": spec},
        },
    }


async def test_a_slice_from_a_claim_template_is_resized_through_a_new_template(cluster):
    """GPU 7 under DynamicMIG; dra-infer holds a 3g.40gb slice through a claim template
    and does nothing on it. The remediator makes a new template for the smaller profile,
    points the Deployment at it with the history in the same write, the real scheduler
    allocates the new pod's claim from the counters, the old template is deleted once no
    pod uses it, and no template update is ever sent (their spec is immutable)."""

    def dynamic(host, nvml):  # the driver makes GPU 7's slices as claims come
        nvml.set_mig(7, [])
        nvml.gpus[7].dynamic_mig = True

    c = await cluster(prepare=dynamic)
    c.node.claims_in_pod_resources = True  # a 1.34+ kubelet names claims' devices
    c.sim.demand["dra-infer"] = 0.0
    s = c.sim.session
    old_spec = {"spec": dra.mig_claim_spec("3g.40gb")}
    template = {
        "apiVersion": dra.API,
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": "dra-infer-gpu", "namespace": "ml"},
        "spec": old_spec,
    }
    await c.cp.create(s, template)
    stored = (await c.get("ResourceClaimTemplate", "dra-infer-gpu"))["spec"]  # defaulted
    await c.cp.create(s, dra_infer("dra-infer-gpu"))
    await c.sim.wait_until(lambda: c.sim.running("dra-infer-"), "dra-infer running")
    (first,) = c.sim.running("dra-infer-")
    await c.prom.wait_for(expressions(Windows("4s", "4s"))["slice_sm"])
    controller = c.controller(max_per_node=3)

    def resized(reports):
        return resizes_of(reports, first.name)

    ((action, result),) = resized(await cycles_until(controller, resized))
    new = action.finding.recommended
    assert (action.finding.profile, result) == ("3g.40gb", "resized")
    assert geometry(new) < geometry("3g.40gb")
    made = await c.get("ResourceClaimTemplate", template_name("dra-infer", new))
    assert made["spec"] == {**stored, "spec": with_profile(stored["spec"], "3g.40gb", new)}
    owner = made["metadata"]["ownerReferences"][0]
    assert (owner["kind"], owner["name"]) == ("Deployment", "dra-infer")
    after = await c.get("Deployment", "dra-infer")
    (claim,) = after["spec"]["template"]["spec"]["resourceClaims"]
    assert claim["resourceClaimTemplateName"] == made["metadata"]["name"]
    assert "numaguard.io/history" in after["metadata"]["annotations"]
    # the rollout: the new pod's claim, allocated by the real scheduler to a slice of
    # the new profile, which the driver made on GPU 7
    profile = c.nvml.gpus[7].model.profile(new)

    def rolled_out():
        pods = [p for p in c.sim.running("dra-infer-") if p.uid != first.uid]
        made = [sl for sl in c.nvml.gpus[7].mig or [] if sl.profile == profile]
        return pods and made and [sl.processes for sl in made if sl.processes]

    await c.sim.wait_until(rolled_out, f"dra-infer rolled out onto a {new} slice")
    # once the old pod is gone, the old template goes too
    await cycles_until(controller, lambda _: not c.sim.running(first.name), timeout=120)

    async def old_gone():
        await controller.cycle()
        return await c.get("ResourceClaimTemplate", "dra-infer-gpu") is None

    await until(old_gone, "the replaced template deleted", 120)
    assert await c.get("ResourceClaimTemplate", made["metadata"]["name"]) is not None
    updates = [
        e
        for e in c.proxy.log
        if "resourceclaimtemplates" in e.path and e.method in ("PUT", "PATCH")
    ]
    assert updates == []


async def test_a_dra_slice_behind_an_extended_resource_is_resized_by_its_name(cluster):
    """GPUs 3 and 7 under DynamicMIG; dra-ext asks for nvidia.com/mig-7g.80gb, which no
    device plugin on the node offers and a DeviceClass maps: the real scheduler makes its
    claim. It uses 12 GiB and nothing else: the remediator swaps the resource for
    nvidia.com/mig-1g.20gb (mapped too), judged on the other GPU's counters (its own
    slice is not free while the rolling update starts the new pod first), not on
    pre-made slices, and the scheduler makes the new pod's claim for a 1g.20gb the driver
    makes."""
    dynamic_gpus = (3, 7)

    def dynamic(host, nvml):
        for i in dynamic_gpus:
            nvml.set_mig(i, [])
            nvml.gpus[i].dynamic_mig = True

    c = await cluster(prepare=dynamic)
    c.node.claims_in_pod_resources = True
    c.sim.demand["dra-ext"] = 0.0
    s = c.sim.session
    classes = []
    for profile in ("7g.80gb", "1g.20gb"):
        mapped = dra.device_class(f"mig-{profile}", "mig", f"nvidia.com/mig-{profile}")
        mapped["spec"]["selectors"].append(dra.profile_selector(profile))
        await c.cp.create(s, mapped)
        classes.append(f"/apis/{dra.API}/deviceclasses/mig-{profile}")
    try:
        deployment = dra_infer("unused")
        deployment["metadata"]["name"] = "dra-ext"
        spec = deployment["spec"]
        spec["selector"]["matchLabels"]["app"] = "dra-ext"
        spec["template"]["metadata"]["labels"]["app"] = "dra-ext"
        del spec["template"]["spec"]["resourceClaims"]
        limits = {"nvidia.com/mig-7g.80gb": "1", "cpu": "1", "memory": "1Gi"}
        spec["template"]["spec"]["containers"][0]["resources"] = {"limits": limits}
        await c.cp.create(s, deployment)
        await c.sim.wait_until(lambda: c.sim.running("dra-ext-"), "dra-ext running")
        (first,) = c.sim.running("dra-ext-")
        (whole,) = [
            sl for i in dynamic_gpus for sl in c.nvml.gpus[i].mig if sl.profile.name == "7g.80gb"
        ]
        whole.memory_used_bytes = 12 << 30
        c.node.write()
        await c.prom.wait_for(expressions(Windows("4s", "4s"))["slice_sm"])
        controller = c.controller(max_per_node=3)

        def resized(reports):
            return resizes_of(reports, first.name)

        ((action, result),) = resized(await cycles_until(controller, resized))
        assert (action.detail, result) == (
            "resize 7g.80gb -> 1g.20gb (Deployment/ml/dra-ext)",
            "resized",
        )
        after = await c.get("Deployment", "dra-ext")
        assert after["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"] == {
            "nvidia.com/mig-1g.20gb": "1",
            "cpu": "1",
            "memory": "1Gi",
        }

        def rolled_out():
            pods = [p for p in c.sim.running("dra-ext-") if p.uid != first.uid]
            made = [
                sl
                for i in dynamic_gpus
                for sl in c.nvml.gpus[i].mig or []
                if sl.profile.name == "1g.20gb"
            ]
            return pods and made

        await c.sim.wait_until(rolled_out, "dra-ext rolled out onto a 1g.20gb the driver made")
        (new,) = [p for p in c.sim.running("dra-ext-") if p.uid != first.uid]
        status = (await c.get("Pod", new.name))["status"]
        assert status["extendedResourceClaimStatus"]["resourceClaimName"]
    finally:
        for path in classes:
            await c.cp.request(s, "DELETE", path)


def split_pair(host: FakeHost, nvml: FakeNvml) -> None:
    """A data-parallel job on GPUs 7 and 8 of NUMA node 1, under different host bridges
    (NODE: no P2P), moving 2 GiB/s over PCIe through each; GPUs 9 and 10, joined by an
    NVLink bridge of 12 links, free on the same NUMA node."""
    far, *bridged = (nvml.add_gpu("H100-80GB", 1) for _ in range(3))
    bridged[0].nvlinks, bridged[1].nvlinks = [10] * 12, [9] * 12
    for gpu in (far, *bridged):
        host.pci_devices[sysfs_pci_address(gpu.pci_bus_id)] = 1
    main = FakeContainer("main", "44-45", {1: 1 << 30}, exclusive_cpus=True)
    job = FakePod("allreduce", presets.pod_uid("allreduce"), "guaranteed", [main], "ml")
    host.pods.append(job)
    for gpu in (nvml.gpus[7], far):
        main.devices.setdefault("nvidia.com/gpu", []).append(gpu.uuid)
        gpu.processes.append(Process(host.pid(job, main), 8 << 30))
        gpu.activity.set(sm=0.3, graphics=0.35, pcie_tx=1 << 30, pcie_rx=1 << 30)


async def test_gpus_without_p2p_are_evicted_onto_a_joined_pair(cluster):
    """The real ReplicaSet's replacement is admitted on NUMA node 1 and, as NVIDIA's
    device plugin prefers, given the NVLink pair; the fix holds and pays off."""
    c = await cluster(split_pair)
    held = expressions(Windows("4s", "4s"))["no_p2p_moving"]
    await c.prom.wait_for(held)
    ignore = Enforcement(cross_numa="ignore", starved="ignore", mis_sized="ignore")
    controller = c.controller(enforcement=ignore)
    reports = await cycles_until(controller, lambda rs: any(r.verified for r in rs))
    assert c.evictions(201) == [("ml", "allreduce", 201)]
    (verified,) = [v for r in reports for v in r.verified]
    assert (verified.workload, verified.kind, verified.outcome) == (
        "Deployment/ml/allreduce",
        "gpu_link",
        "held",
    )
    (replacement,) = c.sim.running("allreduce-")
    given = replacement.containers[0].devices["nvidia.com/gpu"]
    assert sorted(given) == sorted(c.nvml.gpus[i].uuid for i in (9, 10))
    link = await c.prom.query(f'numaguard_pod_gpu_link{{pod="{replacement.name}"}}')
    assert [r["metric"]["level"] for r in link] == ["nvlink"]
    assert verified.gain.ratio > 1.0, verified.detail
    evicted = [e for e in await c.events() if e["reason"] == "RemediationEvicted"]
    assert {e["involvedObject"]["kind"] for e in evicted} == {"Pod", "Deployment"}
    assert {e["message"].rsplit("(finding: ", 1)[1] for e in evicted} == {"gpu_link no_p2p)"}
