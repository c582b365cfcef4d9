"""The web config file's schema (exporter-toolkit's format), as pydantic checks it:
imported only when a file is given."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict

from numaguard.exporter.webconfig import CLIENT_AUTH, TLS_VERSIONS


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
