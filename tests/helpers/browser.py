"""Debian's headless Chromium on a page served here: the DOM it built, a screenshot, and
the requests the page itself made (its network log: a request the page starts carries
the page's origin as its initiator; the browser's own, to its vendor, carry none); and
the elements of a page, each with the groups around it."""

from __future__ import annotations

import asyncio
import json
import shutil
import tempfile
from html.parser import HTMLParser
from pathlib import Path

CHROMIUM = "/usr/bin/chromium"
# a fresh profile that reaches for nothing of its own (this machine's network is closed)
FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--hide-scrollbars",
)
SCREENSHOTS = Path("test-results/screenshots")


async def _chromium(*args: str, timeout: float = 120.0) -> bytes:
    profile = tempfile.mkdtemp(prefix="chromium-")
    try:
        proc = await asyncio.create_subprocess_exec(
            CHROMIUM,
            *FLAGS,
            f"--user-data-dir={profile}",
            *args,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.DEVNULL,
        )
        out, _ = await asyncio.wait_for(proc.communicate(), timeout)
        assert proc.returncode == 0, f"chromium exited {proc.returncode}"
        return out
    finally:
        shutil.rmtree(profile, ignore_errors=True)


async def rendered(url: str) -> tuple[str, list[str]]:
    """The DOM Chromium built from ``url``, and the URLs the page itself asked for."""
    log = Path(tempfile.mkdtemp(prefix="netlog-")) / "net.json"
    try:
        dom = await _chromium(f"--log-net-log={log}", "--dump-dom", url)
        return dom.decode(), _requested_by(log, url)
    finally:
        shutil.rmtree(log.parent, ignore_errors=True)


async def screenshot(url: str, name: str, width: int = 1400, height: int = 1200) -> Path:
    """A screenshot of ``url`` into the test results, as ``name``.png."""
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    path = (SCREENSHOTS / f"{name}.png").resolve()
    await _chromium(f"--window-size={width},{height}", f"--screenshot={path}", url)
    assert path.stat().st_size > 0
    return path


def _requested_by(log: Path, url: str) -> list[str]:
    """Every URL a request started by ``url``'s page asked for."""
    origin = "/".join(url.split("/")[:3])
    events = json.loads(log.read_text())["events"]
    return sorted(
        {
            e["params"]["url"]
            for e in events
            if (e.get("params") or {}).get("initiator") == origin and "url" in e["params"]
        }
    )


class Elements(HTMLParser):
    """Each element's tag, attributes and the data-* attributes of the groups around it."""

    def __init__(self) -> None:
        super().__init__()
        self.found: list[tuple[str, dict, list[dict]]] = []
        self._open: list[tuple[str, dict]] = []

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        self.found.append((tag, attrs, [a for _, a in self._open]))
        if tag not in ("line", "br", "meta"):
            self._open.append((tag, attrs))

    def handle_endtag(self, tag):
        while self._open:
            if self._open.pop()[0] == tag:
                break


def parsed(page: str) -> Elements:
    elements = Elements()
    elements.feed(page)
    return elements


def drawn_or_row(tag: str, attrs: dict) -> bool:
    """A CPU or a device drawn for the pod, or its legend row (its lines aside)."""
    return "data-cpu" in attrs or "data-device" in attrs or tag == "tr"
