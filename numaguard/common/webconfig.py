"""TLS and basic authentication for /metrics, configured as Prometheus' exporter-toolkit
configures node_exporter and dcgm-exporter (``--web.config.file``):

    tls_server_config:
      cert_file: server.crt        # paths relative to this file, as exporter-toolkit's
      key_file: server.key
      client_auth_type: RequireAndVerifyClientCert
      client_ca_file: ca.crt
      min_version: TLS12
    basic_auth_users:
      prometheus: $2y$10$...       # bcrypt (htpasswd -B), never the password itself

Used by both components' HTTP servers. TLS comes from the standard library's ssl,
password checks from bcrypt (in a thread, remembered once right: a bcrypt check costs
tens of milliseconds, a scrape should not).

And, with ``--web.kubernetes-auth``, scrapers authenticated and authorized by the API
server as kube-rbac-proxy does it for node_exporter in kube-prometheus: a bearer token
the API server vouches for (TokenReview) whose user may ``get`` the path as a
non-resource URL (SubjectAccessReview: Prometheus' ClusterRole in kube-prometheus-stack
grants ``get`` on ``/metrics``). The component's own ServiceAccount asks, with the
``system:auth-delegator`` ClusterRole (deploy/components/kubernetes-auth).

And what bounds every port both serve on: the connections held (BoundedSite), request
bodies read at once and how long each may take (bounded_bodies), the log of failed
accepts (quiet_accept_errors), and the open-files limit they share (all_the_files).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import hashlib
import hmac
import logging
import resource
import ssl
import time
from pathlib import Path
from typing import TYPE_CHECKING

import aiohttp
import bcrypt
import yaml
from aiohttp import web

OPEN_PATHS = ("/healthz", "/readyz")  # the kubelet's probes carry no credentials
REVIEW_TTL_SECONDS = 60.0  # how long the API server's word on a token and path holds
REVIEWS_KEPT = 1024  # of tokens the API server knows, and apart, of those it does not
# Tokens never seen are reviewed at most this many a second (after a burst): a flood of
# made-up tokens costs the API server a few reviews a second and gets 429 for the rest,
# while the tokens it already vouched for are reviewed again as they expire, unhindered.
NEW_TOKENS_PER_SECOND = 5.0
NEW_TOKENS_BURST = 10
BEARER = {"WWW-Authenticate": 'Bearer realm="numaguard"'}
REVIEW_TIMEOUT_SECONDS = 10.0
TOKEN_REVIEWS = "/apis/authentication.k8s.io/v1/tokenreviews"
ACCESS_REVIEWS = "/apis/authorization.k8s.io/v1/subjectaccessreviews"

ACCEPT_FAILED = "socket.accept() out of system resource"  # asyncio's words
HANDSHAKE_SECONDS = 10.0  # a TLS client that has not finished its handshake by then never will
log = logging.getLogger(__name__)

if TYPE_CHECKING:
    from numaguard.common.webconfig_schema import WebConfig


class ApiUnavailable(Exception):
    """The API server answered a review with an error."""


class WebConfigError(Exception):
    """The web config file cannot be used; the message says why."""


def load(path: str) -> WebConfig:
    # pydantic costs ~9 MiB of the exporter's memory with what it imports: only a
    # config file needs it
    from pydantic import ValidationError

    from numaguard.common.webconfig_schema import WebConfig

    try:
        text = Path(path).read_text()
        config = WebConfig.model_validate(yaml.safe_load(text) or {})
    except (OSError, yaml.YAMLError) as err:
        raise WebConfigError(f"{path}: {err}") from None
    except ValidationError as err:
        problems = "; ".join(
            f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in err.errors(include_url=False)
        )
        raise WebConfigError(f"{path}: {problems}") from None
    tls = config.tls_server_config
    if tls is not None:  # relative to the config file, as exporter-toolkit has it
        here = Path(path).resolve().parent
        for key in ("cert_file", "key_file", "client_ca_file"):
            value = getattr(tls, key)
            if value:
                setattr(tls, key, str(here / value))
        if tls.client_auth_type != "NoClientCert" and not tls.client_ca_file:
            raise WebConfigError(f"{path}: {tls.client_auth_type} needs client_ca_file")
    for user, hashed in config.basic_auth_users.items():
        if not hashed.startswith(("$2a$", "$2b$", "$2y$")):
            raise WebConfigError(f"{path}: basic_auth_users.{user} is not a bcrypt hash")
    return config


def ssl_context(config: WebConfig, path: str = "") -> ssl.SSLContext | None:
    """The server's TLS context, or None for plain HTTP."""
    from numaguard.common.webconfig_schema import CLIENT_AUTH, TLS_VERSIONS

    tls = config.tls_server_config
    if tls is None:
        return None
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    try:
        context.load_cert_chain(tls.cert_file, tls.key_file)
        if tls.client_ca_file:
            context.load_verify_locations(tls.client_ca_file)
    except (OSError, ssl.SSLError) as err:
        raise WebConfigError(f"{path}: tls_server_config: {err}") from None
    context.verify_mode = CLIENT_AUTH[tls.client_auth_type]
    context.minimum_version = TLS_VERSIONS[tls.min_version]
    context.maximum_version = TLS_VERSIONS[tls.max_version]
    return context


def basic_auth(users: dict[str, str]):
    """An aiohttp middleware asking for one of ``users`` (name -> bcrypt hash) on every
    path but the probes'."""
    passed: set[bytes] = set()  # digests of credentials already checked right

    def refuse() -> web.Response:
        return web.Response(
            status=401,
            text="Unauthorized\n",
            headers={"WWW-Authenticate": 'Basic realm="numaguard"'},
        )

    @web.middleware
    async def middleware(request: web.Request, handler):
        if request.path in OPEN_PATHS:
            return await handler(request)
        scheme, _, encoded = request.headers.get("Authorization", "").partition(" ")
        if scheme.lower() != "basic":
            return refuse()
        try:
            user, sep, password = base64.b64decode(encoded, validate=True).decode().partition(":")
        except (binascii.Error, UnicodeDecodeError):
            return refuse()
        hashed = users.get(user)
        if not sep or hashed is None:
            return refuse()
        digest = hashlib.sha256(f"{user}\0{password}\0{hashed}".encode()).digest()
        if not any(hmac.compare_digest(digest, d) for d in passed):
            right = await asyncio.to_thread(bcrypt.checkpw, password.encode(), hashed.encode())
            if not right:
                return refuse()
            passed.add(digest)
        return await handler(request)

    return middleware


def _plain(status: int, text: str, **headers: str) -> web.Response:
    return web.Response(status=status, text=text + "\n", headers=headers)


def kubernetes_auth(api, clock=None):
    """An aiohttp middleware letting through, on every path but the probes', only
    requests whose bearer token the API server (``api``, an ApiServer) authenticates
    and whose user it allows to ``get`` that path. Answers, remembered for
    REVIEW_TTL_SECONDS per token and path: 401 without a valid token, 403 when not
    allowed, 503 when the API server cannot be asked (nothing remembered then)."""
    clock = clock or time.monotonic
    # the API server's word, by (token hash, path, verb): on tokens it knows (200, 403),
    # and apart, so that a flood cannot push those out, on tokens it does not (401)
    known: dict[tuple[bytes, str, str], tuple[float, int]] = {}
    unknown: dict[tuple[bytes, str, str], tuple[float, int]] = {}
    asking = asyncio.Semaphore(4)  # a flood of new tokens waits, the API server is spared
    strangers = _Bucket(NEW_TOKENS_PER_SECOND, NEW_TOKENS_BURST, clock)

    async def ask(path: str, kind: str, spec: dict) -> dict:
        group = path.split("/")[2]
        body = {"apiVersion": f"{group}/v1", "kind": kind, "spec": spec}
        async with api.request("POST", path, REVIEW_TIMEOUT_SECONDS, json=body) as r:
            if r.status not in (200, 201):
                raise ApiUnavailable(f"{kind}: HTTP {r.status}")
            return (await r.json()).get("status") or {}

    async def review(token: str, path: str, verb: str) -> int:
        who = await ask(TOKEN_REVIEWS, "TokenReview", {"token": token})
        if not who.get("authenticated"):
            return 401
        user = who.get("user") or {}
        spec = {
            "user": user.get("username", ""),
            "groups": user.get("groups") or [],
            "uid": user.get("uid", ""),
            "extra": user.get("extra") or {},
            "nonResourceAttributes": {"path": path, "verb": verb},
        }
        allowed = await ask(ACCESS_REVIEWS, "SubjectAccessReview", spec)
        return 200 if allowed.get("allowed") else 403

    @web.middleware
    async def middleware(request: web.Request, handler):
        if request.path in OPEN_PATHS:
            return await handler(request)
        scheme, _, token = request.headers.get("Authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            return _plain(401, "Unauthorized: a bearer token is needed", **BEARER)
        verb = "get" if request.method in ("GET", "HEAD") else request.method.lower()
        key = (hashlib.sha256(token.encode()).digest(), request.path, verb)
        now = clock()
        remembered = known.get(key) or unknown.get(key)
        if remembered is None or remembered[0] < now:
            if key not in known and not strangers.take():
                return _plain(429, "Too many new tokens: try again later", **{"Retry-After": "1"})
            async with asking:
                try:
                    status = await review(token.strip(), request.path, verb)
                except (ApiUnavailable, aiohttp.ClientError, OSError, TimeoutError) as err:
                    reason = str(err) or type(err).__name__
                    return _plain(503, f"cannot ask the API server about this token: {reason}")
            kept = unknown if status == 401 else known
            known.pop(key, None)
            unknown.pop(key, None)
            if len(kept) >= REVIEWS_KEPT:
                kept.pop(next(iter(kept)))
            kept[key] = (now + REVIEW_TTL_SECONDS, status)
        else:
            status = remembered[1]
        if status == 401:
            return _plain(401, "Unauthorized: the API server does not know this token", **BEARER)
        if status == 403:
            return _plain(403, f"Forbidden: this user may not {verb} {request.path}")
        return await handler(request)

    return middleware


class _Bucket:
    """A token bucket: ``rate`` a second, up to ``burst`` at once."""

    def __init__(self, rate: float, burst: int, clock) -> None:
        self.rate, self.burst, self.clock = rate, burst, clock
        self.level, self.at = float(burst), clock()

    def take(self) -> bool:
        now = self.clock()
        self.level = min(self.burst, self.level + (now - self.at) * self.rate)
        self.at = now
        if self.level < 1:
            return False
        self.level -= 1
        return True


def secure(app: web.Application, config_file: str | None, kube_api=None) -> ssl.SSLContext | None:
    """Put the web config file's basic auth and, given ``kube_api``, Kubernetes
    authentication in front of ``app``; returns its TLS context (None: plain HTTP)."""
    tls = None
    if config_file:
        config = load(config_file)
        tls = ssl_context(config, config_file)
        if config.basic_auth_users:
            app.middlewares.append(basic_auth(config.basic_auth_users))
    if kube_api is not None:
        app.middlewares.append(kubernetes_auth(kube_api))
    return tls


class BoundedSite(web.TCPSite):
    """aiohttp's TCP site, holding at most ``limit`` connections: past it, a new one
    closes the connection held longest that has no request in progress (or, all busy,
    the longest held), rather than the process running out of file descriptors. TLS is
    begun on each connection once accepted (``loop.start_tls``), so that one still in
    its handshake — or never starting it — is held, counted and closed like any other."""

    __slots__ = ("_limit", "_tls")

    def __init__(self, runner, host: str, port: int, limit: int, ssl_context=None) -> None:
        super().__init__(runner, host, port)
        self._limit, self._tls = limit, ssl_context

    async def start(self) -> None:
        await web.BaseSite.start(self)  # registers with the runner, as TCPSite.start
        server = self._runner.server
        held: dict[_Held, None] = {}  # open or opening, oldest first

        def connection() -> _Held:
            if len(held) >= self._limit:
                busy = lambda h: getattr(h.handler, "_request_in_progress", False)  # noqa: E731
                idle = [h for h in held if not busy(h)]
                (idle or list(held))[0].close()
            return _Held(server(), held, self._tls)

        self._server = await asyncio.get_running_loop().create_server(
            connection, self._host, self._port, backlog=self._backlog
        )
        self._bound_port = self._server.sockets[0].getsockname()[1]


class _Held(asyncio.Protocol):
    """A connection's aiohttp handler, seen from outside: ``held`` lists it from its
    accept (before the handler's own bookkeeping sees it) until it is lost."""

    def __init__(self, handler, held: dict, tls: ssl.SSLContext | None) -> None:
        self.handler, self.held, self.tls = handler, held, tls
        self.raw: asyncio.BaseTransport | None = None  # the TCP connection, from its accept
        self.handshake: asyncio.Future | None = None  # TLS begun on it, when served so
        self.transport: asyncio.BaseTransport | None = None  # what the handler was given
        held[self] = None

    def close(self) -> None:
        self.held.pop(self, None)
        if self.transport is not None:
            self.handler.force_close()
        elif self.raw is not None:  # still in (or before) its TLS handshake
            self.raw.abort()

    def connection_made(self, transport) -> None:
        if self not in self.held:  # closed before it was made
            transport.close()
            return
        self.raw = transport
        if self.tls is None:
            self._serve(transport)
            return
        transport.pause_reading()  # the handshake's bytes are start_tls's to read
        self.handshake = asyncio.ensure_future(self._handshake(transport))

    async def _handshake(self, raw) -> None:
        loop = asyncio.get_running_loop()
        try:
            tls = await loop.start_tls(
                raw, self, self.tls, server_side=True, ssl_handshake_timeout=HANDSHAKE_SECONDS
            )
        except (OSError, ssl.SSLError, TimeoutError, RuntimeError):
            # a failed or abandoned handshake, or a connection closed meanwhile
            self.held.pop(self, None)
            raw.abort()
            return
        if self not in self.held:  # closed to make room while it shook hands
            tls.abort()
            return
        self._serve(tls)

    def _serve(self, transport) -> None:
        self.transport = transport
        self.handler.connection_made(transport)

    def connection_lost(self, exc) -> None:
        self.held.pop(self, None)
        if self.transport is not None:
            self.handler.connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        self.handler.data_received(data)

    def eof_received(self):
        return self.handler.eof_received()

    def pause_writing(self) -> None:
        self.handler.pause_writing()

    def resume_writing(self) -> None:
        self.handler.resume_writing()


def bounded_bodies(reads: int, seconds: float):
    """A middleware reading each request's body before its handler: at most ``reads``
    at once, each whole within ``seconds`` of asking (its wait for a turn included), or
    408 and the connection closed. A body nobody reads waits in the kernel (aiohttp
    stops reading a connection whose buffer is full), so slow or endless bodies on every
    connection cost ``reads`` times the largest body allowed, not one each."""
    turns = asyncio.Semaphore(reads)

    @web.middleware
    async def middleware(request: web.Request, handler):
        if request.body_exists:
            try:
                async with asyncio.timeout(seconds), turns:
                    await request.read()
            except TimeoutError:
                answer = _plain(408, f"the request's body did not come within {seconds:g}s\n")
                answer.force_close()
                return answer
        return await handler(request)

    return middleware


def quiet_accept_errors(loop: asyncio.AbstractEventLoop, every: float = 60.0, clock=time.monotonic):
    """asyncio tells the loop's exception handler of every accept that fails for want of
    descriptors, thousands a second while they last (378 MB of log in 100 s, seen): said
    once per ``every`` seconds, with how many were not said since."""
    previous = loop.get_exception_handler()
    said: dict[str, float] = {}
    unsaid = [0]

    def handler(loop: asyncio.AbstractEventLoop, context: dict) -> None:
        if context.get("message") != ACCEPT_FAILED:
            if previous is None:
                loop.default_exception_handler(context)
            else:
                previous(loop, context)
            return
        now = clock()
        if "at" in said and now - said["at"] < every:
            unsaid[0] += 1
            return
        log.error(
            "cannot accept connections: %s (%d more failed accepts since last said)",
            context.get("exception"),
            unsaid[0],
            extra={"reason": "accept_failed", "unsaid": unsaid[0]},
        )
        said["at"], unsaid[0] = now, 0

    loop.set_exception_handler(handler)


def all_the_files() -> None:
    """The soft limit on open files up to the hard one: a node's kernel files, a crowd
    of scrapers and the API server's calls share it, and 1024 is a soft default, not a
    budget."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
