"""Priority classes on the daemon's side: what each live job on each of its
GPUs heeds, written into its limits (vgpuctl.core.classes decides,
vgpuctl.system.class_fields writes).

The hooks act on their own within a millisecond (libvgpu/hook/priority.c):
this module only tells each job which jobs of a higher class share its GPU
(and so whose signals to read), whether it signals, the budget and the
hold-off. It does so at once when a job is admitted, ends or changes class,
and every tick. What a launch costs is each hook's own measure (its events,
libvgpu/hook/flight.c): a job that signals stamps how long its launched
work should keep the GPU busy by its own launches' measured GPU time, and a
held job counts its own work in flight the same way. The signal is the
job's own segment: what it writes there misleads only the lower classes'
wait for it, which that job could make them do anyway by launching; and a
signal that claims the GPU busy far more than the device is (NVML's device
busy time, exact) is not believed for a while (vgpuctl.core.classes,
SignalCheck): the jobs it held stop heeding it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Hashable

from vgpuctl.core import classes
from vgpuctl.core.config import Config
from vgpuctl.daemon.jobs import JobTable, LiveJob
from vgpuctl.system.class_fields import ClassFields, read_class, read_signal, write_class
from vgpuctl.system.nvml import GpuStats

log = logging.getLogger("vgpuctl.daemon")


class Priorities:
    def __init__(self, table: JobTable, config: Callable[[], Config],
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._table = table
        self._config = config
        self._clock = clock
        self._written: dict[tuple[str, int], ClassFields] = {}
        self.signals = classes.SignalCheck()
        self._holders: set[tuple[str, int]] = set()   # (job, device index) someone heeds
        self._observed: float | None = None

    # -- what each job heeds -------------------------------------------------------
    def refresh(self) -> None:
        """Write every live job's class fields, on each of its GPUs, where
        they changed (at admission, an end, a change of class, each tick)."""
        pc = self._config().priority
        by_gpu: dict[str, list[classes.Seat]] = {}
        jobs: dict[str, LiveJob] = {}
        for job in self._table:
            if job.region is None or job.rec.region_error is not None or job.rec.suspended:
                continue            # (a suspended job is on no GPU: none heeds it)
            jobs[job.id] = job
            for on in job.rec.on_gpus():
                by_gpu.setdefault(on.uuid, []).append(
                    classes.Seat((on.job_id, on.dev), on.job_id, on.dev, on.priority))
        holds: dict[Hashable, classes.Hold] = {}
        for members in by_gpu.values():
            holds.update(classes.holds(members))
        live = set()
        now = self._clock()
        self._holders = {(hid, d) for hold in holds.values() for hid, d, _ in hold.holders}
        for (job_id, i), hold in holds.items():
            job = jobs[job_id]
            uuid = job.uuids()[i]
            holders = tuple((hid, d, r, jobs[hid].signal_id if hid in jobs else -1)
                            for hid, d, r in hold.holders
                            if self.signals.believed((hid, d), now))
            fields_ = ClassFields(
                priority=classes.rank(job.rec.priority), hold=hold.bits, holders=holders,
                budget_ns=pc.budget_us * 1000, holdoff_ns=pc.holdoff_ms * 1_000_000)
            live.add((job_id, i))
            self._write(job, i, uuid, fields_)
        for key in [k for k in self._written if k not in live]:
            del self._written[key]

    def _write(self, job: LiveJob, i: int, uuid: str, fields_: ClassFields) -> None:
        """Write a job's class fields for device i where they changed."""
        before = self._written.get((job.id, i))
        if before == fields_:
            return
        try:
            assert job.region is not None
            write_class(job.region, i, fields_)
        except (OSError, ValueError, AttributeError, TypeError) as e:
            log.warning("job %s: could not write its class into its region: %s", job.id, e)
            return
        self._written[(job.id, i)] = fields_
        if before is None or before.hold != fields_.hold or before.holders != fields_.holders:
            log.debug("job %s on GPU %s: priority %s, hold %d, holders %s", job.id, uuid,
                      job.rec.priority, fields_.hold, [h[0] for h in fields_.holders])

    def observe(self, stats: list[GpuStats]) -> None:
        """Each tick: sample what every holder's signal claims now against
        how busy its GPU was (NVML's last sample); one whose claims the GPU
        does not run is not believed for a while (its held jobs' lists are
        written again at once)."""
        now = self._clock()
        dt = 0.0 if self._observed is None else now - self._observed
        self._observed = now
        busy = {s.uuid: s.utilization / 100 for s in stats if s.utilization is not None}
        mono_ns = time.monotonic_ns()
        turned = []
        for hid, d in self._holders:
            job = self._table.find(hid)
            if job is None or job.region is None or d >= len(job.uuids()):
                continue
            device = busy.get(job.uuids()[d])
            sig = read_signal(job.region, d + 1)
            if device is None or not sig:
                continue
            if self.signals.sample((hid, d), sig[d].busy_until_ns > mono_ns, device, now, dt):
                turned.append((hid, job.uuids()[d]))
        self.signals.forget(self._holders)
        for hid, uuid in turned:
            log.warning("job %s on GPU %s: its signal claims the GPU busy far more than the "
                        "GPU is; the jobs of a lower class stop heeding it for %.0f s", hid,
                        uuid, classes.DISTRUST_S)
        if turned:
            self.refresh()

    def fields(self, job: LiveJob, i: int = 0) -> ClassFields | None:
        """What the region of a job holds now for device i (tests, views)."""
        if job.region is None:
            return None
        return read_class(job.region, i)
