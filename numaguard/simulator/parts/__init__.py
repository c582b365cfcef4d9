"""Launchers of the real parts tests and demos run against, each on loopback with a
temporary directory: the Kubernetes control plane, Prometheus 2 and 3, Alertmanager, the
Prometheus Operator, Thanos, the fault-injecting API server proxy, and the node VM
(Debian's kernel under QEMU) with a real kubelet in it."""
