"""Priority classes on the daemon's side: what each live job on each of its
GPUs heeds, written into its limits (vgpuctl.core.priority decides,
vgpuctl.system.priority writes), and the estimate of each such job's GPU
time per launch that its hook counts work in flight by.

The hooks act on their own within a millisecond (libvgpu/hook/priority.c):
this module only tells each job which jobs of a higher class share its GPU
(and so whose signals to read), whether it signals, the budget and the
hold-off, and its launch cost. It does so at once when a job is admitted,
ends or changes class, and every tick for the costs.

The cost of a launch is learnt as the share loop learns it: the job's busy
time in each NVML window (its processes and launcher) over the launches its
hook counted in its signal in the same window. The signal is the job's own
segment: a count it lies about only misleads its own hook (how much it may
keep in flight) or, for a job of a higher class, how long the lower ones
wait, which that job could make them do anyway by launching.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass, field
from typing import Any

from vgpuctl.core import priority as prio
from vgpuctl.core.config import Config
from vgpuctl.core.controller import LaunchHistory
from vgpuctl.daemon.jobs import JobTable, LiveJob
from vgpuctl.system.priority import ClassFields, read_class, signal_launches, write_class

log = logging.getLogger("vgpuctl.daemon")

# A cost beyond this is no launch's (a lie, or a window that saw nothing).
MAX_COST_S = 10.0
# Launches per second no hook counts more of (as the governor's clamp).
MAX_LAUNCH_RATE = 2_000_000
# Half-life of a cost's average on a GPU whose NVML is not known to split
# busy time per process: one that names one process a sample period (an
# H100) gives a job a whole period or nothing, and a job on the GPU a fifth
# of the time is named in a fifth of the periods. Averaged over 0.4 s (two
# 200 ms periods) its cost read 0 to 2.6 times the truth; over 10 s, 0.7 to
# 1.3 (5th to 95th percentile, after a minute; 0.4 to 1.5 in its first 8 s).
ONE_PROCESS_HALFLIFE_S = 10.0


@dataclass
class _Cost:
    history: LaunchHistory = field(default_factory=LaunchHistory)
    cost: prio.LaunchCost = field(default_factory=prio.LaunchCost)
    last: int | None = None
    count: float = 0.0
    last_wall: float | None = None


def _signal_id(job: LiveJob | None) -> int:
    """The segment of a job's signal; -1 when it has none."""
    if job is None or job.region is None:
        return -1
    return int(job.region.signal_id)


class Priorities:
    def __init__(self, table: JobTable, config: Callable[[], Config]) -> None:
        self._table = table
        self._config = config
        self._costs: dict[tuple[str, str], _Cost] = {}
        self._written: dict[tuple[str, int], ClassFields] = {}

    # -- what each job heeds -------------------------------------------------------
    def refresh(self) -> None:
        """Write every live job's class fields, on each of its GPUs, where
        they changed (at admission, an end, a change of class, each tick)."""
        pc = self._config().priority
        by_gpu: dict[str, list[prio.Member]] = {}
        jobs: dict[str, LiveJob] = {}
        for job in self._table:
            if job.region is None or job.rec.region_error is not None or job.rec.suspended:
                continue            # (a suspended job is on no GPU: none heeds it)
            jobs[job.id] = job
            for i, uuid in enumerate(job.uuids()):
                by_gpu.setdefault(uuid, []).append(
                    prio.Member((job.id, i), job.id, i, job.rec.priority))
        holds: dict[Hashable, prio.Hold] = {}
        for members in by_gpu.values():
            holds.update(prio.holds(members))
        live = set()
        for (job_id, i), hold in holds.items():
            job = jobs[job_id]
            uuid = job.uuids()[i]
            c = self._costs.get((job_id, uuid))
            cost = c.cost.value if c is not None and hold.bits else None
            holders = tuple((hid, d, r, _signal_id(jobs.get(hid)))
                            for hid, d, r in hold.holders)
            fields_ = ClassFields(
                priority=prio.rank(job.rec.priority), hold=hold.bits, holders=holders,
                budget_ns=pc.budget_us * 1000, holdoff_ns=pc.holdoff_ms * 1_000_000,
                launch_cost_ns=int(cost * 1e9) if cost is not None else 0)
            live.add((job_id, i))
            if self._written.get((job_id, i)) == fields_:
                continue
            try:
                assert job.region is not None
                write_class(job.region, i, fields_)
            except (OSError, ValueError, AttributeError, TypeError) as e:
                log.warning("job %s: could not write its class into its region: %s",
                            job_id, e)
                continue
            before = self._written.get((job_id, i))
            self._written[(job_id, i)] = fields_
            if before is None or before.hold != fields_.hold or \
                    before.holders != fields_.holders:
                log.debug("job %s on GPU %s: priority %s, hold %d, holders %s", job_id, uuid,
                          job.rec.priority, hold.bits, [h[0] for h in hold.holders])
        for key in [k for k in self._written if k not in live]:
            del self._written[key]

    # -- launch costs --------------------------------------------------------------
    def observe(self, windows: Mapping[str, Any], wall_s: float,
                per_process: Callable[[str], bool] | None = None) -> None:
        """One tick: each job that signals or is held, its launches so far
        (from its signal) and its busy time in the GPU's new NVML window
        (windows: uuid -> the governor's new Window, or absent).
        per_process(uuid): whether that GPU's NVML is known to split busy
        time per process (None: every GPU's is); elsewhere a cost is
        averaged over ONE_PROCESS_HALFLIFE_S."""
        seen = set()
        for job in self._table:
            if job.region is None or job.rec.region_error is not None:
                continue
            uuids = job.uuids()
            wanted = [i for i, _ in enumerate(uuids)
                      if (self._written.get((job.id, i)) or ClassFields()).hold]
            if not wanted:
                continue
            counts = signal_launches(job.region, len(uuids))
            pids = set(job.rec.pids) | ({job.rec.launcher_pid} if job.rec.launcher_pid else set())
            for i in wanted:
                key = (job.id, uuids[i])
                seen.add(key)
                c = self._costs.setdefault(key, _Cost())
                own = per_process is None or per_process(uuids[i])
                c.cost.halflife_s = (prio.LaunchCost.halflife_s if own
                                     else ONE_PROCESS_HALFLIFE_S)
                if counts is not None and i < len(counts):
                    self._count(c, counts[i], wall_s)
                w = windows.get(uuids[i])
                if w is None or getattr(w, "coarse", False) or w.duration_s <= 0:
                    continue
                launches = c.history.between(w.start_s, w.end_s)
                if launches is None:
                    continue
                busy = sum(w.busy_s.get(p, 0.0) for p in pids)
                if busy <= 0.0 and launches <= 0.0:
                    continue
                if launches > 0 and busy / launches > MAX_COST_S:
                    continue
                c.cost.observe(busy, launches, w.duration_s)
        for key in [k for k in self._costs if k not in seen]:
            del self._costs[key]

    def _count(self, c: _Cost, n: int, wall_s: float) -> None:
        """The job's counter now: a step back (or the first look) counts
        nothing, a step beyond any possible rate counts that rate."""
        if c.last is not None and n >= c.last:
            dt = wall_s - c.last_wall if c.last_wall is not None else 1.0
            c.count += min(n - c.last, int(MAX_LAUNCH_RATE * max(dt, 0.0)) + 1)
        c.last, c.last_wall = n, wall_s
        c.history.add(wall_s, c.count)

    def cost(self, job_id: str, uuid: str) -> float | None:
        c = self._costs.get((job_id, uuid))
        return c.cost.value if c is not None else None

    def fields(self, job: LiveJob, i: int = 0) -> ClassFields | None:
        """What the region of a job holds now for device i (tests, views)."""
        if job.region is None:
            return None
        return read_class(job.region, i)
