"""The simulated NVML through NVIDIA's own client, nvidia-ml-py (pynvml):
enumeration, memory, running processes (context memory included), utilization
rates and per-process utilization samples, and injected NVML errors."""

from __future__ import annotations

from support.sim import SPIN_PTX, VGPUCTL, holding, run_py

MiB = 1 << 20
GiB = 1 << 30

# Holds 1 GiB on GPU 1 and reports its pid.
HOLD_1G_ON_GPU1 = """
ck(cu.cuInit(0))
ctx = ck(cu.cuDevicePrimaryCtxRetain(1)); ck(cu.cuCtxSetCurrent(ctx))
p = ck(cu.cuMemAlloc(1 << 30))
out({"pid": os.getpid()})
"""

# Keeps GPU 0 busy with spin kernels until told to stop.
BUSY = f"""
import threading
ck(cu.cuInit(0))
ctx = ck(cu.cuDevicePrimaryCtxRetain(0)); ck(cu.cuCtxSetCurrent(ctx))
fn = ck(cu.cuModuleGetFunction(ck(cu.cuModuleLoadData({SPIN_PTX!r})), b"vgpu_spin"))
stop = threading.Event()
def loop():
    ck(cu.cuCtxSetCurrent(ctx))
    while not stop.is_set():
        for _ in range(20):  # 100 ms queued at a time: the device never waits for us
            ck(cu.cuLaunchKernel(fn, 1, 1, 1, 1, 1, 1, 0, 0,
                                 ((5_000_000,), (ctypes.c_uint64,)), 0))
        ck(cu.cuCtxSynchronize())
threading.Thread(target=loop, daemon=True).start()
out({{"pid": os.getpid()}})
"""


def test_enumeration(sim_env):
    out = run_py(sim_env, """
        import pynvml as N
        N.nvmlInit()
        devs = []
        for i in range(N.nvmlDeviceGetCount()):
            h = N.nvmlDeviceGetHandleByIndex(i)
            m = N.nvmlDeviceGetMemoryInfo(h)
            m2 = N.nvmlDeviceGetMemoryInfo(h, version=N.nvmlMemory_v2)
            uuid = N.nvmlDeviceGetUUID(h)
            bus = N.nvmlDeviceGetPciInfo(h).busId
            bus = bus.decode() if isinstance(bus, bytes) else bus
            devs.append({
                "name": N.nvmlDeviceGetName(h), "uuid": uuid, "bus": bus,
                "index": N.nvmlDeviceGetIndex(h), "mem": [m.total, m.used, m.free],
                "mem2": [m2.total, m2.used, m2.free],
                "by_uuid": N.nvmlDeviceGetIndex(N.nvmlDeviceGetHandleByUUID(uuid)),
                "by_bus": N.nvmlDeviceGetIndex(N.nvmlDeviceGetHandleByPciBusId(bus)),
                "cc": list(N.nvmlDeviceGetCudaComputeCapability(h)),
                "procs": N.nvmlDeviceGetComputeRunningProcesses(h),
            })
        out({"driver": N.nvmlSystemGetDriverVersion(),
             "cuda": N.nvmlSystemGetCudaDriverVersion(), "devs": devs})
        N.nvmlShutdown()
    """)
    assert out["cuda"] >= 12000 and out["driver"]
    d0, d1 = out["devs"]
    assert d0["name"] == "vgpu-sim GPU"
    assert d0["uuid"].startswith("GPU-") and d0["uuid"] != d1["uuid"]
    assert (d0["bus"], d1["bus"]) == ("00000000:01:00.0", "00000000:02:00.0")
    assert [d["index"] for d in out["devs"]] == [0, 1]
    assert [d["by_uuid"] for d in out["devs"]] == [0, 1]
    assert [d["by_bus"] for d in out["devs"]] == [0, 1]
    assert d0["mem"] == d0["mem2"] == [16 * GiB, 0, 16 * GiB]
    assert d0["cc"] == [9, 0] and d0["procs"] == []


def test_uuids_match_the_driver_api(sim_env):
    """NVML and the driver name the same GPUs the same way (the hook maps
    CUDA devices to NVML's physical GPUs by UUID)."""
    out = run_py(sim_env, """
        import uuid, pynvml as N
        ck(cu.cuInit(0))
        N.nvmlInit()
        out([[str(uuid.UUID(bytes=bytes(ck(cu.cuDeviceGetUuid(i)).bytes))),
              N.nvmlDeviceGetUUID(N.nvmlDeviceGetHandleByIndex(i))] for i in range(2)])
    """)
    for drv, nvml in out:
        assert nvml == "GPU-" + drv


def test_another_process_memory_and_process_list(sim_env):
    with holding(sim_env, HOLD_1G_ON_GPU1) as holder:
        out = run_py(sim_env, """
            import pynvml as N
            N.nvmlInit()
            h0, h1 = (N.nvmlDeviceGetHandleByIndex(i) for i in range(2))
            out({"used": [N.nvmlDeviceGetMemoryInfo(h).used for h in (h0, h1)],
                 "procs": [[p.pid, p.usedGpuMemory]
                           for p in N.nvmlDeviceGetComputeRunningProcesses(h1)],
                 "procs0": len(N.nvmlDeviceGetComputeRunningProcesses(h0))})
        """)
        holder.stop()
    # 1 GiB plus the context, charged to the holder on GPU 1 only
    assert out["used"] == [0, GiB + 300 * MiB]
    assert out["procs"] == [[holder.report["pid"], GiB + 300 * MiB]]
    assert out["procs0"] == 0


def test_nvml_ignores_cuda_visible_devices(sim_env):
    sim_env["CUDA_VISIBLE_DEVICES"] = "1"
    out = run_py(sim_env, """
        import pynvml as N
        N.nvmlInit()
        out(N.nvmlDeviceGetCount())
    """)
    assert out == 2


def test_utilization_samples(sim_env):
    """Idle: no samples (NVML_ERROR_NOT_FOUND). Busy: samples for the busy
    process with its SM share, only those newer than lastSeenTimeStamp."""
    sim_env["VGPU_SIM_SAMPLE_MS"] = "100"
    idle = run_py(sim_env, """
        import pynvml as N
        N.nvmlInit()
        h = N.nvmlDeviceGetHandleByIndex(0)
        try:
            N.nvmlDeviceGetProcessUtilization(h, 0)
            out("samples")
        except N.NVMLError_NotFound:
            out("not found")
    """)
    assert idle == "not found"
    with holding(sim_env, BUSY) as busy:
        out = run_py(sim_env, f"BUSY_PID = {busy.report['pid']}\n", """
            import pynvml as N
            N.nvmlInit()
            h = N.nvmlDeviceGetHandleByIndex(0)
            def samples(last_seen):
                try:
                    return N.nvmlDeviceGetProcessUtilization(h, last_seen)
                except N.NVMLError_NotFound:
                    return []
            def four_periods():
                # the busy process's first period may be partial; the last three are whole
                s = samples(0)
                return s if sum(x.pid == BUSY_PID for x in s) >= 4 else None
            first = wait_for(four_periods, what="four samples of the busy process")
            last = max(s.timeStamp for s in first)
            again = len(samples(last))
            later = wait_for(lambda: samples(last), what="a sample newer than the last seen")
            out({"pids": sorted({s.pid for s in first}),
                 "sm": [s.smUtil for s in first[-3:]],
                 "ts_us": last, "now_us": time.time() * 1e6, "again": again,
                 "later": [s.timeStamp > last for s in later],
                 "rates": N.nvmlDeviceGetUtilizationRates(h).gpu})
        """)
        busy.stop()
    assert out["pids"] == [busy.report["pid"]]
    assert all(s >= 80 for s in out["sm"]), out
    assert abs(out["now_us"] - out["ts_us"]) < 5e6  # wall-clock microseconds
    assert out["again"] == 0
    assert out["later"] and all(out["later"])
    assert out["rates"] >= 80


def test_injected_nvml_errors(sim_env):
    out = run_py(sim_env, f"""
        import subprocess, pynvml as N
        def vgpuctl(*args):
            subprocess.run({VGPUCTL!r} + list(args), check=True)
        def counts(n):
            res = []
            for _ in range(n):
                try:
                    res.append(N.nvmlDeviceGetCount())
                except N.NVMLError as e:
                    res.append(e.value)
            return res
        N.nvmlInit()
        vgpuctl("sim", "fault", "--nvml-error", "GPU_IS_LOST", "--count", "2")
        twice = counts(3)
        vgpuctl("sim", "fault", "--nvml-error", "15", "--count", "-1")
        always = counts(3)
        vgpuctl("sim", "fault", "--clear")
        out({{"twice": twice, "always": always, "cleared": counts(1)}})
    """)
    lost = 15  # NVML_ERROR_GPU_IS_LOST
    assert out == {"twice": [lost, lost, 2], "always": [lost] * 3, "cleared": [2]}
