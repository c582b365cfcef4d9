"""Alerts end to end: the exporter on the simulated GPU node, a real Prometheus
evaluating numaguard's rules (with short windows), a real Alertmanager delivering to a
webhook this test serves. And the example Alertmanager configuration is valid."""

from __future__ import annotations

import asyncio
import shutil
import subprocess
from pathlib import Path

import pytest
from aiohttp import web

from alerts import rules
from numaguard.remediator.core.queries import Windows
from numaguard.simulator.cluster.simulated import one_node
from numaguard.simulator.fakes import presets
from numaguard.simulator.parts.alertmanager import AlertmanagerServer
from numaguard.simulator.parts.processes import free_port
from numaguard.simulator.parts.prometheus import VERSIONS, PrometheusServer

pytestmark = [pytest.mark.prometheus, pytest.mark.cluster]


def test_the_example_alertmanager_config_is_valid():
    example = Path(rules.ROOT) / "alerts" / "alertmanager.example.yml"
    check = subprocess.run(
        [shutil.which("amtool") or "amtool", "check-config", str(example)],
        capture_output=True,
        text=True,
    )
    assert check.returncode == 0, check.stdout + check.stderr


@pytest.mark.parametrize("version", VERSIONS)
async def test_an_alert_reaches_a_webhook_through_alertmanager(tmp_path, control_plane, version):
    received: list[dict] = []
    got = asyncio.Event()

    async def webhook(request: web.Request) -> web.Response:
        received.append(await request.json())
        got.set()
        return web.Response()

    app = web.Application()
    app.router.add_post("/hook", webhook)
    runner = web.AppRunner(app)
    await runner.setup()
    hook_port = free_port()
    await web.TCPSite(runner, "127.0.0.1", hook_port).start()

    host, nvml = presets.gpu_node()
    rule_file = tmp_path / "rules.yml"
    rule_file.write_text(rules.rules_yaml(Windows("5s", "5s")))
    config = {
        "route": {
            "receiver": "hook",
            "group_by": ["alertname"],
            "group_wait": "1s",
            "group_interval": "1s",
            "repeat_interval": "1h",
        },
        "receivers": [
            {"name": "hook", "webhook_configs": [{"url": f"http://127.0.0.1:{hook_port}/hook"}]}
        ],
    }
    try:
        async with (
            AlertmanagerServer(config, free_port()) as am,
            one_node(control_plane, host, nvml) as (_, url),
            PrometheusServer(
                [url.removeprefix("http://")],
                free_port(),
                rule_files=[str(rule_file)],
                version=version,
                alertmanagers=[am.url.removeprefix("http://")],
            ),
        ):
            while True:
                await asyncio.wait_for(got.wait(), 60)
                got.clear()
                alerts = [a for m in received for a in m["alerts"]]
                if any(a["labels"]["alertname"] == "NumaguardPodCrossNUMA" for a in alerts):
                    break
    finally:
        await runner.cleanup()
    (alert,) = [
        a
        for a in alerts
        if a["labels"]["alertname"] == "NumaguardPodCrossNUMA" and a["status"] == "firing"
    ][:1]
    assert alert["labels"]["pod"] == "trainer-remote"
    assert alert["labels"]["reason"] == "device_remote"
    assert alert["labels"]["severity"] == "info"  # one per pod: the low-noise route
    assert alert["annotations"]["summary"] == (
        "Pod ml/trainer-remote is placed across NUMA nodes (device_remote)"
    )
    assert alert["annotations"]["runbook_url"].endswith("/docs/runbooks/NumaguardPodCrossNUMA.md")
