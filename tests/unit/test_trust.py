"""Region trust (vgpuctl.core.tamper): a verdict that closes a job's gate rests
on proof, never on timing. The proof is what the hook can never have
written: an impossible value (check_counters), or a launch or GPU-time
counter that went back (went_back: the hook only ever adds to them)."""

from __future__ import annotations

import pytest

from vgpuctl.core.job import DeviceUsage
from vgpuctl.core.tamper import check_counters, went_back

G = 1 << 30


def test_counters_the_hook_cannot_write():
    ok = [DeviceUsage(used=G, peak=2 * G)]
    assert check_counters(ok, [16 * G], [4 * G]) is None
    bad = [DeviceUsage(used=G, peak=40 * G)]
    assert "far more than the GPU's" in check_counters(bad, [16 * G], [4 * G])


def test_a_peak_up_to_twice_the_larger_of_the_gpu_and_the_limit_is_a_reading():
    # A limit may be set above what the GPU has (or below what is held):
    # twice the larger of the two is the bound, not the GPU alone.
    assert check_counters([DeviceUsage(peak=2 * 16 * G)], [16 * G], [4 * G]) is None
    assert check_counters([DeviceUsage(peak=2 * 16 * G + 1)], [16 * G], [4 * G]) is not None
    assert check_counters([DeviceUsage(peak=2 * 40 * G)], [16 * G], [40 * G]) is None


def test_the_counters_of_each_gpu_are_checked_against_that_gpu():
    devs = [DeviceUsage(peak=G), DeviceUsage(peak=100 * G)]
    assert check_counters(devs, [16 * G, 80 * G], [0, 0]) is None
    assert check_counters(devs, [16 * G, 16 * G], [0, 0]) is not None


def test_gpu_time_and_launches_the_hook_may_write_are_no_proof():
    # check_counters judges memory only: a job's GPU time is its own figure
    # (a lie about it bills the job itself), and no value of it is impossible.
    huge = [DeviceUsage(busy_ns=2**64 - 1, launches=2**64 - 1, borrowed_ns=2**64 - 1,
                        cost_ns=2**64 - 1)]
    assert check_counters(huge, [16 * G], [4 * G]) is None


@pytest.mark.parametrize("field", ["launches", "busy_ns"])
def test_a_counter_that_went_back_is_proof(field):
    before = [DeviceUsage(**{field: 500})]
    why = went_back(before, [DeviceUsage(**{field: 499})])
    assert why is not None and "went back by 1" in why
    # to zero, as a job that wipes its counters
    assert "went back by 500" in went_back(before, [DeviceUsage()])


@pytest.mark.parametrize("field", ["launches", "busy_ns"])
def test_equal_or_growing_counters_are_no_proof(field):
    before = [DeviceUsage(**{field: 500})]
    assert went_back(before, [DeviceUsage(**{field: 500})]) is None
    assert went_back(before, [DeviceUsage(**{field: 501})]) is None
    assert went_back(before, [DeviceUsage(**{field: 2**64 - 1})]) is None


def test_went_back_names_the_gpu_whose_counter_went_back():
    before = [DeviceUsage(launches=10, busy_ns=10), DeviceUsage(launches=10, busy_ns=10)]
    ok = [DeviceUsage(launches=11, busy_ns=20), DeviceUsage(launches=10, busy_ns=10)]
    assert went_back(before, ok) is None
    bad = [DeviceUsage(launches=11, busy_ns=20), DeviceUsage(launches=10, busy_ns=9)]
    why = went_back(before, bad)
    assert why is not None and "GPU 1" in why and "GPU-time" in why
    bad = [DeviceUsage(launches=9, busy_ns=20), DeviceUsage(launches=10, busy_ns=10)]
    why = went_back(before, bad)
    assert why is not None and "GPU 0" in why and "launch" in why


def test_other_counters_may_go_down():
    # Memory in use, the last launch's cost, time throttled by the old gate:
    # none of them only grows, so none going down is proof.
    before = [DeviceUsage(used=4 * G, cost_ns=1000, launches=5, busy_ns=5)]
    now = [DeviceUsage(used=G, cost_ns=10, launches=5, busy_ns=5)]
    assert went_back(before, now) is None


def test_no_previous_reading_is_no_proof():
    assert went_back([], [DeviceUsage(launches=3, busy_ns=3)]) is None
    # a GPU the previous reading did not have (a region grown) is not compared
    assert went_back([DeviceUsage(launches=3)], [DeviceUsage(launches=3),
                                                  DeviceUsage()]) is None
