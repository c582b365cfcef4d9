"""Sources: the only code that does I/O. Each returns plain records for the model.

Every failure to read or parse a file becomes an ``Issue`` with a reason, and the
source carries on with the rest: one bad file never hides the others.
"""

from __future__ import annotations

import os
import resource
import stat
import threading
from collections.abc import Callable
from typing import TypeVar

from numaguard.exporter.readers import ParseError
from numaguard.exporter.records import Issue

# Kernel files that matter here are a few KiB; anything far larger is not one of them.
MAX_FILE_BYTES = 1 << 20
_CHUNK = 65536

T = TypeVar("T")


class ReadFailure(Exception):
    def __init__(self, reason: str, path: str, detail: str = "") -> None:
        super().__init__(f"{reason}: {path} {detail}".strip())
        self.issue = Issue(reason, path, detail)


class _KeptFiles:
    """Kernel files kept open between cycles and read again with ``pread`` at offset 0:
    sysfs, procfs and cgroupfs make their content afresh at every read, and one
    ``pread`` (with an ``fstat``) is a fifth of the system calls of stat, open, fstat,
    read and close. A file replaced or removed since (no links left, or ENODEV/ESRCH
    from a cgroup or process that went) is opened afresh; one not read in a whole cycle
    is closed. At most ``limit`` are kept: half the soft limit of open files."""

    def __init__(self) -> None:
        self.lock = threading.Lock()  # held for the bookkeeping only, never for a read
        self.fds: dict[str, int] = {}
        self.used: dict[str, int] = {}  # path -> the cycle it was last read in
        self.busy: dict[int, int] = {}  # fd -> reads of it under way
        self.cycle = 0
        self.limit = self._limit()

    @staticmethod
    def _limit() -> int:
        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        return 65536 if soft == resource.RLIM_INFINITY else max(0, soft // 2)

    def take(self, path: str) -> int | None:
        with self.lock:
            fd = self.fds.get(path)
            if fd is not None:
                self.used[path] = self.cycle
                self.busy[fd] = self.busy.get(fd, 0) + 1
            return fd

    def give_back(self, fd: int) -> None:
        with self.lock:
            self.busy[fd] -= 1
            if not self.busy[fd]:
                del self.busy[fd]

    def forget(self, path: str, fd: int) -> None:
        with self.lock:
            if self.fds.get(path) == fd:
                del self.fds[path], self.used[path]
        os.close(fd)

    def keep(self, path: str, fd: int) -> bool:
        with self.lock:
            if path in self.fds or len(self.fds) >= self.limit:
                return False
            self.fds[path], self.used[path] = fd, self.cycle
            return True

    def sweep(self) -> None:
        """A new cycle: close what the last one did not read."""
        with self.lock:
            gone = [
                p for p, c in self.used.items() if c < self.cycle and self.fds[p] not in self.busy
            ]
            fds = [self.fds.pop(p) for p in gone]
            for p in gone:
                del self.used[p]
            self.cycle += 1
            self.limit = self._limit()
        for fd in fds:
            os.close(fd)


KEPT = _KeptFiles()


def read_text(path: str) -> str:
    """Read a small kernel file as ASCII text, mapping every failure to a reason. Only
    a regular file is read, opened so that nothing can make the open block; it is kept
    open for the next cycle's read."""
    fd = KEPT.take(path)
    if fd is not None:
        try:
            data = _read_again(fd, path)
        finally:
            KEPT.give_back(fd)
        if data is not None:
            return _ascii(data, path)
        KEPT.forget(path, fd)
    fd = _open(path)
    try:
        data = _read_all(fd, path)
    except ReadFailure:
        os.close(fd)
        raise
    if not KEPT.keep(path, fd):
        os.close(fd)
    return _ascii(data, path)


def _open(path: str) -> int:
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):
            raise ReadFailure("not_regular", path)
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
        if not stat.S_ISREG(os.fstat(fd).st_mode):  # swapped since the stat
            os.close(fd)
            raise ReadFailure("not_regular", path)
    except FileNotFoundError:
        raise ReadFailure("missing", path) from None
    except NotADirectoryError:
        raise ReadFailure("missing", path) from None
    except PermissionError:
        raise ReadFailure("permission", path) from None
    except OSError as err:
        raise ReadFailure("io", path, err.strerror or "") from None
    return fd


def _read_again(fd: int, path: str) -> bytes | None:
    """A kept file's content now; None when it is not the file at ``path`` any more."""
    try:
        if os.fstat(fd).st_nlink == 0:
            return None  # replaced or removed: what is at the path now is another file
        return _read_all(fd, path)
    except ReadFailure as failure:
        if failure.issue.reason == "io":
            return None  # the cgroup or process went (ENODEV, ESRCH): ask the path
        raise
    except OSError:
        return None


def _read_all(fd: int, path: str) -> bytes:
    try:
        chunks = []
        size = 0
        while True:
            chunk = os.pread(fd, _CHUNK, size)
            size += len(chunk)
            if size > MAX_FILE_BYTES:
                raise ReadFailure("oversized", path, f"over {MAX_FILE_BYTES} bytes")
            chunks.append(chunk)
            # sysfs, procfs and cgroupfs hand over all they have in one read, like
            # regular files: a short read is the end
            if len(chunk) < _CHUNK:
                break
    except OSError as err:
        raise ReadFailure("io", path, err.strerror or "") from None
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)


def _ascii(data: bytes, path: str) -> str:
    try:
        return data.decode("ascii")
    except UnicodeDecodeError:
        raise ReadFailure("parse", path, "not ASCII text") from None


def read_parsed(issues: list[Issue], path: str, reader: Callable[..., T], *args) -> T | None:
    """Read ``path`` and parse it with ``reader``; on any failure record it and return None."""
    try:
        return reader(read_text(path), *args)
    except ReadFailure as failure:
        issues.append(failure.issue)
    except ParseError as err:
        issues.append(Issue("parse", path, str(err)))
    return None


def subdirs(path: str, issues: list[Issue] | None = None, required: bool = False) -> list[str]:
    """Names of the directories in ``path`` (not following links); none if it cannot
    be listed, and then, given ``issues``, why: what could not be listed is unknown, not
    gone. A directory that does not exist is only an issue when ``required`` (many are
    optional, and a pod's vanishes when it ends)."""
    try:
        with os.scandir(path) as it:
            return [e.name for e in it if e.is_dir(follow_symlinks=False)]
    except FileNotFoundError:
        if issues is not None and required:
            issues.append(Issue("missing", path, "cannot list"))
    except PermissionError:
        if issues is not None:
            issues.append(Issue("permission", path, "cannot list"))
    except OSError as err:
        if issues is not None:
            issues.append(Issue("io", path, f"cannot list: {err.strerror or err}"))
    return []
