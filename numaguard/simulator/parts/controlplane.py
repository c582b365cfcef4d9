"""A real Kubernetes control plane for the tests and the demo, started as envtest starts
one: etcd, kube-apiserver, kube-controller-manager and kube-scheduler (built from their
pinned Go modules by ``make k8s-parts``) on loopback ports with temporary directories,
RBAC authorization, a generated service-account signing key and a self-signed serving
certificate. The controllers and the scheduler run as the users Kubernetes' bootstrap
RBAC has roles for; the test itself is an admin; our components get ServiceAccount
tokens from the TokenRequest API.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import re
import secrets
import ssl
import subprocess
import tempfile
from pathlib import Path

import aiohttp
import yaml

from numaguard.simulator import CHECKOUT
from numaguard.simulator.parts.faultproxy import FaultProxy
from numaguard.simulator.parts.processes import cache, free_port, until

# deploy/'s namespace, ServiceAccounts and RBAC, applied to the test cluster as shipped
RBAC_KINDS = {
    *("Namespace", "ServiceAccount"),
    *("ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding"),
}
ADMISSION_KINDS = {
    "MutatingWebhookConfiguration",
    "ValidatingAdmissionPolicy",
    "ValidatingAdmissionPolicyBinding",
}
ACCOUNTS = ("numaguard-exporter", "numaguard-remediator")
PARTS = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubectl")
# The controllers the simulated cluster's behaviour depends on (kube-controller-manager
# names; the node lifecycle controller stays off: the simulator is every node's kubelet).
CONTROLLERS = (
    "deployment-controller",
    "replicaset-controller",
    "statefulset-controller",
    "disruption-controller",
    "garbage-collector-controller",
    "endpointslice-controller",
    "namespace-controller",
    "serviceaccount-controller",
    "resourceclaim-controller",  # a pod's claims from its ResourceClaimTemplates
)
# kind -> (API path prefix, plural, namespaced): what the simulator and tests create.
KINDS = {
    "Namespace": ("/api/v1", "namespaces", False),
    "Node": ("/api/v1", "nodes", False),
    "Pod": ("/api/v1", "pods", True),
    "Event": ("/api/v1", "events", True),
    "ServiceAccount": ("/api/v1", "serviceaccounts", True),
    "Deployment": ("/apis/apps/v1", "deployments", True),
    "ReplicaSet": ("/apis/apps/v1", "replicasets", True),
    "StatefulSet": ("/apis/apps/v1", "statefulsets", True),
    "DaemonSet": ("/apis/apps/v1", "daemonsets", True),
    "PodDisruptionBudget": ("/apis/policy/v1", "poddisruptionbudgets", True),
    "Lease": ("/apis/coordination.k8s.io/v1", "leases", True),
    "ClusterRole": ("/apis/rbac.authorization.k8s.io/v1", "clusterroles", False),
    "ClusterRoleBinding": ("/apis/rbac.authorization.k8s.io/v1", "clusterrolebindings", False),
    "Role": ("/apis/rbac.authorization.k8s.io/v1", "roles", True),
    "RoleBinding": ("/apis/rbac.authorization.k8s.io/v1", "rolebindings", True),
    "Service": ("/api/v1", "services", True),
    "Secret": ("/api/v1", "secrets", True),
    "ConfigMap": ("/api/v1", "configmaps", True),
    "EndpointSlice": ("/apis/discovery.k8s.io/v1", "endpointslices", True),
    "CustomResourceDefinition": (
        "/apis/apiextensions.k8s.io/v1",
        "customresourcedefinitions",
        False,
    ),
    # the Prometheus Operator's (simulator.parts.operator installs them)
    "Prometheus": ("/apis/monitoring.coreos.com/v1", "prometheuses", True),
    "ServiceMonitor": ("/apis/monitoring.coreos.com/v1", "servicemonitors", True),
    "PrometheusRule": ("/apis/monitoring.coreos.com/v1", "prometheusrules", True),
    "RuntimeClass": ("/apis/node.k8s.io/v1", "runtimeclasses", False),
    "MutatingWebhookConfiguration": (
        "/apis/admissionregistration.k8s.io/v1",
        "mutatingwebhookconfigurations",
        False,
    ),
    "ValidatingAdmissionPolicy": (
        "/apis/admissionregistration.k8s.io/v1",
        "validatingadmissionpolicies",
        False,
    ),
    "ValidatingAdmissionPolicyBinding": (
        "/apis/admissionregistration.k8s.io/v1",
        "validatingadmissionpolicybindings",
        False,
    ),
    # Dynamic Resource Allocation (simulator.fakes.dra publishes a node's GPUs)
    "DeviceClass": ("/apis/resource.k8s.io/v1", "deviceclasses", False),
    "ResourceSlice": ("/apis/resource.k8s.io/v1", "resourceslices", False),
    "ResourceClaim": ("/apis/resource.k8s.io/v1", "resourceclaims", True),
    "ResourceClaimTemplate": ("/apis/resource.k8s.io/v1", "resourceclaimtemplates", True),
    # the scheduler-plugins project's, published by the exporter's --nrt
    "NodeResourceTopology": (
        "/apis/topology.node.k8s.io/v1alpha2",
        "noderesourcetopologies",
        False,
    ),
}


class ControlPlaneMissing(RuntimeError):
    pass


class ApiError(RuntimeError):
    def __init__(self, status: int, body: dict, what: str) -> None:
        super().__init__(f"{what}: {status} {body.get('message', body)}")
        self.status = status
        self.body = body


def parts_dir() -> Path:
    """Where ``make k8s-parts`` put the binaries of the version tests/k8s/go.mod pins."""
    text = (CHECKOUT / "tests/k8s/go.mod").read_text()
    version = re.search(r"k8s\.io/kubernetes (v[0-9.]+)", text)[1]
    path = cache() / f"k8s-{version}"
    stamp = path / ".built"  # what make built there, once it all was
    built = stamp.read_text().split() if stamp.is_file() else []
    if not set(PARTS) <= set(built) or not all((path / p).is_file() for p in PARTS):
        raise ControlPlaneMissing(f"{path} lacks some of {', '.join(PARTS)}: run make k8s-parts")
    return path


def nrt_crd() -> Path:
    """The NodeResourceTopology CRD ``make nrt-crd`` fetched, of the version
    tests/nrt/go.mod pins."""
    text = (CHECKOUT / "tests/nrt/go.mod").read_text()
    version = re.search(r"noderesourcetopology-api (v[0-9.]+)", text)[1]
    path = cache() / f"noderesourcetopology-api-{version}" / "crd.yaml"
    if not path.is_file():
        raise ControlPlaneMissing(f"no {path}: run make nrt-crd")
    return path


def rendered(*components: str) -> list[dict]:
    """What ``kubectl apply -k`` would send of a kustomization of deploy/base with these
    of deploy/components: kustomize's rendering."""
    with tempfile.TemporaryDirectory() as folder:
        # kustomize takes relative paths only
        deploy = os.path.relpath(CHECKOUT / "deploy", folder)
        kustomization = {
            "apiVersion": "kustomize.config.k8s.io/v1beta1",
            "kind": "Kustomization",
            "resources": [f"{deploy}/base"],
            "components": [f"{deploy}/components/{c}" for c in components],
        }
        (Path(folder) / "kustomization.yaml").write_text(json.dumps(kustomization))
        return kustomized(folder)


def kustomized(folder: str | os.PathLike) -> list[dict]:
    """The objects the kustomization in ``folder`` renders (kubectl's kustomize)."""
    kubectl = [str(parts_dir() / "kubectl"), "kustomize", str(folder)]
    out = subprocess.run(kubectl, check=True, capture_output=True, text=True).stdout
    return [obj for obj in yaml.safe_load_all(out) if obj]


def path_of(kind: str, namespace: str | None = None, name: str | None = None) -> str:
    prefix, plural, namespaced = KINDS[kind]
    # a namespaced kind without a namespace: the list across all namespaces
    if namespaced and namespace is not None:
        path = f"{prefix}/namespaces/{namespace}/{plural}"
    else:
        path = f"{prefix}/{plural}"
    return f"{path}/{name}" if name else path


NEW_KEY = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes")


def openssl(*argv) -> None:
    subprocess.run(["openssl", *map(str, argv)], check=True, capture_output=True)


class ControlPlane:
    """Start with ``await cp.start()`` (or ``async with``); ``stop()`` kills by PID."""

    def __init__(self) -> None:
        self.bin = parts_dir()
        self.admin_token = secrets.token_hex(16)
        self.url = ""
        self.started_seconds = 0.0  # how long start() took
        self._dir: tempfile.TemporaryDirectory | None = None
        self._procs: dict[str, subprocess.Popen] = {}
        self.tokens: dict[str, str] = {}  # ServiceAccount -> its token, once installed

    @property
    def directory(self) -> Path:
        return Path(self._dir.name)

    @property
    def ca_file(self) -> Path:
        """The API server's self-signed serving certificate, with the CA that signed it."""
        return self.directory / "certs" / "apiserver.crt"

    @property
    def client_ca(self) -> Path:
        return self.directory / "client-ca.crt"

    async def __aenter__(self) -> ControlPlane:
        await self.start()
        return self

    async def __aexit__(self, *exc) -> None:
        self.stop()

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        began = loop.time()
        self._dir = tempfile.TemporaryDirectory(prefix="numaguard-k8s-")
        d = self.directory
        etcd_port, peer_port, api_port = free_port(), free_port(), free_port()
        self._start(
            "etcd",
            f"--data-dir={d / 'etcd'}",
            f"--listen-client-urls=http://127.0.0.1:{etcd_port}",
            f"--advertise-client-urls=http://127.0.0.1:{etcd_port}",
            f"--listen-peer-urls=http://127.0.0.1:{peer_port}",
            f"--initial-advertise-peer-urls=http://127.0.0.1:{peer_port}",
            f"--initial-cluster=default=http://127.0.0.1:{peer_port}",
            "--unsafe-no-fsync",  # a test cluster: its data dies with it
        )
        key = d / "sa.key"
        openssl("genrsa", "-out", key, "2048")
        # the CA of nodes' client certificates (node_kubeconfig)
        openssl(
            "req",
            "-x509",
            *NEW_KEY,
            "-keyout",
            d / "client-ca.key",
            "-out",
            self.client_ca,
            "-subj",
            "/CN=numaguard-test-client-ca",
            "-days",
            "2",
        )
        users = {
            "admin": (self.admin_token, "system:masters"),
            "system:kube-controller-manager": (secrets.token_hex(16), ""),
            "system:kube-scheduler": (secrets.token_hex(16), ""),
        }
        (d / "tokens.csv").write_text(
            "".join(f'{token},{user},{user},"{group}"\n' for user, (token, group) in users.items())
        )
        self._start(
            "kube-apiserver",
            f"--etcd-servers=http://127.0.0.1:{etcd_port}",
            "--bind-address=127.0.0.1",
            "--advertise-address=127.0.0.1",
            "--endpoint-reconciler-type=none",  # no kubernetes Service endpoints on loopback
            f"--secure-port={api_port}",
            f"--cert-dir={d / 'certs'}",
            # as clusters run: nodes authorized as nodes, and limited to their own objects
            "--authorization-mode=Node,RBAC",
            "--enable-admission-plugins=NodeRestriction",
            f"--client-ca-file={self.client_ca}",
            f"--token-auth-file={d / 'tokens.csv'}",
            f"--service-account-key-file={key}",
            f"--service-account-signing-key-file={key}",
            "--service-account-issuer=https://kubernetes.default.svc",
            "--service-cluster-ip-range=10.0.0.0/24",
            # DRA's v1 is on by default; the betas older API servers serve too, so that
            # a client of those is tested against the real thing
            "--runtime-config=resource.k8s.io/v1beta1=true,resource.k8s.io/v1beta2=true",
        )
        self.url = f"https://127.0.0.1:{api_port}"
        await self._wait(lambda s: self._ok(s, "/readyz"), "kube-apiserver ready")
        for component, flags in (
            (
                "kube-controller-manager",
                [
                    f"--controllers={','.join(CONTROLLERS)}",
                    "--use-service-account-credentials=true",
                    f"--root-ca-file={self.ca_file}",
                ],
            ),
            ("kube-scheduler", []),
        ):
            user = f"system:{component}"
            config = self.kubeconfig(d / f"{component}.kubeconfig", users[user][0], user)
            self._start(component, f"--kubeconfig={config}", "--secure-port=0", *flags)
        # both have started their loops once each holds its leader Lease, and the
        # serviceaccount controller has given the default namespace its account
        await self._wait(self._components_ready, "controller-manager and scheduler ready")
        self.started_seconds = loop.time() - began

    def stop(self) -> None:
        for proc in reversed(self._procs.values()):
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        if self._dir:
            self._dir.cleanup()
            self._dir = None

    def _start(self, name: str, *argv) -> None:
        with open(self.directory / f"{name}.log", "wb") as out:
            self._procs[name] = subprocess.Popen(
                [str(self.bin / name), *map(str, argv)], stdout=out, stderr=subprocess.STDOUT
            )

    def log(self, name: str) -> str:
        return (self.directory / f"{name}.log").read_text()[-3000:]

    def fault_proxy(self) -> FaultProxy:
        """A proxy in front of this API server (start it), serving its certificate."""
        certs = self.directory / "certs"
        return FaultProxy(
            self.url, str(self.ca_file), str(certs / "apiserver.crt"), str(certs / "apiserver.key")
        )

    def kubeconfig(
        self, path: str | Path, token: str, user: str = "admin", server="", server_name=""
    ) -> str:
        """Write a kubeconfig for ``token`` (trusting the API server's certificate);
        returns its path. ``server``: another address (the fault proxy, the node VM's way
        to the API server) to use; ``server_name``: the name to check its certificate
        for where that address is not in it."""
        return self._write_kubeconfig(path, user, {"token": token}, server, server_name)

    def node_kubeconfig(self, path: Path, node: str, server: str) -> str:
        """A kubeconfig for the kubelet of ``node``: a client certificate this control
        plane's client CA signed for system:node:<node> in group system:nodes, as the
        Node authorizer wants; ``server``: how that node reaches the API server (its
        certificate is checked for the name kubernetes)."""
        key, csr, crt = (path.with_suffix(s) for s in (".key", ".csr", ".crt"))
        subject = f"/O=system:nodes/CN=system:node:{node}"
        openssl("req", "-new", *NEW_KEY, "-keyout", key, "-out", csr, "-subj", subject)
        ca_key = self.directory / "client-ca.key"
        openssl(
            "x509",
            "-req",
            "-in",
            csr,
            "-CA",
            self.client_ca,
            "-CAkey",
            ca_key,
            "-CAcreateserial",
            "-days",
            "1",
            "-out",
            crt,
        )
        credentials = {
            "client-certificate-data": base64.b64encode(crt.read_bytes()).decode(),
            "client-key-data": base64.b64encode(key.read_bytes()).decode(),
        }
        return self._write_kubeconfig(path, node, credentials, server, "kubernetes")

    def _write_kubeconfig(
        self, path: str | Path, user: str, credentials: dict, server: str, server_name: str
    ) -> str:
        ca = base64.b64encode(self.ca_file.read_bytes()).decode()
        cluster = {"server": server or self.url, "certificate-authority-data": ca}
        if server_name:
            cluster["tls-server-name"] = server_name
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "numaguard-test", "cluster": cluster}],
            "users": [{"name": user, "user": credentials}],
            "contexts": [{"name": user, "context": {"cluster": "numaguard-test", "user": user}}],
            "current-context": user,
        }
        Path(path).write_text(json.dumps(config, indent=1))
        os.chmod(path, 0o600)
        return str(path)

    async def install_numaguard(
        self,
        session: aiohttp.ClientSession,
        components: tuple[str, ...] = ("no-dry-run", "steering", "mig-layout"),
    ) -> None:
        """Apply deploy/'s namespace, ServiceAccounts, RBAC, admission objects and Secrets
        as kustomize renders them with ``components`` (no-dry-run: tests act; steering: its
        webhook configuration and its empty certificate Secret too; memory-mover: the
        policy on move requests; mig-layout: node writes of a MIG re-layout), and get a
        token for each of our ServiceAccounts (``self.tokens``): our components run as
        those."""
        for obj in rendered(*components):
            if obj["kind"] in (*RBAC_KINDS, *ADMISSION_KINDS, "Secret"):
                await self.create(session, obj)
        for account in ACCOUNTS:
            self.tokens[account] = await self.service_account_token(session, "numaguard", account)

    async def service_account_token(
        self,
        session: aiohttp.ClientSession,
        namespace: str,
        name: str,
        seconds: int = 86400,
        pod: dict | None = None,
    ) -> str:
        """A bound token for the ServiceAccount, from the TokenRequest API; ``pod``: bound
        to that pod, as a pod's projected token is (it then names the pod's node)."""
        body = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest"}
        body["spec"] = {"expirationSeconds": seconds}
        if pod is not None:
            meta = pod["metadata"]
            ref = {"apiVersion": "v1", "kind": "Pod", "name": meta["name"], "uid": meta["uid"]}
            body["spec"]["boundObjectRef"] = ref
        path = path_of("ServiceAccount", namespace, name) + "/token"
        return (await self.call(session, "POST", path, body))["status"]["token"]

    async def _wait(self, ready, what: str, timeout: float = 120.0) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        async with aiohttp.ClientSession() as session:
            while loop.time() < deadline:
                for name, proc in self._procs.items():
                    if proc.poll() is not None:
                        raise RuntimeError(f"{name} exited: {self.log(name)}")
                try:
                    if await ready(session):
                        return
                except (aiohttp.ClientError, OSError):
                    pass
                await asyncio.sleep(0.2)
        logs = "\n".join(f"== {n}\n{self.log(n)}" for n in self._procs)
        raise RuntimeError(f"not {what} in {timeout:g}s:\n{logs}")

    async def _ok(self, session, path: str) -> bool:
        return (await self.request(session, "GET", path))[0] == 200

    async def _components_ready(self, session) -> bool:
        for lease in ("kube-controller-manager", "kube-scheduler"):
            status, body = await self.request(
                session, "GET", path_of("Lease", "kube-system", lease)
            )
            if status != 200 or not body["spec"].get("holderIdentity"):
                return False
        return await self._ok(session, path_of("ServiceAccount", "default", "default"))

    def ssl_context(self) -> ssl.SSLContext:
        return ssl.create_default_context(cafile=str(self.ca_file))

    async def request(
        self, session: aiohttp.ClientSession, method: str, path: str, body=None, token=None
    ) -> tuple[int, dict]:
        """One request as the admin (or ``token``'s owner); (status, JSON body). A PATCH's
        body is a merge patch, or a JSON patch when it is a list of operations."""
        headers = {"Authorization": f"Bearer {token or self.admin_token}"}
        if body is not None:
            json_type = "application/json"
            if method == "PATCH":
                kind = "json-patch" if isinstance(body, list) else "merge-patch"
                json_type = f"application/{kind}+json"
            headers["Content-Type"] = json_type
        async with session.request(
            method,
            self.url + path,
            data=None if body is None else json.dumps(body),
            headers=headers,
            ssl=self.ssl_context(),
        ) as r:
            text = await r.text()
            try:
                return r.status, json.loads(text) if text else {}
            except ValueError:
                return r.status, {"text": text}

    async def call(self, session, method: str, path: str, body=None, token=None) -> dict:
        """A request that must succeed: its JSON body, or ApiError."""
        status, answer = await self.request(session, method, path, body, token)
        if status >= 300:
            raise ApiError(status, answer, f"{method} {path}")
        return answer

    async def create(self, session, obj: dict, token=None) -> dict:
        meta = obj["metadata"]
        path = path_of(obj["kind"], meta.get("namespace", "default"))
        return await self.call(session, "POST", path, obj, token)

    async def get(self, session, kind: str, namespace: str | None, name: str) -> dict | None:
        status, body = await self.request(session, "GET", path_of(kind, namespace, name))
        if status == 404:
            return None
        if status != 200:
            raise ApiError(status, body, f"GET {kind} {namespace}/{name}")
        return body

    async def items(self, session, kind: str, namespace: str | None = None, **query) -> list:
        path = path_of(kind, namespace)
        if query:
            path += "?" + "&".join(f"{k}={v}" for k, v in query.items())
        return (await self.call(session, "GET", path))["items"]

    async def watch(self, session, path: str, version: str, on_event) -> str:
        """Watch ``path`` (``/api/v1/pods``) from ``version``, awaiting ``on_event(type,
        object)`` for each event but bookmarks; the last version seen when the API server
        ends the watch, "" when it must be listed again (a refusal, 410 Gone)."""
        url = f"{self.url}{path}?watch=1&resourceVersion={version}&allowWatchBookmarks=true"
        async with session.get(
            url,
            headers={"Authorization": f"Bearer {self.admin_token}"},
            ssl=self.ssl_context(),
            timeout=aiohttp.ClientTimeout(total=None, sock_read=None),
        ) as r:
            if r.status != 200:
                return ""
            async for line in r.content:
                event = json.loads(line)
                if event["type"] == "ERROR":
                    return ""
                version = event["object"]["metadata"]["resourceVersion"]
                if event["type"] != "BOOKMARK":
                    await on_event(event["type"], event["object"])
        return version

    async def install_crd(self, session, path: Path) -> None:
        """Create the CustomResourceDefinition in ``path`` (kept if another test made it)
        and wait until the API server serves it."""
        crd = yaml.safe_load(path.read_text())
        try:
            await self.create(session, crd)
        except ApiError as err:
            if err.status != 409:
                raise

        async def established() -> bool:
            got = await self.get(session, "CustomResourceDefinition", None, crd["metadata"]["name"])
            conditions = (got or {}).get("status", {}).get("conditions") or []
            return any(c["type"] == "Established" and c["status"] == "True" for c in conditions)

        await until(established, f"{crd['metadata']['name']} established")

    async def evict(self, session, namespace: str, name: str, uid: str) -> int:
        """Ask the Eviction API (as the admin) to evict that pod, if it still has that
        uid; the HTTP status (201, 429 under a PDB, 409 for another uid, 404)."""
        body = {
            "apiVersion": "policy/v1",
            "kind": "Eviction",
            "metadata": {"name": name, "namespace": namespace},
            "deleteOptions": {"preconditions": {"uid": uid}},
        }
        path = path_of("Pod", namespace, name) + "/eviction"
        return (await self.request(session, "POST", path, body))[0]

    async def patch(self, session, kind: str, namespace, name: str, patch: dict, sub="") -> dict:
        path = path_of(kind, namespace, name) + (f"/{sub}" if sub else "")
        return await self.call(session, "PATCH", path, patch)
