"""The simulated NVML through NVIDIA's own client, nvidia-ml-py (pynvml):
enumeration, memory, running processes (context memory included), utilization
rates and per-process utilization samples, and injected NVML errors."""

from __future__ import annotations

import json
import subprocess

import pytest
from support.sim import HOLD_1G_ON_GPU1, SPIN_PTX, VGPUCTL, holding, run_py

MiB = 1 << 20
GiB = 1 << 30


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


# Reads per-process utilization both ways (nvmlDeviceGetProcessUtilization and
# nvmlDeviceGetProcessesUtilizationInfo) as lists of (pid, timeStamp, smUtil),
# [] for NVML_ERROR_NOT_FOUND; and the raw C entry points, for the size query.
UTIL = """
import pynvml as N
N.nvmlInit()
h = N.nvmlDeviceGetHandleByIndex(0)
def util(last_seen, info=False):
    fn = N.nvmlDeviceGetProcessesUtilizationInfo if info else N.nvmlDeviceGetProcessUtilization
    try:
        return [[s.pid, s.timeStamp, s.smUtil] for s in fn(h, last_seen)]
    except N.NVMLError_NotFound:
        return []
def both(last_seen):
    return {"sample": util(last_seen), "info": util(last_seen, True)}
raw = N._nvmlGetFunctionPointer("nvmlDeviceGetProcessUtilization")
raw_info = N._nvmlGetFunctionPointer("nvmlDeviceGetProcessesUtilizationInfo")
def size_query(last_seen):
    n = ctypes.c_uint(0)
    return [raw(h, None, ctypes.byref(n), ctypes.c_ulonglong(last_seen)), n.value]
"""


def _burners(sim_env, burn_program, n, kernel_us):
    return [subprocess.Popen([str(burn_program), "--kernel-us", str(kernel_us),
                              "--seconds", "60"], env=sim_env,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            for _ in range(n)]


def _stop(procs):
    for p in procs:
        p.kill()
    for p in procs:
        p.wait(timeout=30)


def test_utilization_idle_gpu_is_not_found(sim_env):
    out = run_py(sim_env, UTIL, """
        out({"both": both(0), "size": size_query(0)})
    """)
    assert out["both"] == {"sample": [], "info": []}
    assert out["size"] == [6, 0]   # NVML_ERROR_NOT_FOUND, nothing to size


def test_utilization_one_entry_per_process_per_call(sim_env, burn_program):
    """A saturating process gets one entry per call, however many sample
    periods the call covers, with smUtil the device's utilization over them
    (near 100; less where a loaded host kept it from launching), from both
    calls; only
    entries newer than lastSeenTimeStamp come back, stamped with the newest
    period, in microseconds of the wall clock."""
    sim_env["VGPU_SIM_SAMPLE_MS"] = "100"
    (busy,) = procs = _burners(sim_env, burn_program, 1, 1000)
    try:
        out = run_py(sim_env, f"BUSY = {busy.pid}\n", UTIL, """
            first = wait_for(lambda: util(0), what="an entry for the busy process")
            t0 = max(ts for _, ts, _ in first)
            time.sleep(0.5)               # about five more periods
            b = both(t0)
            t1 = max(ts for _, ts, _ in b["sample"])
            _, ss = N.nvmlDeviceGetSamples(h, N.NVML_GPU_UTILIZATION_SAMPLES, t0)
            dev = [x.sampleValue.uiVal for x in ss if t0 < x.timeStamp <= t1]
            out({"first": first, "t0": t0, "b": b, "now_us": time.time() * 1e6,
                 "device": sum(dev) / max(1, len(dev)),
                 "again": both(t1), "future": both(int(time.time() * 1e6) + 10_000_000)})
        """)
    finally:
        _stop(procs)
    assert [p for p, _, _ in out["first"]] == [busy.pid]
    for way in ("sample", "info"):
        (entry,) = out["b"][way]                 # exactly one, for five periods
        pid, ts, sm = entry
        assert pid == busy.pid
        assert out["device"] >= 50 and abs(sm - out["device"]) <= 10, out
        assert out["t0"] + 400_000 <= ts <= out["now_us"]   # the newest period's end
        assert (ts - out["t0"]) % 100_000 in (0, 1, 99_999)  # on the period grid
        assert all(t > ts for _, t, _ in out["again"][way])  # nothing seen twice
        assert out["future"][way] == []                      # nothing newer: NOT_FOUND


def test_utilization_size_query_and_short_buffer(sim_env, burn_program):
    """NULL buffer: NVML_ERROR_INSUFFICIENT_SIZE and the count needed; a
    short buffer: the same; a long one: the count written. The versioned
    call checks its struct's version."""
    sim_env["VGPU_SIM_SAMPLE_MS"] = "100"
    sim_env["VGPU_SIM_UTIL_PROCS"] = "each"      # three entries in every read
    procs = _burners(sim_env, burn_program, 3, 1000)
    try:
        out = run_py(sim_env, UTIL, """
            wait_for(lambda: len(util(0)) == 3, what="three entries")
            res = {"null": size_query(0)}
            n = ctypes.c_uint(2)
            buf = (N.c_nvmlProcessUtilizationSample_t * 8)()
            res["short"] = [raw(h, buf, ctypes.byref(n), ctypes.c_ulonglong(0)), n.value]
            n = ctypes.c_uint(8)
            res["long"] = [raw(h, buf, ctypes.byref(n), ctypes.c_ulonglong(0)), n.value]
            info = N.c_nvmlProcessesUtilizationInfo_v1_t()
            info.version = N.ProcessesUtilizationInfo_v1
            res["info_null"] = [raw_info(h, ctypes.byref(info)), info.processSamplesCount]
            arr = (N.c_nvmlProcessUtilizationInfo_v1_t * 2)()
            info.procUtilArray, info.processSamplesCount = arr, 2
            res["info_short"] = [raw_info(h, ctypes.byref(info)), info.processSamplesCount]
            arr = (N.c_nvmlProcessUtilizationInfo_v1_t * 8)()
            info.procUtilArray, info.processSamplesCount = arr, 8
            res["info_long"] = [raw_info(h, ctypes.byref(info)), info.processSamplesCount]
            info.version = 0x01000010
            res["info_version"] = raw_info(h, ctypes.byref(info))
            res["info_none"] = raw_info(h, None)
            out(res)
        """)
    finally:
        _stop(procs)
    insufficient, version_mismatch, invalid = 7, 25, 2
    assert out["null"] == [insufficient, 3]
    assert out["short"] == [insufficient, 3]
    assert out["long"] == [0, 3]
    assert out["info_null"] == [insufficient, 3]
    assert out["info_short"] == [insufficient, 3]
    assert out["info_long"] == [0, 3]
    assert out["info_version"] == version_mismatch
    assert out["info_none"] == invalid


def test_utilization_lists_every_process_of_a_crowded_gpu(sim_env, burn_program):
    """36 processes share GPU 0: the running-process query lists them all and,
    with VGPU_SIM_UTIL_PROCS=each, each has its own utilization entry (a
    sample period records them all)."""
    sim_env["VGPU_SIM_SAMPLE_MS"] = "100"
    sim_env["VGPU_SIM_UTIL_PROCS"] = "each"
    procs = _burners(sim_env, burn_program, 36, 5000)
    pids = sorted(p.pid for p in procs)
    try:
        out = run_py(sim_env, f"PIDS = {pids}\n", UTIL, """
            running = wait_for(
                lambda: (lambda r: r if len(r) == len(PIDS) else None)(
                    sorted(p.pid for p in N.nvmlDeviceGetComputeRunningProcesses(h))),
                what="every process listed", timeout=60)
            b = wait_for(lambda: (lambda b: b if len(b["sample"]) == len(PIDS)
                                  and len(b["info"]) == len(PIDS) else None)(both(0)),
                         what="an entry for every process", timeout=60)
            out({"running": running, "b": b, "size": size_query(0)})
        """, timeout=120)
    finally:
        _stop(procs)
    assert out["running"] == pids
    for way in ("sample", "info"):
        assert sorted(p for p, _, _ in out["b"][way]) == pids
    assert out["size"][0] == 7 and out["size"][1] >= len(pids)


# A process that runs 50 ms of kernels inside one sample period (250 ms) and
# then idles for three, and the entry it gets with lastSeenTimeStamp at the
# end of an earlier busy period: the window holds five or six periods.
IDLE_WINDOW = f"""
ck(cu.cuInit(0))
ctx = ck(cu.cuDevicePrimaryCtxRetain(0)); ck(cu.cuCtxSetCurrent(ctx))
fn = ck(cu.cuModuleGetFunction(ck(cu.cuModuleLoadData({SPIN_PTX!r})), b"vgpu_spin"))
P = 0.25
def burst():
    # start 30 ms into a period, so that 50 ms of kernels stay inside it
    while (time.monotonic() % P) < 0.03 or (time.monotonic() % P) > 0.06:
        time.sleep(0.002)
    k = int(time.monotonic() // P)
    for _ in range(5):
        ck(cu.cuLaunchKernel(fn, 1, 1, 1, 1, 1, 1, 0, 0,
                             ((10_000_000,), (ctypes.c_uint64,)), 0))
    ck(cu.cuCtxSynchronize())
    return k
def wait_period(k):
    while time.monotonic() < k * P:
        time.sleep(0.005)
k0 = burst()
wait_period(k0 + 1.2)
me = [e for e in util(0) if e[0] == os.getpid()]
t0 = me[0][1]
wait_period(k0 + 4)
k1 = burst()
wait_period(k1 + 1.5)                        # mid-period: the window is unambiguous
read_at = time.monotonic()
b = both(t0)
out({{"k0": k0, "k1": k1, "window": int((read_at - 0.025) // P) - (k0 + 1), "t0": t0,
      "b": b, "pid": os.getpid()}})
"""


@pytest.mark.parametrize("idle", ["average", "skip"])
def test_utilization_idle_periods_average_or_skip(sim_env, idle):
    """VGPU_SIM_UTIL_IDLE: with `average` the periods of the window in which
    the process ran nothing count as zeros; with `skip` they do not count."""
    sim_env["VGPU_SIM_SAMPLE_MS"] = "250"
    sim_env["VGPU_SIM_UTIL_IDLE"] = idle
    out = run_py(sim_env, UTIL, IDLE_WINDOW)
    busy = 50 / 250 * 100                            # 20 % of the period it ran in
    expect = busy if idle == "skip" else busy / out["window"]
    assert out["window"] >= 4, out
    for way in ("sample", "info"):
        (entry,) = out["b"][way]
        assert entry[0] == out["pid"]
        assert entry[2] == round(expect), out
        # stamped with the end of the period it last ran in
        assert entry[1] - out["t0"] == pytest.approx((out["k1"] - out["k0"]) * 250_000, abs=2)


# Two processes on GPU 0: A busy about 30 % of the time (in cycles of 37 ms,
# out of step with the 100 ms periods: with 20 ms the same process would end
# every period, as on the H100 in the probe's trio30), B saturating; every
# one-period read (lastSeenTimeStamp its predecessor's newest) for about 3 s,
# then one read of all those periods.
TWO_PROCS = """
wait_for(lambda: len(util(0)) >= 1, what="a first entry")
time.sleep(0.3)
start = last = max(ts for _, ts, _ in util(0))
reads = []
t_end = time.monotonic() + 3.0
while time.monotonic() < t_end:
    time.sleep(0.05)
    r = util(last)
    if r:
        last = max(ts for _, ts, _ in r)
        reads.append(r)
whole = util(start)
_, samples = N.nvmlDeviceGetSamples(h, 1, start)      # NVML_GPU_UTILIZATION_SAMPLES
device = [x.sampleValue.uiVal for x in samples if x.timeStamp > start]
out({"reads": reads, "whole": whole, "device": sum(device) / max(1, len(device))})
"""


def _two_procs(sim_env, burn_program, mode):
    sim_env["VGPU_SIM_SAMPLE_MS"] = "100"
    if mode is not None:
        sim_env["VGPU_SIM_UTIL_PROCS"] = mode
    a = subprocess.Popen([str(burn_program), "--kernel-us", "1000", "--seconds", "60",
                          "--duty", "30", "--period-ms", "37"], env=sim_env,
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    (b,) = _burners(sim_env, burn_program, 1, 1000)
    try:
        out = run_py(sim_env, UTIL, TWO_PROCS)
    finally:
        _stop([a, b])
    return a.pid, b.pid, out


@pytest.mark.parametrize("mode", [None, "last", "busiest"])
def test_utilization_names_one_process_a_period_by_default(sim_env, burn_program, mode):
    """As an H100 answers (docs/gpu-proof.md): each sample period names one
    process, with the whole device's utilization, and leaves the others out.
    `last` (the default) names the process whose kernel ran last in the
    period, so over many periods both are named; `busiest` always the one
    that ran most."""
    pa, pb, out = _two_procs(sim_env, burn_program, mode)
    assert len(out["reads"]) >= 15, out
    named: dict[int, list[int]] = {pa: [], pb: []}
    for r in out["reads"]:
        assert len(r) == 1, r                      # one process, however many ran
        pid, _, sm = r[0]
        named[pid].append(sm)
    if mode == "busiest":
        assert named[pa] == []
    else:
        assert len(named[pa]) >= 2 and len(named[pb]) >= 2, named
        # A runs about 30 % of the time: named, it has the device's utilization
        assert sum(named[pa]) / len(named[pa]) >= 80, named
    assert sum(named[pb]) / len(named[pb]) >= 80, named
    # A read of many periods lists each process named in any of them, with
    # its average over them all: together, the device's utilization over
    # those periods (near 100, less where a loaded host kept B from
    # launching: measured, not assumed).
    whole = out["whole"]
    assert {p for p, _, _ in whole} == {p for p, v in named.items() if v}
    assert out["device"] >= 70, out["device"]
    assert sum(sm for _, _, sm in whole) == pytest.approx(out["device"], abs=10)


def test_utilization_each_process_with_its_own_share(sim_env, burn_program):
    """VGPU_SIM_UTIL_PROCS=each: every process that ran in a period gets an
    entry with its own busy time; together, the device's."""
    pa, pb, out = _two_procs(sim_env, burn_program, "each")
    assert len(out["reads"]) >= 15, out
    sums, mine = [], []
    for r in out["reads"][2:]:
        shares = {p: sm for p, _, sm in r}
        assert set(shares) == {pa, pb}, r
        assert sum(shares.values()) <= 101, r
        sums.append(sum(shares.values()))
        mine.append(shares[pa])
    # together the device's (below 100 where a loaded host was late)
    assert sum(sums) / len(sums) >= 80, sums
    assert 10 <= sum(mine) / len(mine) <= 50, mine


@pytest.mark.parametrize("mode", [None, "each"])
def test_an_idle_process_is_listed_at_zero_in_one_process_mode(sim_env, mode):
    """An H100 keeps naming the process it last ran, at 0, through periods in
    which it runs nothing (the probe's solo30-slow); each-process mode lists
    only processes that ran."""
    sim_env["VGPU_SIM_SAMPLE_MS"] = "100"
    if mode is not None:
        sim_env["VGPU_SIM_UTIL_PROCS"] = mode
    out = run_py(sim_env, UTIL, f"""
        ck(cu.cuInit(0))
        ctx = ck(cu.cuDevicePrimaryCtxRetain(0)); ck(cu.cuCtxSetCurrent(ctx))
        fn = ck(cu.cuModuleGetFunction(ck(cu.cuModuleLoadData({SPIN_PTX!r})), b"vgpu_spin"))
        ck(cu.cuLaunchKernel(fn, 1, 1, 1, 1, 1, 1, 0, 0, ((50_000_000,), (ctypes.c_uint64,)), 0))
        ck(cu.cuCtxSynchronize())
        time.sleep(0.2)                 # every period it ran in published
        first = wait_for(lambda: util(0), what="an entry")
        last = max(ts for _, ts, _ in first)
        time.sleep(0.6)                 # idle, the context held
        out({{"pid": os.getpid(), "idle": util(last)}})
    """)
    if mode == "each":
        assert out["idle"] == []
    else:
        assert [(p, sm) for p, _, sm in out["idle"]] == [(out["pid"], 0)]


def test_utilization_idle_setting_shows_in_stats(sim_env):
    sim_env["VGPU_SIM_UTIL_IDLE"] = "skip"
    run_py(sim_env, UTIL, "out(both(0))")        # the state is made by its first user
    res = subprocess.run([*VGPUCTL, "sim", "stats", "--json"], env=sim_env, check=True,
                         capture_output=True, text=True)
    assert json.loads(res.stdout)["util_idle"] == "skip"
    assert json.loads(res.stdout)["util_procs"] == "last"      # the default


def test_utilization_procs_setting_shows_in_stats(sim_env):
    sim_env["VGPU_SIM_UTIL_PROCS"] = "each"
    run_py(sim_env, UTIL, "out(both(0))")
    res = subprocess.run([*VGPUCTL, "sim", "stats", "--json"], env=sim_env, check=True,
                         capture_output=True, text=True)
    assert json.loads(res.stdout)["util_procs"] == "each"
    text = subprocess.run([*VGPUCTL, "sim", "stats"], env=sim_env, check=True,
                          capture_output=True, text=True).stdout
    assert "utilization of each process" in text


def test_utilization_procs_none_is_not_supported(sim_env, burn_program):
    """VGPU_SIM_UTIL_PROCS=none: a device without per-process utilization,
    as a MIG instance answers: both calls NVML_ERROR_NOT_SUPPORTED while a
    process runs, the size query too, after the checks a caller's own
    mistakes meet anywhere (uninitialised, bad handle, bad arguments); the
    device's own utilization is still there."""
    sim_env["VGPU_SIM_SAMPLE_MS"] = "100"
    sim_env["VGPU_SIM_UTIL_PROCS"] = "none"
    procs = _burners(sim_env, burn_program, 1, 1000)
    try:
        out = run_py(sim_env, UTIL, """
            rates = wait_for(lambda: N.nvmlDeviceGetUtilizationRates(h).gpu or None,
                             what="the device busy")
            def per_process(info):
                try:
                    util(0, info)
                except N.NVMLError_NotSupported:
                    return "not supported"
                return "answered"
            res = {"rates": rates, "sample": per_process(False), "info": per_process(True)}
            # (the samples' buffer holds the periods that ended: the first
            # busy one may end a moment after the rates first say busy)
            def busiest():
                _, ss = N.nvmlDeviceGetSamples(h, N.NVML_GPU_UTILIZATION_SAMPLES, 0)
                return max(s.sampleValue.uiVal for s in ss) or None
            res["samples"] = wait_for(busiest, what="a busy sample")
            res["size"] = size_query(0)
            res["no_count"] = raw(h, None, None, ctypes.c_ulonglong(0))
            res["bad_handle"] = raw(None, None, ctypes.byref(ctypes.c_uint(0)),
                                    ctypes.c_ulonglong(0))
            info = N.c_nvmlProcessesUtilizationInfo_v1_t()
            info.version = N.ProcessesUtilizationInfo_v1
            res["info_raw"] = raw_info(h, ctypes.byref(info))
            res["info_none"] = raw_info(h, None)
            info.version = 0x01000010
            res["info_version"] = raw_info(h, ctypes.byref(info))
            N.nvmlShutdown()
            res["uninit"] = size_query(0)[0]
            out(res)
        """)
    finally:
        _stop(procs)
    not_supported, invalid, version_mismatch, uninitialized = 3, 2, 25, 1
    assert out["rates"] > 0 and out["samples"] > 0, out
    assert out["sample"] == out["info"] == "not supported"
    assert out["size"] == [not_supported, 0]           # no count to size
    assert out["info_raw"] == not_supported
    assert out["no_count"] == out["bad_handle"] == out["info_none"] == invalid
    assert out["info_version"] == version_mismatch
    assert out["uninit"] == uninitialized
    res = subprocess.run([*VGPUCTL, "sim", "stats", "--json"], env=sim_env, check=True,
                         capture_output=True, text=True)
    assert json.loads(res.stdout)["util_procs"] == "none"


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


def test_device_samples_cover_idle_periods(sim_env, burn_program):
    """nvmlDeviceGetSamples(GPU_UTILIZATION_SAMPLES) answers an idle GPU with
    one zero sample per published period (as an H100 does: its whole buffer
    of zeros), stamped on the grid the per-process entries use, only those
    newer than lastSeenTimeStamp; a busy period reads its busy time; what the
    simulator does not sample is NVML_ERROR_NOT_SUPPORTED."""
    sim_env["VGPU_SIM_SAMPLE_MS"] = "100"
    out = run_py(sim_env, UTIL, """
        def samples(last_seen, kind=N.NVML_GPU_UTILIZATION_SAMPLES):
            try:
                vt, ss = N.nvmlDeviceGetSamples(h, kind, last_seen)
            except N.NVMLError as e:
                return e.value
            return [vt, [[s.timeStamp, s.sampleValue.uiVal] for s in ss]]
        idle = wait_for(lambda: (lambda r: r if isinstance(r, list) and len(r[1]) >= 5
                                 else None)(samples(0)), what="five idle samples")
        newest = idle[1][-1][0]
        out({"idle": idle, "newer": samples(newest - 1), "future": samples(newest + 10**9),
             "power": samples(0, N.NVML_TOTAL_POWER_SAMPLES),
             "memory": samples(0, N.NVML_MEMORY_UTILIZATION_SAMPLES)})
    """)
    vt, idle = out["idle"]
    assert vt == 1                                        # NVML_VALUE_TYPE_UNSIGNED_INT
    stamps = [t for t, _ in idle]
    assert all(v == 0 for _, v in idle)
    gaps = [b - a for a, b in zip(stamps, stamps[1:], strict=False)]
    assert all(g in (99_999, 100_000, 100_001) for g in gaps)
    assert out["newer"][1] == [idle[-1]] or out["newer"][1][0] == idle[-1]
    assert out["future"] == 6                             # NVML_ERROR_NOT_FOUND
    assert out["power"] == 3                              # NVML_ERROR_NOT_SUPPORTED
    assert out["memory"][1] and all(v == 0 for _, v in out["memory"][1])

    (busy,) = procs = _burners(sim_env, burn_program, 1, 1000)
    try:
        out = run_py(sim_env, f"BUSY = {busy.pid}\n", UTIL, """
            first = wait_for(lambda: util(0), what="an entry for the busy process")
            ts = max(t for _, t, _ in first)
            vt, ss = N.nvmlDeviceGetSamples(h, N.NVML_GPU_UTILIZATION_SAMPLES, 0)
            out({"ts": ts, "samples": [[s.timeStamp, s.sampleValue.uiVal] for s in ss]})
        """)
    finally:
        _stop(procs)
    by_ts = dict(out["samples"])
    assert by_ts.get(out["ts"], 0) > 0, out               # the same period, on the same grid
