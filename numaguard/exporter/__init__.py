"""numaguard exporter: NUMA placement, memory traffic and GPU use of a node, for Prometheus."""

from numaguard import __version__  # noqa: F401 (one version, the distribution's)
