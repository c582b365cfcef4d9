"""``make demo``: the whole loop on a simulated cluster.

Three 2-socket nodes with 8 H100 GPUs each (MIG mixed) and a mix of aligned,
cross-socket, starved and mis-sized pods; an exporter per node (fake NVML, fake kubelet
over gRPC); a real Prometheus with numaguard's rules; a real control plane (API server,
controllers, scheduler) whose ReplicaSets recreate evicted pods, the simulator admitting
them under each node's Topology Manager policy; the remediator acting live, leader
elected, as its ServiceAccount. A live view of findings, actions, refusals and
verifications, kubectl commands to look at the cluster meanwhile, then a before/after
summary.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import sys
import tempfile
import time
from collections import Counter

import aiohttp
from aiohttp import web

from alerts import rules
from numaguard.common import logs
from numaguard.remediator import steering
from numaguard.remediator.cli import decisions_handler
from numaguard.remediator.controller import Controller
from numaguard.remediator.core.guards import LASTING_GUARDS
from numaguard.remediator.core.policy import Policy
from numaguard.remediator.core.queries import Windows
from numaguard.remediator.core.steering import Target
from numaguard.remediator.kube import Kube, api_client
from numaguard.remediator.leader import LeaderElector
from numaguard.remediator.signals import Prometheus
from numaguard.simulator.cluster.simulated import SimulatedCluster
from numaguard.simulator.fakes import presets
from numaguard.simulator.fakes.host import FakeContainer, FakePod
from numaguard.simulator.fakes.nvml import Process
from numaguard.simulator.parts.controlplane import ControlPlane
from numaguard.simulator.parts.processes import free_port
from numaguard.simulator.parts.prometheus import PrometheusServer

# node -> its kubelet's Topology Manager policy
NODES = {"gpu-a": "single-numa-node", "gpu-b": "single-numa-node", "gpu-c": "none"}
WINDOW = "6s"


def add_nodes(sim: SimulatedCluster) -> None:
    """The preset GPU node three times (a namespace per node, its workloads pinned to
    it), each with a twist:

    * gpu-a: its cross-socket trainer can be fixed, the fix holds and pays off;
    * gpu-b: a PodDisruptionBudget keeps its trainer in place (429, retried later); and
      a cross-socket loader whose GPU waits on its input: moved, it is aligned and no
      busier (no_gain);
    * gpu-c: no Topology Manager policy and GPU 3 taken: its replacement lands
      misaligned again, so the remediator backs off and gives up; and a cross-NUMA
      pod in kube-system that it must never touch.
    """
    for index, (name, policy) in enumerate(NODES.items()):
        host, nvml = presets.gpu_node(node_id=index + 1)
        for pod in host.pods:  # pods are unique per cluster: a namespace per node
            pod.namespace = f"team-{name}"
            pod.uid = presets.pod_uid(f"{name}/{pod.name}")
        team = f"team-{name}"
        if name == "gpu-b":  # CPUs on NUMA node 1, GPU 3 on node 0, busy at 0.1 anywhere
            loader = add_pod(host, name, "loader", team, "42-43", {1: 1 << 30}, nvml.gpus[3])
            nvml.gpus[3].processes.append(Process(host.pid(loader, loader.containers[0]), 4 << 30))
            nvml.gpus[3].activity.set(sm=0.1, graphics=0.11)
        if name == "gpu-c":
            add_pod(host, name, "holder", team, "24-25", {0: 1 << 30}, nvml.gpus[3])
            add_pod(host, name, "node-agent", "kube-system", "26,58", {0: 1 << 30})
        sim.add_node(name, host, nvml, policy)
        sim.node_pools[team] = name  # its replacements stay on its node
    sim.demand["trainer-remote"] = 0.8
    sim.demand["loader"] = 0.1
    sim.input_bound.add("loader")


def add_pod(host, node: str, name: str, namespace: str, cpus: str, memory, gpu=None) -> FakePod:
    """A Guaranteed pod with exclusive CPUs (and a whole GPU) on a demo node."""
    devices = {"nvidia.com/gpu": [gpu.uuid]} if gpu else {}
    container = FakeContainer("main", cpus, memory, exclusive_cpus=True, devices=devices)
    pod = FakePod(name, presets.pod_uid(f"{node}/{name}"), "guaranteed", [container], namespace)
    host.pods.append(pod)
    return pod


async def protect(sim: SimulatedCluster) -> None:
    pdb = {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {"name": "trainer-remote", "namespace": "team-gpu-b"},
        "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "trainer-remote"}}},
    }
    await sim.cp.create(sim.session, pdb)


async def state(prom: PrometheusServer) -> dict[str, int]:
    async def count(expr: str) -> int:
        result = await prom.query(f"count({expr}) or vector(0)")
        return int(float(result[0]["value"][1])) if result else 0

    return {
        "pods placed across NUMA nodes": await count(
            "max by (node, namespace, pod) (numaguard_pod_cross_numa) == 1"
        ),
        "GPUs or slices starved by their host": await count(
            "max by (node, gpu_uuid, mig_uuid) (numaguard_gpu_starved) == 1"
        ),
    }


async def settled(sim: SimulatedCluster, report, verified: int) -> bool:
    """Nothing left to happen: no action awaiting verification, something verified, and
    every finding the remediator would move refused for good."""
    if not verified or report.plan is None or report.error:
        return False
    moving = [a for a in report.plan.actions if a.kind != "recommend"]
    if moving or not all(r.guard in LASTING_GUARDS for r in report.plan.refusals):
        return False
    for kind in ("Deployment", "StatefulSet", "ReplicaSet"):
        if await sim.cp.items(sim.session, kind, labelSelector="numaguard.io/pending"):
            return False
    return True


def kubectl_commands(kubeconfig: str) -> str:
    k = f"kubectl --kubeconfig {kubeconfig}"
    return "\n".join(
        [
            "  look at the live cluster meanwhile:",
            f"    {k} get pods -A -o wide",
            f"    {k} get events -A --sort-by=.lastTimestamp | grep Remediation",
            f"    {k} -n numaguard get lease numaguard-remediator -o yaml",
            f"    {k} get pdb -A",
        ]
    )


def live_line(t: float, report) -> str:
    kinds = Counter(f.kind for f in report.findings)
    parts = [
        f"t={t:4.0f}s findings "
        + (", ".join(f"{k} {n}" for k, n in sorted(kinds.items())) or "none")
    ]
    for action, result in report.results:
        if action.kind != "recommend":
            parts.append(
                f"  {action.kind} {action.finding.namespace}/{action.finding.pod} "
                f"({action.finding.kind}:{action.finding.reason}) -> {result}"
            )
    recommended = [a for a, r in report.results if a.kind == "recommend"]
    if recommended:
        parts.append(
            f"  {len(recommended)} recommendations (Events), e.g. "
            f"{recommended[0].finding.pod}: {recommended[0].detail}"
        )
    guards = Counter(r.guard for r in (report.plan.refusals if report.plan else ()))
    if guards:
        parts.append("  refused: " + ", ".join(f"{g} {n}" for g, n in sorted(guards.items())))
    for v in report.verified:
        parts.append(f"  verified {v.workload}: {v.outcome} ({v.detail})")
    if report.error:
        parts.append(f"  no action: {report.error}")
    return "\n".join(parts)


async def main(seconds: float, hold: bool = False) -> None:
    """Run until the loop has settled (every fix verified or refused for good), or for
    ``seconds`` at most: how long that takes depends on the machine, what happens not.
    ``hold``: the exporters and the decision page served after that, until standard
    input closes."""
    started = time.monotonic()
    # a short directory: the fake kubelets' unix sockets live in it
    with tempfile.TemporaryDirectory(prefix="ng-demo-", dir="/tmp") as tmp:
        async with ControlPlane() as cp:
            async with aiohttp.ClientSession() as session:
                await cp.install_numaguard(session)
            print(f"a real control plane ({cp.url}) started in {cp.started_seconds:.1f}s")
            sim = SimulatedCluster(tmp, cp)
            add_nodes(sim)
            await sim.start()
            try:
                await protect(sim)
                summary = await run(sim, tmp, seconds, hold)
            finally:
                await sim.stop()
    print(summary)
    print(f"demo finished in {time.monotonic() - started:.0f}s")


async def closed(fd: int) -> None:
    """Until ``fd`` reads its end (what comes before it is read and dropped)."""
    loop = asyncio.get_running_loop()
    ended = loop.create_future()

    def readable() -> None:
        if not os.read(fd, 4096) and not ended.done():
            ended.set_result(None)

    loop.add_reader(fd, readable)
    try:
        await ended
    finally:
        loop.remove_reader(fd)


async def run(sim: SimulatedCluster, tmp: str, seconds: float, hold: bool = False) -> str:
    cp = sim.cp
    exporter_kubeconfig, kubeconfig = (
        cp.kubeconfig(f"{tmp}/{account}.kubeconfig", cp.tokens[account], account)
        for account in ("numaguard-exporter", "numaguard-remediator")
    )
    admin_kubeconfig = cp.kubeconfig(f"{tmp}/kubeconfig", cp.admin_token)
    rule_file = f"{tmp}/rules.yml"
    with open(rule_file, "w") as f:
        f.write(rules.rules_yaml(Windows(WINDOW, WINDOW)))
    async with contextlib.AsyncExitStack() as stack:
        urls = []
        for node in sim.nodes.values():
            url, _ = await stack.enter_async_context(
                sim.exporter(
                    node,
                    exporter_kubeconfig,
                    "--interval",
                    "1",
                    "--resctrl-mode",
                    "off",
                    "--log-level",
                    "error",
                )
            )
            urls.append(url)
        prom = await stack.enter_async_context(
            PrometheusServer(
                [u.removeprefix("http://") for u in urls], free_port(), rule_files=[rule_file]
            )
        )
        session = await stack.enter_async_context(aiohttp.ClientSession())
        client = await api_client(kubeconfig)
        stack.push_async_callback(client.close)
        kube = Kube(client)
        elector = LeaderElector(kube, "numaguard", "numaguard-remediator", "demo-replica")
        stop = asyncio.Event()
        election = asyncio.create_task(elector.run(stop))
        stack.push_async_callback(asyncio.wait_for, election, 30)
        stack.callback(stop.set)
        print(
            "numaguard on a simulated cluster: 3 nodes x 8 H100 (MIG mixed), policies "
            + ", ".join(f"{n}: {p}" for n, p in NODES.items())
        )
        shown: list[Controller] = []  # the decision page's controller, once made
        decided = web.Application()
        decided.add_routes([web.get("/decisions", decisions_handler(shown))])
        page = web.AppRunner(decided, access_log=None)
        await page.setup()
        stack.push_async_callback(page.cleanup)
        page_port = free_port()
        await web.TCPSite(page, "127.0.0.1", page_port).start()
        decisions_url = f"http://127.0.0.1:{page_port}"
        print(f"  Prometheus (rules loaded): {prom.url}   alerts: {prom.url}/alerts")
        print(f"  the remediator's decisions: {decisions_url}/decisions")
        for node, url in zip(sim.nodes, urls, strict=True):
            print(f"  exporter {node}: {url}/metrics   placement map: {url}/placement")
        print(f"  API server: {cp.url}  (admin kubeconfig: {admin_kubeconfig})")
        print(kubectl_commands(admin_kubeconfig))
        print(
            f"running the remediator live until it settles, {seconds:g}s at most "
            f"(finding window {WINDOW})\n",
            flush=True,
        )
        await prom.wait_for("numaguard_pod_cross_numa == 1", 60)
        await asyncio.sleep(7)  # a whole finding window of data
        before = await state(prom)
        controller = Controller(
            Prometheus(prom.url, session, windows=Windows(WINDOW, WINDOW)),
            kube,
            elector=elector,
            policy=Policy(
                dry_run=False,
                min_pod_age_seconds=0,
                cooldown_seconds=6,
                stale_after_seconds=15,
                max_per_node=2,
                give_up_after=2,
                verify_after_seconds=12,
                verify_deadline_seconds=60,
                pdb_retry_seconds=3,
                pdb_backoff_max_seconds=6,
            ),
        )
        shown.append(controller)
        # steering on: the webhook served here, its configuration deploy/'s
        material = steering.certificate(["127.0.0.1"])
        port = free_port()
        webhook = await steering.serve(material, "127.0.0.1", port)
        stack.push_async_callback(webhook.cleanup)
        controller.steering = Target(
            "numaguard-remediator", material["ca.crt"], url=f"https://127.0.0.1:{port}"
        )
        refusals: Counter[str] = Counter()
        why: dict[tuple[str, str], str] = {}  # (namespace, pod) -> the last word on it
        outcomes: Counter[str] = Counter()
        landings: Counter[str] = Counter()
        fixes: list[str] = []  # each verification, with what the fix gained
        evictions = 0
        t0 = time.monotonic()
        while time.monotonic() - t0 < seconds:
            report = await controller.cycle()
            refusals.update(r.guard for r in (report.plan.refusals if report.plan else ()))
            why |= said_of(report)
            outcomes.update(v.outcome for v in report.verified)
            landings.update(v.landing for v in report.verified if v.landing)
            fixes += [f"    {v.workload}: {v.outcome}, {v.detail}" for v in report.verified]
            print(live_line(time.monotonic() - t0, report), flush=True)
            evictions += sum(result == "evicted" for _, result in report.results)
            if await settled(sim, report, sum(outcomes.values())):
                print("settled: every fix verified or refused for good", flush=True)
                break
            await asyncio.sleep(3)
        await asyncio.sleep(7)  # let the last replacements be scraped
        after = await state(prom)
        left = await misplaced(prom)
        if hold:
            print("the pages stay served until standard input closes", flush=True)
            await closed(sys.stdin.fileno())
    lines = ["\nbefore / after"]
    for key in before:
        lines.append(f"  {key:<40}{before[key]:>4} -> {after[key]}")
    lines.append(f"  {'evictions made':<40}{evictions:>4}")
    lines.append(f"  {'replacements refused by the kubelet':<40}{len(sim.rejected):>4}")
    lines.append(
        "  verifications: " + (", ".join(f"{o} {n}" for o, n in outcomes.items()) or "none")
    )
    lines.append(
        "  replacements landed (steered): "
        + (", ".join(f"{o} {n}" for o, n in sorted(landings.items())) or "none verified")
    )
    lines.append("  fixes and what they gained:")
    lines += fixes or ["    none verified"]
    lines.append(
        "  refusals by guard: "
        + (", ".join(f"{g} {n}" for g, n in refusals.most_common()) or "none")
    )
    lines.append("  still misplaced, and why:")
    lines += [
        f"    {ns}/{pod} ({reasons}): {why.get((ns, pod), 'no finding yet: not held a window')}"
        for ns, pod, reasons in left
    ] or ["    none"]
    return "\n".join(lines)


def said_of(report) -> dict[tuple[str, str], str]:
    """What the cycle's plan said of each pod it refused or only recommended."""
    plan = report.plan
    if plan is None:
        return {}
    out = {(r.finding.namespace, r.finding.pod): f"{r.guard}: {r.detail}" for r in plan.refusals}
    for a in plan.actions:
        if a.kind == "recommend":
            out[(a.finding.namespace, a.finding.pod)] = f"recommended: {a.detail}"
    return out


async def misplaced(prom: PrometheusServer) -> list[tuple[str, str, str]]:
    """The pods placed across NUMA nodes now, each with its reasons."""
    result = await prom.query("max by (namespace, pod, reason) (numaguard_pod_cross_numa) == 1")
    pods: dict[tuple[str, str], list[str]] = {}
    for r in result:
        m = r["metric"]
        pods.setdefault((m.get("namespace", ""), m.get("pod", "")), []).append(m["reason"])
    return [(ns, pod, ", ".join(sorted(rs))) for (ns, pod), rs in sorted(pods.items())]


def cli() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument(
        "--seconds",
        type=float,
        default=240.0,
        help="the longest the remediator runs; it stops once the loop has settled",
    )
    p.add_argument(
        "--hold",
        action="store_true",
        help="once settled, keep the exporters' placement maps and the decision page "
        "served until standard input closes (Ctrl-D), to look at the nodes after the fixes",
    )
    args = p.parse_args()
    logs.setup("text", "error")
    asyncio.run(main(args.seconds, args.hold))


if __name__ == "__main__":
    cli()
