"""The exporter as a process: the ``process_*`` metrics (both components export them,
catalogue group "process", named as every Prometheus client names them) and the settings
of the interpreter and the C library it runs with (the benchmarks use them too).

prometheus_client's ProcessCollector counts open descriptors by listing /proc/self/fd,
which costs in proportion to them: the exporter keeps thousands of kernel files open
between cycles, and the listing took 1.5-3.5 ms of every cycle. Since Linux 6.2 the
directory's size is that count; on older kernels it is 0, and the directory is listed.
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import math
import os
import resource
from collections.abc import Iterable

from prometheus_client import process_collector
from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric

from numaguard.contract import catalogue as c


class ProcessCollector(process_collector.ProcessCollector):
    def collect(self) -> Iterable[Metric]:
        if not self._btime:  # no /proc here: nothing to say
            return []
        try:
            with open("/proc/self/stat", "rb") as f:
                # what follows the command name, which is in parentheses and may hold any
                fields = f.read().rpartition(b")")[2].split()
            fds = os.stat("/proc/self/fd").st_size or len(os.listdir("/proc/self/fd"))
        except OSError:
            return []
        limit = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        ticks = self._ticks

        def gauge(spec: c.MetricSpec, value: float) -> Metric:
            return GaugeMetricFamily(spec.name, spec.help, value=value)

        return [
            gauge(c.PROCESS_VSZ, float(fields[20])),
            gauge(c.PROCESS_RSS, float(fields[21]) * self._pagesize),
            gauge(c.PROCESS_START, float(fields[19]) / ticks + self._btime),
            CounterMetricFamily(
                c.PROCESS_CPU.name,
                c.PROCESS_CPU.help,
                value=(float(fields[11]) + float(fields[12])) / ticks,
            ),
            gauge(c.PROCESS_FDS, fds),
            gauge(c.PROCESS_MAX_FDS, math.inf if limit == resource.RLIM_INFINITY else limit),
        ]


# A cycle allocates tens of thousands of short-lived records, and at the interpreter's
# default (a young collection every 700 net allocations) the collector ran ~25 times a
# cycle, each walking what the last snapshot still holds: ~10% of the cycle's CPU. Our
# records hold no cycles, so collecting rarely frees the same memory later, not more.
GC_YOUNG_THRESHOLD = 20_000


def settle_garbage_collector() -> None:
    """Freeze what start-up made (modules, the catalogue: never garbage, never walked
    again) and collect young objects rarely. For the exporter process, once its sources
    exist."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(GC_YOUNG_THRESHOLD, *gc.get_threshold()[1:])


def one_malloc_arena() -> None:
    """glibc gives each thread that allocates an arena of its own; under the GIL our few
    worker threads never allocate at once, and the extra arenas only hold on to freed
    memory (~5 MiB of RSS). Same as MALLOC_ARENA_MAX=1; a no-op without glibc."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").mallopt(_M_ARENA_MAX, 1)


_M_ARENA_MAX = -8  # from glibc's malloc.h
