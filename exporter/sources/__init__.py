"""Sources: the only code that does I/O. Each returns plain records for the model.

Every failure to read or parse a file becomes an ``Issue`` with a reason, and the
source carries on with the rest: one bad file never hides the others.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from exporter.readers import ParseError

# Kernel files that matter here are a few KiB; anything far larger is not one of them.
MAX_FILE_BYTES = 1 << 20
_CHUNK = 65536

T = TypeVar("T")

# Why a file could not be used; the collection adds "timeout" and "internal".
# not_regular: a FIFO, device or socket where a kernel file should be (sysfs, procfs and
# cgroupfs files are all regular): never opened for reading, it could block or not end
READ_FAILURES = ("missing", "permission", "io", "parse", "oversized", "not_regular")


@dataclass(frozen=True, slots=True)
class Issue:
    reason: str  # one of READ_FAILURES, "timeout" or "internal"
    path: str
    detail: str = ""


class ReadFailure(Exception):
    def __init__(self, reason: str, path: str, detail: str = "") -> None:
        super().__init__(f"{reason}: {path} {detail}".strip())
        self.issue = Issue(reason, path, detail)


def read_text(path: str) -> str:
    """Read a small kernel file as ASCII text, mapping every failure to a reason. Only
    a regular file is read, opened so that nothing can make the open block."""
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):
            raise ReadFailure("not_regular", path)
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY)
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
    try:
        chunks = []
        size = 0
        while True:
            chunk = os.read(fd, _CHUNK)
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
    finally:
        os.close(fd)
    try:
        return b"".join(chunks).decode("ascii")
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
