"""The NVML sampler against a fake NVML: last-seen timestamps, windows that
tile the timeline, NOT_FOUND, errors. No real NVML, no clocks."""

from __future__ import annotations

import logging

import pytest
from support.fake_nvml import T0, NVMLError, Sample

from vgpuctl.governor.sampler import Sampler

P = 100_000          # sample period, us


class FakeNvml:
    """Per GPU a list of samples; returns those newer than lastSeenTimeStamp,
    NOT_FOUND when there are none, as the real function does."""

    NVMLError = NVMLError

    def __init__(self) -> None:
        self.samples: dict[str, list[Sample]] = {}
        self.calls: list[tuple[str, int]] = []
        self.fail_next: list[int] = []
        self.lookups = 0            # nvmlDeviceGetHandleByUUID calls
        self.now_us = T0

    def nvmlDeviceGetHandleByUUID(self, uuid: str) -> str:
        self.lookups += 1
        if uuid not in self.samples:
            raise NVMLError(6)
        return uuid

    def nvmlDeviceGetProcessUtilization(self, handle: str, last_seen: int) -> list[Sample]:
        self.calls.append((handle, last_seen))
        if self.fail_next:
            raise NVMLError(self.fail_next.pop(0))
        out = [s for s in self.samples[handle] if s.timeStamp > last_seen]
        if not out:
            raise NVMLError(6)  # NVML_ERROR_NOT_FOUND
        return out

    def period(self, uuid: str, k: int, utils: dict[int, int]) -> None:
        """Close sample period k (ending at T0 + (k+1) * P) with these smUtils."""
        ts = T0 + (k + 1) * P
        self.samples.setdefault(uuid, []).extend(
            Sample(pid, ts, u) for pid, u in utils.items() if u > 0)
        self.now_us = max(self.now_us, ts)


@pytest.fixture
def nvml() -> FakeNvml:
    f = FakeNvml()
    f.samples["GPU-a"] = []
    return f


def make(nvml: FakeNvml) -> Sampler:
    return Sampler(nvml, clock_us=lambda: nvml.now_us)


def test_first_read_is_a_baseline_then_windows_tile(nvml: FakeNvml) -> None:
    for k in range(5):  # history from before the sampler started
        nvml.period("GPU-a", k, {1: 100})
    s = make(nvml)
    assert s.read("GPU-a") is None                 # baseline
    assert nvml.calls[-1] == ("GPU-a", 0)
    nvml.period("GPU-a", 5, {1: 30, 2: 60})
    w = s.read("GPU-a")
    assert w is not None
    # lastSeenTimeStamp is the newest timestamp already seen
    assert nvml.calls[-1] == ("GPU-a", T0 + 5 * P)
    assert (w.start_us, w.end_us) == (T0 + 5 * P, T0 + 6 * P)
    assert w.share(1) == pytest.approx(0.30)
    assert w.share(2) == pytest.approx(0.60)
    assert w.share(3) == 0.0
    nvml.period("GPU-a", 6, {1: 50})
    nvml.period("GPU-a", 7, {1: 10, 2: 90})
    w2 = s.read("GPU-a")
    assert w2.start_us == w.end_us                 # no gap, no overlap
    assert w2.duration_s == pytest.approx(0.2)
    assert w2.share(1) == pytest.approx(0.30)      # (50 + 10) / 2
    assert w2.share(2) == pytest.approx(0.45)      # (0 + 90) / 2: absent = 0


def test_not_found_means_no_new_window_until_idle_is_certain(nvml: FakeNvml) -> None:
    nvml.period("GPU-a", 0, {1: 100})
    s = make(nvml)
    s.read("GPU-a")
    nvml.period("GPU-a", 1, {1: 40})
    assert s.read("GPU-a").share(1) == pytest.approx(0.4)
    # the next period is not closed yet: NOT_FOUND, nothing new
    nvml.now_us += P // 2
    assert s.read("GPU-a") is None
    # nobody ran for several periods: NOT_FOUND again, now a window of zeros
    nvml.now_us += 5 * P
    w = s.read("GPU-a")
    assert w is not None and w.busy_s == {} and w.duration_s > 0.2
    assert w.start_us == T0 + 2 * P
    # and the next real window starts where that one ended
    nvml.period("GPU-a", 10, {1: 20})
    w2 = s.read("GPU-a")
    assert w2.start_us == w.end_us
    assert w2.share(1) == pytest.approx(0.2 * P / (w2.end_us - w2.start_us))


def test_errors_are_logged_and_survived(nvml: FakeNvml, caplog: pytest.LogCaptureFixture) -> None:
    nvml.period("GPU-a", 0, {1: 100})
    s = make(nvml)
    s.read("GPU-a")
    nvml.period("GPU-a", 1, {1: 40})
    nvml.fail_next = [15, 999]   # GPU_IS_LOST, UNKNOWN
    with caplog.at_level(logging.WARNING, logger="vgpuctl.governor.sampler"):
        assert s.read("GPU-a") is None
        assert s.read("GPU-a") is None
    assert "GPU-a" in caplog.text
    # the samples were not lost: the next good read covers them
    w = s.read("GPU-a")
    assert w.share(1) == pytest.approx(0.4)


def test_unknown_gpu_does_not_raise(nvml: FakeNvml, caplog: pytest.LogCaptureFixture) -> None:
    s = make(nvml)
    with caplog.at_level(logging.WARNING, logger="vgpuctl.governor.sampler"):
        assert s.read("GPU-missing") is None
        assert s.read("GPU-missing") is None
    assert "GPU-missing" in caplog.text


def test_pynvml_success_with_no_samples_is_not_an_error(nvml: FakeNvml,
                                                        caplog: pytest.LogCaptureFixture) -> None:
    # pynvml raises NVMLError(NVML_SUCCESS) when the size query returns no
    # samples at all: that is "nothing new", not a failure
    nvml.period("GPU-a", 0, {1: 100})
    s = make(nvml)
    s.read("GPU-a")
    nvml.fail_next = [0, 0, 0]
    with caplog.at_level(logging.WARNING, logger="vgpuctl.governor.sampler"):
        for _ in range(3):
            assert s.read("GPU-a") is None
    assert not caplog.records                      # nothing to warn about
    # and the next period reads as usual, through the handle it had
    nvml.period("GPU-a", 1, {1: 40})
    assert s.read("GPU-a").share(1) == pytest.approx(0.4)
    assert nvml.lookups == 1


def test_period_is_learnt_from_sample_spacing(nvml: FakeNvml) -> None:
    # a driver with a 1/6 s period, an idle period in the middle
    per = 166_667
    s = make(nvml)
    for k in (0, 1, 2, 4, 5):
        nvml.samples["GPU-a"].append(Sample(7, T0 + (k + 1) * per, 50))
    nvml.now_us = T0 + 6 * per
    s.read("GPU-a")
    assert s.period_s("GPU-a") == pytest.approx(per / 1e6, rel=1e-3)
    nvml.samples["GPU-a"].append(Sample(7, T0 + 7 * per, 50))
    w = s.read("GPU-a")
    assert w.share(7) == pytest.approx(0.5, rel=1e-3)


def test_busy_never_exceeds_the_window(nvml: FakeNvml) -> None:
    nvml.period("GPU-a", 0, {1: 100})
    s = make(nvml)
    s.read("GPU-a")
    # two processes reported 80 % each in one period (rounding or a driver
    # quirk): shares are scaled so that they sum to at most the window
    nvml.period("GPU-a", 1, {1: 80, 2: 80})
    w = s.read("GPU-a")
    assert sum(w.busy_s.values()) <= w.duration_s + 1e-9
    assert w.share(1) == pytest.approx(0.5)
