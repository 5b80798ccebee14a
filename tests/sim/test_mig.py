"""MIG on the simulated GPU: the layout VGPU_SIM_MIG presets, seen through
NVIDIA's NVML client (pynvml); creating and destroying instances and the
driver's refusals; and MIG devices through the driver API (cuda-bindings):
what CUDA_VISIBLE_DEVICES enumerates, an instance's memory, SMs and kernel
time, and its processes in NVML."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from support.sim import SPIN_PTX, VGPUCTL, holding, run_py

MiB = 1 << 20
GiB = 1 << 30
PRESET = "0=1g.10gb,1g.10gb,1g.10gb,3g.40gb@4"

# NVML's codes, as pynvml names them.
NOT_SUPPORTED, NO_PERMISSION, NOT_FOUND, IN_USE, INSUFFICIENT_RESOURCES = 3, 4, 6, 19, 23
INVALID_ARGUMENT = 2

# A snippet's helper: the NVML error code a call raises, or "ok".
CODE = """
import pynvml as N
def code(f, *a):
    try:
        f(*a)
        return "ok"
    except N.NVMLError as e:
        return e.value
"""

# The MIG devices of GPU 0 by index: [index, gi, ci, uuid, total, name].
MIG_DEVICES = """
def mig_devices(h):
    devs = []
    for i in range(N.nvmlDeviceGetMaxMigDeviceCount(h)):
        try:
            m = N.nvmlDeviceGetMigDeviceHandleByIndex(h, i)
        except N.NVMLError_NotFound:
            continue
        devs.append([i, N.nvmlDeviceGetGpuInstanceId(m), N.nvmlDeviceGetComputeInstanceId(m),
                     N.nvmlDeviceGetUUID(m), N.nvmlDeviceGetMemoryInfo(m).total,
                     N.nvmlDeviceGetName(m)])
    return devs
"""


@pytest.fixture
def mig_env(sim_env: dict[str, str]) -> dict[str, str]:
    """One 80G GPU (an H100-80GB's MIG names) with PRESET's instances."""
    sim_env.update({"VGPU_SIM": "1x80G", "VGPU_SIM_MIG": PRESET})
    return sim_env


@pytest.fixture
def admin_env(sim_env: dict[str, str]) -> dict[str, str]:
    """One 80G GPU in MIG mode with no instance, this user its MIG admin."""
    sim_env.update({"VGPU_SIM": "1x80G", "VGPU_SIM_MIG": "0=",
                    "VGPU_SIM_MIG_ADMIN": str(os.geteuid())})
    return sim_env


def test_preset_layout_through_nvml(mig_env):
    out = run_py(mig_env, CODE, MIG_DEVICES, """
        N.nvmlInit()
        h = N.nvmlDeviceGetHandleByIndex(0)
        devs = mig_devices(h)
        m = N.nvmlDeviceGetMigDeviceHandleByIndex(h, 0)
        parent = N.nvmlDeviceGetDeviceHandleFromMigDeviceHandle(m)
        profiles = {}
        for p in (N.NVML_GPU_INSTANCE_PROFILE_1_SLICE, N.NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV2,
                  N.NVML_GPU_INSTANCE_PROFILE_2_SLICE, N.NVML_GPU_INSTANCE_PROFILE_3_SLICE,
                  N.NVML_GPU_INSTANCE_PROFILE_4_SLICE, N.NVML_GPU_INSTANCE_PROFILE_7_SLICE):
            info = N.nvmlDeviceGetGpuInstanceProfileInfo(h, p)
            name = info.name.decode() if isinstance(info.name, bytes) else info.name
            profiles[name] = [info.id, info.instanceCount, info.multiprocessorCount,
                              info.memorySizeMB,
                              N.nvmlDeviceGetGpuInstanceRemainingCapacity(h, info.id)]
        one = N.nvmlDeviceGetGpuInstanceProfileInfo(h, N.NVML_GPU_INSTANCE_PROFILE_1_SLICE)
        gis = (N.c_nvmlGpuInstance_t * 7)()
        n = N.c_uint(7)
        N.nvmlDeviceGetGpuInstances(h, one.id, gis, N.byref(n))
        placements = [[N.nvmlGpuInstanceGetInfo(gis[i]).id,
                       N.nvmlGpuInstanceGetInfo(gis[i]).placement.start] for i in range(n.value)]
        out({"count": N.nvmlDeviceGetCount(), "mode": N.nvmlDeviceGetMigMode(h),
             "is_mig": [N.nvmlDeviceIsMigDeviceHandle(h).value,
                        N.nvmlDeviceIsMigDeviceHandle(m).value],
             "parent": N.nvmlDeviceGetIndex(parent), "devs": devs,
             "by_uuid": [N.nvmlDeviceGetGpuInstanceId(N.nvmlDeviceGetHandleByUUID(d[3]))
                         for d in devs],
             "parent_mem": N.nvmlDeviceGetMemoryInfo(h).total, "profiles": profiles,
             "placements": placements,
             "bad_profile": code(N.nvmlDeviceGetGpuInstanceProfileInfo, h, 5),
             "util": [code(N.nvmlDeviceGetUtilizationRates, x) for x in (m, h)],
             "proc_util": [code(N.nvmlDeviceGetProcessUtilization, x, 0) for x in (m, h)],
             "accounting": [code(N.nvmlDeviceGetAccountingMode, x) for x in (m, h)],
             "gi_id_of_gpu": code(N.nvmlDeviceGetGpuInstanceId, h)})
    """)
    assert out["count"] == 1 and out["mode"] == [1, 1]
    assert out["is_mig"] == [0, 1] and out["parent"] == 0
    devs = out["devs"]
    assert [d[:3] for d in devs] == [[0, 1, 0], [1, 2, 0], [2, 3, 0], [3, 4, 0]]
    assert [d[4] for d in devs] == [10 * GiB] * 3 + [40 * GiB]
    assert [d[5] for d in devs] == ["vgpu-sim GPU MIG 1g.10gb"] * 3 + ["vgpu-sim GPU MIG 3g.40gb"]
    uuids = [d[3] for d in devs]
    assert all(u.startswith("MIG-") and len(u) == 40 for u in uuids) and len(set(uuids)) == 4
    assert out["by_uuid"] == [1, 2, 3, 4]
    assert out["parent_mem"] == 80 * GiB
    # NVIDIA's H100-80GB profiles: id, instances, SMs, MiB, room left
    assert out["profiles"] == {
        "1g.10gb": [19, 7, 16, 10240, 1], "1g.20gb": [15, 4, 16, 20480, 0],
        "2g.20gb": [14, 3, 32, 20480, 0], "3g.40gb": [9, 2, 48, 40960, 0],
        "4g.40gb": [5, 1, 64, 40960, 0], "7g.80gb": [0, 1, 112, 81920, 0]}
    assert out["placements"] == [[1, 0], [2, 1], [3, 2]]
    assert out["bad_profile"] == NOT_SUPPORTED  # 8_SLICE: not an H100's
    assert out["util"] == out["proc_util"] == out["accounting"] == [NOT_SUPPORTED] * 2
    assert out["gi_id_of_gpu"] == NOT_SUPPORTED


def test_profile_names_follow_the_gpu_memory(sim_env):
    """A 141G GPU has an H200's names; an 80G name does not fit it."""
    sim_env.update({"VGPU_SIM": "1x141G", "VGPU_SIM_MIG": "0="})
    out = run_py(sim_env, """
        import pynvml as N
        N.nvmlInit()
        h = N.nvmlDeviceGetHandleByIndex(0)
        names = []
        for p in (0, 9, 1, 2, 3, 4):
            n = N.nvmlDeviceGetGpuInstanceProfileInfo(h, p).name
            names.append(n.decode() if isinstance(n, bytes) else n)
        out(names)
    """)
    assert out == ["1g.18gb", "1g.35gb", "2g.35gb", "3g.71gb", "4g.71gb", "7g.141gb"]


def test_malformed_preset_creates_no_state(sim_env):
    sim_env.update({"VGPU_SIM": "1x16G", "VGPU_SIM_MIG": "0=1g.10gb"})
    with pytest.raises(AssertionError) as e:
        run_py(sim_env, "import pynvml as N\nN.nvmlInit()\n")
    assert "VGPU_SIM_MIG=0=1g.10gb" in str(e.value) and "80G" in str(e.value)
    assert not Path(sim_env["VGPU_SIM_STATE"]).exists()


def test_create_and_destroy_instances(admin_env):
    out = run_py(admin_env, CODE, MIG_DEVICES, """
        N.nvmlInit()
        h = N.nvmlDeviceGetHandleByIndex(0)
        prof = {p: N.nvmlDeviceGetGpuInstanceProfileInfo(h, p).id
                for p in (N.NVML_GPU_INSTANCE_PROFILE_1_SLICE, N.NVML_GPU_INSTANCE_PROFILE_3_SLICE,
                          N.NVML_GPU_INSTANCE_PROFILE_4_SLICE)}
        one, three, four = prof.values()
        def at(start, size):  # by reference: nvml.h takes a pointer (pynvml passes as given)
            p = N.c_nvmlGpuInstancePlacement_t()
            p.start, p.size = start, size
            return N.byref(p)
        res = {}
        gi3 = N.nvmlDeviceCreateGpuInstanceWithPlacement(h, three, at(4, 4))
        res["overlap"] = code(N.nvmlDeviceCreateGpuInstanceWithPlacement, h, three, at(4, 4))
        res["not_a_placement"] = code(N.nvmlDeviceCreateGpuInstanceWithPlacement, h, three,
                                      at(2, 4))
        gi4 = N.nvmlDeviceCreateGpuInstance(h, four)
        res["full"] = code(N.nvmlDeviceCreateGpuInstance, h, one)
        i3, i4 = N.nvmlGpuInstanceGetInfo(gi3), N.nvmlGpuInstanceGetInfo(gi4)
        res["info"] = [[i.id, i.profileId, i.placement.start, i.placement.size,
                        N.nvmlDeviceGetIndex(i.device)] for i in (i3, i4)]
        res["no_ci_yet"] = mig_devices(h)
        cp = N.nvmlGpuInstanceGetComputeInstanceProfileInfo(
            gi3, N.NVML_COMPUTE_INSTANCE_PROFILE_3_SLICE, 0)
        res["ci_profile"] = [cp.id, cp.sliceCount, cp.instanceCount, cp.multiprocessorCount]
        res["smaller_ci"] = code(N.nvmlGpuInstanceGetComputeInstanceProfileInfo, gi3,
                                 N.NVML_COMPUTE_INSTANCE_PROFILE_1_SLICE, 0)
        ci = N.nvmlGpuInstanceCreateComputeInstance(gi3, cp.id)
        c = N.nvmlComputeInstanceGetInfo(ci)
        res["ci_info"] = [c.id, c.profileId, N.nvmlGpuInstanceGetInfo(c.gpuInstance).id]
        res["second_ci"] = code(N.nvmlGpuInstanceCreateComputeInstance, gi3, cp.id)
        first = mig_devices(h)
        res["destroy_gi_with_ci"] = code(N.nvmlGpuInstanceDestroy, gi3)
        res["disable_with_gis"] = code(N.nvmlDeviceSetMigMode, h, 0)
        N.nvmlComputeInstanceDestroy(ci)
        res["after_ci_destroy"] = mig_devices(h)
        ci = N.nvmlGpuInstanceCreateComputeInstance(gi3, cp.id)
        second = mig_devices(h)
        res["uuids"] = [first[0][3], second[0][3]]
        res["devs"] = [d[:3] + [d[4]] for d in second]
        N.nvmlComputeInstanceDestroy(ci)
        N.nvmlGpuInstanceDestroy(gi3)
        res["by_id_gone"] = code(N.nvmlDeviceGetGpuInstanceById, h, i3.id)
        res["by_id_kept"] = N.nvmlGpuInstanceGetInfo(N.nvmlDeviceGetGpuInstanceById(h, 2)).id
        gi1 = N.nvmlDeviceCreateGpuInstance(h, one)
        res["reused_id"] = [N.nvmlGpuInstanceGetInfo(gi1).id,
                            N.nvmlGpuInstanceGetInfo(gi1).placement.start]
        N.nvmlGpuInstanceDestroy(gi1)
        N.nvmlGpuInstanceDestroy(gi4)
        res["disable"] = N.nvmlDeviceSetMigMode(h, 0)
        res["mode"] = N.nvmlDeviceGetMigMode(h)
        res["off"] = [N.nvmlDeviceGetMaxMigDeviceCount(h),
                      code(N.nvmlDeviceCreateGpuInstance, h, one),
                      code(N.nvmlDeviceGetGpuInstanceProfileInfo, h, 0)]
        out(res)
    """)
    assert out["overlap"] == INSUFFICIENT_RESOURCES
    assert out["not_a_placement"] == INVALID_ARGUMENT
    assert out["full"] == INSUFFICIENT_RESOURCES  # 4g@0 + 3g@4 hold every slice
    assert out["info"] == [[1, 9, 4, 4, 0], [2, 5, 0, 4, 0]]
    assert out["no_ci_yet"] == []  # a GPU instance without compute instance: no MIG device
    assert out["ci_profile"] == [2, 3, 1, 48]
    assert out["smaller_ci"] == NOT_SUPPORTED
    assert out["ci_info"] == [0, 2, 1]
    assert out["second_ci"] == INSUFFICIENT_RESOURCES
    assert out["destroy_gi_with_ci"] == IN_USE and out["disable_with_gis"] == IN_USE
    assert out["after_ci_destroy"] == []
    assert out["uuids"][0] != out["uuids"][1]  # a new compute instance, a new UUID
    assert out["devs"] == [[0, 1, 0, 40 * GiB]]
    assert out["by_id_gone"] == NOT_FOUND and out["by_id_kept"] == 2
    assert out["reused_id"] == [1, 4]  # the lowest free id, the first free placement
    assert out["disable"] == 0 and out["mode"] == [0, 0]
    assert out["off"] == [0, NOT_SUPPORTED, NOT_SUPPORTED]


def test_changes_need_the_mig_admin(mig_env):
    mig_env["VGPU_SIM_MIG_ADMIN"] = str(os.geteuid() + 1)
    out = run_py(mig_env, CODE, """
        N.nvmlInit()
        h = N.nvmlDeviceGetHandleByIndex(0)
        gi = N.nvmlDeviceGetGpuInstanceById(h, 1)
        ci = N.nvmlGpuInstanceGetComputeInstanceById(gi, 0)
        one = N.nvmlDeviceGetGpuInstanceProfileInfo(h, 0).id
        out({"mode": code(N.nvmlDeviceSetMigMode, h, 0),
             "create": code(N.nvmlDeviceCreateGpuInstance, h, one),
             "destroy_ci": code(N.nvmlComputeInstanceDestroy, ci),
             "destroy_gi": code(N.nvmlGpuInstanceDestroy, gi),
             "read": N.nvmlDeviceGetMigMode(h)})
    """)
    assert [out[k] for k in ("mode", "create", "destroy_ci", "destroy_gi")] == [NO_PERMISSION] * 4
    assert out["read"] == [1, 1]


HOLD_CONTEXT_ON_GPU0 = """
ck(cu.cuInit(0))
ctx = ck(cu.cuDevicePrimaryCtxRetain(0)); ck(cu.cuCtxSetCurrent(ctx))
out({"pid": os.getpid()})
"""

# NVML's own call, for the activation status pynvml does not return on error.
SET_MIG_MODE = """
import pynvml as N
N.nvmlInit()
h = N.nvmlDeviceGetHandleByIndex(0)
status = ctypes.c_uint(99)
rc = N._nvmlGetFunctionPointer("nvmlDeviceSetMigMode")(h, 1, ctypes.byref(status))
out([rc, status.value, N.nvmlDeviceGetMigMode(h)])
"""


def test_enabling_mig_on_a_busy_gpu_is_refused(sim_env):
    sim_env.update({"VGPU_SIM": "1x80G", "VGPU_SIM_MIG_ADMIN": str(os.geteuid())})
    with holding(sim_env, HOLD_CONTEXT_ON_GPU0) as holder:
        busy = run_py(sim_env, SET_MIG_MODE)
        holder.stop()
    idle = run_py(sim_env, SET_MIG_MODE)
    assert busy == [IN_USE, IN_USE, [0, 0]]
    assert idle == [0, 0, [1, 1]]


# The MIG devices' UUIDs by GPU instance id, from NVML.
UUIDS = """
import pynvml as N
N.nvmlInit()
h = N.nvmlDeviceGetHandleByIndex(0)
uuids = {}
for i in range(N.nvmlDeviceGetMaxMigDeviceCount(h)):
    try:
        m = N.nvmlDeviceGetMigDeviceHandleByIndex(h, i)
    except N.NVMLError_NotFound:
        continue
    uuids[N.nvmlDeviceGetGpuInstanceId(m)] = N.nvmlDeviceGetUUID(m)
out(uuids)
"""

# What the driver API shows of the devices it enumerates. cuda-bindings'
# cuDeviceGetUuid is the driver's _v2 (CUDA 11.4 on); the first form is
# asked of the library itself.
CUDA_VIEW = """
import uuid
def uuid_v1(d):
    b = (ctypes.c_ubyte * 16)()
    assert ctypes.CDLL("libcuda.so.1").cuDeviceGetUuid(b, int(d)) == 0
    return bytes(b)
ck(cu.cuInit(0))
n = ck(cu.cuDeviceGetCount())
d = ck(cu.cuDeviceGet(0))
ctx = ck(cu.cuDevicePrimaryCtxRetain(d)); ck(cu.cuCtxSetCurrent(ctx))
A = cu.CUdevice_attribute
big = cu.cuMemAlloc(11 << 30)
free, total = ck(cu.cuMemGetInfo())
out({"count": n, "name": ck(cu.cuDeviceGetName(64, d)).split(b"\\0")[0].decode(),
     "uuid": "MIG-" + str(uuid.UUID(bytes=bytes(ck(cu.cuDeviceGetUuid(d)).bytes))),
     "uuid_v1": "GPU-" + str(uuid.UUID(bytes=uuid_v1(d))),
     "total": ck(cu.cuDeviceTotalMem(d)), "mem_info": [free, total],
     "sms": ck(cu.cuDeviceGetAttribute(A.CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, d)),
     "bus": ck(cu.cuDeviceGetPCIBusId(32, d)).split(b"\\0")[0].decode(),
     "big": err(big)})
"""


def test_cuda_on_a_mig_device(mig_env):
    uuids = run_py(mig_env, UUIDS)
    gpu = run_py(mig_env, "import pynvml as N\nN.nvmlInit()\n"
                          "out(N.nvmlDeviceGetUUID(N.nvmlDeviceGetHandleByIndex(0)))")
    # a unique prefix of the 3g.40gb's UUID, then a GPU that must not be enumerated
    mig_env["CUDA_VISIBLE_DEVICES"] = uuids["4"][:12]
    out = run_py(mig_env, CUDA_VIEW)
    assert out["count"] == 1 and out["name"] == "vgpu-sim GPU MIG 3g.40gb"
    assert out["uuid"] == uuids["4"] and out["uuid_v1"] == gpu
    assert out["total"] == 40 * GiB and out["mem_info"][1] == 40 * GiB
    assert out["sms"] == 48 and out["bus"] == "0000:01:00.0"
    assert out["big"] == "CUDA_SUCCESS"  # 11 GiB fit in 40
    mig_env["CUDA_VISIBLE_DEVICES"] = uuids["1"]
    out = run_py(mig_env, CUDA_VIEW)
    assert out["count"] == 1 and out["total"] == 10 * GiB and out["sms"] == 16
    assert out["big"] == "CUDA_ERROR_OUT_OF_MEMORY"  # 11 GiB do not fit in 10


def test_cuda_enumerates_the_first_mig_device(mig_env):
    uuids = run_py(mig_env, UUIDS)
    for cvd in (None, "0", f"{uuids['3']},{uuids['1']}"):
        if cvd is None:
            mig_env.pop("CUDA_VISIBLE_DEVICES", None)
        else:
            mig_env["CUDA_VISIBLE_DEVICES"] = cvd
        out = run_py(mig_env, CUDA_VIEW)
        assert out["count"] == 1, cvd
        assert out["uuid"] == (uuids["3"] if cvd and cvd.startswith("MIG") else uuids["1"]), cvd


def test_mig_mode_without_compute_instances_enumerates_nothing(sim_env):
    sim_env.update({"VGPU_SIM": "1x80G", "VGPU_SIM_MIG": "0="})
    out = run_py(sim_env, "out(err(cu.cuInit(0)))")
    assert out == "CUDA_ERROR_NO_DEVICE"


# Holds 1 GiB on the device CUDA_VISIBLE_DEVICES names.
HOLD_1G = """
ck(cu.cuInit(0))
ctx = ck(cu.cuDevicePrimaryCtxRetain(0)); ck(cu.cuCtxSetCurrent(ctx))
p = ck(cu.cuMemAlloc(1 << 30))
out({"pid": os.getpid()})
"""

PROCS = CODE + MIG_DEVICES + """
N.nvmlInit()
h = N.nvmlDeviceGetHandleByIndex(0)
def procs(x):
    return [[p.pid, p.usedGpuMemory, p.gpuInstanceId, p.computeInstanceId]
            for p in N.nvmlDeviceGetComputeRunningProcesses(x)]
migs = {N.nvmlDeviceGetGpuInstanceId(m): m for m in
        (N.nvmlDeviceGetMigDeviceHandleByIndex(h, i) for i in range(4))}
out({"parent": procs(h), "gi1": procs(migs[1]), "gi2": procs(migs[2]),
     "used": [N.nvmlDeviceGetMemoryInfo(migs[g]).used for g in (1, 2)],
     "destroy_ci": code(N.nvmlComputeInstanceDestroy,
                        N.nvmlGpuInstanceGetComputeInstanceById(
                            N.nvmlDeviceGetGpuInstanceById(h, 1), 0))})
"""


def test_processes_on_two_instances(mig_env):
    mig_env["VGPU_SIM_MIG_ADMIN"] = str(os.geteuid())
    uuids = run_py(mig_env, UUIDS)
    env1 = dict(mig_env, CUDA_VISIBLE_DEVICES=uuids["1"])
    env2 = dict(mig_env, CUDA_VISIBLE_DEVICES=uuids["2"])
    with holding(env1, HOLD_1G) as holder:
        other = run_py(env2, CUDA_VIEW.replace("11 << 30", "1 << 20"))
        seen = run_py(mig_env, PROCS)
        stats = json.loads(subprocess.run([*VGPUCTL, "sim", "stats", "--json"], env=mig_env,
                                          capture_output=True, text=True, timeout=60,
                                          check=True).stdout)
        holder.stop()
    ctx_mem = 300 * MiB
    # the other instance's process sees its own 10 GiB, less its own context
    assert other["mem_info"] == [10 * GiB - ctx_mem - 2 * MiB, 10 * GiB]
    pid = holder.pid
    assert seen["gi1"] == [[pid, GiB + ctx_mem, 1, 0]]
    assert seen["gi2"] == []
    assert seen["parent"] == [[pid, GiB + ctx_mem, 1, 0]]
    assert seen["used"] == [GiB + ctx_mem, 0]
    assert seen["destroy_ci"] == IN_USE  # a process uses it
    # vgpuctl sim stats: the instances, and the holder's memory on its own
    migs = {m["gi"]: m for m in stats["mig_devices"]}
    assert stats["mig_mode"] == [1] and sorted(migs) == [1, 2, 3, 4]
    assert [migs[1][k] for k in ("parent", "ci", "uuid", "profile", "total", "used")] == [
        0, 0, uuids["1"], "1g.10gb", 10 * GiB, GiB + ctx_mem]
    (proc,) = [p for p in stats["processes"] if p["pid"] == pid]
    assert [[r["index"], r["used"]] for r in proc["mig_devices"]] == [
        [migs[1]["slot"], GiB + ctx_mem]]


# A kernel of 16 * 132 blocks: 16 waves on the whole GPU's 132 SMs, 132 on a
# 1g instance's 16; and the occupancy calculator's grid.
KERNEL_TIME = f"""
ck(cu.cuInit(0))
ctx = ck(cu.cuDevicePrimaryCtxRetain(0)); ck(cu.cuCtxSetCurrent(ctx))
mod = ck(cu.cuModuleLoadData({SPIN_PTX!r}))
work = ck(cu.cuModuleGetFunction(mod, b"work"))
spin = ck(cu.cuModuleGetFunction(mod, b"vgpu_spin"))
p = ck(cu.cuMemAlloc(1024))
a, b = ck(cu.cuEventCreate(0)), ck(cu.cuEventCreate(0))
# keeps the device busy while the host queues the rest
ck(cu.cuLaunchKernel(spin, 1, 1, 1, 1, 1, 1, 0, 0, ((20_000_000,), (ctypes.c_uint64,)), 0))
ck(cu.cuEventRecord(a, 0))
ck(cu.cuLaunchKernel(work, 16 * 132, 1, 1, 256, 1, 1, 0, 0,
                     ((int(p), 256), (ctypes.c_void_p, ctypes.c_uint32)), 0))
ck(cu.cuEventRecord(b, 0))
ck(cu.cuEventSynchronize(b))
grid, _ = ck(cu.cuOccupancyMaxPotentialBlockSize(work, None, 0, 1024))
out([ck(cu.cuEventElapsedTime(a, b)), grid])
"""


def test_kernels_take_the_instance_sms(sim_env):
    sim_env.update({"VGPU_SIM": "2x80G", "VGPU_SIM_MIG": "1=1g.10gb",
                    "VGPU_SIM_NS_PER_BLOCK": "100000"})  # 0.1 ms per wave
    sim_env["CUDA_VISIBLE_DEVICES"] = "0"
    whole = run_py(sim_env, KERNEL_TIME)
    sim_env["CUDA_VISIBLE_DEVICES"] = "1"
    mig = run_py(sim_env, KERNEL_TIME)
    assert whole == [pytest.approx(1.6, abs=0.05), 132 * 2]
    assert mig == [pytest.approx(13.2, abs=0.05), 16 * 2]


# Queues 2 s of kernels on its device, then reports.
HOLD_BUSY = f"""
ck(cu.cuInit(0))
ctx = ck(cu.cuDevicePrimaryCtxRetain(0)); ck(cu.cuCtxSetCurrent(ctx))
mod = ck(cu.cuModuleLoadData({SPIN_PTX!r}))
spin = ck(cu.cuModuleGetFunction(mod, b"vgpu_spin"))
ck(cu.cuLaunchKernel(spin, 1, 1, 1, 1, 1, 1, 0, 0, ((2_000_000_000,), (ctypes.c_uint64,)), 0))
out({{"pid": os.getpid()}})
"""

# The time a 50 ms kernel of this process takes, by its events.
TIME_50MS = f"""
ck(cu.cuInit(0))
ctx = ck(cu.cuDevicePrimaryCtxRetain(0)); ck(cu.cuCtxSetCurrent(ctx))
mod = ck(cu.cuModuleLoadData({SPIN_PTX!r}))
spin = ck(cu.cuModuleGetFunction(mod, b"vgpu_spin"))
a, b = ck(cu.cuEventCreate(0)), ck(cu.cuEventCreate(0))
ck(cu.cuEventRecord(a, 0))
ck(cu.cuLaunchKernel(spin, 1, 1, 1, 1, 1, 1, 0, 0, ((50_000_000,), (ctypes.c_uint64,)), 0))
ck(cu.cuEventRecord(b, 0))
ck(cu.cuEventSynchronize(b))
out(ck(cu.cuEventElapsedTime(a, b)))
"""


def test_instances_run_at_once_and_share_inside(mig_env):
    """A busy process on instance 1 does not slow a kernel on instance 2,
    and does slow one on its own instance (time slices)."""
    uuids = run_py(mig_env, UUIDS)
    env1 = dict(mig_env, CUDA_VISIBLE_DEVICES=uuids["1"])
    env2 = dict(mig_env, CUDA_VISIBLE_DEVICES=uuids["2"])
    with holding(env1, HOLD_BUSY):
        other = run_py(env2, TIME_50MS)
        same = run_py(env1, TIME_50MS)
    assert other == pytest.approx(50, abs=2)
    assert same > 90  # about half of the instance while the holder is busy
