"""The exporter daemon: an aiohttp server for /metrics, /placement (the node's placement
map), /healthz and /readyz, and the background loop that runs a collection cycle every
interval."""

from __future__ import annotations

import asyncio
import importlib
import json
import logging
import os
import signal
import time
from collections.abc import Callable, Mapping

from aiohttp import web

from numaguard.common import webconfig
from numaguard.common.apiserver import KubeconfigError, connect
from numaguard.common.process import settle_garbage_collector
from numaguard.exporter.collection import POD_PLACEMENT, Collection, Source
from numaguard.exporter.collectors import COLLECTORS, Collector
from numaguard.exporter.exposition import CONTENT_TYPE_OPENMETRICS, CONTENT_TYPE_TEXT
from numaguard.exporter.model import NodeSnapshot
from numaguard.exporter.model.placement_map import placement_map
from numaguard.exporter.mover.orders import MemoryMover
from numaguard.exporter.mover.wire import HelperClient
from numaguard.exporter.placement_page import render
from numaguard.exporter.publishers.nrt import NrtPublisher
from numaguard.exporter.settings import Settings
from numaguard.exporter.sources.dra import DraWatch
from numaguard.exporter.sources.kube import PodMetadataWatch

log = logging.getLogger(__name__)


STUCK_CYCLES = 3  # cycles a read may hang before /healthz asks for a restart
# what every Linux host root has: without them the exporter looks at the wrong place
HOST_ROOT_HAS = ("proc", "sys/devices/system/node", "sys/fs/cgroup")


def accepts(header: str, wanted: str) -> bool:
    """Whether an Accept or Accept-Encoding header asks for ``wanted`` (a media type,
    parameters aside, or a coding) with a non-zero quality; ``q=0`` means "not this"."""
    for item in header.split(","):
        name, *params = (part.strip() for part in item.split(";"))
        if name.lower() != wanted:
            continue
        for param in params:
            key, _, value = param.partition("=")
            if key.strip().lower() == "q":
                try:
                    return float(value) > 0
                except ValueError:
                    return False
        return True
    return False


class Exporter:
    def __init__(
        self,
        settings: Settings,
        collection: Collection,
        publisher: NrtPublisher | None = None,
        mover: MemoryMover | None = None,
    ) -> None:
        self.settings = settings
        self.collection = collection
        self.publisher = publisher  # --nrt
        self._publishing: asyncio.Task | None = None
        self.mover = mover  # --memory-mover
        self._moving: asyncio.Future | None = None
        self.last_cycle_end: float | None = None
        # the last cycle's placement map, drawn when first asked for: (its snapshot, page, json)
        self._placement: tuple[NodeSnapshot, bytes, bytes] | None = None
        self.app = web.Application()
        self.app.add_routes(
            [
                web.get("/", self.index),
                web.get("/metrics", self.metrics),
                web.get("/placement", self.placement),
                web.get("/healthz", self.healthz),
                web.get("/readyz", self.readyz),
            ]
        )

    async def run_cycles(self) -> None:
        interval = self.settings.interval_seconds
        while True:
            started = time.monotonic()
            try:
                await self.collection.run_once()
            except Exception:  # never let one bad cycle end the loop
                log.exception("collection cycle failed")
            self.last_cycle_end = time.monotonic()
            self._publish()
            self._move()
            await asyncio.sleep(max(0.0, interval - (self.last_cycle_end - started)))

    async def close(self) -> None:
        """Stop what runs beside the cycles; a move under way stops after its batch (a
        thread cannot be cancelled, and the process cannot end before it does)."""
        if self._publishing is not None:
            self._publishing.cancel()
        if self.mover is not None:
            self.mover.stop()
        if self._moving is not None:
            await asyncio.wait([self._moving])

    def _move(self) -> None:
        """The requests this cycle's pods carry, carried out in a worker thread beside the
        next cycles (a move takes as long as its rate says); one move at a time."""
        snap, metadata = self.collection.snapshot, self.collection.metadata()
        if self.mover is None or snap is None or metadata is None:
            return
        if self._moving is None or self._moving.done():
            self._moving = asyncio.ensure_future(
                asyncio.to_thread(self.mover.carry_out, snap, metadata)
            )
            self._moving.add_done_callback(_log_failure)

    def _publish(self) -> None:
        """The NodeResourceTopology of this cycle, written beside the next one: a slow
        API server delays the object, never a cycle; one write at a time."""
        snap = self.collection.snapshot
        if self.publisher is None or snap is None:
            return
        if self._publishing is None or self._publishing.done():
            self._publishing = asyncio.create_task(self.publisher.publish(snap))

    async def metrics(self, request: web.Request) -> web.Response:
        rendered = self.collection.exposition
        if rendered is None:
            return web.Response(status=503, text="first collection cycle not finished yet\n")
        wants_om = accepts(request.headers.get("Accept", ""), "application/openmetrics-text")
        gz = accepts(request.headers.get("Accept-Encoding", ""), "gzip")
        body = await rendered.body(wants_om, gz)
        headers = {"Content-Type": CONTENT_TYPE_OPENMETRICS if wants_om else CONTENT_TYPE_TEXT}
        if gz:
            headers["Content-Encoding"] = "gzip"
        return web.Response(body=body, headers=headers)

    async def healthz(self, request: web.Request) -> web.Response:
        # Alive while cycles keep finishing and no read hangs: collectors are bounded by
        # their timeout, so a cycle that has not ended in three intervals means the loop
        # is stuck, and a read still running three intervals on is stuck in the kernel.
        limit = STUCK_CYCLES * self.settings.interval_seconds
        limit += self.settings.collector_timeout_seconds
        if self.last_cycle_end is not None and time.monotonic() - self.last_cycle_end > limit:
            return web.Response(status=500, text="collection loop stalled\n")
        stuck = self.collection.stuck(limit)
        if stuck:
            text = f"{', '.join(stuck)}: a read has not returned in {limit:g}s; restart me\n"
            return web.Response(status=500, text=text)
        return web.Response(text="ok\n")

    async def readyz(self, request: web.Request) -> web.Response:
        root = self.settings.host_root
        missing = [p for p in HOST_ROOT_HAS if not os.path.isdir(os.path.join(root, p))]
        if missing:
            text = f"--host-root {root} has no {', '.join(missing)}: point it at the host's /\n"
            return web.Response(status=503, text=text)
        if self.collection.exposition is None:
            return web.Response(status=503, text="waiting for the first collection cycle\n")
        return web.Response(text="ready\n")

    async def placement(self, request: web.Request) -> web.Response:
        """The node's placement map from the last cycle's snapshot: a page (an inline
        SVG, nothing fetched), or JSON with ``?format=json``. Drawn only when asked for,
        once a cycle: a cycle nobody looks at costs nothing."""
        snap = self.collection.snapshot
        if snap is None:
            return web.Response(status=503, text="first collection cycle not finished yet\n")
        wanted = request.query.get("format", "html")
        if wanted not in ("html", "json"):
            return web.Response(status=400, text="format is html or json\n")
        if self._placement is None or self._placement[0] is not snap:
            # the pods' cgroups read, and not past the cardinality guard (unknown, not gone)
            known = snap.readings.get(POD_PLACEMENT) is not None and not self.collection.limited
            self._placement = (snap, *await asyncio.to_thread(_drawn, snap, known))
        _, page, data = self._placement
        if wanted == "json":
            return web.Response(body=data, content_type="application/json")
        # the page fetches nothing: a policy that forbids it says so to the browser too
        headers = {"Content-Security-Policy": "default-src 'none'; style-src 'unsafe-inline'"}
        return web.Response(body=page, content_type="text/html", charset="utf-8", headers=headers)

    async def index(self, request: web.Request) -> web.Response:
        links = "".join(
            f"<li><a href='{path}'>{path}</a> {what}</li>"
            for path, what in (
                ("/metrics", "the metrics"),
                ("/placement", "where each pod's CPUs, memory and devices sit (?format=json)"),
                ("/healthz", "alive"),
                ("/readyz", "ready"),
            )
        )
        page = (
            "<!doctype html><html lang='en'><head><meta charset='utf-8'>"
            "<title>numaguard exporter</title></head><body><h1>numaguard exporter</h1>"
            f"<ul>{links}</ul></body></html>"
        )
        return web.Response(text=page, content_type="text/html")


def _drawn(snap: NodeSnapshot, pods_known: bool) -> tuple[bytes, bytes]:
    """The placement page and its JSON."""
    data = placement_map(snap, pods_known)
    return render(data).encode(), json.dumps(data, separators=(",", ":")).encode()


async def serve(settings: Settings, stop: asyncio.Event | None = None) -> None:
    """Run until SIGTERM/SIGINT (or ``stop`` is set), then shut down cleanly."""
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    webconfig.quiet_accept_errors(loop)

    api = connect(settings.kubeconfig)
    if api is None and (settings.nrt or settings.web_kubernetes_auth or settings.memory_mover):
        # before anything is started that would need stopping
        raise KubeconfigError(
            "nothing (--nrt, --web.kubernetes-auth and --memory-mover need it: give --kubeconfig)"
        )
    tasks, metadata, dra = _watches(api, settings.node_name)
    sources = await open_sources(settings)
    publisher = NrtPublisher(api) if settings.nrt else None
    mover = (
        MemoryMover(HelperClient(settings.memory_mover_socket)) if settings.memory_mover else None
    )
    collection = Collection(
        settings.node_name,
        sources,
        metadata=metadata,
        dra=dra,
        thresholds=settings.thresholds,
        timeout_seconds=settings.collector_timeout_seconds,
        nrt_current=(lambda: publisher.current) if publisher else (lambda: None),
        moves=(lambda: mover.totals) if mover else (lambda: None),
        detail=settings.detail,
    )
    exporter = Exporter(settings, collection, publisher, mover)
    settle_garbage_collector()
    scrapers = api if settings.web_kubernetes_auth else None
    tls = webconfig.secure(exporter.app, settings.web_config_file, scrapers)
    runner = web.AppRunner(
        exporter.app,
        access_log=None,
        handle_signals=False,
        keepalive_timeout=settings.idle_timeout_seconds,
    )
    await runner.setup()
    site = webconfig.BoundedSite(
        runner, settings.host, settings.port, settings.max_connections, tls
    )
    await site.start()
    tasks.append(asyncio.create_task(exporter.run_cycles(), name="collection"))
    log.info(
        "serving metrics",
        extra={
            "listen": _addresses(runner),
            "node": settings.node_name,
            "host_root": settings.host_root,
            "interval_seconds": settings.interval_seconds,
        },
    )
    try:
        await stop.wait()
    finally:
        log.info("shutting down")
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await exporter.close()
        await runner.cleanup()
        if api is not None:
            await api.close()
        await close_sources(sources)
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)


def _log_failure(done: asyncio.Future) -> None:
    if not done.cancelled() and done.exception() is not None:
        log.error("memory move failed", exc_info=done.exception())


def _watches(api, node_name: str) -> tuple[list[asyncio.Task], Callable, Callable]:
    """The watches of this node's pods and DRA devices, when there is an API server:
    (their tasks, the pods' names now, the DRA devices now)."""
    if api is None:
        log.info(
            "no kubeconfig and not in a cluster: pod series carry only pod_uid and container_id"
        )
        return [], lambda: None, lambda: None
    watch = PodMetadataWatch(api, node_name)
    devices = DraWatch(api, node_name, watch.current)
    tasks = [
        asyncio.create_task(watch.run(), name="pod-metadata"),
        asyncio.create_task(devices.run(), name="dra"),
    ]
    return tasks, watch.current, devices.current


async def open_sources(
    settings: Settings, collectors: Mapping[str, Collector] = COLLECTORS
) -> dict[str, Source]:
    """The sources of the collectors turned on, each made by its source module's
    open_source(settings) (in a worker thread: opening NVML blocks); a collector with
    nothing to read here (no GPU driver, no kubelet socket) is left out."""
    sources: dict[str, Source] = {}
    for name in settings.collectors:
        module = importlib.import_module(collectors[name].source)
        source = await asyncio.to_thread(module.open_source, settings)
        if source is not None:
            sources[name] = source
    return sources


async def close_sources(sources: dict[str, Source]) -> None:
    """Let each source go (NVML shut down, the kubelet's channel closed)."""
    for source in sources.values():
        close = getattr(source, "close", None)
        if close is not None:
            await asyncio.to_thread(close)


def _addresses(runner: web.AppRunner) -> str:
    return " ".join(f"{a[0]}:{a[1]}" if isinstance(a, tuple) else str(a) for a in runner.addresses)
