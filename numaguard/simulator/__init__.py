"""The simulator: the tests', the demos' and the benchmarks' world, by kind of thing —
``fakes`` (what cannot run here for real: a host's kernel files, NVML, resctrl, the
kubelet's PodResources and device plugin APIs, NVIDIA's DRA driver), ``parts`` (the
launchers of the real third-party parts: the control plane, Prometheus, Alertmanager,
the Operator, Thanos, the fault proxy, the node VM and its kubelet), ``cluster`` (the
simulated cluster: its life, its nodes' kubelet, its manifests, a fleet's series) and
``demos``. The product never imports it.
"""

from pathlib import Path

# the checkout the simulator runs from (its tests' Go modules, deploy/, the node VM's root)
CHECKOUT = Path(__file__).resolve().parents[2]
