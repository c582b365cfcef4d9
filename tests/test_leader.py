"""Lease leader election against the real API server, as the remediator's ServiceAccount
with deploy/'s Role, through the real client and a fault proxy, on fake clocks: one
holder at a time, takeover only after the Lease was *seen* unchanged for its duration, a
leader that cannot renew stops before anyone may take over, clock skew, release on
shutdown, a lost write race (the server's 409), the pause switch, and the shipped
settings keeping one stable leader between two replicas."""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import pytest

from numaguard.remediator.kube import Kube, api_client
from numaguard.remediator.leader import LeaderElector
from numaguard.simulator.parts.controlplane import ControlPlane, path_of
from numaguard.simulator.parts.faultproxy import FaultProxy
from numaguard.simulator.parts.processes import free_port, until

pytestmark = pytest.mark.cluster

NAMESPACE = "numaguard"  # where deploy/'s Role lets the remediator keep its Lease
LEASE = path_of("Lease", NAMESPACE, "lease")


class Clocks:
    """A shared monotonic clock and per-replica wall clocks (which may be skewed)."""

    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now

    def wall(self, skew: float = 0.0):
        return lambda: 1_800_000_000.0 + self.now + skew


@dataclass
class Server:
    cp: ControlPlane
    proxy: FaultProxy
    session: aiohttp.ClientSession

    async def lease(self) -> dict:
        """The Lease as the API server has it now ({} when there is none)."""
        return await self.cp.get(self.session, "Lease", NAMESPACE, "lease") or {}


@pytest.fixture
async def kube(tmp_path, control_plane):
    cp = control_plane
    async with cp.fault_proxy() as proxy, aiohttp.ClientSession() as session:
        account = "numaguard-remediator"
        kubeconfig = cp.kubeconfig(
            tmp_path / "kubeconfig", cp.tokens[account], account, server=proxy.url
        )
        client = await api_client(kubeconfig)
        try:
            yield Server(cp, proxy, session), Kube(client)
        finally:
            await client.close()
            await cp.request(session, "DELETE", LEASE)


def elector(kube, clocks, identity, skew=0.0, **timing) -> LeaderElector:
    settings = {"lease_duration": 15, "renew_deadline": 10, "retry_period": 2, **timing}
    return LeaderElector(
        kube,
        NAMESPACE,
        "lease",
        identity,
        clock=clocks.wall(skew),
        monotonic=clocks.monotonic,
        **settings,
    )


async def test_one_leader_and_takeover_only_after_an_observed_expiry(kube):
    api, k = kube
    t = Clocks()
    a, b = elector(k, t, "a"), elector(k, t, "b")
    assert await a.try_acquire_or_renew()
    assert not await b.try_acquire_or_renew()
    assert a.leading and not b.leading
    # a renews every 2 s up to t=1006, then dies; b tries every 2 s all along
    taken_at = None
    while taken_at is None and t.now < 1100:
        t.now += 2
        if t.now <= 1006:
            assert await a.try_acquire_or_renew()
        if await b.try_acquire_or_renew():
            taken_at = t.now
        if t.now == 1016:  # a's renew deadline has passed: it no longer writes
            assert not a.leading
    # b saw the Lease change last at 1006: it waits the whole 15 s from then
    assert taken_at == 1022
    lease = await api.lease()
    assert lease["spec"]["holderIdentity"] == "b" and lease["spec"]["leaseTransitions"] == 1
    assert not await a.try_acquire_or_renew()  # a is back: it follows


async def test_a_follower_with_a_clock_ahead_does_not_depose_a_healthy_leader(kube):
    _, k = kube
    t = Clocks()
    a = elector(k, t, "a")
    ahead = elector(k, t, "b", skew=20.0)  # its wall clock runs 20 s ahead
    assert await a.try_acquire_or_renew()
    for _ in range(30):  # a minute of renewals every 2 s
        t.now += 2
        assert await a.try_acquire_or_renew()
        assert not await ahead.try_acquire_or_renew()
    assert a.leading and not ahead.leading


async def test_a_leader_that_cannot_renew_stops_before_anyone_takes_over(kube):
    api, k = kube
    t = Clocks()
    a, b = elector(k, t, "a"), elector(k, t, "b")
    assert await a.try_acquire_or_renew()
    assert not await b.try_acquire_or_renew()
    api.proxy.fail_next(500, times=100)  # the API server fails a's renewals
    stopped = taken = None
    for step in range(1, 20):
        t.now += 1
        await a.try_acquire_or_renew()
        if stopped is None and not a.leading:
            stopped = step
    api.proxy.clear()
    for step in range(1, 20):
        if await b.try_acquire_or_renew():
            taken = step
            break
        t.now += 1
    assert stopped == 10  # the renew deadline
    # b last saw a change 19 s ago: it may take the Lease, a has long stopped writing
    assert taken == 1


async def test_a_leader_out_of_descriptors_gives_the_lease_up(kube):
    """Seen: a leader whose descriptors a crowd of idle connections took kept renewing on
    a connection it held open, while it could reach neither Prometheus nor its webhook's
    callers; the standby never took over. Now, a renew deadline without a new
    connection, it releases the Lease and takes it no more until it can connect."""
    api, k = kube
    t = Clocks()
    connectable = [True]
    a = elector(k, t, "a", can_connect=lambda: connectable[0])
    b = elector(k, t, "b")
    assert await a.try_acquire_or_renew()
    connectable[0] = False
    for _ in range(4):  # 8 s: still within its renew deadline, still renewing
        t.now += 2
        assert await a.try_acquire_or_renew()
        assert not await b.try_acquire_or_renew()
    t.now += 2
    assert not await a.try_acquire_or_renew() and not a.leading
    assert (await api.lease())["spec"]["holderIdentity"] == ""
    assert await b.try_acquire_or_renew()  # at once: no expiry to wait for
    t.now += 60
    assert not await a.try_acquire_or_renew()
    connectable[0] = True
    assert not await a.try_acquire_or_renew()  # b holds it now
    assert (await api.lease())["spec"]["holderIdentity"] == "b"


async def test_release_on_shutdown_lets_a_successor_take_over_at_once(kube):
    api, k = kube
    t = Clocks()
    a, b = elector(k, t, "a"), elector(k, t, "b")
    assert await a.try_acquire_or_renew()
    assert not await b.try_acquire_or_renew()
    await a.release()
    assert not a.leading
    assert (await api.lease())["spec"]["holderIdentity"] == ""
    assert await b.try_acquire_or_renew()


async def test_a_stale_write_loses_and_the_pause_switch_survives(kube):
    api, k = kube
    t = Clocks()
    b = elector(k, t, "b")
    assert await b.try_acquire_or_renew()
    lease = await api.lease()
    stale = {**lease, "metadata": {**lease["metadata"], "resourceVersion": "1"}}
    assert (await b.writer.put(LEASE, stale)).status == 409  # the real optimistic concurrency
    paused = {"metadata": {"annotations": {"numaguard.io/paused": "true"}}}
    await api.cp.patch(api.session, "Lease", NAMESPACE, "lease", paused)  # an operator's
    t.now += 2
    assert await b.try_acquire_or_renew() and b.paused
    t.now += 2
    assert await b.try_acquire_or_renew() and b.paused


def shipped_timing() -> dict:
    """The leader-election flags of the shipped remediator Deployment."""
    text = (Path(__file__).parent.parent / "deploy/base/remediator-deployment.yaml").read_text()
    flags = dict(re.findall(r"--(lease-duration|renew-deadline|retry-period)=([0-9.]+)", text))
    assert len(flags) == 3, "the Deployment sets all three"
    return {
        "lease_duration": float(flags["lease-duration"]),
        "renew_deadline": float(flags["renew-deadline"]),
        "retry_period": float(flags["retry-period"]),
    }


async def test_two_replicas_with_the_shipped_settings_keep_one_leader(kube):
    api, k = kube
    t = Clocks()
    timing = shipped_timing()
    replicas = [elector(k, t, "a", **timing), elector(k, t, "b", skew=20, **timing)]
    holders = []
    # ten minutes; each replica tries every retry period whatever its cycle is doing
    for _ in range(int(600 / timing["retry_period"])):
        for r in replicas:
            await r.try_acquire_or_renew()
        leading = [r.identity for r in replicas if r.leading]
        assert len(leading) == 1
        holders.append(leading[0])
        t.now += timing["retry_period"]
    assert set(holders) == {"a"}
    assert (await api.lease())["spec"]["leaseTransitions"] == 0


async def test_the_run_loop_renews_in_the_background_and_releases(kube):
    api, k = kube
    took = asyncio.Event()
    a = LeaderElector(
        k,
        NAMESPACE,
        "lease",
        "a",
        lease_duration=6,
        renew_deadline=4,
        retry_period=0.2,
        on_change=lambda leading: leading and took.set(),
    )
    stop = asyncio.Event()
    task = asyncio.create_task(a.run(stop))

    async def spec() -> dict:
        return (await api.lease()).get("spec", {})

    await asyncio.wait_for(took.wait(), 60)
    assert a.leading and (await spec())["holderIdentity"] == "a"
    renewed = (await spec())["renewTime"]

    # while nothing else runs here (a long cycle elsewhere), the Lease is renewed
    async def renewed_since() -> bool:
        return (await spec())["renewTime"] != renewed

    await until(renewed_since, "the Lease renewed")
    assert a.leading
    stop.set()
    await asyncio.wait_for(task, 10)
    assert (await spec())["holderIdentity"] == ""


async def test_two_remediator_processes_and_the_leader_killed(tmp_path, control_plane):
    """Two `remediator run` processes on the real API server: one leads; SIGKILL it
    (no release) and the other takes the Lease once it has seen it unchanged for the
    lease duration."""
    cp = control_plane
    account = "numaguard-remediator"
    kubeconfig = cp.kubeconfig(tmp_path / "kubeconfig", cp.tokens[account], account)
    ports = {identity: free_port() for identity in ("replica-a", "replica-b")}
    procs = {}
    for identity, port in ports.items():
        procs[identity] = subprocess.Popen(
            [
                sys.executable,
                *("-m", "numaguard.remediator", "run", "--kubeconfig", kubeconfig),
                *("--prometheus", f"http://127.0.0.1:{free_port()}"),  # none: no findings
                *("--listen", f"127.0.0.1:{port}", "--identity", identity),
                *("--lease-namespace", NAMESPACE, "--lease-name", "lease", "--interval", "1"),
                *("--lease-duration", "4", "--renew-deadline", "3", "--retry-period", "0.5"),
                *("--log-level", "error"),
            ],
            stderr=subprocess.DEVNULL,
        )

    async def leader(session) -> str | None:
        spec = (await cp.get(session, "Lease", NAMESPACE, "lease") or {}).get("spec", {})
        return spec.get("holderIdentity") or None

    async def says_leading(session, identity) -> bool:
        try:
            url = f"http://127.0.0.1:{ports[identity]}/metrics"
            async with session.get(url) as r:
                return "numaguard_remediator_leader 1.0" in await r.text()
        except aiohttp.ClientError:
            return False

    try:
        async with aiohttp.ClientSession() as session:
            first = await until(lambda: leader(session), "a leader")
            await until(lambda: says_leading(session, first), "its metric saying so")
            (other,) = set(procs) - {first}
            assert not await says_leading(session, other)
            procs[first].kill()  # no goodbye: the Lease stays as it was
            procs[first].wait()
            assert await leader(session) == first  # nobody released it
            await until(lambda: says_leading(session, other), "the other leading")
            assert await leader(session) == other
            lease = await cp.get(session, "Lease", NAMESPACE, "lease")
            assert lease["spec"]["leaseTransitions"] >= 1
            # the survivor stops cleanly and gives the Lease back
            procs[other].send_signal(signal.SIGTERM)
            assert procs[other].wait(timeout=30) == 0
            assert await leader(session) is None
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        async with aiohttp.ClientSession() as session:
            await cp.request(session, "DELETE", LEASE)


async def test_healthz_fails_while_every_cycle_fails_and_recovers_with_one_that_ends(
    control_plane, tmp_path, monkeypatch
):
    """`remediator run` whose cycles all raise (a bug: nothing a cycle meets should)
    keeps running, but /healthz fails once no cycle has ended for three intervals and a
    minute (on a fake clock), so the kubelet restarts it; a cycle that ends, even one
    that found its data doubtful (no Prometheus here), makes it healthy again."""
    from numaguard.remediator import cli
    from numaguard.remediator.controller import Controller

    cp = control_plane
    account = "numaguard-remediator"
    kubeconfig = cp.kubeconfig(tmp_path / "kubeconfig", cp.tokens[account], account)
    now = [0.0]
    health = cli.Health
    monkeypatch.setattr(cli, "Health", lambda limit: health(limit, clock=lambda: now[0]))
    failing = [True]
    cycle = Controller.cycle

    async def buggy(self, *args, **kwargs):
        if failing[0]:
            raise RuntimeError("a bug")
        return await cycle(self, *args, **kwargs)

    monkeypatch.setattr(Controller, "cycle", buggy)
    port = free_port()
    args = cli.parser().parse_args(
        [
            *("run", "--kubeconfig", kubeconfig, "--listen", f"127.0.0.1:{port}"),
            *("--prometheus", f"http://127.0.0.1:{free_port()}"),
            *("--lease-namespace", NAMESPACE, "--lease-name", "healthz", "--interval", "0.1"),
        ]
    )
    running = asyncio.create_task(cli.run_command(args))
    base = f"http://127.0.0.1:{port}"

    async def internal_errors(session) -> float:
        assert not running.done(), running
        try:
            async with session.get(f"{base}/metrics") as r:
                text = await r.text()
        except aiohttp.ClientError:
            return 0
        found = re.search(
            r'numaguard_remediator_cycle_errors_total\{reason="internal"\} (\S+)', text
        )
        return float(found[1]) if found else 0

    async def healthz(session) -> tuple[int, str]:
        async with session.get(f"{base}/healthz") as r:
            return r.status, await r.text()

    try:
        async with aiohttp.ClientSession() as session:
            await until(lambda: internal_errors(session), "a cycle failing")
            assert await healthz(session) == (200, "ok")  # started within the limit
            now[0] += 3 * 0.1 + 60 - 1
            assert (await healthz(session))[0] == 200
            seen = await internal_errors(session)

            async def more_errors():
                return await internal_errors(session) > seen

            await until(more_errors, "cycles still failing")
            now[0] += 1
            assert await healthz(session) == (
                503,
                "no cycle has ended without an internal error in 60.3s",
            )
            failing[0] = False

            async def healthy():
                return (await healthz(session))[0] == 200

            await until(healthy, "a cycle ending")
        os.kill(os.getpid(), signal.SIGTERM)  # its own handler: a clean stop
        assert await asyncio.wait_for(running, 30) == 0
    finally:
        if not running.done():
            running.cancel()
            with contextlib.suppress(BaseException):
                await running
        async with aiohttp.ClientSession() as session:
            await cp.request(session, "DELETE", path_of("Lease", NAMESPACE, "healthz"))
