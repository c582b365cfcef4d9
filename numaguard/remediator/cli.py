"""``numaguard-remediator``: ``run`` (the control loop) and ``plan`` (one cycle against the
live Prometheus and cluster, printed; never writes)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import sys
import time
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass, field

import aiohttp
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from numaguard.common import logs, webconfig
from numaguard.common.apiserver import KubeconfigError, connect
from numaguard.remediator import steering
from numaguard.remediator.arguments import parser
from numaguard.remediator.config import ConfigError, settings
from numaguard.remediator.controller import Controller
from numaguard.remediator.core.decisions import decisions
from numaguard.remediator.core.steering import Target
from numaguard.remediator.decisions_page import render as render_decisions
from numaguard.remediator.kube import Kube, api_client
from numaguard.remediator.leader import LeaderElector
from numaguard.remediator.metrics import Metrics
from numaguard.remediator.report import render
from numaguard.remediator.signals import Prometheus

log = logging.getLogger("remediator")


@dataclass
class Health:
    """/healthz: ok while some cycle ended without an internal error in the last
    ``limit`` seconds. Stuck, or failing every time, a restart is what helps; a cycle
    that found its data doubtful ended."""

    limit: float
    clock: Callable[[], float] = time.monotonic
    last: float = field(init=False)

    def __post_init__(self) -> None:
        self.last = self.clock()  # starting counts as a cycle ended

    def ended(self) -> None:
        self.last = self.clock()

    def ok(self) -> bool:
        return self.clock() - self.last < self.limit


async def _controller(args, session, kube, elector, metrics) -> Controller:
    policy, detection, windows, source = settings(args)
    prometheus = Prometheus(args.prometheus, session, source, windows=windows)
    return Controller(prometheus, kube, policy, detection, elector, metrics)


async def plan_command(args) -> int:
    api = await api_client(args.kubeconfig)
    async with aiohttp.ClientSession() as session:
        try:
            controller = await _controller(args, session, Kube(api) if api else None, None, None)
            report = await controller.cycle(write=False)
        finally:
            if api is not None:
                await api.close()
    print(render(report, args.output))
    return 1 if report.error else 0


async def run_command(args) -> int:
    stop = asyncio.Event()  # SIGTERM: the cycle stops at its next write
    loop = asyncio.get_running_loop()
    webconfig.quiet_accept_errors(loop)
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    kube = await _answering_kube(args.kubeconfig, stop)
    if kube is None:  # stopped while the API server did not answer
        return 0
    metrics = Metrics()

    def leadership(leading: bool) -> None:
        metrics.leader.set(int(leading))
        log.info(
            "leading" if leading else "not leading",
            extra={"identity": args.identity, "lease": args.lease_name, "leading": leading},
        )

    elector = LeaderElector(
        kube,
        args.lease_namespace,
        args.lease_name,
        args.identity,
        lease_duration=args.lease_duration,
        renew_deadline=args.renew_deadline,
        retry_period=args.retry_period,
        on_change=leadership,
    )
    release = asyncio.Event()  # then, the cycle over, the Lease is let go
    health = Health(3 * args.interval + 60)
    shown: list[Controller] = []  # the controller, once made: the decision page's source
    runner, scrapers = await _serve_metrics(args, metrics, health, shown)
    election = asyncio.create_task(elector.run(release))  # renews whatever the cycle does
    serving: asyncio.Task | None = None  # the steering webhook, once served
    controller: Controller | None = None
    try:
        async with aiohttp.ClientSession() as session:
            controller = await _controller(args, session, kube, elector, metrics)
            controller.actuator.stopping = stop.is_set
            shown.append(controller)
            if args.steer:
                serving = asyncio.create_task(_steering(args, kube, controller, stop))
            log.info(
                "remediator started",
                extra={
                    "dry_run": controller.policy.dry_run,
                    "prometheus": args.prometheus,
                    "identity": args.identity,
                },
            )
            while not stop.is_set():
                try:
                    await controller.cycle()
                except Exception:  # one bad cycle must not end the loop ...
                    log.exception("remediation cycle failed")
                    metrics.errors.labels("internal").inc()
                else:  # ... but cycles that keep failing so make /healthz fail
                    health.ended()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), args.interval)
    finally:
        if controller is not None and controller.steering is not None:
            # no entry outlives the leader: every replica may be stopping (scaled to 0),
            # and the API server would call a webhook nobody serves for each new pod
            with contextlib.suppress(aiohttp.ClientError, OSError, TimeoutError):
                await controller.actuator.steer(
                    controller.steering, time.time(), pending=frozenset(), last=True
                )
        release.set()
        if serving is not None:
            webhook = await serving
            if webhook is not None:
                await webhook.cleanup()
        await election  # releases the Lease
        await runner.cleanup()
        await kube.api.close()
        if scrapers is not None:
            await scrapers.close()
    log.info("remediator stopped", extra={"identity": args.identity})
    return 0


async def _steering(args, kube: Kube, controller: Controller, stop: asyncio.Event):
    """Serve the steering webhook once its certificate is there (the leader makes it
    when missing), then let the controller steer: its runner, or None if stopped first."""
    namespace, name = args.lease_namespace, args.webhook_secret
    service, _, port = args.webhook_service.rpartition(":")
    hosts = [service, f"{service}.{namespace}", f"{service}.{namespace}.svc"]
    if args.webhook_url:
        hosts.insert(0, urllib.parse.urlsplit(args.webhook_url).hostname)
    while not stop.is_set():
        try:
            answer = await kube.get(f"/api/v1/namespaces/{namespace}/secrets/{name}")
            material = steering.from_secret(answer.body) if answer.ok else None
            if answer.ok and material is None:  # as the install made it: empty
                data = steering.secret_data(steering.certificate(hosts))
                filled = await controller.actuator.fill_secret(answer.body, data)
                if filled in ("ok", "conflict"):
                    continue  # read back what was written, by this replica or another
            elif material is not None:
                host, _, listen = args.webhook_listen.rpartition(":")
                runner = await steering.serve(
                    material,
                    host or "0.0.0.0",
                    int(listen),
                    args.max_connections,
                    args.idle_timeout,
                )
                reached = {"namespace": namespace, "name": service, "port": int(port)}
                controller.steering = Target(
                    args.webhook_configuration,
                    material["ca.crt"],
                    None if args.webhook_url else reached,
                    args.webhook_url or "",
                )
                log.info("steering webhook served", extra={"listen": args.webhook_listen})
                return runner
            elif answer.status == 404:
                log.warning(
                    "webhook certificate Secret %s/%s is missing: deploy/components/steering "
                    "and the chart make it (empty, for the leader to fill)",
                    namespace,
                    name,
                )
            else:
                log.warning("webhook certificate %s/%s: HTTP %s", namespace, name, answer.status)
        except (aiohttp.ClientError, OSError, TimeoutError) as err:
            log.warning("steering webhook not served yet: %r", err)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), args.retry_period)
    return None


async def _answering_kube(kubeconfig: str | None, stop: asyncio.Event) -> Kube | None:
    """The API server's client, once the server answers (asked again with backoff, as a
    controller rides out an API server restart); None if stopped first; a
    KubeconfigError when there is no kubeconfig at all."""
    api = await api_client(kubeconfig)
    if api is None:
        raise KubeconfigError(
            "no kubeconfig ($KUBECONFIG, ~/.kube/config) and not in a cluster: run needs "
            "the API server"
        )
    kube = Kube(api)
    delay = 1.0
    while True:
        try:
            version = await kube.get("/version")
        except (aiohttp.ClientError, OSError, TimeoutError) as err:
            version, reason = None, str(err) or type(err).__name__
        else:
            reason = f"HTTP {version.status}"
        if version is not None and version.ok:
            return kube
        log.warning(
            "the API server does not answer (%s): asking again in %gs",
            reason,
            delay,
            extra={"reason": reason, "retry_seconds": delay},
        )
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), delay)
            await api.close()
            return None
        delay = min(2 * delay, 30.0)


def decisions_handler(shown: list):
    """GET /decisions (?format=json): the decision page of the controller ``shown``
    holds, once there is one and it has run a cycle."""

    async def decided(request):
        wanted = request.query.get("format", "html")
        if wanted not in ("html", "json"):
            return web.Response(status=400, text="format is html or json\n")
        controller = shown[0] if shown else None
        if controller is None or controller.last_report is None:
            return web.Response(status=503, text="no cycle has run yet\n")
        data = decisions(controller.last_report, controller.outcomes, controller.policy)
        if wanted == "json":
            return web.json_response(data)
        headers = {"Content-Security-Policy": "default-src 'none'; style-src 'unsafe-inline'"}
        return web.Response(text=render_decisions(data), content_type="text/html", headers=headers)

    return decided


async def _serve_metrics(args, metrics: Metrics, health: Health, shown: list):
    """/metrics, /decisions and /healthz on --listen: (the runner, the client that
    authenticates scrapers or None). ``shown``: the controller, once there is one."""
    decided = decisions_handler(shown)

    async def serve(_):
        return web.Response(
            body=generate_latest(metrics.registry), headers={"Content-Type": CONTENT_TYPE_LATEST}
        )

    async def healthz(_):
        if health.ok():
            return web.Response(text="ok")
        text = f"no cycle has ended without an internal error in {health.limit:g}s"
        return web.Response(status=503, text=text)

    app = web.Application()
    app.add_routes(
        [web.get("/metrics", serve), web.get("/decisions", decided), web.get("/healthz", healthz)]
    )
    scrapers = connect(args.kubeconfig) if args.web_kubernetes_auth else None
    tls = webconfig.secure(app, args.web_config_file, scrapers)
    runner = web.AppRunner(
        app, access_log=None, handle_signals=False, keepalive_timeout=args.idle_timeout
    )
    await runner.setup()
    host, _, port = args.listen.rpartition(":")
    site = webconfig.BoundedSite(runner, host or "0.0.0.0", int(port), args.max_connections, tls)
    await site.start()
    return runner, scrapers


def main(argv: list[str] | None = None) -> int:
    p = parser()
    args = p.parse_args(argv)
    try:
        settings(args)
        if args.command == "run" and not 0 < args.retry_period < args.renew_deadline < (
            args.lease_duration
        ):
            raise ConfigError(
                "leader election needs 0 < --retry-period < --renew-deadline < --lease-duration"
            )
        if args.command == "run" and (args.max_connections < 1 or args.idle_timeout <= 0):
            raise ConfigError("--web.max-connections and --web.idle-timeout want positive numbers")
        if getattr(args, "web_config_file", None):  # a bad file: an error before starting
            webconfig.ssl_context(webconfig.load(args.web_config_file), args.web_config_file)
    except ConfigError as err:
        args.subparser.error(str(err))
    except webconfig.WebConfigError as err:
        args.subparser.error(f"--web.config.file {err}")
    logs.setup(args.log_format, args.log_level)
    webconfig.all_the_files()
    try:
        return asyncio.run(plan_command(args) if args.command == "plan" else run_command(args))
    except KubeconfigError as err:
        print(f"numaguard-remediator: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
