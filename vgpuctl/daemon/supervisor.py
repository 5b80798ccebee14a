"""The daemon's answer to each request: who may ask what (SO_PEERCRED), and
the parts that do it.

The daemon is split by concern, each part behind a small interface:

- `jobs.JobTable`: the live jobs, and the one place a record changes and is
  written;
- `admission.Admission`: whether a job may start, where, its region and
  environment;
- `slurm.SlurmJobs`: Slurm's jobs (Prolog, TaskProlog, Epilog, squeue);
- `trust.Trust`: the usage regions read and judged, the gates written;
- `tracking.Tracker`: which processes are a job's, and when it has ended;
- `gates.Gates`: each GPU's turns, planned and written; each job's GPU time;
- `violations`: NVML's figures against the jobs (the watch) and their record;
- `views`: what `ps` and the metrics show (pure reads);
- `suspend.Suspender`: suspend, resume, move and drain through the driver's
  checkpoint API (its requests are answered off the event loop's thread).

`Supervisor` builds them and answers requests; the asyncio shell
(lifecycle.py) runs the loops through its methods. Everything here runs on
the event loop's thread; the blocking readers (/proc scans, NVML) run in an
executor and hand their results in.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import signal as _signal
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

from vgpuctl import __version__
from vgpuctl.core import placement
from vgpuctl.core import priority as prio
from vgpuctl.core import protocol as P
from vgpuctl.core.accounting import Accountant
from vgpuctl.core.config import Config
from vgpuctl.core.job import STARTING, promised
from vgpuctl.core.sizes import format_size
from vgpuctl.core.turns import OPEN
from vgpuctl.daemon import logs, metrics, outage, tracking, views
from vgpuctl.daemon import violations as watch
from vgpuctl.daemon.admission import Admission, user_name
from vgpuctl.daemon.gates import Gates
from vgpuctl.daemon.jobs import JobTable, LiveJob
from vgpuctl.daemon.priority import Priorities
from vgpuctl.daemon.slurm import SlurmJobs
from vgpuctl.daemon.suspend import Suspender
from vgpuctl.daemon.tracking import Tracker
from vgpuctl.daemon.trust import Trust
from vgpuctl.errors import (
    AdmissionBusy,
    AdmissionRefused,
    NotFound,
    PermissionDenied,
    RequestInvalid,
    UsageError,
    VgpuError,
)
from vgpuctl.store import reports
from vgpuctl.store.jobs import Store
from vgpuctl.system.config import load_daemon_config
from vgpuctl.system.nvml import GpuStats
from vgpuctl.system.paths import DaemonPaths
from vgpuctl.system.region import Region

log = logging.getLogger("vgpuctl.daemon")

# Usage rows one report request may carry (a row spans up to 5 minutes of
# one job on one GPU: a year of a busy user's jobs is far fewer).
MAX_REPORT_ROWS = 200_000
# Reports a user other than root may ask for a second (each reads the
# window's rows of the database).
REPORT_RATE = 1.0


@dataclass(frozen=True)
class Peer:
    """The process at the other end of a connection (SO_PEERCRED)."""
    pid: int
    uid: int
    gid: int


class Route(NamedTuple):
    """How a request is answered: its op, and whether the op waits (a
    coroutine: driver calls, the database or a /proc scan off the event
    loop's thread) or answers at once."""
    op: Callable[..., Any]
    waits: bool = False


async def _scan_here() -> tracking.ProcTable:
    """A /proc scan on the caller's thread (the server gives the supervisor
    one that runs off the event loop's)."""
    return tracking.scan()


class Supervisor:
    def __init__(self, config: Config, paths: DaemonPaths, store: Store,
                 devices: list[GpuStats], hook_library: Callable[[], Path],
                 clock: Callable[[], float] = time.time,
                 sim_env: Mapping[str, str] | None = None,
                 sim_prepend: Mapping[str, str] | None = None,
                 context_mem: int = placement.CONTEXT_MEM) -> None:
        self.config = config
        self.paths = paths
        self.clock = clock
        self.started = clock()
        self.compute = True             # compute shares are enforced (turns)
        self.on_config: Callable[[Config], None] | None = None
        self.gpus = [placement.Gpu(d.index, d.uuid, d.name, d.memory_total) for d in devices]
        self.stats: dict[str, GpuStats] = {d.uuid: d for d in devices}
        self.table = JobTable(store, paths.jobs_dir, clock)
        self.trust = Trust(self.table, {g.uuid: g.total for g in self.gpus})
        self.admission = Admission(lambda: self.config, self.gpus, self.table, self.trust,
                                   hook_library, clock, sim_env, sim_prepend, context_mem)
        self.slurm = SlurmJobs(lambda: self.config, self.admission, self.table, self.stats)
        self.tracker = Tracker(self.table, self.trust, lambda: self.config)
        self.gates = Gates(self.table, self.trust)
        self.priority = Priorities(self.table, lambda: self.config)
        self.table.on_end.append(lambda job: self.refresh_gpus())
        # Who hears that a job was suspended (the accountant closes its rows).
        self.on_suspend: list[Callable[[LiveJob, float], None]] = []
        self.suspender = Suspender(lambda: self.config, self.gpus, self.table, self.tracker,
                                   self.stats, clock, self._suspended,
                                   allowed=self._may_resume_on)
        self.admission.drained = self.suspender.drained
        self.admission.idle_promises = self._idle_promises
        self.violations = watch.Record()
        # A request that fails on a bug: one line per burst of each op and
        # exception type (logs.Bursts); the traceback at debug level only.
        self.failures = logs.Bursts("request failed (a bug: log_level debug shows where)",
                                    logging.ERROR)
        # Each request's op, and whether it waits (a coroutine, awaited) or
        # answers at once on the event loop's thread.
        self._routes: dict[type, Route] = {
            P.Ping: Route(self.op_ping), P.Run: Route(self.op_run_or_preempt, waits=True),
            P.Started: Route(self.op_started), P.Exited: Route(self.op_exited),
            P.Ps: Route(self.op_ps), P.Set: Route(self.op_set),
            P.Kill: Route(self.op_kill, waits=True), P.Reload: Route(self.op_reload),
            P.Suspend: Route(self.op_suspend, waits=True),
            P.Resume: Route(self.op_resume, waits=True),
            P.Drain: Route(self.op_drain, waits=True),
            P.Report: Route(self.op_report, waits=True),
            P.SlurmRegister: Route(self.op_slurm_register),
            P.SlurmAttach: Route(self.op_slurm_attach),
            P.SlurmRelease: Route(self.op_slurm_release),
        }
        # A fresh /proc scan for `kill` (the server shares one among the
        # requests that wait for it, off the event loop's thread).
        self.scan: Callable[[], Awaitable[tracking.ProcTable]] = _scan_here
        # One report read at a time: a user's flood of them waits its turn
        # rather than reading the database many times over at once.
        self._reports = asyncio.Lock()
        self._report_rate = placement.AdmissionRate()

    def refresh_gpus(self) -> None:
        """The jobs on some GPU changed (admitted, ended, suspended, resumed,
        moved, a share or class set): their turns and classes, written now."""
        self.gates.replan()
        self.priority.refresh()

    def _may_resume_on(self, job: LiveJob) -> set[str]:
        """The GPUs a suspended job may resume on: a Slurm job's own (Slurm
        gave it them), a plain job's those a plain run may use."""
        if job.rec.slurm_job is not None:
            return set(job.uuids())
        sc = self.config.slurm
        return {g.uuid for g in self.gpus if sc.allow_run or not sc.controls(g.index)}

    def _suspended(self, job: LiveJob, now: float) -> None:
        for hear in self.on_suspend:
            hear(job, now)

    # -- requests ---------------------------------------------------------------
    async def reply(self, peer: Peer, line: bytes) -> dict[str, Any]:
        """The reply to one request line, the daemon's one request path: the
        line parsed, the request's op found in the table (`_routes`), awaited
        when it waits (driver calls, the database, a /proc scan: off the
        event loop's thread), its error turned into a reply here and only
        here. Never raises."""
        try:
            req = P.parse_request(line)
        except RequestInvalid as e:
            return P.error("protocol", str(e))
        try:
            op, waits = self._routes[type(req)]
            return await op(peer, req) if waits else op(peer, req)
        except AdmissionBusy as e:      # nothing was done: the client asks again
            return P.error("admission", str(e), retry=True)
        except VgpuError as e:
            return P.error(P.error_code(e), str(e))
        except Exception as e:  # a bug: answer, log one line per burst, keep serving
            return self._internal_error(peer, req, e)

    def _internal_error(self, peer: Peer, req: P.Request, e: Exception) -> dict[str, Any]:
        """A request that failed of a bug: one log line per burst, an answer."""
        what = P.escape_controls(f"{type(e).__name__}: {e}")[:500]
        op = P.op_name(req)
        self.failures.hit(f"{op}/{type(e).__name__}",
                          f"{op} of pid {peer.pid} (uid {peer.uid}): {what}")
        log.debug("request %r failed", req, exc_info=True)
        return P.error("internal", f"internal error: {what}")

    async def op_suspend(self, peer: Peer, req: P.Suspend) -> dict[str, Any]:
        job = self.table.get(req.job)
        self._authorize(peer, job, "suspend")
        async with self.suspender.lock:
            out = await self.suspender.suspend(job, "asked")
        self.refresh_gpus()
        return P.ok(job=self.view(job), outcome=out.wire())

    async def op_resume(self, peer: Peer, req: P.Resume) -> dict[str, Any]:
        job = self.table.get(req.job)
        self._authorize(peer, job, "resume")
        async with self.suspender.lock:
            out = await self.suspender.resume(job, req.gpu)
        self.refresh_gpus()
        return P.ok(job=self.view(job), outcome=out.wire())

    async def op_drain(self, peer: Peer, req: P.Drain) -> dict[str, Any]:
        if not self.is_admin(peer):
            raise PermissionDenied("only root may drain a GPU")
        async with self.suspender.lock:
            was = True
            if req.undo:
                g, was = self.suspender.undrain(req.gpu)
                outcomes = []
            else:
                g = placement.resolve_gpu(self.gpus, req.gpu)
                outcomes = await self.suspender.drain(req.gpu)
        if req.undo and was:
            outcomes = await self.suspender.resume_waiting()
        self.refresh_gpus()
        return P.ok(gpu=g.index, drained=not req.undo, was_drained=was,
                    jobs=[o.wire() for o in outcomes])

    async def op_report(self, peer: Peer, req: P.Report) -> dict[str, Any]:
        """The jobs and usage rows of [since, until) from the daemon's
        database (read on a worker thread): all of them for root, the
        caller's own jobs for anyone else."""
        if req.until <= req.since:
            raise UsageError("--until must be later than --since")
        if not self.is_admin(peer) and not self._report_rate.take(peer.uid, REPORT_RATE,
                                                                  time.monotonic()):
            raise AdmissionBusy(f"uid {peer.uid} asks for reports faster than "
                                f"{REPORT_RATE:g} a second: try again in a moment")
        db = self.paths.db
        bad = [0]
        async with self._reports:
            jobs, usage = await asyncio.to_thread(reports.load, db, req.since, req.until,
                                                  False, bad)
        everyone = self.is_admin(peer)
        if not everyone:
            jobs = [j for j in jobs if j.uid == peer.uid]
            ids = {j.id for j in jobs}
            usage = [u for u in usage if u.job_id in ids]
        if len(usage) > MAX_REPORT_ROWS:
            raise UsageError(f"the window holds {len(usage)} usage rows (at most "
                             f"{MAX_REPORT_ROWS} are sent): give a shorter --since/--until")
        return P.ok(db=str(db), everyone=everyone, bad_rows=bad[0],
                    jobs=[dataclasses.asdict(j) for j in jobs],
                    usage=[dataclasses.asdict(u) for u in usage])

    def is_admin(self, peer: Peer) -> bool:
        return peer.uid == 0 or peer.uid == os.geteuid()

    def _authorize(self, peer: Peer, job: LiveJob, what: str) -> None:
        if peer.uid != job.rec.uid and not self.is_admin(peer):
            raise PermissionDenied(f"job {job.id} belongs to {job.rec.user}: only its owner "
                                   f"or root may {what} it")

    def view(self, job: LiveJob) -> dict[str, Any]:
        return views.live_job(job, self.stats, self.clock()).wire()

    def gpu_views(self) -> list[dict[str, Any]]:
        return [g.wire() for g in views.gpus(self.gpus, self.stats, self.config, self.table,
                                             self.suspender.drained)]

    def op_ping(self, peer: Peer, req: P.Ping) -> dict[str, Any]:
        return P.ok(daemon=self.info())

    def info(self) -> dict[str, Any]:
        return {"pid": os.getpid(), "version": __version__, "uid": os.geteuid(),
                "socket": str(self.paths.socket), "system": self.paths.system,
                "started": self.started, "compute": self.compute,
                "sim": os.environ.get("VGPU_SIM") or None,
                "config": self.config.source, "jobs": len(self.table),
                "config_file": None if self.paths.config is None else str(self.paths.config),
                "slurm": {"shard_size": self.config.slurm.shard_size,
                          "allow_run": self.config.slurm.allow_run}}

    async def op_run_or_preempt(self, peer: Peer, req: P.Run) -> dict[str, Any]:
        """A `run`: admitted as it is when it fits; else, when the job is
        normal or high, of one GPU, and preemption is on, suspend the fewest
        low jobs that make room and admit it (docs/suspend.md)."""
        try:
            return self.op_run(peer, req)
        except AdmissionBusy:
            raise
        except AdmissionRefused as e:
            if (not self.config.priority.preempt
                    or (req.priority or self.config.priority.default) == "low"
                    or (req.gpus or 1) > 1 or (req.gpu is not None and "," in req.gpu)):
                raise
            got = await self.op_run_preempting(peer, req)
            if got is not None:
                return got
            resting = self.suspender.resting(self.admission.run_gpus(req.gpu))
            if resting:
                raise AdmissionRefused(f"{e}; {resting}") from None
            raise

    async def op_run_preempting(self, peer: Peer, req: P.Run) -> dict[str, Any] | None:
        """Admit the job by suspending low jobs for it; None when no GPU can
        be made to fit (the refusal stands)."""
        cfg = self.config
        mem = req.mem if req.mem is not None else cfg.default_mem
        if mem is None:
            return None
        async with self.suspender.lock:
            plan = self.suspender.preemption_plan(self.admission.run_gpus(req.gpu), mem)
            if plan is None:
                return None
            gpu, victims = plan
            ids = [v.id for v in victims]
            # Admitted first, on the room they hold: nothing else can take it
            # while they are suspended.
            if not self.is_admin(peer):
                self._check_cooldown(peer.uid)
            job, warnings = self.admission.run(peer.pid, peer.uid, self.is_admin(peer), req,
                                               make_room=ids, on=gpu.uuid)
            done: list[LiveJob] = []
            try:
                for v in victims:
                    await self.suspender.suspend(v, "preempted")
                    done.append(v)
            except VgpuError as e:
                for v in done:
                    try:
                        await self.suspender.resume(v)
                    except VgpuError as e2:
                        log.warning("job %s, preempted for nothing, stays suspended: %s",
                                    v.id, e2)
                self.table.end(job)
                raise AdmissionRefused(
                    f"no room for {format_size(mem)} on GPU {gpu.index} unless its low jobs "
                    f"{', '.join(ids)} are suspended, and that failed: {e}") from None
        self.refresh_gpus()
        log.info("job %s admitted on GPU %d by suspending low job(s) %s", job.id, gpu.index,
                 ", ".join(ids))
        warnings.append(f"job(s) {', '.join(ids)} of class low on GPU {gpu.index} were "
                        "suspended to make room; they resume by themselves when room returns")
        env, prepend = self.admission.job_env(job)
        return P.ok(job=self.view(job), env=env, prepend=prepend, warnings=warnings)

    def op_run(self, peer: Peer, req: P.Run) -> dict[str, Any]:
        if not self.is_admin(peer):
            self._check_cooldown(peer.uid)
        job, warnings = self.admission.run(peer.pid, peer.uid, self.is_admin(peer), req)
        self.refresh_gpus()     # its neighbours heed it (or it them) from now on
        env, prepend = self.admission.job_env(job)
        return P.ok(job=self.view(job), env=env, prepend=prepend, warnings=warnings)

    def _check_cooldown(self, uid: int) -> None:
        """AdmissionRefused while a user's new jobs are held: their jobs were
        ended for violations cooldown_after times within cooldown_s."""
        cfg = self.config
        now = self.clock()
        until = self.violations.cooldown.held_until(uid, now, cfg.cooldown_after,
                                                    cfg.cooldown_s)
        if until is not None:
            raise AdmissionRefused(
                f"the jobs of {user_name(uid)} were ended for violations "
                f"{cfg.cooldown_after} times within {cfg.cooldown_s} s: new jobs are held "
                f"for another {until - now:.0f} s (cooldown_s in the daemon's configuration)")

    def op_started(self, peer: Peer, req: P.Started) -> dict[str, Any]:
        job = self.table.get(req.job)
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
        self.table.started(job, req.pid, start, tracking.start_time(req.pid) is not None)
        return P.ok(job=self.view(job))

    def op_exited(self, peer: Peer, req: P.Exited) -> dict[str, Any]:
        job = self.table.get(req.job)
        self._authorize(peer, job, "end")
        if job.rec.slurm_job is not None:
            raise UsageError(f"job {job.id} is Slurm job {job.rec.slurm_job}'s: it ends at "
                             "its Epilog")
        self.table.launcher_exited(job, req.code, req.signal)
        # The command's own process is gone: end the job now unless something
        # it left behind still runs (the next pass looks for descendants).
        if not self.tracker.any_alive(job):
            self.table.end(job)
        return P.ok()

    def op_ps(self, peer: Peer, req: P.Ps) -> dict[str, Any]:
        now = self.clock()
        show = views.viewer(peer.uid, self.is_admin(peer), self.config.public_commands)
        if req.job is not None:
            job = self.table.find(req.job)
            if job is not None:
                jobs = [views.live_job(job, self.stats, now)]
            else:
                rec = self.table.record(req.job)
                if rec is None:
                    raise NotFound(f"no job {req.job}")
                jobs = [views.ended_job(rec, self.table.ended_violations(rec.id), now)]
        else:
            jobs = []
            if req.all:
                jobs = [views.ended_job(r, self.table.ended_violations(r.id), now)
                        for r in self.table.ended()]
            jobs += [views.live_job(j, self.stats, now)
                     for j in sorted(self.table, key=lambda j: int(j.id))]
        return P.ok(daemon=self.info(), gpus=self.gpu_views(),
                    jobs=[show(j).wire() for j in jobs],
                    violations=list(self.violations.strays))

    def op_set(self, peer: Peer, req: P.Set) -> dict[str, Any]:
        job = self.table.get(req.job)
        self._authorize(peer, job, "change")
        rec = job.rec
        if rec.slurm_job is not None and not self.is_admin(peer):
            raise PermissionDenied(f"job {job.id} is Slurm job {rec.slurm_job}'s: its "
                                   "limits are its shards, only root may change them")
        if (req.mem is None and req.core is None and req.policy is None
                and req.priority is None):
            raise UsageError("nothing to change: give --mem, --core, --policy or --priority")
        self._check_set(peer, job, req)
        changes = self.table.change_limits(job, req.mem, req.core, req.policy, req.priority)
        self.refresh_gpus()
        warnings = [w for w in [self._over_new_limit(job, req.mem)] if w]
        log.info("job %s changed by uid %d: %s", rec.id, peer.uid,
                 ", ".join(f"{k}={v}" for k, v in changes.items()))
        return P.ok(job=self.view(job), warnings=warnings)

    def _check_set(self, peer: Peer, job: LiveJob, req: P.Set) -> None:
        """Whether the change may be made: a user's maxima and total, a
        class raised only by root, the room on its GPUs, the shares promised."""
        rec = job.rec
        admin = self.is_admin(peer)
        if not admin:
            limits = self.config.limits_for(rec.user, rec.uid)
            placement.check_user_limits(limits, rec.user, req.mem, req.core)
            if req.mem is not None and req.mem > rec.mem_limit:
                placement.check_user_total(limits, rec.user, self.table.held_by(rec.uid),
                                           (req.mem - rec.mem_limit) * max(1, len(rec.gpus)),
                                           self.admission.node_capacity())
        if req.priority is not None:
            # a user may lower their job's class, only root may raise it
            prio.check_change(rec.priority, req.priority, job.id, admin)
        if req.mem is not None and req.mem > rec.mem_limit:
            self.admission.check_resize(job, req.mem)
        cls = req.priority or rec.priority
        core = req.core if req.core is not None else (rec.core_share if rec.core_promised
                                                      else None)
        if core is not None and prio.promises(cls):
            self.admission.check_core(job, core)

    def _over_new_limit(self, job: LiveJob, mem: int | None) -> str | None:
        """The warning for a limit set below what the job holds."""
        usage = self.trust.read(job) if mem is not None else []
        used = max(u.used for u in usage) if usage else None
        if mem is None or used is None or used <= mem:
            return None
        return (f"job {job.id} holds {format_size(used)}, more than its new limit of "
                f"{format_size(mem)}: it keeps what it holds, and its allocations "
                f"fail until it is back under the limit")

    async def op_kill(self, peer: Peer, req: P.Kill) -> dict[str, Any]:
        job = self.table.get(req.job)
        self._authorize(peer, job, "kill")
        try:
            sig = _signal.Signals(req.signal)
        except ValueError:
            raise UsageError(f"no signal {req.signal}") from None
        try:
            table = await self.scan()
        except OSError as e:
            raise VgpuError(f"could not read /proc: {e}") from None
        done = []
        for pid in sorted(self.tracker.processes(job, table)):
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

    # -- Slurm ------------------------------------------------------------------------
    def op_slurm_register(self, peer: Peer, req: P.SlurmRegister) -> dict[str, Any]:
        if peer.uid != 0 and not (self.is_admin(peer) and req.uid == peer.uid):
            raise PermissionDenied("only root may register a Slurm job (from its Prolog)")
        job, existing = self.slurm.register(req)
        self.refresh_gpus()
        return P.ok(job=self.view(job), existing=existing)

    def op_slurm_attach(self, peer: Peer, req: P.SlurmAttach) -> dict[str, Any]:
        job = self.slurm.attached(req.slurm_job, peer.uid, self.is_admin(peer))
        self._authorize(peer, job, "attach to")
        if req.pid is not None:
            self.tracker.add_pid(job, req.pid)
        env, prepend = self.admission.job_env(job)
        return P.ok(job=self.view(job), env=env, prepend=prepend)

    def op_slurm_release(self, peer: Peer, req: P.SlurmRelease) -> dict[str, Any]:
        if not self.is_admin(peer):
            raise PermissionDenied("only root may release a Slurm job (from its Epilog)")
        return P.ok(released=self.slurm.release(req.slurm_job))

    # -- what the loops call ------------------------------------------------------------
    def adopt(self, table: tracking.ProcTable) -> None:
        """At start: take back the jobs a previous daemon left running (their
        root, launcher or slot pids alive with the same start time, region
        still on disk); mark the others ended and remove their regions."""
        for rec in self.table.unended():
            region = None
            if rec.region:
                try:
                    region = Region.open(rec.region, writable_limits=True)
                except (OSError, ValueError) as e:
                    log.warning("job %s: region %s unusable (%s)", rec.id, rec.region, e)
            self.trust.watch(self.table.add(rec, region))
        self.tracker.adopt(table)

    def track(self, table: tracking.ProcTable) -> None:
        self.tracker.track(table, self.clock())

    def watch_known(self) -> watch.Known:
        hooked: dict[int, int] = {}
        for job in self.table:
            hooked.update(self.tracker.slot_seeds(job))
        return watch.known(self.table, self.config.reserve, hooked)

    def _idle_promises(self, uuids: set[str]) -> list[LiveJob]:
        """The jobs with a promised share on any of these GPUs that have run
        nothing there for promise_idle_s: no launch counted by their hooks,
        no process of theirs listed by NVML, since then (or since they
        started); the most idle first."""
        wait = self.config.promise_idle_s
        if wait <= 0:
            return []
        mono, wall = time.monotonic(), self.clock()
        found = []
        for job in self.table:
            rec = job.rec
            if not promised(rec) or rec.suspended or not set(job.uuids()) & uuids:
                continue
            idle = wall - rec.start
            for u in job.uuids():
                for t in (self.gates.last_launch(job.id, u), job.seen_at.get(u)):
                    if t is not None:
                        idle = min(idle, mono - t)
            if idle >= wait:
                found.append((idle, job))
        return [j for _, j in sorted(found, key=lambda x: -x[0])]

    def record_violations(self, res: watch.Result) -> None:
        """Apply one check of the watch: fresh NVML figures, and each new
        violation into its job's record (or the strays), the log and the
        counters."""
        self.update_stats(res.stats)
        mono = time.monotonic()
        listed = {(s.uuid, p) for s in res.stats for p in s.processes}
        for job in self.table:
            for u in job.uuids():
                if any((u, p) in listed for p in job.rec.pids):
                    job.seen_at[u] = mono
        for job in self.table:
            job.held = {u: res.memory.get((job.id, u), 0) for u in job.uuids()}
            for i, u in enumerate(job.uuids()):
                # ungated (alone on its GPU): its share is the device's
                if self.trust.gate(job, i).gate == OPEN and (job.id, u) in res.share:
                    job.measured[u] = res.share[(job.id, u)]
            job.peak_debt = max(job.peak_debt, res.debts.get(job.id, 0.0))
        self.violations.apply(res, self.table, self.clock(), self.trust.stop)

    def metrics_snapshot(self, gpu_seconds: Callable[[str, str], float | None]) -> Any:
        now = self.clock()
        jobs = [(views.live_job(j, self.stats, now), j.violation_count) for j in self.table]
        return metrics.snapshot(views.gpus(self.gpus, self.stats, self.config, self.table,
                                           self.suspender.drained),
                                jobs, gpu_seconds, self.violations.totals)

    def checkpoint(self, acc: Accountant, wall: float) -> None:
        outage.checkpoint(self.table, acc, wall)

    def credit_outage(self, acc: Accountant, now: float) -> None:
        """At start, after re-adoption: each job's use while no daemon ran,
        its memory from NVML's figures for its processes now."""
        held = {}
        for job in self.table:
            for u in job.uuids():
                st = self.stats.get(u)
                if st is not None:
                    held[(job.id, u)] = sum(st.processes.get(p, 0) for p in job.rec.pids)
        outage.credit(self.table, acc, now, held, self.trust.flag)

    def has_jobs(self) -> bool:
        return len(self.table) > 0

    def live_ids(self) -> set[str]:
        return {j.id for j in self.table}

    def update_stats(self, stats: list[GpuStats]) -> None:
        for s in stats:
            self.stats[s.uuid] = s

    def close(self) -> None:
        """Let go of every region (left on disk: the jobs keep running)."""
        self.table.close()
