"""``numaguard-remediator run`` finds its kubeconfig as kubectl does, and refuses to start
without an API server that answers, saying why (never a silent run against nothing)."""

from __future__ import annotations

import os
import subprocess
import sys

from numaguard.exporter.sources.apiserver import find_kubeconfig
from numaguard.simulator.processes import free_port


def run(tmp_path, *args: str, **env: str) -> subprocess.CompletedProcess:
    clean = {
        k: v for k, v in os.environ.items() if k not in ("KUBECONFIG", "KUBERNETES_SERVICE_HOST")
    }
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "numaguard.remediator",
            "run",
            "--listen",
            f"127.0.0.1:{free_port()}",
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=60,
        env={**clean, "HOME": str(tmp_path), **env},
    )


def test_the_kubeconfig_is_found_as_kubectl_finds_it(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("KUBECONFIG", raising=False)
    assert find_kubeconfig(None) is None
    home = tmp_path / ".kube" / "config"
    home.parent.mkdir()
    home.write_text("{}")
    assert find_kubeconfig(None) == str(home)
    monkeypatch.setenv("KUBECONFIG", f"/etc/a.yaml{os.pathsep}/etc/b.yaml")
    assert find_kubeconfig(None) == "/etc/a.yaml"
    assert find_kubeconfig("/given") == "/given"


def test_run_without_any_kubeconfig_refuses_to_start(tmp_path):
    done = run(tmp_path, "--no-dry-run")
    assert done.returncode == 2
    assert "no kubeconfig ($KUBECONFIG, ~/.kube/config) and not in a cluster" in done.stderr


def test_run_with_an_api_server_that_does_not_answer_refuses_to_start(tmp_path):
    config = tmp_path / "kubeconfig"
    config.write_text(
        '{"apiVersion": "v1", "kind": "Config", "current-context": "c",'
        f' "clusters": [{{"name": "c", "cluster": {{"server": "http://127.0.0.1:{free_port()}"}}}}],'
        ' "users": [{"name": "u", "user": {"token": "t"}}],'
        ' "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}]}'
    )
    done = run(tmp_path, "--no-dry-run", KUBECONFIG=str(config))  # found through $KUBECONFIG
    assert done.returncode == 2
    assert "the API server does not answer" in done.stderr and "not starting" in done.stderr
