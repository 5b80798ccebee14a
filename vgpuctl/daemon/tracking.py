"""Which processes belong to a job: pure functions over a process table, the
one /proc reader that builds that table, and `Tracker`, which applies a scan
to the live jobs (their processes; the jobs whose processes are all gone end).

A process is named by (pid, start time), the start time being field 22 of
/proc/<pid>/stat in clock ticks since boot -- the same value the hook writes
into its slot -- so a reused pid is never taken for the original. A job's
processes are the pids it was seen with (its root pid, slot pids, earlier
descendants) that are still alive with the same start time, plus all their
descendants. Remembering every descendant once seen keeps a grandchild whose
parent exited (and which was reparented to init) in the job.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Container, Mapping
from dataclasses import dataclass

from vgpuctl.core.config import Config
from vgpuctl.core.job import STARTING, JobRecord
from vgpuctl.core.sizes import format_size
from vgpuctl.daemon.jobs import JobTable, LiveJob
from vgpuctl.daemon.trust import Trust
from vgpuctl.errors import PermissionDenied
from vgpuctl.system.notice import NOTICE_SIGNAL
from vgpuctl.system.procfs import read_stat, start_time

log = logging.getLogger("vgpuctl.daemon")


@dataclass(frozen=True)
class ProcInfo:
    ppid: int
    start: int      # clock ticks since boot


ProcTable = Mapping[int, ProcInfo]


def poke_launcher(rec: JobRecord) -> None:
    """Tell the job's `vgpuctl run`, if it still runs, that its job's state
    changed (vgpuctl.system.notice): it asks, and tells its terminal."""
    pid, start = rec.launcher_pid, rec.launcher_start
    if pid is None or start is None or start_time(pid) != start:
        return
    try:
        os.kill(pid, NOTICE_SIGNAL)
    except OSError:
        pass


def proc_uid(pid: int) -> int | None:
    """The (effective) uid a process runs as, None when it is gone."""
    try:
        return os.stat(f"/proc/{pid}").st_uid
    except OSError:
        return None


def scan() -> dict[int, ProcInfo]:
    """Every live process of the machine (zombies excluded)."""
    out: dict[int, ProcInfo] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        st = read_stat(int(name))
        if st is not None and st[2] not in ("Z", "X"):
            out[int(name)] = ProcInfo(st[0], st[1])
    return out


def children_map(table: ProcTable) -> dict[int, list[int]]:
    out: dict[int, list[int]] = {}
    for pid, info in table.items():
        out.setdefault(info.ppid, []).append(pid)
    return out


def alive(pid: int, start: int | None, table: ProcTable) -> bool:
    info = table.get(pid)
    return info is not None and start is not None and info.start == start


def job_processes(seeds: Mapping[int, int], table: ProcTable,
                  children: Mapping[int, list[int]] | None = None,
                  exclude: Container[int] = ()) -> dict[int, int]:
    """{pid: start} of the job: the seeds still alive (same start time) and
    all their descendants, except the descendants in exclude (the roots of
    other jobs, started from inside this one) and their subtrees."""
    if children is None:
        children = children_map(table)
    skip = exclude
    out = {p: s for p, s in seeds.items() if alive(p, s, table)}
    stack = list(out)
    while stack:
        p = stack.pop()
        for c in children.get(p, ()):
            if c not in out and c not in skip:
                out[c] = table[c].start
                stack.append(c)
    return out


class Tracker:
    """Keeps each live job's processes up to date from /proc scans, and ends
    the jobs that have none left.

    A job's processes are its seeds -- the pids it was seen with, its
    command's root, the process slots its processes claimed in its region
    (when they run as the job's user), and the children of its `vgpuctl
    run` (a subreaper: what the command double-forked away is re-parented to
    it) -- alive with the same start time, and all their descendants; never
    another job's root and what is below it, and never the daemon itself
    (a daemon a launcher started must not be that job's)."""

    def __init__(self, table: JobTable, trust: Trust, config: Callable[[], Config]) -> None:
        self._table = table
        self._trust = trust
        self._config = config
        self._me = os.getpid()
        # (pid, start) -> the uid it runs as: a slot's process is checked once,
        # not at every tick the violation watch asks for the slots.
        self._uids: dict[tuple[int, int], int | None] = {}

    def slot_seeds(self, job: LiveJob) -> dict[int, int]:
        """Slot pids of the job's region that run as the job's user (the
        usage segment is the job's to write: never trust it for anyone else's
        processes)."""
        out = {}
        for pid, start in self._trust.slot_pids(job):
            if job.rec.uid == 0:
                out[pid] = start
                continue
            key = (pid, start)
            if key not in self._uids:
                self._uids[key] = proc_uid(pid) if start_time(pid) == start else None
            if self._uids[key] == job.rec.uid:
                out[pid] = start
        return out

    def _roots(self) -> set[int]:
        return {j.rec.root_pid for j in self._table if j.rec.root_pid is not None}

    def processes(self, job: LiveJob, table: ProcTable,
                  children: Mapping[int, list[int]] | None = None,
                  roots: set[int] | None = None) -> dict[int, int]:
        """{pid: start} of the job's live processes."""
        if children is None:
            children = children_map(table)
        rec = job.rec
        seeds = dict(rec.pids)
        if rec.root_pid is not None and rec.root_start is not None:
            seeds.setdefault(rec.root_pid, rec.root_start)
        seeds.update(self.slot_seeds(job))
        if rec.launcher_pid is not None and alive(rec.launcher_pid, rec.launcher_start, table):
            for c in children.get(rec.launcher_pid, ()):
                seeds.setdefault(c, table[c].start)
        seeds.pop(self._me, None)
        exclude = (self._roots() if roots is None else roots) | {self._me}
        return job_processes(seeds, table, children, exclude=exclude)

    def launcher_alive(self, job: LiveJob, table: ProcTable) -> bool:
        rec = job.rec
        return rec.launcher_pid is not None and alive(rec.launcher_pid, rec.launcher_start,
                                                      table)

    def track(self, table: ProcTable, now: float) -> None:
        """Apply one /proc scan: update each job's processes; end the jobs
        that have none left and no launcher waiting to start them."""
        children = children_map(table)
        roots = self._roots()
        timeout = self._config().start_timeout_s
        self._uids = {k: v for k, v in self._uids.items() if alive(k[0], k[1], table)}
        for job in self._table:
            rec = job.rec
            if rec.state == STARTING and now - rec.created > timeout:
                # Admitted but never started (a launcher that holds the
                # reservation and does nothing): give the memory back.
                log.warning("job %s (%s) of %s did not start within %d s: its reservation "
                            "of %s is released", rec.id, rec.name, rec.user, timeout,
                            format_size(rec.mem_limit))
                self._table.end(job)
                continue
            live = self.processes(job, table, children, roots)
            self._table.processes_seen(job, live)
            if not live and not self.launcher_alive(job, table) and rec.slurm_job is None:
                self._table.end(job)     # a Slurm job ends at its Epilog, not here

    def adopt(self, table: ProcTable) -> None:
        """At start, after the table loaded the jobs a previous daemon left:
        keep those whose processes (or launcher) still run, end the others."""
        children = children_map(table)
        for job in self._table:
            rec = job.rec
            live = self.processes(job, table, children)
            launcher = self.launcher_alive(job, table)
            if job.region is None or (not live and not launcher and rec.slurm_job is None):
                if job.region is None and (live or launcher):
                    log.warning("job %s: processes %s run without a region: not adopted",
                                rec.id, sorted(live))
                self._table.end(job)
                continue
            self._table.processes_seen(job, live)
            log.info("job %s (%s) of %s re-adopted: pids %s", rec.id, rec.name, rec.user,
                     sorted(live) or [rec.launcher_pid])
        self._table.remove_stray_regions()

    def any_alive(self, job: LiveJob) -> bool:
        """Whether a process the job was seen with (or one in its slots) still runs."""
        seeds = dict(job.rec.pids)
        seeds.update(self.slot_seeds(job))
        return any(start_time(p) == s for p, s in seeds.items())

    def add_pid(self, job: LiveJob, pid: int) -> None:
        """Track pid (and what it starts) as the job's, if it runs as the
        job's user."""
        start = start_time(pid)
        if start is None:
            return
        if job.rec.uid != 0 and proc_uid(pid) != job.rec.uid:
            raise PermissionDenied(f"process {pid} does not run as {job.rec.user}")
        self._table.process_added(job, pid, start)
