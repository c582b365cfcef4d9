"""A fake resctrl filesystem that behaves like the kernel for the parts numaguard uses.

It writes ``info/``, ``mon_data/`` and ``mon_groups/`` under a fake host root, and it is
the ``ResctrlOps`` the exporter writes through: ``mkdir`` of a monitoring group gets an
RMID and a populated ``mon_data`` (or ENOSPC when none is left), ``rmdir`` frees it and
returns its tasks to the default group, and writing a task id moves that task (ESRCH
for a task that does not exist). Traffic is added per pod or to the rest of the node
and lands where the kernel would count it: in the group holding the pod's tasks, and
always in the default group's totals, which sum every group of the node.

With ``abmc_counters`` it is an AMD CPU with assignable counters (``mbm_event`` mode):
each L3 domain has that many counters, one counts one MBM event of one group; ``mkdir``
assigns them while some are free (as ``mbm_assign_on_mkdir`` does), writes to a group's
``mbm_L3_assignments`` assign (``e``) and release (``_``) them, ENOSPC when none is free,
and an event without a counter reads ``Unassigned`` and is missing from the totals.
"""

from __future__ import annotations

import errno
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from numaguard.exporter.sources.resctrl import GROUP_PREFIX
from numaguard.exporter.sources.resctrl_ops import ResctrlOps
from numaguard.simulator.fakes.host import FakeHost

EVENTS = ("llc_occupancy", "mbm_total_bytes", "mbm_local_bytes")
MBM_EVENTS = ("mbm_total_bytes", "mbm_local_bytes")


@dataclass
class _Counters:
    total: int = 0
    local: int = 0
    occupancy: int = 0


@dataclass
class _Group:
    tasks: set[int] = field(default_factory=set)
    # (L3 domain, Sub-NUMA node or None) -> counters of this group's own tasks
    counters: dict[tuple[int, int | None], _Counters] = field(default_factory=dict)


class FakeResctrl(ResctrlOps):
    def __init__(
        self,
        root: str | os.PathLike,
        host: FakeHost,
        num_rmids: int = 256,
        events: tuple[str, ...] = EVENTS,
        snc: dict[int, list[int]] | None = None,
        limbo: bool = False,
        abmc_counters: int | None = None,
    ) -> None:
        """``snc``: L3 domain -> its NUMA nodes, when Sub-NUMA Clustering is on.
        ``limbo``: a removed group's RMID is not free until ``release_limbo()``, as the
        kernel keeps it while the cache still holds lines it counted."""
        self.base = Path(root) / "sys/fs/resctrl"
        self.host = host
        self.num_rmids = num_rmids
        self.events = events
        self.snc = snc or {}
        self.domains = list(range(len(host.l3_caches())))
        self.default = _Group()
        self.groups: dict[str, _Group] = {}  # monitoring groups under mon_groups/
        # (group name or None for the default group, domain, node, event) -> word
        self.unreadable: dict[tuple[str | None, int, int | None, str], str] = {}
        self.limbo_on = limbo
        self.in_limbo = 0  # RMIDs freed but not yet reusable
        self.last_cmd_status = "ok"
        self.abmc_counters = abmc_counters
        # ABMC: group name (None: the default group) -> the (event, domain) it counts
        self.assigned: dict[str | None, set[tuple[str, int]]] = {None: set()}
        if abmc_counters is not None:
            self._assign_all(None)

    # -- the kernel's side of the exporter's writes --------------------------------

    def mkdir(self, path: str) -> None:
        name = self._group_name(path)
        if name in self.groups:
            raise FileExistsError(errno.EEXIST, "File exists", path)
        if 1 + len(self.groups) + self.in_limbo >= self.num_rmids:
            self._status("Out of RMIDs")
            if self.in_limbo:  # the kernel's alloc_rmid(): some will come back
                raise OSError(errno.EBUSY, "Device or resource busy", path)
            raise OSError(errno.ENOSPC, "No space left on device", path)
        self.groups[name] = _Group()
        self._status("ok")
        if self.abmc_counters is not None:
            self.assigned[name] = set()
            self._assign_all(name)
            self._write_counters()
        self._write_group(name)

    def rmdir(self, path: str) -> None:
        name = self._group_name(path)
        if name not in self.groups:
            raise FileNotFoundError(errno.ENOENT, "No such file or directory", path)
        self.default.tasks |= self.groups.pop(name).tasks
        self.assigned.pop(name, None)
        self.in_limbo += int(self.limbo_on)
        shutil.rmtree(self.base / "mon_groups" / name, ignore_errors=True)
        self._write_default_tasks()
        # its counts leave the default group's sums with it
        self._write_mon_data(self.base / "mon_data", None, self._node_sums())
        if self.abmc_counters is not None:
            self._write_counters()

    def move_task(self, tasks_file: str, tid: int) -> None:
        name = self._group_name(os.path.dirname(tasks_file))
        if name not in self.groups:
            raise FileNotFoundError(errno.ENOENT, "No such file or directory", tasks_file)
        if tid not in self.live_tids():
            raise ProcessLookupError(errno.ESRCH, "No such process", tasks_file)
        for other, group in self.groups.items():
            if tid in group.tasks and other != name:
                group.tasks.discard(tid)
                self._write_group(other)
        self.default.tasks.discard(tid)
        self.groups[name].tasks.add(tid)
        _put(self.base / "mon_groups" / name / "tasks", _lines(self.groups[name].tasks))

    def assign(self, assignments_file: str, line: str) -> None:
        """``event:domain=state;...`` to a group's ``mbm_L3_assignments`` (``*``: every
        domain): ``e`` takes a free counter of the domain, ``_`` gives it back."""
        name = self._group_name(os.path.dirname(assignments_file))
        if self.abmc_counters is None or name not in self.groups:
            raise FileNotFoundError(errno.ENOENT, "No such file or directory", assignments_file)
        event, _, states = line.strip().partition(":")
        changes = [part.partition("=") for part in states.split(";")]
        if event not in MBM_EVENTS or event not in self.events or not changes:
            self._status(f"Invalid event {event}")
            raise OSError(errno.EINVAL, "Invalid argument", assignments_file)
        held = self.assigned[name]
        for domain, sep, state in changes:
            domains = self.domains if domain == "*" else [int(domain)] if domain.isdigit() else []
            if not sep or state not in ("e", "_") or not set(domains) <= set(self.domains):
                self._status("Invalid domain or state")
                raise OSError(errno.EINVAL, "Invalid argument", assignments_file)
            for d in domains:
                if state == "_":
                    held.discard((event, d))
                elif (event, d) not in held:
                    if self.free_counters(d) == 0:
                        self._status("Out of MBM assignable counters")
                        raise OSError(errno.ENOSPC, "No space left on device", assignments_file)
                    held.add((event, d))
        self._status("ok")
        self._write_counters()
        self._write_group(name)
        self._write_mon_data(self.base / "mon_data", None, self._node_sums())

    def free_counters(self, domain: int) -> int:
        used = sum(d == domain for pairs in self.assigned.values() for _, d in pairs)
        return (self.abmc_counters or 0) - used

    def _assign_all(self, name: str | None) -> None:
        for event in MBM_EVENTS:
            for d in self.domains:
                if event in self.events and self.free_counters(d) > 0:
                    self.assigned[name].add((event, d))

    # -- what tests do to the node ---------------------------------------------------

    def release_limbo(self) -> None:
        """The cache lines the freed RMIDs counted are gone: they can be reused."""
        self.in_limbo = 0

    def add_traffic(
        self,
        pod_uid: str | None,
        domain: int,
        total: int,
        local: int,
        node: int | None = None,
    ) -> None:
        """Memory traffic of a pod (None: the rest of the node) from one L3 domain; under
        SNC, ``node`` says which Sub-NUMA node of the domain it came from."""
        c = self._counters(self._group_of(pod_uid), domain, node)
        c.total += total
        c.local += local

    def set_occupancy(self, pod_uid: str | None, domain: int, size: int, node: int | None = None):
        self._counters(self._group_of(pod_uid), domain, node).occupancy = size

    def remove_behind_the_exporters_back(self, pod_uid: str) -> None:
        self.rmdir(str(self.base / "mon_groups" / f"{GROUP_PREFIX}{pod_uid}"))

    def live_tids(self) -> set[int]:
        return {t for p in self.host.pods for c in p.containers for t in self.host.tids(p, c)}

    def group_names(self) -> list[str]:
        return sorted(self.groups)

    # -- files -----------------------------------------------------------------------

    def write(self) -> FakeResctrl:
        """Write the whole tree: after tests changed counters or words."""
        info = self.base / "info"
        _put(info / "L3_MON/num_rmids", str(self.num_rmids))
        _put(info / "L3_MON/mon_features", "\n".join(self.events))
        _put(info / "L3_MON/max_threshold_occupancy", "1048576")
        if self.abmc_counters is not None:
            _put(info / "L3_MON/mbm_assign_mode", "[mbm_event]\ndefault")
            _put(info / "L3_MON/mbm_assign_on_mkdir", "1")
            self._write_counters()
        self._status(self.last_cmd_status)
        self._write_default_tasks()
        self._write_mon_data(self.base / "mon_data", None, self._node_sums())
        mon_groups = self.base / "mon_groups"
        mon_groups.mkdir(parents=True, exist_ok=True)
        for entry in mon_groups.iterdir():
            if entry.name not in self.groups:
                shutil.rmtree(entry)
        for name in self.groups:
            self._write_group(name)
        return self

    def _write_group(self, name: str) -> None:
        group = self.groups[name]
        d = self.base / "mon_groups" / name
        _put(d / "tasks", _lines(group.tasks))
        _put(d / "cpus_list", "")
        self._write_mon_data(d / "mon_data", name, group.counters)
        if self.abmc_counters is not None:
            _put(d / "mbm_L3_assignments", self._assignments(name))

    def _write_counters(self) -> None:
        info = self.base / "info/L3_MON"
        _put(info / "num_mbm_cntrs", ";".join(f"{d}={self.abmc_counters}" for d in self.domains))
        free = ";".join(f"{d}={self.free_counters(d)}" for d in self.domains)
        _put(info / "available_mbm_cntrs", free)
        _put(self.base / "mbm_L3_assignments", self._assignments(None))

    def _assignments(self, name: str | None) -> str:
        held = self.assigned[name]
        return "\n".join(
            f"{e}:" + ";".join(f"{d}={'e' if (e, d) in held else '_'}" for d in self.domains)
            for e in MBM_EVENTS
            if e in self.events
        )

    def _write_default_tasks(self) -> None:
        grouped = set().union(*(g.tasks for g in self.groups.values()))
        _put(self.base / "tasks", _lines((self.live_tids() | self.default.tasks) - grouped))

    def _status(self, text: str) -> None:
        self.last_cmd_status = text
        _put(self.base / "info/last_cmd_status", text)

    def _write_mon_data(self, d: Path, group: str | None, counters) -> None:
        for domain in self.domains:
            top = d / f"mon_L3_{domain:02d}"
            nodes = self.snc.get(domain)
            if nodes:
                parts = {n: counters.get((domain, n), _Counters()) for n in nodes}
                summed = _Counters(
                    sum(c.total for c in parts.values()),
                    sum(c.local for c in parts.values()),
                    sum(c.occupancy for c in parts.values()),
                )
                for n, c in parts.items():
                    self._write_events(top / f"mon_sub_L3_{n:02d}", group, domain, n, c)
            else:
                summed = counters.get((domain, None), _Counters())
            self._write_events(top, group, domain, None, summed)

    def _write_events(self, d: Path, group, domain, node, c: _Counters) -> None:
        values = {
            "llc_occupancy": c.occupancy,
            "mbm_total_bytes": c.total,
            "mbm_local_bytes": c.local,
        }
        for event in self.events:
            word = self.unreadable.get((group, domain, node, event))
            # the default group's files sum its groups: Unassigned only if none counts it
            counting = [group] if group is not None else list(self.assigned)
            if word is None and not self._counted(counting, event, domain):
                word = "Unassigned"
            _put(d / event, word if word is not None else str(values[event]))

    def _counted(self, groups: list[str | None], event: str, domain: int) -> bool:
        """Whether a counter counts the event in the domain for any of ``groups``
        (None: the default group); always, but under ABMC."""
        if self.abmc_counters is None or event not in MBM_EVENTS:
            return True
        return any((event, domain) in self.assigned.get(n, ()) for n in groups)

    def _node_sums(self) -> dict[tuple[int, int | None], _Counters]:
        """The default group counts every task of the node, its groups' included (under
        ABMC: those events of them that a counter counts)."""
        sums: dict[tuple[int, int | None], _Counters] = {}
        for name, group in ((None, self.default), *self.groups.items()):
            for key, c in group.counters.items():
                s = sums.setdefault(key, _Counters())
                domain = key[0]
                s.total += c.total if self._counted([name], "mbm_total_bytes", domain) else 0
                s.local += c.local if self._counted([name], "mbm_local_bytes", domain) else 0
                s.occupancy += c.occupancy
        return sums

    def _group_of(self, pod_uid: str | None) -> _Group:
        """Where a pod's traffic is counted: its group once its tasks are in it."""
        if pod_uid is None:
            return self.default
        group = self.groups.get(f"{GROUP_PREFIX}{pod_uid}")
        pod = next((p for p in self.host.pods if p.uid == pod_uid), None)
        tids = {t for c in pod.containers for t in self.host.tids(pod, c)} if pod else set()
        if group is not None and group.tasks & tids:
            return group
        return self.default

    def _counters(self, group: _Group, domain: int, node: int | None) -> _Counters:
        if domain in self.snc and node is None:
            node = self.snc[domain][0]
        return group.counters.setdefault((domain, node), _Counters())

    def _group_name(self, path: str) -> str:
        p = Path(path)
        if p.parent != self.base / "mon_groups":
            raise PermissionError(errno.EPERM, "Operation not permitted", path)
        return p.name


def _lines(ids) -> str:
    return "\n".join(map(str, sorted(ids)))


def _put(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text + "\n" if text and not text.endswith("\n") else text)
