"""The process's own metrics (both components) and the exporter's self-health."""

from __future__ import annotations

from numaguard.contract.catalogue.spec import (
    COLLECTOR,
    declare,
    declare_process,
)

# -- the process (both components; read by numaguard/common/process.py) --------------------
PROCESS_CPU = declare_process(
    "process_cpu_seconds_total", "counter", "User and system CPU time the process spent."
)
PROCESS_RSS = declare_process("process_resident_memory_bytes", "gauge", "Resident memory.")
PROCESS_VSZ = declare_process("process_virtual_memory_bytes", "gauge", "Virtual memory.")
PROCESS_FDS = declare_process("process_open_fds", "gauge", "Open file descriptors.")
PROCESS_MAX_FDS = declare_process(
    "process_max_fds", "gauge", "The process's file descriptor limit."
)
PROCESS_START = declare_process(
    "process_start_time_seconds", "gauge", "When the process started, seconds since the epoch."
)

# -- self-health -------------------------------------------------------------------
BUILD_INFO = declare(
    "build_info",
    "gauge",
    "numaguard build; value is always 1.",
    ("version", "python_version"),
    "health",
)
COLLECTOR_SUCCESS = declare(
    "collector_success",
    "gauge",
    "1 when the collector's last run finished in time without errors.",
    COLLECTOR,
    "health",
)
COLLECTOR_DURATION = declare(
    "collector_duration_seconds",
    "gauge",
    "Wall time of the collector's last run.",
    COLLECTOR,
    "health",
)
COLLECTOR_ERRORS = declare(
    "collector_errors_total",
    "counter",
    "Errors met by the collector, by reason: missing, permission, io, parse, oversized, "
    "not_regular (a FIFO, device or socket where a kernel file should be), write (the "
    "kernel refused a resctrl change), gpu_lost, nvml, kubelet, timeout, internal.",
    (*COLLECTOR, "reason"),
    "health",
)
COLLECTOR_LAST_SUCCESS = declare(
    "collector_last_success_timestamp_seconds",
    "gauge",
    "Unix time of the collector's last successful run.",
    COLLECTOR,
    "health",
)
SERIES_LIMITED = declare(
    "series_limited",
    "gauge",
    "1 when the node has more pods than --max-pods: no pod, container or per-pod resctrl "
    "series this cycle (node-wide ones stay), so that a runaway node cannot take the "
    "exporter past its memory limit; 0 otherwise.",
    (),
    "health",
)
NRT_CURRENT = declare(
    "nrt_current",
    "gauge",
    "With --nrt: 1 when this node's NodeResourceTopology says what the cycle before "
    "found (written, or unchanged), 0 when writing it failed (the log says why).",
    (),
    "health",
)
POD_METADATA_SYNCED = declare(
    "pod_metadata_synced",
    "gauge",
    "1 when pod names come from a synced API-server watch; 0 means pod series carry only "
    "pod_uid and container_id.",
    (),
    "health",
)
