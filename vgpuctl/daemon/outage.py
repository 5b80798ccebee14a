"""Accounting across a daemon outage: with each flush, every running job's
launch counters (the hook's, per process) and cost per launch are kept
beside its region (the `checkpoint` file, the daemon's own); the next
daemon, at start, credits each re-adopted job with the GPU-seconds its
processes used while no daemon ran, bounded by the wall time
(vgpuctl.core.accounting)."""

from __future__ import annotations

import logging
from collections.abc import Iterable

from vgpuctl.core import accounting
from vgpuctl.core.accounting import Accountant
from vgpuctl.core.job import RUNNING
from vgpuctl.daemon.jobs import LiveJob

log = logging.getLogger("vgpuctl.daemon")


def checkpoint(jobs: Iterable[LiveJob], acc: Accountant, wall: float) -> None:
    """Write each running job's checkpoint (a pread and a small file a job)."""
    for job in jobs:
        reg = job.region
        if reg is None or job.rec.state != RUNNING or job.rec.region_error:
            continue
        try:
            slots = reg.slot_launches()
            devices = {}
            for uuid, launched in zip(job.uuids(), slots, strict=False):
                acc.note_launches(job.id, uuid, sum(launched.values()))
                devices[uuid] = {"cost": acc.launch_cost(job.id, uuid),
                                 "slots": [[p, s, n] for (p, s), n in launched.items()]}
            reg.write_checkpoint({"t": wall, "devices": devices})
        except (OSError, ValueError) as e:
            log.debug("job %s: no checkpoint (%s)", job.id, e)


def credit(jobs: Iterable[LiveJob], acc: Accountant, now: float) -> None:
    """At start, for each re-adopted job: what it used while no daemon ran."""
    for job in jobs:
        reg = job.region
        ck = reg.read_checkpoint() if reg is not None else None
        if reg is None or ck is None:
            continue
        try:
            t0 = float(ck["t"])
            slots = reg.slot_launches()
            mem = reg.read_devices()
            for i, (uuid, after) in enumerate(zip(job.uuids(), slots, strict=False)):
                d = ck["devices"].get(uuid) or {}
                before = {(int(p), int(s)): int(n) for p, s, n in d.get("slots", [])}
                cost = d.get("cost")
                cost = float(cost) if isinstance(cost, (int, float)) else None
                gs = accounting.outage_gpu_seconds(before, after, cost, now - t0)
                gs = acc.credit_outage(job.id, uuid, t0, now, gs,
                                       mem[i].used if i < len(mem) else 0)
                if cost is not None:
                    acc.seed_cost(job.id, uuid, cost)
                log.info("job %s: %.1f GPU-seconds on %s while no daemon ran (%.1f s), "
                         "from the hook's launch counters", job.id, gs, uuid, now - t0)
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
            log.warning("job %s: the time no daemon ran is not accounted (%s)", job.id, e)
