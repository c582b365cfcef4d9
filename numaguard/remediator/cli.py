"""``numaguard-remediator``: ``run`` (the control loop) and ``plan`` (one cycle against the
live Prometheus and cluster, printed; never writes)."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import difflib
import json
import logging
import os
import signal
import socket
import sys
import time
import typing
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass, field, fields, replace

import aiohttp
import yaml
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from pydantic import TypeAdapter, ValidationError

from numaguard import __version__
from numaguard.common import logs, webconfig
from numaguard.common.apiserver import KubeconfigError, connect
from numaguard.common.help_text import DefaultsShown
from numaguard.remediator import steering
from numaguard.remediator.controller import Controller, CycleReport
from numaguard.remediator.core.findings import Detection
from numaguard.remediator.core.kinds import RESIZED
from numaguard.remediator.core.policy import MODES, Enforcement, FixGain, Policy
from numaguard.remediator.core.queries import Windows
from numaguard.remediator.core.rejections import describe
from numaguard.remediator.core.steering import Target
from numaguard.remediator.kube import Kube, api_client
from numaguard.remediator.leader import LeaderElector
from numaguard.remediator.metrics import Metrics
from numaguard.remediator.signals import Prometheus, Source

log = logging.getLogger("remediator")

SECTIONS = {"policy": Policy, "detection": Detection, "windows": Windows, "prometheus": Source}
# flag (argparse dest) -> (config section, key) it overrides
FLAGS = {
    "max_per_cycle": ("policy", "max_per_cycle"),
    "max_per_node": ("policy", "max_per_node"),
    "max_per_namespace": ("policy", "max_per_namespace"),
    "min_pod_age": ("policy", "min_pod_age_seconds"),
    "verify_after": ("policy", "verify_after_seconds"),
    "finding_window": ("windows", "finding"),
    "selector": ("prometheus", "selector"),
    "cluster": ("prometheus", "cluster"),
}


class ConfigError(Exception):
    pass


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


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="numaguard-remediator",
        description=(
            "Cluster controller that finds cross-socket, GPU-starved and badly sized MIG "
            "workloads from the numaguard exporters' metrics in Prometheus and fixes them "
            "safely: evictions through the Eviction API only when an aligned NUMA zone "
            "exists somewhere, opt-in MIG resizes, every guard on, dry-run by default."
        ),
        formatter_class=DefaultsShown,
    )
    p.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = p.add_subparsers(dest="command", required=True)
    for name, text in (
        ("run", "the control loop (leader-elected); dry-run unless --no-dry-run"),
        (
            "plan",
            "one cycle against the live Prometheus and cluster: print the findings "
            "and the actions it would take; never writes",
        ),
    ):
        s = sub.add_parser(
            name,
            help=text,
            description=text,
            formatter_class=DefaultsShown,
        )
        s.set_defaults(subparser=s)  # its own usage for its own errors
        s.add_argument(
            "--prometheus",
            default="http://127.0.0.1:9090",
            type=_url,
            metavar="URL",
            help="Prometheus that scrapes the numaguard exporters",
        )
        s.add_argument(
            "--config",
            metavar="FILE",
            help="YAML with sections policy, detection and windows (field names as "
            "in docs/remediator.md); flags override it",
        )
        s.add_argument(
            "--kubeconfig",
            metavar="FILE",
            help="kubeconfig; without it, as kubectl: $KUBECONFIG, ~/.kube/config, then the "
            "in-cluster service account",
        )
        s.add_argument("--max-per-cycle", type=int, metavar="N", help="actions per cycle")
        s.add_argument("--max-per-node", type=int, metavar="N", help="actions per node per cycle")
        s.add_argument(
            "--max-per-namespace", type=int, metavar="N", help="actions per namespace per cycle"
        )
        s.add_argument(
            "--min-pod-age",
            type=float,
            metavar="SECONDS",
            help="pods younger than this are never touched",
        )
        s.add_argument(
            "--protected-namespace",
            action="append",
            metavar="NS",
            help="never act in this namespace (repeatable; kube-system and its own, env "
            "POD_NAMESPACE, always)",
        )
        s.add_argument(
            "--enforce",
            action="append",
            type=_enforcement,
            metavar="KIND=MODE",
            help="what to do about a kind of finding (repeatable): KIND is "
            f"{', '.join(f.name for f in fields(Enforcement))}; MODE is act (evict or "
            "resize under every guard; while dry-run, which --no-dry-run alone ends, a DryRun "
            "Event says it would), recommend (an Event and the log say what would help; "
            "nothing else) or ignore. Default: act for all",
        )
        s.add_argument(
            "--min-fix-gain",
            action="append",
            type=_min_gain,
            metavar="KIND=GAIN",
            help="the least gain a fix of a kind of finding must show to count as paid off "
            "(repeatable): the workload's GPU work after / before (its share of local memory "
            "without GPU activity). KIND is "
            f"{', '.join(f.name for f in fields(FixGain))}; less, and the fix that cleared "
            "its finding is verified no_gain and counts like one that did not hold; 0: any. "
            "Default: " + ", ".join(f"{f.name}={f.default:g}" for f in fields(FixGain)),
        )
        s.add_argument(
            "--finding-window",
            metavar="DURATION",
            help="how long a condition must hold to be a finding (PromQL duration)",
        )
        s.add_argument(
            "--verify-after",
            type=float,
            metavar="SECONDS",
            help="how long a fixed workload's replacement must be seen aligned before the "
            "fix counts as held",
        )
        s.add_argument(
            "--selector",
            metavar="MATCHERS",
            help='label matchers selecting the exporters\' own series (default job="numaguard", '
            "as the alert rules); series of other scrape targets are never read",
        )
        s.add_argument(
            "--cluster",
            metavar="NAME",
            help="where Prometheus is a view of several clusters (Thanos, Mimir): the value "
            "of the cluster label of the one to act on; every query selects it. Unset, a "
            "view of several clusters ends each cycle with no action",
        )
        s.add_argument("--log-format", choices=("json", "text"), default="json", help=" ")
        s.add_argument(
            "--log-level", choices=("debug", "info", "warning", "error"), default="info", help=" "
        )
        if name == "plan":
            s.add_argument("--output", choices=("table", "json"), default="table", help=" ")
        else:
            s.add_argument(
                "--interval",
                type=float,
                default=60.0,
                metavar="SECONDS",
                help="time between cycles",
            )
            dry = s.add_mutually_exclusive_group()
            dry.add_argument(
                "--dry-run",
                dest="dry_run",
                action="store_true",
                default=None,
                help="plan, and write only Events saying what would be done (and the "
                "Lease): the default, unless the config says policy.dry_run: false",
            )
            dry.add_argument(
                "--no-dry-run",
                dest="dry_run",
                action="store_false",
                help="evict and patch for real",
            )
            s.add_argument(
                "--listen",
                default="0.0.0.0:9848",
                metavar="HOST:PORT",
                help="where to serve /metrics and /healthz",
            )
            s.add_argument(
                "--web.config.file",
                dest="web_config_file",
                default=None,
                metavar="FILE",
                help="TLS and basic authentication for /metrics, in the format of "
                "Prometheus' exporter-toolkit (as the exporter's); /healthz stays open",
            )
            s.add_argument(
                "--web.idle-timeout",
                dest="idle_timeout",
                type=float,
                default=30.0,
                metavar="SECONDS",
                help="close a connection that has not sent a whole request for this long "
                "(idle keep-alives, slow clients), on each port, as the exporter's",
            )
            s.add_argument(
                "--web.max-connections",
                dest="max_connections",
                type=int,
                default=256,
                metavar="N",
                help="connections held at once on each port (metrics, the steering "
                "webhook); past it the longest-held idle one is closed to make room, as the "
                "exporter's",
            )
            s.add_argument(
                "--web.kubernetes-auth",
                dest="web_kubernetes_auth",
                action="store_true",
                help="let only scrapers the API server authenticates and allows to get "
                "/metrics (TokenReview, SubjectAccessReview), as the exporter's",
            )
            steer = s.add_argument_group(
                "steering (deploy/components/steering)",
                "send each evicted pod's replacement to the nodes whose NUMA zones fit, "
                "through a mutating webhook this process serves; the API server calls it "
                "only for pods of workloads awaiting verification",
            )
            steer.add_argument(
                "--steer",
                action="store_true",
                help="serve the webhook and keep its configuration (opt-in)",
            )
            steer.add_argument(
                "--webhook-listen",
                default="0.0.0.0:8443",
                metavar="HOST:PORT",
                help="where to serve it (TLS)",
            )
            steer.add_argument(
                "--webhook-configuration",
                default="numaguard-remediator",
                metavar="NAME",
                help="the MutatingWebhookConfiguration it keeps (the only one it may write)",
            )
            steer.add_argument(
                "--webhook-service",
                default="numaguard-remediator-webhook:443",
                metavar="NAME:PORT",
                help="the Service the API server reaches it by, in --lease-namespace",
            )
            steer.add_argument(
                "--webhook-url",
                type=_url,
                metavar="URL",
                help="https://HOST:PORT the API server reaches it at, instead of the Service "
                "(a remediator outside the cluster)",
            )
            steer.add_argument(
                "--webhook-secret",
                default="numaguard-remediator-webhook",
                metavar="NAME",
                help="the Secret (in --lease-namespace) holding its certificate: made by "
                "the leader when missing, or yours (kubernetes.io/tls, with ca.crt)",
            )
            s.add_argument(
                "--lease-namespace",
                default=os.environ.get("POD_NAMESPACE", "numaguard"),
                help="namespace of the leader-election Lease (env POD_NAMESPACE)",
            )
            s.add_argument(
                "--lease-name",
                default="numaguard-remediator",
                help="the Lease; annotate it numaguard.io/paused=true to pause",
            )
            s.add_argument(
                "--identity",
                default=os.environ.get("POD_NAME", socket.gethostname()),
                help="this replica's name in the Lease (env POD_NAME)",
            )
            s.add_argument(
                "--lease-duration",
                type=int,
                default=15,
                metavar="SECONDS",
                help="how long others wait, after they last saw the Lease change, before "
                "taking it over",
            )
            s.add_argument(
                "--renew-deadline",
                type=float,
                default=10.0,
                metavar="SECONDS",
                help="the leader stops acting when it could not renew for this long (less "
                "than the lease duration)",
            )
            s.add_argument(
                "--retry-period",
                type=float,
                default=2.0,
                metavar="SECONDS",
                help="how often the Lease is renewed or tried, in the background",
            )
    return p


def settings(args: argparse.Namespace) -> tuple[Policy, Detection, Windows, Source]:
    """The config file's sections with the flags over them, validated as a whole: a
    wrong value is a ConfigError naming the key, the value and what is allowed."""
    sections: dict[str, dict] = {name: {} for name in SECTIONS}
    where = args.config or "flags"
    if args.config:
        try:
            with open(args.config) as f:
                loaded = yaml.safe_load(f) or {}
        except (OSError, yaml.YAMLError) as err:
            raise ConfigError(f"{args.config}: {err}") from None
        if not isinstance(loaded, dict) or set(loaded) - set(SECTIONS):
            raise ConfigError(f"{args.config}: top-level keys must be among {sorted(SECTIONS)}")
        for section, values in loaded.items():
            if not isinstance(values, dict):
                raise ConfigError(f"{args.config}: {section} must be a mapping, got {values!r}")
            sections[section] = dict(values)
    for flag, (section, key) in FLAGS.items():
        value = getattr(args, flag, None)
        if value is not None:
            sections[section][key] = value
    for flag, key in (("enforce", "enforcement"), ("min_fix_gain", "min_fix_gain")):
        for kind, value in getattr(args, flag, None) or ():
            sections["policy"].setdefault(key, {})
            if isinstance(sections["policy"][key], dict):  # else pydantic says why
                sections["policy"][key][kind] = value
    if getattr(args, "dry_run", None) is not None:  # `run --dry-run` / `--no-dry-run`
        sections["policy"]["dry_run"] = args.dry_run
    built, problems = {}, []
    for name, cls in SECTIONS.items():
        try:
            built[name] = TypeAdapter(cls).validate_python(sections[name])
        except ValidationError as err:
            problems += [_problem(name, e, cls) for e in err.errors()]
    if problems:
        raise ConfigError(f"{where}: {'; '.join(problems)}")
    policy = built["policy"]
    # its own namespace (where it is installed, with the exporters) is never acted in
    own = [os.environ["POD_NAMESPACE"]] if os.environ.get("POD_NAMESPACE") else []
    if args.protected_namespace or own:
        protected = (*policy.protected_namespaces, *(args.protected_namespace or ()), *own)
        policy = replace(policy, protected_namespaces=protected)
    return policy, built["detection"], built["windows"], built["prometheus"]


def _problem(section: str, error: dict, record: type) -> str:
    """One validation error, named by where it is (one across a section's fields, its
    __post_init__, by the section), in words a user can act on."""
    message = error["msg"].removeprefix("Value error, ")
    if not error["loc"]:
        return f"{section}: {message}"
    where = f"{section}.{'.'.join(map(str, error['loc']))}"
    if error["type"] == "unexpected_keyword_argument":
        for part in error["loc"][:-1]:  # the record the key was given to
            record = typing.get_type_hints(record).get(part)
        keys = [f.name for f in fields(record)] if dataclasses.is_dataclass(record) else []
        near = difflib.get_close_matches(str(error["loc"][-1]), keys, n=1)
        hint = f"did you mean {near[0]}?" if near else f"the keys are {', '.join(keys)}"
        return f"{where}: no such setting ({hint})"
    return f"{where}: {message} (got {error['input']!r})"


def _url(text: str) -> str:
    """An http(s) URL: without a scheme every query would fail as unreachable."""
    parsed = urllib.parse.urlsplit(text)
    if parsed.scheme not in ("http", "https") or not parsed.netloc:
        raise argparse.ArgumentTypeError(
            f"{text!r} is no http(s) URL: give the scheme too, e.g. http://{text.split('://')[-1]}"
        )
    return text


def _enforcement(text: str) -> tuple[str, str]:
    kind, sep, mode = text.partition("=")
    kinds = [f.name for f in fields(Enforcement)]
    # the resize kinds are enforced together (one policy), their gains set per direction
    if kind in RESIZED and sep and mode in MODES:
        raise argparse.ArgumentTypeError(
            f"{text!r}: undersized and oversized slices are enforced together, as "
            f"mis_sized: give mis_sized={mode}"
        )
    if not sep or kind not in kinds or mode not in MODES:
        raise argparse.ArgumentTypeError(
            f"{text!r}: give KIND=MODE, KIND one of {', '.join(kinds)}, MODE one of "
            f"{', '.join(MODES)}"
        )
    return kind, mode


def _min_gain(text: str) -> tuple[str, float]:
    kind, sep, value = text.partition("=")
    kinds = [f.name for f in fields(FixGain)]
    try:
        gain = float(value)
    except ValueError:
        gain = -1.0
    if kind == "mis_sized" and sep:
        raise argparse.ArgumentTypeError(
            f"{text!r}: a resize's gain is set per direction: give undersized={value} and/or "
            f"oversized={value}"
        )
    if not sep or kind not in kinds or not 0 <= gain < float("inf"):
        raise argparse.ArgumentTypeError(
            f"{text!r}: give KIND=GAIN, KIND one of {', '.join(kinds)}, GAIN a number >= 0"
        )
    return kind, gain


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


def render(report: CycleReport, output: str) -> str:
    return _json(report) if output == "json" else _table(report)


def _json(report: CycleReport) -> str:
    return json.dumps(
        {
            "error": report.error,
            "warning": report.warning,
            "findings": [vars(f) for f in report.findings],
            "actions": [
                {
                    "kind": a.kind,
                    "pod": f"{a.finding.namespace}/{a.finding.pod}",
                    "finding": a.finding.kind,
                    "reason": a.finding.reason,
                    "detail": a.detail,
                    "dry_run": a.dry_run,
                }
                for a in (report.plan.actions if report.plan else ())
            ],
            "refusals": [
                {
                    "pod": f"{r.finding.namespace}/{r.finding.pod}",
                    "finding": r.finding.kind,
                    "reason": r.finding.reason,
                    "guard": r.guard,
                    "detail": r.detail,
                }
                for r in (report.plan.refusals if report.plan else ())
            ],
            "rejected_pods": [
                {
                    "workload": st.workload,
                    "node": st.node,
                    "reason": st.reason,
                    "pods": len(st.pods),
                    "delete": [p.name for p in st.delete],
                    "held_back": st.guard,
                    "fits_on": list(st.fit) if st.fit else None,
                }
                for st in report.storms
            ],
            "ignored": [
                {
                    "pod": f"{f.namespace}/{f.pod}",
                    "finding": f.kind,
                    "reason": f.reason,
                }
                for f in (report.plan.ignored if report.plan else ())
            ],
        },
        indent=1,
    )


def _table(report: CycleReport) -> str:
    if report.error:
        return f"no plan: {report.error}"
    lines = [f"warning: {report.warning}"] if report.warning else []
    lines.append(f"{len(report.findings)} findings")
    rows = [("pod", "finding", "decision", "why")]
    for a in report.plan.actions:
        rows.append(
            (
                f"{a.finding.namespace}/{a.finding.pod}",
                f"{a.finding.kind}:{a.finding.reason}",
                a.kind,
                a.detail,
            )
        )
    for r in report.plan.refusals:
        rows.append(
            (
                f"{r.finding.namespace}/{r.finding.pod}",
                f"{r.finding.kind}:{r.finding.reason}",
                f"refused ({r.guard})",
                r.detail,
            )
        )
    for f in report.plan.ignored:
        rows.append((f"{f.namespace}/{f.pod}", f"{f.kind}:{f.reason}", "ignored", "policy"))
    for st in report.storms:
        decision = f"delete {len(st.delete)}" if st.delete else f"keep ({st.guard or 'few'})"
        rows.append((st.workload, f"rejected:{st.reason}", decision, describe(st)))
    widths = [max(len(row[i]) for row in rows) for i in range(3)]
    for row in rows:
        lines.append(
            "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=False)) + "  " + row[3]
        )
    return "\n".join(lines)


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
    runner, scrapers = await _serve_metrics(args, metrics, health)
    election = asyncio.create_task(elector.run(release))  # renews whatever the cycle does
    serving: asyncio.Task | None = None  # the steering webhook, once served
    controller: Controller | None = None
    try:
        async with aiohttp.ClientSession() as session:
            controller = await _controller(args, session, kube, elector, metrics)
            controller.actuator.stopping = stop.is_set
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


async def _serve_metrics(args, metrics: Metrics, health: Health):
    """/metrics and /healthz on --listen: (the runner, the client that authenticates
    scrapers or None)."""

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
    app.add_routes([web.get("/metrics", serve), web.get("/healthz", healthz)])
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
