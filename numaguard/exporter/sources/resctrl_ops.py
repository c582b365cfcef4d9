"""The writes a managed resctrl tree needs (--resctrl-mode=manage): the one place the
exporter writes the kernel's files; a fake host's stand in for them in tests."""

from __future__ import annotations

import os


class ResctrlOps:
    """The writes a managed resctrl tree needs, done on the real kernel files."""

    def mkdir(self, path: str) -> None:
        os.mkdir(path)

    def rmdir(self, path: str) -> None:
        os.rmdir(path)

    def move_task(self, tasks_file: str, tid: int) -> None:
        # One id per write: older kernels take no lists.
        _write_file(tasks_file, str(tid))

    def assign(self, assignments_file: str, line: str) -> None:
        """One ``event:domain=state;...`` line to a group's ``mbm_L3_assignments``."""
        _write_file(assignments_file, line)


def _write_file(path: str, text: str) -> None:
    fd = os.open(path, os.O_WRONLY)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)
