"""Suspend, resume, move and drain: the daemon's side of the driver's
checkpoint API (vgpuctl.system.checkpoint; docs/suspend.md).

A job is suspended whole: every CUDA process of it is locked (its CUDA
calls wait), then checkpointed (its device memory goes to host memory and
the GPU's memory is given back). If any step fails, what was done is undone
and the job runs on as before. A suspended job holds no GPU: its limit no
longer counts on the GPU it left, it is not governed, and its time
suspended is not billed (the accountant closes its rows; `suspended_s` in
its record counts that time). Resuming restores every process, on the same
GPU or on another one (a move: UUID pairs, driver R580), points the job's
region and record at the new GPU, then unlocks the processes.

Every operation takes the one lock here, so two never interleave, and the
driver's calls (which block: a lock waits for the job's work, a checkpoint
copies its memory) run on a worker thread; the job's record and region are
changed on the event loop's thread.

Jobs suspended by preemption or by a drain resume by themselves when a GPU
has room for them (`resume_waiting`, from the daemon's loop).
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from vgpuctl.core import placement, suspend_rules
from vgpuctl.core.config import Config
from vgpuctl.core.job import RUNNING, STARTING, SUSPENDED, JobGpu
from vgpuctl.core.sizes import format_size
from vgpuctl.daemon import job_checkpoint, tracking
from vgpuctl.daemon.jobs import JobTable, LiveJob
from vgpuctl.errors import (
    AdmissionRefused,
    CheckpointError,
    CheckpointUnavailable,
    UsageError,
)
from vgpuctl.system.checkpoint import Driver
from vgpuctl.system.nvml import GpuStats

log = logging.getLogger("vgpuctl.daemon")


@dataclass
class Outcome:
    """What an operation did to one job, for the reply and the log."""
    job: str
    action: str                 # suspended | resumed | moved | stayed | failed
    gpu: int | None = None      # where it runs now (resumed, moved)
    detail: str = ""

    def wire(self) -> dict[str, Any]:
        return {"job": self.job, "action": self.action, "gpu": self.gpu, "detail": self.detail}


class Suspender:
    def __init__(self, config: Callable[[], Config], gpus: list[placement.Gpu],
                 table: JobTable, tracker: tracking.Tracker,
                 stats: dict[str, GpuStats], clock: Callable[[], float],
                 on_suspend: Callable[[LiveJob, float], None],
                 open_driver: Callable[[], Driver] = Driver.open,
                 allowed: Callable[[LiveJob], set[str]] | None = None) -> None:
        self._config = config
        self.gpus = gpus
        self._table = table
        self._tracker = tracker
        self._stats = stats
        self._clock = clock
        self._on_suspend = on_suspend        # the accountant closes the job's rows
        self._open_driver = open_driver
        self._allowed = allowed    # the GPUs a job may resume on (None: any)
        self._driver: Driver | None = None
        self._unavailable: str | None = None
        self.lock = asyncio.Lock()
        self.drained: set[str] = set()       # GPU uuids: nothing placed or resumed there
        # job id -> the GPUs the driver refused to move it to (between MIG
        # devices, say): a waiting job is not sent there again
        self.refused_moves: dict[str, set[str]] = {}

    # -- the driver -------------------------------------------------------------
    async def driver(self) -> Driver:
        """The driver's checkpoint API, opened once (on a worker thread:
        cuInit may take a while); CheckpointUnavailable, the same line each
        time, when this node can't suspend."""
        if self._driver is not None:
            return self._driver
        if self._unavailable is not None:
            raise CheckpointUnavailable(self._unavailable)
        loop = asyncio.get_running_loop()
        try:
            self._driver = await loop.run_in_executor(None, self._open_driver)
        except CheckpointUnavailable as e:
            self._unavailable = str(e)
            log.warning("suspend and resume are not available: %s", e)
            raise
        return self._driver

    # -- what a job is --------------------------------------------------------------
    async def _pids(self, job: LiveJob) -> list[int]:
        """The job's live processes that run as its user (a slot's pid is
        the job's own word: a process of another user is never touched)."""
        table = await asyncio.get_running_loop().run_in_executor(None, tracking.scan)
        pids = self._tracker.processes(job, table)
        uid = job.rec.uid
        return sorted(p for p in pids
                      if p != os.getpid() and (uid == 0 or tracking.proc_uid(p) == uid))

    def _features(self, job: LiveJob, pids: list[int]) -> dict[int, int]:
        if job.region is None:
            return {}
        try:
            usage = job.region.read_usage()
        except (OSError, ValueError):
            return {}
        mine = set(pids)
        return {p.pid: p.features for p in usage.procs if p.pid in mine and p.features}

    def held(self, job: LiveJob) -> int:
        """What the job holds on its GPUs (the hook's count, contexts
        included), the last reading."""
        return sum(u.used for u in job.usage) if job.usage else 0

    # -- suspend ------------------------------------------------------------------
    async def suspend(self, job: LiveJob, reason: str) -> Outcome:
        """Suspend the job (all its processes or none). Callers hold self.lock."""
        rec = job.rec
        if rec.state == SUSPENDED:
            raise UsageError(f"job {job.id} is suspended already")
        if rec.state == STARTING:
            raise UsageError(f"job {job.id} has not started yet: nothing to suspend")
        if rec.state != RUNNING:
            raise UsageError(f"job {job.id} is {rec.state}")
        driver = await self.driver()
        loop = asyncio.get_running_loop()
        pids = await self._pids(job)
        why = suspend_rules.unsuspendable(self._features(job, pids))
        if why:
            raise CheckpointError(f"job {job.id} can't be suspended: {why}; it keeps running")
        timeout_ms = self._config().suspend_lock_timeout_s * 1000
        _close_region(job)
        try:
            cuda = await loop.run_in_executor(None, job_checkpoint.checkpoint_all, driver,
                                              pids, timeout_ms, job.id)
        except BaseException:
            _open_region(job)
            raise
        now = self._clock()
        self._table.suspended(job, reason, now)
        job.suspended_pids = cuda
        self._on_suspend(job, now)
        tracking.poke_launcher(rec)
        log.info("job %s (%s) suspended (%s): %d process(es), %s moved to host memory",
                 job.id, rec.name, reason, len(cuda), format_size(self.held(job)))
        return Outcome(job.id, "suspended", None,
                       f"{len(cuda)} process(es); {format_size(self.held(job))} in host memory")

    # -- resume ---------------------------------------------------------------------
    def rooms(self, job: LiveJob | None = None) -> list[suspend_rules.Room]:
        """What each GPU not drained can take now (of those the job may
        resume on: a Slurm job's own, a plain job's not Slurm's)."""
        cfg = self._config()
        used = placement.committed(self._table.commitments(),
                                   exclude_job=job.id if job is not None else None)
        allowed = self._allowed(job) if job is not None and self._allowed is not None else None
        out = []
        for g in self.gpus:
            if g.uuid in self.drained or (allowed is not None and g.uuid not in allowed):
                continue
            st = self._stats.get(g.uuid)
            free = None
            if st is not None and st.memory_used is not None:
                free = max(0, g.total - st.memory_used)
            out.append(suspend_rules.Room(g.uuid, g.index,
                                  placement.capacity(g, cfg.reserve, cfg.oversubscribe)
                                  - used.get(g.uuid, 0), free))
        return out

    async def resume(self, job: LiveJob, gpu: str | None = None) -> Outcome:
        """Resume a suspended job: on the GPU named, else its own when it has
        room, else the one with the most. Callers hold self.lock."""
        rec = job.rec
        if rec.state != SUSPENDED:
            raise UsageError(f"job {job.id} is not suspended (it is {rec.state})")
        driver = await self.driver()
        home = rec.uuids[0] if rec.uuids else None
        if len(rec.uuids) > 1 and gpu is not None:
            raise UsageError(f"job {job.id} has {len(rec.uuids)} GPUs: it resumes on them "
                             "(--gpu moves one-GPU jobs)")
        target = self._target(job, gpu, home)
        moves = {home: target.uuid} if target is not None and home and target.uuid != home \
            else {}
        if moves:
            driver.check_move()
        # every whole GPU, and the MIG devices of the move (a driver that
        # knows no move between MIG devices refuses it: the job stays)
        pairs = suspend_rules.gpu_pairs(
            [g.uuid for g in self.gpus if g.parent is None or g.uuid in moves
             or g.uuid in moves.values()], moves)
        loop = asyncio.get_running_loop()
        pids = job.suspended_pids
        if pids is None:        # suspended before this daemon started: ask the driver
            pids = await loop.run_in_executor(None, job_checkpoint.checkpointed, driver,
                                              await self._pids(job))
        await self._restore(job, driver, pids, pairs, target if moves else None)
        now = self._clock()
        self.refused_moves.pop(job.id, None)
        self._table.resumed(job, now)
        job.suspended_pids = None
        job.resumed_at = now
        tracking.poke_launcher(rec)
        where = rec.gpus[0].index if rec.gpus else None
        action = "moved" if moves else "resumed"
        log.info("job %s (%s) %s GPU %s after %.1f s suspended", job.id, rec.name,
                 "moved to" if moves else "resumed on", where, rec.suspended_s)
        return Outcome(job.id, action, where)

    async def _restore(self, job: LiveJob, driver: Driver, pids: list[int],
                       pairs: list[tuple[str, str]],
                       moving_to: suspend_rules.Room | None) -> None:
        """Restore the job's processes (onto moving_to, a move) and let them
        go on."""
        loop = asyncio.get_running_loop()
        # The job's record and region say where it goes before it gets there:
        # NVML then never sees its processes on a GPU the daemon does not
        # give them.
        before = list(job.rec.gpus)
        if moving_to is not None:
            self._point(job, moving_to)
        # From here its memory comes back to the GPU: the watch no longer
        # holds it to a suspended job's nothing (vgpuctl.daemon.watch).
        job.resuming = True
        try:
            try:
                await loop.run_in_executor(None, job_checkpoint.restore_all, driver, pids,
                                           pairs, job.id)
            except BaseException as e:
                # whatever failed (the driver's refusal, or a bug on the way
                # to it), the job's processes are where they were: so is it
                if moving_to is not None:
                    self._point_back(job, before)
                    if isinstance(e, CheckpointError):
                        self.refused_moves.setdefault(job.id, set()).add(moving_to.uuid)
                raise
            _open_region(job)
            await loop.run_in_executor(None, job_checkpoint.unlock_all, driver, pids, job.id)
        finally:
            job.resuming = False

    def _target(self, job: LiveJob, gpu: str | None, home: str | None) -> suspend_rules.Room | None:
        """Where a suspended job resumes: the GPU named, else its own when it
        has room, else the one with the most (None: a job of several GPUs,
        on its own); AdmissionRefused when that has no room for it."""
        rec = job.rec
        held = self.held(job)
        rooms = self.rooms(job)
        if gpu is not None:
            return self._named_target(job, gpu, rooms, held)
        refused = self.refused_moves.get(job.id, set())
        rooms = [r for r in rooms if r.uuid not in refused]
        if len(rec.uuids) > 1:
            for i, u in enumerate(rec.uuids):
                r = next((r for r in rooms if r.uuid == u), None)
                there = job.usage[i].used if i < len(job.usage) else 0
                if r is None or suspend_rules.resume_target([r], None, rec.gpu_mem_limit(i),
                                                    there) is None:
                    raise AdmissionRefused(self._no_room(job, rec.uuids, rooms, held))
            return None
        target = suspend_rules.resume_target(rooms, home, rec.mem_limit, held)
        if target is None:
            raise AdmissionRefused(self._no_room(job, [r.uuid for r in rooms], rooms, held))
        return target

    def _named_target(self, job: LiveJob, gpu: str, rooms: list[suspend_rules.Room],
                      held: int) -> suspend_rules.Room:
        """The GPU a resume names, if the job may go there and fits."""
        rec = job.rec
        g = placement.resolve_gpu(self.gpus, gpu)
        if g.uuid in self.drained:
            raise AdmissionRefused(f"GPU {g.index} is drained (vgpuctl drain --undo "
                                   f"{g.index} takes it back)")
        if all(r.uuid != g.uuid for r in rooms):
            why = (f"job {job.id} is Slurm job {rec.slurm_job}'s: it stays on its GPU"
                   if rec.slurm_job is not None else f"GPU {g.index} is Slurm's "
                   "([slurm] gpus)")
            raise AdmissionRefused(why)
        target = next((r for r in rooms if r.uuid == g.uuid), None)
        if target is None or suspend_rules.resume_target([target], None, rec.mem_limit,
                                                         held) is None:
            raise AdmissionRefused(self._no_room(job, [g.uuid], rooms, held))
        return target

    def _point(self, job: LiveJob, target: suspend_rules.Room) -> None:
        """The suspended job's first GPU is now target's (a move)."""
        rec = job.rec
        first = (replace(rec.gpus[0], index=target.index, uuid=target.uuid)  # its limits stay
                 if rec.gpus else JobGpu(target.index, target.uuid))
        self._table.moved(job, [first, *rec.gpus[1:]])
        job.measured.clear()
        job.target.clear()
        job.held = {}

    def _point_back(self, job: LiveJob, before: list[JobGpu]) -> None:
        self._table.moved(job, before)

    def _no_room(self, job: LiveJob, uuids: list[str], rooms: list[suspend_rules.Room],
                 held: int) -> str:
        by = {r.uuid: r for r in rooms}
        parts = []
        for u in uuids:
            g = next((g for g in self.gpus if g.uuid == u), None)
            r = by.get(u)
            name = f"GPU {g.index}" if g else u
            if r is None:
                parts.append(f"{name} is drained")
            else:
                free = "" if r.free is None else f", {format_size(r.free)} free"
                parts.append(f"{name} has {format_size(max(0, r.promised_left))} of promises "
                             f"left{free}")
        return (f"job {job.id} (limit {format_size(job.rec.mem_limit)}, holding "
                f"{format_size(held)}) has no room to resume: " + "; ".join(parts)
                + "; it stays suspended")

    # -- drain ------------------------------------------------------------------------
    async def drain(self, gpu: str) -> list[Outcome]:
        """Move every running job off a GPU where another has room, suspend
        the ones that can't move (they resume elsewhere by themselves when
        room returns), and place nothing there until undrained. A job
        suspended already holds no GPU: it stays as it is, and resumes
        elsewhere. Callers hold self.lock."""
        g = placement.resolve_gpu(self.gpus, gpu)
        self.drained.add(g.uuid)
        log.info("GPU %d drained", g.index)
        out = []
        for job in sorted(self._table, key=lambda j: int(j.id)):
            if g.uuid not in job.uuids() or job.rec.state != RUNNING:
                continue
            try:
                out.append(await self._drain_one(job))
            except (CheckpointError, CheckpointUnavailable, AdmissionRefused,
                    UsageError) as e:
                out.append(Outcome(job.id, "failed", g.index, str(e)))
                log.warning("drain of GPU %d: job %s: %s", g.index, job.id, e)
        return out

    async def _drain_one(self, job: LiveJob) -> Outcome:
        if len(job.uuids()) > 1:
            raise UsageError(f"job {job.id} has {len(job.uuids())} GPUs: it is not moved")
        await self.suspend(job, "drained")
        try:
            return await self.resume(job)
        except AdmissionRefused as e:
            self._table.stays_suspended(job, "drained")
            return Outcome(job.id, "suspended", None, str(e))

    def undrain(self, gpu: str) -> tuple[placement.Gpu, bool]:
        """Take GPU back; says whether it was drained."""
        g = placement.resolve_gpu(self.gpus, gpu)
        was = g.uuid in self.drained
        self.drained.discard(g.uuid)
        if was:
            log.info("GPU %d undrained", g.index)
        return g, was

    # -- preemption ---------------------------------------------------------------------
    def preemptible(self, job: LiveJob) -> bool:
        """A running job of class low, on one GPU, that nothing of it keeps
        from being suspended (as far as its region says), and that has run
        `preempt_min_run_s` since it last resumed (a loop of short jobs that
        each preempt it would keep it suspended nearly all the time)."""
        rec = job.rec
        if rec.state != RUNNING or rec.priority != "low" or len(rec.uuids) != 1:
            return False
        if not self.ran_enough(job):
            return False
        if job.region is None:
            return False
        try:
            usage = job.region.read_usage()
        except (OSError, ValueError):
            return False
        return not any(p.features for p in usage.procs)

    def ran_enough(self, job: LiveJob) -> bool:
        """Whether the job has run `preempt_min_run_s` since it last resumed."""
        wait = self._config().priority.preempt_min_run_s
        return job.resumed_at is None or self._clock() - job.resumed_at >= wait

    def resting(self, gpus: list[placement.Gpu]) -> str:
        """Why low jobs on these GPUs were not preempted though they are low
        (each runs `preempt_min_run_s` between preemptions); "" for none."""
        uuids = {g.uuid for g in gpus}
        wait = self._config().priority.preempt_min_run_s
        now = self._clock()
        parts = [f"{j.id} in {wait - (now - j.resumed_at):.0f} s" for j in self._table
                 if j.rec.state == RUNNING and j.rec.priority == "low"
                 and j.resumed_at is not None and not self.ran_enough(j)
                 and set(j.uuids()) & uuids]
        if not parts:
            return ""
        return (f"low job(s) resumed lately may be preempted again (a low job runs "
                f"[priority] preempt_min_run_s, {wait} s, between preemptions): "
                + ", ".join(parts))

    def preemption_plan(self, gpus: list[placement.Gpu], mem: int
                        ) -> tuple[placement.Gpu, list[LiveJob]] | None:
        """Where a job of mem bytes fits by suspending the fewest preemptible
        jobs, and which: among the GPUs given (not drained), the one that
        needs the fewest, then frees the least past what is needed; None
        when no GPU can be made to fit."""
        cfg = self._config()
        used = placement.committed(self._table.commitments())
        best: tuple[tuple[int, int], placement.Gpu, list[LiveJob]] | None = None
        for g in gpus:
            if g.uuid in self.drained:
                continue
            short = used.get(g.uuid, 0) + mem - placement.capacity(g, cfg.reserve,
                                                                    cfg.oversubscribe)
            if short <= 0:
                continue            # it fits as it is: no one need be suspended
            cands = {j.id: j for j in self._table
                     if g.uuid in j.uuids() and self.preemptible(j)}
            ids = suspend_rules.victims([suspend_rules.Candidate(j.id, j.rec.mem_limit, j.rec.start)
                                 for j in cands.values()], short)
            if ids is None:
                continue
            freed = sum(cands[i].rec.mem_limit for i in ids)
            key = (len(ids), freed - short)
            if best is None or key < best[0]:
                best = (key, g, [cands[i] for i in ids])
        return None if best is None else (best[1], best[2])

    # -- the jobs that wait for room ------------------------------------------------------
    def waiting(self) -> list[LiveJob]:
        """Suspended jobs that resume by themselves (preempted, drained), the
        longest suspended first."""
        jobs = [j for j in self._table if j.rec.state == SUSPENDED
                and j.rec.suspend_reason in ("preempted", "drained")]
        return sorted(jobs, key=lambda j: (j.rec.suspended_at or 0.0, int(j.id)))

    async def resume_waiting(self) -> list[Outcome]:
        """Resume every waiting job a GPU has room for (any GPU)."""
        out = []
        if not self.waiting():
            return out
        async with self.lock:
            for gone in set(self.refused_moves) - {j.id for j in self._table}:
                del self.refused_moves[gone]
            for job in self.waiting():
                if job.id not in self._table:
                    continue
                held = self.held(job)
                refused = self.refused_moves.get(job.id, set())
                rooms = [r for r in self.rooms(job) if r.uuid not in refused]
                if suspend_rules.resume_target(rooms,
                                       job.rec.uuids[0] if job.rec.uuids else None,
                                       job.rec.mem_limit, held) is None:
                    continue
                try:
                    out.append(await self.resume(job))
                except (CheckpointError, CheckpointUnavailable, AdmissionRefused,
                        UsageError) as e:
                    log.warning("job %s could not resume by itself: %s", job.id, e)
        return out


def _close_region(job: LiveJob) -> None:
    """While suspended a job may allocate nothing (what its books give it
    is nothing until it resumes): a new process of it, or one that frees
    and allocates again, is refused by its hook, at what the job holds
    (at least 1 byte: 0 is "no limit" in a region). The watch holds it to
    the same (vgpuctl.daemon.watch.known)."""
    if job.region is None:
        return
    for i in range(len(job.rec.gpus)):
        held = job.usage[i].used if i < len(job.usage) else 0
        job.region.update_device(i, mem_limit=max(1, min(held, job.rec.gpu_mem_limit(i))))


def _open_region(job: LiveJob) -> None:
    """The job's limits back in its region (it resumes, or was never
    suspended)."""
    if job.region is None:
        return
    for i in range(len(job.rec.gpus)):
        job.region.update_device(i, mem_limit=job.rec.gpu_mem_limit(i))
