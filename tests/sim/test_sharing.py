"""What makes the simulated GPU one device shared by every process: memory
one process holds is gone for the others (and comes back when it dies, even
by SIGKILL), kernels of all processes take turns on one timeline, and
CUDA_VISIBLE_DEVICES, fault injection, tags and `vgpuctl sim` act on the
same state."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time

import pytest
from support.sim import VGPUCTL, Holder, burn, busy_by_tag, holding, run_py

MiB = 1 << 20
GiB = 1 << 30
CTX = 300 * MiB



def hold(gpu: int, nbytes: int) -> str:
    return f"""
ck(cu.cuInit(0))
ctx = ck(cu.cuDevicePrimaryCtxRetain({gpu})); ck(cu.cuCtxSetCurrent(ctx))
p = ck(cu.cuMemAlloc({nbytes}))
out({{"pid": os.getpid()}})
"""


MEM_INFO_GPU1 = """
ck(cu.cuInit(0))
ctx = ck(cu.cuDevicePrimaryCtxRetain(1)); ck(cu.cuCtxSetCurrent(ctx))
out(list(ck(cu.cuMemGetInfo())))
"""


def sim_stats(env: dict[str, str]) -> dict:
    res = subprocess.run([*VGPUCTL, "sim", "stats", "--json"], env=env, capture_output=True,
                         text=True, check=True)
    return json.loads(res.stdout)


def test_memory_held_by_one_process_is_gone_for_the_others(sim_env):
    with holding(sim_env, hold(1, 3 * GiB)):
        free, total = run_py(sim_env, MEM_INFO_GPU1)
    assert total == 16 * GiB
    assert free == 16 * GiB - (3 * GiB + CTX) - CTX  # the holder's, then our own context
    free_after, _ = run_py(sim_env, MEM_INFO_GPU1)
    assert free_after == 16 * GiB - CTX


def test_memory_of_a_killed_process_comes_back(sim_env):
    holder = Holder(sim_env, hold(1, 5 * GiB))
    assert sim_stats(sim_env)["devices"][1]["used"] == 5 * GiB + CTX
    holder.kill()  # SIGKILL: no chance to free anything
    free, _ = run_py(sim_env, MEM_INFO_GPU1)
    assert free == 16 * GiB - CTX
    stats = sim_stats(sim_env)
    assert stats["devices"][1]["used"] == 0
    assert stats["processes"] == []


def test_a_device_cannot_be_overcommitted_across_processes(sim_env):
    with holding(sim_env, hold(0, 10 * GiB)):
        out = run_py(sim_env, """
            ck(cu.cuInit(0))
            ctx = ck(cu.cuDevicePrimaryCtxRetain(0)); ck(cu.cuCtxSetCurrent(ctx))
            out([err(cu.cuMemAlloc(6 << 30)), err(cu.cuMemAlloc(5 << 30))])
        """)
    assert out == ["CUDA_ERROR_OUT_OF_MEMORY", "CUDA_SUCCESS"]


def test_two_burners_share_the_device_time(sim_env, burn_program):
    args = ("--kernel-us", "2000", "--seconds", "1.5")
    solo = burn(sim_env, str(burn_program), *args)
    assert solo["rc"] == 0, solo
    results: list[dict] = []
    threads = [threading.Thread(target=lambda: results.append(
        burn(sim_env, str(burn_program), *args))) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert [r["rc"] for r in results] == [0, 0], results
    for r in results:
        assert 0.35 <= r["rate"] / solo["rate"] <= 0.65, (solo, results)
    # the simulator's own timeline agrees: the device was busy all along
    busy = sum(d["busy_ns"] for d in sim_stats(sim_env)["devices"]) / 1e9
    assert busy == pytest.approx(sum(r["kernels"] for r in [solo, *results]) * 0.002, rel=0.01)


def test_different_gpus_do_not_share_time(sim_env, burn_program):
    results: list[dict] = []
    threads = [threading.Thread(target=lambda d=d: results.append(
        burn(sim_env, str(burn_program), "--device", str(d), "--kernel-us", "2000",
             "--seconds", "1"))) for d in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    # 2 ms kernels: 500/s each when the GPUs run independently, at most 250/s
    # each if they shared one timeline. The bound sits well between the two,
    # so a loaded machine's lateness can't fail it but sharing would.
    assert all(r["rate"] > 330 for r in results), results


def _concurrently(*calls):
    results: list = [None] * len(calls)

    def run(i, call):
        results[i] = call()

    threads = [threading.Thread(target=run, args=(i, c)) for i, c in enumerate(calls)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results


def test_time_slices_divide_the_device_by_time_not_by_kernels(sim_env, burn_program):
    """Two saturating processes get the device half each, however long their
    kernels: the device takes turns in time slices, not kernel by kernel (one
    kernel each, in turn, would give the 100 us kernels 2 % of it)."""
    def job(tag: str, *args: str):
        return lambda: burn({**sim_env, "VGPU_SIM_TAG": tag}, str(burn_program),
                            "--seconds", "2", *args)

    short, long_ = _concurrently(job("short", "--kernel-us", "100", "--inflight", "40"),
                                 job("long", "--kernel-us", "5000", "--inflight", "2"))
    assert short["rc"] == 0 and long_["rc"] == 0, (short, long_)
    busy = busy_by_tag(sim_env)
    share = busy["short"] / (busy["short"] + busy["long"])
    assert 0.4 <= share <= 0.6, busy


def test_a_kernel_waits_at_most_a_time_slice_behind_another_process(sim_env, burn_program):
    """A process's kernel starts once the process that holds the device has
    used up its time slice, even behind a queue of 20 ms kernels, which are
    preempted and resume later (first-come, first-served keeps it waiting
    behind at least the kernel that runs, up to 20 ms)."""
    env = {**sim_env, "VGPU_SIM_TIMESLICE_US": "2000", "VGPU_SIM_SWITCH_US": "25"}
    busy = subprocess.Popen([str(burn_program), "--kernel-us", "20000", "--inflight", "8",
                             "--seconds", "3"], env=env, stdout=subprocess.PIPE, text=True)
    try:
        time.sleep(0.3)     # its queue is full (not a synchronisation: the bound holds anyway)
        client = burn(env, str(burn_program), "--kernel-us", "100", "--request", "1",
                      "--think-ms", "5", "--count", "40")
    finally:
        busy.wait(timeout=30)
    assert client["rc"] == 0, client
    # device time from the request's start to its kernel's end: the slice's
    # rest, a switch and the kernel, and what the host took between queueing
    # the start event and the kernel (a little, on a loaded machine more)
    assert max(client["device_ms"]) < 2.0 + 0.025 + 0.1 + 2.0, client["device_ms"]
    stats = sim_stats(env)
    assert stats["timeslice_us"] == 2000 and stats["switch_us"] == 25
    assert stats["devices"][0]["switches"] >= 2 * 40


VISIBLE = """
r = cu.cuInit(0)
if err(r) != "CUDA_SUCCESS":
    out(err(r))
else:
    import uuid
    out([str(uuid.UUID(bytes=bytes(ck(cu.cuDeviceGetUuid(i)).bytes)))
         for i in range(ck(cu.cuDeviceGetCount()))])
"""


@pytest.fixture
def uuids(sim_env) -> list[str]:
    """The physical GPUs' UUIDs without "GPU-", in NVML (physical) order."""
    names = run_py(sim_env, """
        import pynvml as N
        N.nvmlInit()
        out([N.nvmlDeviceGetUUID(N.nvmlDeviceGetHandleByIndex(i)) for i in range(2)])
    """)
    return [n[4:] for n in names]


@pytest.mark.parametrize("visible,expect", [
    ("1", [1]),
    ("1,0", [1, 0]),
    (" 1 , 0 ", [1, 0]),
    ("0,7,1", [0]),          # stops at the first invalid entry
    ("0,0", [0]),            # and at a repeated one
    ("GPU-{1}", [1]),
    ("GPU-{1:.8},0", [1, 0]),  # a unique prefix is enough
    ("GPU-,1", "CUDA_ERROR_NO_DEVICE"),  # ambiguous prefix: nothing before it
    ("", "CUDA_ERROR_NO_DEVICE"),
    ("-1", "CUDA_ERROR_NO_DEVICE"),
])
def test_cuda_visible_devices(sim_env, uuids, visible, expect):
    sim_env["CUDA_VISIBLE_DEVICES"] = visible.format(*uuids)
    out = run_py(sim_env, VISIBLE)
    if isinstance(expect, str):
        assert out == expect
    else:
        assert out == [uuids[i] for i in expect]


def test_injected_allocation_failures(sim_env, burn_program):
    alloc = """
        ck(cu.cuInit(0))
        ctx = ck(cu.cuDevicePrimaryCtxRetain(0)); ck(cu.cuCtxSetCurrent(ctx))
        out([err(cu.cuMemAlloc(1 << 20)) for _ in range(3)])
    """
    run_py(sim_env, "ck(cu.cuInit(0)); out(1)")  # the state exists
    subprocess.run([*VGPUCTL, "sim", "fault", "--fail-allocs", "2", "--gpu", "0"], env=sim_env,
                   check=True)
    assert sim_stats(sim_env)["devices"][0]["fail_allocs"] == 2
    # the context is no allocation: it still comes up
    assert run_py(sim_env, alloc) == ["CUDA_ERROR_OUT_OF_MEMORY"] * 2 + ["CUDA_SUCCESS"]
    subprocess.run([*VGPUCTL, "sim", "fault", "--fail-allocs", "1", "--gpu", "0"], env=sim_env,
                   check=True)
    r = burn(sim_env, str(burn_program), "--kernel-us", "10", "--count", "1", "--alloc", "1M")
    assert (r["rc"], r["error"], r["call"]) == (2, "CUDA_ERROR_OUT_OF_MEMORY", "cuMemAlloc")
    subprocess.run([*VGPUCTL, "sim", "fault", "--fail-allocs", "5", "--gpu", "1"], env=sim_env,
                   check=True)
    subprocess.run([*VGPUCTL, "sim", "fault", "--clear"], env=sim_env, check=True)
    assert run_py(sim_env, alloc) == ["CUDA_SUCCESS"] * 3


def test_tags_record_a_jobs_peak_and_time(sim_env, burn_program):
    env = dict(sim_env, VGPU_SIM_TAG="job-a")
    for size in ("1G", "2G"):
        r = burn(env, str(burn_program), "--kernel-us", "1000", "--count", "50", "--alloc", size)
        assert r["rc"] == 0, r
    burn(sim_env, str(burn_program), "--kernel-us", "1000", "--count", "10")  # untagged
    tag = next(t for t in sim_stats(sim_env)["tags"] if t["name"] == "job-a")
    gpu0 = tag["devices"][0]
    assert gpu0["used"] == 0  # both processes are gone
    assert gpu0["peak"] == 2 * GiB + CTX
    assert gpu0["busy_ns"] == 100 * 1_000_000


def test_stats_text_and_reset(sim_env):
    res = subprocess.run([*VGPUCTL, "sim", "stats"], env=sim_env, capture_output=True, text=True,
                         check=False)
    assert res.returncode != 0 and "no simulated GPU state" in res.stderr
    with holding(sim_env, hold(0, GiB)) as holder:
        text = subprocess.run([*VGPUCTL, "sim", "stats"], env=sim_env, capture_output=True,
                              text=True, check=True).stdout
        assert "2 GPU(s)" in text and str(holder.pid) in text
        refused = subprocess.run([*VGPUCTL, "sim", "reset"], env=sim_env, capture_output=True,
                                 text=True, check=False)
        assert refused.returncode != 0 and "1 live process" in refused.stderr
        assert sim_stats(sim_env)["devices"][0]["used"] == GiB + CTX
        subprocess.run([*VGPUCTL, "sim", "reset", "--force"], env=sim_env, check=True)
        holder.stop()
    res = subprocess.run([*VGPUCTL, "sim", "stats"], env=sim_env, capture_output=True, text=True,
                         check=False)
    assert res.returncode != 0


def test_another_configuration_replaces_an_unused_state_only(sim_env):
    count = """
        r = cu.cuInit(0)
        out(ck(cu.cuDeviceGetCount()))
    """
    assert run_py(sim_env, count) == 2
    with holding(sim_env, hold(0, MiB)):
        busy = dict(sim_env, VGPU_SIM="4x8G")
        assert run_py(busy, count) == 2  # in use: kept as it is
    assert run_py(dict(sim_env, VGPU_SIM="4x8G"), count) == 4
    assert sim_stats(sim_env)["memory"] == 8 * GiB


def wait_for_memory_back(env: dict[str, str], gpu: int) -> dict:
    deadline = time.monotonic() + 10
    while True:
        stats = sim_stats(env)
        if stats["devices"][gpu]["used"] == 0 or time.monotonic() > deadline:
            return stats
        time.sleep(0.05)


def test_exec_gives_the_memory_back(sim_env):
    """A process that execs another program loses its CUDA state, as with the
    real driver (its device files close on exec): same pid, memory back."""
    with holding(sim_env, """
        ck(cu.cuInit(0))
        ctx = ck(cu.cuDevicePrimaryCtxRetain(0)); ck(cu.cuCtxSetCurrent(ctx))
        p = ck(cu.cuMemAlloc(2 << 30))
        out({"pid": os.getpid()})
        os.execv("/bin/sleep", ["sleep", "60"])
    """) as holder:
        stats = wait_for_memory_back(sim_env, 0)
        assert holder.proc.poll() is None  # still there, as `sleep`
    assert stats["devices"][0]["used"] == 0
    assert stats["processes"] == []


def test_a_forked_child_does_not_keep_its_parents_memory(sim_env):
    """A child forked after CUDA init (a data-loader worker) and outliving its
    parent must not keep the parent's memory alive."""
    with holding(sim_env, """
        ck(cu.cuInit(0))
        ctx = ck(cu.cuDevicePrimaryCtxRetain(0)); ck(cu.cuCtxSetCurrent(ctx))
        p = ck(cu.cuMemAlloc(2 << 30))
        child = os.fork()
        if child == 0:
            time.sleep(60)
            os._exit(0)
        out({"child": child})
    """) as parent:
        child = parent.report["child"]
        try:
            assert sim_stats(sim_env)["devices"][0]["used"] == 2 * GiB + CTX
            parent.kill()
            stats = wait_for_memory_back(sim_env, 0)
            os.kill(child, 0)  # the child still runs
        finally:
            os.kill(child, signal.SIGKILL)
    assert stats["devices"][0]["used"] == 0
