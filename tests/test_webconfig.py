"""TLS and basic auth on /metrics (--web.config.file, exporter-toolkit's format): a real
Prometheus scrapes the exporter over TLS with a client certificate and with basic auth;
wrong credentials get 401, no certificate fails the handshake, the probes stay open;
the remediator serves the same; a bad file is a clear error before anything starts."""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import subprocess
import sys
import time

import aiohttp
import bcrypt
import pytest
import yaml

from numaguard.common.webconfig import NEW_TOKENS_BURST, NEW_TOKENS_PER_SECOND
from numaguard.simulator.fakes import presets
from numaguard.simulator.parts.controlplane import path_of, rendered
from numaguard.simulator.parts.processes import exporter_process, free_port, until, wait_ok
from numaguard.simulator.parts.prometheus import PrometheusServer

pytestmark = [pytest.mark.prometheus, pytest.mark.cluster]

PASSWORD = "s3cret"


def openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True)


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    """A CA, a server certificate for 127.0.0.1, a client certificate it signed, and a
    client certificate of another CA."""
    d = tmp_path_factory.mktemp("pki")
    for ca in ("ca", "other-ca"):
        openssl(
            *("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2"),
            *("-keyout", str(d / f"{ca}.key"), "-out", str(d / f"{ca}.crt"), "-subj", f"/CN={ca}"),
        )
    (d / "san.cnf").write_text("subjectAltName=IP:127.0.0.1\n")
    for name, ca, extra in (
        ("server", "ca", ["-extfile", str(d / "san.cnf")]),
        ("client", "ca", []),
        ("stranger", "other-ca", []),
    ):
        openssl(
            *("req", "-newkey", "rsa:2048", "-nodes", "-subj", f"/CN={name}"),
            *("-keyout", str(d / f"{name}.key"), "-out", str(d / f"{name}.csr")),
        )
        openssl(
            *("x509", "-req", "-in", str(d / f"{name}.csr"), "-days", "2"),
            *("-CA", str(d / f"{ca}.crt"), "-CAkey", str(d / f"{ca}.key"), "-CAcreateserial"),
            *("-out", str(d / f"{name}.crt"), *extra),
        )
    return d


def web_config(directory, tls: bool, users: bool) -> str:
    config = {}
    if tls:  # paths relative to the file, as exporter-toolkit reads them
        config["tls_server_config"] = {
            "cert_file": "server.crt",
            "key_file": "server.key",
            "client_auth_type": "RequireAndVerifyClientCert",
            "client_ca_file": "ca.crt",
        }
    if users:  # htpasswd -B writes $2y$
        hashed = bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(rounds=10)).decode()
        config["basic_auth_users"] = {"prometheus": "$2y$" + hashed[4:]}
    path = directory / f"web-{tls}-{users}.yml"
    path.write_text(yaml.safe_dump(config))
    return str(path)


def client_tls(pki, cert: str | None = "client") -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=str(pki / "ca.crt"))
    if cert:
        context.load_cert_chain(str(pki / f"{cert}.crt"), str(pki / f"{cert}.key"))
    return context


def basic(user: str, password: str) -> dict:
    return {"Authorization": aiohttp.encode_basic_auth(user, password)}


async def status(url: str, context=None, auth: dict | None = None) -> int:
    async with (
        aiohttp.ClientSession() as session,
        session.get(url, ssl=context, headers=auth or {}) as r,
    ):
        return r.status


def exporter_args(root, config: str) -> tuple[str, ...]:
    return (
        *("--host-root", str(root.root), "--node-name", "n1", "--interval", "0.5"),
        *("--gpu-backend", "none", "--web.config.file", config),
    )


async def test_prometheus_scrapes_over_tls_with_a_client_cert_and_basic_auth(fake_root, pki):
    root = fake_root(presets.two_socket())
    config = web_config(pki, tls=True, users=True)
    port = free_port()
    args = (*exporter_args(root, config), "--listen", f"127.0.0.1:{port}")
    proc = subprocess.Popen(
        [sys.executable, "-m", "numaguard.exporter", *args], stderr=subprocess.DEVNULL
    )
    url = f"https://127.0.0.1:{port}"
    right = basic("prometheus", PASSWORD)
    try:
        await wait_ok_tls(f"{url}/readyz", client_tls(pki))
        assert await status(f"{url}/metrics", client_tls(pki), right) == 200
        assert await status(f"{url}/metrics", client_tls(pki)) == 401
        wrong = basic("prometheus", "guess")
        assert await status(f"{url}/metrics", client_tls(pki), wrong) == 401
        assert await status(f"{url}/healthz", client_tls(pki)) == 200  # probes: no password
        for cert in (None, "stranger"):  # no certificate, or one of another CA
            with pytest.raises(aiohttp.ClientError):
                await status(f"{url}/metrics", client_tls(pki, cert), right)
        job = {
            "job_name": "tls",
            "scheme": "https",
            "tls_config": {
                "ca_file": str(pki / "ca.crt"),
                "cert_file": str(pki / "client.crt"),
                "key_file": str(pki / "client.key"),
            },
            "basic_auth": {"username": "prometheus", "password": PASSWORD},
            "static_configs": [{"targets": [f"127.0.0.1:{port}"]}],
        }
        async with PrometheusServer([], free_port(), other_jobs=[job]) as prom:
            await prom.wait_for('up{job="tls"} == 1')
            assert await prom.wait_for('numaguard_numa_node_info{job="tls", numa_node="0"}')
    finally:
        proc.terminate()
        proc.wait(timeout=10)


async def wait_ok_tls(url: str, context: ssl.SSLContext) -> None:
    async def ok() -> bool:
        try:
            return await status(url, context) == 200
        except aiohttp.ClientError:
            return False

    await until(ok, f"{url} answering")


async def test_basic_auth_alone_over_plain_http(fake_root, pki):
    root = fake_root(presets.two_socket())
    config = web_config(pki, tls=False, users=True)
    async with exporter_process(*exporter_args(root, config)) as (url, _):
        assert await status(f"{url}/metrics") == 401
        assert await status(f"{url}/metrics", auth=basic("prometheus", PASSWORD)) == 200
        job = {
            "job_name": "auth",
            "basic_auth": {"username": "prometheus", "password": PASSWORD},
            "static_configs": [{"targets": [url.removeprefix("http://")]}],
        }
        async with PrometheusServer([], free_port(), other_jobs=[job]) as prom:
            await prom.wait_for('up{job="auth"} == 1')


@pytest.mark.parametrize(
    ("config", "says"),
    [
        ({"basic_auth_users": {"p": "plain-text"}}, "basic_auth_users.p is not a bcrypt hash"),
        (
            {
                "tls_server_config": {
                    "cert_file": "server.crt",
                    "key_file": "server.key",
                    "client_auth_type": "RequireAndVerifyClientCert",
                }
            },
            "RequireAndVerifyClientCert needs client_ca_file",
        ),
        ({"tls_server_config": {"cert_file": "nope.crt", "key_file": "nope.key"}}, "No such"),
        ({"http2": True}, "http2: Extra inputs are not permitted"),
        (
            {
                "tls_server_config": {
                    "cert_file": "server.crt",
                    "key_file": "server.key",
                    "client_auth_type": "RequestClientCert",
                }
            },
            "client_auth_type",
        ),
    ],
)
@pytest.mark.parametrize("component", ["exporter", "remediator"])
def test_a_bad_web_config_is_a_clear_error_before_anything_starts(pki, config, says, component):
    path = pki / "bad.yml"
    path.write_text(yaml.safe_dump(config))
    argv = {
        "exporter": [
            "-m",
            "numaguard.exporter",
            "--host-root",
            "/",
            "--web.config.file",
            str(path),
        ],
        "remediator": [
            *("-m", "numaguard.remediator", "run", "--prometheus", "http://127.0.0.1:1"),
            *("--web.config.file", str(path)),
        ],
    }[component]
    done = subprocess.run([sys.executable, *argv], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert "--web.config.file" in done.stderr and says in done.stderr, done.stderr


@contextlib.asynccontextmanager
async def remediator(cp, tmp_path, *web: str):
    """``remediator run`` as its ServiceAccount with these web flags; yields its URL once
    /healthz (open to probes) answers."""
    account = "numaguard-remediator"
    kubeconfig = cp.kubeconfig(tmp_path / "kubeconfig", cp.tokens[account], account)
    port = free_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            *("-m", "numaguard.remediator", "run", "--kubeconfig", kubeconfig),
            *("--prometheus", f"http://127.0.0.1:{free_port()}", "--listen", f"127.0.0.1:{port}"),
            *("--lease-namespace", "numaguard", "--lease-name", "webconfig-test", *web),
        ],
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        await wait_ok(f"{url}/healthz")
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=30)


async def test_the_remediator_serves_its_metrics_with_the_same_config(pki, tmp_path, control_plane):
    config = web_config(pki, tls=False, users=True)
    async with remediator(control_plane, tmp_path, "--web.config.file", config) as url:
        assert await status(f"{url}/metrics") == 401
        assert await status(f"{url}/metrics", auth=basic("prometheus", PASSWORD)) == 200


def bearer(token: str) -> dict:
    return {"Authorization": f"Bearer {token}"}


READERS = ("prometheus", "stranger", "viewer")


@contextlib.asynccontextmanager
async def scrapers(cp, session):
    """deploy/components/kubernetes-auth's RBAC (what it adds to the base) applied; and
    would-be readers in namespace monitoring: prometheus, allowed to get /metrics as
    kube-prometheus-stack's Prometheus ClusterRole allows it, stranger, not, and viewer,
    bound to the component's numaguard-page-viewer. Yields {name: a token of it}; takes
    it all away after."""
    base = {(o["kind"], o["metadata"]["name"]) for o in rendered()}
    made = [
        o for o in rendered("kubernetes-auth") if (o["kind"], o["metadata"]["name"]) not in base
    ]
    if await cp.get(session, "Namespace", None, "monitoring") is None:
        made.append({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "monitoring"}})
    for name in READERS:
        account = {"apiVersion": "v1", "kind": "ServiceAccount"}
        made.append({**account, "metadata": {"name": name, "namespace": "monitoring"}})
    rbac = {"apiVersion": "rbac.authorization.k8s.io/v1"}
    made += [
        {
            **rbac,
            "kind": "ClusterRole",
            "metadata": {"name": "numaguard-test-metrics-reader"},
            "rules": [{"nonResourceURLs": ["/metrics"], "verbs": ["get"]}],
        },
        {
            **rbac,
            "kind": "ClusterRoleBinding",
            "metadata": {"name": "numaguard-test-metrics-reader"},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": "numaguard-test-metrics-reader",
            },
            "subjects": [
                {"kind": "ServiceAccount", "name": "prometheus", "namespace": "monitoring"}
            ],
        },
        {
            **rbac,
            "kind": "ClusterRoleBinding",
            "metadata": {"name": "numaguard-test-page-viewer"},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": "numaguard-page-viewer",
            },
            "subjects": [{"kind": "ServiceAccount", "name": "viewer", "namespace": "monitoring"}],
        },
    ]
    for obj in made:
        await cp.create(session, obj)
    try:
        yield {
            name: await cp.service_account_token(session, "monitoring", name) for name in READERS
        }
    finally:
        for obj in reversed(made):
            if obj["kind"] != "Namespace":
                meta = obj["metadata"]
                await cp.request(
                    session, "DELETE", path_of(obj["kind"], meta.get("namespace"), meta["name"])
                )


async def test_kubernetes_auth_lets_in_only_scrapers_the_api_server_allows(
    fake_root, tmp_path, control_plane
):
    cp = control_plane
    root = fake_root(presets.two_socket())
    async with (
        aiohttp.ClientSession() as session,
        scrapers(cp, session) as tokens,
        cp.fault_proxy() as proxy,
    ):
        account = "numaguard-exporter"
        kubeconfig = cp.kubeconfig(
            tmp_path / "exporter.kubeconfig", cp.tokens[account], account, server=proxy.url
        )
        args = ("--host-root", str(root.root), "--node-name", "n1", "--interval", "0.5")
        args += ("--gpu-backend", "none", "--kubeconfig", kubeconfig, "--web.kubernetes-auth")
        async with exporter_process(*args) as (url, _):
            metrics = f"{url}/metrics"
            assert await status(f"{url}/healthz") == 200  # the probes carry no token
            assert await status(metrics) == 401
            assert await status(metrics, auth=bearer("not-a-token")) == 401
            assert await status(metrics, auth=bearer(tokens["stranger"])) == 403
            assert await status(metrics, auth=bearer(tokens["prometheus"])) == 200

            # the map, for a person bound to the page viewer's role only
            placement = f"{url}/placement"
            assert await status(placement, auth=bearer(tokens["viewer"])) == 200
            assert await status(placement, auth=bearer(tokens["prometheus"])) == 403
            assert await status(metrics, auth=bearer(tokens["viewer"])) == 403

            files = {}
            for name, token in tokens.items():
                files[name] = tmp_path / f"{name}.token"
                files[name].write_text(token)
            jobs = [
                {
                    "job_name": name,
                    "authorization": {"credentials_file": str(files[name])},
                    "static_configs": [{"targets": [url.removeprefix("http://")]}],
                }
                for name in tokens
            ]
            async with PrometheusServer([], free_port(), other_jobs=jobs, version="3") as prom:
                await prom.wait_for('numaguard_numa_node_info{job="prometheus", numa_node="0"}')
                await prom.wait_for('count_over_time(up{job="prometheus"}[1m]) >= 5')
                assert await prom.wait_for('up{job="stranger"} == 0')
                assert not await prom.query('numaguard_build_info{job="stranger"}')
            # the API server's word is remembered: one TokenReview per token and path,
            # however many scrapes (six so far: the bad token's and stranger's on
            # /metrics, prometheus' and viewer's on /metrics and /placement)
            reviews = [e for e in proxy.log if e.path.endswith("/tokenreviews")]
            assert len(reviews) == 6, reviews

            # a token the API server cannot be asked about gets 503, and is not remembered
            proxy.fail_next(500, times=1, match=lambda _, path: path.endswith("/tokenreviews"))
            assert await status(metrics, auth=bearer("another-token")) == 503
            assert await status(metrics, auth=bearer("another-token")) == 401

            # a flood of made-up tokens: the API server is asked about a few a second,
            # the rest are told to come back unasked; the scraper it knows still gets in
            asked_before = sum(e.path.endswith("/tokenreviews") for e in proxy.log)
            started = time.monotonic()
            flood = [status(metrics, auth=bearer(f"made-up-{i}")) for i in range(200)]
            answers = await asyncio.gather(*flood)
            assert await status(metrics, auth=bearer(tokens["prometheus"])) == 200
            took = time.monotonic() - started
            asked = sum(e.path.endswith("/tokenreviews") for e in proxy.log) - asked_before
            bound = NEW_TOKENS_BURST + NEW_TOKENS_PER_SECOND * took + 1
            assert asked <= bound, (asked, took)
            assert set(answers) <= {401, 429} and answers.count(401) == asked


async def test_the_remediator_takes_kubernetes_auth_too(tmp_path, control_plane):
    async with (
        aiohttp.ClientSession() as session,
        scrapers(control_plane, session) as tokens,
        remediator(control_plane, tmp_path, "--web.kubernetes-auth") as url,
    ):
        assert await status(f"{url}/metrics") == 401
        assert await status(f"{url}/metrics", auth=bearer(tokens["stranger"])) == 403
        assert await status(f"{url}/metrics", auth=bearer(tokens["prometheus"])) == 200
        # the decision page: the page viewer's, not Prometheus'; past the auth, it says
        # whether a cycle has run yet
        decisions = f"{url}/decisions"
        assert await status(decisions, auth=bearer(tokens["prometheus"])) == 403
        assert await status(decisions, auth=bearer(tokens["viewer"])) in (200, 503)


async def test_the_remediator_lets_idle_and_slow_clients_go(tmp_path, control_plane):
    """As the exporter's: past --web.max-connections the longest-held idle connection
    makes room, long before any idle timeout, and its metrics are answered; one that
    says nothing is closed after --web.idle-timeout."""

    async def closed_within(conns, seconds: float) -> int:
        async def one(reader) -> bool:
            with contextlib.suppress(TimeoutError):
                return await asyncio.wait_for(reader.read(), seconds) == b""
            return False

        return sum(await asyncio.gather(*(one(r) for r, _ in conns)))

    bounded = ("--web.idle-timeout", "600", "--web.max-connections", "4")
    async with remediator(control_plane, tmp_path, *bounded) as url:
        host, port = url.removeprefix("http://").split(":")
        idle = [await asyncio.open_connection(host, int(port)) for _ in range(8)]
        try:
            async with aiohttp.ClientSession() as session, session.get(f"{url}/metrics") as r:
                assert r.status == 200
                assert "numaguard_remediator" in await r.text()
            # 8 idle and one scrape through 4 places: 5 made room, the 4 last wait
            assert await closed_within(idle, 5) == 5
        finally:
            for _, writer in idle:
                writer.close()
    async with remediator(control_plane, tmp_path, "--web.idle-timeout", "1") as url:
        host, port = url.removeprefix("http://").split(":")
        silent = [await asyncio.open_connection(host, int(port))]
        try:
            assert await closed_within(silent, 30) == 1
        finally:
            silent[0][1].close()
