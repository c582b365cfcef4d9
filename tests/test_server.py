"""The daemon: endpoints, formats, readiness, a hung collector, and clean shutdown."""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil
import pytest
from aiohttp.test_utils import TestClient, TestServer

from numaguard.common import webconfig
from numaguard.exporter.collection import Collection
from numaguard.exporter.collectors import COLLECTORS
from numaguard.exporter.server import STUCK_CYCLES, Exporter
from numaguard.exporter.settings import Settings
from numaguard.exporter.sources.cgroups import CgroupSource
from numaguard.exporter.sources.host import HostSource
from numaguard.simulator.fakes import presets
from numaguard.simulator.fakes.host import FakeContainer, FakeHostRoot, FakePod
from numaguard.simulator.parts.processes import exporter_process, get, log_of, until
from tests.conftest import NODE, TMPFS, samples, series


class HangingSource:
    """A source stuck in the kernel: read() blocks until released."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.calls = 0

    def read(self, *_inputs):
        self.calls += 1
        self.release.wait(30)
        raise OSError("released")


async def test_hung_collector_never_blocks_metrics(fake_root):
    root = fake_root(presets.two_socket())
    hanging = HangingSource()
    collection = Collection(
        NODE,
        {"host_numa": HostSource(str(root.root)), "pod_placement": hanging},
        timeout_seconds=0.3,
    )
    exporter = Exporter(Settings(interval_seconds=0.2, collector_timeout_seconds=0.3), collection)
    async with TestClient(TestServer(exporter.app)) as client:
        assert (await client.get("/readyz")).status == 503
        assert (await client.get("/metrics")).status == 503
        loop_task = asyncio.create_task(exporter.run_cycles())
        try:
            timeouts = series(
                "numaguard_collector_errors_total", collector="pod_placement", reason="timeout"
            )

            async def served_past_two_timeouts():  # cycles went on with the source hung
                started = time.monotonic()
                response = await client.get("/metrics")
                took = time.monotonic() - started
                body = await response.read()
                served = response.status == 200 and samples(body).get(timeouts, 0) >= 2
                return served and (response, took, body)

            response, took, body = await until(
                served_past_two_timeouts, "two cycles past the hung read served", 30
            )
            calls_while_hung = hanging.calls
            hanging.release.set()  # the stuck read returns; the next cycle reads afresh

            async def read_again():
                return hanging.calls >= 2

            await until(read_again, "the source read again once released", 30)
        finally:
            hanging.release.set()
            loop_task.cancel()
            await asyncio.gather(loop_task, return_exceptions=True)
            # let the released worker thread finish before the test ends
            await asyncio.gather(*collection.in_flight(), return_exceptions=True)
    assert response.status == 200
    assert took < 0.5
    got = samples(body)
    assert got[series("numaguard_collector_success", collector="pod_placement")] == 0
    assert (
        got[series("numaguard_collector_errors_total", collector="pod_placement", reason="timeout")]
        >= 2
    )
    assert got[series("numaguard_collector_success", collector="host_numa")] == 1
    assert got[series("numaguard_numa_node_memory_total_bytes", numa_node="1")] > 0
    # the stuck read was not started again while it was still running, and was once done
    assert calls_while_hung == 1
    assert hanging.calls >= 2


async def test_a_read_stuck_for_three_cycles_fails_healthz_naming_its_collector(fake_root):
    root = fake_root(presets.two_socket())
    hanging = HangingSource()
    now = [1000.0]
    collection = Collection(
        NODE,
        {"host_numa": HostSource(str(root.root)), "pod_placement": hanging},
        timeout_seconds=0.05,
        monotonic=lambda: now[0],
    )
    settings = Settings(interval_seconds=15, collector_timeout_seconds=0.05)
    exporter = Exporter(settings, collection)
    limit = STUCK_CYCLES * 15 + 0.05
    try:
        async with TestClient(TestServer(exporter.app)) as client:
            await collection.run_once()  # the read times out and keeps hanging
            now[0] += limit - 1
            assert (await client.get("/healthz")).status == 200  # slow, not yet stuck
            now[0] += 2
            stuck = await client.get("/healthz")
            assert stuck.status == 500
            assert (await stuck.text()).startswith("pod_placement: a read has not returned")
            hanging.release.set()  # the kernel answers at last
            await asyncio.gather(*collection.in_flight(), return_exceptions=True)
            assert (await client.get("/healthz")).status == 200
    finally:
        hanging.release.set()
        await asyncio.gather(*collection.in_flight(), return_exceptions=True)


async def test_an_empty_host_root_is_not_ready_and_says_what_is_missing(tmp_path):
    (tmp_path / "proc").mkdir()  # a /proc, but neither /sys tree
    root = str(tmp_path)
    collection = Collection(
        NODE, {"host_numa": HostSource(root), "pod_placement": CgroupSource(root)}
    )
    await collection.run_once()
    exporter = Exporter(Settings(host_root=root), collection)
    async with TestClient(TestServer(exporter.app)) as client:
        ready = await client.get("/readyz")
        assert ready.status == 503
        assert await ready.text() == (
            f"--host-root {root} has no sys/devices/system/node, sys/fs/cgroup: "
            "point it at the host's /\n"
        )
        got = samples(await (await client.get("/metrics")).read())
    # no pods because there is nowhere to look is a failure, not an empty node
    assert got[series("numaguard_collector_success", collector="pod_placement")] == 0
    errors = "numaguard_collector_errors_total"
    assert got[series(errors, collector="pod_placement", reason="missing")] == 1
    assert got[series("numaguard_collector_success", collector="host_numa")] == 0


async def test_formats_and_compression(fake_root):
    root = fake_root(presets.two_socket())
    collection = Collection(
        NODE,
        {"host_numa": HostSource(str(root.root)), "pod_placement": CgroupSource(str(root.root))},
    )
    await collection.run_once()
    exporter = Exporter(Settings(), collection)
    async with TestClient(TestServer(exporter.app)) as client:
        plain = await client.get("/metrics", headers={"Accept-Encoding": "identity"})
        assert plain.headers["Content-Type"].startswith("text/plain; version=0.0.4")
        text = await plain.read()
        om = await client.get(
            "/metrics", headers={"Accept": "application/openmetrics-text; version=1.0.0"}
        )
        assert om.headers["Content-Type"].startswith("application/openmetrics-text")
        om_text = await om.text()
        assert om_text.endswith("# EOF\n")
        assert "# UNIT numaguard_numa_node_memory_total_bytes bytes" in om_text
        gz = await client.get(
            "/metrics", headers={"Accept-Encoding": "gzip"}, auto_decompress=False
        )
        assert gz.headers["Content-Encoding"] == "gzip"
        assert gzip.decompress(await gz.read()) == text
        assert (await client.get("/healthz")).status == 200
        assert (await client.get("/readyz")).status == 200


async def test_q_zero_refuses_and_gzip_is_made_once_in_the_cycle_or_a_thread(
    fake_root, monkeypatch
):
    root = fake_root(presets.two_socket())
    collection = Collection(NODE, {"host_numa": HostSource(str(root.root))})
    await collection.run_once()
    compressed_in = []
    real_compress = gzip.compress

    def compress(data, level):
        compressed_in.append(threading.current_thread())
        return real_compress(data, level)

    monkeypatch.setattr(gzip, "compress", compress)
    exporter = Exporter(Settings(), collection)
    async with TestClient(TestServer(exporter.app)) as client:
        refused = await client.get(
            "/metrics",
            headers={
                "Accept-Encoding": "gzip;q=0, identity",
                "Accept": "application/openmetrics-text;q=0",
            },
            auto_decompress=False,
        )
        assert "Content-Encoding" not in refused.headers
        assert refused.headers["Content-Type"].startswith("text/plain; version=0.0.4")
        assert await refused.read() == collection.exposition.text
        wanted = [
            client.get(
                "/metrics",
                headers={"Accept-Encoding": "deflate, gzip;q=0.5"},
                auto_decompress=False,
            )
            for _ in range(5)
        ]
        for response in await asyncio.gather(*wanted):
            assert response.headers["Content-Encoding"] == "gzip"
            assert gzip.decompress(await response.read()) == collection.exposition.text
        assert len(compressed_in) == 1  # once for the cycle, however many asked at once
        # what was asked gzipped is made in the next cycle, before anyone asks
        await collection.run_once()
        assert len(compressed_in) == 2
        again = await client.get("/metrics", headers={"Accept-Encoding": "gzip"})
        assert await again.read() == collection.exposition.text
        assert len(compressed_in) == 2
    assert threading.main_thread() not in compressed_in


async def test_a_slow_client_is_let_go_and_others_are_served(fake_root):
    """A client that trickles a request's headers (slowloris), and one that connects and
    says nothing, are closed after --web.idle-timeout; scrapes are answered meanwhile.
    And the exporter raised its open-files limit to the hard limit."""
    root = fake_root(presets.two_socket())
    args = ("--host-root", str(root.root), "--node-name", NODE, "--gpu-backend", "none")
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    started_with = (shutil.which("prlimit") or "prlimit", f"--nofile=1024:{hard}")
    idle = ("--web.idle-timeout", "1")
    async with exporter_process(*args, *idle, wrapper=started_with) as (url, proc):
        host, port = url.removeprefix("http://").split(":")
        slow = await asyncio.open_connection(host, int(port))
        silent = await asyncio.open_connection(host, int(port))
        loop = asyncio.get_running_loop()
        started = loop.time()

        async def trickle():
            _, writer = slow
            for byte in b"GET /metrics HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"a" * 200:
                writer.write(bytes([byte]))
                await writer.drain()
                await asyncio.sleep(0.05)

        trickling = asyncio.create_task(trickle())
        try:
            assert (await get(f"{url}/metrics")).startswith(b"# HELP")
            for reader, _ in (silent, slow):
                assert await asyncio.wait_for(reader.read(), 30) == b""  # closed by the server
            assert loop.time() - started < 10  # long before the trickle would have ended
        finally:
            trickling.cancel()
            await asyncio.gather(trickling, return_exceptions=True)
            for _, writer in (slow, silent):
                writer.close()
        limits = Path(f"/proc/{proc.pid}/limits").read_text()
        (line,) = [line for line in limits.splitlines() if line.startswith("Max open files")]
        assert line.split()[3:5] == [str(hard), str(hard)]  # from a soft 1024


async def test_1100_idle_connections_under_a_1024_file_limit_starve_nothing(fake_root):
    """Past --web.max-connections the longest-held idle connection makes room: with
    1,100 clients connected and silent, a scrape is answered, the exporter holds no more
    connections than its bound allows nor more kernel files kept open than half its
    limit, and the collectors still open every file they read."""
    root = fake_root(presets.two_socket())
    args = ("--host-root", str(root.root), "--node-name", NODE, "--gpu-backend", "none")
    args += ("--interval", "0.2", "--web.max-connections", "256")
    limited = (shutil.which("prlimit") or "prlimit", "--nofile=1024:1024")
    async with exporter_process(*args, wrapper=limited) as (url, proc):
        host, port = url.removeprefix("http://").split(":")
        crowd = [await asyncio.open_connection(host, int(port)) for _ in range(1100)]
        try:
            got = samples(await get(f"{url}/metrics"))
            assert got[series("numaguard_collector_success", collector="pod_placement")] == 1
            errors = "numaguard_collector_errors_total"
            assert got[series(errors, collector="pod_placement", reason="io")] == 0
            links = []
            for fd in os.listdir(f"/proc/{proc.pid}/fd"):
                with contextlib.suppress(FileNotFoundError):  # closed since the listing
                    links.append(os.readlink(f"/proc/{proc.pid}/fd/{fd}"))
            sockets = [link for link in links if link.startswith("socket:")]
            kept = [link for link in links if link.startswith(str(root.root))]
            assert len(sockets) < 256 + 16  # the bound, the listener, the loop's
            assert 0 < len(kept) <= 1024 // 2
            assert len(links) < 1024 - 64
        finally:
            for _, writer in crowd:
                writer.close()


async def test_cli_serves_and_stops_cleanly_on_sigterm(fake_root):
    root = fake_root(presets.two_socket())
    env = {**os.environ, "NODE_NAME": "ignored"}
    args = ("--host-root", str(root.root), "--node-name", "n1", "--interval", "0.5")
    async with exporter_process(*args, env=env) as (url, proc):
        body = (await get(f"{url}/metrics")).decode()
        assert 'numaguard_numa_node_info{node="n1",numa_node="0",cpulist="0-15"} 1' in body
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=10)
    stderr = log_of(proc)
    assert code == 0, stderr
    lines = [json.loads(line) for line in stderr.splitlines()]
    assert lines[-1]["message"] == "shutting down"
    assert all({"time", "level", "logger", "message"} <= set(line) for line in lines)


def test_help_explains_every_flag():
    out = subprocess.run(
        [sys.executable, "-m", "numaguard.exporter", "--help"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    for flag in (
        "--host-root",
        "--listen",
        "--node-name",
        "--interval",
        "--log-format",
        "--kubeconfig",
        "--collector-timeout",
        "--memory-remote-threshold",
        "--resctrl-mode",
        *(f"--collector.{name}" for name in COLLECTORS),
        *(f"--no-collector.{name}" for name in COLLECTORS),
    ):
        assert flag in out


def test_bad_flags_fail_with_a_clear_message(tmp_path):
    garbage = tmp_path / "kubeconfig"
    garbage.write_text("clusters: [\n")
    for args, message in (
        (["--listen", "nonsense"], "--listen wants HOST:PORT"),
        (["--host-root", str(tmp_path / "nope")], "is not a directory"),
        (["--interval", "-1"], "must be positive"),
        (["--kubeconfig", str(tmp_path / "none")], "is not a file"),
        (
            ["--kubeconfig", str(garbage), "--listen", "127.0.0.1:0"],
            "cannot talk to the API server",
        ),
    ):
        run = subprocess.run(
            [sys.executable, "-m", "numaguard.exporter", *args], capture_output=True, text=True
        )
        assert run.returncode == 2
        assert message in run.stderr


def test_remediator_prints_help():
    run = subprocess.run(
        [sys.executable, "-m", "numaguard.remediator.cli", "--help"], capture_output=True, text=True
    )
    assert run.returncode == 0
    assert "dry-run" in run.stdout


def in_memory(size: int) -> str | None:
    """The tmpfs fake roots go to, if it has ``size`` bytes free; else None."""
    if TMPFS is None:
        return None
    shm = os.statvfs(TMPFS)
    return TMPFS if shm.f_bavail * shm.f_frsize >= size else None


def crowded(pods: int):
    """two_socket's node with that many more burstable pods, one container each."""
    host = presets.two_socket()
    for i in range(pods):
        name = f"crowd-{i}"
        ctr = FakeContainer("c", "0-31", {0: 64 << 20}, throttling=(10, 1, 0.1))
        host.pods.append(FakePod(name, presets.pod_uid(name), "burstable", [ctr], "crowd"))
    return host


@pytest.mark.scale
async def test_the_cardinality_guard_holds_20000_pods_within_the_memory_limit():
    """Past --max-pods no pod is read: node-wide series and numaguard_series_limited 1,
    logged once, and the exporter stays far inside the DaemonSet's 256 MiB limit."""
    host = crowded(20_000)
    # its 200,000 files are removed here, not left for a later session's pytest to
    # remove from its kept temporary folders; in memory where there is room (on a disk
    # they take minutes to write and remove)
    with tempfile.TemporaryDirectory(prefix="ng-crowd", dir=in_memory(2 << 30)) as folder:
        root = FakeHostRoot(f"{folder}/host", host).write()
        args = ("--host-root", str(root.root), "--node-name", NODE, "--gpu-backend", "none")
        async with exporter_process(*args, "--interval", "0.5") as (url, proc):
            for _ in range(3):  # a few cycles, each listing the 20,000 pods
                got = samples(await get(f"{url}/metrics"))
            rss = psutil.Process(proc.pid).memory_info().rss
    assert got[series("numaguard_series_limited")] == 1
    assert got[series("numaguard_numa_node_info", numa_node="1", cpulist="16-31")] == 1
    assert not [k for k in got if "pod_uid" in dict(k[1])]
    assert got[series("numaguard_collector_success", collector="pod_placement")] == 1
    assert rss < 256 << 20, rss >> 20
    assert log_of(proc).count("more than --max-pods") == 1


async def test_under_the_guard_nothing_is_left_out(fake_root):
    root = fake_root(presets.two_socket())
    collection = Collection(NODE, {"pod_placement": CgroupSource(str(root.root), max_pods=1000)})
    await collection.run_once()
    got = samples(collection.exposition.text)
    assert got[series("numaguard_series_limited")] == 0
    assert [k for k in got if "pod_uid" in dict(k[1])]


async def test_collectors_turned_off_are_not_run(fake_root):
    """--no-collector.<name>: that collector is not run and has no health series; the
    others run as before."""
    root = fake_root(presets.two_socket())
    args = ("--host-root", str(root.root), "--node-name", NODE, "--interval", "0.2")
    off = ("--no-collector.resctrl", "--no-collector.gpu", "--no-collector.pod_resources")
    async with exporter_process(*args, *off) as (url, _):
        got = samples(await get(f"{url}/metrics"))
    ran = {
        dict(k[1])["collector"]: v for k, v in got.items() if k[0] == "numaguard_collector_success"
    }
    assert ran == {"host_numa": 1, "pod_placement": 1}
    resctrl = {k: v for k, v in got.items() if k[0].startswith(("numaguard_l3_", "numaguard_res"))}
    assert resctrl == {  # it says it is off, and nothing else of it shows
        series("numaguard_resctrl_available"): 0,
        series("numaguard_resctrl_mode_info", mode="off"): 1,
    }
    assert got[series("numaguard_numa_node_memory_total_bytes", numa_node="0")] > 0
    assert got[series("process_open_fds")] > 0  # the process's own, always


def test_process_metrics_agree_with_psutil_and_count_every_open_file(tmp_path):
    """process_* as psutil sees this process; the descriptor count by /proc/self/fd's
    size (or a listing) follows files opened and closed."""
    from numaguard.common.process import ProcessCollector

    def values() -> dict[str, float]:
        return {
            s.name: s.value for m in ProcessCollector(registry=None).collect() for s in m.samples
        }

    me = psutil.Process()
    before = values()
    assert before["process_open_fds"] == me.num_fds() - 1  # psutil's listing holds one
    assert before["process_max_fds"] == resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    assert before["process_start_time_seconds"] == pytest.approx(me.create_time(), abs=0.02)
    assert abs(before["process_resident_memory_bytes"] - me.memory_info().rss) < 8 << 20
    cpu = me.cpu_times()
    assert before["process_cpu_seconds_total"] <= cpu.user + cpu.system + 0.02
    fds = [os.open(tmp_path, os.O_RDONLY) for _ in range(500)]
    try:
        assert values()["process_open_fds"] == before["process_open_fds"] + 500
    finally:
        for fd in fds:
            os.close(fd)
    assert values()["process_open_fds"] == before["process_open_fds"]


def test_failed_accepts_are_said_once_a_minute_with_how_many_were_not(caplog):
    """asyncio tells the loop's exception handler of every accept that fails for want of
    descriptors: 718,079 lines in 100 s were seen. Said once per minute, with a count;
    anything else still reaches the handler that was there."""
    loop = asyncio.new_event_loop()
    others: list[dict] = []
    loop.set_exception_handler(lambda _, context: others.append(context))
    now = [0.0]
    webconfig.quiet_accept_errors(loop, every=60.0, clock=lambda: now[0])
    failed = {"message": webconfig.ACCEPT_FAILED, "exception": OSError(24, "Too many open files")}
    try:
        with caplog.at_level("ERROR", logger="numaguard.common.webconfig"):
            for _ in range(5000):
                loop.call_exception_handler(failed)
                now[0] += 0.01  # 50 s of a failed accept every 10 ms
            now[0] += 11.0  # a minute after the first was said
            loop.call_exception_handler(failed)
            loop.call_exception_handler({"message": "something else"})
    finally:
        loop.close()
    said = [r for r in caplog.records if r.name == "numaguard.common.webconfig"]
    assert [r.unsaid for r in said] == [0, 4999]
    assert "Too many open files" in said[0].getMessage()
    assert [c["message"] for c in others] == ["something else"]
