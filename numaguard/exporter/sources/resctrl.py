"""resctrl source: memory bandwidth (MBM) and LLC occupancy (CMT) per L3 cache domain,
per Sub-NUMA node, and per pod through one monitoring group per pod.

In ``manage`` mode the source owns the groups named ``numaguard-<pod uid>`` under
``mon_groups/``: it creates them (GPU pods first, then Guaranteed ones, while RMIDs
last), keeps their tasks in step with the pods' cgroups, reuses them after a restart
and removes those of pods that are gone. In ``read-only`` mode it only reads the groups
it finds. Writes go through ``ResctrlOps``, which a test's fake kernel implements too.

On AMD's assignable bandwidth counters (ABMC: ``mbm_assign_mode`` is ``[mbm_event]``)
a group's traffic is counted only while a hardware counter is assigned to each of its
MBM events, and there are far fewer counters than RMIDs. The source assigns them to its
groups by the same priority as RMIDs, a group without them is unmonitored (its traffic
reads ``Unassigned``, never 0), and a domain where any group goes uncounted has partial
node totals, which the reading says.
"""

from __future__ import annotations

import errno
import os
import re
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from numaguard.exporter.readers import ParseError, parse_single_int
from numaguard.exporter.readers.resctrl import (
    EVENTS,
    MonValues,
    Unreadable,
    parse_assign_mode,
    parse_assignments,
    parse_domain_counts,
    parse_mon_value,
    parse_tids,
    parse_word_list,
    sum_mon_values,
)
from numaguard.exporter.records import Issue, PodsReading, ResctrlReading
from numaguard.exporter.sources import read_parsed, subdirs
from numaguard.exporter.sources.resctrl_ops import ResctrlOps

if TYPE_CHECKING:
    from numaguard.exporter.settings import Settings

GROUP_PREFIX = "numaguard-"
MODES = ("auto", "manage", "read-only", "off")
_DOMAIN_DIR = re.compile(r"mon_L3_(\d+)")
_SUB_DIR = re.compile(r"mon_sub_L3_(\d+)")
# resctrl's own directories at its root; any other directory is a CTRL_MON group
_NOT_GROUPS = frozenset({"info", "mon_groups", "mon_data"})
MBM_EVENTS = ("mbm_total_bytes", "mbm_local_bytes")  # what ABMC counters count
# cycles between two full task syncs of a group whose pod's thread lists did not change
RESYNC_CYCLES = 10


@dataclass(frozen=True, slots=True)
class _Pod:
    uid: str
    priority: int  # lower goes first when RMIDs are short
    tasks_files: tuple[str, ...]


class ResctrlSource:
    def __init__(self, host_root: str, mode: str = "auto", ops: ResctrlOps | None = None) -> None:
        if mode not in MODES:
            raise ValueError(f"resctrl mode must be one of {MODES}, got {mode!r}")
        self.root = os.path.join(host_root, "sys/fs/resctrl")
        self.mode = mode
        self.ops = ops or ResctrlOps()
        self._unreadable: Counter[str] = Counter()
        self._exhaustions = 0
        self._cycle = 0
        # group -> (its pod's thread lists as last moved in, the cycle they were)
        self._synced: dict[str, tuple[tuple, int]] = {}

    def read(self, pods: PodsReading | None = None) -> ResctrlReading:
        issues: list[Issue] = []
        self._cycle += 1
        mode = self._mode()
        if mode in ("off", "unavailable"):
            return ResctrlReading(mode)
        features = read_parsed(issues, f"{self.root}/info/L3_MON/mon_features", parse_word_list)
        num_rmids = read_parsed(issues, f"{self.root}/info/L3_MON/num_rmids", parse_single_int)
        features = (features or frozenset()) & frozenset(EVENTS)
        # mounted with L3 monitoring, resctrl always has mon_data: without it, unknown
        domain_ids = _ids(self.root + "/mon_data", _DOMAIN_DIR, issues, required=True)

        groups, unmonitored, limbo = self._groups(mode, pods, issues)
        ctrl_groups = [f"{self.root}/{n}" for n in subdirs(self.root) if n not in _NOT_GROUPS]
        node_dirs = [self.root, *ctrl_groups]  # all tasks of the node, between them
        counters, partial = {}, frozenset()
        if self._counter_mode(issues) == "mbm_event":
            priority = {p.uid: p.priority for p in _pods(pods)} if pods is not None else {}
            counters, partial, uncounted = self._mbm_counters(
                mode, groups, priority, node_dirs, domain_ids, features, issues
            )
            unmonitored |= uncounted
        domains = {
            d: sum_mon_values(
                [self._values(f"{g}/mon_data/mon_L3_{d:02d}", features, issues) for g in node_dirs]
            )
            for d in domain_ids
        }
        snc: dict[int, MonValues] = {}
        for d in domain_ids:
            for node in _ids(f"{self.root}/mon_data/mon_L3_{d:02d}", _SUB_DIR, issues):
                snc[node] = sum_mon_values(
                    [
                        self._values(
                            f"{g}/mon_data/mon_L3_{d:02d}/mon_sub_L3_{node:02d}", features, issues
                        )
                        for g in node_dirs
                    ]
                )
        pod_groups = {
            uid: {
                d: self._values(f"{path}/mon_data/mon_L3_{d:02d}", features, issues)
                for d in domain_ids
            }
            for uid, path in groups.items()
        }
        used = 1 + len(ctrl_groups) + sum(len(subdirs(f"{g}/mon_groups")) for g in node_dirs)
        return ResctrlReading(
            mode=mode,
            num_rmids=num_rmids,
            rmids_used=used,
            domains=domains,
            snc_nodes=snc,
            pods=pod_groups,
            unmonitored=unmonitored,
            unreadable_total=dict(self._unreadable),
            rmid_exhaustions_total=self._exhaustions,
            rmids_in_limbo=limbo,
            mbm_counters=counters,
            partial_domains=partial,
            issues=issues,
        )

    def _mode(self) -> str:
        if self.mode == "off":
            return "off"
        if not os.path.isdir(f"{self.root}/info/L3_MON"):
            return "unavailable"  # not mounted, or no L3 monitoring on this CPU
        if self.mode == "auto":
            return "manage" if os.access(f"{self.root}/mon_groups", os.W_OK) else "read-only"
        return self.mode

    def _counter_mode(self, issues: list[Issue]) -> str:
        """``mbm_event`` on assignable counters; ``default`` where the file is absent
        (every RMID counts by itself)."""
        path = f"{self.root}/info/L3_MON/mbm_assign_mode"
        if not os.path.exists(path):
            return "default"
        return read_parsed(issues, path, parse_assign_mode) or "unknown"

    # -- groups ------------------------------------------------------------------

    def _groups(
        self, mode: str, pods: PodsReading | None, issues: list[Issue]
    ) -> tuple[dict[str, str], frozenset[str], bool]:
        """Pod uid -> group directory for the pods monitored this cycle, the uids of
        pods left unmonitored, and whether the kernel said its free RMIDs are in limbo.
        A pod is monitored only when all its threads are in its group: a group the
        kernel would not move them into reads a made-up zero."""
        base = f"{self.root}/mon_groups"
        ours = {
            name[len(GROUP_PREFIX) :]: f"{base}/{name}"
            for name in subdirs(base, issues)
            if name.startswith(GROUP_PREFIX)
        }
        wanted = _pods(pods) if pods is not None else None
        if mode == "read-only" or wanted is None:
            # Without this cycle's pods we cannot tell who is gone: touch nothing.
            known = set(ours) if wanted is None else {p.uid for p in wanted}
            monitored = {uid: path for uid, path in ours.items() if uid in known}
            return monitored, frozenset(known - set(monitored)), False
        by_uid = {p.uid: p for p in wanted}
        for uid in set(ours) - set(by_uid):  # the pod is gone
            self._write(issues, self.ops.rmdir, ours.pop(uid))
        ordered = sorted(wanted, key=lambda p: (p.priority, p.uid))
        exhausted = limbo = False
        for pod in ordered:
            if pod.uid in ours or exhausted:
                continue
            path = f"{base}/{GROUP_PREFIX}{pod.uid}"
            self._synced.pop(path, None)  # a new group holds no task yet
            try:
                self.ops.mkdir(path)
                ours[pod.uid] = path
            except FileExistsError:
                ours[pod.uid] = path
            except OSError as err:
                if err.errno not in (errno.ENOSPC, errno.EBUSY):
                    issues.append(Issue("write", path, err.strerror or ""))
                    continue
                # out of RMIDs: ENOSPC, or EBUSY when the freed ones still sit in limbo
                # (they come back by themselves, so nothing more is given up for them)
                self._exhaustions += 1
                exhausted = True
                if err.errno == errno.EBUSY:
                    limbo = True
                else:
                    self._preempt_for(pod, ordered, ours, issues)
        self._synced = {g: v for g, v in self._synced.items() if g in ours.values()}
        monitored = {
            uid: path
            for uid, path in ours.items()
            if self._assign_tasks(path, by_uid[uid].tasks_files, issues)
        }
        return monitored, frozenset(by_uid) - set(monitored), limbo

    def _preempt_for(self, pod: _Pod, ordered: list[_Pod], ours: dict[str, str], issues) -> None:
        """RMIDs ran out before ``pod`` got one: free the group of the least important
        monitored pod ranked below it. Its RMID may sit in limbo a while, so ``pod``
        gets it on a later cycle; one group a cycle, so nothing thrashes."""
        for victim in reversed(ordered):
            if victim.priority <= pod.priority:
                return
            if victim.uid in ours:
                if self._write(issues, self.ops.rmdir, ours[victim.uid]):
                    del ours[victim.uid]
                return

    def _assign_tasks(self, group: str, tasks_files: Iterable[str], issues: list[Issue]) -> bool:
        """Move the pod's threads that are not in its group yet (threads come and go;
        new ones mostly inherit the group from the thread that made them). While the
        pod's thread lists read as when they were last all moved, the group's own list
        is not read again, but for every RESYNC_CYCLES-th cycle: a thread someone else
        moved out comes back then. True when all the pod's threads are in the group."""
        lists: dict[str, str] = {}
        for tasks_file in tasks_files:
            problems: list[Issue] = []
            text = read_parsed(problems, tasks_file, str)  # as text: parsed if it changed
            # a container that just ended is no problem; an unreadable list is
            issues.extend(p for p in problems if p.reason != "missing")
            if text is not None:
                lists[tasks_file] = text
        seen = tuple(sorted(lists.items()))
        synced = self._synced.get(group)
        if synced and synced[0] == seen and self._cycle - synced[1] < RESYNC_CYCLES:
            return True
        inside = read_parsed(issues, f"{group}/tasks", parse_tids)
        if inside is None:
            return False
        for tasks_file, text in lists.items():
            try:
                tids = parse_tids(text)
            except ParseError as err:
                issues.append(Issue("parse", tasks_file, str(err)))
                return False
            for tid in sorted(tids - inside):
                try:
                    self.ops.move_task(f"{group}/tasks", tid)
                except ProcessLookupError:
                    pass  # the thread exited meanwhile
                except OSError as err:
                    issues.append(Issue("write", f"{group}/tasks", f"task {tid}: {err.strerror}"))
                    return False  # e.g. the pod's tasks sit in another control group
        self._synced[group] = (seen, self._cycle)
        return True

    def _write(self, issues: list[Issue], op, path: str) -> bool:
        try:
            op(path)
        except FileNotFoundError:
            return True  # gone already
        except OSError as err:
            issues.append(Issue("write", path, err.strerror or ""))
            return False
        return True

    # -- assignable counters (ABMC) ----------------------------------------------

    def _mbm_counters(
        self,
        mode: str,
        groups: dict[str, str],
        priority: dict[str, int],
        node_dirs: list[str],
        domain_ids: list[int],
        features: frozenset[str],
        issues: list[Issue],
    ) -> tuple[dict[int, tuple[int, int]], frozenset[int], frozenset[str]]:
        """Counters per domain (all, free), the domains with partial totals, and our
        groups left without a counter for some MBM event (their pods: unmonitored). In
        manage mode counters go to our groups by priority first."""
        info = f"{self.root}/info/L3_MON"
        total = read_parsed(issues, f"{info}/num_mbm_cntrs", parse_domain_counts) or {}
        free = read_parsed(issues, f"{info}/available_mbm_cntrs", parse_domain_counts)
        pairs = frozenset((e, d) for e in MBM_EVENTS if e in features for d in domain_ids)
        lacking = {uid: self._lacking(path, pairs, issues) for uid, path in groups.items()}
        if mode == "manage" and free is not None:
            self._assign(groups, priority, lacking, pairs, dict(free), issues)
            free = read_parsed(issues, f"{info}/available_mbm_cntrs", parse_domain_counts)
        partial = {d for lack in lacking.values() for _, d in lack}
        ours = set(groups.values())
        for g in node_dirs:  # the others' groups count in the node's totals too
            others = [f"{g}/mon_groups/{n}" for n in subdirs(f"{g}/mon_groups")]
            for path in [g, *(o for o in others if o not in ours)]:
                partial |= {d for _, d in self._lacking(path, pairs, issues)}
        counters = {d: (n, (free or {}).get(d, 0)) for d, n in total.items()}
        return counters, frozenset(partial), frozenset(u for u, lack in lacking.items() if lack)

    @staticmethod
    def _lacking(group: str, pairs: frozenset, issues: list[Issue]) -> set[tuple[str, int]]:
        """The (event, domain) pairs no counter of ``group`` counts (all, if unknown)."""
        held = read_parsed(issues, f"{group}/mbm_L3_assignments", parse_assignments)
        if held is None:
            return set(pairs)
        return {(e, d) for e, d in pairs if not held.get(e, {}).get(d, False)}

    def _assign(self, groups, priority, lacking, pairs, free: dict[int, int], issues) -> None:
        """Counters to the groups lacking them, most important first; when they run out,
        those of the least important group ranked below the one waiting are taken back
        (one group a cycle, so nothing thrashes)."""
        ranked = sorted(groups, key=lambda uid: (priority.get(uid, 1), uid))
        taken_back = False
        for uid in ranked:
            if not lacking[uid]:
                continue
            if not _fits(lacking[uid], free) and not taken_back:
                taken_back = True
                rank = priority.get(uid, 1)
                below = [v for v in ranked if priority.get(v, 1) > rank and lacking[v] != pairs]
                victim = below[-1] if below else None
                if victim is not None:
                    released = self._set(groups[victim], pairs - lacking[victim], "_", issues)
                    for _, d in released:
                        free[d] = free.get(d, 0) + 1
                    lacking[victim] |= released
            if not _fits(lacking[uid], free):
                return
            assigned = self._set(groups[uid], lacking[uid], "e", issues)
            for _, d in assigned:
                free[d] -= 1
            lacking[uid] -= assigned
            if lacking[uid]:
                return  # the kernel had fewer than it said

    def _set(self, group: str, pairs, state: str, issues: list[Issue]) -> set[tuple[str, int]]:
        """Assign (``e``) or release (``_``) the counters of ``pairs``, one event a write;
        the pairs done."""
        done: set[tuple[str, int]] = set()
        for event in sorted({e for e, _ in pairs}):
            domains = sorted(d for e, d in pairs if e == event)
            line = f"{event}:" + ";".join(f"{d}={state}" for d in domains)
            try:
                self.ops.assign(f"{group}/mbm_L3_assignments", line)
            except OSError as err:
                if err.errno != errno.ENOSPC:  # out of counters: a wait, not an error
                    issues.append(Issue("write", f"{group}/mbm_L3_assignments", err.strerror or ""))
                break
            done |= {(event, d) for d in domains}
        return done

    # -- values ------------------------------------------------------------------

    def _values(self, directory: str, features: frozenset[str], issues: list[Issue]) -> MonValues:
        values: MonValues = {}
        for event in features:
            value = read_parsed(issues, f"{directory}/{event}", parse_mon_value)
            if isinstance(value, Unreadable):
                self._unreadable[value.reason] += 1
            if value is not None:
                values[event] = value
        return values


def _pods(reading: PodsReading) -> list[_Pod]:
    tasks: dict[str, list[str]] = {}
    qos: dict[str, str] = {}
    for c in reading.containers:
        tasks.setdefault(c.pod_uid, []).append(c.tasks_file)
        qos[c.pod_uid] = c.qos_class
    # Pods holding GPUs come first once the exporter knows them; then Guaranteed pods.
    return [
        _Pod(uid, 0 if qos[uid] == "guaranteed" else 1, tuple(files))
        for uid, files in tasks.items()
    ]


def _fits(need: set[tuple[str, int]], free: dict[int, int]) -> bool:
    per_domain = Counter(d for _, d in need)
    return all(free.get(d, 0) >= n for d, n in per_domain.items())


def _ids(path: str, pattern: re.Pattern, issues: list[Issue], required: bool = False) -> list[int]:
    names = subdirs(path, issues, required)
    return sorted(int(m[1]) for n in names if (m := pattern.fullmatch(n)))


def open_source(settings: Settings) -> ResctrlSource:
    return ResctrlSource(settings.host_root, settings.resctrl_mode, settings.resctrl_ops)
