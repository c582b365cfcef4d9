"""Pod metadata source: watches this node's pods on the API server and keeps pod UID ->
namespace, name and container names for the snapshot to join."""

from __future__ import annotations

import asyncio
import json
import logging
import random
from collections.abc import AsyncIterator, Mapping

import aiohttp

from exporter.model import PodMeta
from exporter.sources.apiserver import ApiServer

log = logging.getLogger(__name__)

WATCH_SECONDS = 300  # the server ends each watch after this; we resume from its version
REQUEST_TIMEOUT_SECONDS = 30.0
MAX_EVENT_BYTES = 16 << 20  # one watch event (a pod object); past it, list again
# Every (API group, resource, verb) the exporter uses; deploy/ grants exactly these.
API_USE = {("", "pods", "list"), ("", "pods", "watch")}


class WatchExpired(Exception):
    """The watch cannot go on from its version (410 Gone, or an event too big)."""


def pod_meta(pod: dict) -> tuple[str, PodMeta]:
    """A pod object -> (uid, PodMeta) with container id (without runtime prefix) -> name."""
    containers: dict[str, str] = {}
    status = pod.get("status") or {}
    for key in ("containerStatuses", "initContainerStatuses", "ephemeralContainerStatuses"):
        for s in status.get(key) or ():
            if s.get("containerID"):
                containers[s["containerID"].rpartition("://")[2]] = s["name"]
    meta = pod["metadata"]
    return meta["uid"], PodMeta(meta["namespace"], meta["name"], containers)


class PodMetadataWatch:
    """List, then watch, pods with ``spec.nodeName=<node>``; resync on any failure."""

    def __init__(self, api: ApiServer, node_name: str) -> None:
        self.api = api
        self.selector = f"spec.nodeName={node_name}"
        self._pods: dict[str, PodMeta] | None = None

    def current(self) -> Mapping[str, PodMeta] | None:
        """The pods as last seen; None until the first listing succeeded."""
        return self._pods

    async def run(self) -> None:
        backoff = 1.0
        while True:
            try:
                version = await self._list()
                backoff = 1.0
                await self._watch(version)
            except asyncio.CancelledError:
                raise
            except WatchExpired as err:
                log.info("pod metadata watch expired, listing again: %s", err)
            except Exception as err:
                # Names stay as last seen while we resync; they only fill labels.
                log.warning(
                    "pod metadata watch failed; retrying in %.0fs: %s",
                    backoff,
                    err,
                    extra={"reason": type(err).__name__},
                )
                await asyncio.sleep(backoff * random.uniform(0.8, 1.2))
                backoff = min(backoff * 2, 60.0)

    async def _list(self) -> str:
        params = {"fieldSelector": self.selector}
        async with self.api.request(
            "GET", "/api/v1/pods", REQUEST_TIMEOUT_SECONDS, params=params
        ) as r:
            if r.status != 200:
                raise RuntimeError(f"listing pods: HTTP {r.status}")
            listing = await r.json()
        self._pods = dict(pod_meta(p) for p in listing["items"])
        return listing["metadata"]["resourceVersion"]

    async def _watch(self, version: str) -> None:
        """Follow changes from ``version``, resuming where each watch ends, until the
        version expires (the caller then lists again) or the API server fails."""
        while True:
            params = {
                "fieldSelector": self.selector,
                "watch": "1",
                "resourceVersion": version,
                "timeoutSeconds": str(WATCH_SECONDS),
                "allowWatchBookmarks": "true",
            }
            timeout = WATCH_SECONDS + REQUEST_TIMEOUT_SECONDS
            async with self.api.request("GET", "/api/v1/pods", timeout, params=params) as r:
                if r.status == 410:
                    raise WatchExpired(f"resourceVersion {version}")
                if r.status != 200:
                    raise RuntimeError(f"watching pods: HTTP {r.status}")
                try:
                    async for event in _events(r.content):
                        version = self._apply(event) or version
                except (aiohttp.ClientPayloadError, aiohttp.ServerDisconnectedError):
                    pass  # the watch was cut: go on from the last version seen

    def _apply(self, event: dict) -> str:
        """Take one watch event in; returns the version it brings."""
        kind, obj = event.get("type"), event.get("object") or {}
        if kind == "ERROR":  # in-stream 410 Gone: the version was compacted away
            raise WatchExpired(obj.get("message", "watch error"))
        if kind in ("ADDED", "MODIFIED", "DELETED"):
            uid, meta = pod_meta(obj)
            pods = dict(self._pods or {})
            if kind == "DELETED":
                pods.pop(uid, None)
            else:
                pods[uid] = meta
            self._pods = pods
        return obj.get("metadata", {}).get("resourceVersion", "")


async def _events(stream: aiohttp.StreamReader) -> AsyncIterator[dict]:
    """The JSON objects of a watch stream, one per line, however the bytes arrive."""
    pending = b""
    async for chunk in stream.iter_any():
        pending += chunk
        *lines, pending = pending.split(b"\n")
        if len(pending) > MAX_EVENT_BYTES:
            raise WatchExpired(f"a watch event over {MAX_EVENT_BYTES} bytes")
        for line in lines:
            if line.strip():
                yield json.loads(line)
