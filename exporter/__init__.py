"""numaguard exporter: NUMA placement, memory traffic and GPU use of a node, for Prometheus."""

__version__ = "0.1.0"
