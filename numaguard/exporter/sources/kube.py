"""Watches of the API server: this node's pods (pod UID -> namespace, name, container
names and ResourceClaims, for the snapshot to join), and any other collection the same
way (the node's ResourceSlices: dra.py)."""

from __future__ import annotations

import asyncio
import json
import logging
import random
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Generic, TypeVar

import aiohttp

from numaguard.common.apiserver import ApiServer
from numaguard.contract.names import REQUEST, REQUEST_ANNOTATION
from numaguard.exporter.readers import ParseError
from numaguard.exporter.records import PodMeta

log = logging.getLogger(__name__)

WATCH_SECONDS = 300  # the server ends each watch after this; we resume from its version
REQUEST_TIMEOUT_SECONDS = 30.0
MAX_EVENT_BYTES = 16 << 20  # one watch event (a pod object); past it, list again
# Every (API group, resource, verb) the exporter uses; deploy/ grants exactly these.
API_USE = {
    ("", "pods", "list"),
    ("", "pods", "watch"),
    ("resource.k8s.io", "resourceslices", "list"),
    ("resource.k8s.io", "resourceslices", "watch"),
    ("resource.k8s.io", "resourceclaims", "get"),
}


T = TypeVar("T")


class WatchExpired(Exception):
    """The watch cannot go on from its version (410 Gone, or an event too big)."""


def pod_meta(pod: dict) -> tuple[str, PodMeta]:
    """A pod object -> (uid, PodMeta) with container id (without runtime prefix) -> name,
    and its ResourceClaims: a claim named in the pod (``resourceClaimName``), made for it
    from a template (named in ``status.resourceClaimStatuses`` once made), or made by the
    scheduler for its extended resources (``status.extendedResourceClaimStatus``)."""
    containers: dict[str, str] = {}
    spec, status = pod.get("spec") or {}, pod.get("status") or {}
    for key in ("containerStatuses", "initContainerStatuses", "ephemeralContainerStatuses"):
        for s in status.get(key) or ():
            if s.get("containerID"):
                containers[s["containerID"].rpartition("://")[2]] = s["name"]
    made = {
        s.get("name"): s.get("resourceClaimName") for s in status.get("resourceClaimStatuses") or ()
    }
    users: dict[str, list[str]] = {}
    for key in ("containers", "initContainers"):
        for c in spec.get(key) or ():
            for claim in (c.get("resources") or {}).get("claims") or ():
                users.setdefault(claim.get("name"), []).append(c.get("name", ""))
    claims = {}
    for claim in spec.get("resourceClaims") or ():
        name = claim.get("resourceClaimName") or made.get(claim.get("name"))
        if name:  # a template's claim not made yet has no devices yet
            claims[name] = tuple(users.get(claim.get("name"), ()))
    # the claim the scheduler made for extended resources a DeviceClass maps (1.34 on)
    extended = status.get("extendedResourceClaimStatus") or {}
    if isinstance(extended, dict) and isinstance(extended.get("resourceClaimName"), str):
        mappings = extended.get("requestMappings") or ()
        names = {m.get("containerName") for m in mappings if isinstance(m, dict)}
        claims[extended["resourceClaimName"]] = tuple(
            sorted(n for n in names if isinstance(n, str))
        )
    meta = pod["metadata"]
    request = (meta.get("annotations") or {}).get(REQUEST_ANNOTATION, "")
    request = request if isinstance(request, str) and REQUEST.fullmatch(request) else ""
    return meta["uid"], PodMeta(meta["namespace"], meta["name"], containers, claims, request)


class ListWatch(Generic[T]):
    """List, then watch, the objects of one collection matching a field selector; resync
    on any failure. ``paths``: the collection under each API version to try, newest
    first; the first the server serves (not 404) is used."""

    def __init__(
        self,
        api: ApiServer,
        paths: tuple[str, ...],
        selector: str,
        parse: Callable[[dict], tuple[str, T]],
        what: str,
    ) -> None:
        self.api = api
        self.paths = paths
        self.path = paths[0]
        self.selector = selector
        self.parse = parse
        self.what = what
        self._objects: dict[str, T] | None = None

    def current(self) -> Mapping[str, T] | None:
        """The objects as last seen, by key; None until the first listing succeeded."""
        return self._objects

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
                log.info("%s watch expired, listing again: %s", self.what, err)
            except Exception as err:
                # What was seen stays while we resync: it only fills labels.
                log.warning(
                    "%s watch failed; retrying in %.0fs: %s",
                    self.what,
                    backoff,
                    err,
                    extra={"reason": type(err).__name__},
                )
                await asyncio.sleep(backoff * random.uniform(0.8, 1.2))
                backoff = min(backoff * 2, 60.0)

    async def _list(self) -> str:
        params = {"fieldSelector": self.selector}
        for path in self.paths:
            async with self.api.request("GET", path, REQUEST_TIMEOUT_SECONDS, params=params) as r:
                if r.status == 404 and path != self.paths[-1]:
                    continue  # an older API server: its older version
                if r.status != 200:
                    raise RuntimeError(f"listing {self.what}: HTTP {r.status}")
                listing = await r.json()
            self.path = path
            self._objects = dict(self._parsed(o) for o in listing["items"])
            return listing["metadata"]["resourceVersion"]
        raise AssertionError("unreachable: the last path answers or raises")

    def _parsed(self, obj: dict) -> tuple[str, T]:
        try:
            return self.parse(obj)
        except (ParseError, KeyError, TypeError, AttributeError) as err:
            raise RuntimeError(f"a {self.what} object the exporter cannot read: {err}") from None

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
            async with self.api.request("GET", self.path, timeout, params=params) as r:
                if r.status == 410:
                    raise WatchExpired(f"resourceVersion {version}")
                if r.status != 200:
                    raise RuntimeError(f"watching {self.what}: HTTP {r.status}")
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
            key, value = self._parsed(obj)
            objects = dict(self._objects or {})
            if kind == "DELETED":
                objects.pop(key, None)
            else:
                objects[key] = value
            self._objects = objects
        return obj.get("metadata", {}).get("resourceVersion", "")


class PodMetadataWatch(ListWatch[PodMeta]):
    """This node's pods (``spec.nodeName=<node>``), by uid."""

    def __init__(self, api: ApiServer, node_name: str) -> None:
        super().__init__(api, ("/api/v1/pods",), f"spec.nodeName={node_name}", pod_meta, "pods")


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
