"""A real Alertmanager (Debian package ``prometheus-alertmanager``) on 127.0.0.1 with a
temporary data directory, for the tests: clustering off, the given configuration."""

from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
from pathlib import Path

from numaguard.simulator.parts.processes import wait_ok

BINARY = "prometheus-alertmanager"  # Debian's name for alertmanager


class AlertmanagerServer:
    def __init__(self, config: dict, port: int) -> None:
        self.config = config
        self.port = port
        self.url = f"http://127.0.0.1:{port}"
        self._dir: tempfile.TemporaryDirectory | None = None
        self._proc: subprocess.Popen | None = None

    async def __aenter__(self) -> AlertmanagerServer:
        path = shutil.which(BINARY)
        if path is None:
            raise RuntimeError(
                f"{BINARY} not found: apt-get install prometheus-alertmanager "
                "('make test' does it for you)"
            )
        self._dir = tempfile.TemporaryDirectory(prefix="numaguard-am-")
        d = Path(self._dir.name)
        (d / "alertmanager.yml").write_text(json.dumps(self.config))  # JSON is YAML
        self._log = open(d / "alertmanager.log", "wb")  # noqa: SIM115 (closed on exit)
        self._proc = subprocess.Popen(
            [
                path,
                f"--config.file={d / 'alertmanager.yml'}",
                f"--storage.path={d / 'data'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
                "--cluster.listen-address=",
                "--log.level=warn",
            ],
            stdout=subprocess.DEVNULL,
            stderr=self._log,
        )
        await wait_ok(
            f"{self.url}/-/ready",
            30,
            died=lambda: (
                (d / "alertmanager.log").read_text()[-2000:]
                if self._proc.poll() is not None
                else None
            ),
        )
        return self

    async def __aexit__(self, *exc) -> None:
        if self._proc and self._proc.poll() is None:
            self._proc.kill()
            self._proc.wait(timeout=10)
        self._log.close()
        self._dir.cleanup()
