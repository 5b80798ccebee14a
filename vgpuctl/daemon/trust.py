"""Region trust: the daemon's side of vgpuctl.core.trust. Every tick it reads
each live job's usage counters once (bounded preads, validated), checks them
against what the hook can have written, keeps the reading for the views and
the governor, and writes every gate the governor sets. A job found tampering
is flagged here and only here: its counters are ignored from then on and its
gate is closed for good.

Views never read a region: they show the last reading (`LiveJob.usage`).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from vgpuctl.core.job import ENDED, DeviceUsage
from vgpuctl.core.trust import CLOSED, OPEN, Gate, check_counters
from vgpuctl.daemon.jobs import JobTable, LiveJob
from vgpuctl.system.region import MAX_BYTES, BadRegion

log = logging.getLogger("vgpuctl.daemon")


class Trust:
    def __init__(self, table: JobTable, totals: Mapping[str, int]) -> None:
        self._table = table
        self._totals = dict(totals)          # GPU uuid -> its memory

    # -- gates -------------------------------------------------------------------------
    def watch(self, job: LiveJob) -> None:
        """Take up a job's gates as its region holds them now (a new region,
        or one a previous daemon left)."""
        job.gates = {}
        if job.region is not None:
            for i, d in enumerate(job.region.devices()):
                job.gates[i] = Gate(d.throttle, d.refill_rate, d.bucket_size)

    def write_gate(self, job: LiveJob, i: int, gate: Gate) -> None:
        """Write device i's gate into the job's region, when it changed."""
        if job.region is None or job.rec.state == ENDED or i not in job.gates:
            return
        if job.rec.region_error is not None:
            gate = CLOSED
        if job.gates[i] == gate:
            return
        job.region.update_device(i, throttle=gate.throttle, refill_rate=gate.refill_rate,
                                 bucket_size=gate.bucket_size)
        job.gates[i] = gate

    def gate(self, job: LiveJob, i: int) -> Gate:
        return job.gates.get(i, OPEN)

    # -- reading -----------------------------------------------------------------------
    def read(self, job: LiveJob) -> list[DeviceUsage]:
        """The job's counters now, per GPU, validated; [] when they can't be
        read or the job was found tampering (flagged here). Kept as the
        job's last reading for its views."""
        reg = job.region
        if reg is None or not reg.usage_readable or job.rec.region_error:
            job.usage = []
            return []
        try:
            raw = reg.read_devices()
        except BadRegion as e:
            self.flag(job, str(e))
            return []
        uuids = job.uuids()
        devs = [DeviceUsage(used=d.used, peak=d.peak, launches=d.launches,
                            throttled_ns=d.throttled_ns, oom_refusals=d.oom_refusals)
                for d in raw[:len(uuids)]]
        totals = [self._totals.get(u, MAX_BYTES) for u in uuids[:len(devs)]]
        why = check_counters(devs, totals, [job.rec.mem_limit] * len(devs))
        if why is not None:
            self.flag(job, why)
            return []
        job.usage = [DeviceUsage(used=min(d.used, t), peak=min(d.peak, t), launches=d.launches,
                                 throttled_ns=d.throttled_ns, oom_refusals=d.oom_refusals)
                     for d, t in zip(devs, totals, strict=True)]
        return job.usage

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
        for i in list(job.gates):
            self.write_gate(job, i, CLOSED)
