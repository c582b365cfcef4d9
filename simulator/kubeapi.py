"""An HTTP-level fake of the Kubernetes API server, for the real ``kubernetes.aio`` client.

It keeps objects per resource with resourceVersions, serves list and watch (with field
and label selectors and 410 Gone once history is compacted) and can be told
to fail requests or drop watches, so that client code meets the same protocol it meets
in a cluster.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from aiohttp import web

from simulator.host import FakeHost

# Core (v1) resources the fake knows; later parts of the simulator add more.
CORE_RESOURCES = {"pods": "Pod", "nodes": "Node"}


@dataclass(frozen=True)
class _Event:
    version: int
    resource: str
    type: str  # ADDED | MODIFIED | DELETED
    obj: dict


class FakeApiServer:
    def __init__(self, history: int = 1000) -> None:
        self.objects: dict[str, dict[tuple[str, str], dict]] = {r: {} for r in CORE_RESOURCES}
        self.version = 1
        self._events: list[_Event] = []
        self._history = history
        self._changed = asyncio.Event()
        self._failures: list[int] = []
        self._watches: set[web.StreamResponse] = set()
        self.requests: list[str] = []  # "METHOD path?query", for tests to inspect
        self._runner: web.AppRunner | None = None
        self.url = ""

    # -- lifecycle -------------------------------------------------------------------

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> str:
        app = web.Application(middlewares=[self._middleware])
        app.add_routes(
            [
                web.get("/api/v1/{resource}", self._list_or_watch),
                web.get("/api/v1/namespaces/{namespace}/{resource}", self._list_or_watch),
                web.get("/api/v1/namespaces/{namespace}/{resource}/{name}", self._get),
                web.get("/api/v1/{resource}/{name}", self._get),
            ]
        )
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, host, port)
        await site.start()
        bound = self._runner.addresses[0]
        self.url = f"http://{bound[0]}:{bound[1]}"
        return self.url

    async def stop(self) -> None:
        await self.drop_watches()
        if self._runner:
            await self._runner.cleanup()

    def kubeconfig(self, path: str | Path) -> str:
        """Write a kubeconfig that points the real client here; returns its path."""
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "fake", "cluster": {"server": self.url}}],
            "users": [{"name": "fake", "user": {"token": "fake-token"}}],
            "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "fake"}}],
            "current-context": "fake",
        }
        Path(path).write_text(json.dumps(config))
        return str(path)

    # -- state -----------------------------------------------------------------------

    def put(self, resource: str, obj: dict) -> dict:
        """Create or replace an object; it gets a uid, resourceVersion and timestamps."""
        meta = obj.setdefault("metadata", {})
        key = (meta.get("namespace", ""), meta["name"])
        existed = key in self.objects[resource]
        meta.setdefault("uid", str(uuid.uuid4()))
        meta.setdefault("creationTimestamp", _now())
        self._record(resource, "MODIFIED" if existed else "ADDED", obj)
        self.objects[resource][key] = obj
        return obj

    def delete(self, resource: str, namespace: str, name: str) -> None:
        obj = self.objects[resource].pop((namespace, name))
        self._record(resource, "DELETED", obj)

    def fail_next(self, status: int, times: int = 1) -> None:
        """Answer the next ``times`` requests with ``status`` (500, 429, 409, ...)."""
        self._failures.extend([status] * times)

    async def drop_watches(self) -> None:
        """Cut every open watch, as an API server restart or a load balancer would."""
        for response in list(self._watches):
            with contextlib.suppress(Exception):
                response.force_close()
                await response.write_eof()
        self._watches.clear()
        self._changed.set()

    def compact(self) -> None:
        """Forget all history: a watch from an older version now gets 410 Gone."""
        self._events.clear()

    def _record(self, resource: str, type_: str, obj: dict) -> None:
        self.version += 1
        obj["metadata"]["resourceVersion"] = str(self.version)
        self._events.append(_Event(self.version, resource, type_, json.loads(json.dumps(obj))))
        del self._events[: -self._history]
        self._changed.set()

    # -- HTTP --------------------------------------------------------------------------

    @web.middleware
    async def _middleware(self, request: web.Request, handler):
        self.requests.append(f"{request.method} {request.path_qs}")
        if self._failures:
            status = self._failures.pop(0)
            return _status(status, "injected failure")
        return await handler(request)

    async def _get(self, request: web.Request) -> web.Response:
        resource = request.match_info["resource"]
        if resource not in self.objects:
            return _status(404, f"the server could not find resource {resource}")
        key = (request.match_info.get("namespace", ""), request.match_info["name"])
        obj = self.objects[resource].get(key)
        if obj is None:
            return _status(404, f'{resource} "{key[1]}" not found', reason="NotFound")
        return web.json_response(obj)

    async def _list_or_watch(self, request: web.Request) -> web.StreamResponse:
        resource = request.match_info["resource"]
        if resource not in self.objects:
            return _status(404, f"the server could not find resource {resource}")
        match = _selector(request.match_info.get("namespace"), request.query)
        if request.query.get("watch") in ("true", "1"):
            return await self._watch(request, resource, match)
        items = [o for o in self.objects[resource].values() if match(o)]
        kind = CORE_RESOURCES[resource]
        return web.json_response(
            {
                "kind": f"{kind}List",
                "apiVersion": "v1",
                "metadata": {"resourceVersion": str(self.version)},
                "items": items,
            }
        )

    async def _watch(self, request: web.Request, resource: str, match) -> web.StreamResponse:
        since = int(request.query.get("resourceVersion") or self.version)
        timeout = float(request.query.get("timeoutSeconds", 1800))
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        await response.prepare(request)
        self._watches.add(response)
        deadline = asyncio.get_running_loop().time() + timeout
        try:
            oldest = self._events[0].version if self._events else self.version + 1
            if since + 1 < oldest and since < self.version:
                gone = {
                    "type": "ERROR",
                    "object": _status_body(410, "too old resource version", "Expired"),
                }
                await response.write(json.dumps(gone).encode() + b"\n")
                return response
            while response in self._watches:
                for event in [e for e in self._events if e.version > since]:
                    since = event.version
                    if event.resource == resource and match(event.obj):
                        line = {"type": event.type, "object": event.obj}
                        await response.write(json.dumps(line).encode() + b"\n")
                left = deadline - asyncio.get_running_loop().time()
                if left <= 0:
                    break
                self._changed.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._changed.wait(), min(left, 1.0))
        except (ConnectionResetError, asyncio.CancelledError):
            pass
        finally:
            self._watches.discard(response)
        with contextlib.suppress(Exception):
            await response.write_eof()
        return response


def _selector(namespace: str | None, query):
    """A predicate for the namespace, fieldSelector and labelSelector of a request."""
    fields = _pairs(query.get("fieldSelector", ""))
    labels = _pairs(query.get("labelSelector", ""))

    def match(obj: dict) -> bool:
        meta = obj.get("metadata", {})
        if namespace is not None and meta.get("namespace") != namespace:
            return False
        for path, (op, want) in fields.items():
            have = obj
            for part in path.split("."):
                have = have.get(part, "") if isinstance(have, dict) else ""
            if (str(have) == want) != (op == "="):
                return False
        obj_labels = meta.get("labels") or {}
        return all((obj_labels.get(k) == v) == (op == "=") for k, (op, v) in labels.items())

    return match


def _pairs(selector: str) -> dict[str, tuple[str, str]]:
    out = {}
    for term in filter(None, selector.split(",")):
        if "!=" in term:
            key, value = term.split("!=", 1)
            out[key] = ("!=", value)
        else:
            key, _, value = term.partition("=")
            out[key] = ("=", value.lstrip("="))
    return out


def _status_body(code: int, message: str, reason: str = "") -> dict:
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason
        or {
            404: "NotFound",
            409: "Conflict",
            410: "Expired",
            429: "TooManyRequests",
            500: "InternalError",
        }.get(code, "Unknown"),
        "code": code,
    }


def _status(code: int, message: str, reason: str = "") -> web.Response:
    return web.json_response(_status_body(code, message, reason), status=code)


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def pod_objects(host: FakeHost, node_name: str) -> list[dict]:
    """The API objects of a fake host's pods, as the kubelet would report them."""
    objs = []
    for pod in host.pods:
        statuses = []
        containers = []
        for ctr in pod.containers:
            image = f"registry.example/{ctr.name}:1.0"
            containers.append({"name": ctr.name, "image": image})
            statuses.append(
                {
                    "name": ctr.name,
                    "containerID": f"{host.runtime_scheme}://{host.container_id(pod, ctr)}",
                    "image": image,
                    "imageID": f"{image}@sha256:{'0' * 64}",
                    "ready": True,
                    "restartCount": 0,
                    "started": True,
                    "state": {"running": {"startedAt": _now()}},
                }
            )
        objs.append(
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": pod.name, "namespace": pod.namespace, "uid": pod.uid},
                "spec": {"nodeName": node_name, "containers": containers},
                "status": {
                    "phase": "Running",
                    "qosClass": {
                        "guaranteed": "Guaranteed",
                        "burstable": "Burstable",
                        "besteffort": "BestEffort",
                    }[pod.qos_class],
                    "containerStatuses": statuses,
                },
            }
        )
    return objs
