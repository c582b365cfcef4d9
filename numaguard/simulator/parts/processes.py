"""Starting real processes on loopback (the exporter, Prometheus) and waiting for them."""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import os
import random
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import aiohttp
import psutil


async def until(check, what: str, timeout: float = 60.0, every: float = 0.1):
    """Await ``check()`` until it returns something truthy, and return that: the one way
    tests and the simulator wait on a condition they cannot be told about."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        result = await check()
        if result:
            return result
        if loop.time() > deadline:
            raise AssertionError(f"not {what} in {timeout:g}s")
        await asyncio.sleep(every)


def cache() -> Path:
    """Where make builds the pinned real parts: numaguard/ in $XDG_CACHE_HOME, else in
    ~/.cache, one folder each keyed by version."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "numaguard"


def free_port(address: str = "127.0.0.1") -> int:
    """A port free now, below the kernel's ephemeral range: the port a test hands a
    server it starts later. One from that range (bind to port 0) can be taken meanwhile
    by any outgoing connection (an API server's to etcd, a scrape)."""
    try:
        ephemeral = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        ephemeral = 32768
    candidates = list(range(max(1024, ephemeral - 16384), ephemeral))
    random.shuffle(candidates)
    for port in candidates:
        with socket.socket() as s, contextlib.suppress(OSError):
            s.bind((address, port))
            return port
    raise OSError(f"no free port below {ephemeral} on {address}")


def routable_address() -> str:
    """This machine's first IPv4 address that is neither loopback nor link-local: one a
    pod's status and an EndpointSlice accept (the API server refuses those two)."""
    for addresses in psutil.net_if_addrs().values():
        for a in addresses:
            ip = ipaddress.ip_address(a.address) if a.family == socket.AF_INET else None
            if ip and not (ip.is_loopback or ip.is_link_local):
                return str(ip)
    raise RuntimeError(
        "this machine has no IPv4 address but loopback or link-local ones; the tests that "
        "run exporters as pods need one (EndpointSlices refuse those): add one to an interface"
    )


async def wait_ok(url: str, timeout: float = 120.0, died: Callable[[], str | None] = lambda: None):
    """Poll ``url`` until it answers 200. ``died`` returns why the process is gone, if it is.
    ``timeout`` only ends a hang: an emulated guest takes tens of seconds to start one."""
    deadline = time.monotonic() + timeout
    async with aiohttp.ClientSession() as session:
        while time.monotonic() < deadline:
            reason = died()
            if reason is not None:
                raise RuntimeError(f"{url}: the process exited: {reason}")
            with contextlib.suppress(aiohttp.ClientError):
                async with session.get(url) as r:
                    if r.status == 200:
                        return
            await asyncio.sleep(0.1)
    raise RuntimeError(f"{url} not ready after {timeout}s")


@contextlib.asynccontextmanager
async def exporter_process(
    *args: str,
    env: dict | None = None,
    address: str = "127.0.0.1",
    wrapper: tuple[str, ...] = (),
    gpus: str | None = None,
    port: int | None = None,
) -> AsyncIterator[tuple[str, subprocess.Popen]]:
    """``python -m numaguard.exporter ARGS`` on a free port of ``address``, once ready; on the fake
    GPU node described in the file ``gpus`` if one is given (simulator.fakes.gpu_exporter), run by
    ``wrapper`` (a command that runs the rest of its arguments) if one is given; on
    ``port`` if one is given.

    Yields (base URL, process); stops it with SIGTERM on the way out.
    """
    port = port or free_port(address)
    module = (
        ("numaguard.exporter",)
        if gpus is None
        else ("numaguard.simulator.fakes.gpu_exporter", gpus)
    )
    # its log goes to a file: a pipe nobody reads fills up and blocks the exporter
    log = tempfile.TemporaryFile()  # noqa: SIM115 (read after the process ends)
    proc = subprocess.Popen(
        [*wrapper, sys.executable, "-m", *module, "--listen", f"{address}:{port}", *args],
        stdout=subprocess.DEVNULL,
        stderr=log,
        env=env,
    )
    proc.log = log

    def died() -> str | None:
        if proc.poll() is None:
            return None
        return f"code {proc.returncode}: {log_of(proc)[-2000:]}"

    url = f"http://{address}:{port}"
    try:
        await wait_ok(f"{url}/readyz", died=died)
        yield url, proc
    finally:
        if proc.poll() is None:
            proc.terminate()
            proc.wait(timeout=10)


def log_of(proc: subprocess.Popen) -> str:
    """What an exporter_process wrote to stderr so far."""
    proc.log.seek(0)
    return proc.log.read().decode()


async def get(url: str) -> bytes:
    async with aiohttp.ClientSession() as session, session.get(url) as r:
        return await r.read()
