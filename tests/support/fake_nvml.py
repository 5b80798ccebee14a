"""What the fake NVMLs of the compute tests share: pynvml's exception, its
process-utilization sample, and a driver's per-process utilization buffer
answered as NVIDIA documents nvmlDeviceGetProcessUtilization."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

T0 = 1_700_000_000_000_000     # a sample timestamp, us

PERIOD_FAST_US = 166_667       # 1/6 s: the shortest sample period NVIDIA documents
PERIOD_SLOW_US = 1_000_000     # 1 s: the longest
IDLE_TREATMENTS = ("average", "skip")
# Which processes a period names: each that ran, with its own busy time; or
# one, with the device's (an H100 with driver 580): the busiest of the
# period (the reading that misleads the most about shares), or the one that
# ran the most kernels in it (names that follow the launches, not the time:
# whatever the jobs' costs, they agree with a split that takes every launch
# to cost alike).
PROCS = ("each", "busiest", "kernels")


class NVMLError(Exception):
    def __init__(self, value: int) -> None:
        super().__init__(f"NVML error {value}")
        self.value = value


@dataclass
class Sample:
    pid: int
    timeStamp: int
    smUtil: int
    memUtil: int = 0
    encUtil: int = 0
    decUtil: int = 0


class UtilBuffer:
    """One GPU's per-process utilization as a driver keeps and answers it.

    Time is cut into sample periods of ``period_us`` from T0; `run` adds
    busy time of a pid (any interval, split across the periods it covers),
    `publish` closes the periods that ended by a time. `query` answers as
    NVIDIA documents it: one entry per pid that ran in the closed periods
    newer than lastSeenTimeStamp (at most ``keep`` periods back), stamped with
    the end of the newest period it ran in, its smUtil its busy time in whole
    percents of the window's periods (``idle="average"``: every period of the
    window, those it ran nothing in as zeros) or of only the periods it ran in
    (``idle="skip"``); NVML_ERROR_NOT_FOUND when nobody ran. With
    ``procs="busiest"`` a period names one pid, its busiest, with the busy
    time of every pid of the period (the device's); with ``procs="kernels"``
    the pid that ran the most kernels in it (`run`'s ``kernels``)."""

    def __init__(self, period_us: int = PERIOD_FAST_US, idle: str = "average",
                 keep: int = 32, procs: str = "each") -> None:
        assert idle in IDLE_TREATMENTS and procs in PROCS
        self.period_us = period_us
        self.idle = idle
        self.procs = procs
        self.keep = keep
        self.busy: dict[int, dict[int, float]] = {}     # period -> pid -> busy us
        self.kernels: dict[int, dict[int, float]] = {}  # period -> pid -> kernels run
        self.published = 0                               # periods [0, published) closed
        self.extra: list[Sample] = []                    # odd entries a driver adds to
                                                         # every answer

    def end_us(self, k: int) -> int:
        """The timestamp of period k (its end)."""
        return T0 + (k + 1) * self.period_us

    def run(self, pid: int, start_us: float, end_us: float, share: float = 1.0,
            kernels: float = 1.0) -> None:
        """pid was busy `share` of the time between start_us and end_us,
        running ``kernels`` kernels (spread evenly over it)."""
        P = self.period_us
        span = max(end_us - start_us, 1e-9)
        k = int((start_us - T0) // P)
        while True:
            a, b = T0 + k * P, T0 + (k + 1) * P
            lo, hi = max(a, start_us), min(b, end_us)
            if hi <= lo:
                break
            per = self.busy.setdefault(k, {})
            per[pid] = per.get(pid, 0.0) + share * (hi - lo)
            ran = self.kernels.setdefault(k, {})
            ran[pid] = ran.get(pid, 0.0) + kernels * (hi - lo) / span
            k += 1

    def period(self, k: int, utils: dict[int, float]) -> None:
        """Period k with these smUtils (percent), closed at once."""
        for pid, u in utils.items():
            if u > 0:
                self.busy.setdefault(k, {})[pid] = u / 100 * self.period_us
        self.published = max(self.published, k + 1)

    def publish(self, now_us: float) -> None:
        self.published = max(self.published, int((now_us - T0) // self.period_us))

    def query(self, last_seen: int) -> list[Sample]:
        first = max(0, self.published - self.keep)
        ks = [k for k in range(first, self.published) if self.end_us(k) > last_seen]
        acc: dict[int, list[float]] = {}                # pid -> [busy, periods, newest]
        for k in ks:
            per = self.busy.get(k, {})
            if self.procs != "each" and per:
                ran = self.kernels.get(k, {})
                if self.procs == "kernels":
                    top = max(per, key=lambda p: (ran.get(p, 0.0), -p))
                else:
                    top = max(per, key=lambda p: (per[p], -p))
                per = {top: min(sum(per.values()), float(self.period_us))}
            for pid, b in per.items():
                if b <= 0:
                    continue
                a = acc.setdefault(pid, [0.0, 0, k])
                a[0] += b
                a[1] += 1
                a[2] = k
        out = []
        for pid, (b, n, newest) in acc.items():
            periods = n if self.idle == "skip" else len(ks)
            util = min(100, int(100 * b / (periods * self.period_us) + 0.5))
            out.append(Sample(pid, self.end_us(int(newest)), util))
        out += self.extra          # returned whatever lastSeenTimeStamp says
        if not out:
            raise NVMLError(6)  # NVML_ERROR_NOT_FOUND
        return out

    def truth(self, pid: int, ks: Iterable[int]) -> float:
        """pid's busy seconds in periods ks."""
        return sum(self.busy.get(k, {}).get(pid, 0.0) for k in ks) / 1e6
