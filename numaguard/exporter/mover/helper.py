"""numaguard-memory-mover: the one process of the exporter's pod that holds
``CAP_SYS_PTRACE`` (deploy/components/memory-mover), so that the exporter, which serves
HTTP and parses what every pod and the kubelet write, holds none.

It listens on a Unix socket only the exporter's container shares, opens no other, reads
no configuration but its flags, and carries out one order at a time (wire.py). It takes
no order on trust: whatever the exporter says, it moves only the pages of processes that
a pod container's cgroup lists, whose /proc/<pid>/cgroup names that pod, to a node that
pod's ``cpuset.mems`` allows, at its own ``--rate``. So the most a subverted exporter can
make it do is move one pod's own pages between nodes the pod may use, slowly.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import signal
import socket
import socketserver
import sys
import threading
import time
from collections.abc import Callable

from numaguard import __version__
from numaguard.common import logs
from numaguard.common.help_text import DefaultsShown
from numaguard.exporter.mover import wire
from numaguard.exporter.mover.pages import Kernel, Moved, Pace, allowed_mems, move_pod_memory
from numaguard.exporter.readers.cgroup import container_of, pod_uid_of

log = logging.getLogger(__name__)
DEFAULT_SOCKET = "/run/numaguard/memory-mover.sock"
DEFAULT_RATE = 256 << 20  # bytes a second: the neighbours' memory bandwidth
CAP_SYS_PTRACE = 19  # <linux/capability.h>
# the helper's own refusals
NOT_THE_POD_S = "not_the_pod_s_cgroup"  # a folder outside the pod's containers' cgroups
MEMS = "mems"  # a node the pod's cpuset.mems does not allow
BAD_ORDER = "bad_order"
HELPER_ERROR = wire.HELPER_ERROR
ORDER_SECONDS = 5.0  # an order's line comes at once, or the connection is dropped


class Helper:
    """Checks and carries out orders; ``stop`` (from a signal) ends the move under way
    after its batch and refuses the rest."""

    def __init__(
        self,
        host_root: str,
        rate: float,
        kernel: Kernel | None = None,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], object] | None = None,
        order_seconds: float = ORDER_SECONDS,
    ) -> None:
        Pace(rate)  # a rate that is not positive is an error now, not at the first order
        self.rate, self.kernel, self.clock, self.sleep = rate, kernel, clock, sleep
        self.order_seconds = order_seconds
        self.proc = os.path.join(host_root, "proc")
        self.sys = os.path.join(host_root, "sys")
        self.cgroup_root = os.path.realpath(os.path.join(host_root, "sys", "fs", "cgroup"))
        self.stopping = threading.Event()
        self.current: threading.Event | None = None  # the stop of the move under way
        # when what earlier moves moved is paid for at the rate: an order cut short and
        # sent again waits for it, so no exporter outruns the rate by asking anew
        self.owed_until = 0.0

    def stop(self) -> None:
        self.stopping.set()
        if self.current is not None:
            self.current.set()

    def carry_out(self, order: wire.MoveOrder, stop: threading.Event) -> Moved:
        """What moved; Refused (and nothing moved) if the order is not one to obey.
        ``stop``, once set, ends the move after its batch (the exporter went)."""
        if self.stopping.is_set():
            raise wire.Refused(wire.NO_HELPER)  # ending: the next helper takes it
        cgroups = []
        for folder in order.cgroups:
            real, pod = self._container_folder(folder)
            if pod != order.pod_uid:
                raise wire.Refused(NOT_THE_POD_S)
            cgroups.append(real)
        if order.node not in allowed_mems(cgroups):
            raise wire.Refused(MEMS)
        if self.kernel is None:
            self.kernel = Kernel()
        self.current = stop
        if self.stopping.is_set():
            stop.set()
        pace = Pace(self.rate, self.clock, self.sleep or stop.wait, stop, self.owed_until)
        try:
            return move_pod_memory(
                cgroups,
                order.pod_uid,
                order.node,
                pace,
                self.kernel,
                self.proc,
                order.home,
                order.far_bytes,
                self.sys,
            )
        finally:
            self.current, self.owed_until = None, pace.owed_until()

    def _container_folder(self, folder: str) -> tuple[str, str | None]:
        """The folder, links and '..' resolved, and the pod whose container's cgroup it
        is, if it is one: under the host's cgroup mount, named as the kubelet names a
        container's folder in its pod's (the walk takes what is below it too)."""
        real = os.path.realpath(folder)
        if not real.startswith(self.cgroup_root + os.sep):
            return real, None
        *_, pod, container = ["", *real.split(os.sep)]
        return real, (pod_uid_of(pod) if container_of(container) else None)

    def serve(self, path: str) -> socketserver.UnixStreamServer:
        """A server on ``path`` (a stale socket there is replaced; only this user may
        connect), not yet serving: call its serve_forever."""
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        mask = os.umask(0o177)
        try:
            handler = type("Handler", (_Handler,), {"timeout": self.order_seconds})
            server = socketserver.UnixStreamServer(path, handler)
        finally:
            os.umask(mask)
        server.helper = self  # type: ignore[attr-defined]
        return server


class _Handler(socketserver.StreamRequestHandler):
    timeout = ORDER_SECONDS  # for the order's line (the helper's); then none: moves take minutes

    def handle(self) -> None:
        try:
            line = self.rfile.readline(wire.LINE_BYTES + 1)
        except TimeoutError:
            line = b""
        self.connection.settimeout(None)
        # the exporter half-closes (or goes) to stop the move: heard between any two calls
        stop = threading.Event()
        watcher = threading.Thread(target=_until_closed, args=(self.connection, stop))
        watcher.start()
        try:
            self._carry_out(line, stop)
        except Exception:  # a defect: said, and the helper serves the next order
            log.exception("memory move order failed")
            self._say(wire.encode_refused(HELPER_ERROR))
        finally:
            with contextlib.suppress(OSError):  # ends the watcher's wait
                self.connection.shutdown(socket.SHUT_RDWR)
            watcher.join()

    def _carry_out(self, line: bytes, stop: threading.Event) -> None:
        helper: Helper = self.server.helper  # type: ignore[attr-defined]
        try:
            order = wire.decode_order(line)
        except wire.BadOrder as err:
            log.warning("memory move order refused", extra={"reason": BAD_ORDER, "error": str(err)})
            self._say(wire.encode_refused(BAD_ORDER))
            return
        said = {
            "namespace": order.namespace,
            "pod": order.pod,
            "pod_uid": order.pod_uid,
            "request": order.request,
            "numa_node": order.node,
        }
        try:
            moved = helper.carry_out(order, stop)
        except wire.Refused as refused:
            log.info("memory move refused", extra={**said, "reason": refused.reason})
            self._say(wire.encode_refused(refused.reason))
            return
        log.info(
            "memory moved",
            extra={
                **said,
                "bytes": moved.bytes,
                "pages": moved.pages,
                "seconds": round(moved.seconds, 3),
                "stopped": moved.stopped,
                "failures": dict(moved.failures),
            },
        )
        self._say(wire.encode_moved(moved))

    def _say(self, answer: bytes) -> None:
        with contextlib.suppress(OSError):  # the exporter went: its next one asks again
            self.wfile.write(answer + b"\n")


def _until_closed(connection, stop: threading.Event) -> None:
    with contextlib.suppress(OSError):
        connection.recv(1)
    stop.set()


def has_cap_sys_ptrace(status: str) -> bool:
    """Whether /proc/self/status's effective set holds CAP_SYS_PTRACE."""
    for line in status.splitlines():
        if line.startswith("CapEff:"):
            return bool(int(line.split()[1], 16) >> CAP_SYS_PTRACE & 1)
    return False


def _positive_int(value: str) -> int:
    number = int(value)
    if number <= 0:
        raise argparse.ArgumentTypeError(f"must be positive, got {value}")
    return number


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="numaguard-memory-mover",
        formatter_class=DefaultsShown,
        description="Move pods' memory home with move_pages(2), as numaguard-exporter "
        "--memory-mover orders over a Unix socket: the one process of the exporter's pod "
        "that holds CAP_SYS_PTRACE (deploy/components/memory-mover).",
    )
    p.add_argument("--version", action="version", version=__version__)
    p.add_argument(
        "--socket",
        default=DEFAULT_SOCKET,
        metavar="PATH",
        help="where to listen: a folder only the exporter's container shares "
        "(the exporter's --memory-mover.socket)",
    )
    p.add_argument(
        "--host-root",
        default="/",
        metavar="DIR",
        help="where the host's /proc and /sys are mounted, as the exporter's --host-root",
    )
    p.add_argument(
        "--rate",
        type=_positive_int,
        default=DEFAULT_RATE,
        metavar="BYTES",
        help="bytes moved a second at most, so that the node's memory bandwidth is not "
        "taken from its neighbours (this helper's, whatever the exporter asks)",
    )
    logs.add_arguments(p)
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    logs.setup(args.log_format, args.log_level)
    with open("/proc/self/status") as f:
        if not has_cap_sys_ptrace(f.read()):
            print(
                "numaguard-memory-mover: needs CAP_SYS_PTRACE to move other processes' pages "
                "(securityContext.capabilities.add: [SYS_PTRACE])",
                file=sys.stderr,
            )
            return 2
    helper = Helper(args.host_root, args.rate)
    try:
        server = helper.serve(args.socket)
    except OSError as err:
        print(f"numaguard-memory-mover: cannot listen on {args.socket}: {err}", file=sys.stderr)
        return 1
    # the signals go to this thread alone, taken with sigwait: nothing runs in a handler
    ending = {signal.SIGTERM, signal.SIGINT}
    signal.pthread_sigmask(signal.SIG_BLOCK, ending)
    serving = threading.Thread(target=server.serve_forever, args=(0.5,))
    serving.start()
    log.info("memory mover listening", extra={"socket": args.socket, "rate": args.rate})
    signal.sigwait(ending)
    helper.stop()
    server.shutdown()  # once the move under way has answered
    serving.join()
    server.server_close()
    os.unlink(args.socket)
    log.info("memory mover stopped")
    return 0
