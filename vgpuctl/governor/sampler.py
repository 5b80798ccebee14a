"""Per-process SM shares from NVML's ``nvmlDeviceGetProcessUtilization``.

What NVML gives: for a device and a ``lastSeenTimeStamp`` (CPU time in
microseconds), the samples recorded after that time, each one (pid,
timeStamp in us, smUtil, memUtil, encUtil, decUtil) where smUtil is the
percent of one sample period in which that process had work on the SMs. A
process with no utilization in a period has no sample for it. When nothing
newer than lastSeenTimeStamp exists the call fails with
``NVML_ERROR_NOT_FOUND``: nobody ran, or the next period has not closed yet.

What the sampler gives: per GPU a `Window` (start, end, GPU-busy seconds per
pid) covering the time from the previous window's end to the newest sample,
so consecutive windows tile the timeline with no gap and no overlap. A
sample stands for one sample period ending at its timestamp; the period is
estimated from the spacing of the timestamps. NVML errors other than
NOT_FOUND are logged and the GPU's window is skipped (the caller keeps its
last values): the daemon never dies of a sampling error.
"""

from __future__ import annotations

import logging
import statistics
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger(__name__)

NVML_SUCCESS = 0
NVML_ERROR_NOT_FOUND = 6

# Timestamps closer than this belong to the same sample period.
_SAME_PERIOD_US = 1000
_DEFAULT_PERIOD_US = 100_000
# With no sample for this many periods (and at least _IDLE_MIN_US), the GPU
# was idle: report a window of zeros rather than nothing.
_IDLE_PERIODS = 3
_IDLE_MIN_US = 300_000


@dataclass(frozen=True)
class Window:
    """GPU-busy seconds per pid on one GPU between start_us and end_us
    (NVML's CPU timestamps, microseconds)."""

    start_us: int
    end_us: int
    busy_s: dict[int, float] = field(default_factory=dict)

    @property
    def duration_s(self) -> float:
        return max(self.end_us - self.start_us, 0) / 1e6

    def share(self, pid: int) -> float:
        d = self.duration_s
        return min(self.busy_s.get(pid, 0.0) / d, 1.0) if d > 0 else 0.0

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

    @property
    def period_us(self) -> int:
        if not self.gaps_us:
            return _DEFAULT_PERIOD_US
        return int(statistics.median_low(self.gaps_us))


class Sampler:
    """Reads process utilization per GPU, remembering the last-seen
    timestamp of each.

    ``nvml`` is the ``pynvml`` module or anything with the same three
    names (``nvmlDeviceGetHandleByUUID``, ``nvmlDeviceGetProcessUtilization``,
    ``NVMLError``); tests pass a fake. ``clock_us`` gives the current CPU time
    in microseconds (NVML's timestamps are CPU time).
    """

    def __init__(self, nvml: Any, clock_us: Callable[[], int] | None = None) -> None:
        self._nvml = nvml
        self._clock_us = clock_us or (lambda: time.time_ns() // 1000)
        self._handles: dict[str, Any] = {}
        self._gpus: dict[str, _GpuState] = {}

    def period_s(self, uuid: str) -> float:
        """The sample period estimated for this GPU."""
        st = self._gpus.get(uuid)
        return (st.period_us if st else _DEFAULT_PERIOD_US) / 1e6

    def forget(self, uuid: str) -> None:
        self._handles.pop(uuid, None)
        self._gpus.pop(uuid, None)

    def _handle(self, uuid: str) -> Any:
        h = self._handles.get(uuid)
        if h is None:
            h = self._nvml.nvmlDeviceGetHandleByUUID(uuid)
            self._handles[uuid] = h
        return h

    def _error_code(self, e: BaseException) -> int | None:
        return getattr(e, "value", None)

    def _query(self, uuid: str, last_seen_us: int) -> list[Any] | None:
        """The samples newer than last_seen_us; [] when NVML has none; None on
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
                # NOT_FOUND: no sample newer than last_seen. SUCCESS with no
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
            # First look at this GPU: everything NVML still holds is from
            # before we started; only its newest timestamp matters (the start
            # of our first window).
            samples = self._query(uuid, 0)
            if samples is None:
                return None
            stamps = sorted({int(s.timeStamp) for s in samples})
            self._learn_period(st, stamps)
            st.last_seen_us = stamps[-1] if stamps else self._clock_us()
            st.last_sample_us = stamps[-1] if stamps else None
            return None

        samples = self._query(uuid, st.last_seen_us)
        if samples is None:
            return None
        samples = [s for s in samples if int(s.timeStamp) > st.last_seen_us]
        if not samples:
            # Nothing newer. Idle GPU, or the current period is still open:
            # only after several periods without a sample do we call it idle.
            now = self._clock_us()
            period = st.period_us
            gap = now - st.last_seen_us
            if 0 < gap < 3_600_000_000 and gap >= max(_IDLE_PERIODS * period, _IDLE_MIN_US):
                end = now - period
                win = Window(st.last_seen_us, end, {})
                st.last_seen_us = end
                return win
            return None

        stamps = sorted({int(s.timeStamp) for s in samples})
        prev = [st.last_sample_us] if st.last_sample_us is not None else []
        self._learn_period(st, [*prev, *stamps])
        period_s = st.period_us / 1e6
        busy: dict[int, float] = {}
        for s in samples:
            util = min(max(int(s.smUtil), 0), 100)
            busy[int(s.pid)] = busy.get(int(s.pid), 0.0) + util / 100.0 * period_s
        win = Window(st.last_seen_us, stamps[-1], busy)
        # The busy time can't exceed the window (a first window after a
        # baseline may be shorter than one period).
        d = win.duration_s
        if d > 0:
            total = sum(busy.values())
            if total > d:
                busy = {pid: b * d / total for pid, b in busy.items()}
                win = Window(win.start_us, win.end_us, busy)
        st.last_seen_us = stamps[-1]
        st.last_sample_us = stamps[-1]
        return win

    @staticmethod
    def _learn_period(st: _GpuState, stamps: list[int]) -> None:
        """Record the spacing of consecutive distinct sample times."""
        prev: int | None = None
        for t in stamps:
            if prev is not None:
                gap = t - prev
                if gap > _SAME_PERIOD_US:
                    st.gaps_us.append(gap)
                    prev = t
            else:
                prev = t
