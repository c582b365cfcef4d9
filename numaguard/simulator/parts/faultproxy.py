"""A fault-injecting proxy between our Kubernetes clients and the real API server.

It serves TLS with the API server's own certificate (so clients trust it as they trust
the server), forwards every request as it came, streams watches, and keeps a log of
what was asked and answered. Tests make it fail the next matching requests with a
status, slow them down, cut open watches, or hold new watches silent: the errors a
real cluster produces, around real answers.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import ssl
from collections.abc import Callable
from dataclasses import dataclass

import aiohttp
from aiohttp import web

FORWARDED_HEADERS = ("Authorization", "Content-Type", "Accept", "Accept-Encoding", "User-Agent")
ANSWER_HEADERS = ("Content-Type", "Content-Encoding")  # large lists come back gzipped


@dataclass(frozen=True)
class Exchange:
    method: str
    path: str  # with its query
    status: int
    injected: bool = False


@dataclass
class _Fault:
    status: int
    times: int
    match: Callable[[str, str], bool]


class FaultProxy:
    def __init__(self, upstream: str, ca_file: str, cert_file: str, key_file: str) -> None:
        self.upstream = upstream
        self.log: list[Exchange] = []
        self.delay = 0.0  # seconds before forwarding each request
        self.silent_watches = False  # accept new watches, then send nothing
        self.expire_watches = 0  # answer this many new watches "410 Gone", in the stream
        # (match, change): answers to requests that match(method, path) are change()d,
        # as a cache that lags or an object re-made meanwhile would show them
        self.rewrites: list[tuple[Callable[[str, str], bool], Callable[[int, dict], tuple]]] = []
        self._faults: list[_Fault] = []
        self._watches: set[web.StreamResponse] = set()
        self._client_ssl = ssl.create_default_context(cafile=ca_file)
        self._server_ssl = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        self._server_ssl.load_cert_chain(cert_file, key_file)
        self._runner: web.AppRunner | None = None
        self._session: aiohttp.ClientSession | None = None
        self.url = ""

    async def start(self) -> FaultProxy:
        self._session = aiohttp.ClientSession(auto_decompress=False)
        app = web.Application(client_max_size=64 << 20)
        app.router.add_route("*", "/{tail:.*}", self._forward)
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=1)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0, ssl_context=self._server_ssl)
        await site.start()
        self.url = f"https://127.0.0.1:{self._runner.addresses[0][1]}"
        return self

    async def stop(self) -> None:
        await self.drop_watches()
        if self._runner:
            await self._runner.cleanup()
        if self._session:
            await self._session.close()

    async def __aenter__(self) -> FaultProxy:
        return await self.start()

    async def __aexit__(self, *exc) -> None:
        await self.stop()

    # -- faults ---------------------------------------------------------------------

    def fail_next(self, status: int, times: int = 1, match=lambda method, path: True) -> None:
        """Answer the next ``times`` requests that ``match(method, path)`` with ``status``."""
        self._faults.append(_Fault(status, times, match))

    def clear(self) -> None:
        self._faults.clear()
        self.delay = 0.0
        self.silent_watches = False
        self.expire_watches = 0
        self.rewrites.clear()

    async def drop_watches(self) -> None:
        """Cut every open watch, as an API server restart or a load balancer would."""
        for response in list(self._watches):
            with contextlib.suppress(Exception):
                response.force_close()
                if response.prepared:
                    await response.write_eof()
        self._watches.clear()

    # -- what was asked ---------------------------------------------------------------

    def evictions(self) -> list[tuple[str, str, int]]:
        """(namespace, pod, status) of every eviction asked through the proxy."""
        out = []
        for e in self.log:
            parts = e.path.split("?")[0].split("/")
            if e.method == "POST" and parts[-1] == "eviction":
                out.append((parts[4], parts[6], e.status))
        return out

    def writes(self) -> list[Exchange]:
        return [e for e in self.log if e.method not in ("GET", "HEAD")]

    # -- forwarding -------------------------------------------------------------------

    def _fault(self, method: str, path: str) -> int | None:
        for fault in self._faults:
            if fault.times > 0 and fault.match(method, path):
                fault.times -= 1
                return fault.status
        return None

    async def _forward(self, request: web.Request) -> web.StreamResponse:
        path = request.path_qs
        if self.delay:
            await asyncio.sleep(self.delay)
        status = self._fault(request.method, path)
        if status is not None:
            self.log.append(Exchange(request.method, path, status, injected=True))
            return web.json_response(_status_body(status), status=status)
        watch = request.query.get("watch") in ("1", "true")
        if watch and self.expire_watches:
            # what the API server sends once the version asked for is compacted away
            # (etcd compacts every 5 minutes; a test cannot wait for it)
            self.expire_watches -= 1
            self.log.append(Exchange(request.method, path, 200, injected=True))
            gone = _status_body(410) | {"message": "too old resource version"}
            return web.Response(
                text=json.dumps({"type": "ERROR", "object": gone}) + "\n",
                content_type="application/json",
            )
        headers = {h: request.headers[h] for h in FORWARDED_HEADERS if h in request.headers}
        body = await request.read()
        timeout = aiohttp.ClientTimeout(total=None if watch else 60, sock_read=None)
        async with self._session.request(
            request.method,
            self.upstream + path,
            data=body or None,
            headers=headers,
            ssl=self._client_ssl,
            timeout=timeout,
        ) as upstream:
            self.log.append(Exchange(request.method, path, upstream.status))
            answer = {h: upstream.headers[h] for h in ANSWER_HEADERS if h in upstream.headers}
            for match, change in self.rewrites:
                if not watch and match(request.method, path):
                    status, body = change(upstream.status, json.loads(await upstream.read()))
                    return web.json_response(body, status=status)
            if not watch or upstream.status != 200:
                return web.Response(
                    body=await upstream.read(), status=upstream.status, headers=answer
                )
            response = web.StreamResponse(status=200, headers=answer)
            await response.prepare(request)
            self._watches.add(response)
            try:
                if self.silent_watches:
                    while response in self._watches:
                        await asyncio.sleep(0.1)
                else:
                    async for chunk in upstream.content.iter_any():
                        if response not in self._watches:
                            break
                        await response.write(chunk)
            except (ConnectionResetError, aiohttp.ClientError):
                pass
            finally:
                self._watches.discard(response)
            with contextlib.suppress(Exception):
                await response.write_eof()
            return response


def _status_body(code: int) -> dict:
    reason, message = {
        409: ("Conflict", "Operation cannot be fulfilled: the object has been modified"),
        410: ("Expired", "too old resource version"),
        429: ("TooManyRequests", "the server has received too many requests"),
        500: ("InternalError", "an error on the server has prevented the request"),
        503: ("ServiceUnavailable", "the server is currently unable to handle the request"),
    }.get(code, ("Unknown", "injected failure"))
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }
