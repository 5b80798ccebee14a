"""Accounting across a daemon outage: with each flush, every running job's
launch counters (the hook's, per process) and cost per launch are kept
beside its region (the `checkpoint` file, the daemon's own); the next
daemon, at start, credits each re-adopted job with the GPU-seconds its
processes used while no daemon ran, bounded by the wall time
(vgpuctl.core.accounting), and the memory NVML shows its processes hold
at the daemon's return.

The counters are the job's to write, so what they may say is bounded: a
process alive at the checkpoint and alive now (same pid, same start time)
whose slot is gone, or whose count went back, has had its counters
rewritten (the hook frees a slot only when its process is gone, and only
ever adds), or, rarely, exec'd a new program that started counting again:
the job is charged the whole outage on that GPU, as if it had held it all
along, and the log says why. It is not flagged: that takes proof
(vgpuctl.core.tamper), and an exec'd process is not tampering."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping

from vgpuctl.core import accounting
from vgpuctl.core.accounting import Accountant
from vgpuctl.core.job import RUNNING
from vgpuctl.daemon.jobs import LiveJob

log = logging.getLogger("vgpuctl.daemon")


def checkpoint(jobs: Iterable[LiveJob], acc: Accountant, wall: float) -> None:
    """Write each running job's checkpoint (a copy of its slots and a small file a job)."""
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


def went_back(before: Mapping[tuple[int, int], int], after: Mapping[tuple[int, int], int],
              alive: Callable[[int, int], bool]) -> tuple[int, int] | None:
    """A slot of the checkpoint whose process still runs and whose count is
    gone or lower now: what the hook can't have written. None when there is
    none."""
    for slot, n in before.items():
        if alive(*slot) and after.get(slot, -1) < n:
            return slot
    return None


def _alive(pid: int, start: int) -> bool:
    from vgpuctl.daemon import tracking

    return tracking.start_time(pid) == start


def credit(jobs: Iterable[LiveJob], acc: Accountant, now: float,
           held: Mapping[tuple[str, str], int] | None = None,
           flag: Callable[[LiveJob, str], None] | None = None,
           alive: Callable[[int, int], bool] = _alive) -> None:
    """At start, for each re-adopted job: what it used while no daemon ran.
    held: (job id, uuid) -> the bytes NVML shows its processes hold now."""
    held = held or {}
    for job in jobs:
        reg = job.region
        ck = reg.read_checkpoint() if reg is not None else None
        if reg is None or ck is None:
            continue
        try:
            t0 = float(ck["t"])
            try:
                slots = reg.slot_launches()
            except ValueError as e:     # BadRegion: its counters are not the hook's
                slots = []
                if flag is not None:
                    flag(job, str(e))
            for i, uuid in enumerate(job.uuids()):
                after = slots[i] if i < len(slots) else {}
                d = ck["devices"].get(uuid) or {}
                before = {(int(p), int(s)): int(n) for p, s, n in d.get("slots", [])}
                cost = d.get("cost")
                cost = float(cost) if isinstance(cost, (int, float)) else None
                back = went_back(before, after, alive)
                if back is not None or job.rec.region_error:
                    if back is not None:
                        log.warning("job %s: the launch count of its pid %d went back while "
                                    "no daemon ran (%d at the checkpoint, %d now): it is "
                                    "charged the whole outage", job.id, back[0], before[back],
                                    after.get(back, 0))
                    gs = now - t0       # charged the whole outage
                else:
                    gs = accounting.outage_gpu_seconds(before, after, cost, now - t0)
                gs = acc.credit_outage(job.id, uuid, t0, now, gs, held.get((job.id, uuid), 0))
                if cost is not None:
                    acc.seed_cost(job.id, uuid, cost)
                log.info("job %s: %.1f GPU-seconds on %s while no daemon ran (%.1f s), "
                         "from the hook's launch counters", job.id, gs, uuid, now - t0)
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
            log.warning("job %s: the time no daemon ran is not accounted (%s)", job.id, e)
