"""The live jobs: each job's record and what exists only while it runs (its
region, its last trusted counters, its gates, its violations), and the one
place a job's record is changed and written to the store.

A job's life is one state machine, here: each transition is a method of
`JobTable` that checks the state it starts from (`MOVES`), sets the fields
it changes and writes those, and only those, to the store:

    admitted -> starting -> started -> running <-> suspended/resumed
    any state but ended -> ended (or a job that could not be made: unmade)

and, within a state: its processes seen, its launcher's exit, its limits
changed, its promise yielded, its region flagged, its GPU moved. Every
other part of the daemon calls these; nothing outside this module assigns
a record's fields or names a column.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vgpuctl.core import placement
from vgpuctl.core.job import (
    ENDED,
    RUNNING,
    STARTING,
    SUSPENDED,
    DeviceUsage,
    JobGpu,
    JobRecord,
    promised,
)
from vgpuctl.core.turns import Turn
from vgpuctl.errors import NotFound, StateError
from vgpuctl.store.database import Store
from vgpuctl.system.region import Region

log = logging.getLogger("vgpuctl.daemon")

POLICY_CODES = {"hard": 0, "soft": 1}     # region.h VGPU_POLICY_*

# The states each transition may start from (a bug in the caller raises
# StateError: the request fails, the record is untouched).
MOVES = {
    "started": {STARTING},
    "suspended": {RUNNING},
    "resumed": {SUSPENDED},
}

# Violations kept per job (the newest), and the jobs ended last whose
# violations are kept (as many as `ps --all` shows).
MAX_VIOLATIONS = 50
ENDED_VIOLATIONS = 100


@dataclass
class LiveJob:
    """A job while it runs: its record plus what only exists meanwhile."""
    rec: JobRecord
    region: Region | None = None
    usage: list[DeviceUsage] = field(default_factory=list)   # last trusted, per GPU
    turns: list[Turn] = field(default_factory=list)   # per GPU: its gate as written
    measured: dict[str, float] = field(default_factory=dict)  # uuid -> share 0..1
    target: dict[str, float] = field(default_factory=dict)    # uuid -> share 0..1
    violations: list[dict[str, Any]] = field(default_factory=list)  # newest last, capped
    violation_count: int = 0        # all of them, for the metrics
    stopped: str | None = None      # why the violation watch ended it (its gate closed)
    held: dict[str, int] = field(default_factory=dict)   # uuid -> bytes by NVML (the watch)
    peak_debt: float = 0.0          # the highest compute debt the watch saw it run up (GPU-s)
    suspended_pids: list[int] | None = None   # its processes checkpointed (None: unknown)
    resuming: bool = False          # its memory is being put back (vgpuctl.daemon.suspend)
    resumed_at: float | None = None  # when it last resumed (this daemon's clock)
    seen_at: dict[str, float] = field(default_factory=dict)   # uuid -> when NVML last
                                                              # listed a process of it there

    @property
    def signal_id(self) -> int:
        """The System V segment of its signal (the hooks of the jobs that
        heed it attach it); -1 when it has no region."""
        return int(self.region.signal_id) if self.region is not None else -1

    @property
    def id(self) -> str:
        return self.rec.id

    def uuids(self) -> list[str]:
        return self.rec.uuids


def commitments(jobs: Iterable[LiveJob]) -> list[placement.Commitment]:
    """Each job's memory limit, and its promised share (0: none), on each of
    its GPUs."""
    return [placement.Commitment(j.id, u, mem, core if promised(j.rec) else 0)
            for j in jobs for u, (mem, core) in j.rec.limits_by_uuid().items()]


class JobTable:
    """The daemon's live jobs, by id, and their records in the store."""

    def __init__(self, store: Store, jobs_dir: Path, clock: Callable[[], float]) -> None:
        self._store = store
        self._jobs: dict[str, LiveJob] = {}
        self.jobs_dir = jobs_dir
        self.clock = clock
        # job id -> the violations of the jobs ended last (in memory only)
        self._ended_violations: dict[str, list[dict[str, Any]]] = {}
        self.on_end: list[Callable[[LiveJob], None]] = []

    # -- reading ---------------------------------------------------------------
    def __iter__(self) -> Iterator[LiveJob]:
        return iter(list(self._jobs.values()))

    def __len__(self) -> int:
        return len(self._jobs)

    def __contains__(self, job_id: object) -> bool:
        return job_id in self._jobs

    def find(self, job_id: str) -> LiveJob | None:
        return self._jobs.get(job_id)

    def get(self, job_id: str) -> LiveJob:
        """The live job of an id; NotFound saying whether it ended or never was."""
        job = self._jobs.get(job_id)
        if job is None:
            if self._store.get_job(job_id) is not None:
                raise NotFound(f"job {job_id} has ended")
            raise NotFound(f"no job {job_id}")
        return job

    def record(self, job_id: str) -> JobRecord | None:
        """A job's record, live or ended."""
        job = self._jobs.get(job_id)
        return job.rec if job is not None else self._store.get_job(job_id)

    def ended(self, limit: int = 100) -> list[JobRecord]:
        return self._store.ended_jobs(limit)

    def ended_violations(self, job_id: str) -> list[dict[str, Any]]:
        return self._ended_violations.get(job_id, [])

    def by_slurm(self, slurm_job: str) -> LiveJob | None:
        return next((j for j in self._jobs.values() if j.rec.slurm_job == slurm_job), None)

    def of_user(self, uid: int) -> list[LiveJob]:
        return [j for j in self._jobs.values() if j.rec.uid == uid]

    def commitments(self) -> list[placement.Commitment]:
        """Each live job's memory limit, and its promised share, on each of its
        GPUs: a suspended job holds none."""
        return commitments(j for j in self._jobs.values() if not j.rec.suspended)

    def held_by(self, uid: int) -> int:
        """The memory limits a user's live jobs hold, per GPU summed."""
        return sum(sum(m for m, _ in j.rec.limits_by_uuid().values()) or j.rec.mem_limit
                   for j in self.of_user(uid))

    def unended(self) -> list[JobRecord]:
        """The records of the jobs the store has not seen end (at start: the
        ones a previous daemon left)."""
        return self._store.active_jobs()

    # -- changing --------------------------------------------------------------
    def insert(self, rec: JobRecord) -> str:
        """Record a new job (its id comes from the store); StateError when
        it can't be written. The job is not live until `add`."""
        return self._store.insert_job(rec)

    def add(self, rec: JobRecord, region: Region | None) -> LiveJob:
        job = self._jobs[rec.id] = LiveJob(rec, region)
        return job

    def _save(self, job: LiveJob | JobRecord, columns: Iterable[str] | None = None) -> None:
        """Write a record's changed columns (all when None); kept in memory
        and written later when the store can't take it now."""
        rec = job.rec if isinstance(job, LiveJob) else job
        self._store.update_job(rec, columns)

    def _check(self, job: LiveJob, move: str) -> None:
        if job.rec.state not in MOVES[move]:
            raise StateError(f"job {job.id} is {job.rec.state}: it can't be {move}")

    # -- a job's life ------------------------------------------------------------
    def admitted(self, rec: JobRecord, region: Region, job_dir: Path) -> LiveJob:
        """A recorded job whose region was made: live from now, starting."""
        rec.region = str(job_dir)
        self._save(rec, ["region"])
        return self.add(rec, region)

    def unmade(self, rec: JobRecord) -> None:
        """A recorded job whose region could not be made: ended, never live."""
        rec.state, rec.ended = ENDED, self.clock()
        self._save(rec)

    def started(self, job: LiveJob, pid: int, start: int | None, alive: bool) -> None:
        """Its command runs as pid (start: its start time, when known; alive:
        it still runs, so it is the job's first process)."""
        self._check(job, "started")
        rec = job.rec
        rec.state, rec.started = RUNNING, self.clock()
        rec.root_pid, rec.root_start = pid, start
        if start is not None and alive:
            rec.pids = {pid: start}
        self._save(job, ["state", "started", "root_pid", "root_start", "pids"])

    def launcher_exited(self, job: LiveJob, code: int | None, signal: int | None) -> None:
        """Its command exited so (its launcher is leaving; what the command
        left behind may still run)."""
        rec = job.rec
        rec.exit_code, rec.exit_signal = code, signal
        rec.launcher_pid = rec.launcher_start = None
        self._save(job, ["exit_code", "exit_signal", "launcher_pid", "launcher_start"])

    def processes_seen(self, job: LiveJob, live: dict[int, int]) -> None:
        """Its processes (pid -> start time) as a scan found them."""
        if live != job.rec.pids:
            job.rec.pids = live
            self._save(job, ["pids"])

    def process_added(self, job: LiveJob, pid: int, start: int) -> None:
        """One more process of it (Slurm's attach)."""
        if job.rec.pids.get(pid) != start:
            job.rec.pids[pid] = start
            self._save(job, ["pids"])

    def flagged(self, job: LiveJob, why: str) -> None:
        """Its usage region held what the hook never writes (trust)."""
        job.rec.region_error = why
        job.usage = []
        self._save(job, ["region_error"])

    def suspended(self, job: LiveJob, reason: str, now: float) -> None:
        """Its processes were checkpointed: off the GPU, holding nothing."""
        self._check(job, "suspended")
        rec = job.rec
        rec.state, rec.suspended_at, rec.suspend_reason = SUSPENDED, now, reason
        rec.suspensions += 1
        self._save(job, ["state", "suspended_at", "suspend_reason", "suspensions"])

    def stays_suspended(self, job: LiveJob, reason: str) -> None:
        """A suspended job that could not resume (a drain found no room)."""
        job.rec.suspend_reason = reason
        self._save(job, ["suspend_reason"])

    def resumed(self, job: LiveJob, now: float) -> None:
        """Back on its GPU (the one it was moved to, if moved)."""
        self._check(job, "resumed")
        rec = job.rec
        if rec.suspended_at is not None:
            rec.suspended_s += max(0.0, now - rec.suspended_at)
        rec.state, rec.suspended_at, rec.suspend_reason = RUNNING, None, None
        self._save(job, ["state", "suspended_s", "suspended_at", "suspend_reason", "gpus"])

    def moved(self, job: LiveJob, gpus: list[JobGpu]) -> None:
        """Its GPUs are now these (a suspended job's move, or its undoing):
        its record and its region's UUIDs alike."""
        job.rec.gpus = gpus
        if job.region is not None:
            for i, g in enumerate(gpus):
                job.region.update_device(i, uuid=g.uuid)
        self._save(job, ["gpus"])

    def change_limits(self, job: LiveJob, mem: int | None, core: int | None,
                      policy: str | None, priority: str | None = None) -> dict[str, Any]:
        """Change a job's limits, in its record and its region (live); the
        fields changed, as the region has them (its class goes to the region
        with the next pass of vgpuctl.daemon.holds). A share given is
        promised from then on."""
        rec = job.rec
        changes: dict[str, Any] = {}
        rec.set_limits(mem, core)          # one limit, one share, on every GPU
        if mem is not None:
            changes["mem_limit"] = mem
        if core is not None:
            changes["core_share"] = core
            rec.core_promised = True
        if policy is not None:
            rec.policy = policy
            changes["policy"] = POLICY_CODES[policy]
        live = dict(changes)
        if rec.state == SUSPENDED:         # its region stays closed until it resumes
            live.pop("mem_limit", None)
        if job.region is not None and live:
            for i in range(len(rec.gpus)):
                job.region.update_device(i, **live)
        shown = dict(changes)
        if priority is not None:
            rec.priority = shown["priority"] = priority
        self._save(job, ["mem_limit", "core_share", "policy", "gpus", "priority",
                         "core_promised"])
        return shown

    def yield_promise(self, job: LiveJob) -> None:
        """Its promised share is given up (it was idle, and another job
        needed it): the job runs on as one without --core (no turn, the
        open part of the cycle), its record and its region alike."""
        rec = job.rec
        rec.set_limits(core=100)
        rec.core_promised = False
        if job.region is not None:
            for i in range(len(rec.gpus)):
                job.region.update_device(i, core_share=100)
        self._save(job, ["core_share", "gpus", "core_promised"])

    def note_violation(self, job_id: str | None, entry: dict[str, Any]) -> bool:
        """Keep a violation in its job's record (a live job, or one that
        ended since); False when no job of that id is known here."""
        job = self._jobs.get(job_id) if job_id is not None else None
        if job is not None:
            job.violation_count += 1
            target = job.violations
        elif job_id is not None:
            target = self._ended_violations.setdefault(job_id, [])
        else:
            return False
        target.append(entry)
        del target[:-MAX_VIOLATIONS]
        return True

    def end(self, job: LiveJob) -> None:
        """End a job: its region goes, its record says so, and whoever
        listens (accounting, the governor) hears of it."""
        rec = job.rec
        if job.region is not None:
            job.region.remove()
            job.region = None
        elif rec.region:
            p = Path(rec.region)
            if p.parent == self.jobs_dir:
                Region.discard(p)
        rec.state, rec.ended, rec.pids = ENDED, self.clock(), {}
        self._save(rec, ["state", "ended", "pids"])
        self._jobs.pop(rec.id, None)
        if job.violations:
            self._ended_violations[rec.id] = job.violations
            for old in list(self._ended_violations)[:-ENDED_VIOLATIONS]:
                del self._ended_violations[old]
        for hear in self.on_end:
            hear(job)
        log.info("job %s (%s) ended (exit %s)", rec.id, rec.name,
                 f"signal {rec.exit_signal}" if rec.exit_signal else rec.exit_code)
        log.debug("job %s: peak compute debt %.3f GPU-seconds", rec.id, job.peak_debt)

    def remove_stray_regions(self) -> None:
        """Delete the region directories of jobs that are not live."""
        d = self.jobs_dir
        if not d.is_dir():
            return
        for p in d.iterdir():
            if p.name not in self._jobs and p.name.isascii() and p.name.isdigit():
                log.info("removing the region of ended job %s", p.name)
                Region.discard(p)

    def close(self) -> None:
        """Let go of every region (left on disk: the jobs keep running)."""
        for job in self._jobs.values():
            if job.region is not None:
                job.region.close()
                job.region = None
