"""Moving a pod's memory, in place, to the NUMA node of its CPUs: the node's half of the
remedy for remote memory (docs/remediator.md). The exporter's part: which of its node's
pods asked (the annotation below), whether each has a home to move to and which of its
CPUs' nodes has room, once per request, and what was done, for the exposition and the
log. The move itself is the memory mover's helper's (mover/helper.py), the one process
that holds the capability it takes; this one holds none.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace

from numaguard.exporter.mover.pages import SHUTDOWN, allowed_mems
from numaguard.exporter.mover.wire import (
    HELPER_LOST,
    NO_HELPER,
    HelperClient,
    MoveOrder,
    Refused,
)
from numaguard.exporter.records import PodMeta

# A request that is a Unix time (the remediator's) this much older than when this process
# first sees it is not carried out: after a restart the exporter would otherwise move
# again every pod that ever asked, unrecorded by the remediator.
REQUEST_TTL_SECONDS = 600.0
# Refusals for what may pass (the kubelet's socket restarting, a file read mid-change, a
# neighbour's memory freed, the helper restarting): asked again every cycle until the
# request expires, where handling it for good would leave the pod to an eviction, the
# restart a move avoids
TRANSIENT = frozenset({"kubelet", "unknown_memory", "unknown_mems", "no_free_memory", NO_HELPER})
log = logging.getLogger(__name__)


def destination(
    cpu_nodes: Iterable[int],
    mems: Iterable[int],
    free_bytes: dict[int, int],
    needed_bytes: int,
    pinned: Iterable[int] = (),
) -> tuple[int | None, str]:
    """The NUMA node to move a pod's far memory to, or None and the reason: among its CPUs'
    nodes that its ``cpuset.mems`` allows (and the Memory Manager's ``pinned`` nodes, when
    it pinned the pod's memory), the one with most free memory, if that covers
    ``needed_bytes``."""
    candidates = set(cpu_nodes) & set(mems)
    if not candidates:
        return None, "mems"
    pinned = set(pinned)
    if pinned:
        candidates &= pinned
        if not candidates:
            return None, "memory_manager"
    node = max(sorted(candidates), key=lambda n: free_bytes.get(n, 0))
    if free_bytes.get(node, 0) < needed_bytes:
        return None, "no_free_memory"
    return node, ""


# -- requests: which pods to move, from the exporter's snapshot --------------------------


@dataclass(frozen=True)
class Order:
    """A pod's request to move its memory home, as this node's snapshot found it."""

    uid: str
    namespace: str
    name: str
    request: str
    cgroups: tuple[str, ...] = ()  # its containers' cgroup folders
    cpu_nodes: frozenset[int] = frozenset()  # the NUMA nodes of its exclusive CPUs
    far_bytes: int = 0  # its memory on other nodes
    pinned: frozenset[int] = frozenset()  # where the Memory Manager put its memory
    refused: str = ""  # why it is not carried out, from the snapshot alone


def orders(snapshot, metadata: Mapping[str, PodMeta], handled: Mapping[str, str]) -> list[Order]:
    """The pods of ``snapshot`` whose request (their PodMeta's ``move_memory``) is not the
    one ``handled`` already: each with what a move needs, or why there is none. Only a
    pod with exclusive CPUs and known memory has a home to move to; the Memory Manager's
    pinning must be known (the kubelet answered)."""
    placement = snapshot.readings.get("pod_placement")
    kubelet = snapshot.readings.get("pod_resources")
    out = []
    for pod in snapshot.pods:
        meta = metadata.get(pod.uid)
        if meta is None or not meta.move_memory or handled.get(pod.uid) == meta.move_memory:
            continue
        order = Order(pod.uid, pod.namespace, pod.name, meta.move_memory)
        cpu_nodes = frozenset(n for n, count in (pod.exclusive_cpus_by_node or {}).items() if count)
        if not cpu_nodes:
            out.append(replace(order, refused="not_exclusive"))
            continue
        if pod.memory_by_node is None or placement is None:
            out.append(replace(order, refused="unknown_memory"))
            continue
        if kubelet is None or kubelet.pods is None:
            out.append(replace(order, refused="kubelet"))
            continue
        granted = next(
            (p for p in kubelet.pods if (p.namespace, p.name) == (pod.namespace, pod.name)), None
        )
        pinned = frozenset(
            n
            for c in (granted.containers if granted else ())
            for m in c.memory
            if m.kind == "memory"
            for n in m.numa_nodes
        )
        cgroups = tuple(
            sorted(
                os.path.dirname(c.tasks_file)
                for c in placement.containers
                if c.pod_uid == pod.uid and c.tasks_file
            )
        )
        far = sum(b for n, b in pod.memory_by_node.items() if n not in cpu_nodes)
        out.append(
            replace(order, cgroups=cgroups, cpu_nodes=cpu_nodes, far_bytes=far, pinned=pinned)
        )
    return out


@dataclass
class MoveTotals:
    """Every request this process carried out or refused, for the exposition."""

    results: Counter[str] = field(default_factory=Counter)  # moved | partial | failed | refused
    refusals: Counter[str] = field(default_factory=Counter)  # by reason
    failures: Counter[str] = field(default_factory=Counter)  # pages (or calls) by errno name
    pages: int = 0
    bytes: int = 0
    seconds: float = 0.0


class MemoryMover:
    """The exporter's ``--memory-mover``: carries out the requests its node's pods carry,
    one at a time (the rate is the node's, the helper's), each once, through ``helper``.
    Runs in a worker thread."""

    def __init__(self, helper: HelperClient, wall: Callable[[], float] = time.time) -> None:
        self.helper, self.wall = helper, wall
        self.stopping = threading.Event()  # set at shutdown: no new move is asked for
        self.totals = MoveTotals()
        self.handled: dict[str, str] = {}  # pod uid -> the request last carried out
        # (pod uid, request) -> when first seen, and the transient refusal last said
        self.seen: dict[tuple[str, str], tuple[float, str]] = {}

    def stop(self) -> None:
        """Stop the move under way (from another thread): it ends after its batch."""
        self.stopping.set()
        self.helper.stop()

    def carry_out(self, snapshot, metadata: Mapping[str, PodMeta]) -> list[dict]:
        """Every new request of ``snapshot``'s pods: what was decided and done, each as
        the JSON log's fields."""
        done, asked = [], orders(snapshot, metadata, self.handled)
        current = {(o.uid, o.request) for o in asked}  # of pods gone or asking anew: forgotten
        self.seen = {k: v for k, v in self.seen.items() if k in current}
        for order in asked:
            if self.stopping.is_set():
                break
            key, now = (order.uid, order.request), self.wall()
            first, said = self.seen.setdefault(key, (now, ""))
            made = int(order.request) if order.request.isdigit() else first
            if now - min(made, first) > REQUEST_TTL_SECONDS:
                order = replace(order, refused="expired")
            decision = self._one(order, snapshot)
            reason = decision["reason"]
            # a move the helper cut short (it restarted) is carried on, as a refusal that
            # may pass is asked again; one this exporter stopped, by the next exporter
            cut = reason in (SHUTDOWN, HELPER_LOST) and not self.stopping.is_set()
            if reason in TRANSIENT or cut:
                if reason == said and not cut:
                    continue  # asked again next cycle; said once
                self.seen[key] = (first, reason)
            else:
                self.handled[order.uid] = order.request
                self.seen.pop(key, None)
            self.totals.results[decision["result"]] += 1
            if decision["result"] == "refused":
                self.totals.refusals[decision["reason"]] += 1
            log.info("memory move", extra=decision)
            done.append(decision)
        return done

    def _one(self, order: Order, snapshot) -> dict:
        said = {
            "namespace": order.namespace,
            "pod": order.name,
            "pod_uid": order.uid,
            "request": order.request,
            "far_bytes": order.far_bytes,
        }
        reason = order.refused or ("" if order.far_bytes else "nothing_remote")
        node = None
        if not reason:
            mems = allowed_mems(order.cgroups)
            free = {
                n.id: n.meminfo.free_bytes for n in snapshot.numa_nodes if n.meminfo is not None
            }
            node, reason = (
                destination(order.cpu_nodes, mems, free, order.far_bytes, order.pinned)
                if mems
                else (None, "unknown_mems")
            )
        if node is None:
            return {**said, "result": "refused", "reason": reason}
        try:
            moved = self.helper.move(
                MoveOrder(
                    order.uid,
                    order.cgroups,
                    node,
                    order.cpu_nodes,
                    order.far_bytes,
                    order.namespace,
                    order.name,
                    order.request,
                )
            )
        except Refused as refused:
            return {**said, "result": "refused", "reason": refused.reason}
        t = self.totals
        t.pages, t.bytes, t.seconds = (
            t.pages + moved.pages,
            t.bytes + moved.bytes,
            t.seconds + moved.seconds,
        )
        t.failures.update(moved.failures)
        if moved.stopped and moved.stopped not in (SHUTDOWN, HELPER_LOST):
            result = "failed"
        else:  # one cut short is carried on
            result = "partial" if moved.failures or moved.stopped else "moved"
        return {
            **said,
            "result": result,
            "reason": moved.stopped,
            "numa_node": node,
            "bytes": moved.bytes,
            "pages": moved.pages,
            "seconds": round(moved.seconds, 3),
            "failures": dict(moved.failures),
        }
