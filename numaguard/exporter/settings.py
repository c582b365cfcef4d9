"""What the exporter daemon runs with: the command line's settings, one frozen record
that the server and each source's open_source read."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from numaguard.exporter.collectors import COLLECTORS
from numaguard.exporter.model.thresholds import Thresholds

if TYPE_CHECKING:
    from numaguard.exporter.sources.resctrl_ops import ResctrlOps


@dataclass(frozen=True)
class Settings:
    host_root: str = "/"
    host: str = "0.0.0.0"
    port: int = 9847
    node_name: str = ""
    interval_seconds: float = 15.0
    collector_timeout_seconds: float = 10.0
    kubeconfig: str | None = None
    thresholds: Thresholds = Thresholds()
    resctrl_mode: str = "auto"
    resctrl_ops: ResctrlOps | None = None  # resctrl's writes; None: the kernel's files
    gpu_backend: str = "auto"  # auto | nvml (a driver must load) | none
    # the kubelet's PodResources socket; None: the default one, used only if it exists
    pod_resources_socket: str | None = None
    web_config_file: str | None = None  # TLS and basic auth (exporter-toolkit's format)
    web_kubernetes_auth: bool = False  # scrapers' tokens checked with the API server
    # a connection without a whole request for this long is closed: idle keep-alives,
    # and clients that send slowly or not at all
    idle_timeout_seconds: float = 30.0
    # connections held at once; past it the longest-held idle one makes room, so that a
    # crowd of clients can neither starve a scrape nor use up the files the reads need
    max_connections: int = 256
    # the cardinality guard: past this many pods on the node, no pod series at all
    max_pods: int = 1000
    detail: bool = False  # the catalogue's detail families too
    # the collectors to run (--collector.<name>); the rest are not run at all
    collectors: frozenset[str] = frozenset(n for n, c in COLLECTORS.items() if c.default)
    nrt: bool = False  # publish this node's NodeResourceTopology each cycle it changes
    kubelet_config: str = "/var/lib/kubelet/config.yaml"  # under the host root
    # carry out the requests to move a pod's memory home its node's pods carry
    memory_mover: bool = False
    memory_mover_socket: str = "/run/numaguard/memory-mover.sock"  # the helper's
