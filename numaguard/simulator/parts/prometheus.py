"""A real Prometheus on 127.0.0.1 with a temporary data directory, scraping given
targets: for the tests, the demo and the benchmarks. Two majors: 2 is Debian's package
``prometheus`` (2.42, with its promtool), 3 is built from the Go module pinned in
tests/prometheus/go.mod by ``make prometheus3`` (``make test`` does it)."""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import subprocess
import tempfile
import time
from collections import Counter
from pathlib import Path

import aiohttp

from numaguard.remediator.core.answers import Signals
from numaguard.remediator.core.queries import REQUIRED_LABELS
from numaguard.remediator.signals import frame
from numaguard.simulator import CHECKOUT
from numaguard.simulator.parts.processes import cache, wait_ok


def as_signals(
    at: float,
    rows: dict[str, list[dict]],
    instances: dict[str, str],
    queries: dict[str, tuple[str, ...]] = REQUIRED_LABELS,
) -> Signals:
    """The remediator's Signals for the given rows per query, read as it reads real
    answers (empty labels absent, rows lacking a label it needs or with a bad value
    dropped); every other query answers nothing. ``instances``: node -> its exporter
    target, given to each row of that node that names no instance, as a scrape would;
    ``queries``: query name -> the labels its rows need."""
    answers: dict[str, list] = {name: [] for name in queries}
    for name, given in rows.items():
        for row in given:
            labels = {k: str(v) for k, v in row.items() if k != "value" and v != ""}
            if labels.get("node") in instances:
                labels.setdefault("instance", instances[labels["node"]])
            answers[name].append({"metric": labels, "value": [at, str(row["value"])]})
    frames, dropped = {}, Counter()
    for name, result in answers.items():
        body = {"status": "success", "data": {"resultType": "vector", "result": result}}
        frames[name], lost = frame(name, body, queries[name])
        dropped.update({(name, reason): n for reason, n in lost.items()})
    return Signals(at, frames, dropped)


class PrometheusMissing(RuntimeError):
    pass


VERSIONS = ("2", "3")  # the majors the rules, dashboards and alert tests run on


def built_prometheus3() -> Path:
    """Where ``make prometheus3`` puts the Prometheus 3 that tests/prometheus/go.mod pins."""
    text = (CHECKOUT / "tests/prometheus/go.mod").read_text()
    module = re.search(r"github\.com/prometheus/prometheus v0\.(\d+)\.(\d+)", text)
    version = f"v3.{int(module[1]) - 300}.{module[2]}"  # v0.316.0 is Prometheus 3.16.0
    return cache() / f"prometheus-{version}"


def binary(name: str = "prometheus", version: str = "2") -> str:
    """``prometheus`` or ``promtool`` of that major version."""
    if version == "3":
        path = built_prometheus3() / name
        if not path.is_file():
            raise PrometheusMissing(f"{path} is missing: run make prometheus3")
        return str(path)
    path = shutil.which(name)
    if path is None:
        raise PrometheusMissing(
            f"{name} not found: install the Debian package 'prometheus' "
            "(apt-get install prometheus; 'make test' does it for you)"
        )
    return path


def tsdb_blocks(openmetrics: Path) -> Path:
    """The TSDB blocks (``PrometheusServer(blocks=...)``) of an OpenMetrics file's
    samples, made by promtool beside it; the file is removed."""
    blocks = openmetrics.parent / "blocks"
    subprocess.run(
        [
            binary("promtool"),
            "tsdb",
            "create-blocks-from",
            "openmetrics",
            str(openmetrics),
            str(blocks),
        ],
        check=True,
        capture_output=True,
    )
    openmetrics.unlink()
    return blocks


class PrometheusServer:
    def __init__(
        self,
        targets: list[str],
        port: int,
        scrape_interval: str = "1s",
        rule_files: list[str] | None = None,
        alertmanagers: list[str] | None = None,
        other_jobs: list[dict] | None = None,
        version: str = "2",
        config_file: str | None = None,
        blocks: Path | None = None,
    ) -> None:
        self.version = version
        self.blocks = blocks  # a TSDB's blocks (promtool's backfill) to start with
        self.targets = targets
        self.other_jobs = other_jobs or []  # more scrape configs, beside job numaguard
        self.port = port
        self.scrape_interval = scrape_interval
        self.rule_files = rule_files or []
        self.alertmanagers = alertmanagers or []  # host:port
        self.config_file = config_file  # a whole configuration, instead of the above
        self.url = f"http://127.0.0.1:{port}"
        self._dir: tempfile.TemporaryDirectory | None = None
        self._proc: subprocess.Popen | None = None
        self._log = None

    async def __aenter__(self) -> PrometheusServer:
        await self.start()
        return self

    async def __aexit__(self, *exc) -> None:
        self.stop()

    async def start(self, timeout: float = 30.0) -> None:
        self._dir = tempfile.TemporaryDirectory(prefix="numaguard-prom-")
        d = Path(self._dir.name)
        config = {
            "global": {
                "scrape_interval": self.scrape_interval,
                "evaluation_interval": self.scrape_interval,
            },
            "rule_files": self.rule_files,
            "scrape_configs": [
                {"job_name": "numaguard", "static_configs": [{"targets": self.targets}]},
                *self.other_jobs,
            ],
        }
        if self.alertmanagers:
            config["alerting"] = {
                "alertmanagers": [{"static_configs": [{"targets": self.alertmanagers}]}]
            }
        (d / "prometheus.yml").write_text(json.dumps(config))  # JSON is YAML
        if self.blocks is not None:  # linked, not copied: Prometheus never rewrites a block
            shutil.copytree(self.blocks, d / "data", copy_function=os.link)
        config_file = self.config_file or d / "prometheus.yml"
        self.data = d / "data"  # its TSDB: a Thanos sidecar beside it reads it
        self._log = open(d / "prometheus.log", "wb")  # noqa: SIM115 (closed in stop)
        self._proc = subprocess.Popen(
            [
                binary("prometheus", self.version),
                f"--config.file={config_file}",
                f"--storage.tsdb.path={self.data}",
                f"--web.listen-address=127.0.0.1:{self.port}",
                "--log.level=warn",
                "--web.enable-lifecycle",  # reload(), as a config reloader would
            ],
            stdout=subprocess.DEVNULL,
            stderr=self._log,
        )
        await wait_ok(
            f"{self.url}/-/ready",
            timeout,
            died=lambda: self.log() if self._proc.poll() is not None else None,
        )

    async def reload(self) -> None:
        """Read the configuration file again; raises if Prometheus refuses it."""
        async with (
            aiohttp.ClientSession() as session,
            session.post(f"{self.url}/-/reload") as r,
        ):
            if r.status != 200:
                raise RuntimeError(f"reload refused: {r.status} {await r.text()}")

    @property
    def pid(self) -> int:
        return self._proc.pid

    def log(self) -> str:
        return (Path(self._dir.name) / "prometheus.log").read_text()[-2000:] if self._dir else ""

    def stop(self) -> None:
        if self._proc and self._proc.poll() is None:
            self._proc.kill()
            self._proc.wait(timeout=10)
        if self._log:
            self._log.close()
            self._log = None
        if self._dir:
            self._dir.cleanup()
            self._dir = None

    async def query(self, expr: str) -> list[dict]:
        """An instant query; the result vector as returned by the HTTP API."""
        async with (
            aiohttp.ClientSession() as session,
            session.get(f"{self.url}/api/v1/query", params={"query": expr}) as r,
        ):
            body = await r.json()
        if body.get("status") != "success":
            raise RuntimeError(f"query {expr!r} failed: {body}")
        return body["data"]["result"]

    async def wait_for(self, expr: str, timeout: float = 60.0) -> list[dict]:
        """Poll ``expr`` until it returns something (scrapes and rules start late)."""
        deadline = time.monotonic() + timeout
        while True:
            result = await self.query(expr)
            if result:
                return result
            if time.monotonic() > deadline:
                raise AssertionError(f"{expr!r} returned nothing within {timeout}s")
            await asyncio.sleep(0.5)
