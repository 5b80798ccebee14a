"""Every way a program reaches the driver goes through libvgpu.so (issue 3,
interception): linked against libcuda.so.1, dlopen + dlsym, cuGetProcAddress
and cuGetProcAddress_v2 (including the lookup of cuGetProcAddress itself),
NVIDIA's cuda-bindings, and NVML through nvidia-ml-py."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import pytest
from support.hook import (
    CLIENT_MODES,
    CUDA_ERROR_OUT_OF_MEMORY,
    GiB,
    MiB,
    results,
    run,
    slot_of,
)


@pytest.mark.parametrize("mode", list(CLIENT_MODES))
def test_each_path_enforces_the_limit(mode, sim, clients, client_factory):
    region = sim.region([1 * GiB, 1 * GiB])
    c = client_factory(clients[mode], ["ctx", "0", "info", "alloc", "512M", "alloc", "600M",
                                       "info", "launch", "kernel", "3", "hold"],
                       sim.job_env(region.path))
    assert c.until("ctx") == ["0"]
    rc, free, total = c.until("info")
    assert (rc, int(total)) == ("0", GiB)
    ctx_bytes = GiB - int(free)
    assert c.until("alloc")[0] == "0"
    assert c.until("alloc")[0] == str(CUDA_ERROR_OUT_OF_MEMORY)
    rc, free, total = c.until("info")
    assert int(free) == GiB - ctx_bytes - 512 * MiB
    assert c.until("launch") == ["0"]
    c.until("hold")
    # The driver holds exactly what the hook let through: nothing of the refusal.
    assert sim.process_used(c.pid) == ctx_bytes + 512 * MiB
    slot = slot_of(region, c.pid)
    assert slot.allocs == 2 and slot.launches[0] == 3 and slot.used[0] == ctx_bytes + 512 * MiB
    if mode.startswith("gpa"):
        assert slot.get_proc_calls > 0
    c.go()
    assert c.finish()[0] == 0


# (base name, cudaVersion, flags, the versioned symbol the driver answers; None: an error)
LOOKUPS = [
    ("cuGetProcAddress", 12000, 0, "cuGetProcAddress_v2"),
    ("cuGetProcAddress", 11080, 0, "cuGetProcAddress"),
    ("cuMemAlloc", 12080, 0, "cuMemAlloc_v2"),
    ("cuMemAlloc", 12080, 2, "cuMemAlloc_v2"),             # no per-thread form
    ("cuLaunchKernel", 12080, 0, "cuLaunchKernel"),
    ("cuLaunchKernel", 12080, 1, "cuLaunchKernel"),        # legacy stream asked for
    ("cuLaunchKernel", 12080, 2, "cuLaunchKernel_ptsz"),   # per-thread default stream
    ("cuLaunchKernel", 6050, 2, "cuLaunchKernel"),         # _ptsz is newer than 6.5
    ("cuLaunchKernelEx", 12080, 2, "cuLaunchKernelEx_ptsz"),
    ("cuGraphLaunch", 12080, 2, "cuGraphLaunch_ptsz"),
    ("cuMemAllocAsync", 11020, 2, "cuMemAllocAsync_ptsz"),
    ("cuMemFreeAsync", 12080, 0, "cuMemFreeAsync"),
    ("cuMemAllocAsync", 11000, 0, None),                   # version not sufficient
    ("cuCtxCreate", 11000, 0, "cuCtxCreate_v2"),
    ("cuCtxCreate", 11040, 0, "cuCtxCreate_v3"),
    ("cuCtxCreate", 12080, 0, "cuCtxCreate_v4"),
    ("cuDeviceTotalMem", 3000, 0, "cuDeviceTotalMem"),
    ("cuDeviceTotalMem", 12000, 0, "cuDeviceTotalMem_v2"),
    ("cuDevicePrimaryCtxRelease", 10000, 0, "cuDevicePrimaryCtxRelease"),
    ("cuDevicePrimaryCtxRelease", 11000, 0, "cuDevicePrimaryCtxRelease_v2"),
    ("cuDeviceGetCount", 12080, 0, "cuDeviceGetCount"),            # not wrapped
    ("cuStreamQuery", 12080, 2, "cuStreamQuery_ptsz"),              # not wrapped
    ("cuStreamSynchronize", 12080, 2, "cuStreamSynchronize_ptsz"),  # pools settle after it
    ("cuNoSuchFunction", 12080, 0, None),
]
WRAPPED = {"cuGetProcAddress", "cuGetProcAddress_v2", "cuMemAlloc_v2", "cuLaunchKernel",
           "cuLaunchKernel_ptsz", "cuLaunchKernelEx_ptsz", "cuGraphLaunch_ptsz",
           "cuMemAllocAsync_ptsz", "cuMemFreeAsync", "cuCtxCreate_v2", "cuCtxCreate_v3",
           "cuCtxCreate_v4", "cuDeviceTotalMem", "cuDeviceTotalMem_v2",
           "cuDevicePrimaryCtxRelease", "cuDevicePrimaryCtxRelease_v2",
           "cuStreamSynchronize_ptsz"}


def _lookup_run(program, env):
    """[rc, ptr, status, library, symbol, dlsym(libcuda, expected symbol)] per lookup."""
    args = []
    for base, ver, flags, sym in LOOKUPS:
        args += ["lookup", base, str(ver), str(flags), "sym", sym or "none"]
    res = run(program, args, env)
    assert res.returncode == 0, res.stderr
    out = [r + s[2:] for r, s in zip(results(res.stdout, "lookup"), results(res.stdout, "sym"),
                                        strict=True)]
    assert len(out) == len(LOOKUPS)
    return out


@pytest.mark.parametrize("mode", ["gpa_v1", "gpa_v2"])
def test_get_proc_address_forwards_to_exactly_what_the_driver_returns(mode, sim, clients):
    """Each lookup answers as the driver does (result, status, which versioned
    entry point); a wrapped answer is the hook's wrapper of that very symbol,
    an unwrapped one the driver's own function."""
    region = sim.region([GiB, GiB])
    plain = _lookup_run(clients[mode], sim.env)
    hooked = _lookup_run(clients[mode], sim.job_env(region.path))
    for (base, ver, flags, sym), p, h in zip(LOOKUPS, plain, hooked, strict=True):
        what = f"{base} {ver} {flags}"
        assert h[0] == p[0] and h[2] == p[2], what        # same CUresult and status
        if sym is None:
            assert p[0] != "0" and h[1] in ("(nil)", "0x0"), what
            continue
        # Without the hook the driver answers with its symbol `sym`...
        assert p[0] == "0" and p[3] == "libcuda.so.1" and p[1] == p[5], what
        if sym in WRAPPED:
            assert h[3:5] == ["libvgpu.so", sym], what     # ...with it, the wrapper of `sym`
        else:
            assert h[3] == "libcuda.so.1", what             # ...or the driver's, untouched


def test_functions_the_hook_does_not_wrap_reach_the_driver(sim, clients):
    region = sim.region([GiB, GiB])
    res = run(clients["dlsym"], ["ctx", "0", "sym", "cuDeviceGetCount", "sym", "cuMemAlloc_v2",
                                 "ptr", "cuMemAlloc_v2"], sim.job_env(region.path))
    assert res.returncode == 0, res.stderr
    (rc, default, lib), (_, d2, lib2) = results(res.stdout, "sym")
    assert default == "(nil)" and lib != "(nil)"   # not exported by the hook: the driver's
    assert d2 == lib2                              # dlsym(libcuda) gives the hook's wrapper
    assert results(res.stdout, "ptr")[0][1] == d2


def test_rtld_next_still_resolves_from_the_caller(sim, cbuild):
    """Overriding dlsym must not break other interposers' dlsym(RTLD_NEXT)."""
    shim = cbuild("next_shim.so", "next_shim.c", shared=True)
    env = sim.job_env()
    env["LD_PRELOAD"] = f"{env['LD_PRELOAD']}:{shim}"
    res = run(Path(sys.executable), ["-c", "pass"], env)
    assert res.returncode == 0
    assert "next_shim: ok" in res.stderr, res.stderr


CUDA_BINDINGS = textwrap.dedent("""
    from cuda.bindings import driver as cu
    E = cu.CUresult
    MiB = 1 << 20
    (err,) = cu.cuInit(0); assert err == E.CUDA_SUCCESS, err
    err, dev = cu.cuDeviceGet(0); assert err == E.CUDA_SUCCESS, err
    err, ctx = cu.cuDevicePrimaryCtxRetain(dev); assert err == E.CUDA_SUCCESS, err
    (err,) = cu.cuCtxSetCurrent(ctx); assert err == E.CUDA_SUCCESS, err
    err, a = cu.cuMemAlloc(512 * MiB)
    print("alloc512", int(err))
    err, b = cu.cuMemAlloc(600 * MiB)
    print("alloc600", err.name)
    err, free, total = cu.cuMemGetInfo()
    print("info", int(err), free, total)
    err, t = cu.cuDeviceTotalMem(dev)
    print("total", int(err), t)
""")


def test_cuda_bindings(sim):
    """NVIDIA's own driver bindings (they look everything up through
    cuGetProcAddress): 1 GiB limit, 512 MiB fits, 600 MiB more does not."""
    region = sim.region([GiB, GiB])
    res = run(Path(sys.executable), ["-c", CUDA_BINDINGS],
              sim.job_env(region.path))
    assert res.returncode == 0, res.stderr
    assert results(res.stdout, "alloc512") == [["0"]]
    assert results(res.stdout, "alloc600") == [["CUDA_ERROR_OUT_OF_MEMORY"]]
    rc, free, total = results(res.stdout, "info")[0]
    assert rc == "0" and int(total) == GiB and int(free) < GiB - 512 * MiB
    assert results(res.stdout, "total") == [["0", str(GiB)]]
    usage = region.read_usage()
    assert usage.devices[0].oom_refusals == 1


PYNVML = textwrap.dedent("""
    import os, sys
    import pynvml as n
    n.nvmlInit()
    h = n.nvmlDeviceGetHandleByIndex(0)
    m = n.nvmlDeviceGetMemoryInfo(h)
    print("mem", m.total, m.used, m.free)
    m2 = n.nvmlDeviceGetMemoryInfo(h, version=n.nvmlMemory_v2)
    print("mem2", m2.total, m2.used, m2.free, m2.reserved)
    print("procs", *sorted(p.pid for p in n.nvmlDeviceGetComputeRunningProcesses(h)))
    h1 = n.nvmlDeviceGetHandleByIndex(1)
    print("other", n.nvmlDeviceGetMemoryInfo(h1).total)
    import time
    seen, end = set(), time.monotonic() + float(sys.argv[2])
    while time.monotonic() < end and len(seen) < int(sys.argv[1]):
        for get in (n.nvmlDeviceGetProcessUtilization, n.nvmlDeviceGetProcessesUtilizationInfo):
            try:
                seen |= {s.pid for s in get(h, 0)}
            except n.NVMLError_NotFound:
                pass
        time.sleep(0.05)
    print("util", *sorted(seen))
""")


def test_nvml_shows_the_job_view(sim, clients, client_factory):
    """nvidia-ml-py through dlsym: memory info v1 and v2 show the limit and
    the job's use; the process list only the job's processes."""
    region = sim.region({0: GiB})
    job = client_factory(clients["direct"], ["ctx", "0", "alloc", "100M", "bglaunch",
                                             "kernel", "100000000", "hold"],
                         sim.job_env(region.path))
    other = client_factory(clients["direct"], ["ctx", "0", "alloc", "200M", "bglaunch",
                                               "kernel", "100000000", "hold"], sim.env)
    job.until("hold")
    other.until("hold")
    used = region.read_usage().devices[0].used
    # Outside the job both processes are named in the per-process utilization
    res = run(Path(sys.executable), ["-c", PYNVML, "2", "10"], sim.env)
    assert results(res.stdout, "util")[0] == sorted([str(job.pid), str(other.pid)]), res.stdout
    # (inside, as long as the other took to be seen outside, twice: it is
    # named in most sample periods, and never here)
    res = run(Path(sys.executable), ["-c", PYNVML, "2", "2"],
              sim.job_env(region.path))
    assert res.returncode == 0, res.stderr
    total, u, free = map(int, results(res.stdout, "mem")[0])
    assert (total, u, free) == (GiB, used, GiB - used)
    total2, u2, free2, reserved = map(int, results(res.stdout, "mem2")[0])
    assert (total2, u2, free2) == (GiB, used, GiB - used)
    assert results(res.stdout, "procs")[0] == [str(job.pid)]
    # ... and the per-process utilization (both calls) only the job's own
    assert results(res.stdout, "util")[0] == [str(job.pid)]
    # A GPU that is not the job's is shown as it is.
    assert int(results(res.stdout, "other")[0][0]) == 16 * GiB
