"""What the exporter and the memory mover's helper say to each other: one order a
connection, a JSON line each way, over a Unix socket in a folder only the two containers
of the exporter's pod share.

The exporter decides (which pod asked, whether it has a home, which node has room); the
helper, which alone holds ``CAP_SYS_PTRACE``, checks the order against the node's own
files and moves. Either end may close: the exporter half-closes its side to stop a move,
and the helper answers with what moved until then.
"""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass

from numaguard.exporter.mover.pages import SHUTDOWN, Moved

LINE_BYTES = 64 << 10  # an order or an answer; a pod has a few dozen cgroups at most
MAX_CGROUPS = 256
# how long an exporter that is ending waits for the helper's answer once it asked it to
# stop (the helper stops after the batch under way: well under a second)
STOP_GRACE_SECONDS = 10.0
# why an order was not carried out, besides the helper's own refusals
NO_HELPER = "no_helper"  # its socket is not there or refuses: asked again next cycle
HELPER_LOST = "helper_lost"  # it ended mid-move without an answer
HELPER_ERROR = "helper_error"  # it failed on the order, or answered nonsense: a defect
CONNECT_SECONDS = 5.0  # a helper whose backlog is full for this long is not there


class BadOrder(ValueError):
    """A line that is not a well-formed order (or answer)."""


class Refused(Exception):
    """The helper did not carry the order out, and why."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True)
class MoveOrder:
    """One pod's far pages to move to ``node``: those of the processes in ``cgroups``
    (its containers' folders, as both ends see the host's /sys) on nodes outside
    ``home``, asking about as many addresses as ``far_bytes`` warrant. ``namespace``,
    ``pod`` and ``request`` are for the helper's log alone."""

    pod_uid: str
    cgroups: tuple[str, ...]
    node: int
    home: frozenset[int] = frozenset()
    far_bytes: int = 0
    namespace: str = ""
    pod: str = ""
    request: str = ""


def encode_order(order: MoveOrder) -> bytes:
    fields = {**asdict(order), "cgroups": list(order.cgroups), "home": sorted(order.home)}
    return json.dumps(fields).encode() + b"\n"


def decode_order(line: bytes) -> MoveOrder:
    """The order a line says; BadOrder for anything else (a type, a size, a field)."""
    if len(line) > LINE_BYTES or not line.endswith(b"\n"):
        raise BadOrder(f"an order is one line of at most {LINE_BYTES} bytes")
    try:
        fields = json.loads(line)
    except (ValueError, RecursionError) as err:
        raise BadOrder(f"not JSON: {err}") from None
    names = {f for f in MoveOrder.__dataclass_fields__}
    if not isinstance(fields, dict) or set(fields) != names:
        raise BadOrder(f"an order has exactly the fields {sorted(names)}")
    strings = ("pod_uid", "namespace", "pod", "request")
    cgroups, home = fields["cgroups"], fields["home"]
    if (
        not all(isinstance(fields[f], str) for f in strings)
        or not all(_count(fields[f]) for f in ("node", "far_bytes"))
        or not isinstance(cgroups, list)
        or not 0 < len(cgroups) <= MAX_CGROUPS
        or not all(isinstance(c, str) for c in cgroups)
        or not isinstance(home, list)
        or not all(_count(n) for n in home)
    ):
        raise BadOrder("an order's fields are of the wrong type or out of range")
    return MoveOrder(**{**fields, "cgroups": tuple(cgroups), "home": frozenset(home)})


def encode_moved(moved: Moved) -> bytes:
    return json.dumps({"moved": {**asdict(moved), "failures": dict(moved.failures)}}).encode()


def encode_refused(reason: str) -> bytes:
    return json.dumps({"refused": reason}).encode()


def decode_answer(line: bytes) -> Moved:
    """What the helper did; Refused if it did nothing."""
    try:
        answer = json.loads(line)
        if "refused" in answer:
            raise Refused(str(answer["refused"]))
        moved = answer["moved"]
        return Moved(**{**moved, "failures": Counter(moved["failures"])})
    except (ValueError, TypeError, KeyError, AttributeError, RecursionError) as err:
        raise BadOrder(f"not an answer: {err}") from None


def _count(value: object) -> bool:
    """A non-negative integer a C long holds (JSON's true is not one)."""
    return type(value) is int and 0 <= value < 1 << 63


class HelperClient:
    """The exporter's end: ``move`` hands an order to the helper listening on ``path``
    and waits for its answer, as long as the move takes; ``stop`` (from another thread)
    asks it to stop after its batch, and ``move`` returns what moved by then."""

    def __init__(
        self,
        path: str,
        clock: Callable[[], float] = time.monotonic,
        grace: float = STOP_GRACE_SECONDS,
    ) -> None:
        self.path, self.clock, self.grace = path, clock, grace
        self._lock = threading.Lock()
        self._connection: socket.socket | None = None
        self._stopped_at: float | None = None

    def stop(self) -> None:
        with self._lock:
            if self._stopped_at is None:
                self._stopped_at = self.clock()
            if self._connection is not None:
                _half_close(self._connection)

    def move(self, order: MoveOrder) -> Moved:
        """What the helper moved; Refused when it moved nothing, NO_HELPER included."""
        connection = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            connection.settimeout(CONNECT_SECONDS)
            try:
                connection.connect(self.path)
            except OSError:
                raise Refused(NO_HELPER) from None
            with self._lock:
                if self._stopped_at is not None:
                    return Moved(stopped=SHUTDOWN)
                self._connection = connection
            try:
                connection.sendall(encode_order(order))
            except OSError:  # stopped meanwhile, or the helper went
                raise Refused(NO_HELPER) from None
            try:
                return decode_answer(self._answer(connection))
            except BadOrder:
                raise Refused(HELPER_ERROR) from None
        finally:
            with self._lock:
                self._connection = None
            connection.close()

    def _answer(self, connection: socket.socket) -> bytes:
        """The helper's line, however long the move takes; once stopped, no longer than
        ``grace`` more (a helper that does not answer is left, not waited for)."""
        connection.settimeout(1.0)
        received = b""
        while not received.endswith(b"\n"):
            try:
                chunk = connection.recv(LINE_BYTES)
            except TimeoutError:
                stopped = self._stopped_at
                if stopped is not None and self.clock() - stopped > self.grace:
                    return encode_moved(Moved(stopped=SHUTDOWN)) + b"\n"
                continue
            except OSError:
                chunk = b""
            if not chunk or len(received) > LINE_BYTES:
                return encode_moved(Moved(stopped=HELPER_LOST)) + b"\n"
            received += chunk
        return received


def _half_close(connection: socket.socket) -> None:
    with contextlib.suppress(OSError):  # not connected yet, or already closed
        connection.shutdown(socket.SHUT_WR)
