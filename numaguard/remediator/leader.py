"""Lease-based leader election (coordination.k8s.io/v1) with client-go's semantics.

* One Lease, written with its resourceVersion: two replicas can never both take it.
* Expiry is judged by when *this* replica saw the Lease record change, on its own
  monotonic clock, never by the holder's timestamps: a replica whose wall clock runs
  ahead cannot depose a healthy leader.
* The leader renews every ``retry_period`` in the background, whatever the control loop
  is doing, and counts as leading only while its last renewal is younger than
  ``renew_deadline`` (< ``lease_duration``): it stops writing before anyone else may
  take the Lease.
* On shutdown the Lease is released, so a successor need not wait for it to expire.
* A leader that cannot open a new connection (out of descriptors) for a renew deadline
  gives the Lease up, though its renewals may still pass on a connection kept open: it
  can neither reach Prometheus nor answer its webhook, and a standby can.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import random
import socket
import time
from datetime import UTC, datetime

import aiohttp

from numaguard.contract.names import PAUSE_ANNOTATION
from numaguard.remediator.actuator import Writer
from numaguard.remediator.kube import Kube

log = logging.getLogger(__name__)


class LeaderElector:
    def __init__(
        self,
        kube: Kube,
        namespace: str,
        name: str,
        identity: str,
        lease_duration: float = 15.0,
        renew_deadline: float = 10.0,
        retry_period: float = 2.0,
        clock=time.time,
        monotonic=time.monotonic,
        on_change=lambda leading: None,
        can_connect=None,
    ) -> None:
        if not 0 < retry_period < renew_deadline < lease_duration:
            raise ValueError(
                "leader election needs retry period < renew deadline < lease duration, got "
                f"{retry_period:g} / {renew_deadline:g} / {lease_duration:g}"
            )
        self.kube = kube
        self.writer = Writer(kube)  # the actuator's, not acting: the Lease is all it writes
        self.path = f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases"
        self.name = name
        self.identity = identity
        self.lease_duration = lease_duration
        self.renew_deadline = renew_deadline
        self.retry_period = retry_period
        self.clock = clock  # for the Lease's timestamps, which others only display
        self.monotonic = monotonic  # for every judgement of time
        self.on_change = on_change
        self.paused = False  # kubectl annotate lease <name> numaguard.io/paused=true
        self._renewed_at: float | None = None  # monotonic time of our last renewal
        self._observed: tuple | None = None  # the Lease record as last seen ...
        self._observed_at = 0.0  # ... and when we saw it change
        self._was_leading = False
        self.can_connect = can_connect or _can_open_a_socket
        self._connectable_at = monotonic()  # when a new connection could last be opened

    @property
    def leading(self) -> bool:
        """True while our last successful renewal is younger than the renew deadline."""
        leading = (
            self._renewed_at is not None
            and self.monotonic() - self._renewed_at < self.renew_deadline
        )
        if leading != self._was_leading:
            self._was_leading = leading
            self.on_change(leading)
        return leading

    async def try_acquire_or_renew(self) -> bool:
        """One attempt to take the Lease (free, released or expired as we observed it) or
        renew it (ours). True: we lead now."""
        now = self.monotonic()
        if self.can_connect():
            self._connectable_at = now
        elif now - self._connectable_at >= self.renew_deadline:
            if self._renewed_at is not None:
                log.error(
                    "lease %s: no new connection could be opened for %gs: giving it up",
                    self.name,
                    now - self._connectable_at,
                    extra={"reason": "no_connections", "identity": self.identity},
                )
                await self.release()
            return False
        answer = await self.kube.get(f"{self.path}/{self.name}")
        now = self.monotonic()
        if answer.status == 404:
            created = await self.writer.post(self.path, self._lease(None, None, 0))
            return self._renewed(created.ok, now)
        if not answer.ok:
            return self.leading
        lease = answer.body
        annotations = lease["metadata"].get("annotations") or {}
        self.paused = annotations.get(PAUSE_ANNOTATION) == "true"
        spec = lease.get("spec") or {}
        holder = spec.get("holderIdentity") or ""
        record = (
            holder,
            spec.get("renewTime"),
            spec.get("leaseDurationSeconds"),
            spec.get("leaseTransitions"),
        )
        if record != self._observed:
            self._observed, self._observed_at = record, now
        duration = float(spec.get("leaseDurationSeconds") or self.lease_duration)
        if holder not in ("", self.identity) and now < self._observed_at + duration:
            self._renewed_at = None  # someone else holds it, and it has not expired
            return self.leading
        ours = holder == self.identity
        transitions = int(spec.get("leaseTransitions") or 0) + (0 if ours else 1)
        body = self._lease(
            lease["metadata"]["resourceVersion"],
            spec.get("acquireTime") if ours else None,
            transitions,
        )
        body["metadata"]["annotations"] = annotations  # the pause switch lives there
        renewed = await self.writer.put(f"{self.path}/{self.name}", body)  # 409: lost a race
        return self._renewed(renewed.ok, now)

    async def run(self, stop: asyncio.Event) -> None:
        """Acquire, then renew, every retry period until ``stop``; then release."""
        try:
            while not stop.is_set():
                try:
                    await self.try_acquire_or_renew()
                except (aiohttp.ClientError, OSError, TimeoutError) as err:
                    log.warning("lease %s: %r", self.name, err)
                self.leading  # noqa: B018 (reports a change of leadership)
                # candidates jitter, as client-go's do, so that they do not write in step
                wait = self.retry_period * (1 if self.leading else 1 + 0.2 * random.random())
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), wait)
        finally:
            await self.release()

    async def release(self) -> None:
        """Give the Lease up now (if ours), so that a successor need not wait."""
        if not self.leading:
            return
        self._renewed_at = None
        self.leading  # noqa: B018 (reports the change)
        with contextlib.suppress(aiohttp.ClientError, OSError, TimeoutError):
            answer = await self.kube.get(f"{self.path}/{self.name}")
            if answer.ok and (answer.body.get("spec") or {}).get("holderIdentity") == (
                self.identity
            ):
                lease = answer.body
                lease["spec"].update(
                    holderIdentity="", leaseDurationSeconds=1, renewTime=_format(self.clock())
                )
                await self.writer.put(f"{self.path}/{self.name}", lease)

    def _renewed(self, ok: bool, at: float) -> bool:
        if ok:
            self._renewed_at = at
            self._observed = None  # our own write: the next read is a change we made
            self._observed_at = at
        return self.leading

    def _lease(self, version: str | None, acquired: str | None, transitions: int) -> dict:
        meta = {"name": self.name}
        if version is not None:
            meta["resourceVersion"] = version
        now = _format(self.clock())
        return {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": meta,
            "spec": {
                "holderIdentity": self.identity,
                "leaseDurationSeconds": int(self.lease_duration),
                "acquireTime": acquired or now,
                "renewTime": now,
                "leaseTransitions": transitions,
            },
        }


def _can_open_a_socket() -> bool:
    """Whether this process may open one more connection now."""
    try:
        socket.socket(socket.AF_INET, socket.SOCK_STREAM).close()
    except OSError as err:
        if err.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
            return False
        raise
    return True


def _format(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
