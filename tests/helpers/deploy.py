"""Where deploy/ is, the Kubernetes version its manifests are validated for, and the
CRDs they use."""

from __future__ import annotations

from pathlib import Path

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"


K8S_VERSION = "1.31.0"


CRDS = {"ServiceMonitor", "PrometheusRule", "Kustomization"}
