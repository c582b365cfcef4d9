"""Thanos, as fleets run it over Prometheus: a sidecar beside each Prometheus server and
one querier over the sidecars, deduplicating HA replicas by their replica label.

``make thanos`` builds it from the module tests/thanos/go.mod pins (with Thanos's own
replace directives). Each process runs on 127.0.0.1 on free ports and is killed by PID.
"""

from __future__ import annotations

import re
import subprocess
import tempfile
from pathlib import Path

import aiohttp

from numaguard.simulator import CHECKOUT
from numaguard.simulator.parts.processes import cache, free_port, until, wait_ok


class ThanosMissing(RuntimeError):
    pass


def thanos_binary() -> Path:
    """Where ``make thanos`` put the version tests/thanos/go.mod pins."""
    text = (CHECKOUT / "tests/thanos/go.mod").read_text()
    version = re.search(r"^require github.com/thanos-io/thanos (v[0-9.]+)", text, re.M)[1]
    path = cache() / f"thanos-{version}"
    if not (path / ".built").is_file():
        raise ThanosMissing(f"{path} is incomplete: run make thanos")
    return path / "thanos"


class _Process:
    """A Thanos component: ``start()`` returns once it says it is ready."""

    def __init__(self, component: str, *args: str) -> None:
        self.http = free_port()
        self.grpc = free_port()
        self.url = f"http://127.0.0.1:{self.http}"
        self.grpc_address = f"127.0.0.1:{self.grpc}"
        self._argv = [
            str(thanos_binary()),
            component,
            f"--http-address=127.0.0.1:{self.http}",
            f"--grpc-address={self.grpc_address}",
            "--log.level=warn",
            *args,
        ]
        self._log = tempfile.TemporaryFile()  # noqa: SIM115 (closed in stop)
        self._proc: subprocess.Popen | None = None

    async def start(self, timeout: float = 60.0):
        self._proc = subprocess.Popen(self._argv, stdout=subprocess.DEVNULL, stderr=self._log)
        await wait_ok(
            f"{self.url}/-/ready",
            timeout,
            died=lambda: self.log() if self._proc.poll() is not None else None,
        )
        return self

    @property
    def pid(self) -> int:
        return self._proc.pid

    def log(self) -> str:
        self._log.seek(0)
        return self._log.read().decode(errors="replace")[-3000:]

    def stop(self) -> None:
        if self._proc and self._proc.poll() is None:
            self._proc.kill()
            self._proc.wait(timeout=10)
        self._log.close()


class Sidecar(_Process):
    """Beside one Prometheus server: serves its series, with its external labels, over
    Thanos's Store API."""

    def __init__(self, prometheus_url: str, tsdb: Path) -> None:
        super().__init__("sidecar", f"--prometheus.url={prometheus_url}", f"--tsdb.path={tsdb}")


class Query(_Process):
    """The querier over ``endpoints`` (Store API addresses), deduplicating series that
    differ only in ``replica_label``: the Prometheus HTTP API, as one Prometheus."""

    def __init__(self, endpoints: list[str], replica_label: str) -> None:
        super().__init__(
            "query",
            *(f"--endpoint={e}" for e in endpoints),
            f"--query.replica-label={replica_label}",
        )
        self.endpoints = endpoints

    async def start(self, timeout: float = 60.0) -> Query:
        await super().start(timeout)
        await self.wait_for_endpoints(len(self.endpoints), timeout)
        return self

    async def wait_for_endpoints(self, n: int, timeout: float = 60.0) -> None:
        """Until the querier has ``n`` endpoints up (it checks them on its own pace)."""

        async def up() -> bool:
            async with (
                aiohttp.ClientSession() as session,
                session.get(f"{self.url}/api/v1/stores") as r,
            ):
                stores = (await r.json())["data"]
            healthy = [s for group in stores.values() for s in group if not s.get("lastError")]
            return len(healthy) == n

        await until(up, f"{n} Thanos endpoints up", timeout, every=0.5)
