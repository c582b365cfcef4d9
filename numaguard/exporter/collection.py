"""One collection cycle: run the sources concurrently (each in a worker thread, or on the
event loop for one that only waits on a socket, bounded by a timeout), build the
NodeSnapshot, render the exposition once. Scrapes are served from those rendered bytes
and never wait on a source."""

from __future__ import annotations

import asyncio
import gzip
import inspect
import logging
import platform
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from numaguard.common.process import ProcessCollector
from numaguard.contract import catalogue as c
from numaguard.exporter import __version__, sources
from numaguard.exporter.collectors import COLLECTORS, METADATA, Collector, pod_placement
from numaguard.exporter.exposition import Families, Family, render
from numaguard.exporter.model import NodeSnapshot, build_snapshot
from numaguard.exporter.model.thresholds import Thresholds
from numaguard.exporter.readers.dra import DraView
from numaguard.exporter.records import Issue, PodMeta

if TYPE_CHECKING:
    from numaguard.exporter.mover.orders import MoveTotals

log = logging.getLogger(__name__)

POD_PLACEMENT = pod_placement.COLLECTOR.name  # its reading holds the cardinality guard

# Distinct (collector, reason, path) problems we log once each; beyond this, just count.
_MAX_LOGGED_PROBLEMS = 10_000


class Source(Protocol):
    def read(self, *inputs: Any) -> Any: ...  # or a coroutine function


@dataclass
class Health:
    success: bool = False
    duration_seconds: float = 0.0
    # every reason its source can fail for starts at 0, so rate() sees the first error
    errors: Counter[str] = field(default_factory=Counter)
    last_success: float | None = None

    @classmethod
    def of(cls, collector: Collector) -> Health:
        return cls(errors=Counter(dict.fromkeys((*collector.errors, "timeout", "internal"), 0)))


class Exposition:
    """One cycle's rendered bytes. gzip is made in the cycle (in its worker thread) for
    the formats scrapers asked gzipped in the cycle before; any other is made for the
    first request that wants it, in a worker thread too (compressing megabytes on the
    event loop would hold every other scrape up), and shared with those that wait."""

    def __init__(self, text: bytes, openmetrics: bytes, gzip_now: Iterable[bool] = ()) -> None:
        self.text = text
        self.openmetrics = openmetrics
        self.asked: set[bool] = set()  # the formats asked gzipped, for the next cycle
        self._gzipped: dict[bool, bytes] = {om: self._compress(om) for om in gzip_now}
        self._compressing: dict[bool, asyncio.Future[bytes]] = {}

    def _compress(self, openmetrics: bool) -> bytes:
        return gzip.compress(self.openmetrics if openmetrics else self.text, 1)

    async def body(self, openmetrics: bool, gzipped: bool) -> bytes:
        if not gzipped:
            return self.openmetrics if openmetrics else self.text
        self.asked.add(openmetrics)
        if openmetrics in self._gzipped:
            return self._gzipped[openmetrics]
        if openmetrics not in self._compressing:
            compressing = asyncio.to_thread(self._compress, openmetrics)
            self._compressing[openmetrics] = asyncio.ensure_future(compressing)
        return await asyncio.shield(self._compressing[openmetrics])


class Collection:
    """Owns the cycle: sources -> snapshot -> rendered exposition."""

    def __init__(
        self,
        node_name: str,
        sources: Mapping[str, Source],
        metadata: Callable[[], Mapping[str, PodMeta] | None] = lambda: None,
        dra: Callable[[], DraView | None] = lambda: None,
        thresholds: Thresholds = Thresholds(),
        timeout_seconds: float = 10.0,
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
        nrt_current: Callable[[], bool | None] = lambda: None,
        moves: Callable[[], MoveTotals | None] = lambda: None,
        collectors: Mapping[str, Collector] = COLLECTORS,
        detail: bool = False,
    ) -> None:
        self.node_name = node_name
        self.detail = detail  # render the catalogue's detail families too (--detail)
        self.sources = dict(sources)  # by collector name: the collectors turned on
        self.collectors = dict(collectors)  # every one registered (those off say so)
        self.metadata = metadata
        self.dra = dra
        self.thresholds = thresholds
        self.timeout = timeout_seconds
        self.clock = clock  # snapshot timestamps, the base of every rate
        self.monotonic = monotonic  # how long a read has been running
        self.nrt_current = nrt_current  # whether the published topology is current (--nrt)
        self.moves = moves  # what --memory-mover did
        self.health = {name: Health.of(self.collectors[name]) for name in self.sources}
        self.snapshot: NodeSnapshot | None = None
        self.exposition: Exposition | None = None
        # a source's read still running, and since when (a thread cannot be cancelled)
        self._in_flight: dict[str, tuple[asyncio.Future, float]] = {}
        self._logged: set[tuple[str, str, str]] = set()
        self.limited = False  # this cycle's pods were more than the cgroup source may read
        self._process = ProcessCollector(registry=None)
        self._limit_logged = False

    async def run_once(self) -> NodeSnapshot:
        sources.KEPT.sweep()  # the files the last cycle did not read are closed
        metadata = self.metadata()  # the cycle's one view of the pods' names
        given: dict[str, Any] = {METADATA: metadata}
        readings: dict[str, Any] = {}
        todo = {name: self.collectors[name] for name in self.sources}
        while todo:  # in waves: a collector whose source reads another's goes after it
            ready = [n for n, c in todo.items() if not any(r in todo for r in c.reads)]
            if not ready:
                raise ValueError(f"collectors that read each other: {sorted(todo)}")
            got = await asyncio.gather(
                *(self._read(n, *(given.get(r) for r in todo[n].reads)) for n in ready)
            )
            for name, reading in zip(ready, got, strict=True):
                del todo[name]
                readings[name] = given[name] = reading
            if POD_PLACEMENT in ready:
                self._guard(readings[POD_PLACEMENT])
                if self.limited:  # over the guard the pods are unknown, not gone
                    given[POD_PLACEMENT] = None
        # Off the event loop too: tens of milliseconds of CPU would stall scrapes.
        self.snapshot, self.exposition = await asyncio.to_thread(
            self._snapshot_and_render, readings, metadata, self.dra()
        )
        return self.snapshot

    def _snapshot_and_render(
        self, readings: dict[str, Any], metadata, dra: DraView | None
    ) -> tuple[NodeSnapshot, Exposition]:
        snap = build_snapshot(
            self.node_name,
            self.clock(),
            previous=self.snapshot,
            thresholds=self.thresholds,
            metadata=metadata,
            dra=dra,
            readings=readings,
            detail=self.detail,
            **{
                self.collectors[name].reading: reading
                for name, reading in readings.items()
                if self.collectors[name].reading
            },
        )
        return snap, self.render(snap)

    async def _read(self, name: str, *inputs):
        """Run one source off the event loop (a coroutine one on it); None when it failed
        or timed out."""
        health = self.health[name]
        started = time.monotonic()
        future, _ = self._in_flight.get(name, (None, 0.0))
        if future is not None and future.done():
            # a read that outlived its cycle finished since: its answer is stale
            if not future.cancelled():
                future.exception()  # retrieved, so asyncio does not warn about it
            future = None
        if future is None:
            # A thread cannot be cancelled: a read that timed out keeps running, and
            # we wait for it instead of piling up another.
            read = self.sources[name].read
            if inspect.iscoroutinefunction(read):  # it waits on a socket: on the loop
                future = asyncio.ensure_future(read(*inputs))
            else:
                future = asyncio.ensure_future(asyncio.to_thread(read, *inputs))
            self._in_flight[name] = (future, self.monotonic())
        reading = None
        try:
            reading = await asyncio.wait_for(asyncio.shield(future), self.timeout)
        except TimeoutError:
            self._problem(name, Issue("timeout", "", f"no answer within {self.timeout:g}s"))
        except Exception as err:  # a bug must not stop the other collectors
            self._in_flight.pop(name, None)
            log.exception("collector %s failed", name)
            self._problem(name, Issue("internal", "", repr(err)))
        else:
            self._in_flight.pop(name, None)
        health.duration_seconds = time.monotonic() - started
        issues = reading.issues if reading is not None else []
        for issue in issues:
            self._problem(name, issue)
        health.success = reading is not None and not issues
        if health.success:
            health.last_success = time.time()
        return reading

    def _guard(self, pods) -> None:
        """Note whether the pod reading stopped at the cardinality guard; say so once."""
        self.limited = bool(pods is not None and pods.over_limit)
        if self.limited and not self._limit_logged:
            self._limit_logged = True
            log.warning(
                "%d pods on this node, more than --max-pods: pod series left out",
                pods.over_limit,
                extra={"pods": pods.over_limit},
            )

    def stuck(self, longer_than: float) -> list[str]:
        """The collectors whose read has been running for more than ``longer_than``
        seconds: stuck in the kernel, most likely, where only a restart helps."""
        now = self.monotonic()
        return sorted(
            name
            for name, (future, since) in self._in_flight.items()
            if not future.done() and now - since > longer_than
        )

    def in_flight(self) -> list[asyncio.Future]:
        return [future for future, _ in self._in_flight.values()]

    def _problem(self, collector: str, issue: Issue) -> None:
        self.health[collector].errors[issue.reason] += 1
        key = (collector, issue.reason, issue.path)
        if key in self._logged or len(self._logged) >= _MAX_LOGGED_PROBLEMS:
            return
        self._logged.add(key)
        log.warning(
            "collector %s: %s %s %s",
            collector,
            issue.reason,
            issue.path,
            issue.detail,
            extra={"collector": collector, "reason": issue.reason, "path": issue.path},
        )

    def render(self, snap: NodeSnapshot) -> Exposition:
        families = [
            *(f for collector in self.collectors.values() for f in collector.families(snap)),
            *self._self_families(snap),
            *self._process_families(),
        ]
        asked = self.exposition.asked if self.exposition is not None else ()
        return Exposition(*render(families), gzip_now=set(asked))

    def _process_families(self) -> list[Family]:
        """The process's own CPU, memory, descriptors and start time, as every
        Prometheus client reports them."""
        families = Families("process", self.node_name)
        for metric in self._process.collect():
            for sample in metric.samples:
                if sample.name in families:
                    families[sample.name].add(sample.value)
        return list(families.values())

    def _self_families(self, snap: NodeSnapshot) -> list[Family]:
        node = self.node_name
        build = Family(c.BUILD_INFO, node)
        build.add(1, __version__, platform.python_version())
        synced = Family(c.POD_METADATA_SYNCED, node)
        synced.add(int(snap.pod_metadata_synced))
        limited = Family(c.SERIES_LIMITED, node)
        limited.add(int(self.limited))
        nrt = Family(c.NRT_CURRENT, node)
        if (current := self.nrt_current()) is not None:
            nrt.add(int(current))
        success, duration, errors, last = (
            Family(m, node)
            for m in (
                c.COLLECTOR_SUCCESS,
                c.COLLECTOR_DURATION,
                c.COLLECTOR_ERRORS,
                c.COLLECTOR_LAST_SUCCESS,
            )
        )
        for name, h in self.health.items():
            success.add(int(h.success), name)
            duration.add(h.duration_seconds, name)
            for reason in sorted(h.errors):
                errors.add(h.errors[reason], name, reason)
            if h.last_success is not None:
                last.add(h.last_success, name)
        return [build, synced, limited, nrt, success, duration, errors, last, *self._moves()]

    def _moves(self) -> list[Family]:
        """What --memory-mover did, when it is on."""
        totals = self.moves()
        if totals is None:
            return []
        node = self.node_name
        results, refusals, pages, size, failures, seconds = (
            Family(m, node)
            for m in (
                c.MEMORY_MOVES,
                c.MEMORY_MOVE_REFUSALS,
                c.MEMORY_MOVED_PAGES,
                c.MEMORY_MOVED_BYTES,
                c.MEMORY_MOVE_FAILURES,
                c.MEMORY_MOVE_DURATION,
            )
        )
        for result in ("moved", "partial", "failed", "refused"):
            results.add(totals.results[result], result)
        for reason, count in sorted(totals.refusals.items()):
            refusals.add(count, reason)
        for name, count in sorted(totals.failures.items()):
            failures.add(count, name)
        pages.add(totals.pages)
        size.add(totals.bytes)
        seconds.add(totals.seconds)
        return [results, refusals, pages, size, failures, seconds]
