"""numaguard: NUMA-, LLC- and MIG-aware Prometheus exporter (``numaguard.exporter``) and
Kubernetes remediator (``numaguard.remediator``) for GPU nodes. The simulator
(``numaguard.simulator``) is the tests', the demo's and the benchmarks' fake world; the
product never imports it.

The repository keeps one folder per component (``exporter/``, ``remediator/``,
``simulator/``); setup.py maps each into this one namespace.
"""

__version__ = "0.1.0"
