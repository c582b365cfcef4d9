"""The steering webhook's server (opt-in, ``run --steer``): answers the API server's
AdmissionReviews for the replacements of workloads under remediation with the node
affinity core/steering.py writes, over TLS from a certificate every replica shares (a
Secret in the remediator's namespace that the install makes empty and the leader fills
at first start). It never refuses a pod: a request it cannot read is allowed unchanged."""

from __future__ import annotations

import base64
import datetime
import ipaddress
import json
import logging
import os
import ssl
import tempfile
import time

from aiohttp import web
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from numaguard.common import webconfig
from numaguard.remediator.core.steering import TIMEOUT_SECONDS, mutation, steered_to

log = logging.getLogger(__name__)
# a pod create's review: the API server takes no request body over 3 MiB (its default
# --max-request-bytes), and a review holds the one pod
MAX_REVIEW_BYTES = 3 << 20
# reviews read at once: what slow or endless bodies on every connection may hold, at
# most this many times the largest (the API server sends each at once, and waits for
# its answer no longer than the webhook's timeout: a body read longer helps nobody)
REVIEWS_READ_AT_ONCE = 8
CERTIFICATE_DAYS = 3650


def certificate(hosts: list[str], now: datetime.datetime | None = None) -> dict[str, str]:
    """A self-signed serving certificate for ``hosts`` (DNS names or IP addresses), as a
    kubernetes.io/tls Secret's data holds it (PEM; ca.crt is the certificate itself)."""
    now = now or datetime.datetime.now(datetime.UTC)
    key = ec.generate_private_key(ec.SECP256R1())
    names: list[x509.GeneralName] = []
    for h in hosts:
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(h)))
        except ValueError:
            names.append(x509.DNSName(h))
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, hosts[0])])
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=CERTIFICATE_DAYS))
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    pem = cert.public_bytes(serialization.Encoding.PEM).decode()
    key_pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    ).decode()
    return {"tls.crt": pem, "tls.key": key_pem, "ca.crt": pem}


def secret_data(material: dict[str, str]) -> dict[str, str]:
    return {k: base64.b64encode(v.encode()).decode() for k, v in material.items()}


def from_secret(secret: dict) -> dict[str, str] | None:
    """The PEM material of a kubernetes.io/tls Secret, or None when incomplete (as the
    install makes it: empty)."""
    data = secret.get("data") or {}
    try:
        out = {k: base64.b64decode(data[k]).decode() for k in ("tls.crt", "tls.key")}
    except (KeyError, ValueError):
        return None
    if not all(out.values()):
        return None
    ca = data.get("ca.crt")
    out["ca.crt"] = base64.b64decode(ca).decode() if ca else out["tls.crt"]
    return out


def ssl_context(material: dict[str, str]) -> ssl.SSLContext:
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    # load_cert_chain reads files only: written where only this process can read them
    with tempfile.TemporaryDirectory() as d:
        cert, key = os.path.join(d, "tls.crt"), os.path.join(d, "tls.key")
        for path, text in ((cert, material["tls.crt"]), (key, material["tls.key"])):
            with open(os.open(path, os.O_WRONLY | os.O_CREAT, 0o600), "w") as f:
                f.write(text)
        context.load_cert_chain(cert, key)
    return context


async def review(request: web.Request) -> web.Response:
    """One AdmissionReview: allowed, with the node affinity the path names when the
    object is a pod being created; allowed unchanged otherwise."""
    try:
        body = await request.json()
        req = body["request"]
        uid = str(req["uid"])
    except (ValueError, KeyError, TypeError):
        return web.json_response({"error": "not an AdmissionReview"}, status=400)
    answer: dict = {"uid": uid, "allowed": True}
    steer = steered_to(request.path, time.time())
    pod = req.get("object")
    if steer is not None and req.get("operation") == "CREATE" and isinstance(pod, dict):
        required, nodes = steer
        patch = mutation(pod, nodes, required)
        answer["patchType"] = "JSONPatch"
        answer["patch"] = base64.b64encode(json.dumps(patch).encode()).decode()
        meta = pod.get("metadata") or {}
        log.info(
            "steered %s/%s to %s",
            req.get("namespace", ""),
            meta.get("name") or meta.get("generateName", ""),
            ",".join(nodes),
            extra={
                "decision": "steered",
                "namespace": req.get("namespace", ""),
                "nodes": list(nodes),
                "required": required,
            },
        )
    return web.json_response(
        {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": answer}
    )


def application() -> web.Application:
    app = web.Application(
        client_max_size=MAX_REVIEW_BYTES,
        middlewares=[webconfig.bounded_bodies(REVIEWS_READ_AT_ONCE, TIMEOUT_SECONDS)],
    )
    app.add_routes([web.post("/steer/{mode}/{until}/{nodes}", review)])
    return app


async def serve(
    material: dict[str, str],
    host: str,
    port: int,
    max_connections: int = 256,
    idle_timeout: float = 30.0,
) -> web.AppRunner:
    """On any pod's network: bounded as the metrics port is, in connections held and
    their idle time, and in the bodies read at once and how long each may take."""
    runner = web.AppRunner(
        application(), access_log=None, handle_signals=False, keepalive_timeout=idle_timeout
    )
    await runner.setup()
    tls = ssl_context(material)
    await webconfig.BoundedSite(runner, host, port, max_connections, tls).start()
    return runner
