"""The NVML sampler against a fake NVML that answers as NVIDIA documents it
(one entry per process per call, averaged over the periods newer than
lastSeenTimeStamp, idle periods averaged in or skipped): last-seen
timestamps, windows that tile the timeline, reads that cover one period or
several, NOT_FOUND, odd entries, errors. No real NVML, no clocks."""

from __future__ import annotations

import logging
import random

import pytest
from support.fake_nvml import (
    IDLE_TREATMENTS,
    PERIOD_FAST_US,
    PERIOD_SLOW_US,
    T0,
    NVMLError,
    Sample,
    UtilBuffer,
)

from vgpuctl.governor.sampler import Sampler

PERIODS = [PERIOD_FAST_US, PERIOD_SLOW_US]


class FakeNvml:
    """Per GPU a UtilBuffer; errors to fail the next calls with."""

    NVMLError = NVMLError

    def __init__(self, period_us: int = PERIOD_FAST_US, idle: str = "average") -> None:
        self.gpus: dict[str, UtilBuffer] = {"GPU-a": UtilBuffer(period_us, idle)}
        self.calls: list[tuple[str, int]] = []
        self.fail_next: list[int] = []
        self.lookups = 0            # nvmlDeviceGetHandleByUUID calls
        self.now_us = T0

    def nvmlDeviceGetHandleByUUID(self, uuid: str) -> str:
        self.lookups += 1
        if uuid not in self.gpus:
            raise NVMLError(6)
        return uuid

    def nvmlDeviceGetProcessUtilization(self, handle: str, last_seen: int) -> list[Sample]:
        self.calls.append((handle, last_seen))
        if self.fail_next:
            raise NVMLError(self.fail_next.pop(0))
        return self.gpus[handle].query(last_seen)

    @property
    def buf(self) -> UtilBuffer:
        return self.gpus["GPU-a"]

    def period(self, k: int, utils: dict[int, float]) -> None:
        """Close sample period k with these smUtils (percent)."""
        self.buf.period(k, utils)
        self.now_us = max(self.now_us, self.buf.end_us(k))


def make(nvml: FakeNvml) -> Sampler:
    return Sampler(nvml, clock_us=lambda: nvml.now_us)


@pytest.mark.parametrize("idle", IDLE_TREATMENTS)
@pytest.mark.parametrize("period_us", PERIODS)
def test_first_read_is_a_baseline_then_windows_tile(period_us: int, idle: str) -> None:
    nvml = FakeNvml(period_us, idle)
    P = period_us
    for k in range(5):  # history from before the sampler started
        nvml.period(k, {1: 100})
    s = make(nvml)
    assert s.read("GPU-a") is None                 # baseline
    assert nvml.calls[-1] == ("GPU-a", 0)
    nvml.period(5, {1: 30, 2: 60})
    w = s.read("GPU-a")
    assert w is not None and not w.coarse
    # lastSeenTimeStamp is the newest timestamp already seen
    assert nvml.calls[-1] == ("GPU-a", T0 + 5 * P)
    assert (w.start_us, w.end_us) == (T0 + 5 * P, T0 + 6 * P)
    assert w.share(1) == pytest.approx(0.30)
    assert w.share(2) == pytest.approx(0.60)
    assert w.share(3) == 0.0
    assert s.period_s("GPU-a") == pytest.approx(P / 1e6)
    for k, utils in ((6, {1: 50}), (7, {1: 10, 2: 90})):
        nvml.period(k, utils)
        w2 = s.read("GPU-a")
        assert w2.start_us == w.end_us             # no gap, no overlap
        assert w2.duration_s == pytest.approx(P / 1e6)
        assert not w2.coarse
        for pid in (1, 2):
            assert w2.share(pid) == pytest.approx(utils.get(pid, 0) / 100)
        w = w2


@pytest.mark.parametrize("idle", IDLE_TREATMENTS)
@pytest.mark.parametrize("period_us", PERIODS)
def test_reading_faster_than_the_period_measures_either_idle_treatment(period_us: int,
                                                                       idle: str) -> None:
    """The daemon's 100 ms tick against periods of 1/6 s and 1 s: each read
    covers at most one new period, where averaging idle periods in and
    skipping them agree, so the busy time measured is the busy time run, for
    processes that run in some periods and not in others."""
    rng = random.Random(period_us)
    nvml = FakeNvml(period_us, idle)
    s = make(nvml)
    s.read("GPU-a")
    start = nvml.now_us
    got: dict[int, float] = {}
    coarse = []
    for tick in range(1, 120):
        t = T0 + tick * 100_000
        # pid 1 busy 40 % of the time; pid 2 in bursts, idle in between
        nvml.buf.run(1, t - 100_000, t, 0.4)
        if (tick // 7) % 2 == 0:
            nvml.buf.run(2, t - 100_000, t, rng.choice([0.2, 0.35, 0.55]))
        nvml.now_us = t
        nvml.buf.publish(t)
        w = s.read("GPU-a")
        if w is not None and w.busy_s:
            coarse.append(w.coarse)
            for pid, b in w.busy_s.items():
                got[pid] = got.get(pid, 0.0) + b
    end = s._gpus["GPU-a"].last_seen_us
    ks = range(0, (end - T0) // period_us)
    # only the first window, before the period was learnt, may look coarse
    assert not any(coarse[1:])
    for pid in (1, 2):
        truth = nvml.buf.truth(pid, [k for k in ks if nvml.buf.end_us(k) > start])
        # within NVML's whole percents of a period, per period
        assert got[pid] == pytest.approx(truth, abs=0.005 * len(ks) * period_us / 1e6 + 1e-9)


@pytest.mark.parametrize("idle", IDLE_TREATMENTS)
def test_a_read_over_several_periods_bounds_the_share(idle: str) -> None:
    """A late read covers two periods: pid 1 ran in both, pid 2 only in the
    second. Its one entry can't say which; the window gives bounds that hold
    whether NVML averaged the idle period in or skipped it."""
    nvml = FakeNvml(PERIOD_FAST_US, idle)
    P = PERIOD_FAST_US
    nvml.period(0, {1: 50})
    s = make(nvml)
    s.read("GPU-a")
    nvml.period(1, {1: 50})
    s.read("GPU-a")                                # the period is learnt
    nvml.period(2, {1: 50})
    nvml.period(3, {1: 10, 2: 90})
    w = s.read("GPU-a")
    assert w.coarse and w.periods == pytest.approx(2.0)
    assert (w.start_us, w.end_us) == (T0 + 2 * P, T0 + 4 * P)
    truth = {1: 0.30, 2: 0.45}
    for pid, true_share in truth.items():
        assert w.share_low(pid) - 1e-9 <= true_share <= w.share(pid) + 1e-9
    assert w.share(1) == pytest.approx(0.30)       # ran in both: exact either way
    # the next single-period window is exact again
    nvml.period(4, {2: 20})
    w = s.read("GPU-a")
    assert not w.coarse and w.share(2) == pytest.approx(0.20)


def test_entries_with_lagging_timestamps_stay_in_their_window() -> None:
    """Entries of one call may carry different timestamps (a process that
    stopped lags one that runs): the window ends at the newest, and the next
    read asks for what is newer than that."""
    nvml = FakeNvml(PERIOD_FAST_US, "average")
    P = PERIOD_FAST_US
    nvml.period(0, {1: 50, 2: 50})
    s = make(nvml)
    s.read("GPU-a")
    nvml.period(1, {1: 50, 2: 50})
    s.read("GPU-a")
    nvml.period(2, {1: 40, 2: 60})
    nvml.period(3, {1: 40})
    w = s.read("GPU-a")
    assert w.end_us == T0 + 4 * P
    assert w.share(2) == pytest.approx(0.30)       # 60 % over one of two periods
    nvml.period(4, {1: 40})
    s.read("GPU-a")
    assert nvml.calls[-1] == ("GPU-a", T0 + 4 * P)


def test_odd_entries_are_clamped_or_dropped() -> None:
    """A driver's odd entries (nvtop #110): smUtil above 100, entries not newer
    than lastSeenTimeStamp, a pid twice. Clamped, dropped, the newest kept;
    the busy time never exceeds the window."""
    nvml = FakeNvml(PERIOD_FAST_US, "average")
    P = PERIOD_FAST_US
    nvml.period(0, {1: 100})
    s = make(nvml)
    s.read("GPU-a")
    nvml.period(1, {1: 30})
    nvml.buf.extra = [Sample(7, T0 + P, 4_000_000_000),     # stale: as old as last seen
                      Sample(1, T0 + 2 * P - 50_000, 99),    # pid 1 again, older
                      Sample(9, T0 + 2 * P, 250)]            # above 100
    w = s.read("GPU-a")
    assert 7 not in w.busy_s
    assert sum(w.busy_s.values()) <= w.duration_s + 1e-9
    assert w.share(9) == pytest.approx(1 / 1.3)                # 100 and 30, scaled to the window
    assert w.share(1) == pytest.approx(0.3 / 1.3)


@pytest.mark.parametrize("period_us", PERIODS)
def test_not_found_means_no_new_window_until_idle_is_certain(period_us: int) -> None:
    nvml = FakeNvml(period_us, "average")
    P = period_us
    nvml.period(0, {1: 100})
    s = make(nvml)
    s.read("GPU-a")
    nvml.period(1, {1: 40})
    assert s.read("GPU-a").share(1) == pytest.approx(0.4)
    # the next period is not closed yet: NOT_FOUND, nothing new
    nvml.now_us += P // 2
    assert s.read("GPU-a") is None
    # nobody ran for several periods: NOT_FOUND again, now a window of zeros
    nvml.now_us += 5 * P
    w = s.read("GPU-a")
    assert w is not None and w.busy_s == {} and w.duration_s >= 2 * P / 1e6
    assert w.start_us == T0 + 2 * P
    # and the next real window starts where that one ended
    nvml.period(10, {1: 20})
    nvml.now_us = nvml.buf.end_us(10)
    w2 = s.read("GPU-a")
    assert w2.start_us == w.end_us and w2.end_us == T0 + 11 * P


def test_idle_is_not_declared_before_the_period_is_known() -> None:
    """Until the period is learnt it may be as long as NVIDIA's longest (1 s):
    a second without an entry is not yet idleness."""
    nvml = FakeNvml(PERIOD_SLOW_US, "average")
    s = make(nvml)
    s.read("GPU-a")                                # nothing yet: baseline is now
    nvml.now_us += 1_500_000
    assert s.read("GPU-a") is None
    assert s.period_s("GPU-a") == 1.0


def test_errors_are_logged_and_survived(caplog: pytest.LogCaptureFixture) -> None:
    nvml = FakeNvml()
    nvml.period(0, {1: 100})
    s = make(nvml)
    s.read("GPU-a")
    nvml.period(1, {1: 40})
    nvml.fail_next = [15, 999]   # GPU_IS_LOST, UNKNOWN
    with caplog.at_level(logging.WARNING, logger="vgpuctl.governor.sampler"):
        assert s.read("GPU-a") is None
        assert s.read("GPU-a") is None
    assert "GPU-a" in caplog.text
    # the samples were not lost: the next good read covers them
    w = s.read("GPU-a")
    assert w.share(1) == pytest.approx(0.4)


def test_unknown_gpu_does_not_raise(caplog: pytest.LogCaptureFixture) -> None:
    s = make(FakeNvml())
    with caplog.at_level(logging.WARNING, logger="vgpuctl.governor.sampler"):
        assert s.read("GPU-missing") is None
        assert s.read("GPU-missing") is None
    assert "GPU-missing" in caplog.text


def test_pynvml_success_with_no_samples_is_not_an_error(caplog: pytest.LogCaptureFixture) -> None:
    # pynvml raises NVMLError(NVML_SUCCESS) when the size query returns no
    # samples at all: that is "nothing new", not a failure
    nvml = FakeNvml()
    nvml.period(0, {1: 100})
    s = make(nvml)
    s.read("GPU-a")
    nvml.fail_next = [0, 0, 0]
    with caplog.at_level(logging.WARNING, logger="vgpuctl.governor.sampler"):
        for _ in range(3):
            assert s.read("GPU-a") is None
    assert not caplog.records                      # nothing to warn about
    # and the next period reads as usual, through the handle it had
    nvml.period(1, {1: 40})
    assert s.read("GPU-a").share(1) == pytest.approx(0.4)
    assert nvml.lookups == 1


@pytest.mark.parametrize("period_us", PERIODS)
def test_period_is_learnt_from_sample_spacing(period_us: int) -> None:
    # idle periods in between: spacings of two and three periods
    nvml = FakeNvml(period_us, "skip")
    s = make(nvml)
    nvml.period(0, {7: 50})
    s.read("GPU-a")
    for k in (1, 2, 4, 5, 8, 9, 10):
        nvml.period(k, {7: 50})
        s.read("GPU-a")
    assert s.period_s("GPU-a") == pytest.approx(period_us / 1e6)


# ---- following idle periods (the compute governor's sampler) --------------------

def follow(nvml: FakeNvml, offset_us: int = 0) -> Sampler:
    """The governor's sampler; offset_us: how far this host's clock is ahead
    of NVML's timestamps."""
    return Sampler(nvml, clock_us=lambda: nvml.now_us + offset_us, follow_idle=True)


def tick(nvml: FakeNvml, s: Sampler, t_us: int, lag_us: int = 0,
         busy: dict[int, float] | None = None) -> object:
    """100 ms of the GPU up to t_us (pids busy at these shares), periods
    published lag_us after they end, then one read, as the daemon's tick."""
    for pid, share in (busy or {}).items():
        nvml.buf.run(pid, t_us - 100_000, t_us, share)
    nvml.now_us = t_us
    nvml.buf.publish(t_us - lag_us)
    return s.read("GPU-a")


@pytest.mark.parametrize("idle", IDLE_TREATMENTS)
@pytest.mark.parametrize("period_us", PERIODS)
@pytest.mark.parametrize("phase_us", [0, 30_000, 70_000])
def test_after_idle_periods_the_first_window_is_one_period(period_us: int, idle: str,
                                                           phase_us: int) -> None:
    """A process ran, the GPU was idle for a while (the daemon reading it
    every 100 ms, NVML publishing 25 ms after a period ends), then a new
    process runs: the first window holding it covers one period, not all
    since the last entry, and gives its busy time exactly (a new job's first
    cost is taken from it). Without following the idle periods that window
    was coarse (several periods in one read), its busy time only bounded."""
    nvml = FakeNvml(period_us, idle)
    s = follow(nvml)
    t = T0 + phase_us
    s.read("GPU-a")
    for _ in range(60):                          # a job runs 6 s...
        t += 100_000
        tick(nvml, s, t, 25_000, {1: 0.5})
    for _ in range(25):                          # ...the GPU idle for 2.5 s
        t += 100_000
        tick(nvml, s, t, 25_000)
    start = t
    got = None
    for _ in range(2 * period_us // 100_000 + 3):
        t += 100_000
        w = tick(nvml, s, t, 25_000, {2: 0.3})
        if w is not None and w.busy_s.get(2):
            got = w
            break
    assert got is not None
    assert not got.coarse, got
    assert got.end_us - got.start_us == pytest.approx(period_us, abs=1)
    k = (got.end_us - T0) // period_us - 1
    assert got.busy_s[2] == pytest.approx(nvml.buf.truth(2, [k]), abs=0.005 * period_us / 1e6)
    assert got.start_us < start + period_us      # its first period, not a later one


@pytest.mark.parametrize("offset_us", [0, 40_000, -40_000])
@pytest.mark.parametrize("lag_us", [0, 25_000, 140_000, 400_000])
def test_following_idle_periods_loses_no_busy_time(lag_us: int, offset_us: int) -> None:
    """Whatever NVML's publishing lag (up to a few hundred ms, as seen on
    real GPUs) and however far this host's clock is from NVML's timestamps,
    following idle periods never moves lastSeenTimeStamp past a period not
    yet published: every busy second NVML recorded is in some window."""
    rng = random.Random(lag_us + offset_us)
    P = PERIOD_FAST_US
    nvml = FakeNvml(P, "average")
    s = follow(nvml, offset_us)
    t = T0
    s.read("GPU-a")
    got = 0.0
    for n in range(400):                         # bursts and idle stretches
        t += 100_000
        busy = {1: rng.choice([0.2, 0.5, 0.9])} if (n // 13) % 2 == 0 else {}
        w = tick(nvml, s, t, lag_us, busy)
        if w is not None:
            got += w.busy_s.get(1, 0.0)
    for _ in range(40):                          # the last periods published
        t += 100_000
        w = tick(nvml, s, t, lag_us)
        if w is not None:
            got += w.busy_s.get(1, 0.0)
    truth = nvml.buf.truth(1, range(0, (t - lag_us - T0) // P))
    periods = (t - T0) // P
    assert got == pytest.approx(truth, abs=0.005 * periods * P / 1e6 + 1e-9)

