"""The daemon's state and its answer to each request.

Everything here runs on the event loop's thread and is synchronous: the
asyncio shell (server.py, lifecycle.py) reads the socket, runs the blocking
readers (/proc scan, NVML, the compute governor) in an executor, and hands
their results to the methods below (`kill` gets its /proc scan that way).
No method here blocks for long.
"""

from __future__ import annotations

import logging
import os
import pwd
import shutil
import signal as _signal
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vgpuctl import __version__
from vgpuctl.core import placement, slurm
from vgpuctl.core import protocol as P
from vgpuctl.core.config import Config
from vgpuctl.core.sizes import format_size
from vgpuctl.core.violations import KINDS, JobLimits
from vgpuctl.daemon import tracking
from vgpuctl.daemon import violations as watch
from vgpuctl.errors import (
    AdmissionRefused,
    NotFound,
    PermissionDenied,
    RequestInvalid,
    StateError,
    UsageError,
    VgpuError,
)
from vgpuctl.store.jobs import ENDED, RUNNING, STARTING, JobRecord, Store
from vgpuctl.system.config import load_daemon_config
from vgpuctl.system.nvml import GpuStats
from vgpuctl.system.paths import DaemonPaths
from vgpuctl.system.region import MAX_BYTES, BadRegion, DeviceLimit, Region

log = logging.getLogger("vgpuctl.daemon")

POLICY_CODES = {"hard": 0, "soft": 1}

# Violations kept per job, and of processes in no job (the newest); the
# violations of this many ended jobs (as many as `ps --all` shows).
MAX_VIOLATIONS = 50
ENDED_VIOLATIONS = 100


@dataclass(frozen=True)
class Peer:
    """The process at the other end of a connection (SO_PEERCRED)."""
    pid: int
    uid: int
    gid: int


@dataclass
class Job:
    """A live job: its record plus what only exists while it runs."""
    rec: JobRecord
    region: Region | None = None
    measured: dict[str, float] = field(default_factory=dict)   # uuid -> share 0..1
    target: dict[str, float] = field(default_factory=dict)     # uuid -> share 0..1
    gates: dict[int, tuple[bool, int, int]] = field(default_factory=dict)  # last written
    violations: list[dict[str, Any]] = field(default_factory=list)  # newest last, capped
    violation_count: int = 0        # all of them, for the metrics

    @property
    def id(self) -> str:
        return self.rec.id

    def uuids(self) -> list[str]:
        return [str(g["uuid"]) for g in self.rec.gpus]


def user_name(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


class Supervisor:
    def __init__(self, config: Config, paths: DaemonPaths, store: Store,
                 devices: list[GpuStats], hook_library: Callable[[], Path],
                 clock: Callable[[], float] = time.time,
                 sim_env: Mapping[str, str] | None = None,
                 sim_prepend: Mapping[str, str] | None = None,
                 context_mem: int = placement.CONTEXT_MEM) -> None:
        self.config = config
        self.paths = paths
        self.store = store
        self.gpus = [placement.Gpu(d.index, d.uuid, d.name, d.memory_total) for d in devices]
        self.stats: dict[str, GpuStats] = {d.uuid: d for d in devices}
        self.hook_library = hook_library
        self.clock = clock
        self.sim_env = dict(sim_env or {})
        self.sim_prepend = dict(sim_prepend or {})
        self.context_mem = context_mem    # what one CUDA context takes, about
        self.jobs: dict[str, Job] = {}
        self.started = clock()
        self.compute = False            # set by the shell when a governor runs
        self.on_config: Callable[[Config], None] | None = None
        self.on_job_end: Callable[[str], None] | None = None
        self.strays: list[dict[str, Any]] = []      # violations of processes in no job
        self.ended_violations: dict[str, list[dict[str, Any]]] = {}  # job id -> its, in memory
        self.violation_totals: dict[str, int] = dict.fromkeys(KINDS, 0)
        self._handlers: dict[type, Callable[[Peer, Any], dict[str, Any]]] = {
            P.Ping: self.op_ping, P.Run: self.op_run, P.Started: self.op_started,
            P.Exited: self.op_exited, P.Ps: self.op_ps, P.Set: self.op_set,
            P.Kill: self.op_kill, P.Reload: self.op_reload,
            P.SlurmRegister: self.op_slurm_register, P.SlurmAttach: self.op_slurm_attach,
            P.SlurmRelease: self.op_slurm_release,
        }
        # Slurm job id -> (uid, why): registrations refused, for the job's
        # TaskProlog to fail its steps with the reason (until the Epilog).
        self.slurm_refused: dict[str, tuple[int, str]] = {}

    # -- requests ---------------------------------------------------------------
    def handle_line(self, peer: Peer, line: bytes) -> dict[str, Any]:
        """The reply to one request line. Never raises."""
        try:
            req = P.parse_request(line)
        except RequestInvalid as e:
            return P.error("protocol", str(e))
        return self.handle(peer, req)

    def handle(self, peer: Peer, req: P.Request,
               table: tracking.ProcTable | None = None) -> dict[str, Any]:
        """The reply to one request. table: a fresh /proc scan, which `kill`
        then uses instead of scanning on the caller's thread."""
        try:
            if table is not None and isinstance(req, P.Kill):
                return self.op_kill(peer, req, table)
            return self._handlers[type(req)](peer, req)
        except VgpuError as e:
            return P.error(P.error_code(e), str(e))
        except Exception as e:  # a bug: answer, log, keep serving
            log.exception("request %r failed", req)
            return P.error("internal", f"internal error: {type(e).__name__}: {e}")

    def is_admin(self, peer: Peer) -> bool:
        return peer.uid == 0 or peer.uid == os.geteuid()

    def _job(self, job_id: str) -> Job:
        job = self.jobs.get(job_id)
        if job is None:
            rec = self.store.get_job(job_id)
            if rec is not None:
                raise NotFound(f"job {job_id} has ended")
            raise NotFound(f"no job {job_id}")
        return job

    def _authorize(self, peer: Peer, job: Job, what: str) -> None:
        if peer.uid != job.rec.uid and not self.is_admin(peer):
            raise PermissionDenied(f"job {job.id} belongs to {job.rec.user}: only its owner "
                                   f"or root may {what} it")

    def op_ping(self, peer: Peer, req: P.Ping) -> dict[str, Any]:
        return P.ok(daemon=self.info())

    def info(self) -> dict[str, Any]:
        return {"pid": os.getpid(), "version": __version__, "uid": os.geteuid(),
                "socket": str(self.paths.socket), "system": self.paths.system,
                "started": self.started, "compute": self.compute,
                "config": self.config.source, "jobs": len(self.jobs),
                "config_file": None if self.paths.config is None else str(self.paths.config),
                "slurm": {"shard_size": self.config.slurm.shard_size,
                          "allow_run": self.config.slurm.allow_run}}

    def commitments(self) -> list[placement.Commitment]:
        return [placement.Commitment(j.id, u, j.rec.mem_limit)
                for j in self.jobs.values() for u in j.uuids()]

    def op_run(self, peer: Peer, req: P.Run) -> dict[str, Any]:
        cfg = self.config
        user = user_name(peer.uid)
        mem = req.mem if req.mem is not None else cfg.default_mem
        if mem is None:
            raise UsageError("--mem is required (this daemon has no default_mem)")
        core = req.core if req.core is not None else 100
        policy = req.policy or cfg.default_policy
        limits = cfg.limits_for(user, peer.uid)
        placement.check_user_limits(limits, user, mem, core)
        placement.check_user_total(limits, user, self.held_by(peer.uid), mem)
        where = placement.place(self._run_gpus(req.gpu), self.commitments(), mem, pin=req.gpu,
                                reserve=cfg.reserve, oversubscribe=cfg.oversubscribe)
        name = req.name or os.path.basename(req.command[0]) or req.command[0]
        rec = JobRecord(name=name, uid=peer.uid, user=user,
                        command=P.stored_command(req.command),
                        cwd=req.cwd, gpus=[{"index": where.gpu.index, "uuid": where.gpu.uuid}],
                        mem_limit=mem, core_share=core, policy=policy, created=self.clock(),
                        state=STARTING, launcher_pid=peer.pid,
                        launcher_start=tracking.start_time(peer.pid))
        self.hook_library()            # NativeMissing before anything is admitted
        job = self._admit(rec)
        log.info("job %s (%s) of %s admitted on GPU %d: mem %s, core %d%%, %s", rec.id, name,
                 user, where.gpu.index, format_size(mem), core, policy)
        env, prepend = self._job_env(job)
        small = placement.context_warning(mem, self.context_mem)
        return P.ok(job=self.view(job), env=env, prepend=prepend,
                    warnings=[small] if small else [])

    def _run_gpus(self, pin: str | None) -> list[placement.Gpu]:
        """The GPUs a plain `vgpuctl run` may use: not those Slurm hands out
        ([slurm] gpus), unless [slurm] allow_run."""
        sc = self.config.slurm
        if sc.allow_run:
            return self.gpus
        how = ("run it through Slurm (srun --gres=shard:N), or set [slurm] allow_run "
               "in the daemon's configuration")
        if pin is not None:
            g = placement.resolve_gpu(self.gpus, pin)
            if sc.controls(g.index):
                raise AdmissionRefused(f"GPU {g.index} is Slurm's ([slurm] gpus): {how}")
        gpus = [g for g in self.gpus if not sc.controls(g.index)]
        if not gpus and self.gpus:
            raise AdmissionRefused(f"every GPU here is Slurm's ([slurm] gpus): {how}")
        return gpus

    def _admit(self, rec: JobRecord) -> Job:
        """Insert an admitted job and create its region; the live Job."""
        self.store.insert_job(rec)
        job_dir = self.paths.jobs_dir / rec.id
        try:
            if job_dir.exists():       # left by a database that was deleted
                shutil.rmtree(job_dir)
            region = Region.create(job_dir, rec.id, rec.uid, [DeviceLimit(
                uuid=str(g["uuid"]), mem_limit=rec.mem_limit, core_share=rec.core_share,
                policy=POLICY_CODES[rec.policy]) for g in rec.gpus])
        except (OSError, ValueError) as e:
            rec.state, rec.ended = ENDED, self.clock()
            self.store.update_job(rec)
            raise StateError(f"could not create the job's region in {job_dir}: {e}") from None
        rec.region = str(job_dir)
        self.store.update_job(rec, ["region"])
        job = self.jobs[rec.id] = Job(rec, region)
        return job

    def _job_env(self, job: Job) -> tuple[dict[str, str], dict[str, str]]:
        """The variables a job's processes get, and the paths put first on
        path-list variables (the hook on LD_PRELOAD, the simulator's
        libraries on LD_LIBRARY_PATH)."""
        rec = job.rec
        env = {"VGPU_REGION": str(rec.region), "VGPU_JOB": rec.id,
               "CUDA_VISIBLE_DEVICES": ",".join(job.uuids()), **self.sim_env}
        return env, {"LD_PRELOAD": str(self.hook_library()), **self.sim_prepend}

    # -- Slurm --------------------------------------------------------------------
    def slurm_job(self, slurm_job: str) -> Job | None:
        """The live job registered for a Slurm job id."""
        return next((j for j in self.jobs.values() if j.rec.slurm_job == slurm_job), None)

    def slurm_gpu(self, index: int) -> placement.Gpu:
        """Slurm's GPU ``index``: the index-th GPU in /dev/nvidiaN minor order,
        the order of gres.conf's lines (`vgpuctl slurm gres-conf`)."""
        def minor(g: placement.Gpu) -> tuple[int, int]:
            st = self.stats.get(g.uuid)
            m = st.minor if st is not None and st.minor is not None else g.index
            return m, g.index
        ordered = sorted(self.gpus, key=minor)
        if index >= len(ordered):
            raise NotFound(f"Slurm's GPU {index} is not here: this node has {len(ordered)} "
                           "GPUs (gres.conf and vgpuctl disagree; see `vgpuctl slurm gres-conf`)")
        return ordered[index]

    def op_slurm_register(self, peer: Peer, req: P.SlurmRegister) -> dict[str, Any]:
        if peer.uid != 0 and not (self.is_admin(peer) and req.uid == peer.uid):
            raise PermissionDenied("only root may register a Slurm job (from its Prolog)")
        job = self.slurm_job(req.slurm_job)
        if job is not None:
            if job.rec.uid != req.uid:
                raise UsageError(f"Slurm job {req.slurm_job} is registered for uid "
                                 f"{job.rec.uid}, not {req.uid}")
            return P.ok(job=self.view(job), existing=True)
        try:
            job = self._register_slurm(req)
        except (AdmissionRefused, NotFound, UsageError) as e:
            self.slurm_refused.pop(req.slurm_job, None)
            self.slurm_refused[req.slurm_job] = (req.uid, str(e))
            while len(self.slurm_refused) > 4096:       # missed Epilogs: forget the oldest
                del self.slurm_refused[next(iter(self.slurm_refused))]
            log.warning("Slurm job %s of uid %d refused: %s", req.slurm_job, req.uid, e)
            raise
        self.slurm_refused.pop(req.slurm_job, None)
        return P.ok(job=self.view(job), existing=False)

    def _register_slurm(self, req: P.SlurmRegister) -> Job:
        cfg = self.config
        where = sorted(set(req.gpus))
        if len(where) != 1:
            raise AdmissionRefused(
                f"Slurm job {req.slurm_job} has shards on {len(where)} GPUs of this node "
                f"({', '.join(map(str, where))}): vgpuctl fences a job on one GPU")
        gpu = self.slurm_gpu(where[0])
        size = cfg.slurm.shard_size
        per_gpu = slurm.shards_per_gpu(
            placement.capacity(gpu, cfg.reserve, cfg.oversubscribe), size)
        mem, core = slurm.shard_limits(req.shards, per_gpu, size)
        core = req.core or core
        if req.ask_core is not None:         # a job may take less than its share, not more
            core = min(core, req.ask_core)
        policy = req.policy or cfg.default_policy
        placement.place(self.gpus, self.commitments(), mem, pin=gpu.uuid, reserve=cfg.reserve,
                        oversubscribe=cfg.oversubscribe)
        self.hook_library()
        now = self.clock()
        rec = JobRecord(name=req.name or f"slurm-{req.slurm_job}", uid=req.uid,
                        user=user_name(req.uid),
                        command=[req.command or f"slurm job {req.slurm_job}"],
                        cwd=req.cwd or "/", gpus=[{"index": gpu.index, "uuid": gpu.uuid}],
                        mem_limit=mem, core_share=core, policy=policy, created=now,
                        state=RUNNING, started=now, slurm_job=req.slurm_job,
                        slurm_partition=req.partition, slurm_account=req.account,
                        slurm_shards=req.shards)
        job = self._admit(rec)
        log.info("job %s: Slurm job %s of %s registered on GPU %d: %d shards, mem %s, "
                 "core %d%%, %s", rec.id, req.slurm_job, rec.user, gpu.index, req.shards,
                 format_size(mem), core, policy)
        return job

    def op_slurm_attach(self, peer: Peer, req: P.SlurmAttach) -> dict[str, Any]:
        job = self.slurm_job(req.slurm_job)
        if job is None:
            refused = self.slurm_refused.get(req.slurm_job)
            if refused is not None and (peer.uid == refused[0] or self.is_admin(peer)):
                raise AdmissionRefused(f"vgpuctl refused Slurm job {req.slurm_job}: "
                                       f"{refused[1]}")
            raise NotFound(f"Slurm job {req.slurm_job} is not registered with vgpuctl")
        self._authorize(peer, job, "attach to")
        if req.pid is not None:
            self._add_pid(job, req.pid)
        env, prepend = self._job_env(job)
        return P.ok(job=self.view(job), env=env, prepend=prepend)

    def _add_pid(self, job: Job, pid: int) -> None:
        """Track pid (and what it starts) as the job's, if it runs as the
        job's user."""
        start = tracking.start_time(pid)
        if start is None:
            return
        if job.rec.uid != 0 and tracking.proc_uid(pid) != job.rec.uid:
            raise PermissionDenied(f"process {pid} does not run as {job.rec.user}")
        if job.rec.pids.get(pid) != start:
            job.rec.pids[pid] = start
            self.store.update_job(job.rec, ["pids"])

    def op_slurm_release(self, peer: Peer, req: P.SlurmRelease) -> dict[str, Any]:
        if not self.is_admin(peer):
            raise PermissionDenied("only root may release a Slurm job (from its Epilog)")
        self.slurm_refused.pop(req.slurm_job, None)
        job = self.slurm_job(req.slurm_job)
        if job is None:
            return P.ok(released=None)
        self.end_job(job)
        return P.ok(released=job.id)

    def slurm_jobs(self) -> list[str]:
        """The Slurm job ids of the live jobs."""
        return [j.rec.slurm_job for j in self.jobs.values() if j.rec.slurm_job is not None]

    def reconcile_slurm(self, asked: list[str], states: Mapping[str, str]) -> list[str]:
        """End the jobs of the Slurm jobs ``asked`` about (those registered
        before the controller was asked: a later one may be missing from its
        answer) that its list (job id -> state) shows ended or no longer
        has: an Epilog that never came."""
        ended = slurm.gone(asked, states)
        for sid in ended:
            job = self.slurm_job(sid)
            if job is not None:
                log.warning("Slurm job %s is %s: releasing job %s (its Epilog did not)", sid,
                            states.get(sid, "gone").lower(), job.id)
                self.end_job(job)
        return ended

    def held_by(self, uid: int) -> int:
        """The memory limits a user's live jobs hold, per GPU summed."""
        return sum(j.rec.mem_limit * max(1, len(j.rec.gpus))
                   for j in self.jobs.values() if j.rec.uid == uid)

    def op_started(self, peer: Peer, req: P.Started) -> dict[str, Any]:
        job = self._job(req.job)
        self._authorize(peer, job, "start")
        if job.rec.state != STARTING:
            raise UsageError(f"job {job.id} has already started")
        start = tracking.start_time(req.pid)
        if start is None:
            st = tracking.read_stat(req.pid)   # a zombie (exited already) still names itself
            start = st[1] if st else None
        uid = tracking.proc_uid(req.pid)
        if start is not None and uid != job.rec.uid and job.rec.uid != 0:
            raise PermissionDenied(f"process {req.pid} does not run as {job.rec.user}")
        rec = job.rec
        rec.state, rec.started = RUNNING, self.clock()
        rec.root_pid, rec.root_start = req.pid, start
        if start is not None and tracking.start_time(req.pid) is not None:
            rec.pids = {req.pid: start}
        self.store.update_job(rec, ["state", "started", "root_pid", "root_start", "pids"])
        return P.ok(job=self.view(job))

    def op_exited(self, peer: Peer, req: P.Exited) -> dict[str, Any]:
        job = self._job(req.job)
        self._authorize(peer, job, "end")
        if job.rec.slurm_job is not None:
            raise UsageError(f"job {job.id} is Slurm job {job.rec.slurm_job}'s: it ends at "
                             "its Epilog")
        rec = job.rec
        rec.exit_code, rec.exit_signal = req.code, req.signal
        rec.launcher_pid = rec.launcher_start = None    # the launcher is leaving
        self.store.update_job(rec, ["exit_code", "exit_signal", "launcher_pid",
                                    "launcher_start"])
        # The command's own process is gone: end the job now unless something
        # it left behind still runs (the next pass looks for descendants).
        seeds = dict(rec.pids)
        seeds.update(self._slot_seeds(job))
        if not any(tracking.start_time(p) == s for p, s in seeds.items()):
            self.end_job(job)
        return P.ok()

    def op_ps(self, peer: Peer, req: P.Ps) -> dict[str, Any]:
        if req.job is not None:
            job = self.jobs.get(req.job)
            if job is not None:
                jobs = [self.view(job)]
            else:
                rec = self.store.get_job(req.job)
                if rec is None:
                    raise NotFound(f"no job {req.job}")
                jobs = [self.view(self._ended(rec))]
        else:
            jobs = []
            if req.all:
                jobs = [self.view(self._ended(r)) for r in self.store.ended_jobs()]
            jobs += [self.view(j) for j in sorted(self.jobs.values(), key=lambda j: int(j.id))]
        return P.ok(daemon=self.info(), gpus=self.gpu_views(), jobs=jobs,
                    violations=list(self.strays))

    def _ended(self, rec: JobRecord) -> Job:
        """An ended job for its view, with the violations this daemon saw."""
        return Job(rec, violations=self.ended_violations.get(rec.id, []))

    def op_set(self, peer: Peer, req: P.Set) -> dict[str, Any]:
        job = self._job(req.job)
        self._authorize(peer, job, "change")
        if job.rec.slurm_job is not None and not self.is_admin(peer):
            raise PermissionDenied(f"job {job.id} is Slurm job {job.rec.slurm_job}'s: its "
                                   "limits are its shards, only root may change them")
        if req.mem is None and req.core is None and req.policy is None:
            raise UsageError("nothing to change: give --mem, --core or --policy")
        rec = job.rec
        if not self.is_admin(peer):
            limits = self.config.limits_for(rec.user, rec.uid)
            placement.check_user_limits(limits, rec.user, req.mem, req.core)
            if req.mem is not None and req.mem > rec.mem_limit:
                placement.check_user_total(limits, rec.user, self.held_by(rec.uid),
                                           (req.mem - rec.mem_limit) * max(1, len(rec.gpus)))
        warnings = []
        if req.mem is not None and req.mem > rec.mem_limit:
            for u in job.uuids():
                placement.check_resize(self.gpus, self.commitments(), rec.id, u, req.mem,
                                       reserve=self.config.reserve,
                                       oversubscribe=self.config.oversubscribe)
        changes: dict[str, Any] = {}
        if req.mem is not None:
            rec.mem_limit = changes["mem_limit"] = req.mem
        if req.core is not None:
            rec.core_share = changes["core_share"] = req.core
        if req.policy is not None:
            rec.policy = req.policy
            changes["policy"] = POLICY_CODES[req.policy]
        if job.region is not None:
            for i in range(len(rec.gpus)):
                job.region.update_device(i, **changes)
        self.store.update_job(rec, ["mem_limit", "core_share", "policy"])
        if req.mem is not None:
            used = self._dev_usage(job).get("used")
            if used is not None and used > req.mem:
                warnings.append(
                    f"job {rec.id} holds {format_size(used)}, more than its new limit of "
                    f"{format_size(req.mem)}: it keeps what it holds, and its allocations "
                    f"fail until it is back under the limit")
        log.info("job %s changed by uid %d: %s", rec.id, peer.uid,
                 ", ".join(f"{k}={v}" for k, v in changes.items()))
        return P.ok(job=self.view(job), warnings=warnings)

    def op_kill(self, peer: Peer, req: P.Kill,
                table: tracking.ProcTable | None = None) -> dict[str, Any]:
        job = self._job(req.job)
        self._authorize(peer, job, "kill")
        try:
            sig = _signal.Signals(req.signal)
        except ValueError:
            raise UsageError(f"no signal {req.signal}") from None
        if table is None:
            table = tracking.scan()
        pids = self._processes(job, table, tracking.children_map(table))
        done = []
        for pid in sorted(pids):
            if job.rec.uid != 0 and tracking.proc_uid(pid) != job.rec.uid:
                continue
            try:
                os.kill(pid, sig)
                done.append(pid)
            except ProcessLookupError:
                pass
            except PermissionError:
                log.warning("job %s: may not signal pid %d", job.id, pid)
        log.info("job %s: %s sent to %s by uid %d", job.id, sig.name, done, peer.uid)
        return P.ok(job=job.id, signal=sig.name, pids=done)

    def op_reload(self, peer: Peer, req: P.Reload) -> dict[str, Any]:
        if not self.is_admin(peer):
            raise PermissionDenied("only root may reload the daemon's configuration")
        try:
            self.reload()
        except VgpuError as e:
            log.error("reload failed, keeping the previous configuration: %s", e)
            raise
        return P.ok(config=self.config.source)

    def reload(self) -> None:
        """Re-read the config file (the default one is read if it has been
        created since); on error keep the old config and raise."""
        new = load_daemon_config(self.paths.config, self.paths.config_optional)
        old = self.config
        for key in ("socket", "runtime_dir", "state_dir"):
            if getattr(new, key) != getattr(old, key):
                log.warning("config %s: %s changed: takes effect at the next start",
                            new.source, key)
        self.config = new
        if self.on_config is not None:
            self.on_config(new)
        if new.source == Config().source and self.paths.config is not None:
            log.info("configuration reloaded: no %s, the defaults", self.paths.config)
        else:
            log.info("configuration reloaded from %s", new.source)

    # -- views ------------------------------------------------------------------
    def _dev_usage(self, job: Job, i: int = 0) -> dict[str, int]:
        """Device i's counters from the job's usage region, validated and
        bounded by the GPU's memory; {} when unreadable or tampered with (the
        job is then flagged and its gate closed: see `flag_region`)."""
        reg = job.region
        if reg is None or not reg.usage_readable or reg.limits is None or job.rec.region_error:
            return {}
        try:
            devs = reg.read_devices()
        except BadRegion as e:
            self.flag_region(job, str(e))
            return {}
        if i >= len(devs):
            return {}
        d = devs[i]
        total = next((g.total for g in self.gpus if job.rec.gpus and i < len(job.rec.gpus)
                      and g.uuid == job.rec.gpus[i].get("uuid")), MAX_BYTES)
        if d.peak > 2 * max(total, job.rec.mem_limit):
            self.flag_region(job, f"peak = {d.peak} bytes, far more than the GPU's {total}")
            return {}
        return {"used": min(d.used, total), "peak": min(d.peak, total), "launches": d.launches,
                "throttled_ns": d.throttled_ns, "oom_refusals": d.oom_refusals}

    def flag_region(self, job: Job, why: str) -> None:
        """The job wrote what the hook never writes into its usage region: its
        counters are no longer read, it is flagged (``region_error`` in
        ``ps --json``, the job's record, the log) and its compute gate closed
        for good: its kernel launches fail. Only this job is affected."""
        if job.rec.region_error is not None:
            return
        job.rec.region_error = why
        self.store.update_job(job.rec, ["region_error"])
        log.warning("job %s (%s) of %s: its usage region was tampered with (%s): "
                    "its counters are ignored and its kernel launches fail",
                    job.id, job.rec.name, job.rec.user, why)
        if job.region is not None and job.rec.state != ENDED:
            for i in range(len(job.uuids())):
                job.region.update_device(i, throttle=True, refill_rate=0, bucket_size=0)
                job.gates[i] = (True, 0, 0)

    def view(self, job: Job) -> dict[str, Any]:
        """A job as `ps --json` shows it (fields documented in docs/cli.md)."""
        rec = job.rec
        now = self.clock()
        gpu = rec.gpus[0] if rec.gpus else {"index": None, "uuid": None}
        active = rec.state != ENDED
        u = self._dev_usage(job) if active else {}
        pids = sorted(rec.pids) if active else []
        nvml_mem = None
        st = self.stats.get(str(gpu["uuid"]))
        if active and st is not None and st.memory_used is not None:
            nvml_mem = sum(st.processes.get(p, 0) for p in pids)
        begin = rec.started or rec.created
        end = rec.ended if rec.ended is not None else now
        throttled_ns = u.get("throttled_ns")
        return {
            "id": rec.id, "name": rec.name, "user": rec.user, "uid": rec.uid,
            "state": rec.state, "pids": pids,
            "gpu": gpu["index"], "gpu_uuid": gpu["uuid"],
            "mem_limit": rec.mem_limit, "mem_used": u.get("used"), "mem_peak": u.get("peak"),
            "mem_nvml": nvml_mem,
            "over_limit": bool(nvml_mem is not None and nvml_mem > rec.mem_limit),
            "oom_refusals": u.get("oom_refusals"),
            "core": rec.core_share, "core_measured": job.measured.get(str(gpu["uuid"])),
            "policy": rec.policy, "gated_launches": u.get("launches"),
            "throttled_s": None if throttled_ns is None else throttled_ns / 1e9,
            "created": rec.created, "started": rec.started, "ended": rec.ended,
            "runtime_s": max(0.0, end - begin),
            "command": rec.command, "cwd": rec.cwd,
            "exit_code": rec.exit_code, "exit_signal": rec.exit_signal,
            "violations": list(job.violations),
            "slurm_job": rec.slurm_job, "slurm_partition": rec.slurm_partition,
            "slurm_account": rec.slurm_account, "slurm_shards": rec.slurm_shards,
            "region_error": rec.region_error,
        }

    def gpu_views(self) -> list[dict[str, Any]]:
        used = placement.committed(self.commitments())
        out = []
        for g in self.gpus:
            st = self.stats.get(g.uuid)
            out.append({
                "index": g.index, "uuid": g.uuid, "name": g.name, "memory_total": g.total,
                "minor": st.minor if st else None,
                "slurm": self.config.slurm.controls(g.index),
                "memory_used": st.memory_used if st else None,
                "utilization": st.utilization if st else None,
                "committed": used.get(g.uuid, 0),
                "capacity": placement.capacity(g, self.config.reserve,
                                               self.config.oversubscribe),
                "jobs": sum(1 for j in self.jobs.values() if g.uuid in j.uuids()),
            })
        return out

    # -- tracking -----------------------------------------------------------------
    def _slot_seeds(self, job: Job) -> dict[int, int]:
        """Slot pids of the job's region that run as the job's user (the
        usage file is the job's to write: never trust it for anyone else's
        processes)."""
        if job.region is None or not job.region.usage_readable or job.rec.region_error:
            return {}
        out = {}
        try:
            slots = job.region.slot_pids()
        except BadRegion as e:
            self.flag_region(job, str(e))
            return {}
        for pid, start in slots:
            if job.rec.uid == 0 or tracking.proc_uid(pid) == job.rec.uid:
                out[pid] = start
        return out

    def _roots(self) -> set[int]:
        return {j.rec.root_pid for j in self.jobs.values() if j.rec.root_pid is not None}

    def _processes(self, job: Job, table: tracking.ProcTable,
                   children: Mapping[int, list[int]],
                   roots: set[int] | None = None) -> dict[int, int]:
        seeds = dict(job.rec.pids)
        rec = job.rec
        if rec.root_pid is not None and rec.root_start is not None:
            seeds.setdefault(rec.root_pid, rec.root_start)
        seeds.update(self._slot_seeds(job))
        if rec.launcher_pid is not None and tracking.alive(rec.launcher_pid,
                                                            rec.launcher_start, table):
            # `vgpuctl run` is a subreaper: what its command left behind
            # (double-forked, setsid) is re-parented to it, and stays the job's.
            for c in children.get(rec.launcher_pid, ()):
                seeds.setdefault(c, table[c].start)
        # Another job's root below this job's processes is that job's.
        return tracking.job_processes(seeds, table, children,
                                      exclude=self._roots() if roots is None else roots)

    def track(self, table: tracking.ProcTable) -> None:
        """Apply one /proc scan: update each job's processes; end the jobs
        that have none left and no launcher waiting to start them."""
        children = tracking.children_map(table)
        roots = self._roots()
        now = self.clock()
        for job in list(self.jobs.values()):
            rec = job.rec
            if rec.state == STARTING and now - rec.created > self.config.start_timeout_s:
                # Admitted but never started (a launcher that holds the
                # reservation and does nothing): give the memory back.
                log.warning("job %s (%s) of %s did not start within %d s: its reservation "
                            "of %s is released", rec.id, rec.name, rec.user,
                            self.config.start_timeout_s, format_size(rec.mem_limit))
                self.end_job(job)
                continue
            live = self._processes(job, table, children, roots)
            if live != rec.pids:
                rec.pids = live
                self.store.update_job(rec, ["pids"])
            launcher = (rec.launcher_pid is not None
                        and tracking.alive(rec.launcher_pid, rec.launcher_start, table))
            if not live and not launcher and rec.slurm_job is None:
                self.end_job(job)     # a Slurm job ends at its Epilog, not here

    def end_job(self, job: Job) -> None:
        rec = job.rec
        self._remove_region(job)
        rec.state, rec.ended, rec.pids = ENDED, self.clock(), {}
        self.store.update_job(rec, ["state", "ended", "pids"])
        self.jobs.pop(rec.id, None)
        if job.violations:
            self.ended_violations[rec.id] = job.violations
            for old in list(self.ended_violations)[:-ENDED_VIOLATIONS]:
                del self.ended_violations[old]
        if self.on_job_end is not None:
            self.on_job_end(rec.id)
        log.info("job %s (%s) ended (exit %s)", rec.id, rec.name,
                 f"signal {rec.exit_signal}" if rec.exit_signal else rec.exit_code)

    def _remove_region(self, job: Job) -> None:
        if job.region is not None:
            job.region.remove()
            job.region = None
        elif job.rec.region:
            p = Path(job.rec.region)
            if p.parent == self.paths.jobs_dir:
                shutil.rmtree(p, ignore_errors=True)

    def adopt(self, table: tracking.ProcTable) -> None:
        """At start: take back the jobs a previous daemon left running (their
        root, launcher or slot pids alive with the same start time, region
        still on disk); mark the others ended and remove their regions."""
        for rec in self.store.active_jobs():
            job = Job(rec)
            if rec.region:
                try:
                    job.region = Region.open(rec.region, writable_limits=True)
                except (OSError, ValueError) as e:
                    log.warning("job %s: region %s unusable (%s)", rec.id, rec.region, e)
            self.jobs[rec.id] = job
        children = tracking.children_map(table)
        for job in list(self.jobs.values()):
            rec = job.rec
            live = self._processes(job, table, children)
            launcher = (rec.launcher_pid is not None
                        and tracking.alive(rec.launcher_pid, rec.launcher_start, table))
            if job.region is None or (not live and not launcher and rec.slurm_job is None):
                if job.region is None and (live or launcher):
                    log.warning("job %s: processes %s run without a region: not adopted",
                                rec.id, sorted(live))
                self.end_job(job)
                continue
            rec.pids = live
            self.store.update_job(rec, ["pids"])
            log.info("job %s (%s) of %s re-adopted: pids %s", rec.id, rec.name, rec.user,
                     sorted(live) or [rec.launcher_pid])
        self._remove_stray_regions()

    def _remove_stray_regions(self) -> None:
        d = self.paths.jobs_dir
        if not d.is_dir():
            return
        for p in d.iterdir():
            if p.name not in self.jobs and p.name.isdigit():
                log.info("removing the region of ended job %s", p.name)
                shutil.rmtree(p, ignore_errors=True)

    # -- compute ------------------------------------------------------------------
    def gate_inputs(self) -> list[tuple[Job, int, str, dict[str, int]]]:
        """(job, device index, uuid, usage counters) of every running job's GPU."""
        out = []
        for job in self.jobs.values():
            if job.rec.state != RUNNING or job.region is None:
                continue
            for i, u in enumerate(job.uuids()):
                out.append((job, i, u, self._dev_usage(job, i)))
        return out

    def apply_gate(self, job: Job, i: int, uuid: str, throttle: bool, refill_rate: int,
                   bucket_size: int, measured: float | None, target: float | None) -> None:
        if job.region is None or job.rec.state == ENDED:
            return
        if measured is not None:
            job.measured[uuid] = measured
        if target is not None:
            job.target[uuid] = target
        if job.rec.region_error is not None:
            throttle, refill_rate, bucket_size = True, 0, 0   # closed for good
        elif job.rec.core_share >= 100 and job.rec.policy == "hard":
            throttle, refill_rate, bucket_size = False, 0, 0   # no gate: the fast path
        gate = (throttle, refill_rate, bucket_size)
        if job.gates.get(i) != gate:
            job.region.update_device(i, throttle=throttle, refill_rate=refill_rate,
                                     bucket_size=bucket_size)
            job.gates[i] = gate

    # -- violations ---------------------------------------------------------------
    def watch_known(self) -> watch.Known:
        """What the violation watch needs of the jobs, copied for its thread."""
        limits, pids, starts, launchers, slurm = [], {}, {}, {}, {}
        for job in self.jobs.values():
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
        return watch.Known(limits, pids, starts, launchers, slurm)

    def record_violations(self, res: watch.Result) -> None:
        """Apply one check of the watch: fresh NVML figures, and each new
        violation into its job's record (or the strays), the log and the
        counters."""
        self.update_stats(res.stats)
        now = self.clock()
        killed = {v.key for v in res.killed}
        for v in res.new:
            self.violation_totals[v.kind] = self.violation_totals.get(v.kind, 0) + 1
            done = "killed" if v.key in killed else "reported"
            entry = watch.record(v, done, now)
            job = self.jobs.get(v.job_id) if v.job_id is not None else None
            if job is not None:
                job.violation_count += 1
            if job is not None:
                target = job.violations
            elif v.job_id is not None:      # a job that ended since (killed, say)
                target = self.ended_violations.setdefault(v.job_id, [])
            else:
                target = self.strays
            target.append(entry)
            del target[:-MAX_VIOLATIONS]
            log.warning("violation (%s): %s%s", v.kind, v.describe(),
                        f": pid {v.pid} killed" if done == "killed" else "")
        fresh = {v.key for v in res.new}
        for v in res.killed:
            if v.key not in fresh:
                log.debug("violation (%s): pid %d killed again", v.kind, v.pid)

    def update_stats(self, stats: list[GpuStats]) -> None:
        for s in stats:
            self.stats[s.uuid] = s

    def close(self) -> None:
        """Let go of every region (left on disk: the jobs keep running)."""
        for job in self.jobs.values():
            if job.region is not None:
                job.region.close()
                job.region = None
