"""The web config file's schema (exporter-toolkit's format), as pydantic checks it:
imported only when a file is given."""

from __future__ import annotations

import ssl
from typing import Literal

from pydantic import BaseModel, ConfigDict

# exporter-toolkit's names -> what the handshake asks of a client. Its two that take a
# certificate unverified (RequestClientCert, RequireAnyClientCert) are refused: the
# standard library verifies every certificate it is given.
CLIENT_AUTH = {
    "NoClientCert": ssl.CERT_NONE,
    "VerifyClientCertIfGiven": ssl.CERT_OPTIONAL,
    "RequireAndVerifyClientCert": ssl.CERT_REQUIRED,
}

TLS_VERSIONS = {
    "TLS10": ssl.TLSVersion.TLSv1,
    "TLS11": ssl.TLSVersion.TLSv1_1,
    "TLS12": ssl.TLSVersion.TLSv1_2,
    "TLS13": ssl.TLSVersion.TLSv1_3,
}


class TlsServerConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    cert_file: str
    key_file: str
    client_auth_type: Literal[tuple(CLIENT_AUTH)] = "NoClientCert"
    client_ca_file: str = ""
    min_version: Literal[tuple(TLS_VERSIONS)] = "TLS12"
    max_version: Literal[tuple(TLS_VERSIONS)] = "TLS13"


class WebConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    tls_server_config: TlsServerConfig | None = None
    basic_auth_users: dict[str, str] = {}
