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

# Resources the fake knows: name -> (API group path, kind).
RESOURCES = {
    "pods": ("api/v1", "Pod"),
    "nodes": ("api/v1", "Node"),
    "events": ("api/v1", "Event"),
    "replicasets": ("apis/apps/v1", "ReplicaSet"),
    "deployments": ("apis/apps/v1", "Deployment"),
    "statefulsets": ("apis/apps/v1", "StatefulSet"),
    "daemonsets": ("apis/apps/v1", "DaemonSet"),
    "poddisruptionbudgets": ("apis/policy/v1", "PodDisruptionBudget"),
    "leases": ("apis/coordination.k8s.io/v1", "Lease"),
}


@dataclass(frozen=True)
class _Event:
    version: int
    resource: str
    type: str  # ADDED | MODIFIED | DELETED
    obj: dict


class FakeApiServer:
    def __init__(self, history: int = 1000) -> None:
        self.objects: dict[str, dict[tuple[str, str], dict]] = {r: {} for r in RESOURCES}
        # A pod evicted from a ReplicaSet comes back through this: given the evicted pod,
        # it returns its replacement (placed as the kubelet would admit it), or None.
        self.recreate = lambda evicted: None
        self.evictions: list[tuple[str, str, int]] = []  # (namespace, name, HTTP status)
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
        routes = []
        for group in {g for g, _ in RESOURCES.values()}:
            ns = f"/{group}/namespaces/{{namespace}}/{{resource}}"
            routes += [
                web.get(f"/{group}/{{resource}}", self._list_or_watch),
                web.get(ns, self._list_or_watch),
                web.get(f"{ns}/{{name}}", self._get),
                web.get(f"/{group}/{{resource}}/{{name}}", self._get),
                web.post(ns, self._create),
                web.put(f"{ns}/{{name}}", self._replace),
                web.patch(f"{ns}/{{name}}", self._patch),
            ]
        routes.append(web.post("/api/v1/namespaces/{namespace}/pods/{name}/eviction", self._evict))
        routes.append(web.get("/version", self._version))
        app.add_routes(routes)
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

    async def wait_until(self, predicate, timeout: float = 60.0) -> None:
        """Return once ``predicate()`` holds, looking again at every change of state."""
        async with asyncio.timeout(timeout):
            while True:
                self._changed.clear()  # before looking: a change meanwhile wakes us
                if predicate():
                    return
                await self._changed.wait()

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
        group, kind = RESOURCES[resource]
        return web.json_response(
            {
                "kind": f"{kind}List",
                "apiVersion": group.removeprefix("apis/").removeprefix("api/"),
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

    async def _create(self, request: web.Request) -> web.Response:
        resource = request.match_info["resource"]
        if resource not in self.objects:
            return _status(404, f"the server could not find resource {resource}")
        obj = await request.json()
        meta = obj.setdefault("metadata", {})
        meta["namespace"] = request.match_info["namespace"]
        if not meta.get("name") and meta.get("generateName"):
            meta["name"] = meta["generateName"] + uuid.uuid4().hex[:5]
        if (meta["namespace"], meta.get("name")) in self.objects[resource]:
            return _status(409, f'{resource} "{meta["name"]}" already exists', "AlreadyExists")
        return web.json_response(self.put(resource, obj), status=201)

    async def _replace(self, request: web.Request) -> web.Response:
        """PUT with optimistic concurrency: a stale resourceVersion gets 409 Conflict."""
        resource = request.match_info["resource"]
        key = (request.match_info["namespace"], request.match_info["name"])
        current = self.objects.get(resource, {}).get(key)
        if current is None:
            return _status(404, f'{resource} "{key[1]}" not found', "NotFound")
        obj = await request.json()
        sent = obj.get("metadata", {}).get("resourceVersion")
        if sent != current["metadata"]["resourceVersion"]:
            return _status(
                409,
                "the object has been modified; please apply your changes "
                "to the latest version and try again",
            )
        obj["metadata"]["uid"] = current["metadata"]["uid"]
        obj["metadata"]["namespace"] = key[0]
        return web.json_response(self.put(resource, obj))

    async def _patch(self, request: web.Request) -> web.Response:
        """JSON merge patch (and strategic merge patch, read as one: enough for the
        fields the remediator patches, whose lists it sends whole)."""
        resource = request.match_info["resource"]
        key = (request.match_info["namespace"], request.match_info["name"])
        current = self.objects.get(resource, {}).get(key)
        if current is None:
            return _status(404, f'{resource} "{key[1]}" not found', "NotFound")
        patched = _merge(json.loads(json.dumps(current)), await request.json())
        return web.json_response(self.put(resource, patched))

    async def _version(self, request: web.Request) -> web.Response:
        return web.json_response({"major": "1", "minor": "34", "gitVersion": "v1.34.0-fake"})

    async def _evict(self, request: web.Request) -> web.Response:
        """policy/v1 Eviction: 201 and the pod gone (its ReplicaSet brings a replacement)
        when every PodDisruptionBudget over it allows a disruption, else 429; 409 when
        the uid precondition names another pod than the one of that name now."""
        namespace, name = request.match_info["namespace"], request.match_info["name"]
        pod = self.objects["pods"].get((namespace, name))
        if pod is None:
            self.evictions.append((namespace, name, 404))
            return _status(404, f'pods "{name}" not found', "NotFound")
        body = await request.json()
        want = ((body.get("deleteOptions") or {}).get("preconditions") or {}).get("uid")
        if want is not None and want != pod["metadata"]["uid"]:
            self.evictions.append((namespace, name, 409))
            return _status(
                409,
                f"Precondition failed: UID in precondition: {want}, UID in object meta: "
                f"{pod['metadata']['uid']}",
                "Conflict",
            )
        for pdb in self.objects["poddisruptionbudgets"].values():
            if pdb["metadata"]["namespace"] == namespace and not _disruption_allowed(
                pdb, pod, self.objects["pods"].values()
            ):
                self.evictions.append((namespace, name, 429))
                return _status(
                    429,
                    "Cannot evict pod as it would violate the pod's disruption budget.",
                    "TooManyRequests",
                )
        self.delete("pods", namespace, name)
        self.evictions.append((namespace, name, 201))
        replacement = self.recreate(pod)
        if replacement is not None:
            self.put("pods", replacement)
        return web.json_response(
            {"kind": "Status", "apiVersion": "v1", "status": "Success", "code": 201},
            status=201,
        )


def _merge(target, patch):
    if not isinstance(patch, dict):
        return patch
    if not isinstance(target, dict):
        target = {}
    for key, value in patch.items():
        if value is None:
            target.pop(key, None)
        else:
            target[key] = _merge(target.get(key), value)
    return target


def _disruption_allowed(pdb: dict, pod: dict, pods) -> bool:
    want = pdb["spec"].get("selector", {}).get("matchLabels", {})
    labels = pod["metadata"].get("labels") or {}
    if not want or any(labels.get(k) != v for k, v in want.items()):
        return True  # not covered by this budget
    covered = [
        p
        for p in pods
        if p["metadata"]["namespace"] == pod["metadata"]["namespace"]
        and all((p["metadata"].get("labels") or {}).get(k) == v for k, v in want.items())
    ]
    healthy = sum(1 for p in covered if p.get("status", {}).get("phase") == "Running")
    spec = pdb["spec"]
    if "minAvailable" in spec:
        return healthy - 1 >= int(spec["minAvailable"])
    return len(covered) - healthy + 1 <= int(spec.get("maxUnavailable", 0))


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


def _claims(pod) -> dict:
    """A pod with DRA devices names its claims in its spec, as the API server shows it."""
    names = [claim.claim for c in pod.containers for claim in c.claims]
    if not names:
        return {}
    return {"resourceClaims": [{"name": n, "resourceClaimName": n} for n in names]}


def pod_objects(host: FakeHost, node_name: str) -> list[dict]:
    """The API objects of a fake host's pods, as the kubelet would report them."""
    objs = []
    for pod in host.pods:
        statuses = []
        containers = []
        for ctr in pod.containers:
            image = f"registry.example/{ctr.name}:1.0"
            devices = {r: str(len(ids)) for r, ids in sorted(ctr.devices.items())}
            containers.append(
                {
                    "name": ctr.name,
                    "image": image,
                    "resources": {"requests": devices, "limits": devices} if devices else {},
                }
            )
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
                "spec": {"nodeName": node_name, "containers": containers, **_claims(pod)},
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
