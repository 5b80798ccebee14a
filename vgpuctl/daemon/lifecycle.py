"""Start, run and stop the daemon: the asyncio shell around the Supervisor.

Start: resolve paths and config (a bad config stops here, before anything
else), take the state dir's lock (one daemon per state dir), open the
database and NVML, re-adopt the jobs a previous daemon left, listen, tell
systemd READY=1. Run: the loops below. SIGHUP re-reads the config (a bad
file keeps the old one); SIGTERM/SIGINT stop the daemon and leave the jobs
running under their last limits, their regions on disk for the next start.

Loops (the blocking parts run in the default executor):
  tick      every tick_ms: each job's counters read once (its GPU time, as
            its hooks measured it), each GPU's turns planned and written
            where they changed, the violation watch (NVML against the jobs),
            accounting samples, the metrics snapshot
  track     every 0.5 s while jobs exist: one /proc scan -> job processes,
            jobs whose processes are all gone end
  inventory every 1 s: NVML memory, utilization and per-process memory; and
            the job changes a failed database write left in memory (a full
            disk) written again
  slurm     every [slurm] reconcile_s while Slurm jobs are registered: jobs
            squeue shows ended (or no longer knows) are released, for an
            Epilog that never came

Nothing at start is a traceback: a state or socket dir that can't be used
(read-only, not ours) or a corrupt database is one StateError line (exit 8).
The database, its -wal and -shm, and the lock are created 0600 whatever the
umask (store/database.py); the process umask stays 022 because what the daemon
shares with jobs (the runtime dirs, regions, socket) gets explicit modes.
"""

from __future__ import annotations

import asyncio
import fcntl
import logging
import os
import signal
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from vgpuctl.core.accounting import Accountant
from vgpuctl.core.config import Config
from vgpuctl.daemon import logs, metrics, partition, sim_setup, tracking
from vgpuctl.daemon.server import Server, listen
from vgpuctl.daemon.supervisor import Supervisor
from vgpuctl.daemon.watch import Watch
from vgpuctl.errors import DaemonConflict, StateError, VgpuError
from vgpuctl.store import retention, usage
from vgpuctl.store.database import Store
from vgpuctl.system import native, notify, paths, scontrol
from vgpuctl.system.busy import DeviceBusy
from vgpuctl.system.config_file import load_daemon_config
from vgpuctl.system.nvml import Nvml

log = logging.getLogger("vgpuctl.daemon")

# How often ended jobs and usage rows past retention_days are pruned.
RETENTION_EVERY_S = 3600.0

TRACK_S = 0.5
INVENTORY_S = 1.0
# The GPUs are read again every this many inventories (MIG devices made or
# destroyed outside vgpuctl; docs/mig.md).
FOLLOW_TICKS = 10
RESUME_S = 1.0      # how often a job waiting for room looks for it


@dataclass
class Options:
    socket: str | None = None
    runtime_dir: str | None = None
    state_dir: str | None = None
    config: str | None = None
    user: bool = False        # the user layout even as root


def resolve(opts: Options) -> tuple[paths.DaemonPaths, Config]:
    user = opts.user or os.geteuid() != 0
    if opts.config:
        cfg_path, optional = paths.absolute(opts.config), False
    else:
        cfg_path, optional = paths.config_file(user)
    config = load_daemon_config(cfg_path, optional)
    dp = paths.daemon_paths(user, socket=opts.socket, runtime_dir=opts.runtime_dir,
                            state_dir=opts.state_dir, config=cfg_path,
                            config_optional=optional,
                            from_config={"socket": config.socket,
                                         "runtime_dir": config.runtime_dir,
                                         "state_dir": config.state_dir})
    return dp, config


def _prepare_dirs(dp: paths.DaemonPaths) -> None:
    os.umask(0o022)
    if dp.system:
        paths.ensure_shared_dir(dp.runtime_dir)
        paths.ensure_shared_dir(dp.jobs_dir)
        try:
            # Owner-only, as systemd's StateDirectoryMode=0700 makes it.
            dp.state_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        except OSError as e:
            raise StateError(f"{dp.state_dir}: {e.strerror}") from None
    else:
        paths.ensure_private_dir(dp.runtime_dir)
        paths.ensure_private_dir(dp.jobs_dir)
        paths.ensure_private_dir(dp.state_dir)


def _lock(dp: paths.DaemonPaths) -> int:
    try:
        fd = os.open(dp.lock, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    except OSError as e:
        raise StateError(f"{dp.lock}: {e.strerror} (the state dir must be writable: "
                         "--state-dir or VGPU_STATE_DIR names another)") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise DaemonConflict(f"another daemon runs with state dir {dp.state_dir}") from None
    try:
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
    except OSError as e:
        os.close(fd)
        raise StateError(f"{dp.lock}: {e.strerror}") from None
    return fd


@contextmanager
def _logged(what: str) -> Iterator[None]:
    """A step of one of the daemon's periodic loops: an error in it is
    logged (`what` failed) and the loop goes on; a cancellation goes through."""
    try:
        yield
    except asyncio.CancelledError:
        raise
    except Exception:
        log.exception("%s failed", what)


class Daemon:
    def __init__(self, dp: paths.DaemonPaths, config: Config) -> None:
        self.dp = dp
        self.config = config
        self.stop_event: asyncio.Event | None = None
        self.accountant: Any = None
        self.metrics: Any = None
        self.metrics_box: Any = None
        self.sim_mark: Any = None
        self._last_metrics = 0.0
        self._tick_errors = 0
        self._write_failing: str | None = None    # the database write error, while it lasts

    def run(self) -> int:
        logs.setup(self.config.log_level)
        _prepare_dirs(self.dp)
        lock_fd = _lock(self.dp)
        try:
            return asyncio.run(self._main())
        finally:
            os.close(lock_fd)

    async def _main(self) -> int:
        loop = asyncio.get_running_loop()
        self.stop_event = asyncio.Event()
        store = self.store = Store.open(self.dp.db)
        store.active_jobs()         # a corrupt jobs table stops the start here, in one line
        nvml = await loop.run_in_executor(None, Nvml)
        self.sim_mark = sim_setup.mark_state()
        devices = await loop.run_in_executor(None, partition.at_start, nvml, self.config.mig)
        sim_set, sim_prepend = sim_setup.job_env()
        sup = Supervisor(self.config, self.dp, store, devices, native.hook_library,
                         sim_env=sim_set, sim_prepend=sim_prepend,
                         context_mem=sim_setup.context_mem())
        self.sup = sup
        sup.nvml = nvml
        # The watch takes each job's GPU time from its hooks and the
        # device's busy time from NVML (exact on the H100; per-process
        # figures are not needed, docs/compute.md): what no hook accounts
        # for is the busy time of the processes that went through none.
        self.watch = Watch(nvml.snapshot, DeviceBusy(nvml.module).read)
        self._start_accounting(store)
        sup.on_config = self._config_changed
        sup.table.on_end.append(lambda job: self._job_ended(job.id))
        sup.on_suspend.append(self._job_suspended)
        sup.update_stats(await loop.run_in_executor(None, nvml.snapshot))
        sup.adopt(await loop.run_in_executor(None, tracking.scan))
        if self.accountant is not None:
            sup.credit_outage(self.accountant, time.time())
        self._start_metrics()
        server = Server(sup)
        try:
            sock = listen(self.dp.socket, 0o666 if self.dp.system else 0o600)
        except OSError as e:
            raise StateError(f"{self.dp.socket}: can't listen: {e.strerror} (the socket's "
                             "dir must be writable: --socket or VGPU_SOCKET names "
                             "another)") from None
        sock_inode = os.stat(self.dp.socket).st_ino
        await server.start(sock)
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.stop_event.set)
        loop.add_signal_handler(signal.SIGHUP, self._sighup)
        log.info("vgpud %s listening on %s (%d GPU%s, %s daemon, config %s)",
                 os.getpid(), self.dp.socket, len(devices), "" if len(devices) == 1 else "s",
                 "system" if self.dp.system else "user", self.config.source)
        notify.ready(f"{len(sup.live_ids())} jobs, {len(devices)} GPUs")
        tasks = [asyncio.ensure_future(c) for c in
                 (self._tick_loop(), self._track_loop(), self._inventory_loop(nvml),
                  self._retention_loop(), self._slurm_loop(), self._resume_loop())]
        try:
            await self.stop_event.wait()
        finally:
            log.info("stopping; %d jobs keep running", len(sup.live_ids()))
            notify.stopping()
            await server.close()
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            self._unlink_socket(sock_inode)
            if self.accountant is not None:
                try:
                    usage.flush(store.conn, self.accountant)
                    sup.checkpoint(self.accountant, time.time())
                except Exception:
                    log.exception("accounting flush failed")
            if self.metrics is not None:
                self.metrics.stop()
            sup.close()
            if store.pending:
                store.retry_pending()
            if store.pending:
                log.error("%d job changes could not be written to %s (%s): lost",
                          len(store.pending), store.path, store.write_error)
            store.close()
            nvml.close()
        return 0

    def _unlink_socket(self, inode: int) -> None:
        """Remove our socket file, unless another daemon has replaced it."""
        try:
            if os.stat(self.dp.socket).st_ino == inode:
                os.unlink(self.dp.socket)
        except OSError:
            pass

    # -- optional parts -----------------------------------------------------------
    def _start_accounting(self, store: Store) -> None:
        try:
            try:
                usage.create_schema(store.conn)
            except StateError as e:
                # Keep what was there for whoever wants to look, and account
                # from now on rather than not at all.
                kept = usage.set_aside(store.conn, time.time())
                log.error("%s: it is kept as table %s in %s, and accounting starts afresh in "
                          "a new usage table (reports miss the rows before now)", e, kept,
                          store.path)
                usage.create_schema(store.conn)
            self.accountant = Accountant()
            # Re-adopted jobs' counters continue.
            active = [r.id for r in store.active_jobs()]
            self.accountant.seed(usage.recorded_gpu_seconds(store.conn, active))
        except Exception as e:
            log.error("accounting off: %s (%s)", e, store.path)

    def _start_metrics(self) -> None:
        if not self.config.metrics_address:
            return
        self.metrics_box = metrics.SnapshotBox()
        self.metrics = metrics.serve(self.config.metrics_address, self.metrics_box.get, log)

    def _config_changed(self, config: Config) -> None:
        self.config = config
        logging.getLogger("vgpuctl").setLevel(config.log_level.upper())

    def _job_ended(self, job_id: str) -> None:
        if self.accountant is not None:
            # A job's GPU time is its hooks' own figure: it trails nothing.
            self.accountant.end_job(job_id, time.time(), 0.0)
            try:   # a report right after the job's end sees all of it
                usage.flush(self.store.conn, self.accountant)
            except StateError as e:
                self._note_write_error(str(e))

    def _job_suspended(self, job: Any, now: float) -> None:
        if self.accountant is not None:
            # Billed up to now; nothing while it is suspended.
            self.accountant.pause(job.id, now)

    def _sighup(self) -> None:
        notify.reloading()
        try:
            self.sup.reload()
        except VgpuError as e:
            log.error("reload failed, keeping the previous configuration: %s", e)
        notify.ready()

    # -- loops --------------------------------------------------------------------
    async def _retention_loop(self) -> None:
        """Apply retention_days at start and every RETENTION_EVERY_S, a batch
        at a time so requests are served in between."""
        while True:
            try:
                await self.apply_retention(time.time())
            except asyncio.CancelledError:
                raise
            except Exception as e:
                log.error("retention failed (will retry): %s", e)
            await asyncio.sleep(RETENTION_EVERY_S)

    async def apply_retention(self, now: float) -> tuple[int, int]:
        """Prune ended jobs and usage rows older than retention_days; returns
        how many of each went."""
        days = self.sup.config.retention_days
        before = retention.cutoff(now, days)
        keep = self.sup.live_ids()
        jobs = rows = 0
        while True:
            j, r = retention.prune_batch(self.store, before, keep)
            jobs, rows = jobs + j, rows + r
            if j < retention.BATCH and r < retention.BATCH:
                break
            await asyncio.sleep(0)
        if jobs or rows:
            log.info("retention: removed %d jobs and %d usage rows older than %d days",
                     jobs, rows, days)
        return jobs, rows

    async def _tick_loop(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            t0 = time.monotonic()
            try:
                await self._tick(loop)
                self._tick_errors = 0
            except asyncio.CancelledError:
                raise
            except Exception:
                self._tick_errors += 1
                if self._tick_errors <= 3 or self._tick_errors % 600 == 0:
                    log.exception("tick failed (%d in a row)", self._tick_errors)
            period = self.sup.config.tick_ms / 1000
            await asyncio.sleep(max(0.0, period - (time.monotonic() - t0)))

    async def _tick(self, loop: asyncio.AbstractEventLoop) -> None:
        sup = self.sup
        inputs = sup.gates.inputs()
        sup.gates.step(inputs)
        if inputs:
            sup.priority.refresh()
        res = await loop.run_in_executor(None, self.watch.check, sup.watch_known(),
                                         sup.config.on_violation, time.time())
        sup.record_violations(res)
        sup.priority.observe(res.stats)
        wall = time.time()
        if self.accountant is not None:
            # Bills: each job's GPU time as its hooks measured it, and what
            # the watch gave it of the device's busy time beyond every hook's
            # claim (its unhooked processes; alone and ungated, the device's);
            # memory as NVML reports its processes'.
            for on in (i.on for i in inputs):
                job = sup.table.find(on.job_id)
                # suspended (or moved) since the tick began: its rows are
                # closed, the time suspended is not billed
                if job is not None and not job.rec.suspended and on.uuid in job.uuids():
                    key = (on.job_id, on.uuid)
                    self.accountant.observe(
                        on.job_id, on.uuid, wall, sup.gates.measured(*key),
                        res.memory.get(key, 0),
                        busy_s=sup.gates.busy_s(*key) + res.beyond.get(key, 0.0))
            try:
                if usage.maybe_flush(self.store.conn, self.accountant, wall):
                    sup.checkpoint(self.accountant, wall)   # a copy and a small file per job
            except StateError as e:
                # Kept in memory by the accountant, written at a later flush.
                self._note_write_error(str(e))
        if self.metrics_box is not None and wall - self._last_metrics >= 1.0:
            self._last_metrics = wall
            acc = self.accountant
            self.metrics_box.set(sup.metrics_snapshot(
                acc.gpu_seconds if acc is not None else (lambda j, u: None)))

    async def _resume_loop(self) -> None:
        """Resume the jobs that wait for room (preempted, drained) as soon as
        a GPU has it."""
        while True:
            await asyncio.sleep(RESUME_S)
            with _logged("resuming waiting jobs"):
                await self.sup.suspender.resume_waiting()

    async def _track_loop(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(TRACK_S)
            if not self.sup.has_jobs():
                continue
            with _logged("process tracking"):
                table = await loop.run_in_executor(None, tracking.scan)
                self.sup.track(table)

    async def _slurm_loop(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            every = self.sup.config.slurm.reconcile_s
            await asyncio.sleep(every or 60)
            asked = self.sup.slurm.registered()
            if not every or not asked:
                continue
            with _logged("Slurm reconciliation"):
                states = await loop.run_in_executor(None, scontrol.job_states)
                if states is None:
                    log.debug("squeue did not answer: Slurm jobs not reconciled")
                else:
                    self.sup.slurm.reconcile(asked, states)

    def _note_write_error(self, why: str | None) -> None:
        """Log a database write error once while it lasts, and its end."""
        if why is not None and self._write_failing is None:
            log.error("can't write %s: %s; job changes and accounting are kept in memory "
                      "and written when it works again", self.store.path, why)
        elif why is None and self._write_failing is not None:
            log.info("%s is writable again: the changes kept in memory are written",
                     self.store.path)
        self._write_failing = why

    def _retry_writes(self) -> None:
        store = self.store
        if store.write_error is not None:     # a write failed since the last call
            self._note_write_error(store.write_error)
            store.write_error = None
        if store.pending:
            store.retry_pending()
            if store.write_error is not None:
                return
        if self._write_failing is not None:
            try:
                if self.accountant is not None:
                    usage.flush(store.conn, self.accountant)
                self._note_write_error(None)
            except StateError:
                pass

    async def _inventory_loop(self, nvml: Nvml) -> None:
        loop = asyncio.get_running_loop()
        ticks = 0
        while True:
            await asyncio.sleep(INVENTORY_S)
            self._retry_writes()
            if self.sim_mark is not None and self.sim_mark.replaced():
                log.error("the simulated GPU's state %s was removed or replaced under the "
                          "daemon: it sees the old one; restart the daemon", self.sim_mark.path)
                self.sim_mark = None
            with _logged("NVML inventory"):
                ticks += 1
                if ticks % FOLLOW_TICKS == 0:
                    said = partition.follow(self.sup, await loop.run_in_executor(None,
                                                                                 nvml.reread))
                    if said:
                        log.warning("%s", said)
                self.sup.update_stats(await loop.run_in_executor(None, nvml.snapshot))


def run(opts: Options) -> int:
    """Run the daemon in the foreground until SIGTERM; returns the exit code.
    Raises VgpuError (bad config, another daemon, no NVML) before serving."""
    dp, config = resolve(opts)
    return Daemon(dp, config).run()
