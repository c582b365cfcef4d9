"""How the GPU source calls NVML: one GPU's calls through a Caller (a lost GPU aborts
the read, NOT_SUPPORTED is a capability, a function an older driver lacks is learnt once,
any other error is recorded and the value left unknown), and the GPUs read in turn in
worker threads under a deadline, so that a hung GPU holds up no other."""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import ALL_COMPLETED, Future, wait
from types import ModuleType

from numaguard.exporter.records import Issue

log = logging.getLogger(__name__)


class Lost(Exception):
    pass


# A GPU read this long is slow: the GPUs after it go on in another thread.
HANDOFF_SECONDS = 0.25


def read_in_turn(read: Callable, todo: list[int], futures: dict[int, Future], deadline: float):
    """Fill each GPU's future with ``read(index)``, the GPUs one after another in a
    daemon thread (a call stuck in the driver must not keep the process from exiting).
    When no read has finished for HANDOFF_SECONDS, the GPUs not yet begun go on in one
    more thread, until the deadline: a hung GPU holds up no other, and the GPUs are not
    read in parallel threads that would pass the GIL to and fro at every NVML call (that
    cost 40-50 % more CPU for 8 GPUs)."""
    waiting = deque(todo)

    def run() -> None:
        while True:
            try:
                index = waiting.popleft()
            except IndexError:
                return
            try:
                futures[index].set_result(read(index))
            except BaseException as err:  # handed to whoever waits on the future
                futures[index].set_exception(err)

    pending = {futures[i] for i in todo}
    start = True
    while waiting and time.monotonic() < deadline:
        if start:
            threading.Thread(target=run, name="nvml", daemon=True).start()
        # woken when all are read, else after HANDOFF_SECONDS: not at every GPU
        done, pending = wait(pending, HANDOFF_SECONDS, ALL_COMPLETED)
        start = not done  # none read meanwhile: every thread is on a slow GPU
    while waiting:  # past the deadline: not begun, so asked again next cycle
        with contextlib.suppress(IndexError):
            futures[waiting.popleft()].cancel()


class Caller:
    """Calls NVML for one GPU: a lost GPU aborts the read; NOT_SUPPORTED is a capability,
    not an error; any other NVML error is recorded and the value left unknown."""

    def __init__(self, nvml: ModuleType, where: str, issues: list[Issue], missing: set[str]):
        self.nvml = nvml
        self.where = where
        self.issues = issues
        self.missing = missing  # the source's: what the driver's library does not export

    def lacks(self, fn: Callable) -> bool:
        return fn.__name__ in self.missing

    def learn_missing(self, name: str) -> None:
        if name not in self.missing:
            self.missing.add(name)
            log.info(
                "NVML of this driver has no %s: what it gives is left unknown",
                name,
                extra={"function": name},
            )

    def optional(self, fn: Callable, *args, empty_ok: bool = False):
        n = self.nvml
        if fn.__name__ in self.missing:
            return None
        try:
            return fn(*args)
        except n.NVMLError_GpuIsLost:
            raise Lost from None
        except n.NVMLError_NotSupported:
            return None
        except (n.NVMLError_FunctionNotFound, n.NVMLLibraryMismatchError):
            self.learn_missing(fn.__name__)  # an older driver: a capability, not an error
            return None
        except n.NVMLError_NotFound:
            if not empty_ok:
                self.issues.append(Issue("nvml", f"{self.where}/{fn.__name__}", "Not Found"))
            return None
        except n.NVMLError as err:
            self.issues.append(Issue("nvml", f"{self.where}/{fn.__name__}", str(err)))
            return None
