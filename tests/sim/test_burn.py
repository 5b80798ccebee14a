"""vgpu-burn, the workload program: its JSON line, its count and time modes,
--alloc, and one clear line for every bad argument (exit status 2)."""

from __future__ import annotations

import pytest
from support.sim import burn


def test_count_mode_reports_every_kernel(sim_env, burn_program):
    r = burn(sim_env, str(burn_program), "--kernel-us", "1000", "--count", "200", "--device", "1")
    assert r["rc"] == 0, r
    assert r["kernels"] == 200 and r["device"] == 1 and r["kernel_us"] == 1000
    assert r["seconds"] >= 0.199
    assert r["rate"] == pytest.approx(r["kernels"] / r["seconds"], rel=1e-3)
    assert r["pid"] > 0 and "error" not in r


def test_time_mode_runs_that_long(sim_env, burn_program):
    r = burn(sim_env, str(burn_program), "--kernel-us", "500", "--seconds", "0.5",
             "--inflight", "8")
    assert r["rc"] == 0, r
    assert 0.5 <= r["seconds"] < 1.5
    assert r["rate"] == pytest.approx(2000, rel=0.2)  # the device is kept busy


def test_flip_mode_switches_the_kernels_length(sim_env, burn_program):
    # 100 us kernels, 1 ms ones, in turn every 0.25 s, the device kept busy:
    # half the time each, so about 5,000 + 500 kernels in a second (10,000
    # without the flips, 1,000 if they never flipped back)
    r = burn(sim_env, str(burn_program), "--kernel-us", "100", "--flip-us", "1000",
             "--flip-s", "0.25", "--seconds", "1", "--inflight", "8")
    assert r["rc"] == 0, r
    assert 4000 <= r["kernels"] / r["seconds"] <= 7000, r


def test_alloc_beyond_the_device_fails_with_the_error_name(sim_env, burn_program):
    r = burn(sim_env, str(burn_program), "--kernel-us", "10", "--count", "1", "--alloc", "17G")
    assert r["rc"] == 2
    assert (r["error"], r["call"], r["kernels"]) == ("CUDA_ERROR_OUT_OF_MEMORY", "cuMemAlloc", 0)
    ok = burn(sim_env, str(burn_program), "--kernel-us", "10", "--count", "1", "--alloc", "15G")
    assert ok["rc"] == 0 and ok["alloc"] == 15 << 30


def test_a_missing_device_is_a_driver_error(sim_env, burn_program):
    r = burn(sim_env, str(burn_program), "--kernel-us", "10", "--count", "1", "--device", "5")
    assert r["rc"] == 1
    assert (r["error"], r["call"]) == ("CUDA_ERROR_INVALID_DEVICE", "cuDeviceGet")


@pytest.mark.parametrize("args,message", [
    ([], "--kernel-us is required"),
    (["--kernel-us", "5"], "exactly one of --seconds or --count"),
    (["--kernel-us", "5", "--count", "1", "--seconds", "1"], "exactly one of"),
    (["--kernel-us", "-1", "--count", "1"], "--kernel-us needs a positive number"),
    (["--kernel-us", "5", "--count", "1.5"], "--count needs a whole number"),
    (["--kernel-us", "5", "--count", "1", "--alloc", "4X"], "--alloc needs a size"),
    (["--kernel-us", "5", "--count", "1", "--inflight", "0"], "--inflight"),
    (["--kernel-us", "5", "--count", "1", "--bogus"], "unknown option '--bogus'"),
    (["--kernel-us"], "--kernel-us needs a positive number"),
    (["--kernel-us", "5", "--count", "1", "--flip-us", "10"], "both of --flip-us and --flip-s"),
    (["--kernel-us", "5", "--count", "1", "--flip-us", "10", "--flip-s", "1", "--graph", "2"],
     "--flip-us: plain launches"),
])
def test_bad_arguments(sim_env, burn_program, args, message):
    r = burn(sim_env, str(burn_program), *args)
    assert r["rc"] == 2
    first = r["stderr"].splitlines()[0]
    assert first.startswith("vgpu-burn: error: ") and message in first
