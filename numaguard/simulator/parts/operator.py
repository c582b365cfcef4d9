"""The real Prometheus Operator against the test control plane, so that it, not we,
decides how deploy/'s ServiceMonitors and PrometheusRule are scraped and evaluated.

``make prometheus-operator`` builds it from the module tests/operator/go.mod pins, with
its CRDs beside it. The operator runs as the admin; a Prometheus object declared as
kube-prometheus-stack declares it (ServiceMonitors and PrometheusRules selected by the
Helm release's label, in every namespace) but asking for no pods, since the test runs
Prometheus itself: ``generated`` reads back the configuration and the rule files the
operator wrote for it and lays them out as its config reloader and volumes would.
"""

from __future__ import annotations

import base64
import gzip
import os
import re
import subprocess
from pathlib import Path

import yaml

from numaguard.simulator import CHECKOUT
from numaguard.simulator.parts.controlplane import ControlPlane
from numaguard.simulator.parts.processes import cache, free_port, until

RELEASE = "kube-prometheus-stack"  # the release label deploy/ carries
RULES_DIR = "/etc/prometheus/rules"  # where the operator's StatefulSet mounts rule files


class OperatorMissing(RuntimeError):
    pass


def operator_dir() -> Path:
    """Where ``make prometheus-operator`` put the version tests/operator/go.mod pins."""
    text = (CHECKOUT / "tests/operator/go.mod").read_text()
    version = re.search(r"prometheus-operator/prometheus-operator (v[0-9.]+)", text)[1]
    path = cache() / f"prometheus-operator-{version}"
    if not (path / ".built").is_file():
        raise OperatorMissing(f"{path} is incomplete: run make prometheus-operator")
    return path


def install_crds(cp: ControlPlane, kubeconfig: str) -> None:
    """The operator's CRDs (ServiceMonitor, PrometheusRule, ...) on the control plane,
    served. Server-side, as the operator's docs say: they are too big for the
    last-applied annotation; applying again (another test did) changes nothing."""
    kubectl = [str(cp.bin / "kubectl"), f"--kubeconfig={kubeconfig}"]
    for argv in (
        ["apply", "--server-side", f"--filename={operator_dir() / 'crds'}"],
        ["wait", "--for=condition=Established", "--timeout=60s", "crd", "--all"],
    ):
        subprocess.run([*kubectl, *argv], check=True, capture_output=True)


class PrometheusOperator:
    """``op.start()``; ``op.stop()`` kills it by PID."""

    def __init__(self, control_plane: ControlPlane, directory: Path) -> None:
        self.cp = control_plane
        self.directory = directory
        self.bin = operator_dir()
        self._proc: subprocess.Popen | None = None

    def start(self) -> None:
        kubeconfig = self.cp.kubeconfig(self.directory / "operator.kubeconfig", self.cp.admin_token)
        install_crds(self.cp, kubeconfig)
        self._log = open(self.directory / "operator.log", "wb")  # noqa: SIM115 (closed in stop)
        self._proc = subprocess.Popen(
            [
                str(self.bin / "operator"),
                f"--web.listen-address=127.0.0.1:{free_port()}",
                "--kubelet-endpoints=false",
                "--log-level=info",
            ],
            env={**os.environ, "KUBECONFIG": kubeconfig},
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )

    def log(self) -> str:
        return (self.directory / "operator.log").read_text()[-3000:]

    def stop(self) -> None:
        if self._proc and self._proc.poll() is None:
            self._proc.kill()
            self._proc.wait()
        if self._proc:
            self._log.close()

    async def generated(
        self,
        session,
        namespace: str,
        name: str,
        ready,
        timeout: float = 60.0,
        shard: int = 0,
        replica: int = 0,
    ) -> Path:
        """The configuration and rule files the operator generated for Prometheus
        ``namespace/name``, once ``ready(config dict)`` holds of them, written into this
        operator's directory as the StatefulSet would mount them: the rule files where
        the configuration says, the variables of its pod (of that ``shard``'s
        StatefulSet, that ``replica``) expanded as the config reloader does."""
        statefulset = f"prometheus-{name}" + (f"-shard-{shard}" if shard else "")
        pod = f"{statefulset}-{replica}"

        async def config() -> dict | None:
            if self._proc.poll() is not None:
                raise RuntimeError(f"the Prometheus Operator exited: {self.log()}")
            secret = await self.cp.get(session, "Secret", namespace, f"prometheus-{name}")
            if secret is None:
                return None
            packed = secret["data"]["prometheus.yaml.gz"]
            text = gzip.decompress(base64.b64decode(packed)).decode()
            # the config reloader expands the StatefulSet pod's environment
            for var, value in {"POD_NAME": pod, "SHARD": str(shard)}.items():
                text = text.replace(f"$({var})", value)
            if "$(" in text:
                raise AssertionError(f"a variable the reloader would expand is left: {text}")
            parsed = yaml.safe_load(text)
            return parsed if ready(parsed) else None

        try:
            parsed = await until(config, "a configuration generated", timeout, every=0.5)
        except AssertionError as e:
            raise AssertionError(f"{e}; the operator's log:\n{self.log()}") from None
        out = self.directory / pod
        rules = out / "rules"
        for maps in await self.cp.items(session, "ConfigMap", namespace):
            meta = maps["metadata"]
            if not meta["name"].startswith(f"prometheus-{name}-rulefiles-"):
                continue
            folder = rules / meta["name"]
            folder.mkdir(parents=True, exist_ok=True)
            for file, text in (maps.get("data") or {}).items():
                (folder / file).write_text(text)
        parsed["rule_files"] = [
            str(rules) + path.removeprefix(RULES_DIR) for path in parsed.get("rule_files", [])
        ]
        out.mkdir(parents=True, exist_ok=True)
        config_file = out / "prometheus.yaml"
        config_file.write_text(yaml.safe_dump(parsed))
        return config_file


def prometheus_resource(
    cp: ControlPlane, namespace: str, name: str, token_file: Path, version: str
) -> dict:
    """A Prometheus object as kube-prometheus-stack's defaults make it (selecting by the
    release label in every namespace; service discovery through EndpointSlices), running
    outside the cluster: it names the API server and its credentials, and no pods."""
    selector = {"matchLabels": {"release": RELEASE}}
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "Prometheus",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "replicas": 0,
            "version": version,
            "serviceDiscoveryRole": "EndpointSlice",
            "serviceMonitorSelector": selector,
            "serviceMonitorNamespaceSelector": {},
            "podMonitorSelector": selector,
            "podMonitorNamespaceSelector": {},
            "ruleSelector": selector,
            "ruleNamespaceSelector": {},
            "evaluationInterval": "1s",
            "apiserverConfig": {
                "host": cp.url,
                "authorization": {"credentialsFile": str(token_file)},
                "tlsConfig": {"caFile": str(cp.ca_file)},
            },
        },
    }
