"""The daemon's violation watch: every tick, in a worker thread, NVML's
per-process memory and the device's busy time on every managed GPU against
the jobs the daemon knows (the rules are vgpuctl.core.violations').

**Whose busy time.** A job's GPU time is what its hooks measured; the
device's busy time beyond what every hook claims went through no hook, and
is the busy time of the processes on the GPU that loaded none: split each
tick by vgpuctl.daemon.busysplit. A job whose process bypassed its hook runs
up a debt that way, and one that never loaded it is ungated; busy time with
no such process to give it to is nobody's (it is left out, not pinned on an
honest job). No per-process utilization is read.

**Attribution at the time of the sample.** Each process NVML lists (a
compute process holding memory, or a pid in a utilization window) is given
its job when the watch first sees it, not from the job's list of pids that
/proc tracking refreshes every half second: it is one of the job's tracked
pids, or its `vgpuctl run` (which holds the job's environment); it sits in
the cgroup of a Slurm job the daemon serves (Slurm's task/cgroup puts every
process of a job under `.../job_<id>/`, which the job cannot leave); or one
of its ancestors is a tracked pid or the job's launcher (`vgpuctl run` is a
subreaper, so a double-forked child is re-parented to it and stays below
it). The verdict is kept per pid for `REMEMBER_S` after the pid was last
seen, so the busy time NVML reports after a short-lived process exited
(its windows close a sample period or more later) is still its job's.
A pid a job tracks is checked once against /proc (its start time: a pid
that was reused is not the job's process); a stranger's ancestry is read
once; both verdicts are kept while NVML lists the pid.

**Acting** (`on_violation`, vgpuctl.core.enforcement.act): a job to end
has every process killed, not the one NVML named: its tracked processes,
everything below them and below its launcher, and each process NVML
attributes to it, each checked to run as the job's user; first stopped
(SIGSTOP, so that none forks away), then killed. The job stays in the
watch's list of jobs being ended, and is killed again at every tick until
it is gone; from the second round on its launcher too (an honest `vgpuctl
run` reports its command's end at once; one that keeps starting work is
part of the job). A process in no job to kill is sent SIGKILL, checked
first to be the same process (pid and start time) NVML listed. Never pid 1
or the daemon itself. Only pids NVML lists on the daemon's GPUs, and the
processes of the jobs they belong to, are ever candidates.
"""

from __future__ import annotations

import logging
import os
import re
import signal
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from vgpuctl.core.enforcement import Actions, Cooldown, GpuMemory, act
from vgpuctl.core.job import SUSPENDED
from vgpuctl.core.violations import KINDS, MEMORY, Checker, JobLimits, ProcWindow, Violation
from vgpuctl.daemon import tracking
from vgpuctl.daemon.busysplit import Busy, BusySplit
from vgpuctl.daemon.jobs import MAX_VIOLATIONS, JobTable
from vgpuctl.system.nvml import GpuStats

log = logging.getLogger("vgpuctl.daemon")

# How far up the process tree a stranger's ancestry is followed.
MAX_DEPTH = 64
# A pid's verdict is kept this long after NVML last listed it (its busy
# time is reported up to a sample buffer later).
REMEMBER_S = 10.0
# A job being ended: from this long after the first round, its launcher too.
LAUNCHER_AFTER_S = 0.5
# Rounds of stop-rescan within one kill of a job (children forked meanwhile).
STOP_ROUNDS = 4
# A suspended job holds nothing by its books from this long after its
# memory left the GPU (an NVML reading of just before counts it no more).
SUSPENDED_GRACE_S = 2.0
# Slurm's job cgroup (task/cgroup, v1 and v2): .../job_<id>/...
_SLURM_CGROUP = re.compile(r"/job_(\d+)(?:/|$)")


@dataclass(frozen=True)
class JobProcs:
    """What the watch needs of a job to end it."""
    uid: int
    seeds: Mapping[int, int]                 # pid -> start: tracked processes
    launcher: tuple[int, int] | None         # (pid, start) of its `vgpuctl run`


@dataclass(frozen=True)
class Known:
    """What the event loop hands the watch each tick (a copy: the worker
    never touches the supervisor's live state)."""
    limits: list[JobLimits]
    pids: Mapping[int, str]                  # tracked pid -> job id
    starts: Mapping[int, int]                # tracked pid -> its start time
    launchers: Mapping[int, tuple[int, str]]  # launcher pid -> (start, job id)
    slurm: Mapping[str, str] = field(default_factory=dict)  # Slurm job id -> job id
    jobs: Mapping[str, JobProcs] = field(default_factory=dict)
    reserve: int = 0                         # bytes kept aside per GPU (config)
    hooked: Mapping[int, int] | None = None  # pid -> start: processes in their job's slots
    # (job id, uuid) -> the job's GPU time there so far, as its hooks measured it (ns)
    claims: Mapping[tuple[str, str], int] = field(default_factory=dict)


@dataclass
class Result:
    stats: list[GpuStats]
    found: list[Violation]
    new: list[Violation]
    killed: list[Violation] = field(default_factory=list)
    ended: dict[str, Violation] = field(default_factory=dict)   # jobs ended this check
    memory: dict[tuple[str, str], int] = field(default_factory=dict)    # (job, uuid) -> bytes
    busy: dict[tuple[str, str], float] = field(default_factory=dict)    # ... GPU-seconds
    share: dict[tuple[str, str], float] = field(default_factory=dict)   # ... last window's
    # ... GPU-seconds no hook of the job claimed (its unhooked processes, or
    # the device's time while it is alone on the GPU, ungated)
    beyond: dict[tuple[str, str], float] = field(default_factory=dict)
    debts: dict[str, float] = field(default_factory=dict)   # job -> compute debt, GPU-s


def _job_by_origin(pid: int, ppid: int, start: int, known: Known) -> str | None:
    """The job of a process seen for the first time (or since it changed):
    its Slurm job's, a launcher's own, or its nearest tracked ancestor's
    (or a launcher ancestor's), up to MAX_DEPTH generations; None for none."""
    job = slurm_job(pid, known.slurm, known.jobs) if known.slurm else None
    if job is None and pid in known.launchers and known.launchers[pid][0] == start:
        job = known.launchers[pid][1]
    if job is not None:
        return job
    for _ in range(MAX_DEPTH):
        if ppid <= 1:
            return None
        if ppid in known.pids:
            return known.pids[ppid]
        pst = tracking.read_stat(ppid)
        if pst is None:
            return None
        if ppid in known.launchers and known.launchers[ppid][0] == pst[1]:
            return known.launchers[ppid][1]
        ppid = pst[0]
    return None


class Watch:
    def __init__(self, snapshot: Callable[[], list[GpuStats]],
                 busy: Busy | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._snapshot = snapshot
        self._split = BusySplit(busy)
        self._clock = clock
        self._checker = Checker()
        # pid -> (its start time, its job, when NVML last listed it)
        self._verdicts: dict[int, tuple[int | None, str | None, float]] = {}
        self._hooked: dict[int, int | None] = {}   # pid -> start: seen in its job's slots
        self._ending: dict[str, float] = {}      # job id -> when its first round ran

    def check(self, known: Known, on_violation: str, now: float) -> Result:
        """One check; `now` is the wall clock (NVML's windows are stamped
        with it)."""
        stats = self._snapshot()
        mono = self._clock()
        memory = {s.uuid: dict(s.processes) for s in stats}
        owner: dict[tuple[str, int], str | None] = {}
        jobs = {lim.job_id for lim in known.limits}
        for s in stats:
            for pid in s.processes:
                owner[(s.uuid, pid)] = self._attribute(pid, known, jobs, mono)
        windows = self._split.windows(stats, known, owner, mono)
        self._forget(mono)
        found, new = self._checker.check(now, known.limits, memory, windows, owner,
                                         self._gated(known, windows))
        res = Result(stats, found, new, debts=self._checker.debts())
        for (uuid, pid), b in self._split.beyond.items():
            job = owner.get((uuid, pid))
            if job is not None:
                res.beyond[(job, uuid)] = res.beyond.get((job, uuid), 0.0) + b
        for (uuid, pid), job in owner.items():
            if job is None:
                continue
            if pid in memory.get(uuid, {}):
                key = (job, uuid)
                res.memory[key] = res.memory.get(key, 0) + memory[uuid][pid]
        for w in windows:
            per: dict[str, float] = {}
            for pid, b in w.busy.items():
                job = owner.get((w.uuid, pid))
                if job is not None:
                    per[job] = per.get(job, 0.0) + b
            for job, b in per.items():
                key = (job, w.uuid)
                res.busy[key] = res.busy.get(key, 0.0) + min(b, w.duration)
                res.share[key] = min(b / w.duration, 1.0) if w.duration > 0 else 0.0
            for lim in known.limits:
                if lim.uuid == w.uuid and lim.job_id not in per:
                    res.share[(lim.job_id, w.uuid)] = 0.0
        gpus = {s.uuid: GpuMemory(s.uuid, s.memory_total, s.memory_used) for s in stats}
        todo = act(found, on_violation, gpus, known.limits, res.memory, known.reserve)
        self._do(todo, known, owner, res, mono)
        return res

    def _attribute(self, pid: int, known: Known, jobs: set[str], now: float) -> str | None:
        """The job of a pid NVML lists, as it is when seen (the module
        docstring); None for no job."""
        job = known.pids.get(pid)
        cached = self._verdicts.get(pid)
        if job is not None:
            want = known.starts.get(pid)
            if cached is not None and cached[1] == job and cached[0] == want:
                self._verdicts[pid] = (want, job, now)      # checked when first seen
                return job
        st = tracking.read_stat(pid)
        if st is None or st[2] in ("Z", "X"):
            # Gone (its busy time is reported after it exited): what it was.
            if job is not None:
                return job          # tracked as the job's at the last scan
            if cached is not None and (cached[1] is None or cached[1] in jobs):
                self._verdicts[pid] = (cached[0], cached[1], now)
                return cached[1]
            return None
        start = st[1]
        if job is not None and start == known.starts.get(pid):
            self._verdicts[pid] = (start, job, now)
            return job
        if cached is not None and cached[0] == start and (cached[1] is None
                                                          or cached[1] in jobs):
            self._verdicts[pid] = (start, cached[1], now)
            return cached[1]
        job = _job_by_origin(pid, st[0], start, known)
        self._verdicts[pid] = (start, job, now)
        return job

    def _gated(self, known: Known, windows: list[ProcWindow]) -> set[int] | None:
        """The pids of the windows that loaded the hook: in a slot of their
        job's region, now or when last seen (the same process: start time)."""
        if known.hooked is None:
            return None
        live: dict[int, int | None] = dict(known.hooked)
        for pid, start in self._hooked.items():    # gone since, its busy still reported
            if pid not in live and pid in self._verdicts:
                live[pid] = start
        self._hooked = live
        out = set(self._split.claim_pids)     # a job's claim went through its hooks
        for w in windows:
            for pid in w.busy:
                if pid in out:
                    continue
                v = self._verdicts.get(pid)
                if pid in self._hooked and (v is None or v[0] is None
                                            or self._hooked[pid] == v[0]):
                    out.add(pid)
        return out

    def _forget(self, now: float) -> None:
        for pid in [p for p, v in self._verdicts.items() if now - v[2] > REMEMBER_S]:
            del self._verdicts[pid]

    # -- acting ----------------------------------------------------------------------
    def _do(self, todo: Actions, known: Known, owner: Mapping[tuple[str, int], str | None],
            res: Result, now: float) -> None:
        self._end_jobs(todo, known, owner, res, now)
        for v in todo.kill:
            start = tracking.start_time(v.pid)
            cached = self._verdicts.get(v.pid)
            if cached is not None and cached[0] is not None and cached[0] != start:
                continue        # not the process NVML listed any more
            if _kill(v.pid, start):
                res.killed.append(v)

    def _end_jobs(self, todo: Actions, known: Known,
                  owner: Mapping[tuple[str, int], str | None], res: Result, now: float) -> None:
        """The jobs being ended (newly, or still: their processes killed each
        pass until none is left, their launcher after LAUNCHER_AFTER_S)."""
        for job_id, v in todo.end.items():
            if job_id not in self._ending and job_id in known.jobs:
                self._ending[job_id] = now
                res.ended[job_id] = v
        for job_id in [j for j in self._ending if j not in known.jobs]:
            del self._ending[job_id]
        for job_id, first in self._ending.items():
            on_gpu = {pid: v[0] for (_, pid), j in owner.items() if j == job_id
                      and (v := self._verdicts.get(pid)) is not None and v[0] is not None}
            killed = end_job(known.jobs[job_id], on_gpu, with_launcher=now - first
                             >= LAUNCHER_AFTER_S)
            if killed:
                log.debug("job %s: killed %s", job_id, sorted(killed))
            for v in res.found:
                if v.job_id == job_id and (v.pid in killed or v.pid == 0):
                    res.killed.append(v)


def _kill(pid: int, start: int | None, sig: int = signal.SIGKILL) -> bool:
    if pid <= 1 or pid == os.getpid() or start is None:
        return False
    if tracking.start_time(pid) != start:
        return False        # gone, or its pid is another process's now
    try:
        os.kill(pid, sig)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        log.warning("may not kill pid %d", pid)
        return False


def job_processes(job: JobProcs, on_gpu: Mapping[int, int], table: tracking.ProcTable,
                  with_launcher: bool) -> dict[int, int]:
    """{pid: start} of every live process of a job: its tracked processes
    and what runs below them and below its launcher, and the processes NVML
    attributes to it (and what runs below those); the launcher itself only
    with_launcher. Never pid 1 or the daemon."""
    seeds = {p: s for p, s in job.seeds.items() if tracking.alive(p, s, table)}
    for p, s in on_gpu.items():
        if tracking.alive(p, s, table):
            seeds.setdefault(p, s)
    children = tracking.children_map(table)
    if job.launcher is not None and tracking.alive(*job.launcher, table):
        lp, ls = job.launcher
        for c in children.get(lp, ()):
            seeds.setdefault(c, table[c].start)
        if with_launcher:
            seeds.setdefault(lp, ls)
    out = tracking.job_processes(seeds, table, children)
    me = os.getpid()
    return {p: s for p, s in out.items()
            if p > 1 and p != me and (job.uid == 0 or tracking.proc_uid(p) == job.uid)}


def end_job(job: JobProcs, on_gpu: Mapping[int, int], with_launcher: bool) -> set[int]:
    """Kill every process of a job: stop them all (rescanning for what
    forked meanwhile), then kill them. The pids killed."""
    stopped: dict[int, int] = {}
    for _ in range(STOP_ROUNDS):
        table = tracking.scan()
        procs = job_processes(job, on_gpu, table, with_launcher)
        fresh = {p: s for p, s in procs.items() if p not in stopped}
        if not fresh:
            break
        for p, s in fresh.items():
            if _kill(p, s, signal.SIGSTOP):
                stopped[p] = s
            else:
                stopped.setdefault(p, s)
    killed = set()
    for p, s in stopped.items():
        if _kill(p, s):
            killed.add(p)
    return killed


def slurm_job(pid: int, jobs: Mapping[str, str],
              procs: Mapping[str, JobProcs] | None = None) -> str | None:
    """The job whose Slurm job's cgroup holds pid, if any, and only if pid
    runs as that job's user: a user who may make cgroups of their own (a
    delegated subtree) can name one job_<id>, and must not so charge their
    process to another user's job."""
    try:
        with open(f"/proc/{pid}/cgroup") as f:
            text = f.read()
    except OSError:
        return None
    for m in _SLURM_CGROUP.finditer(text):
        job = jobs.get(m.group(1))
        if job is None:
            continue
        info = procs.get(job) if procs is not None else None
        if info is not None and info.uid != 0 and tracking.proc_uid(pid) != info.uid:
            return None
        return job
    return None


def held_to_nothing(job: Any, now: float) -> bool:
    """Whether a job's books give it no memory: suspended, not being
    resumed, since SUSPENDED_GRACE_S ago."""
    rec = job.rec
    return (rec.state == SUSPENDED and not job.resuming and rec.suspended_at is not None
            and now - rec.suspended_at > SUSPENDED_GRACE_S)


def known(table: JobTable, reserve: int = 0,
          hooked: Mapping[int, int] | None = None) -> Known:
    """What the watch needs of the live jobs, copied for its thread;
    hooked: the processes in their jobs' region slots (pid -> start)."""
    limits, pids, starts, launchers, slurm, jobs = [], {}, {}, {}, {}, {}
    claims: dict[tuple[str, str], int] = {}
    now = table.clock()
    for job in table:
        rec = job.rec
        # A job suspended (past the moment its memory left the GPU) holds
        # nothing by its books: memory its processes take meanwhile, hook or
        # no hook, is over its limit (issue: a suspended job re-took the
        # memory the daemon had given away).
        closed = held_to_nothing(job, now)
        for on in rec.on_gpus():
            i = on.dev
            turn = min(job.turns[i].share, 1.0) \
                if i < len(job.turns) and job.turns[i].len_ns > 0 else 0.0
            limits.append(JobLimits.of(on, turn, closed))
            if i < len(job.usage):
                claims[(job.id, on.uuid)] = job.usage[i].busy_ns
        for p, start in rec.pids.items():
            pids[p] = job.id
            starts[p] = start
        launcher = None
        if rec.launcher_pid is not None and rec.launcher_start is not None:
            launchers[rec.launcher_pid] = (rec.launcher_start, job.id)
            launcher = (rec.launcher_pid, rec.launcher_start)
        if rec.slurm_job is not None:
            slurm[rec.slurm_job] = job.id
        jobs[job.id] = JobProcs(rec.uid, dict(rec.pids), launcher)
    return Known(limits, pids, starts, launchers, slurm, jobs, reserve,
                 dict(hooked) if hooked is not None else None, claims)


class Record:
    """The violations the watch found: into their jobs' records (the job
    table), the processes in no job (the newest), the totals per kind, the
    log; the jobs it ended (their gates closed, their users' cooldown)."""

    def __init__(self) -> None:
        self.strays: list[dict[str, Any]] = []
        self.totals: dict[str, int] = dict.fromkeys(KINDS, 0)
        self.cooldown = Cooldown()

    def apply(self, res: Result, table: JobTable, now: float,
              close: Callable[[Any, str], None] | None = None) -> None:
        _drop_stale(res, table)
        self._note_new(res, table, now)
        self._note_ended(res, table, now, close)

    def _note_new(self, res: Result, table: JobTable, now: float) -> None:
        """Each new violation into its job's record (or the strays), the
        totals and the log."""
        killed = {v.key for v in res.killed}
        for v in res.new:
            self.totals[v.kind] = self.totals.get(v.kind, 0) + 1
            done = ("ended" if v.job_id in res.ended else
                    "killed" if v.key in killed else "reported")
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

    def _note_ended(self, res: Result, table: JobTable, now: float,
                    close: Callable[[Any, str], None] | None) -> None:
        """The jobs the watch ended: recorded, their gates closed, their
        users' cooldown counted, the log."""
        fresh = {v.key for v in res.new}
        for job_id, v in res.ended.items():
            job = table.find(job_id)
            if job is None:
                continue
            why = v.describe()
            if v.key not in fresh:      # seen before, acted on now
                table.note_violation(job_id, record(v, "ended", now))
            if close is not None:
                close(job, why)
            self.cooldown.note(job.rec.uid, now)
            log.warning("job %s (%s) of %s ended for a %s violation: every process of it "
                        "is killed and its gate closed", job_id, job.rec.name, job.rec.user,
                        v.kind)


def _drop_stale(res: Result, table: JobTable) -> None:
    """The check ran on a copy of the jobs taken before it read NVML: a
    suspended job held to nothing that has begun to resume since (its
    memory back on the GPU) broke no rule."""
    stale = {v.key for v in res.found if v.kind == MEMORY and v.limit == 0
             and (job := table.find(v.job_id)) is not None and v.uuid in job.uuids()
             and job.rec.mem_limit > 0 and not held_to_nothing(job, table.clock())}
    if stale:
        res.new = [v for v in res.new if v.key not in stale]
        res.ended = {j: v for j, v in res.ended.items() if v.key not in stale}


def record(v: Violation, action: str, at: float) -> dict[str, Any]:
    """A violation as `ps --json` shows it."""
    return {"kind": v.kind, "pid": v.pid, "gpu_uuid": v.uuid, "job": v.job_id,
            "value": v.value, "limit": v.limit, "time": at, "action": action,
            "scope": v.scope, "detail": v.describe()}
