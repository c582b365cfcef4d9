"""The process's own ``process_*`` metrics, named as every Prometheus client names them;
both components export them (catalogue group "process").

prometheus_client's ProcessCollector counts open descriptors by listing /proc/self/fd,
which costs in proportion to them: the exporter keeps thousands of kernel files open
between cycles, and the listing took 1.5-3.5 ms of every cycle. Since Linux 6.2 the
directory's size is that count; on older kernels it is 0, and the directory is listed.
"""

from __future__ import annotations

import math
import os
import resource
from collections.abc import Iterable

from numaguard.exporter import catalogue as c
from prometheus_client import process_collector
from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric


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
