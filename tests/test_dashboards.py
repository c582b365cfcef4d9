"""The Grafana dashboards: generated files current, sound structure (datasource and
filter variables, a unit on every panel), every query parses and names only catalogue
metrics or our recording rules, and every panel returns data from a real Prometheus
scraping the demo's simulated GPU node and a remediator."""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import shutil
import sys
import tempfile

import pytest

from alerts import rules
from grafana import dashboards
from numaguard.contract.catalogue import CATALOGUE, series_names
from numaguard.exporter.readers.nvml import sysfs_pci_address
from numaguard.exporter.server import serve
from numaguard.exporter.settings import Settings
from numaguard.remediator.core.queries import Windows
from numaguard.simulator.cluster.simulated import SimulatedCluster
from numaguard.simulator.demos import exporter_view as demo
from numaguard.simulator.fakes.gpu_exporter import fake_gpus
from numaguard.simulator.fakes.resctrl import FakeResctrl
from numaguard.simulator.parts.processes import free_port, until, wait_ok
from numaguard.simulator.parts.prometheus import VERSIONS, PrometheusServer
from tests.helpers.promql import metric_names, panels, substituted

pytestmark = [pytest.mark.prometheus, pytest.mark.cluster]

UNITS = {"bytes", "Bps", "percentunit", "s", "short", "watt", "celsius"}


def test_generated_dashboards_are_current():
    for name, text in dashboards.files().items():
        assert (dashboards.HERE / name).read_text() == text, "run: make docs"


def test_dashboards_are_sound():
    for name in dashboards.files():
        d = json.loads((dashboards.HERE / name).read_text())
        variables = [v["name"] for v in d["templating"]["list"]]
        assert variables[0] == "datasource"
        used = {  # Grafana's own ($__rate_interval) aside
            m
            for p in d["panels"]
            for t in p["targets"]
            for m in re.findall(r"\$(\w+)", t["expr"])
            if not m.startswith("__")
        }
        assert used <= set(variables), (name, used - set(variables))
        for p in d["panels"]:
            assert p["fieldConfig"]["defaults"]["unit"] in UNITS, (name, p["title"])
            assert p["datasource"]["uid"] == "${datasource}"
            assert p["targets"] and p["title"]


def test_every_query_parses_and_names_known_metrics():
    """Catalogue metrics an exporter exports by default, or our recording rules; a
    detail metric only in a panel whose title says it needs the exporter's --detail
    (the alerts and the remediator never read one)."""
    known = series_names() | set(rules.RECORDING) | {"up"}
    detail = {name for spec in CATALOGUE.values() if spec.detail for name in spec.series}
    for d, p in panels():
        names = metric_names(substituted(p.expr))
        allowed = known | detail if "--detail" in p.title else known
        assert names and names <= allowed, (d.uid, p.title, names - allowed)
        if "--detail" in p.title:
            assert names & detail, (d.uid, p.title, "says --detail but needs none")


def test_runbooks_link_to_dashboards():
    uids = {d.uid for d in dashboards.DASHBOARDS}
    for a in rules.ALERTS:
        assert a.dashboard in uids, a.name
        assert f"/d/{a.dashboard}" in rules.runbook(a)


@pytest.fixture
async def scraped(tmp_path, control_plane):
    """The demo node (plus an A100 without GPM) served in-process, a remediator in
    dry-run, both scraped by a real Prometheus of each major with numaguard's rules: one
    stack, since only the rules' evaluation and the queries differ by major."""
    host, nvml = demo.demo_node()
    host.threads_per_core = 2  # its pods' exclusive CPUs then share cores (no full-pcpus-only)
    host.kubelet_config["cpuManagerPolicyOptions"] = {"prefer-align-cpus-by-uncorecache": "true"}
    a100 = nvml.add_gpu("A100-40GB", 1, ["3g.20gb", "3g.20gb"])
    host.pci_devices[sysfs_pci_address(a100.pci_bus_id)] = 1
    cp = control_plane
    short = tempfile.mkdtemp(prefix="ng", dir="/tmp")  # unix socket paths are short
    sim = SimulatedCluster(short, cp)
    node = sim.add_node(demo.NODE, host, nvml, "single-numa-node")
    await sim.start()
    root = node.root
    kernel = FakeResctrl(root.root, host).write()
    exporter_kubeconfig, kubeconfig = (
        cp.kubeconfig(tmp_path / account, cp.tokens[account], account)
        for account in ("numaguard-exporter", "numaguard-remediator")
    )
    rule_file = tmp_path / "rules.yml"
    rule_file.write_text(rules.rules_yaml(Windows("3s", "3s")))
    exporter_port, remediator_port = free_port(), free_port()
    prom_ports = {version: free_port() for version in VERSIONS}
    stop = asyncio.Event()
    restore = contextlib.ExitStack()  # the NVML library this process had before
    restore.enter_context(fake_gpus(node.description).installed())
    exporter = asyncio.create_task(
        serve(
            Settings(
                host_root=str(root.root),
                host="127.0.0.1",
                port=exporter_port,
                node_name=demo.NODE,
                interval_seconds=1,
                kubeconfig=exporter_kubeconfig,
                resctrl_ops=kernel,
                pod_resources_socket=node.kubelet.socket_path,
            ),
            stop,
        )
    )

    async def life():
        tick = 0
        while True:
            demo.advance(host, kernel, tick)
            root.write()
            kernel.write()
            tick += 1
            await asyncio.sleep(1)

    ticker = asyncio.create_task(life())
    remediator = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "numaguard.remediator",
        "run",
        "--prometheus",
        f"http://127.0.0.1:{prom_ports[VERSIONS[0]]}",  # the remediator asks one of them
        "--kubeconfig",
        kubeconfig,
        "--interval",
        "1",
        "--finding-window",
        "3s",
        "--min-pod-age",
        "0",
        "--listen",
        f"127.0.0.1:{remediator_port}",
        "--lease-namespace",
        "numaguard",
        "--log-level",
        "error",
    )
    try:
        await wait_ok(f"http://127.0.0.1:{exporter_port}/readyz")
        await wait_ok(f"http://127.0.0.1:{remediator_port}/healthz")
        async with contextlib.AsyncExitStack() as servers:
            targets = [f"127.0.0.1:{exporter_port}", f"127.0.0.1:{remediator_port}"]
            proms = {
                version: await servers.enter_async_context(
                    PrometheusServer(
                        targets, prom_ports[version], rule_files=[str(rule_file)], version=version
                    )
                )
                for version in VERSIONS
            }
            for prom in proms.values():
                await prom.wait_for('numaguard_remediator_actions_total{result="dry_run"} > 0', 120)
            yield proms
    finally:  # each step whatever the one before did: a node left behind spoils the rest
        async with contextlib.AsyncExitStack() as cleanup:
            cleanup.callback(shutil.rmtree, short, ignore_errors=True)
            cleanup.push_async_callback(sim.stop)
            cleanup.callback(restore.close)
            remediator.terminate()
            await remediator.wait()
            ticker.cancel()
            stop.set()
            await exporter


async def panels_without_data(prom: PrometheusServer) -> list[str]:
    """Of the panels an exporter's defaults feed: one that says it needs --detail has
    none here, as on most installs (test_gpu_links checks the pairs it shows)."""
    return [
        f"{d.uid}: {p.title}: {p.expr}"
        for d, p in panels()
        if "--detail" not in p.title and not await prom.query(substituted(p.expr))
    ]


async def test_every_panel_returns_data_on_each_prometheus_major(scraped):
    for version, prom in scraped.items():
        # rates need a second scrape and rules a first evaluation: a while after the
        # first action every panel has data; what still has none after a minute is named
        async def answered(prom=prom) -> bool:
            return not await panels_without_data(prom)

        with contextlib.suppress(AssertionError):
            await until(answered, "every panel answering", 60, every=1)
        empty = await panels_without_data(prom)
        assert not empty, f"panels without data on Prometheus {version}:\n" + "\n".join(empty)


def test_variables_are_chained_and_every_query_is_scoped_as_fleets_need():
    """cluster, then the exporters' job, then node, namespace, pod, each listing only
    what the ones before it chose; every exporter query scoped by job and cluster, the
    remediator's by cluster; rates over Grafana's $__rate_interval."""
    for name in dashboards.files():
        d = json.loads((dashboards.HERE / name).read_text())
        variables = [v for v in d["templating"]["list"] if v["type"] == "query"]
        order = [v["name"] for v in variables]
        assert order[0] == "cluster", name
        for i, v in enumerate(variables[1:], 1):
            query = v["query"]["query"]
            for before in order[:i]:
                assert f'{before}=~"${before}"' in query, (name, v["name"], query)
        for p in d["panels"]:
            for t in p["targets"]:
                expr = t["expr"]
                assert 'cluster=~"$cluster"' in expr, (name, p["title"])
                if "numaguard_remediator_" not in expr:
                    assert 'job=~"$job"' in expr, (name, p["title"])
                assert not re.search(r"rate\([^)]*\[\d+[smh]\]\)", expr), (name, expr)
