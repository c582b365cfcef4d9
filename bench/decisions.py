"""Benchmark: the quality of the remediator's decisions on a suite of simulated clusters.

Each scenario is a simulated cluster on a real control plane (simulator.cluster.simulated: fake
hosts, NVML and kubelets admitting pods under their Topology Manager policy; the real
ReplicaSets recreate evicted pods, the real NUMA-blind scheduler places them) with
cross-socket GPU pods (some of them protected: kube-system, opted
out, bare), pods whose memory sits on the other socket and pods whose CPUs span both.
Each cycle the exporter's view is computed from the simulation (placement verdicts and
free capacity per NUMA zone, as the exporters would report them, fresh, from each
node's own target), the real findings code and planner decide (with the nodes as the
real API server describes them), and evictions go through the real Eviction API.
Measured: the share of remediable findings (an aligned zone existed, and a pod holding
exclusive CPUs: one in the shared pool is advised, never evicted) fixed within three
cycles, evictions per fix, guard violations (actions on protected pods), which must be
zero, and the share of replacements the scheduler placed on a node the plan found to fit
— each scenario run twice, with the remediator's steering webhook (served over TLS, its
configuration written by the actuator, called by the real API server) and without.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import tempfile
import time
from pathlib import Path

import aiohttp

from numaguard.exporter.readers import parse_id_list
from numaguard.remediator import steering
from numaguard.remediator.actuator import Actuator
from numaguard.remediator.cluster import nodes_of, placement_of
from numaguard.remediator.core.actions import PodInfo, after_action
from numaguard.remediator.core.answers import Signals
from numaguard.remediator.core.findings import FindingState, update
from numaguard.remediator.core.history import WorkloadHistory, after_verification
from numaguard.remediator.core.planner import nodes_to_check, plan, prepare
from numaguard.remediator.core.policy import Policy
from numaguard.remediator.core.queries import REQUIRED_LABELS
from numaguard.remediator.core.steering import Steer, Target
from numaguard.remediator.kube import Kube, api_client
from numaguard.simulator.cluster.manifests import PRESET_HASH, pod_template
from numaguard.simulator.cluster.node import free_cpus
from numaguard.simulator.cluster.simulated import SimulatedCluster
from numaguard.simulator.fakes import presets
from numaguard.simulator.fakes.host import FakeContainer, FakePod
from numaguard.simulator.fakes.nvml import FakeGpu
from numaguard.simulator.parts.controlplane import ControlPlane
from numaguard.simulator.parts.processes import free_port
from numaguard.simulator.parts.prometheus import as_signals


def scenario(cp, directory: str, seed: int, nodes: int, policies: tuple[str, ...]):
    """A cluster of preset GPU nodes; on each, extra cross-socket pods, some protected."""
    rng = random.Random(seed)
    sim = SimulatedCluster(directory, cp)
    protected: list[tuple[FakePod, str]] = []  # pod, how it is protected (uid comes later)
    for n in range(nodes):
        name = f"node-{n}"
        host, nvml = presets.gpu_node(node_id=n + 1)
        for pod in host.pods:
            pod.namespace = f"team-{n}"
            pod.uid = presets.pod_uid(f"{name}/{pod.name}")
        # one more cross-socket job on GPU 7 (socket 1), fed from socket 0, maybe protected
        kind = rng.choice(["", "", "kube-system", "opted-out", "bare"])
        pod = FakePod(
            f"extra-{n}",
            presets.pod_uid(f"{name}/extra"),
            "guaranteed",
            [
                FakeContainer(
                    "main",
                    "26-27",
                    {0: 1 << 30},
                    exclusive_cpus=True,
                    devices={"nvidia.com/gpu": [nvml.gpus[7].uuid]},
                )
            ],
            "kube-system" if kind == "kube-system" else f"team-{n}",
        )
        host.pods.append(pod)
        if kind:
            protected.append((pod, kind))
        # a pod whose memory sits on the other socket, and one whose CPUs span both
        for stem, cpus, memory in (("mem", "56-57", {0: 4 << 30}), ("span", "28,60", {0: 1 << 30})):
            host.pods.append(
                FakePod(
                    f"{stem}-{n}",
                    presets.pod_uid(f"{name}/{stem}"),
                    "guaranteed",
                    [FakeContainer("main", cpus, memory, exclusive_cpus=True)],
                    f"team-{n}",
                )
            )
        sim.add_node(name, host, nvml, rng.choice(policies))
    sim.demand["trainer-remote"] = 0.8
    return sim, protected


COLLECTORS = ("host_numa", "pod_placement", "gpu", "pod_resources", "resctrl")


def observe(
    sim: SimulatedCluster, protected: dict[str, str], now: float
) -> tuple[Signals, dict[str, PodInfo]]:
    """What the exporters would report (fresh, from each node's own target), and what
    the API server would say, right now."""
    rows: dict[str, list[dict]] = {name: [] for name in REQUIRED_LABELS}
    infos: dict[str, PodInfo] = {}
    for node in sim.nodes.values():
        host, nvml = node.host, node.nvml
        rows["targets_up"].append({"node": node.name, "value": 1})
        for collector in COLLECTORS:
            ids = {"node": node.name, "collector": collector}
            rows["collector_age"].append({**ids, "value": 1})
            rows["collector_success"].append({**ids, "value": 1})
        free = free_cpus(node)
        held = {
            u for p in host.pods for c in p.containers for ids in c.devices.values() for u in ids
        }
        for i, numa in enumerate(host.nodes):
            ids = {"node": node.name, "numa_node": str(i)}
            rows["zone_free_cpus"].append({**ids, "value": len(parse_id_list(numa.cpus) & free)})
            rows["zone_free_memory"].append({**ids, "value": 1 << 40})
            free_gpus = sum(
                1 for g in nvml.gpus if g.numa_node == i and g.mig is None and g.uuid not in held
            )
            rows["zone_free_devices"].append(
                {**ids, "resource": "nvidia.com/gpu", "value": free_gpus}
            )
        numa_of_gpu = {g.uuid: g.numa_node for g in nvml.gpus if isinstance(g, FakeGpu)}
        for pod in host.pods:
            ctr = pod.containers[0]
            ids = {
                "node": node.name,
                "namespace": pod.namespace,
                "pod": pod.name,
                "pod_uid": pod.uid,
            }
            cpus = parse_id_list(ctr.cpus)
            cpu_nodes = {i for i, n in enumerate(host.nodes) if parse_id_list(n.cpus) & cpus}
            memory = sum(ctr.memory_by_node.values())
            remote = sum(v for i, v in ctr.memory_by_node.items() if i not in cpu_nodes)
            # the exporter's verdicts: CPUs across nodes (exclusive ones only), memory
            # away from them (>= 0.3 of >= 64 MiB)
            reasons = []
            if ctr.exclusive_cpus and len(cpu_nodes) > 1:
                reasons.append("cpu_span")
            if memory >= 64 << 20 and remote >= 0.3 * memory:
                reasons.append("memory_remote")
            for reason in reasons:
                row = {**ids, "reason": reason, "value": 1}
                rows["cross_numa_sustained"].append(row)
                rows["cross_numa_seen"].append(row)
                rows["cross_numa_age"].append({**row, "value": 1})
            for uuid in ctr.devices.get("nvidia.com/gpu", []):
                rows["holders"].append(
                    {
                        **ids,
                        "gpu_uuid": uuid,
                        "numa_node": numa_of_gpu[uuid],
                        "resource": "nvidia.com/gpu",
                        "source": "kubelet",
                        "value": 1,
                    }
                )
                if ctr.exclusive_cpus and numa_of_gpu[uuid] not in cpu_nodes:
                    row = {**ids, "reason": "device_remote", "value": 1}
                    rows["cross_numa_sustained"].append(row)
                    rows["cross_numa_seen"].append(row)
                    rows["cross_numa_age"].append({**row, "value": 1})
            for i in cpu_nodes:
                in_zone = len(cpus & parse_id_list(host.nodes[i].cpus))
                if ctr.exclusive_cpus:
                    rows["pod_exclusive_cpus"].append({**ids, "numa_node": i, "value": in_zone})
            for i, size in ctr.memory_by_node.items():
                rows["pod_memory"].append({**ids, "numa_node": i, "value": size})
            kind = protected.get(pod.uid, "")
            stem = sim.workload[pod.uid]
            template = pod_template(pod, stem)
            placement = placement_of(template["spec"])
            infos[pod.uid] = PodInfo(
                namespace=pod.namespace,
                name=pod.name,
                uid=pod.uid,
                node=node.name,
                created=now - 3600,
                owner_kind="" if kind == "bare" else "ReplicaSet",
                owner_name="" if kind == "bare" else f"{stem}-preset",
                workload="" if kind == "bare" else f"Deployment/{pod.namespace}/{stem}",
                annotations={"numaguard.io/remediate": "false"} if kind == "opted-out" else {},
                resources=frozenset(ctr.devices),
                placement=placement,
                requests=placement.requests,
                selector={**template["metadata"]["labels"], "pod-template-hash": PRESET_HASH},
            )
    instances = {n: f"{n}:9847" for n in sim.nodes}
    return as_signals(now, rows, instances), infos


async def run_scenario(
    cp: ControlPlane,
    seed: int,
    nodes: int,
    policies: tuple[str, ...],
    cycles: int = 6,
    steer: bool = False,
) -> dict:
    with tempfile.TemporaryDirectory(prefix="ng", dir="/tmp") as tmp:
        sim, protecting = scenario(cp, tmp, seed, nodes, policies)
        await sim.start()
        try:
            protected = {pod.uid: kind for pod, kind in protecting}
            async with Remediator(cp, Path(tmp), steer) as remediator:
                return await run_cycles(sim, protected, cycles, remediator)
        finally:
            await sim.stop()


class Remediator:
    """The remediator's API client (admin: the decisions, not the RBAC, are measured
    here) and, steering, its webhook served on 127.0.0.1 with its configuration kept
    by the actuator as ``run --steer`` keeps it."""

    def __init__(self, cp: ControlPlane, directory: Path, steer: bool) -> None:
        self.cp, self.directory, self.steering = cp, directory, steer
        self.target: Target | None = None

    async def __aenter__(self) -> Remediator:
        self.stack = contextlib.AsyncExitStack()
        kubeconfig = self.cp.kubeconfig(self.directory / "admin.kubeconfig", self.cp.admin_token)
        client = await api_client(kubeconfig)
        self.stack.push_async_callback(client.close)
        self.kube = Kube(client)
        self.actuator = Actuator(self.kube, None, dry_run=False)
        if self.steering:
            material = steering.certificate(["127.0.0.1"])
            port = free_port()
            runner = await steering.serve(material, "127.0.0.1", port)
            self.stack.push_async_callback(runner.cleanup)
            self.target = Target(
                "numaguard-remediator", material["ca.crt"], url=f"https://127.0.0.1:{port}"
            )
            # nothing left steered for the next scenario
            self.stack.push_async_callback(
                self.actuator.steer, self.target, time.time(), (), frozenset()
            )
        return self

    async def __aexit__(self, *exc) -> None:
        await self.stack.aclose()

    async def steer(self, pod: PodInfo, nodes: tuple[str, ...]) -> None:
        if self.target is None:
            return
        entry = Steer(pod.workload, pod.selector, nodes, False, time.time() + 3600)
        result = await self.actuator.steer(self.target, time.time(), (entry,))
        assert result == "ok", result


async def evict(sim: SimulatedCluster, pod: PodInfo) -> str:
    """Evict through the Eviction API; return once the replacement was admitted or
    refused by its node, or the scheduler found no node for it: the node it was bound
    to ("" for none)."""
    status = await sim.cp.evict(sim.session, pod.namespace, pod.name, pod.uid)
    assert status == 201, f"eviction of {pod.namespace}/{pod.name}: HTTP {status}"
    app = pod.workload.split("/")[-1]
    landed: list[str] = []

    async def replaced(session) -> bool:
        pods = await sim.cp.items(session, "Pod", pod.namespace, labelSelector=f"app={app}")
        for p in pods:
            status = p["status"]
            scheduled = {c["type"]: c for c in status.get("conditions", [])}.get("PodScheduled")
            if p["metadata"]["uid"] == pod.uid:
                continue
            if status.get("phase") in ("Running", "Failed") or (
                scheduled and scheduled.get("reason") == "Unschedulable"
            ):
                landed.append(p["spec"].get("nodeName", ""))
                return True
        return False

    await sim.wait_for_api(replaced, f"{pod.name} replaced")
    return landed[0]


async def run_cycles(
    sim: SimulatedCluster, protected: dict[str, str], cycles: int, remediator: Remediator
) -> dict:
    # as the controller runs it: a cooldown of two cycles after each eviction, growing
    # when the fix did not hold, and given up after two that did not
    policy = Policy(
        dry_run=False,
        min_pod_age_seconds=0,
        cooldown_seconds=120,
        max_per_cycle=20,
        max_per_node=2,
        max_per_namespace=2,
        give_up_after=2,
    )
    history: dict[str, WorkloadHistory] = {}
    state = FindingState()
    now = time.time()
    first_seen: dict[str, int] = {}  # workload -> cycle its finding was first open
    fixed_at: dict[str, int] = {}
    evictions = violations = planned = first = 0
    remediable: set[str] = set()
    for cycle in range(cycles):
        at = now + cycle * 60
        signals, infos = observe(sim, protected, at)
        state = update(state, signals)
        findings = list(state.open.values())
        open_workloads = {infos[f.pod_uid].workload or f.pod_uid for f in findings}
        for w in open_workloads:
            first_seen.setdefault(w, cycle)
        for w in set(first_seen) - open_workloads - set(fixed_at):
            fixed_at[w] = cycle
        for w, h in list(history.items()):  # the verifier, one cycle later
            for pending in h.pending:
                outcome = "did_not_hold" if w in open_workloads else "held"
                history[w] = h = after_verification(h, pending, outcome)
        prepared = prepare(findings, signals, policy)
        wanted = nodes_to_check(findings, infos, prepared, policy)
        nodes = await nodes_of(remediator.kube, wanted)
        result = plan(findings, infos, signals, policy, history, at, nodes, prepared)
        no_fit = {r.finding.pod_uid for r in result.refusals if r.guard == "no_fit"}
        # advised, not acted on: a pod of the shared CPU pool has no placement to fix
        advised = {a.finding.pod_uid for a in result.actions if a.kind == "recommend"}
        for f in findings:
            if f.pod_uid not in protected and f.pod_uid not in no_fit | advised:
                remediable.add(infos[f.pod_uid].workload)
        for action in result.actions:
            if action.kind != "evict":
                continue
            if action.pod.uid in protected:
                violations += 1
                continue
            await remediator.steer(action.pod, action.nodes)
            landed = await evict(sim, action.pod)
            planned += landed in action.nodes
            first += landed == action.nodes[0]
            evictions += 1
            w = action.pod.workload
            history[w] = after_action(history.get(w), action, "evicted", at)
    fixed_in_3 = sum(1 for w in remediable if w in fixed_at and fixed_at[w] - first_seen[w] <= 3)
    return {
        "remediable": len(remediable),
        "fixed_in_3": fixed_in_3,
        "evictions": evictions,
        "violations": violations,
        "landed_planned": planned,
        "landed_first": first,  # on the node of the zone the plan counted as taken
    }


async def measure(suite) -> dict[bool, dict[str, int]]:
    """Totals over the suite without steering (False) and with it (True)."""
    totals = {steer: dict.fromkeys(KEYS, 0) for steer in (False, True)}
    async with ControlPlane() as cp:
        async with aiohttp.ClientSession() as session:  # the steering configuration
            await cp.install_numaguard(session)
        for seed, nodes, policies in suite:
            for steer in (False, True):
                result = await run_scenario(cp, seed, nodes, policies, steer=steer)
                for k, v in result.items():
                    totals[steer][k] += v
    return totals


KEYS = ("remediable", "fixed_in_3", "evictions", "violations", "landed_planned", "landed_first")


def rows() -> list[tuple]:
    suite = [
        (1, 3, ("single-numa-node",)),
        (2, 4, ("single-numa-node", "restricted")),
        (3, 4, ("single-numa-node", "best-effort")),
        (4, 5, ("single-numa-node", "none")),
    ]
    totals = asyncio.run(measure(suite))

    def share(t: dict, part: str, whole: str) -> float:
        return t[part] / t[whole] if t[whole] else 1.0

    off, on = totals[False], totals[True]
    landed = share(on, "landed_planned", "evictions")
    violations = off["violations"] + on["violations"]
    return [
        (
            f"remediable findings fixed within 3 cycles ({len(suite)} scenarios)",
            share(on, "fixed_in_3", "remediable"),
            share(off, "fixed_in_3", "remediable"),
            None,
        ),
        (
            "evictions per fix",
            share(on, "evictions", "fixed_in_3"),
            share(off, "evictions", "fixed_in_3"),
            None,
        ),
        (
            "replacements on a planned node",
            landed,
            share(off, "landed_planned", "evictions"),
            (">= 0.95", landed >= 0.95),
        ),
        (
            "replacements on the plan's first node",
            share(on, "landed_first", "evictions"),
            share(off, "landed_first", "evictions"),
            None,
        ),
        (
            "guard violations (actions on protected pods)",
            on["violations"],
            off["violations"],
            ("== 0", violations == 0),
        ),
    ]


def main() -> None:
    print(f"{'measure':<46}{'steered':>10}{'unsteered':>11}  target")
    for name, steered, unsteered, target in rows():
        verdict = f"{target[0]}: {'met' if target[1] else 'NOT met'}" if target else ""
        print(f"{name:<46}{steered:>10.2f}{unsteered:>11.2f}  {verdict}")


if __name__ == "__main__":
    main()
