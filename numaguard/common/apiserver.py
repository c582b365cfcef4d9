"""The API server over plain aiohttp, for the exporter: it makes three kinds of call
(list and watch its node's pods; review a scraper's token), and the kubernetes package
would cost its process ~23 MiB of RSS for them.

Credentials as kubectl finds them (a kubeconfig: server, its CA, a token, token file or
client certificate) or the in-cluster ServiceAccount, whose token file is read again
every minute, as client-go does: bound tokens rotate. Exec plugins and auth providers
are for people's laptops, not a DaemonSet: such a kubeconfig is a clear error.
"""

from __future__ import annotations

import base64
import contextlib
import os
import ssl
import tempfile
import time
from pathlib import Path

import aiohttp
import yaml

IN_CLUSTER = "/var/run/secrets/kubernetes.io/serviceaccount"
TOKEN_REREAD_SECONDS = 60.0


class KubeconfigError(Exception):
    """The kubeconfig or in-cluster credentials cannot be used."""


def in_cluster() -> bool:
    return "KUBERNETES_SERVICE_HOST" in os.environ


def find_kubeconfig(given: str | None) -> str | None:
    """The kubeconfig kubectl would use: the one given, else $KUBECONFIG (its first
    file), else ~/.kube/config if it exists; None: try the in-cluster account."""
    if given:
        return given
    listed = [p for p in os.environ.get("KUBECONFIG", "").split(os.pathsep) if p]
    if listed:
        return listed[0]
    home = os.path.expanduser("~/.kube/config")
    return home if os.path.isfile(home) else None


class ApiServer:
    """One API server and this process's credentials for it."""

    def __init__(
        self,
        server: str,
        context: ssl.SSLContext | None,
        token: str = "",
        token_file: str = "",
        server_name: str = "",
    ) -> None:
        self.server = server.rstrip("/")
        # the name its certificate is checked for, where that is not the server's
        # address (kubeconfig's tls-server-name: a tunnel, a forwarded port)
        self.server_name = server_name or None
        self._ssl = context if server.startswith("https:") else None
        self._token = token
        self._token_file = token_file
        self._token_read = float("-inf")
        self._session: aiohttp.ClientSession | None = None

    def _headers(self) -> dict[str, str]:
        if self._token_file and time.monotonic() - self._token_read > TOKEN_REREAD_SECONDS:
            with contextlib.suppress(OSError):  # keep the last one: it may still be valid
                self._token = Path(self._token_file).read_text().strip()
                self._token_read = time.monotonic()
        return {"Authorization": f"Bearer {self._token}"} if self._token else {}

    def request(self, method: str, path: str, timeout: float, **kwargs):
        """``async with api.request("GET", "/api/v1/pods", 30, params=...) as r``: an
        aiohttp response; ``timeout`` bounds the whole exchange."""
        if self._session is None:
            self._session = aiohttp.ClientSession()
        return self._session.request(
            method,
            self.server + path,
            headers=self._headers(),
            ssl=self._ssl if self._ssl is not None else True,
            server_hostname=self.server_name,
            timeout=aiohttp.ClientTimeout(total=timeout),
            **kwargs,
        )

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()


def connect(kubeconfig: str | None) -> ApiServer | None:
    """The API server of the kubeconfig kubectl would use, or of the in-cluster
    ServiceAccount, or None when there is neither."""
    path = find_kubeconfig(kubeconfig)
    try:
        if path:
            return _from_kubeconfig(Path(path))
        if in_cluster():
            host = os.environ["KUBERNETES_SERVICE_HOST"]
            port = os.environ.get("KUBERNETES_SERVICE_PORT", "443")
            host = f"[{host}]" if ":" in host else host
            context = ssl.create_default_context(cafile=f"{IN_CLUSTER}/ca.crt")
            return ApiServer(f"https://{host}:{port}", context, token_file=f"{IN_CLUSTER}/token")
    except KubeconfigError:
        raise
    except (OSError, ssl.SSLError, ValueError, KeyError, TypeError, yaml.YAMLError) as err:
        where = path or "the in-cluster service account"
        raise KubeconfigError(f"{where}: {err}") from None
    return None


def _from_kubeconfig(path: Path) -> ApiServer:
    config = yaml.safe_load(path.read_text()) or {}
    here = path.resolve().parent  # its relative paths are relative to it, as kubectl's

    def named(kind: str, name: str) -> dict:
        for entry in config.get(f"{kind}s") or []:
            if entry.get("name") == name:
                return entry.get(kind) or {}
        raise KubeconfigError(f"{path}: no {kind} named {name!r}")

    current = config.get("current-context")
    if not current:
        raise KubeconfigError(f"{path}: no current-context")
    context = named("context", current)
    cluster, user = named("cluster", context["cluster"]), named("user", context["user"])
    for unsupported in ("exec", "auth-provider"):
        if unsupported in user:
            raise KubeconfigError(
                f"{path}: user {context['user']!r} uses {unsupported}, which the exporter "
                "does not run: give it a ServiceAccount token (token or tokenFile)"
            )
    tls = ssl.create_default_context()
    if cluster.get("insecure-skip-tls-verify"):
        tls.check_hostname = False
        tls.verify_mode = ssl.CERT_NONE
    elif "certificate-authority-data" in cluster:
        tls.load_verify_locations(
            cadata=base64.b64decode(cluster["certificate-authority-data"]).decode()
        )
    elif "certificate-authority" in cluster:
        tls.load_verify_locations(cafile=here / cluster["certificate-authority"])
    if "client-certificate-data" in user or "client-certificate" in user:
        _load_client_certificate(tls, user, here)
    token_file = user.get("tokenFile", "")
    return ApiServer(
        cluster["server"],
        tls,
        token=user.get("token", ""),
        token_file=str(here / token_file) if token_file else "",
        server_name=cluster.get("tls-server-name", ""),
    )


def _load_client_certificate(tls: ssl.SSLContext, user: dict, here: Path) -> None:
    """ssl loads a certificate and key only from files: inline ones go through a
    private temporary directory that is gone once they are loaded."""
    with tempfile.TemporaryDirectory() as tmp:
        files = []
        for kind in ("client-certificate", "client-key"):
            if f"{kind}-data" in user:
                file = Path(tmp) / kind
                file.write_bytes(base64.b64decode(user[f"{kind}-data"]))
                files.append(file)
            else:
                files.append(here / user[kind])
        tls.load_cert_chain(*files)
