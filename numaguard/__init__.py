"""numaguard: NUMA-, LLC- and MIG-aware Prometheus exporter (``numaguard.exporter``) and
Kubernetes remediator (``numaguard.remediator``) for GPU nodes. The simulator
(``numaguard.simulator``) is the tests', the demo's and the benchmarks' fake world; the
product never imports it.

Each folder is its import path: ``numaguard/exporter/`` is ``numaguard.exporter``, so a
plain checkout imports from the repository root without installation.
"""

__version__ = "0.1.0"
