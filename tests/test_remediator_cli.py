"""``numaguard-remediator``'s command line: ``run`` finds its kubeconfig as kubectl does,
refuses to start without one and rides out an API server that does not answer yet; a
mistaken flag, setting or selector is answered with what to write instead."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys

import pytest

from numaguard.common.apiserver import find_kubeconfig
from numaguard.simulator.parts.processes import free_port


def run(tmp_path, *args: str, **env: str) -> subprocess.CompletedProcess:
    clean = {
        k: v for k, v in os.environ.items() if k not in ("KUBECONFIG", "KUBERNETES_SERVICE_HOST")
    }
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "numaguard.remediator",
            "run",
            "--listen",
            f"127.0.0.1:{free_port()}",
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=60,
        env={**clean, "HOME": str(tmp_path), **env},
    )


def test_the_kubeconfig_is_found_as_kubectl_finds_it(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("KUBECONFIG", raising=False)
    assert find_kubeconfig(None) is None
    home = tmp_path / ".kube" / "config"
    home.parent.mkdir()
    home.write_text("{}")
    assert find_kubeconfig(None) == str(home)
    monkeypatch.setenv("KUBECONFIG", f"/etc/a.yaml{os.pathsep}/etc/b.yaml")
    assert find_kubeconfig(None) == "/etc/a.yaml"
    assert find_kubeconfig("/given") == "/given"


def test_run_without_any_kubeconfig_refuses_to_start(tmp_path):
    done = run(tmp_path, "--no-dry-run")
    assert done.returncode == 2
    assert "no kubeconfig ($KUBECONFIG, ~/.kube/config) and not in a cluster" in done.stderr


def test_a_kubeconfig_that_is_not_there_is_said_so(tmp_path):
    missing = str(tmp_path / "nowhere.yaml")
    done = run(tmp_path, KUBECONFIG=missing)
    assert done.returncode == 2
    assert f"{missing}: no such file (--kubeconfig or $KUBECONFIG)" in done.stderr
    assert "current-context" not in done.stderr


async def test_run_rides_out_an_api_server_that_does_not_answer_yet(tmp_path):
    """An API server down for a while (restarting, not yet reachable): `run` asks again
    with backoff, saying so, instead of exiting into a crash loop; it starts once the
    server answers, and SIGTERM meanwhile stops it cleanly."""
    from aiohttp import web

    port = free_port()
    config = tmp_path / "kubeconfig"
    config.write_text(
        '{"apiVersion": "v1", "kind": "Config", "current-context": "c",'
        f' "clusters": [{{"name": "c", "cluster": {{"server": "http://127.0.0.1:{port}"}}}}],'
        ' "users": [{"name": "u", "user": {"token": "t"}}],'
        ' "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}]}'
    )
    env = {k: v for k, v in os.environ.items() if k != "KUBERNETES_SERVICE_HOST"}
    argv = [sys.executable, "-m", "numaguard.remediator", "run", "--listen"]
    argv += [f"127.0.0.1:{free_port()}", "--prometheus", f"http://127.0.0.1:{free_port()}"]

    async def started(env: dict) -> asyncio.subprocess.Process:
        return await asyncio.create_subprocess_exec(*argv, env=env, stderr=asyncio.subprocess.PIPE)

    async def line_with(proc, text: str) -> str:
        while True:
            line = (await asyncio.wait_for(proc.stderr.readline(), 60)).decode()
            assert line, f"exited before saying {text!r}"
            if text in line:
                return line

    proc = await started({**env, "KUBECONFIG": str(config)})  # found through $KUBECONFIG
    try:
        said = json.loads(await line_with(proc, "does not answer"))
        assert said["message"].startswith("the API server does not answer (")
        assert said["retry_seconds"] == 1
        proc.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(proc.wait(), 30) == 0
        # again; the server comes up while it waits
        proc = await started({**env, "KUBECONFIG": str(config)})
        await line_with(proc, "does not answer")
        app = web.Application()

        async def version(_):
            return web.json_response({"gitVersion": "v1.37.2"})

        app.router.add_get("/version", version)
        runner = web.AppRunner(app)
        await runner.setup()
        try:
            await web.TCPSite(runner, "127.0.0.1", port).start()
            await line_with(proc, "remediator started")
            proc.send_signal(signal.SIGTERM)
            assert await asyncio.wait_for(proc.wait(), 30) == 0
        finally:
            await runner.cleanup()
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


@pytest.mark.parametrize(
    "args, said",
    [
        (
            ["--prometheus", "localhost:9090"],
            "argument --prometheus: 'localhost:9090' is no http(s) URL: give the scheme too, "
            "e.g. http://localhost:9090",
        ),
        (
            ["--selector", "job=numaguard,cluster=~gpu-.*"],
            'quote each value, job="numaguard",cluster=~"gpu-.*"',
        ),
        (
            ["--enforce", "oversized=act"],
            "undersized and oversized slices are enforced together, as mis_sized: give "
            "mis_sized=act",
        ),
        (
            ["--min-fix-gain", "mis_sized=1.2"],
            "a resize's gain is set per direction: give undersized=1.2 and/or oversized=1.2",
        ),
    ],
)
def test_a_mistaken_flag_is_answered_with_what_to_write(tmp_path, args, said):
    done = run_plan(tmp_path, *args)
    assert done.returncode == 2
    assert said in done.stderr, done.stderr
    # the subcommand's own usage, not the top level's
    assert done.stderr.startswith("usage: numaguard-remediator plan ")


def test_every_misspelt_setting_is_named_with_the_one_meant(tmp_path):
    config = tmp_path / "config.yaml"
    config.write_text("policy:\n  max_per_nod: 3\ndetection:\n  low_utilisation: 0.2\n")
    done = run_plan(tmp_path, "--config", str(config))
    assert done.returncode == 2
    assert (
        f"{config}: policy.max_per_nod: no such setting (did you mean max_per_node?); "
        "detection.low_utilisation: no such setting (did you mean low_utilization?)"
    ) in done.stderr


def run_plan(tmp_path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "numaguard.remediator", "plan", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "HOME": str(tmp_path)},
    )


@pytest.mark.prometheus
def test_a_selector_that_matches_no_exporter_is_said(tmp_path):
    """`plan --selector 'job="nope"'` against a Prometheus scraping no such job: not a
    quiet "0 findings", but a warning naming the selector and how to find the right one."""
    from numaguard.simulator.parts.prometheus import PrometheusServer

    async def plan() -> subprocess.CompletedProcess:
        async with PrometheusServer([], free_port()) as prom:
            return await asyncio.to_thread(
                run_plan, tmp_path, "--prometheus", prom.url, "--selector", 'job="nope"'
            )

    done = asyncio.run(plan())
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(
        'warning: no exporter target matches the selector job="nope": no finding can be made'
    )
    assert "count by (job) (numaguard_build_info)" in done.stdout
