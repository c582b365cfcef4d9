"""``numaguard-remediator``'s command line: its commands, their flags and their help."""

from __future__ import annotations

import argparse
import os
import socket
import urllib.parse
from dataclasses import fields

from numaguard import __version__
from numaguard.common import logs
from numaguard.common.help_text import DefaultsShown
from numaguard.remediator.core.kinds import RESIZED
from numaguard.remediator.core.policy import MODES, Enforcement, FixGain


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
            "nothing else) or ignore. Default: act for all but gpu_fragmentation (recommend)",
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
        logs.add_arguments(s)
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
                help="where to serve /metrics, /decisions (the last cycle) and /healthz",
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
