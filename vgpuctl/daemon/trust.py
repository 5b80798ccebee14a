"""Region trust: the daemon's side of vgpuctl.core.tamper. Every tick it reads
each live job's usage counters once (a private copy, validated), checks them
against what the hook can have written, keeps the reading for the views and
the compute step, and writes every gate and turn the compute step sets. A
job found tampering is flagged here and only here: its counters are ignored
from then on and its gate is closed for good.

Views never read a region: they show the last reading (`LiveJob.usage`).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import replace

from vgpuctl.core.job import ENDED, DeviceUsage
from vgpuctl.core.tamper import check_counters, went_back
from vgpuctl.core.turns import CLOSED_TURN, OPEN_TURN, Turn
from vgpuctl.daemon.jobs import JobTable, LiveJob
from vgpuctl.system.procfs import start_time
from vgpuctl.system.region import MAX_BYTES, BadRegion
from vgpuctl.system.turn_fields import read_turn, write_turn

log = logging.getLogger("vgpuctl.daemon")

# The slots of a job are read for dead processes only where its hooks count
# this much more than NVML shows it hold.
DEAD_SLOT_CHECK = 1 << 20


class Trust:
    def __init__(self, table: JobTable, totals: Mapping[str, int]) -> None:
        self._table = table
        self._totals = dict(totals)          # GPU uuid -> its memory

    def set_totals(self, totals: Mapping[str, int]) -> None:
        """The GPUs changed (MIG devices made or destroyed)."""
        self._totals = dict(totals)

    # -- the gates ---------------------------------------------------------------------
    def watch(self, job: LiveJob) -> None:
        """Start from the gates its region holds now (a new region, or one a
        previous daemon left)."""
        job.turns = []
        if job.region is not None:
            for i in range(len(job.region.devices())):
                job.turns.append(read_turn(job.region, i))

    def write_gate(self, job: LiveJob, i: int, turn: Turn) -> None:
        """Write device i's gate and turn into the job's region, when they
        changed; a job flagged or being ended keeps its gate closed."""
        if job.region is None or job.rec.state == ENDED or i >= len(job.turns):
            return
        if job.rec.region_error is not None or job.stopped is not None:
            turn = CLOSED_TURN
        if job.turns[i] == turn:
            return
        write_turn(job.region, i, turn)
        job.turns[i] = turn

    def gate(self, job: LiveJob, i: int) -> Turn:
        return job.turns[i] if i < len(job.turns) else OPEN_TURN

    # -- reading -----------------------------------------------------------------------
    def read(self, job: LiveJob) -> list[DeviceUsage]:
        """The job's counters now, per GPU, validated and checked against its
        ledgers; [] when they can't be read or the job was found tampering
        (flagged here). Kept as the job's last reading for its views."""
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
        devs = [replace(d, borrowed_ns=min(d.borrowed_ns, d.busy_ns)) for d in raw[:len(uuids)]]
        totals = [self._totals.get(u, MAX_BYTES) for u in uuids[:len(devs)]]
        why = check_counters(devs, totals,
                             [job.rec.gpu_mem_limit(i) for i in range(len(devs))])
        if why is None and job.usage:
            why = went_back(job.usage, devs)
        if why is not None:
            self.flag(job, why)
            return []
        job.usage = [replace(d, used=min(d.used, t), peak=min(d.peak, t))
                     for d, t in zip(devs, totals, strict=True)]
        gone = self._dead_slots(job)
        if gone:
            job.usage = [replace(d, used=max(0, d.used - g))
                         for d, g in zip(job.usage, gone, strict=True)]
        return job.usage

    def _dead_slots(self, job: LiveJob) -> list[int]:
        """What the slots of its processes that died without a word (SIGKILL)
        still count, per GPU: its hooks count them until one sweeps (at its
        next refused allocation), NVML no longer. Read only where NVML shows
        the job hold less than its hooks count (the slots are a larger read
        than the counters)."""
        held = sum(job.held.values()) if job.held else None
        if held is None or sum(d.used for d in job.usage) - held < DEAD_SLOT_CHECK:
            return []
        try:
            procs = job.region.read_usage().procs if job.region is not None else []
        except (OSError, ValueError, BadRegion):
            return []
        out = [0] * len(job.usage)
        for p in procs:
            if start_time(p.pid) != p.start_time:
                for i, b in enumerate(p.used[:len(out)]):
                    out[i] += b
        return out if any(out) else []

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
        for i in range(len(job.turns)):
            self.write_gate(job, i, CLOSED_TURN)

    # -- the verdict ---------------------------------------------------------------------
    def flag(self, job: LiveJob, why: str) -> None:
        """The job wrote what the hook never writes into its usage region:
        its counters are no longer read, it is flagged (``region_error`` in
        ``ps --json``, its record, the log) and its compute gate closed for
        good: its kernel launches fail. Only this job is affected."""
        if job.rec.region_error is not None:
            return
        self._table.flagged(job, why)
        log.warning("job %s (%s) of %s: its usage region was tampered with (%s): "
                    "its counters are ignored and its kernel launches fail",
                    job.id, job.rec.name, job.rec.user, why)
        for i in range(len(job.turns)):
            self.write_gate(job, i, CLOSED_TURN)
