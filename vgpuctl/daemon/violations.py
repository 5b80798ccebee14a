"""The daemon's violation watch: every tick, in a worker thread, NVML's
per-process memory and utilization on every managed GPU against the jobs the
daemon knows (the rules are vgpuctl.core.violations').

A process NVML lists belongs to a job when it is one of the job's tracked
pids, or its `vgpuctl run` (which holds the job's environment); when it
sits in the cgroup of a Slurm job the daemon serves (Slurm's task/cgroup
puts every process of a job under `.../job_<id>/`, which the job cannot
leave); or when one of its ancestors is a tracked pid or the
job's launcher (`vgpuctl run` is a subreaper, so a double-forked child is
re-parented to it and stays below it). /proc is read only for pids no job
knows, so a tick with no stranger on the GPUs reads no /proc file.

With ``on_violation = "kill"`` the process a violation names is sent
SIGKILL, checked first to be the same process (pid and start time) NVML
listed, and never pid 1 or the daemon itself. Only pids NVML lists on the
daemon's GPUs are ever candidates.
"""

from __future__ import annotations

import logging
import os
import re
import signal
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from vgpuctl.core.violations import KINDS, Checker, JobLimits, Violation
from vgpuctl.daemon import tracking
from vgpuctl.daemon.jobs import MAX_VIOLATIONS, JobTable
from vgpuctl.system.nvml import GpuStats

log = logging.getLogger("vgpuctl.daemon")

# How far up the process tree a stranger's ancestry is followed.
MAX_DEPTH = 64
# Slurm's job cgroup (task/cgroup, v1 and v2): .../job_<id>/...
_SLURM_CGROUP = re.compile(r"/job_(\d+)(?:/|$)")


@dataclass(frozen=True)
class Known:
    """What the event loop hands the watch each tick (a copy: the worker
    never touches the supervisor's live state)."""
    limits: list[JobLimits]
    pids: Mapping[int, str]                  # tracked pid -> job id
    starts: Mapping[int, int]                # tracked pid -> its start time
    launchers: Mapping[int, tuple[int, str]]  # launcher pid -> (start, job id)
    slurm: Mapping[str, str] = field(default_factory=dict)  # Slurm job id -> job id


@dataclass
class Result:
    stats: list[GpuStats]
    found: list[Violation]
    new: list[Violation]
    killed: list[Violation] = field(default_factory=list)


class Watch:
    def __init__(self, snapshot: Callable[[], list[GpuStats]],
                 busy: Callable[[str], Mapping[int, float]] | None = None) -> None:
        self._snapshot = snapshot
        self._busy = busy
        self._checker = Checker()
        self._strangers: dict[tuple[int, int], str | None] = {}   # (pid, start) -> job

    def check(self, known: Known, on_violation: str, now: float) -> Result:
        stats = self._snapshot()
        memory = {s.uuid: dict(s.processes) for s in stats}
        busy: dict[str, Mapping[int, float]] = {}
        if self._busy is not None:
            for s in stats:
                busy[s.uuid] = self._busy(s.uuid)
        owner: dict[tuple[str, int], str | None] = {}
        starts: dict[int, int | None] = {}
        jobs = {lim.job_id for lim in known.limits}
        for uuid, procs in memory.items():
            for pid in procs:
                job = known.pids.get(pid)
                if job is None:
                    job, starts[pid] = self._attribute(pid, known, jobs)
                owner[(uuid, pid)] = job
        live = {(p, s) for p, s in starts.items() if s is not None}
        self._strangers = {k: v for k, v in self._strangers.items() if k in live}
        found, new = self._checker.check(now, known.limits, memory, busy, owner)
        res = Result(stats, found, new)
        if on_violation == "kill":
            for v in found:
                start = starts.get(v.pid) or known.starts.get(v.pid)
                if self._kill(v.pid, start):
                    res.killed.append(v)
        return res

    def _attribute(self, pid: int, known: Known,
                   jobs: set[str]) -> tuple[str | None, int | None]:
        """The job of a pid no job tracks (by its ancestors), and its start
        time (None when it is gone). A verdict is kept while the process
        lives and its job runs."""
        st = tracking.read_stat(pid)
        if st is None:
            return None, None
        start = st[1]
        cached = self._strangers.get((pid, start), "")
        if cached is None or cached in jobs:
            return cached, start
        job = slurm_job(pid, known.slurm) if known.slurm else None
        if job is None and pid in known.launchers and known.launchers[pid][0] == start:
            job = known.launchers[pid][1]
        ppid = st[0] if job is None else 0
        for _ in range(MAX_DEPTH):
            if ppid <= 1:
                break
            if ppid in known.pids:
                job = known.pids[ppid]
                break
            pst = tracking.read_stat(ppid)
            if pst is None:
                break
            if ppid in known.launchers and known.launchers[ppid][0] == pst[1]:
                job = known.launchers[ppid][1]
                break
            ppid = pst[0]
        self._strangers[(pid, start)] = job
        return job, start

    @staticmethod
    def _kill(pid: int, start: int | None) -> bool:
        if pid <= 1 or pid == os.getpid() or start is None:
            return False
        if tracking.start_time(pid) != start:
            return False        # gone, or its pid is another process's now
        try:
            os.kill(pid, signal.SIGKILL)
            return True
        except ProcessLookupError:
            return False
        except PermissionError:
            log.warning("may not kill pid %d", pid)
            return False


def slurm_job(pid: int, jobs: Mapping[str, str]) -> str | None:
    """The job whose Slurm job's cgroup holds pid, if any."""
    try:
        with open(f"/proc/{pid}/cgroup") as f:
            text = f.read()
    except OSError:
        return None
    for m in _SLURM_CGROUP.finditer(text):
        if m.group(1) in jobs:
            return jobs[m.group(1)]
    return None


def known(table: JobTable) -> Known:
    """What the watch needs of the live jobs, copied for its thread."""
    limits, pids, starts, launchers, slurm = [], {}, {}, {}, {}
    for job in table:
        rec = job.rec
        for u in job.uuids():
            share = max(rec.core_share / 100, job.target.get(u, 0.0))
            limits.append(JobLimits(job.id, u, rec.mem_limit, share, job.measured.get(u)))
        for p, start in rec.pids.items():
            pids[p] = job.id
            starts[p] = start
        if rec.launcher_pid is not None and rec.launcher_start is not None:
            launchers[rec.launcher_pid] = (rec.launcher_start, job.id)
        if rec.slurm_job is not None:
            slurm[rec.slurm_job] = job.id
    return Known(limits, pids, starts, launchers, slurm)


class Record:
    """The violations the watch found: into their jobs' records (the job
    table), the processes in no job (the newest), the totals per kind, the
    log."""

    def __init__(self) -> None:
        self.strays: list[dict[str, Any]] = []
        self.totals: dict[str, int] = dict.fromkeys(KINDS, 0)

    def apply(self, res: Result, table: JobTable, now: float) -> None:
        killed = {v.key for v in res.killed}
        for v in res.new:
            self.totals[v.kind] = self.totals.get(v.kind, 0) + 1
            done = "killed" if v.key in killed else "reported"
            entry = record(v, done, now)
            if not table.note_violation(v.job_id, entry):
                self.strays.append(entry)
                del self.strays[:-MAX_VIOLATIONS]
            log.warning("violation (%s): %s%s", v.kind, v.describe(),
                        f": pid {v.pid} killed" if done == "killed" else "")
        fresh = {v.key for v in res.new}
        for v in res.killed:
            if v.key not in fresh:
                log.debug("violation (%s): pid %d killed again", v.kind, v.pid)


def record(v: Violation, action: str, at: float) -> dict[str, Any]:
    """A violation as `ps --json` shows it."""
    return {"kind": v.kind, "pid": v.pid, "gpu_uuid": v.uuid, "job": v.job_id,
            "value": v.value, "limit": v.limit, "time": at, "action": action,
            "detail": v.describe()}
