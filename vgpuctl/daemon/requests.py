"""The daemon's requests: each request type's op, and the table the
supervisor answers them by (`ROUTES`: one path, Supervisor.reply). An op
takes the supervisor (the parts it asks), the peer (who asks: SO_PEERCRED)
and the request; it returns the reply or raises a VgpuError, which
Supervisor.reply turns into the error reply.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import signal as _signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple

from vgpuctl.core import classes, placement
from vgpuctl.core import protocol as P
from vgpuctl.core.job import STARTING
from vgpuctl.core.sizes import format_size
from vgpuctl.daemon import partition, tracking, views
from vgpuctl.daemon.admission import user_name
from vgpuctl.daemon.jobs import LiveJob
from vgpuctl.errors import (
    AdmissionBusy,
    AdmissionRefused,
    NotFound,
    PermissionDenied,
    UsageError,
    VgpuError,
)
from vgpuctl.store import reports

if TYPE_CHECKING:
    from vgpuctl.daemon.supervisor import Supervisor

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


async def op_suspend(sup: Supervisor, peer: Peer, req: P.Suspend) -> dict[str, Any]:
    job = sup.table.get(req.job)
    authorize(sup, peer, job, "suspend")
    async with sup.suspender.lock:
        out = await sup.suspender.suspend(job, "asked")
    sup.refresh_gpus()
    return P.ok(job=sup.view(job), outcome=out.wire())


async def op_resume(sup: Supervisor, peer: Peer, req: P.Resume) -> dict[str, Any]:
    job = sup.table.get(req.job)
    authorize(sup, peer, job, "resume")
    async with sup.suspender.lock:
        out = await sup.suspender.resume(job, req.gpu)
    sup.refresh_gpus()
    return P.ok(job=sup.view(job), outcome=out.wire())


async def op_drain(sup: Supervisor, peer: Peer, req: P.Drain) -> dict[str, Any]:
    if not sup.is_admin(peer):
        raise PermissionDenied("only root may drain a GPU")
    async with sup.suspender.lock:
        was = True
        if req.undo:
            g, was = sup.suspender.undrain(req.gpu)
            outcomes = []
        else:
            g = placement.resolve_gpu(sup.gpus, req.gpu)
            outcomes = await sup.suspender.drain(req.gpu)
    if req.undo and was:
        outcomes = await sup.suspender.resume_waiting()
    sup.refresh_gpus()
    return P.ok(gpu=g.index, drained=not req.undo, was_drained=was,
                jobs=[o.wire() for o in outcomes])


async def op_report(sup: Supervisor, peer: Peer, req: P.Report) -> dict[str, Any]:
    """The jobs and usage rows of [since, until) from the daemon's
    database (read on a worker thread): all of them for root, the
    caller's own jobs for anyone else."""
    if req.until <= req.since:
        raise UsageError("--until must be later than --since")
    if not sup.is_admin(peer) and not sup.report_rate.take(peer.uid, REPORT_RATE,
                                                              time.monotonic()):
        raise AdmissionBusy(f"uid {peer.uid} asks for reports faster than "
                            f"{REPORT_RATE:g} a second: try again in a moment")
    db = sup.paths.db
    bad = [0]
    async with sup.reports_lock:
        jobs, usage = await asyncio.to_thread(reports.load, db, req.since, req.until,
                                              False, bad)
    everyone = sup.is_admin(peer)
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


def authorize(sup: Supervisor, peer: Peer, job: LiveJob, what: str) -> None:
    if peer.uid != job.rec.uid and not sup.is_admin(peer):
        raise PermissionDenied(f"job {job.id} belongs to {job.rec.user}: only its owner "
                               f"or root may {what} it")


def op_ping(sup: Supervisor, peer: Peer, req: P.Ping) -> dict[str, Any]:
    return P.ok(daemon=sup.info())


async def op_run_or_preempt(sup: Supervisor, peer: Peer, req: P.Run) -> dict[str, Any]:
    """A `run`: admitted as it is when it fits; else, when the job is
    normal or high, of one GPU, and preemption is on, suspend the fewest
    low jobs that make room and admit it (docs/suspend.md)."""
    try:
        return op_run(sup, peer, req)
    except AdmissionBusy:
        raise
    except AdmissionRefused as e:
        if (not sup.config.priority.preempt
                or (req.priority or sup.config.priority.default) == "low"
                or (req.gpus or 1) > 1 or (req.gpu is not None and "," in req.gpu)):
            raise
        got = await op_run_preempting(sup, peer, req)
        if got is not None:
            return got
        resting = sup.suspender.resting(sup.admission.run_gpus(req.gpu))
        if resting:
            raise AdmissionRefused(f"{e}; {resting}") from None
        raise


async def op_run_preempting(sup: Supervisor, peer: Peer, req: P.Run) -> dict[str, Any] | None:
    """Admit the job by suspending low jobs for it; None when no GPU can
    be made to fit (the refusal stands)."""
    cfg = sup.config
    mem = req.mem if req.mem is not None else cfg.default_mem
    if mem is None:
        return None
    async with sup.suspender.lock:
        plan = sup.suspender.preemption_plan(sup.admission.run_gpus(req.gpu), mem)
        if plan is None:
            return None
        gpu, victims = plan
        ids = [v.id for v in victims]
        # Admitted first, on the room they hold: nothing else can take it
        # while they are suspended.
        if not sup.is_admin(peer):
            check_cooldown(sup, peer.uid)
        job, warnings = sup.admission.run(peer.pid, peer.uid, sup.is_admin(peer), req,
                                           make_room=ids, on=gpu.uuid)
        done: list[LiveJob] = []
        try:
            for v in victims:
                await sup.suspender.suspend(v, "preempted")
                done.append(v)
        except VgpuError as e:
            for v in done:
                try:
                    await sup.suspender.resume(v)
                except VgpuError as e2:
                    log.warning("job %s, preempted for nothing, stays suspended: %s",
                                v.id, e2)
            sup.table.end(job)
            raise AdmissionRefused(
                f"no room for {format_size(mem)} on GPU {gpu.index} unless its low jobs "
                f"{', '.join(ids)} are suspended, and that failed: {e}") from None
    sup.refresh_gpus()
    log.info("job %s admitted on GPU %d by suspending low job(s) %s", job.id, gpu.index,
             ", ".join(ids))
    warnings.append(f"job(s) {', '.join(ids)} of class low on GPU {gpu.index} were "
                    "suspended to make room; they resume by themselves when room returns")
    env, prepend = sup.admission.job_env(job)
    return P.ok(job=sup.view(job), env=env, prepend=prepend, warnings=warnings)


def op_run(sup: Supervisor, peer: Peer, req: P.Run) -> dict[str, Any]:
    if not sup.is_admin(peer):
        check_cooldown(sup, peer.uid)
    job, warnings = sup.admission.run(peer.pid, peer.uid, sup.is_admin(peer), req)
    sup.refresh_gpus()     # its neighbours heed it (or it them) from now on
    env, prepend = sup.admission.job_env(job)
    return P.ok(job=sup.view(job), env=env, prepend=prepend, warnings=warnings)


def check_cooldown(sup: Supervisor, uid: int) -> None:
    """AdmissionRefused while a user's new jobs are held: their jobs were
    ended for violations cooldown_after times within cooldown_s."""
    cfg = sup.config
    now = sup.clock()
    until = sup.violations.cooldown.held_until(uid, now, cfg.cooldown_after,
                                                cfg.cooldown_s)
    if until is not None:
        raise AdmissionRefused(
            f"the jobs of {user_name(uid)} were ended for violations "
            f"{cfg.cooldown_after} times within {cfg.cooldown_s} s: new jobs are held "
            f"for another {until - now:.0f} s (cooldown_s in the daemon's configuration)")


def op_started(sup: Supervisor, peer: Peer, req: P.Started) -> dict[str, Any]:
    job = sup.table.get(req.job)
    authorize(sup, peer, job, "start")
    if job.rec.state != STARTING:
        raise UsageError(f"job {job.id} has already started")
    start = tracking.start_time(req.pid)
    if start is None:
        st = tracking.read_stat(req.pid)   # a zombie (exited already) still names itself
        start = st[1] if st else None
    uid = tracking.proc_uid(req.pid)
    if start is not None and uid != job.rec.uid and job.rec.uid != 0:
        raise PermissionDenied(f"process {req.pid} does not run as {job.rec.user}")
    sup.table.started(job, req.pid, start, tracking.start_time(req.pid) is not None)
    return P.ok(job=sup.view(job))


def op_exited(sup: Supervisor, peer: Peer, req: P.Exited) -> dict[str, Any]:
    job = sup.table.get(req.job)
    authorize(sup, peer, job, "end")
    if job.rec.slurm_job is not None:
        raise UsageError(f"job {job.id} is Slurm job {job.rec.slurm_job}'s: it ends at "
                         "its Epilog")
    sup.table.launcher_exited(job, req.code, req.signal)
    # The command's own process is gone: end the job now unless something
    # it left behind still runs (the next pass looks for descendants).
    if not sup.tracker.any_alive(job):
        sup.table.end(job)
    return P.ok()


def op_ps(sup: Supervisor, peer: Peer, req: P.Ps) -> dict[str, Any]:
    now = sup.clock()
    show = views.viewer(peer.uid, sup.is_admin(peer), sup.config.public_commands)
    if req.job is not None:
        job = sup.table.find(req.job)
        if job is not None:
            jobs = [views.live_job(job, sup.stats, now)]
        else:
            rec = sup.table.record(req.job)
            if rec is None:
                raise NotFound(f"no job {req.job}")
            jobs = [views.ended_job(rec, sup.table.ended_violations(rec.id), now)]
    else:
        jobs = []
        if req.all:
            jobs = [views.ended_job(r, sup.table.ended_violations(r.id), now)
                    for r in sup.table.ended()]
        jobs += [views.live_job(j, sup.stats, now)
                 for j in sorted(sup.table, key=lambda j: int(j.id))]
    return P.ok(daemon=sup.info(), gpus=sup.gpu_views(),
                jobs=[show(j).wire() for j in jobs],
                violations=list(sup.violations.strays))


def op_set(sup: Supervisor, peer: Peer, req: P.Set) -> dict[str, Any]:
    job = sup.table.get(req.job)
    authorize(sup, peer, job, "change")
    rec = job.rec
    if rec.slurm_job is not None and not sup.is_admin(peer):
        raise PermissionDenied(f"job {job.id} is Slurm job {rec.slurm_job}'s: its "
                               "limits are its shards, only root may change them")
    if (req.mem is None and req.core is None and req.policy is None
            and req.priority is None):
        raise UsageError("nothing to change: give --mem, --core, --policy or --priority")
    _check_set(sup, peer, job, req)
    changes = sup.table.change_limits(job, req.mem, req.core, req.policy, req.priority)
    sup.refresh_gpus()
    warnings = [w for w in [_over_new_limit(sup, job, req.mem)] if w]
    log.info("job %s changed by uid %d: %s", rec.id, peer.uid,
             ", ".join(f"{k}={v}" for k, v in changes.items()))
    return P.ok(job=sup.view(job), warnings=warnings)


def _check_set(sup: Supervisor, peer: Peer, job: LiveJob, req: P.Set) -> None:
    """Whether the change may be made: a user's maxima and total, a
    class raised only by root, the room on its GPUs, the shares promised."""
    rec = job.rec
    admin = sup.is_admin(peer)
    if not admin:
        limits = sup.config.limits_for(rec.user, rec.uid)
        placement.check_user_limits(limits, rec.user, req.mem, req.core)
        if req.mem is not None and req.mem > rec.mem_limit:
            placement.check_user_total(limits, rec.user, sup.table.held_by(rec.uid),
                                       (req.mem - rec.mem_limit) * max(1, len(rec.gpus)),
                                       sup.admission.node_capacity())
    if req.priority is not None:
        # a user may lower their job's class, only root may raise it
        classes.check_change(rec.priority, req.priority, job.id, admin)
    if req.mem is not None and req.mem > rec.mem_limit:
        sup.admission.check_resize(job, req.mem)
    cls = req.priority or rec.priority
    core = req.core if req.core is not None else (rec.core_share if rec.core_promised
                                                  else None)
    if core is not None and classes.promises(cls):
        sup.admission.check_core(job, core)


def _over_new_limit(sup: Supervisor, job: LiveJob, mem: int | None) -> str | None:
    """The warning for a limit set below what the job holds."""
    usage = sup.trust.read(job) if mem is not None else []
    used = max(u.used for u in usage) if usage else None
    if mem is None or used is None or used <= mem:
        return None
    return (f"job {job.id} holds {format_size(used)}, more than its new limit of "
            f"{format_size(mem)}: it keeps what it holds, and its allocations "
            f"fail until it is back under the limit")


async def op_kill(sup: Supervisor, peer: Peer, req: P.Kill) -> dict[str, Any]:
    job = sup.table.get(req.job)
    authorize(sup, peer, job, "kill")
    try:
        sig = _signal.Signals(req.signal)
    except ValueError:
        raise UsageError(f"no signal {req.signal}") from None
    try:
        table = await sup.scan()
    except OSError as e:
        raise VgpuError(f"could not read /proc: {e}") from None
    done = []
    for pid in sorted(sup.tracker.processes(job, table)):
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


def op_reload(sup: Supervisor, peer: Peer, req: P.Reload) -> dict[str, Any]:
    if not sup.is_admin(peer):
        raise PermissionDenied("only root may reload the daemon's configuration")
    try:
        sup.reload()
    except VgpuError as e:
        log.error("reload failed, keeping the previous configuration: %s", e)
        raise
    return P.ok(config=sup.config.source)

# -- Slurm ------------------------------------------------------------------------


def op_slurm_register(sup: Supervisor, peer: Peer, req: P.SlurmRegister) -> dict[str, Any]:
    if peer.uid != 0 and not (sup.is_admin(peer) and req.uid == peer.uid):
        raise PermissionDenied("only root may register a Slurm job (from its Prolog)")
    job, existing = sup.slurm.register(req)
    sup.refresh_gpus()
    return P.ok(job=sup.view(job), existing=existing)


def op_slurm_attach(sup: Supervisor, peer: Peer, req: P.SlurmAttach) -> dict[str, Any]:
    job = sup.slurm.attached(req.slurm_job, peer.uid, sup.is_admin(peer))
    authorize(sup, peer, job, "attach to")
    if req.pid is not None:
        sup.tracker.add_pid(job, req.pid)
    env, prepend = sup.admission.job_env(job)
    return P.ok(job=sup.view(job), env=env, prepend=prepend)


def op_slurm_release(sup: Supervisor, peer: Peer, req: P.SlurmRelease) -> dict[str, Any]:
    if not sup.is_admin(peer):
        raise PermissionDenied("only root may release a Slurm job (from its Epilog)")
    return P.ok(released=sup.slurm.release(req.slurm_job))


# Each request's op, and whether it waits (a coroutine, awaited) or answers
# at once on the event loop's thread.
ROUTES: dict[type, Route] = {
    P.Ping: Route(op_ping), P.Run: Route(op_run_or_preempt, waits=True),
    P.Started: Route(op_started), P.Exited: Route(op_exited),
    P.Ps: Route(op_ps), P.Set: Route(op_set),
    P.Kill: Route(op_kill, waits=True), P.Reload: Route(op_reload),
    P.Suspend: Route(op_suspend, waits=True), P.Resume: Route(op_resume, waits=True),
    P.Drain: Route(op_drain, waits=True), P.Report: Route(op_report, waits=True),
    P.Mig: Route(partition.op_mig, waits=True),
    P.SlurmRegister: Route(op_slurm_register), P.SlurmAttach: Route(op_slurm_attach),
    P.SlurmRelease: Route(op_slurm_release),
}
