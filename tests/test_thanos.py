"""numaguard on the metrics engine fleets run: the real Prometheus Operator shards the
exporters' targets over two Prometheus servers and runs each twice (HA replicas, told
apart by ``prometheus_replica``), all with the external label ``cluster``; a Thanos
sidecar beside each and Thanos Query over the sidecars, deduplicating the replicas
(tests/thanos/go.mod). The remediator reads the querier as it reads one Prometheus:

* its plan through Thanos is its plan against one Prometheus holding the same series
  (the operator's configuration of an unsharded Prometheus, beside the shards);
* HA pairs count once: no doubled verdict, target or zone capacity;
* a shard down is no smaller cluster: nothing is acted on on its nodes;
* two clusters in one view: each remediator acts on its own cluster's pods only, even
  where the other's node and pod names are the same; one told no cluster acts on none;
* the dashboards' panels and the alerts the shards evaluate say through the querier
  what they say on one Prometheus.
"""

from __future__ import annotations

import contextlib
import hashlib
import time
from pathlib import Path

import aiohttp
import pytest
import pytest_asyncio
import yaml
from aiohttp import web

from numaguard.remediator.controller import Controller
from numaguard.remediator.core.actions import Plan
from numaguard.remediator.core.policy import Policy
from numaguard.remediator.core.queries import RECORDED, Windows
from numaguard.remediator.kube import Kube, api_client
from numaguard.remediator.signals import Prometheus, Source
from numaguard.simulator.cluster.simulated import SimulatedCluster
from numaguard.simulator.fakes import presets
from numaguard.simulator.parts.controlplane import ControlPlane, path_of, rendered
from numaguard.simulator.parts.operator import PrometheusOperator, prometheus_resource
from numaguard.simulator.parts.processes import free_port, until
from numaguard.simulator.parts.prometheus import PrometheusServer, built_prometheus3
from numaguard.simulator.parts.thanos import Query, Sidecar
from tests.helpers.operator import JOB, MONITORING, WINDOW, quick
from tests.helpers.promql import panels as dashboard_panels
from tests.helpers.promql import substituted

pytestmark = [
    pytest.mark.prometheus,
    pytest.mark.cluster,
    pytest.mark.asyncio(loop_scope="module"),
]

CLUSTER, OTHER = "gpu-east", "gpu-west"
SHARDS, REPLICAS = 2, 2
REPLICA_LABEL = "prometheus_replica"  # the operator's default replicaExternalLabelName
NODES = {"gpu-a": 0, "gpu-b": 1}  # each node's exporter, in the shard that scrapes it


def shard_of(address: str, shards: int = SHARDS) -> int:
    """The shard the operator's configuration gives a target: Prometheus' hashmod
    relabelling of its address (the low 8 bytes of its MD5, big-endian, modulo)."""
    return int.from_bytes(hashlib.md5(address.encode()).digest()[8:], "big") % shards


def port_in_shard(address: str, shard: int) -> int:
    """A free port of ``address`` that puts a target there in ``shard``."""
    while True:
        port = free_port(address)
        if shard_of(f"{address}:{port}") == shard:
            return port


def sharded(cp: ControlPlane, token: Path, version: str) -> dict:
    """kube-prometheus-stack's Prometheus, sharded and replicated as a fleet runs it,
    with its cluster's external label. Its pods never run (the test runs the servers),
    so they are kept off the simulated nodes."""
    obj = prometheus_resource(cp, MONITORING, "k8s", token, version)
    obj["spec"] |= {
        "shards": SHARDS,
        "replicas": REPLICAS,
        "replicaExternalLabelName": REPLICA_LABEL,
        "externalLabels": {"cluster": CLUSTER},
        "nodeSelector": {"numaguard.test/prometheus": "run-by-the-test"},
    }
    return obj


class Fleet:
    """Two GPU nodes, one per shard, each running the exporter; the four Prometheus
    servers the operator configures, their sidecars and the querier; one unsharded
    Prometheus beside them; and another cluster's Prometheus and sidecar."""

    def __init__(self) -> None:
        self.exit = contextlib.AsyncExitStack()  # closed whether start got far or not

    async def start(self, cp: ControlPlane, directory: Path) -> Fleet:
        self.cp, self.directory = cp, directory
        self.session = await self.exit.enter_async_context(aiohttp.ClientSession())
        operator = PrometheusOperator(cp, directory)
        operator.start()
        self.exit.callback(operator.stop)
        if await cp.get(self.session, "Namespace", None, MONITORING) is None:
            namespace = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": MONITORING}}
            await cp.create(self.session, namespace)
        monitoring = ("Service", "ServiceMonitor", "PrometheusRule")
        objects = quick([o for o in rendered() if o["kind"] in monitoring])
        token = directory / "prometheus.token"
        token.write_text(cp.admin_token)
        version = built_prometheus3().name.removeprefix("prometheus-")
        single = prometheus_resource(cp, MONITORING, "single", token, version)
        objects += [sharded(cp, token, version), single]
        for obj in objects:
            await cp.create(self.session, obj)
        self.exit.push_async_callback(self._delete, objects)

        self.sim = SimulatedCluster(str(directory / "cluster"), cp)
        for index, name in enumerate(NODES):
            host, nvml = presets.gpu_node(node_id=index + 1)
            for pod in host.pods:  # pods are unique per cluster: a namespace per node
                pod.namespace = f"team-{name}"
                pod.uid = presets.pod_uid(f"{name}/{pod.name}")
            self.sim.add_node(name, host, nvml, "single-numa-node")
            self.sim.node_pools[f"team-{name}"] = name
        self.sim.demand["trainer-remote"] = 0.8
        await self.sim.start()
        self.exit.push_async_callback(self.sim.stop)
        account = "numaguard-exporter"
        kubeconfig = cp.kubeconfig(directory / "exporter.kubeconfig", cp.tokens[account], account)
        self.exporters = await self.sim.run_exporter_daemonset(
            self.exit,
            kubeconfig,
            "--interval",
            "1",
            port_of=lambda address, node: port_in_shard(address, NODES[node]),
        )

        def complete(config: dict) -> bool:
            jobs = {job["job_name"] for job in config.get("scrape_configs", [])}
            return JOB in jobs and bool(config.get("rule_files"))

        self.shards: dict[tuple[int, int], PrometheusServer] = {}
        self.sidecars: dict[tuple[int, int], Sidecar] = {}
        for shard in range(SHARDS):
            for replica in range(REPLICAS):
                config = await operator.generated(
                    self.session, MONITORING, "k8s", complete, shard=shard, replica=replica
                )
                prom = await self.exit.enter_async_context(
                    PrometheusServer([], free_port(), version="3", config_file=str(config))
                )
                sidecar = await Sidecar(prom.url, prom.data).start()
                self.exit.callback(sidecar.stop)
                self.shards[shard, replica], self.sidecars[shard, replica] = prom, sidecar
        config = await operator.generated(self.session, MONITORING, "single", complete)
        self.single = await self.exit.enter_async_context(
            PrometheusServer([], free_port(), version="3", config_file=str(config))
        )
        self.other = await self._other_cluster()
        endpoints = [s.grpc_address for s in (*self.sidecars.values(), self.other)]
        self.query = await Query(endpoints, REPLICA_LABEL).start()
        self.exit.callback(self.query.stop)
        account = "numaguard-remediator"
        remediator = cp.kubeconfig(directory / "remediator.kubeconfig", cp.tokens[account], account)
        self.client = await api_client(remediator)
        self.exit.push_async_callback(self.client.close)
        return self

    async def _other_cluster(self) -> Sidecar:
        """Another cluster's Prometheus (external label cluster=gpu-west) and sidecar. Its
        exporter, on a node named as this cluster's gpu-a, says that gpu-a's aligned
        trainer — same namespace, name and uid as here — hangs off the far socket."""

        async def metrics(_: web.Request) -> web.Response:
            return web.Response(text=other_exposition())

        app = web.Application()
        app.router.add_get("/metrics", metrics)
        runner = web.AppRunner(app)
        await runner.setup()
        port = free_port()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        self.exit.push_async_callback(runner.cleanup)
        config = self.directory / "other.yaml"
        config.write_text(
            yaml.safe_dump(
                {
                    "global": {
                        "scrape_interval": "1s",
                        "evaluation_interval": "1s",
                        "external_labels": {"cluster": OTHER, REPLICA_LABEL: "other-0"},
                    },
                    "scrape_configs": [
                        {
                            "job_name": "numaguard",
                            "honor_labels": True,
                            "static_configs": [{"targets": [f"127.0.0.1:{port}"]}],
                        }
                    ],
                }
            )
        )
        prom = await self.exit.enter_async_context(
            PrometheusServer([], free_port(), version="3", config_file=str(config))
        )
        sidecar = await Sidecar(prom.url, prom.data).start()
        self.exit.callback(sidecar.stop)
        return sidecar

    def remediator(self, url: str, cluster: str = "") -> Controller:
        prometheus = Prometheus(
            url, self.session, Source(cluster=cluster), windows=Windows(WINDOW, WINDOW)
        )
        policy = Policy(dry_run=True, min_pod_age_seconds=0, stale_after_seconds=10)
        return Controller(prometheus, Kube(self.client), policy)

    async def _delete(self, objects: list[dict]) -> None:
        for obj in objects:
            meta = obj["metadata"]
            path = path_of(obj["kind"], meta.get("namespace"), meta["name"])
            await self.cp.request(self.session, "DELETE", path)


def other_exposition() -> str:
    """What the other cluster's exporter on its node gpu-a says, now."""
    node = 'node="gpu-a"'
    uid = presets.pod_uid("gpu-a/trainer-aligned")
    pod = f'{node},namespace="team-gpu-a",pod="trainer-aligned",pod_uid="{uid}"'
    now = time.time()
    lines = [f'numaguard_build_info{{{node},version="0.1.0",python_version="3.11"}} 1']
    for collector in ("host_numa", "pod_placement", "gpu", "pod_resources"):
        c = f'{node},collector="{collector}"'
        lines += [
            f"numaguard_collector_success{{{c}}} 1",
            f"numaguard_collector_last_success_timestamp_seconds{{{c}}} {now - 1:.3f}",
        ]
    for reason, value in (("cpu_span", 0), ("memory_remote", 0), ("device_remote", 1)):
        lines.append(f'numaguard_pod_cross_numa{{{pod},reason="{reason}"}} {value}')
    return "\n".join(lines) + "\n"


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def fleet(tmp_path_factory, control_plane):
    f = Fleet()
    try:
        await f.start(control_plane, tmp_path_factory.mktemp("thanos"))
        yield f
    finally:
        await f.exit.aclose()


def summary(report) -> dict:
    """What a cycle decided, comparable between two engines."""
    plan = report.plan or Plan((), (), ())
    return {
        "error": report.error,
        "findings": sorted((f.kind, f.node, f.namespace, f.pod, f.reason) for f in report.findings),
        "actions": sorted((a.kind, a.pod.namespace, a.pod.name) for a in plan.actions),
        "refusals": sorted((r.finding.pod, r.guard) for r in plan.refusals),
    }


EVERY_TRAINER = [("team-gpu-a", "trainer-remote"), ("team-gpu-b", "trainer-remote")]


def evictions(report) -> list[tuple[str, str]]:
    """The pods a cycle's plan evicts (a dry run's, said once, are planned every cycle)."""
    actions = report.plan.actions if report.plan else ()
    return sorted((a.pod.namespace, a.pod.name) for a in actions if a.kind == "evict")


async def evicting_every_trainer(controller: Controller) -> None:
    """Until a cycle of ``controller`` plans to evict both nodes' cross-NUMA trainers."""

    last = {}

    async def planned() -> bool:
        report = await controller.cycle()
        last["cycle"] = summary(report)
        return evictions(report) == EVERY_TRAINER

    try:
        await until(planned, "both trainers' evictions planned", 90, every=1)
    except AssertionError as e:
        raise AssertionError(f"{e}; the last cycle: {last}") from None


async def query(url: str, expr: str, **params: str) -> list[dict]:
    """An instant query of any engine speaking the Prometheus HTTP API."""
    async with (
        aiohttp.ClientSession() as session,
        session.get(f"{url}/api/v1/query", params={"query": expr, **params}) as r,
    ):
        body = await r.json()
    assert body.get("status") == "success", body
    return body["data"]["result"]


def values(result: list[dict], *labels: str) -> dict[tuple, str]:
    return {tuple(r["metric"].get(k, "") for k in labels): r["value"][1] for r in result}


async def test_each_node_is_scraped_by_its_shard_twice_and_counted_once(fleet):
    for (shard, replica), prom in fleet.shards.items():
        got = await prom.wait_for('up{job="numaguard"} == 1')
        assert sorted(r["metric"]["node"] for r in got) == [
            n for n, s in NODES.items() if s == shard
        ], (shard, replica)
    # through the querier: each target once, with its cluster, the replicas merged
    ours = f'cluster="{CLUSTER}"'

    async def both_targets():
        got = await query(fleet.query.url, f"numaguard_build_info{{{ours}}}")
        return got if len(got) == len(NODES) else None

    targets = await until(both_targets, "both targets through Thanos", 60, every=0.5)
    assert sorted(t["metric"]["node"] for t in targets) == sorted(NODES)
    assert not [t for t in targets if REPLICA_LABEL in t["metric"]]
    every = await query(fleet.query.url, f"numaguard_build_info{{{ours}}}", dedup="false")
    assert len(every) == REPLICAS * len(NODES)
    # zone capacity once: as the unsharded Prometheus holds it
    free = "sum by (node, numa_node) (numaguard_zone_cpus_allocatable{%s})"
    await fleet.single.wait_for(f"count({free % ''}) == 4")  # both nodes scraped
    assert values(await query(fleet.query.url, free % ours), "node", "numa_node") == values(
        await query(fleet.single.url, free % ""), "node", "numa_node"
    )


async def test_the_plan_through_thanos_is_the_plan_against_one_prometheus(fleet):
    thanos = fleet.remediator(fleet.query.url, CLUSTER)
    single = fleet.remediator(fleet.single.url)
    for controller in (thanos, single):
        await evicting_every_trainer(controller)
    # the findings sustained on both: two remediators started together (a slice's
    # sizing is looked at every few cycles) decide the same, cycle after cycle
    thanos, single = fleet.remediator(fleet.query.url, CLUSTER), fleet.remediator(fleet.single.url)
    for _ in range(3):
        through, alone = [summary(await c.cycle()) for c in (thanos, single)]
        assert through == alone
    assert not through["error"] and ("evict", "team-gpu-b", "trainer-remote") in through["actions"]
    kinds = {f[0] for f in through["findings"]}
    assert {"cross_numa", "starved", "oversized"} <= kinds, through
    # the recording rules each shard evaluates are found through the querier too
    recorded = await thanos.prometheus.recorded(time.time())
    assert recorded == await single.prometheus.recorded(time.time()) == frozenset(RECORDED)


# what the querier adds to every series: the shards' external labels (the replica
# label is deduplicated away); the unsharded Prometheus answers without them
EXTERNAL = ("cluster", "prometheus")


def label_sets(result: list[dict]) -> set[frozenset]:
    return {frozenset((k, v) for k, v in r["metric"].items() if k not in EXTERNAL) for r in result}


async def test_every_dashboard_panel_through_thanos_is_what_one_prometheus_says(fleet):
    """Each panel's query with the dashboard's cluster variable set to this cluster: the
    same series through the querier as from the unsharded Prometheus (there, with no
    cluster label, the variable's All), and data wherever that has data."""

    async def differing() -> list[str]:
        out = []
        for d, p in dashboard_panels():
            through = await query(fleet.query.url, substituted(p.expr.replace("$cluster", CLUSTER)))
            alone = await query(fleet.single.url, substituted(p.expr))
            if label_sets(through) != label_sets(alone):
                out.append(f"{d.uid}: {p.title}: {len(through)} vs {len(alone)} series")
        return out

    async def agreeing() -> bool:
        return not await differing()

    with contextlib.suppress(AssertionError):  # rates need two scrapes through both
        await until(agreeing, "every panel agreeing", 60, every=1)
    assert await differing() == []
    # not vacuous: most panels have data (the rest are the remediator's own)
    answered = [
        p
        for _, p in dashboard_panels()
        if await query(fleet.query.url, substituted(p.expr.replace("$cluster", CLUSTER)))
    ]
    assert len(answered) >= len(list(dashboard_panels())) // 2


async def test_the_alerts_the_shards_evaluate_are_the_unsharded_ones(fleet):
    """The PrometheusRule the operator gives every shard: the alerts pending or firing
    through the querier, for this cluster, are those of the unsharded Prometheus."""
    alerts = "ALERTS{%s}"

    async def alerting(url: str, matcher: str) -> set[frozenset]:
        """Each alert's labels, its state aside (two servers move to firing apart)."""
        sets = label_sets(await query(url, alerts % matcher))
        return {frozenset(x for x in s if x[0] != "alertstate") for s in sets}

    async def same() -> bool:
        alone = await alerting(fleet.single.url, "")
        return bool(alone) and await alerting(fleet.query.url, f'cluster="{CLUSTER}"') == alone

    await until(same, "the same alerts through Thanos as from one Prometheus", 90, every=1)
    names = {dict(s)["alertname"] for s in await alerting(fleet.single.url, "")}
    assert "NumaguardPodCrossNUMA" in names, names


async def test_two_clusters_in_one_view_each_remediator_acts_on_its_own(fleet):
    """The other cluster says this cluster's aligned trainer on gpu-a (same node name,
    namespace, pod name and uid) is cross-NUMA: scoped to this cluster, the remediator
    never sees it; scoped to none, it sees two clusters and acts on nothing."""
    aligned = ("team-gpu-a", "trainer-aligned")
    await until(
        lambda: query(fleet.query.url, f'numaguard_pod_cross_numa{{cluster="{OTHER}"}} == 1'),
        "the other cluster's verdict through Thanos",
        60,
        every=0.5,
    )
    ours = fleet.remediator(fleet.query.url, CLUSTER)
    await evicting_every_trainer(ours)
    report = await ours.cycle()
    assert aligned not in {(f.namespace, f.pod) for f in report.findings}
    unscoped = await fleet.remediator(fleet.query.url).cycle()
    assert not unscoped.plan and not unscoped.findings
    assert unscoped.error.startswith("clusters: the exporters' series come from 2 clusters")
    assert f"{CLUSTER!r}, {OTHER!r}" in unscoped.error


async def test_another_cluster_s_recording_rules_never_silence_this_one(fleet):
    """This cluster's shards run numaguard's recording rules, the other cluster's server
    none; the querier lists the rules to both. Read as if the other's ran them, its
    records would be empty: its remediator would find nothing, and say nothing."""
    west = fleet.remediator(fleet.query.url, OTHER)
    east = fleet.remediator(fleet.query.url, CLUSTER)

    async def east_reads_its_records() -> bool:
        return await east.prometheus.recorded(time.time()) == frozenset(RECORDED)

    await until(east_reads_its_records, "this cluster's records through Thanos", 60, every=1)
    assert await west.prometheus.recorded(time.time()) == frozenset()
    aligned = ("cross_numa", "gpu-a", "team-gpu-a", "trainer-aligned", "device_remote")

    async def found() -> bool:
        report = await west.cycle()
        return aligned in {(f.kind, f.node, f.namespace, f.pod, f.reason) for f in report.findings}

    await until(found, "the other cluster's finding, evaluated directly", 90, every=1)


async def test_a_shard_down_is_no_smaller_cluster(fleet):
    """Both replicas of gpu-b's shard gone (servers and sidecars). While the querier
    still counts them, it cannot answer whole: each cycle ends with no action, saying
    which store did not answer. Once its health checks have dropped them, it answers
    without gpu-b: nothing is acted on there, and gpu-a's finding is still fixed."""
    thanos = fleet.remediator(fleet.query.url, CLUSTER)
    await evicting_every_trainer(thanos)
    down = NODES["gpu-b"]
    for replica in range(REPLICAS):
        fleet.sidecars[down, replica].stop()
        fleet.shards[down, replica].stop()
    report = await thanos.cycle()
    assert report.plan is None and report.error.startswith("query: ")
    assert "prometheus-k8s-shard-1-" in report.error and "connection refused" in report.error
    await fleet.query.wait_for_endpoints(len(fleet.sidecars) + 1 - REPLICAS)
    for _ in range(3):
        report = await thanos.cycle()
        assert not report.error
        assert {f.node for f in report.findings} == {"gpu-a"}
        assert evictions(report) == [("team-gpu-a", "trainer-remote")]
