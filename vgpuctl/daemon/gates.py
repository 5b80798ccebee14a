"""The compute step on the daemon's side: each GPU's turns (vgpuctl.core.turns
plans them) written into the regions of the jobs on it, through region trust,
and each job's GPU time as its hooks measured it (their events while it held
the GPU: busy_ns in its usage region), read once a tick.

Turns are planned again whenever the jobs on a GPU change (admitted, ended,
suspended, resumed, moved, a share or class changed) and at every tick,
which lends the turn of a job that launched nothing for `IDLE_S` to the
jobs that may borrow, and takes it back as soon as the job launches again.
A job is gated from its admission: the supervisor plans its GPUs before it
answers `run`, so the job's first launch already keeps to its turn.

A job's measured share (`measured`) is its GPU time over the last
`WINDOW_S` of wall time (or `WINDOW_CYCLES` of its GPU's cycles, if longer:
a cycle stretched for a tiny share holds one turn of each job); it is the
job's own figure, from its own hooks: a job that lies about it misleads its
own view and nothing of its neighbours (their turns are the daemon's, and
their hooks measure their own time). Bills come from the violation watch's
split of the device's busy time, which believes a claim only as far as the
device ran (vgpuctl.daemon.watch).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from vgpuctl.core import turns
from vgpuctl.core.job import DeviceUsage, JobOnGpu
from vgpuctl.daemon.jobs import JobTable, LiveJob
from vgpuctl.daemon.trust import Trust

# A job that launched nothing for this long lends its turn.
IDLE_S = 0.5
# A measured share is the GPU time over this much wall time.
WINDOW_S = 1.0
WINDOW_CYCLES = 10


@dataclass(frozen=True)
class Input:
    """One live job on one of its GPUs, this tick: the job there, its
    processes and its launcher, and its counters (zeros when unknown)."""
    on: JobOnGpu
    pids: frozenset[int]
    usage: DeviceUsage


@dataclass
class _Meter:
    """One job on one GPU: its GPU time over the last window, and when it
    last launched."""
    samples: deque[tuple[float, int]] = field(default_factory=lambda: deque(maxlen=64))
    launches: int = -1
    launched_at: float = 0.0
    new_ns: int = 0             # GPU time since the previous tick

    def add(self, now: float, busy_ns: int, launches: int, window: float = WINDOW_S) -> None:
        if launches != self.launches:
            self.launches, self.launched_at = launches, now
        last = self.samples[-1][1] if self.samples else busy_ns
        self.new_ns = max(0, busy_ns - last)
        self.samples.append((now, busy_ns))
        while len(self.samples) > 2 and now - self.samples[1][0] >= window:
            self.samples.popleft()

    def share(self) -> float | None:
        if len(self.samples) < 2:
            return None
        (t0, b0), (t1, b1) = self.samples[0], self.samples[-1]
        if t1 <= t0:
            return None
        return max(0.0, (b1 - b0) / 1e9 / (t1 - t0))

    def idle(self, now: float) -> bool:
        return now - self.launched_at >= IDLE_S


class Gates:
    def __init__(self, table: JobTable, trust: Trust,
                 clock: Callable[[], float] = time.monotonic,
                 cycle_ns: Callable[[], int] = lambda: turns.CYCLE_NS) -> None:
        self._table = table
        self._trust = trust
        self._clock = clock
        self._cycle_ns = cycle_ns
        self._meters: dict[tuple[str, str], _Meter] = {}
        # the cycles' epoch, one for every GPU (a job's ranks' turns line up)
        self._epoch = time.monotonic_ns()
        self._cycles: dict[str, int] = {}     # uuid -> its cycle now (ns)

    def inputs(self) -> list[Input]:
        """Every live job with a region, on each of its GPUs; reads each
        job's counters once (a job found tampering is flagged then)."""
        out = []
        for job in self._table:
            if job.region is None:
                continue
            usage = self._trust.read(job)
            if job.rec.suspended:   # runs nothing; read for its views (refusals, tampering)
                continue
            rec = job.rec
            pids = frozenset(rec.pids) | ({rec.launcher_pid} if rec.launcher_pid else set())
            out += [Input(on, pids, usage[on.dev] if on.dev < len(usage) else DeviceUsage())
                    for on in rec.on_gpus()]
        return out

    def last_launch(self, job_id: str, uuid: str) -> float | None:
        """When the job last launched on the GPU, as its counter says (the
        gates' clock); None when it has not been read there yet."""
        m = self._meters.get((job_id, uuid))
        return None if m is None else m.launched_at

    def step(self, inputs: list[Input]) -> None:
        """One tick: take in each job's counters (its measured share, whether
        it is idle), then plan every GPU again and write what changed."""
        now = self._clock()
        live = set()
        for i in inputs:
            key = (i.on.job_id, i.on.uuid)
            live.add(key)
            m = self._meters.get(key)
            if m is None:
                m = self._meters[key] = _Meter(launched_at=now)
            cycle = self._cycles.get(i.on.uuid, 0) / 1e9
            m.add(now, i.usage.busy_ns, i.usage.launches, max(WINDOW_S, WINDOW_CYCLES * cycle))
            job = self._table.find(i.on.job_id)
            share = m.share()
            if job is not None and share is not None:
                job.measured[i.on.uuid] = share
        for key in [k for k in self._meters if k not in live]:
            del self._meters[key]
        self.replan()

    def replan(self) -> None:
        """Plan every GPU's turns from the live jobs now, and write them."""
        now = self._clock()
        by_gpu: dict[str, list[tuple[LiveJob, JobOnGpu]]] = {}
        for job in self._table:
            if job.region is None or job.rec.suspended:
                continue
            for on in job.rec.on_gpus():
                by_gpu.setdefault(on.uuid, []).append((job, on))
        for uuid, jobs in by_gpu.items():
            epoch = self._epoch
            members = [self._member(on, now) for _, on in jobs]
            signals = {(job.id, on.dev): (job.signal_id, on.dev) for job, on in jobs}
            plan = turns.plan(members, epoch, self._cycle_ns(), signal_of=signals.get)
            self._cycles[uuid] = max((t.cycle_ns for t in plan.values()), default=0)
            for job, on in jobs:
                t = plan[(job.id, on.dev)]
                # its turn's share of the cycle (a guard may shave a full
                # GPU's); without a turn, its cap
                cap = on.core / 100
                job.target[uuid] = min(t.share, cap) if t.gate == turns.TURNS and t.len_ns \
                    else cap
                self._trust.write_gate(job, on.dev, t)

    def _member(self, on: JobOnGpu, now: float) -> turns.Share:
        m = self._meters.get((on.job_id, on.uuid))
        return turns.Share((on.job_id, on.dev), on.core, on.policy, on.priority,
                           idle=m is not None and m.idle(now), gpus=on.gpus)

    def busy_s(self, job_id: str, uuid: str) -> float:
        """The job's GPU time on that GPU since the previous tick."""
        m = self._meters.get((job_id, uuid))
        return m.new_ns / 1e9 if m is not None else 0.0

    def measured(self, job_id: str, uuid: str) -> float:
        job = self._table.find(job_id)
        return job.measured.get(uuid, 0.0) if job is not None else 0.0
