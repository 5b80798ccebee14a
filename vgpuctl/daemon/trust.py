"""Region trust: the daemon's side of vgpuctl.core.trust. Every tick it reads
each live job's usage counters once (a private copy, validated), checks them
against what the hook can have written, keeps the reading for the views and
the governor, and writes every gate the governor sets, recording each write
in the job's launch ledger. A job found tampering is flagged here and only
here: its counters are ignored from then on and its gate is closed for good.

Views never read a region: they show the last reading (`LiveJob.usage`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping

from vgpuctl.core.job import ENDED, DeviceUsage
from vgpuctl.core.trust import CLOSED, OPEN, Gate, LaunchLedger, check_counters
from vgpuctl.daemon.jobs import JobTable, LiveJob
from vgpuctl.system.procfs import thread_count
from vgpuctl.system.region import MAX_BYTES, BadRegion

log = logging.getLogger("vgpuctl.daemon")


class Trust:
    def __init__(self, table: JobTable, totals: Mapping[str, int],
                 clock: Callable[[], float] = time.monotonic,
                 threads: Callable[[int], int] = thread_count) -> None:
        self._table = table
        self._totals = dict(totals)          # GPU uuid -> its memory
        self._clock = clock
        self._threads = threads

    # -- the ledger ------------------------------------------------------------------
    def watch(self, job: LiveJob) -> None:
        """Start a job's ledgers from the gates its region holds now (a new
        region, or one a previous daemon left)."""
        now = self._clock()
        gates = []
        if job.region is not None:
            for d in job.region.devices():
                gates.append(Gate(d.throttle, d.refill_rate, d.bucket_size))
        job.ledgers = [LaunchLedger(g, now) for g in gates]

    def write_gate(self, job: LiveJob, i: int, gate: Gate) -> None:
        """Write device i's gate into the job's region, when it changed."""
        if job.region is None or job.rec.state == ENDED or i >= len(job.ledgers):
            return
        if job.rec.region_error is not None or job.stopped is not None:
            gate = CLOSED
        ledger = job.ledgers[i]
        if ledger.gate == gate:
            return
        t0 = self._clock()
        job.region.update_device(i, throttle=gate.throttle, refill_rate=gate.refill_rate,
                                 bucket_size=gate.bucket_size)
        ledger.wrote(t0, self._clock(), gate)

    def gate(self, job: LiveJob, i: int) -> Gate:
        return job.ledgers[i].gate if i < len(job.ledgers) else OPEN

    # -- reading -----------------------------------------------------------------------
    def read(self, job: LiveJob) -> list[DeviceUsage]:
        """The job's counters now, per GPU, validated and checked against its
        ledgers; [] when they can't be read or the job was found tampering
        (flagged here). Kept as the job's last reading for its views."""
        reg = job.region
        if reg is None or not reg.usage_readable or job.rec.region_error:
            job.usage = []
            return []
        t0 = self._clock()
        try:
            raw = reg.read_devices()
        except BadRegion as e:
            self.flag(job, str(e))
            return []
        t1 = self._clock()
        uuids = job.uuids()
        devs = [DeviceUsage(used=d.used, peak=d.peak, launches=d.launches,
                            throttled_ns=d.throttled_ns, oom_refusals=d.oom_refusals)
                for d in raw[:len(uuids)]]
        totals = [self._totals.get(u, MAX_BYTES) for u in uuids[:len(devs)]]
        why = check_counters(devs, totals,
                             [job.rec.gpu_mem_limit(i) for i in range(len(devs))])
        if why is None:
            why = self._overrun(job, devs, uuids, t0, t1)
        if why is not None:
            self.flag(job, why)
            return []
        job.usage = [DeviceUsage(used=min(d.used, t), peak=min(d.peak, t), launches=d.launches,
                                 throttled_ns=d.throttled_ns, oom_refusals=d.oom_refusals)
                     for d, t in zip(devs, totals, strict=True)]
        return job.usage

    def _overrun(self, job: LiveJob, devs: list[DeviceUsage], uuids: list[str],
                 t0: float, t1: float) -> str | None:
        for i, d in enumerate(devs):
            if i >= len(job.ledgers):
                break
            over = job.ledgers[i].read(t0, t1, d.launches)
            if over is None:
                continue
            threads = sum(self._threads(p) for p in job.rec.pids) or 1
            if over.proven(threads):
                return over.describe(uuids[i], threads)
            log.debug("job %s: %d gated launches in %.2f s against a bound of %.0f "
                      "(%d threads): within their slack", job.id, over.launched,
                      over.t1 - over.t0, over.bound, threads)
        return None

    def slot_pids(self, job: LiveJob) -> list[tuple[int, int]]:
        """(pid, start time) of the process slots the job's processes claimed
        (anything may be written there: callers check each pid's owner)."""
        reg = job.region
        if reg is None or not reg.usage_readable or job.rec.region_error:
            return []
        try:
            return reg.slot_pids()
        except BadRegion as e:
            self.flag(job, str(e))
            return []

    def stop(self, job: LiveJob, why: str) -> None:
        """The violation watch ends the job (its processes are being
        killed): its gates close for good, so that nothing of it that goes
        through the hook launches again. Not a verdict on its region."""
        if job.stopped is not None:
            return
        job.stopped = why
        for i in range(len(job.ledgers)):
            self.write_gate(job, i, CLOSED)

    # -- the verdict ---------------------------------------------------------------------
    def flag(self, job: LiveJob, why: str) -> None:
        """The job wrote what the hook never writes into its usage region:
        its counters are no longer read, it is flagged (``region_error`` in
        ``ps --json``, its record, the log) and its compute gate closed for
        good: its kernel launches fail. Only this job is affected."""
        if job.rec.region_error is not None:
            return
        job.rec.region_error = why
        job.usage = []
        self._table.save(job, ["region_error"])
        log.warning("job %s (%s) of %s: its usage region was tampered with (%s): "
                    "its counters are ignored and its kernel launches fail",
                    job.id, job.rec.name, job.rec.user, why)
        for i in range(len(job.ledgers)):
            self.write_gate(job, i, CLOSED)
