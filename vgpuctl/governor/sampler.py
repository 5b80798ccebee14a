"""Per-process SM shares from NVML's ``nvmlDeviceGetProcessUtilization``.

What NVML gives, as NVIDIA documents it: for a device and a
``lastSeenTimeStamp`` (CPU time in microseconds), **one entry per process**
that ran in the sample periods newer than that time: (pid, timeStamp in us,
smUtil, memUtil, encUtil, decUtil), smUtil its utilization averaged over
those periods in whole percents, timeStamp the newest of its samples. With
nothing newer the call fails with ``NVML_ERROR_NOT_FOUND``. What the average
makes of a period in which the process ran nothing (a zero in the average,
or left out) is not documented; so:

- the sampler reads more often than the sample period (the daemon's tick,
  100 ms, against NVIDIA's 1/6 s to 1 s) with ``lastSeenTimeStamp`` the
  newest timestamp it has seen, so that a read usually covers one new period,
  where both readings of the average agree;
- a read that covers several periods (a tick came late, or the GPU was idle
  for a while) is **coarse**: its value is an upper bound of the process's
  share over the window (exact if idle periods are averaged in, too high if
  they are skipped) and one period's worth of it a lower bound. The
  controller acts on such a window only where both bounds agree.

What the sampler gives: per GPU a `Window` (start, end, GPU-busy seconds per
pid) covering the time from the previous window's end to the newest
timestamp, so consecutive windows tile the timeline with no gap and no
overlap. The sample period is learnt from the spacing of the timestamps.
Entries not newer than ``lastSeenTimeStamp`` are dropped, smUtil is clamped
to 0..100, a pid's entries beyond its newest are dropped; which pids belong
to whom is the caller's business (unknown pids are simply never asked for).
NVML errors other than NOT_FOUND are logged and the GPU's window is skipped
(the caller keeps its last values): the daemon never dies of a sampling
error.

A sampler that **follows idle periods** (the compute governor's) also moves
``lastSeenTimeStamp`` on while nothing runs. A read that finds nothing newer
says that every period published by then was idle; published are those
that ended before the read, less the time NVML takes to publish a period,
which is learnt (the longest a new timestamp was seen missing at a read
after it, plus a margin; nothing is followed before a few new timestamps
were seen). lastSeenTimeStamp goes to the middle of the period after the
newest of them, on the grid of the periods' timestamps (the middle: a grid
extrapolated from the last entry drifts a little, and the periods an entry
then covers are still told without doubt). The first period a process runs
in after the GPU was idle is then a window of one period, exact (a new job's
first cost is taken from it), not one of all the periods since the last
entry, which is coarse. Such a window is the periods its entries cover; the
idle time before it is in no window, or in an idle one.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger(__name__)

NVML_SUCCESS = 0
NVML_ERROR_NOT_FOUND = 6

# NVIDIA documents sample periods from 1/6 s to 1 s. Until the period is
# learnt, a window longer than the shortest is taken as coarse and idleness
# is declared only after the longest.
_MIN_PERIOD_US = 166_667
_MAX_PERIOD_US = 1_000_000
# Spacings outside these bounds are not a sample period (jitter of a real
# driver's timestamps; a GPU idle for a while).
_PERIOD_FLOOR_US = 100_000
_PERIOD_CEIL_US = 2_000_000
# A window longer than this many periods spans more than one.
_COARSE_PERIODS = 1.5
# With no sample for this many periods (and at least _IDLE_MIN_US), the GPU
# was idle: report a window of zeros rather than nothing.
_IDLE_PERIODS = 3
_IDLE_MIN_US = 300_000
# Following idle periods: the margin beyond the publishing lag learnt (at
# least this, or this part of a period); the new timestamps seen before the
# lag learnt is trusted; the longest a grid is extrapolated from an entry.
_LAG_SAFETY_US = 20_000
_LAG_SAFETY_PERIODS = 0.1
_LAG_MIN_SEEN = 4
_FOLLOW_MAX_US = 3_600_000_000


@dataclass(frozen=True)
class Window:
    """GPU-busy seconds per pid on one GPU between start_us and end_us
    (NVML's CPU timestamps, microseconds).

    busy_s is the best reading of each pid's busy time. A coarse window
    (several sample periods in one read) also has low_s, a lower bound:
    there busy_s is an upper bound that is exact only if NVML averages idle
    periods in as zeros."""

    start_us: int
    end_us: int
    busy_s: dict[int, float] = field(default_factory=dict)
    low_s: dict[int, float] | None = None
    periods: float = 1.0        # sample periods the window spans (learnt period)

    @property
    def coarse(self) -> bool:
        return self.low_s is not None

    @property
    def duration_s(self) -> float:
        return max(self.end_us - self.start_us, 0) / 1e6

    def share(self, pid: int) -> float:
        d = self.duration_s
        return min(self.busy_s.get(pid, 0.0) / d, 1.0) if d > 0 else 0.0

    def share_low(self, pid: int) -> float:
        """A lower bound of the pid's share (the share itself in a window
        that is not coarse)."""
        if self.low_s is None:
            return self.share(pid)
        d = self.duration_s
        return min(self.low_s.get(pid, 0.0) / d, 1.0) if d > 0 else 0.0

    def shares(self) -> dict[int, float]:
        return {pid: self.share(pid) for pid in self.busy_s}

    @property
    def start_s(self) -> float:
        return self.start_us / 1e6

    @property
    def end_s(self) -> float:
        return self.end_us / 1e6


@dataclass
class _GpuState:
    last_seen_us: int | None = None             # None: no baseline yet
    last_sample_us: int | None = None           # newest real sample time
    gaps_us: deque[int] = field(default_factory=lambda: deque(maxlen=32))
    errors: int = 0
    baseline: str = "stamp"                     # what last_seen_us is: an entry's
                                                # "stamp", a "clock" reading, or
                                                # "followed" (mid-period, on the grid)
    window_end_us: int | None = None            # the newest window's end
    last_read_us: int | None = None             # when NVML last answered
    lags_us: deque[int] = field(default_factory=lambda: deque(maxlen=32))
                                                # lower bounds of the publishing lag
    new_stamps: int = 0                         # new timestamps seen (up to a few)

    @property
    def period_us(self) -> int | None:
        """The sample period learnt so far, None before the first spacing:
        the lowest quartile of recent spacings between consecutive newest
        timestamps (spacings of two or more periods, after an idle period,
        are the exception on a busy GPU)."""
        if not self.gaps_us:
            return None
        gaps = sorted(self.gaps_us)
        return gaps[(len(gaps) - 1) // 4]


class Sampler:
    """Reads process utilization per GPU, remembering the last-seen
    timestamp of each.

    ``nvml`` is the ``pynvml`` module or anything with the same three
    names (``nvmlDeviceGetHandleByUUID``, ``nvmlDeviceGetProcessUtilization``,
    ``NVMLError``); tests pass a fake. ``clock_us`` gives the current CPU time
    in microseconds (NVML's timestamps are CPU time). ``follow_idle``: move
    lastSeenTimeStamp on over idle periods (the module docstring).
    """

    def __init__(self, nvml: Any, clock_us: Callable[[], int] | None = None,
                 follow_idle: bool = False) -> None:
        self._nvml = nvml
        self._follow_idle = follow_idle
        self._clock_us = clock_us or (lambda: time.time_ns() // 1000)
        self._handles: dict[str, Any] = {}
        self._gpus: dict[str, _GpuState] = {}
        self._last: dict[str, Window] = {}      # the newest window of each GPU

    def period_s(self, uuid: str) -> float:
        """The sample period learnt for this GPU (NVIDIA's longest, 1 s,
        until one is learnt)."""
        st = self._gpus.get(uuid)
        p = st.period_us if st else None
        return (p if p is not None else _MAX_PERIOD_US) / 1e6

    def gpus(self) -> list[str]:
        """The GPUs read so far (and not forgotten)."""
        return list(self._gpus)

    def forget(self, uuid: str) -> None:
        self._handles.pop(uuid, None)
        self._gpus.pop(uuid, None)
        self._last.pop(uuid, None)

    def last_shares(self, uuid: str) -> dict[int, float]:
        """Each pid's share in the newest window read on this GPU (empty
        before the first); for the violation watch, which names the busiest
        process of a job over its share."""
        w = self._last.get(uuid)
        return w.shares() if w is not None else {}

    def _handle(self, uuid: str) -> Any:
        h = self._handles.get(uuid)
        if h is None:
            h = self._nvml.nvmlDeviceGetHandleByUUID(uuid)
            self._handles[uuid] = h
        return h

    def _error_code(self, e: BaseException) -> int | None:
        return getattr(e, "value", None)

    def _query(self, uuid: str, last_seen_us: int) -> list[Any] | None:
        """The entries newer than last_seen_us; [] when NVML has none; None on
        any other error (logged)."""
        st = self._gpus.setdefault(uuid, _GpuState())
        try:
            handle = self._handle(uuid)
        except Exception as e:  # noqa: BLE001 - any failure: skip this GPU this tick
            st.errors += 1
            if st.errors == 1 or st.errors % 100 == 0:
                log.warning("no NVML handle for %s (%s), %d in a row", uuid, e, st.errors)
            return None
        try:
            samples = self._nvml.nvmlDeviceGetProcessUtilization(handle, last_seen_us)
        except self._nvml.NVMLError as e:
            code = self._error_code(e)
            if code in (NVML_ERROR_NOT_FOUND, NVML_SUCCESS):
                # NOT_FOUND: no entry newer than last_seen. SUCCESS with no
                # buffer needed (pynvml raises it as an error): none either.
                st.errors = 0
                return []
            st.errors += 1
            if st.errors == 1 or st.errors % 100 == 0:
                log.warning("nvmlDeviceGetProcessUtilization on %s failed (%s), %d in a row;"
                            " keeping the last shares", uuid, e, st.errors)
            if st.errors >= 3:
                self._handles.pop(uuid, None)   # look the handle up again
            return None
        except Exception:
            st.errors += 1
            if st.errors == 1 or st.errors % 100 == 0:
                log.exception("sampling %s failed", uuid)
            return None
        st.errors = 0
        return list(samples)

    def read(self, uuid: str) -> Window | None:
        """The next window on this GPU, or None when there is nothing new
        (no sample period closed since the last window, or an NVML error)."""
        st = self._gpus.setdefault(uuid, _GpuState())
        if st.last_seen_us is None:
            # First look at this GPU: what NVML still holds is from before we
            # started; only its newest timestamp matters (the start of our
            # first window).
            samples = self._query(uuid, 0)
            if samples is None:
                return None
            stamps = [int(s.timeStamp) for s in samples]
            st.last_read_us = self._clock_us()
            st.last_seen_us = max(stamps) if stamps else st.last_read_us
            st.last_sample_us = max(stamps) if stamps else None
            st.baseline = "stamp" if stamps else "clock"
            st.window_end_us = st.last_seen_us
            return None

        read_us = self._clock_us()
        samples = self._query(uuid, st.last_seen_us)
        if samples is None:
            return None
        prev_read, st.last_read_us = st.last_read_us, read_us
        newest: dict[int, tuple[int, float]] = {}    # pid -> (timeStamp, share)
        for s in samples:
            ts = int(s.timeStamp)
            if ts <= st.last_seen_us:
                continue        # not what was asked for (a driver's stale entry)
            pid = int(s.pid)
            if pid in newest and newest[pid][0] >= ts:
                continue
            newest[pid] = (ts, min(max(int(s.smUtil), 0), 100) / 100.0)
        if not newest:
            if self._follow_idle:
                self._follow(st, read_us)
            return self._idle_window(st)

        end = max(ts for ts, _ in newest.values())
        if st.last_sample_us is not None:
            gap = end - st.last_sample_us
            if _PERIOD_FLOOR_US <= gap <= _PERIOD_CEIL_US:
                st.gaps_us.append(gap)
        if prev_read is not None and (st.last_sample_us is None or end > st.last_sample_us):
            st.new_stamps = min(st.new_stamps + 1, _LAG_MIN_SEEN)
            if prev_read > end:
                # published after the previous read, which came after its end
                st.lags_us.append(prev_read - end)
        period = st.period_us
        start = st.last_seen_us
        if st.baseline == "followed" and period is not None:
            # the entries cover the periods that end after the baseline
            start = end - max(1, round((end - start) / period + 0.5)) * period
        d_us = end - start
        periods = d_us / (period if period is not None else _MIN_PERIOD_US)
        d = d_us / 1e6
        # Each entry is the pid's share averaged over the window: its busy
        # time is that share of the window.
        busy = {pid: share * d for pid, (_, share) in newest.items()}
        low: dict[int, float] | None = None
        if periods > _COARSE_PERIODS or (self._follow_idle and st.baseline == "clock"):
            # Several periods in one read: had NVML skipped the periods a pid
            # ran nothing in, the share was over as little as one period. (A
            # baseline read off the clock says as little of the periods the
            # entries cover, for a sampler that relies on them.)
            one = min(d, (period if period is not None else _MIN_PERIOD_US) / 1e6)
            low = {pid: share * one for pid, (_, share) in newest.items()}
        total = sum(busy.values())
        if d > 0 and total > d and low is None:
            # Rounding or a driver's odd values: the busy time can't exceed
            # the window; scale it down. (A coarse window's values are each
            # an upper bound: together they may exceed it.)
            busy = {pid: b * d / total for pid, b in busy.items()}
        st.last_seen_us = end
        st.last_sample_us = end
        st.baseline = "stamp"
        st.window_end_us = end
        win = Window(start, end, busy, low, round(periods, 3))
        self._last[uuid] = win
        return win

    def _follow(self, st: _GpuState, now: int) -> None:
        """Nothing newer than last seen: every period published by now was
        idle. Move last seen to the middle of the period after the newest of
        them (the module docstring)."""
        period = st.period_us
        if (period is None or st.last_sample_us is None or st.last_seen_us is None
                or st.new_stamps < _LAG_MIN_SEEN
                or not 0 < now - st.last_sample_us < _FOLLOW_MAX_US):
            return
        margin = max(st.lags_us, default=0) + max(_LAG_SAFETY_US,
                                                  int(_LAG_SAFETY_PERIODS * period))
        k = (now - margin - st.last_sample_us) // period
        grid = st.last_sample_us + k * period + period // 2
        if k >= 1 and grid > st.last_seen_us:
            st.last_seen_us = grid
            st.baseline = "followed"

    def _idle_window(self, st: _GpuState) -> Window | None:
        """Nothing newer: an idle GPU, or the current period is still open.
        Only after several periods without an entry is it called idle."""
        assert st.last_seen_us is not None
        now = self._clock_us()
        period = st.period_us if st.period_us is not None else _MAX_PERIOD_US
        start = st.window_end_us if st.window_end_us is not None else st.last_seen_us
        gap = now - start
        if 0 < gap < 3_600_000_000 and gap >= max(_IDLE_PERIODS * period, _IDLE_MIN_US):
            if st.baseline == "followed":
                end = st.last_seen_us - period // 2     # the newest idle period's end
            else:
                end = now - period
                if not self._follow_idle:
                    st.last_seen_us = max(st.last_seen_us, end)
                    st.baseline = "clock"
                # (following, only _follow moves last seen: a period NVML
                # publishes late is never skipped)
            if end <= start:
                return None
            st.window_end_us = end
            return Window(start, end, {}, None, round((end - start) / period, 3))
        return None
