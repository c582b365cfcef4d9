"""A real Kubernetes control plane for the tests, started as envtest starts one: etcd and
kube-apiserver (built from their pinned Go modules by ``make k8s-parts``) on loopback
ports with temporary directories, RBAC authorization, a generated service-account
signing key and a self-signed serving certificate; an admin token for the test itself.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import secrets
import ssl
import subprocess
import tempfile
from pathlib import Path

import aiohttp

from simulator.processes import free_port

ROOT = Path(__file__).resolve().parent.parent


class ControlPlaneMissing(RuntimeError):
    pass


def parts_dir() -> Path:
    """Where ``make k8s-parts`` put the binaries of the version tests/k8s/go.mod pins."""
    text = (ROOT / "tests/k8s/go.mod").read_text()
    version = re.search(r"k8s\.io/kubernetes (v[0-9.]+)", text)[1]
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")
    path = Path(cache) / "numaguard" / f"k8s-{version}"
    if not (path / ".built").is_file():
        raise ControlPlaneMissing(f"{path} has no control plane: run make k8s-parts")
    return path


class ControlPlane:
    def __init__(self) -> None:
        self.bin = parts_dir()
        self.admin_token = secrets.token_hex(16)
        self.url = ""
        self._dir: tempfile.TemporaryDirectory | None = None
        self._procs: list[subprocess.Popen] = []

    async def __aenter__(self) -> ControlPlane:
        self._dir = tempfile.TemporaryDirectory(prefix="numaguard-k8s-")
        d = Path(self._dir.name)
        etcd_port, peer_port, api_port = free_port(), free_port(), free_port()
        self._start(
            d / "etcd.log",
            self.bin / "etcd",
            f"--data-dir={d / 'etcd'}",
            f"--listen-client-urls=http://127.0.0.1:{etcd_port}",
            f"--advertise-client-urls=http://127.0.0.1:{etcd_port}",
            f"--listen-peer-urls=http://127.0.0.1:{peer_port}",
            f"--initial-advertise-peer-urls=http://127.0.0.1:{peer_port}",
            f"--initial-cluster=default=http://127.0.0.1:{peer_port}",
        )
        key = d / "sa.key"
        subprocess.run(
            ["openssl", "genrsa", "-out", str(key), "2048"], check=True, capture_output=True
        )
        (d / "tokens.csv").write_text(f"{self.admin_token},admin,admin,system:masters\n")
        self._start(
            d / "apiserver.log",
            self.bin / "kube-apiserver",
            f"--etcd-servers=http://127.0.0.1:{etcd_port}",
            "--bind-address=127.0.0.1",
            "--advertise-address=127.0.0.1",
            "--endpoint-reconciler-type=none",  # no kubernetes Service endpoints on loopback
            f"--secure-port={api_port}",
            f"--cert-dir={d / 'certs'}",
            "--authorization-mode=RBAC",
            f"--token-auth-file={d / 'tokens.csv'}",
            f"--service-account-key-file={key}",
            f"--service-account-signing-key-file={key}",
            "--service-account-issuer=https://kubernetes.default.svc",
            "--service-cluster-ip-range=10.0.0.0/24",
        )
        self.url = f"https://127.0.0.1:{api_port}"
        await self._wait_ready()
        return self

    async def __aexit__(self, *exc) -> None:
        for proc in reversed(self._procs):
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        if self._dir:
            self._dir.cleanup()

    def _start(self, log: Path, *argv) -> None:
        with open(log, "wb") as out:
            self._procs.append(
                subprocess.Popen([str(a) for a in argv], stdout=out, stderr=subprocess.STDOUT)
            )

    def log(self, name: str) -> str:
        return (Path(self._dir.name) / f"{name}.log").read_text()[-3000:]

    async def _wait_ready(self, timeout: float = 120.0) -> None:
        """Poll /readyz (the post-start hooks, RBAC's bootstrap roles among them)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        async with aiohttp.ClientSession() as session:
            while loop.time() < deadline:
                for proc, name in zip(self._procs, ("etcd", "apiserver"), strict=False):
                    if proc.poll() is not None:
                        raise RuntimeError(f"{name} exited: {self.log(name)}")
                try:
                    status, _ = await self.request(session, "GET", "/readyz")
                    if status == 200:
                        return
                except (aiohttp.ClientError, OSError):
                    pass
                await asyncio.sleep(0.5)
        raise RuntimeError(f"kube-apiserver not ready in {timeout:g}s: {self.log('apiserver')}")

    async def request(
        self, session: aiohttp.ClientSession, method: str, path: str, body=None, token=None
    ) -> tuple[int, dict]:
        """One request as the admin (or ``token``'s owner); (status, JSON body)."""
        headers = {"Authorization": f"Bearer {token or self.admin_token}"}
        context = ssl.create_default_context()
        context.check_hostname, context.verify_mode = False, ssl.CERT_NONE  # self-signed
        async with session.request(
            method, self.url + path, json=body, headers=headers, ssl=context
        ) as r:
            text = await r.text()
            try:
                return r.status, json.loads(text) if text else {}
            except ValueError:
                return r.status, {"text": text}
