"""``numaguard-exporter``: command line."""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import sys

from numaguard.common import logs, webconfig
from numaguard.common.apiserver import KubeconfigError, find_kubeconfig, in_cluster
from numaguard.common.help_text import DefaultsShown
from numaguard.common.process import one_malloc_arena
from numaguard.contract.reasons import STARVED_REASONS, STARVED_THRESHOLDS
from numaguard.exporter import __version__
from numaguard.exporter.collectors import COLLECTORS
from numaguard.exporter.model.thresholds import Thresholds
from numaguard.exporter.server import serve
from numaguard.exporter.settings import Settings
from numaguard.exporter.sources.gpu import GpuBackendError
from numaguard.exporter.sources.kubelet import DEFAULT_SOCKET
from numaguard.exporter.sources.resctrl import MODES

DEFAULT_PORT = 9847


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="numaguard-exporter",
        description=(
            "Per-node Prometheus exporter of NUMA placement: the host's NUMA nodes, "
            "memory and allocation locality, and where every pod's CPUs and memory sit. "
            "Scrapes are served from bytes rendered at the end of the last collection "
            "cycle, so they never wait on the kernel."
        ),
        formatter_class=DefaultsShown,
    )
    p.add_argument(
        "--host-root",
        default="/",
        metavar="DIR",
        help="where the host's / is visible (in the DaemonSet: /host, mounted "
        "read-only); sysfs, procfs and cgroups are read below it",
    )
    p.add_argument(
        "--listen",
        default=f"0.0.0.0:{DEFAULT_PORT}",
        metavar="HOST:PORT",
        help="address to serve /metrics, /placement, /healthz and /readyz on (port 0: any free)",
    )
    p.add_argument(
        "--node-name",
        default="",
        help="Kubernetes node name for the node label; empty: env NODE_NAME, else the hostname",
    )
    p.add_argument(
        "--interval",
        type=_positive,
        default=15.0,
        metavar="SECONDS",
        help="time between collection cycles",
    )
    p.add_argument(
        "--collector-timeout",
        type=_positive,
        default=10.0,
        metavar="SECONDS",
        help="a collector that takes longer is reported failed (reason timeout) "
        "for the cycle; the scrape keeps answering",
    )
    p.add_argument(
        "--kubeconfig",
        metavar="FILE",
        help="kubeconfig for pod names from the API server; without it, as kubectl: "
        "$KUBECONFIG, ~/.kube/config, then the in-cluster service account; with none, "
        "pod series carry only pod_uid and container_id",
    )
    p.add_argument(
        "--memory-remote-threshold",
        type=_ratio,
        default=0.3,
        metavar="RATIO",
        help="pod_cross_numa{reason=memory_remote} is 1 when at least this share of "
        "a pod's memory sits on NUMA nodes that hold none of its CPUs",
    )
    p.add_argument(
        "--memory-remote-min-bytes",
        type=int,
        default=64 << 20,
        metavar="BYTES",
        help="pods with less memory than this are never flagged memory_remote",
    )
    p.add_argument(
        "--gpu-starved-utilization",
        type=_ratio,
        default=0.3,
        metavar="RATIO",
        help="gpu_starved needs a device with processes whose SM activity (graphics where "
        "SM is not measured) stayed under this over the last interval",
    )
    for reason in STARVED_REASONS:
        if reason.default is None:
            continue  # the pod's cross-NUMA verdict decides
        flag = f"--gpu-starved-{reason.name.replace('_', '-')}"
        # --gpu-starved-throttled: the name cpu_throttled's flag had first
        old = ("--gpu-starved-throttled",) if reason.name == "cpu_throttled" else ()
        p.add_argument(
            flag,
            *old,
            dest=f"starved_{reason.name}",
            type=_ratio,
            default=reason.default,
            metavar="RATIO",
            help=f"gpu_starved{{reason={reason.name}}}: {reason.measure}",
        )
    p.add_argument(
        "--resctrl-mode",
        choices=MODES,
        default="auto",
        help="memory traffic and LLC per pod through resctrl (sys/fs/resctrl under the host "
        "root): manage creates one monitoring group per pod and keeps its tasks current; "
        "read-only reads existing groups; auto is manage when the tree is writable, else "
        "read-only",
    )
    p.add_argument(
        "--gpu-backend",
        default="auto",
        choices=("auto", "nvml", "none"),
        help="where GPU and MIG metrics come from: the driver's libnvidia-ml, where there is "
        "one (auto: without a driver, one log line and no GPU metrics), or must be (nvml, "
        "for GPU nodes: without a driver the gpu collector fails with reason driver, and "
        "NVML is tried again every cycle), or none",
    )
    p.add_argument(
        "--pod-resources-socket",
        metavar="PATH",
        help="the kubelet's PodResources gRPC socket, for which pod holds which GPU, MIG "
        "slice and exclusive CPUs, and what each NUMA node can still give; unset: "
        f"{DEFAULT_SOCKET} when it exists, else devices are attributed by their processes",
    )
    p.add_argument(
        "--max-pods",
        type=int,
        default=1000,
        metavar="N",
        help="the cardinality guard: on a node with more pods than this, export no pod or "
        "container series (node-wide ones stay) and numaguard_series_limited 1, so that a "
        "runaway node cannot take the exporter past its memory limit (a kubelet runs 110 "
        "by default)",
    )
    p.add_argument(
        "--detail",
        action="store_true",
        help="also export the breakdowns a fleet need not pay for: every container's "
        "series (CPUs and memory per NUMA node, throttling, pressure), every pod's CPUs "
        "per NUMA node, per-L3-domain traffic and LLC bytes, per-slice PCIe; off: about "
        "3,000 series on a 150-pod, 56-slice node instead of about 11,000 (docs/metrics.md "
        "marks each family)",
    )
    p.add_argument(
        "--web.config.file",
        dest="web_config_file",
        default=None,
        metavar="FILE",
        help="TLS and basic authentication for the HTTP server, in the format of "
        "Prometheus' exporter-toolkit (tls_server_config, basic_auth_users with bcrypt "
        "hashes), as node_exporter takes it; /healthz and /readyz stay open to probes",
    )
    p.add_argument(
        "--web.idle-timeout",
        dest="idle_timeout",
        type=float,
        default=30.0,
        metavar="SECONDS",
        help="close a connection that has not sent a whole request for this long: idle "
        "keep-alive connections, and clients that send slowly or not at all",
    )
    p.add_argument(
        "--web.max-connections",
        dest="max_connections",
        type=int,
        default=256,
        metavar="N",
        help="connections held at once; past it the longest-held idle connection is closed "
        "to make room, so that a crowd of clients cannot starve a scrape or use up the "
        "open files the collectors need",
    )
    p.add_argument(
        "--web.kubernetes-auth",
        dest="web_kubernetes_auth",
        action="store_true",
        help="let only scrapers whose bearer token the API server authenticates "
        "(TokenReview) and allows to get the path (SubjectAccessReview, e.g. Prometheus' "
        "ClusterRole's nonResourceURLs /metrics), as kube-rbac-proxy does; needs the API "
        "server and the system:auth-delegator ClusterRole (deploy/components/kubernetes-auth)",
    )
    p.add_argument(
        "--nrt",
        action="store_true",
        help="publish this node's NodeResourceTopology (topology.node.k8s.io/v1alpha2, read "
        "by the scheduler's NodeResourceTopologyMatch plugin) from the numaguard_zone_* "
        "figures, each cycle they change; needs the API server, the CRD and "
        "deploy/components/nrt's RBAC",
    )
    p.add_argument(
        "--kubelet-config",
        "--nrt.kubelet-config",  # its name before the CPU manager's options were read
        dest="kubelet_config",
        default="/var/lib/kubelet/config.yaml",
        metavar="PATH",
        help="the kubelet's configuration file, under --host-root: its CPU manager's policy "
        "and options (numaguard_kubelet_cpu_manager_info), and with --nrt those and its "
        "Topology Manager's policy and scope as the NodeResourceTopology's attributes; "
        "where it is missing they are left out",
    )
    p.add_argument(
        "--memory-mover",
        action="store_true",
        help="move a pod's memory home in place when it asks (the numaguard.io/move-memory "
        "annotation the remediator writes): the pages of its own processes that sit on NUMA "
        "nodes none of its exclusive CPUs is on, moved with move_pages(2) to its CPUs' node "
        "with most free memory that its cpuset.mems allows, never against the Memory "
        "Manager's pinning; needs the API server, hostPID and the memory mover's helper "
        "(numaguard-memory-mover, which alone holds CAP_SYS_PTRACE: "
        "deploy/components/memory-mover)",
    )
    p.add_argument(
        "--memory-mover.socket",
        dest="memory_mover_socket",
        default="/run/numaguard/memory-mover.sock",
        metavar="PATH",
        help="the memory mover's helper's Unix socket (its --socket); the helper moves at "
        "its own --rate",
    )
    # an earlier release's flag: said where it went, rather than "unrecognized"
    p.add_argument("--memory-mover.rate", dest="memory_mover_rate", help=argparse.SUPPRESS)
    for name, collector in COLLECTORS.items():
        p.add_argument(
            f"--collector.{name}",
            dest=f"collector_{name}",
            action=argparse.BooleanOptionalAction,
            default=collector.default,
            help=f"the {name} collector: {collector.help}",
        )
    logs.add_arguments(p)
    p.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    return p


def settings_from(args: argparse.Namespace) -> Settings:
    host, port = parse_listen(args.listen)
    return Settings(
        host_root=args.host_root,
        host=host,
        port=port,
        node_name=args.node_name or os.environ.get("NODE_NAME") or socket.gethostname(),
        interval_seconds=args.interval,
        collector_timeout_seconds=args.collector_timeout,
        kubeconfig=args.kubeconfig,
        thresholds=Thresholds(
            memory_remote_ratio=args.memory_remote_threshold,
            memory_remote_min_bytes=args.memory_remote_min_bytes,
            gpu_starved_utilization=args.gpu_starved_utilization,
            starved={name: getattr(args, f"starved_{name}") for name in STARVED_THRESHOLDS},
        ),
        resctrl_mode=args.resctrl_mode,
        gpu_backend=args.gpu_backend,
        pod_resources_socket=args.pod_resources_socket,
        web_config_file=args.web_config_file,
        web_kubernetes_auth=args.web_kubernetes_auth,
        idle_timeout_seconds=args.idle_timeout,
        max_connections=args.max_connections,
        max_pods=args.max_pods,
        detail=args.detail,
        collectors=frozenset(n for n in COLLECTORS if getattr(args, f"collector_{n}")),
        nrt=args.nrt,
        kubelet_config=args.kubelet_config,
        memory_mover=args.memory_mover,
        memory_mover_socket=args.memory_mover_socket,
    )


def parse_listen(value: str) -> tuple[str, int]:
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit() or int(port) > 65535:
        raise argparse.ArgumentTypeError(f"--listen wants HOST:PORT, got {value!r}")
    return host.strip("[]") or "0.0.0.0", int(port)


def main(argv: list[str] | None = None) -> int:
    p = parser()
    args = p.parse_args(argv)
    try:
        settings = settings_from(args)
    except argparse.ArgumentTypeError as err:
        p.error(str(err))
    if not os.path.isdir(args.host_root):
        p.error(f"--host-root {args.host_root!r} is not a directory")
    if args.kubeconfig and not os.path.isfile(args.kubeconfig):
        p.error(f"--kubeconfig {args.kubeconfig!r} is not a file")
    if args.web_config_file:
        try:  # read once here: a bad file is a clear error before anything starts
            webconfig.ssl_context(webconfig.load(args.web_config_file), args.web_config_file)
        except webconfig.WebConfigError as err:
            p.error(f"--web.config.file {err}")
    if min(args.max_connections, args.max_pods) < 1 or args.idle_timeout <= 0:
        p.error("--web.max-connections, --web.idle-timeout and --max-pods want positive numbers")
    if args.web_kubernetes_auth and not (find_kubeconfig(args.kubeconfig) or in_cluster()):
        p.error("--web.kubernetes-auth needs the API server: give --kubeconfig or run in a cluster")
    if args.memory_mover_rate is not None:
        p.error("--memory-mover.rate is the memory mover's helper's now: its --rate")
    for flag, on in (("--nrt", args.nrt), ("--memory-mover", args.memory_mover)):
        if on and not (find_kubeconfig(args.kubeconfig) or in_cluster()):
            p.error(f"{flag} needs the API server: give --kubeconfig or run in a cluster")
    logs.setup(args.log_format, args.log_level)
    one_malloc_arena()
    webconfig.all_the_files()
    try:
        asyncio.run(serve(settings))
    except KubeconfigError as err:
        print(f"numaguard-exporter: cannot talk to the API server with {err}", file=sys.stderr)
        return 2
    except GpuBackendError as err:
        print(f"numaguard-exporter: --gpu-backend: {err}", file=sys.stderr)
        return 2
    except OSError as err:
        print(f"numaguard-exporter: cannot serve on {args.listen}: {err}", file=sys.stderr)
        return 1
    return 0


def _positive(value: str) -> float:
    number = float(value)
    if number <= 0:
        raise argparse.ArgumentTypeError(f"must be positive, got {value}")
    return number


def _ratio(value: str) -> float:
    number = float(value)
    if not 0 <= number <= 1:
        raise argparse.ArgumentTypeError(f"must be between 0 and 1, got {value}")
    return number


if __name__ == "__main__":
    sys.exit(main())
