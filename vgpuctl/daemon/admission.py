"""Admission and placement: whether a job may start, on which GPU, and the
job's region and environment.

The rules are vgpuctl.core.placement's (pure); this module applies them to
the live jobs: a user's maxima and caps (jobs, jobs starting, admissions a
second, memory held in all), the GPUs a plain `run` may use (not Slurm's),
then the GPU. An admitted job gets its row in the store (its id), its
region, and its ledgers (vgpuctl.daemon.trust) before anyone hears of it.
"""

from __future__ import annotations

import dataclasses
import grp
import logging
import os
import pwd
import time
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from pathlib import Path

from vgpuctl.core import classes, placement
from vgpuctl.core import protocol as P
from vgpuctl.core.config import Config, UserLimits
from vgpuctl.core.job import STARTING, JobGpu, JobRecord
from vgpuctl.core.sizes import format_size
from vgpuctl.daemon import tracking
from vgpuctl.daemon.jobs import POLICY_CODES, JobTable, LiveJob
from vgpuctl.daemon.trust import Trust
from vgpuctl.errors import AdmissionBusy, AdmissionRefused, StateError, UsageError
from vgpuctl.system.region import DeviceLimit, Region

log = logging.getLogger("vgpuctl.daemon")

# A user refused for want of room waits for the next room as long as they
# ask again within this long (a `run` that retries, a user's script).
WAITING_S = 2.0


@dataclass
class _Waiting:
    user: str
    since: float                    # their first refusal of this wait
    last: float                     # their last one
    place: Callable[[], object]     # their request placed as things are now

# A user refused for asking too fast is logged at most this often.
REFUSAL_LOG_S = 60.0


def user_name(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def group_names(uid: int) -> list[str]:
    """The names of the groups a user is in (primary and supplementary)."""
    try:
        pw = pwd.getpwuid(uid)
        gids = os.getgrouplist(pw.pw_name, pw.pw_gid)
    except (KeyError, OSError):
        return []
    out = []
    for gid in gids:
        try:
            out.append(grp.getgrgid(gid).gr_name)
        except KeyError:
            pass
    return out


class Admission:
    def __init__(self, config: Callable[[], Config], gpus: list[placement.Gpu],
                 table: JobTable, trust: Trust, hook_library: Callable[[], Path],
                 clock: Callable[[], float] = time.time,
                 sim_env: Mapping[str, str] | None = None,
                 sim_prepend: Mapping[str, str] | None = None,
                 context_mem: int = placement.CONTEXT_MEM) -> None:
        self._config = config
        self.gpus = gpus
        self._table = table
        self._trust = trust
        self._hook_library = hook_library
        self._clock = clock
        self._sim_env = dict(sim_env or {})
        self._sim_prepend = dict(sim_prepend or {})
        self.context_mem = context_mem    # what one CUDA context takes, about
        self._rate = placement.AdmissionRate()
        self.drained: set[str] = set()    # GPU uuids nothing is placed on (vgpuctl drain)
        self._refusals: dict[int, tuple[float, int]] = {}   # uid -> (logged at, since)
        # the promised jobs on these GPUs idle for promise_idle_s, the most
        # idle first (the supervisor knows when each last ran: see there)
        self.idle_promises: Callable[[set[str]], list[LiveJob]] = lambda uuids: []
        # uid -> the request of a user refused for want of room and still
        # asking: the next room goes to whoever has asked the longest
        self._waiting: dict[int, _Waiting] = {}

    # -- a user's maxima and caps ------------------------------------------------------
    def node_capacity(self) -> int:
        cfg = self._config()
        return sum(placement.capacity(g, cfg.reserve, cfg.oversubscribe) for g in self.gpus)

    def check_user(self, limits: UserLimits, uid: int, user: str, mem: int | None,
                   core: int | None, gpus: int = 1) -> None:
        """A user's maxima for one job, and their caps on what they hold."""
        placement.check_user_limits(limits, user, mem, core)
        mine = self._table.of_user(uid)
        placement.check_user_jobs(limits, user, len(mine),
                                  sum(1 for j in mine if j.rec.state == STARTING))
        if mem is not None:
            placement.check_user_total(limits, user, self._table.held_by(uid), mem * gpus,
                                       self.node_capacity())

    def _check_rate(self, limits: UserLimits, uid: int, user: str) -> None:
        now = time.monotonic()
        if self._rate.take(uid, limits.admission_rate, now):
            return
        logged, count = self._refusals.get(uid, (-REFUSAL_LOG_S, 0))
        if now - logged >= REFUSAL_LOG_S:
            log.warning("user %s asks for jobs faster than %g a second (admission_rate): "
                        "%d more refused since the last line", user, limits.admission_rate,
                        count)
            self._refusals[uid] = (now, 0)
        else:
            self._refusals[uid] = (logged, count + 1)
        raise AdmissionBusy(f"user {user} asks for jobs faster than "
                            f"{limits.admission_rate:g} a second (admission_rate): try again "
                            "in a moment")

    def check_priority(self, cls: str, uid: int, user: str, admin: bool) -> None:
        """PermissionDenied when the user may not run a job of class cls."""
        pc = self._config().priority
        groups = group_names(uid) if cls == classes.HIGH else []
        classes.check_class(cls, user, groups, admin or uid == 0, pc.high_users,
                             pc.high_groups)

    # -- run ------------------------------------------------------------------------------
    def run(self, peer_pid: int, uid: int, admin: bool, req: P.Run,
            make_room: Collection[str] = (), on: str | None = None
            ) -> tuple[LiveJob, list[str]]:
        """Admit a `vgpuctl run`: the live job and what to warn its user of.
        make_room: jobs about to be suspended for it (preemption): their
        limits don't count; on: the GPU (its UUID) they free."""
        cfg = self._config()
        user = user_name(uid)
        mem = req.mem if req.mem is not None else cfg.default_mem
        if mem is None:
            raise UsageError("--mem is required (this daemon has no default_mem)")
        core = req.core if req.core is not None else 100
        policy = req.policy or cfg.default_policy
        cls = req.priority or cfg.priority.default
        limits = cfg.limits_for(user, uid, admin)
        count = self._count(req)
        self.check_user(limits, uid, user, mem, core, count)
        self.check_priority(cls, uid, user, admin)
        # A share asked for is a promise on each of its GPUs (a low job's is a
        # cap only).
        promise = core if req.core is not None and classes.promises(cls) else 0
        gpus = self.run_gpus(req.gpu)

        def place(unpromised: Collection[str] = ()) -> list[placement.Placement]:
            commits = [dataclasses.replace(c, core=0) if c.job_id in unpromised else c
                       for c in self._table.commitments() if c.job_id not in make_room]
            return placement.place_many(gpus, commits, mem, count=req.gpus,
                                        pin=on or req.gpu, reserve=cfg.reserve,
                                        oversubscribe=cfg.oversubscribe, core=promise,
                                        core_oversubscribe=cfg.core_oversubscribe)
        now = time.monotonic()
        try:
            where, yielded = self._place_yielding(place, gpus if promise else [])
        except AdmissionRefused:
            self._note_waiting(uid, user, now, place)
            raise
        if not make_room:       # (a preemption makes its own room)
            self._check_turn(uid, user, now, place)
        self._check_rate(limits, uid, user)
        self._waiting.pop(uid, None)
        # The command's name stands for a job's name: one line, nothing a
        # terminal acts on (a name the user gives is checked at the edge).
        name = req.name or P.escape_controls(
            os.path.basename(req.command[0]) or req.command[0])[:P.MAX_NAME]
        rec = JobRecord(name=name, uid=uid, user=user,
                        command=P.stored_command(req.command),
                        cwd=req.cwd,
                        gpus=[JobGpu(p.gpu.index, p.gpu.uuid) for p in where],
                        mem_limit=mem, core_share=core, policy=policy, created=self._clock(),
                        state=STARTING, launcher_pid=peer_pid,
                        launcher_start=tracking.start_time(peer_pid), priority=cls,
                        core_promised=req.core is not None)
        job = self.create(rec)
        log.info("job %s (%s) of %s admitted on GPU %s: mem %s, core %d%%%s, %s, priority %s",
                 rec.id, name, user, ",".join(str(p.gpu.index) for p in where),
                 format_size(mem), core, " promised" if promise else "", policy, cls)
        warnings = [self._yield(y, rec.id, cfg.promise_idle_s) for y in yielded]
        small = placement.context_warning(mem, self.context_mem)
        return job, warnings + ([small] if small else [])

    def _count(self, req: P.Run) -> int:
        """How many GPUs a run asks for (--gpus N, or the GPUs --gpu names)."""
        if req.gpus is not None and req.gpu is not None:
            raise UsageError("--gpus and --gpu: give one (--gpus N picks N GPUs, "
                             "--gpu A,B names them)")
        if req.gpus is not None and req.gpus < 1:
            placement.check_count(req.gpus, self.gpus)
        return req.gpus if req.gpus is not None else (
            len(req.gpu.split(",")) if req.gpu is not None else 1)

    def _place_yielding(self, place: Callable[..., list[placement.Placement]],
                        promised_on: list[placement.Gpu]
                        ) -> tuple[list[placement.Placement], list[LiveJob]]:
        """Where the job goes, and the idle jobs whose promises yield to it
        (the most idle first, as few as will do: promise_idle_s), when it
        has a promise and fits only so (promised_on: its GPUs, or none);
        AdmissionRefused when it does not fit even so."""
        try:
            return place(), []
        except AdmissionRefused:
            idle = self.idle_promises({g.uuid for g in promised_on}) if promised_on else []
            for k in range(1, len(idle) + 1):
                try:
                    return place({j.id for j in idle[:k]}), idle[:k]
                except AdmissionRefused:
                    continue
            raise

    def _yield(self, y: LiveJob, to: str, idle_s: int) -> str:
        """An idle job gives up its promise to job `to`: the warning for
        the new job's user."""
        self._table.yield_promise(y)
        log.info("job %s (%s) of %s gave up its promised share, idle for %d s, to job %s",
                 y.id, y.rec.name, y.rec.user, idle_s, to)
        return (f"job {y.id} of {y.rec.user} gave up its promised share to this "
                f"one (it launched nothing for promise_idle_s, {idle_s} s)")

    # -- the next room to the user who has asked the longest -------------------------------
    def _note_waiting(self, uid: int, user: str, now: float,
                      place: Callable[[], object]) -> None:
        """A user refused for want of room: they wait from their first
        refusal, as long as they ask again within WAITING_S."""
        w = self._waiting.get(uid)
        since = w.since if w is not None and now - w.last <= WAITING_S else now
        self._waiting[uid] = _Waiting(user, since, now, place)

    def _check_turn(self, uid: int, user: str, now: float,
                    place: Callable[[], object]) -> None:
        """AdmissionRefused when another user, refused for want of room and
        still asking, has waited longer than this one and would fit now:
        the room is theirs (two users asking every 20 ms took every
        admission from a third)."""
        for other, w in list(self._waiting.items()):
            if now - w.last > WAITING_S:
                del self._waiting[other]
        mine = self._waiting.get(uid)
        ahead = sorted((w.since, other, w) for other, w in self._waiting.items()
                       if other != uid and (mine is None or w.since < mine.since))
        for _, _, w in ahead:
            try:
                w.place()
            except (AdmissionRefused, UsageError):
                continue            # their job would not fit now: no room to keep for it
            self._note_waiting(uid, user, now, place)
            raise AdmissionRefused(
                f"the room is kept for user {w.user}, who has asked for it since "
                f"{now - w.since:.1f} s ago (the next room goes to the user who has asked "
                f"the longest, while they ask again within {WAITING_S:g} s): ask again")

    def run_gpus(self, pin: str | None) -> list[placement.Gpu]:
        """The GPUs a plain `vgpuctl run` may use: not those Slurm hands out
        ([slurm] gpus), unless [slurm] allow_run."""
        sc = self._config().slurm
        if pin is not None:
            for g in placement.resolve_gpus(self.gpus, pin):
                if g.uuid in self.drained:
                    raise AdmissionRefused(f"GPU {g.index} is drained (vgpuctl drain --undo "
                                           f"{g.index} takes it back)")
        if sc.allow_run:
            return self._undrained(self.gpus)
        how = ("run it through Slurm (srun --gres=shard:N), or set [slurm] allow_run "
               "in the daemon's configuration")
        if pin is not None:
            for g in placement.resolve_gpus(self.gpus, pin):
                if sc.controls(g.index):
                    raise AdmissionRefused(f"GPU {g.index} is Slurm's ([slurm] gpus): {how}")
        gpus = [g for g in self.gpus if not sc.controls(g.index)]
        if not gpus and self.gpus:
            raise AdmissionRefused(f"every GPU here is Slurm's ([slurm] gpus): {how}")
        return self._undrained(gpus)

    def _undrained(self, gpus: list[placement.Gpu]) -> list[placement.Gpu]:
        out = [g for g in gpus if g.uuid not in self.drained]
        if gpus and not out:
            raise AdmissionRefused("every GPU a job may use here is drained (vgpuctl drain "
                                   "--undo GPU takes one back)")
        return out

    def create(self, rec: JobRecord) -> LiveJob:
        """Record an admitted job, create its region, and make it live. The
        region is made open; the supervisor writes the job's turns (its
        GPUs' plans, vgpuctl.daemon.gates) before the job is told to start."""
        self._hook_library()            # NativeMissing before anything is admitted
        self._table.insert(rec)
        job_dir = self._table.jobs_dir / rec.id
        try:
            if job_dir.exists():       # left by a database that was deleted
                Region.discard(job_dir)
            limits = rec.limits_by_uuid()
            region = Region.create(job_dir, rec.id, rec.uid, [DeviceLimit(
                uuid=u, mem_limit=mem, core_share=core, policy=POLICY_CODES[rec.policy])
                for u, (mem, core) in limits.items()])
        except (OSError, ValueError) as e:
            self._table.unmade(rec)
            Region.discard(job_dir)         # what it made of the region: nothing is left
            raise StateError(f"could not create the job's region in {job_dir}: {e}") from None
        job = self._table.admitted(rec, region, job_dir)
        self._trust.watch(job)
        return job

    def job_env(self, job: LiveJob) -> tuple[dict[str, str], dict[str, str]]:
        """The variables a job's processes get, and the paths put first on
        path-list variables (the hook on LD_PRELOAD, the simulator's
        libraries on LD_LIBRARY_PATH)."""
        rec = job.rec
        env = {"VGPU_REGION": str(rec.region), "VGPU_JOB": rec.id,
               "CUDA_VISIBLE_DEVICES": ",".join(job.uuids()), **self._sim_env}
        return env, {"LD_PRELOAD": str(self._hook_library()), **self._sim_prepend}

    def check_core(self, job: LiveJob, core: int) -> None:
        """AdmissionRefused when the job's promised share can't become core
        percent on each of its GPUs."""
        cfg = self._config()
        for u in job.uuids():
            placement.check_core(self.gpus, self._table.commitments(), job.id, u, core,
                                 core_oversubscribe=cfg.core_oversubscribe)

    def check_resize(self, job: LiveJob, mem: int) -> None:
        """AdmissionRefused when the job's limit can't grow to mem on each of
        its GPUs."""
        cfg = self._config()
        for u in job.uuids():
            placement.check_resize(self.gpus, self._table.commitments(), job.id, u, mem,
                                   reserve=cfg.reserve, oversubscribe=cfg.oversubscribe)
