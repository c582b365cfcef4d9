"""Lease leader election against the fake API server through the real client: one
holder at a time, takeover after expiry, a lost write race (409), and the pause switch."""

from __future__ import annotations

from exporter.sources.kube import api_client
from remediator.kube import Kube
from remediator.leader import LeaderElector
from simulator.kubeapi import FakeApiServer


async def test_one_leader_takeover_conflict_and_pause(tmp_path):
    api = FakeApiServer()
    await api.start()
    client = await api_client(api.kubeconfig(tmp_path / "kubeconfig"))
    now = [1000.0]
    try:
        kube = Kube(client)
        a = LeaderElector(kube, "ns", "lease", "a", lease_seconds=10, clock=lambda: now[0])
        b = LeaderElector(kube, "ns", "lease", "b", lease_seconds=10, clock=lambda: now[0])
        assert await a.acquire_or_renew()
        assert not await b.acquire_or_renew()
        assert await a.confirm() and not await b.confirm()
        now[0] += 5
        assert await a.acquire_or_renew()  # renewed: b still waits
        now[0] += 8
        assert not await b.acquire_or_renew()
        now[0] += 11  # a stopped renewing: its lease expired
        assert not await a.confirm()  # a must not write any more ...
        assert await b.acquire_or_renew()  # ... and b takes over
        assert not await a.acquire_or_renew()
        # a write with a stale resourceVersion loses (409), never overwrites
        lease = api.objects["leases"][("ns", "lease")]
        stale = {**lease, "metadata": {**lease["metadata"], "resourceVersion": "1"}}
        answer = await kube.put("/apis/coordination.k8s.io/v1/namespaces/ns/leases/lease", stale)
        assert answer.status == 409
        assert api.objects["leases"][("ns", "lease")]["spec"]["holderIdentity"] == "b"
        # the pause switch lives on the Lease and survives renewals
        lease["metadata"]["annotations"] = {"numaguard.io/paused": "true"}
        api.put("leases", lease)
        assert await b.acquire_or_renew() and b.paused
        assert await b.acquire_or_renew() and b.paused
    finally:
        await client.close()
        await api.stop()
