"""Lease-based leader election (coordination.k8s.io/v1), as client-go does it: one
Lease object, held by the replica that last renewed it within its duration; writes use
the Lease's resourceVersion, so two replicas can never both take it."""

from __future__ import annotations

import time
from datetime import UTC, datetime

from remediator.kube import Kube

PAUSE_ANNOTATION = "numaguard.io/paused"


class LeaderElector:
    def __init__(
        self,
        kube: Kube,
        namespace: str,
        name: str,
        identity: str,
        lease_seconds: int = 15,
        clock=time.time,
    ) -> None:
        self.kube = kube
        self.path = f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases"
        self.name = name
        self.identity = identity
        self.lease_seconds = lease_seconds
        self.clock = clock
        self.paused = False  # kubectl annotate lease <name> numaguard.io/paused=true

    async def acquire_or_renew(self) -> bool:
        """Take the Lease if it is free or expired, renew it if ours. True: we lead."""
        answer = await self.kube.get(f"{self.path}/{self.name}")
        now = self.clock()
        if answer.status == 404:
            created = await self.kube.post(self.path, self._lease(None, now, now))
            return created.ok
        if not answer.ok:
            return False
        lease = answer.body
        annotations = lease["metadata"].get("annotations") or {}
        self.paused = annotations.get(PAUSE_ANNOTATION) == "true"
        spec = lease.get("spec", {})
        holder = spec.get("holderIdentity")
        if holder not in (None, "", self.identity) and not _expired(spec, now):
            return False
        acquired = spec.get("acquireTime") if holder == self.identity else None
        body = self._lease(lease["metadata"]["resourceVersion"], _parse(acquired) or now, now)
        body["metadata"]["annotations"] = annotations  # the pause switch lives there
        renewed = await self.kube.put(f"{self.path}/{self.name}", body)
        return renewed.ok  # 409: another replica wrote first

    async def confirm(self) -> bool:
        """Right before a write: is the Lease still ours and current?"""
        answer = await self.kube.get(f"{self.path}/{self.name}")
        if not answer.ok:
            return False
        spec = answer.body.get("spec", {})
        return spec.get("holderIdentity") == self.identity and not _expired(spec, self.clock())

    def _lease(self, version: str | None, acquired: float, renewed: float) -> dict:
        meta = {"name": self.name}
        if version is not None:
            meta["resourceVersion"] = version
        return {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": meta,
            "spec": {
                "holderIdentity": self.identity,
                "leaseDurationSeconds": self.lease_seconds,
                "acquireTime": _format(acquired),
                "renewTime": _format(renewed),
            },
        }


def _expired(spec: dict, now: float) -> bool:
    renewed = _parse(spec.get("renewTime"))
    return renewed is None or now > renewed + float(spec.get("leaseDurationSeconds") or 0)


def _format(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _parse(text: str | None) -> float | None:
    if not text:
        return None
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
