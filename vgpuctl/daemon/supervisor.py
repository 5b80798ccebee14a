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
- `watch`: NVML's figures against the jobs (the watch) and their record;
- `views`: what `ps` and the metrics show (pure reads);
- `holds.Priorities`: the classes' holds written into the jobs' limits;
- `suspend.Suspender`: suspend, resume, move and drain through the driver's
  checkpoint API (its requests are answered off the event loop's thread).

`Supervisor` builds them and answers requests (each request's op is in
requests.py); the asyncio shell
(lifecycle.py) runs the loops through its methods. Everything here runs on
the event loop's thread; the blocking readers (/proc scans, NVML) run in an
executor and hand their results in.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any

from vgpuctl import __version__
from vgpuctl.core import placement
from vgpuctl.core import protocol as P
from vgpuctl.core.accounting import Accountant
from vgpuctl.core.config import Config
from vgpuctl.core.job import promised
from vgpuctl.core.turns import OPEN
from vgpuctl.daemon import logs, metrics, outage, requests, tracking, views, watch
from vgpuctl.daemon.admission import Admission
from vgpuctl.daemon.gates import Gates
from vgpuctl.daemon.holds import Priorities
from vgpuctl.daemon.jobs import JobTable, LiveJob
from vgpuctl.daemon.requests import Peer
from vgpuctl.daemon.slurm import SlurmJobs
from vgpuctl.daemon.suspend import Suspender
from vgpuctl.daemon.tracking import Tracker
from vgpuctl.daemon.trust import Trust
from vgpuctl.errors import (
    AdmissionBusy,
    RequestInvalid,
    VgpuError,
)
from vgpuctl.store.database import Store
from vgpuctl.system.config_file import load_daemon_config
from vgpuctl.system.nvml import GpuStats
from vgpuctl.system.paths import DaemonPaths
from vgpuctl.system.region import Region

log = logging.getLogger("vgpuctl.daemon")


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
        self.gpus = [d.as_gpu() for d in devices]
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
        # A fresh /proc scan for `kill` (the server shares one among the
        # requests that wait for it, off the event loop's thread).
        self.scan: Callable[[], Awaitable[tracking.ProcTable]] = _scan_here
        # One report read at a time: a user's flood of them waits its turn
        # rather than reading the database many times over at once.
        self.reports_lock = asyncio.Lock()
        self.report_rate = placement.AdmissionRate()
        # NVML (the daemon's; None in tests that build a supervisor alone):
        # `vgpuctl mig` makes and destroys MIG devices through it.
        self.nvml: Any = None

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
        line parsed, the request's op found in `requests.ROUTES`, awaited
        when it waits (driver calls, the database, a /proc scan: off the
        event loop's thread), its error turned into a reply here and only
        here. Never raises."""
        try:
            req = P.parse_request(line)
        except RequestInvalid as e:
            return P.error("protocol", str(e))
        try:
            op, waits = requests.ROUTES[type(req)]
            return await op(self, peer, req) if waits else op(self, peer, req)
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

    def is_admin(self, peer: Peer) -> bool:
        return peer.uid == 0 or peer.uid == os.geteuid()

    def view(self, job: LiveJob) -> dict[str, Any]:
        return views.live_job(job, self.stats, self.clock()).wire()

    def gpu_views(self) -> list[dict[str, Any]]:
        return [g.wire() for g in views.gpus(self.gpus, self.stats, self.config, self.table,
                                             self.suspender.drained)]

    def info(self) -> dict[str, Any]:
        return {"pid": os.getpid(), "version": __version__, "uid": os.geteuid(),
                "socket": str(self.paths.socket), "system": self.paths.system,
                "started": self.started, "compute": self.compute,
                "sim": os.environ.get("VGPU_SIM") or None,
                "config": self.config.source, "jobs": len(self.table),
                "config_file": None if self.paths.config is None else str(self.paths.config),
                "slurm": {"shard_size": self.config.slurm.shard_size,
                          "allow_run": self.config.slurm.allow_run}}

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
        jobs = [(*views.live_job_parts(j, self.stats, now), j.violation_count)
                for j in self.table]
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

    def set_gpus(self, devices: list[GpuStats]) -> None:
        """The GPUs are now these (MIG devices were made or destroyed): every
        part that places, moves or checks jobs holds the one list, changed
        in place."""
        self.gpus[:] = [d.as_gpu() for d in devices]
        self.trust.set_totals({g.uuid: g.total for g in self.gpus})
        gone = set(self.stats) - {d.uuid for d in devices}
        for u in gone:
            del self.stats[u]
        self.update_stats(devices)

    def close(self) -> None:
        """Let go of every region (left on disk: the jobs keep running)."""
        self.table.close()
