"""Usage accounting: how much GPU time and memory each job used, over time.

The daemon calls ``Accountant.observe`` once per tick for every (job, GPU)
with what the driver says of it, never what the job's own counters say:
the GPU-busy seconds NVML's per-process utilization gave its processes
since the last tick (or its measured share, 0..1), and the bytes NVML
shows its processes hold there. The violation watch attributes each
process NVML reports to its job when it reports it
(vgpuctl.daemon.watch), so a process too short-lived for /proc
tracking, or one that walked past the hook, is billed like any other. The
accountant integrates

    GPU time      the busy seconds (or sum of share x dt)  in GPU-seconds
    memory time   integral of used bytes over time          in GiB-hours
    peak memory   highest used bytes seen

and keeps the sums of the current interval in memory. ``flush(write)`` hands
the changed intervals to ``write``, which persists them (vgpuctl.store.usage
writes them to the ``usage`` table of the daemon's SQLite file), about every
two seconds, so a crash loses at most the samples since the last flush. Each row
covers one interval [t0, t1) of one job on one GPU; a row grows by UPDATE until
it spans ``row_seconds``, then a new one starts, which keeps the table small
(one row per job and GPU per five minutes) while reports can still clip rows to
a time window. A restarted daemon starts new rows for the same job ids, so the
records of a job simply continue.

Times are wall-clock seconds since the epoch (``time.time()``): reports are
asked for in dates. A step backwards of the clock, or a gap longer than
``max_gap`` (the daemon was stopped or stalled), starts integrating afresh
from the next sample instead of guessing what happened in between.

A daemon outage is accounted from the hook's counters, which run on while
no daemon does: every process's cumulative kernel launches (its slot in the
job's region). The daemon checkpoints them with each flush, with the job's
GPU-seconds per launch as measured so far (``note_launches``,
``launch_cost``); at re-adoption, the launches since the checkpoint times
that cost, never more than the outage's wall time, are credited to a row
covering the outage (``outage_gpu_seconds``, ``credit_outage``).

No I/O and no clock: times come in as arguments, rows go out through the
``write`` callable.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

GIB = 1 << 30
# Byte counts come from the job's usage region, which the job can write: no
# GPU holds more than this, and SQLite's INTEGER must hold it. Shares are
# clamped to 0..1, so a job never has more GPU time than wall time.
MAX_BYTES = 1 << 50
# NVML's windows may straddle a row's start by up to a sample period (1 s
# at most, as NVIDIA documents them).
BUSY_SLACK_S = 1.0

@dataclass(frozen=True)
class UsageRow:
    """One interval of one job on one GPU, as stored in the usage table."""

    job_id: str
    gpu_uuid: str
    t0: float
    t1: float
    gpu_seconds: float
    mem_gib_hours: float
    peak_mem_bytes: int


@dataclass(frozen=True)
class RowWrite:
    """One interval to persist: a new row (``row_id`` None) or an update of
    the row it names."""

    row: UsageRow
    row_id: int | None


# Persists a batch of rows in one transaction and returns each one's row id,
# in order; raises when nothing was written.
Writer = Callable[[Sequence[RowWrite]], Sequence[int]]


@dataclass
class _Open:
    """The running sums of one (job, GPU) since its row started."""

    t0: float                 # start of the current row
    t1: float                 # time of the last sample integrated
    last_mem: int             # bytes at the last sample
    last_share: float = 0.0   # share at the last sample
    gpu_seconds: float = 0.0  # in the current row, flushed or not
    mem_gib_hours: float = 0.0
    peak: int = 0
    row_id: int | None = None  # the row in the table, once written
    dirty: bool = True         # changed since the last flush


# A process's slot: (pid, start time); its cumulative launches.
Slots = Mapping[tuple[int, int], int]


def outage_gpu_seconds(before: Slots, after: Slots, cost: float | None,
                       wall_s: float) -> float:
    """GPU-seconds a job used on one GPU while no daemon watched: the
    launches its processes made since the checkpoint (a process that
    started since counts from zero, one that ended is lost, a counter that
    went back counts nothing) times the seconds per launch measured before,
    at most the outage's wall time (one GPU can't be busier than that)."""
    if cost is None or not cost > 0 or not wall_s > 0:
        return 0.0
    launched = sum(max(n - before.get(slot, 0), 0) for slot, n in after.items())
    return min(launched * cost, wall_s)


@dataclass
class Accountant:
    """Integrates per-job GPU time and memory time; see the module docstring.

    flush_seconds  how often ``maybe_flush`` writes (a crash loses at most this)
    row_seconds    a row spans at most this long before a new one starts
    max_gap        a longer gap between two samples is not integrated
    """

    flush_seconds: float = 2.0
    row_seconds: float = 300.0
    max_gap: float = 30.0
    _open: dict[tuple[str, str], _Open] = field(default_factory=dict, repr=False)
    _ended: set[tuple[str, str]] = field(default_factory=set, repr=False)
    _closed: list[tuple[tuple[str, str], _Open]] = field(default_factory=list, repr=False)
    _total: dict[tuple[str, str], float] = field(default_factory=dict, repr=False)
    _last_flush: float | None = field(default=None, repr=False)
    # per (job, GPU): GPU-seconds total and launches at the last note; the
    # GPU-seconds and launches summed over the notes since
    _marks: dict[tuple[str, str], tuple[float, int]] = field(default_factory=dict, repr=False)
    _cost: dict[tuple[str, str], tuple[float, float]] = field(default_factory=dict, repr=False)

    # -- samples ----------------------------------------------------------------
    def observe(self, job_id: str, gpu_uuid: str, now: float, share: float,
                mem_used_bytes: int, peak_bytes: int | None = None,
                busy_s: float | None = None) -> None:
        """One sample: over the time since the previous sample of this job on
        this GPU, the job used ``share`` (0..1, measured over that time) of the
        GPU's compute, or when given ``busy_s`` GPU-busy seconds (NVML's
        windows that closed since: they need not line up with the samples),
        and now holds ``mem_used_bytes``. ``peak_bytes``, when known, also
        feeds the peak. A row never holds more GPU-seconds than its wall time
        (and one sample period of slack, for windows that straddle its start)."""
        key = (job_id, gpu_uuid)
        share = min(max(float(share), 0.0), 1.0)
        mem = min(max(int(mem_used_bytes), 0), MAX_BYTES)
        peak = max(mem, min(max(int(peak_bytes or 0), 0), MAX_BYTES))
        cur = self._open.get(key)
        if cur is None:
            # The first sample only sets the baseline: nothing to integrate yet.
            self._open[key] = _Open(t0=now, t1=now, last_mem=mem, peak=peak)
            return
        dt = now - cur.t1
        if dt < 0 or dt > self.max_gap:
            # The clock stepped back, or the daemon was away: don't invent
            # the usage in between; continue from here in a new row.
            self._roll(key, cur, now, mem, peak)
            return
        if cur.row_id is not None and now - cur.t0 > self.row_seconds:
            cur = self._roll(key, cur, cur.t1, cur.last_mem, 0, cur.last_share)
        if busy_s is None:
            add = share * dt
        else:
            room = (now - cur.t0) + BUSY_SLACK_S - cur.gpu_seconds
            add = min(max(float(busy_s), 0.0), max(room, 0.0))
        cur.gpu_seconds += add
        self._total[key] = self._total.get(key, 0.0) + add
        # Memory changes somewhere between the two samples: the trapezoid.
        cur.mem_gib_hours += (cur.last_mem + mem) / 2 / GIB * dt / 3600.0
        cur.t1 = now
        cur.last_mem = mem
        cur.last_share = share
        cur.peak = max(cur.peak, peak)
        cur.dirty = True

    def _roll(self, key: tuple[str, str], old: _Open, t0: float, mem: int,
              peak: int, share: float = 0.0) -> _Open:
        """Close ``old`` (the next flush writes its last sums) and open a
        fresh row for ``key`` starting at ``t0``."""
        if old.dirty and (old.t1 > old.t0 or old.row_id is not None or old.peak):
            self._closed.append(_snapshot(key, old))
        new = _Open(t0=t0, t1=t0, last_mem=mem, last_share=share, peak=max(peak, mem))
        self._open[key] = new
        return new

    def end_job(self, job_id: str, now: float | None = None, lag_s: float = 0.0) -> None:
        """The job ended (at ``now``): its rows are written by the next flush,
        then forgotten.

        A measured share arrives late: it describes the sampler's last
        window, which closes up to one sample period after the work was
        done, so the integral of the shares trails the real use by about
        ``lag_s`` (the sampler's period) and the job's last moments are never
        measured. The last measured share stands in for them: from the last
        sample to ``now``, plus ``lag_s``."""
        for key, o in list(self._open.items()):
            if key[0] != job_id:
                continue
            self._ended.add(key)
            if now is None:
                continue
            tail = min(max(now - o.t1, 0.0), self.max_gap)
            extra = o.last_share * (tail + max(lag_s, 0.0))
            if extra > 0 or tail > 0:
                o.gpu_seconds += extra
                self._total[key] = self._total.get(key, 0.0) + extra
                o.mem_gib_hours += o.last_mem / GIB * tail / 3600.0
                o.t1 = max(o.t1, now)
                o.dirty = True

    def pause(self, job_id: str, now: float) -> None:
        """The job stops using its GPUs at ``now`` (it is suspended): its
        rows are integrated up to then at their last figures and closed; its
        next sample (once it resumes, on any GPU) only sets a new baseline,
        so the time in between is billed neither as GPU time nor as memory
        time. Its totals and launch costs are kept."""
        for key, o in list(self._open.items()):
            if key[0] != job_id:
                continue
            tail = min(max(now - o.t1, 0.0), self.max_gap)
            if tail > 0:
                add = o.last_share * tail
                o.gpu_seconds += add
                self._total[key] = self._total.get(key, 0.0) + add
                o.mem_gib_hours += o.last_mem / GIB * tail / 3600.0
                o.t1 = now
                o.dirty = True
            if o.dirty and (o.t1 > o.t0 or o.row_id is not None or o.peak):
                self._closed.append(_snapshot(key, o))
            del self._open[key]

    def totals(self, job_id: str) -> tuple[float, float, int]:
        """(GPU-seconds since the job started, all GPUs summed, as
        ``gpu_seconds``; GiB-hours and peak bytes of its current rows). For
        live views."""
        gs = sum(v for (jid, _), v in self._total.items() if jid == job_id)
        gh = 0.0
        pk = 0
        for (jid, _), o in self._open.items():
            if jid == job_id:
                gh += o.mem_gib_hours
                pk = max(pk, o.peak)
        return gs, gh, pk

    def gpu_seconds(self, job_id: str, gpu_uuid: str) -> float:
        """GPU-seconds the job used on one of its GPUs since it started."""
        return self._total.get((job_id, gpu_uuid), 0.0)

    def seed(self, recorded: Mapping[tuple[str, str], float]) -> None:
        """At start, before the first sample: the GPU-seconds already
        recorded per (job, GPU) for re-adopted jobs, so ``gpu_seconds``
        counts from each job's start rather than from this daemon's."""
        for key, total in recorded.items():
            self._total[key] = self._total.get(key, 0.0) + float(total)

    # -- outages ---------------------------------------------------------------
    def note_launches(self, job_id: str, gpu_uuid: str, launches: int) -> None:
        """The job's launches on this GPU so far (all its processes): with
        the GPU-seconds integrated since the last note, they make the cost
        of a launch."""
        key = (job_id, gpu_uuid)
        total = self._total.get(key, 0.0)
        mark = self._marks.get(key)
        self._marks[key] = (total, launches)
        if mark is None:
            # The first note: both count from the job's start.
            mark = (0.0, 0)
        if launches <= mark[1]:
            return
        gs, n = self._cost.get(key, (0.0, 0.0))
        self._cost[key] = (gs + max(total - mark[0], 0.0), n + launches - mark[1])

    def launch_cost(self, job_id: str, gpu_uuid: str) -> float | None:
        """GPU-seconds per launch of this job on this GPU, None before any."""
        gs, n = self._cost.get((job_id, gpu_uuid), (0.0, 0.0))
        return gs / n if n > 0 and gs > 0 else None

    def seed_cost(self, job_id: str, gpu_uuid: str, cost: float) -> None:
        """A cost measured by the previous daemon (one launch's worth of
        weight: the first notes of this one soon outweigh it)."""
        if cost > 0 and (job_id, gpu_uuid) not in self._cost:
            self._cost[(job_id, gpu_uuid)] = (float(cost), 1.0)

    def credit_outage(self, job_id: str, gpu_uuid: str, t0: float, t1: float,
                      gpu_seconds: float, mem_bytes: int) -> float:
        """Record [t0, t1) as a row of its own: the time no daemon watched.
        GPU-seconds are bounded by the wall time; returns what was
        credited."""
        dt = t1 - t0
        if not dt > 0:
            return 0.0
        gs = min(max(float(gpu_seconds), 0.0), dt)
        mem = min(max(int(mem_bytes), 0), MAX_BYTES)
        key = (job_id, gpu_uuid)
        o = _Open(t0=t0, t1=t1, last_mem=mem, gpu_seconds=gs,
                  mem_gib_hours=mem / GIB * dt / 3600.0, peak=mem)
        self._closed.append((key, o))
        self._total[key] = self._total.get(key, 0.0) + gs
        return gs

    # -- persistence --------------------------------------------------------
    def flush_due(self, now: float) -> bool:
        return self._last_flush is None or now - self._last_flush >= self.flush_seconds

    def maybe_flush(self, write: Writer, now: float) -> bool:
        """Flush when ``flush_seconds`` have passed since the last flush.
        Returns True when it wrote."""
        if not self.flush_due(now):
            return False
        self.flush(write)
        self._last_flush = now
        return True

    def flush(self, write: Writer) -> int:
        """Hand every changed interval to ``write`` in one batch; returns the
        number of rows written. Jobs ended with ``end_job`` are forgotten
        afterwards. When ``write`` raises, nothing is marked written: the
        same rows go again next time."""
        items: list[tuple[tuple[str, str], _Open]] = list(self._closed)
        items += [(k, o) for k, o in self._open.items()
                  if o.dirty and (o.t1 > o.t0 or o.row_id is not None or o.peak)]
        ids = write([RowWrite(UsageRow(k[0], k[1], o.t0, o.t1, o.gpu_seconds, o.mem_gib_hours,
                                       o.peak), o.row_id) for k, o in items])
        for (_, o), row_id in zip(items, ids, strict=True):
            o.row_id = row_id
            o.dirty = False
        self._closed.clear()
        for key in self._ended:
            self._open.pop(key, None)
            self._total.pop(key, None)
            self._marks.pop(key, None)
            self._cost.pop(key, None)
        self._ended.clear()
        return len(items)


def _snapshot(key: tuple[str, str], o: _Open) -> tuple[tuple[str, str], _Open]:
    return key, _Open(t0=o.t0, t1=o.t1, last_mem=o.last_mem, last_share=o.last_share,
                      gpu_seconds=o.gpu_seconds,
                      mem_gib_hours=o.mem_gib_hours, peak=o.peak, row_id=o.row_id)
