"""The simulated driver API through NVIDIA's own client, cuda-bindings (which
resolves every entry point through cuGetProcAddress): enumeration, memory,
copies, modules, launches, streams, events, graphs, VMM, pools, and the
error codes the real driver gives for wrong programs."""

from __future__ import annotations

import pytest
from support.sim import SPIN_PTX, run_py

MiB = 1 << 20
GiB = 1 << 30

# Retain device 0's primary context and make it current, as the runtime does.
SETUP = f"""
ck(cu.cuInit(0))
ctx = ck(cu.cuDevicePrimaryCtxRetain(0))
ck(cu.cuCtxSetCurrent(ctx))
PTX = {SPIN_PTX!r}
def spin(ns, stream=0):
    return cu.cuLaunchKernel(fn, 1, 1, 1, 1, 1, 1, 0, stream, ((ns,), (ctypes.c_uint64,)), 0)
mod = ck(cu.cuModuleLoadData(PTX))
fn = ck(cu.cuModuleGetFunction(mod, b"vgpu_spin"))
"""


def test_enumeration(sim_env):
    out = run_py(sim_env, """
        ck(cu.cuInit(0))
        A = cu.CUdevice_attribute
        devs = []
        for i in range(ck(cu.cuDeviceGetCount())):
            d = ck(cu.cuDeviceGet(i))
            devs.append({
                "name": ck(cu.cuDeviceGetName(64, d)).split(b"\\0")[0].decode(),
                "uuid": bytes(ck(cu.cuDeviceGetUuid(d)).bytes).hex(),
                "total": ck(cu.cuDeviceTotalMem(d)),
                "sms": ck(cu.cuDeviceGetAttribute(A.CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, d)),
                "cc": [ck(cu.cuDeviceGetAttribute(getattr(A, f"CU_DEVICE_ATTRIBUTE_{w}"), d))
                       for w in ("COMPUTE_CAPABILITY_MAJOR", "COMPUTE_CAPABILITY_MINOR")],
                "bus": ck(cu.cuDeviceGetPCIBusId(32, d)).split(b"\\0")[0].decode(),
            })
        out({"version": ck(cu.cuDriverGetVersion()), "devs": devs,
             "bad": err(cu.cuDeviceGet(2))})
    """)
    assert out["version"] >= 12000
    assert len(out["devs"]) == 2
    d0, d1 = out["devs"]
    assert d0["name"] == "vgpu-sim GPU" and d0["total"] == 16 * GiB
    assert d0["sms"] == 132 and d0["cc"] == [9, 0]
    assert d0["uuid"] != d1["uuid"]
    assert (d0["bus"], d1["bus"]) == ("0000:01:00.0", "0000:02:00.0")
    assert out["bad"] == "CUDA_ERROR_INVALID_DEVICE"


def test_memory_copies_and_accounting(sim_env):
    out = run_py(sim_env, SETUP, """
        free0, total = ck(cu.cuMemGetInfo())
        p = ck(cu.cuMemAlloc(1000))
        free1, _ = ck(cu.cuMemGetInfo())
        src = (ctypes.c_uint32 * 256)(*range(256))
        back = (ctypes.c_uint32 * 256)()
        q = ck(cu.cuMemAlloc(1024))
        ck(cu.cuMemcpyHtoD(p, src, 1000))
        ck(cu.cuMemcpyDtoD(q, p, 1000))
        ck(cu.cuMemcpyDtoH(back, q, 1000))
        same = list(back)[:250] == list(src)[:250]
        ck(cu.cuMemsetD32(q, 7, 256))
        ck(cu.cuMemcpyDtoH(back, q, 1024))
        base, size = ck(cu.cuMemGetAddressRange(int(p) + 10))
        ck(cu.cuMemFree(p)); ck(cu.cuMemFree(q))
        free2, _ = ck(cu.cuMemGetInfo())
        out({"total": total, "free0": free0, "free1": free1, "free2": free2, "same": same,
             "set": [back[0], back[255]], "range": [int(base) == int(p), size]})
    """)
    assert out["total"] - out["free0"] == 300 * MiB  # the context
    assert out["free0"] - out["free1"] == 2 * MiB    # 1000 bytes take a 2 MiB granule
    assert out["free2"] == out["free0"]
    assert out["same"] and out["set"] == [7, 7]
    assert out["range"] == [True, 1000]


def test_arrays_take_their_formats_bytes(sim_env):
    """An array takes width x height x channels x its format's bytes (one
    table, vgpu/array.h, shared with the hook, which reserves the same), and
    a format the simulator does not model is refused as the driver refuses
    a wrong one."""
    out = run_py(sim_env, SETUP, """
        F = cu.CUarray_format
        def taken(fmt, ch):
            d = cu.CUDA_ARRAY_DESCRIPTOR()
            d.Width, d.Height, d.Format, d.NumChannels = 2048, 1024, fmt, ch
            free0, _ = ck(cu.cuMemGetInfo())
            rc, arr = cu.cuArrayCreate(d)
            if rc != cu.CUresult.CUDA_SUCCESS:
                return rc.name
            free1, _ = ck(cu.cuMemGetInfo())
            ck(cu.cuArrayDestroy(arr))
            return (free0 - free1) // (2048 * 1024)   # whole 2 MiB granules
        out({name: taken(getattr(F, name), ch) for name, ch in [
            ("CU_AD_FORMAT_UNSIGNED_INT8", 4), ("CU_AD_FORMAT_SIGNED_INT8", 1),
            ("CU_AD_FORMAT_HALF", 2), ("CU_AD_FORMAT_SIGNED_INT16", 1),
            ("CU_AD_FORMAT_FLOAT", 4), ("CU_AD_FORMAT_UNSIGNED_INT32", 2),
            ("CU_AD_FORMAT_BC7_UNORM", 4)]})
    """)
    assert out == {"CU_AD_FORMAT_UNSIGNED_INT8": 4, "CU_AD_FORMAT_SIGNED_INT8": 1,
                   "CU_AD_FORMAT_HALF": 4, "CU_AD_FORMAT_SIGNED_INT16": 2,
                   "CU_AD_FORMAT_FLOAT": 16, "CU_AD_FORMAT_UNSIGNED_INT32": 8,
                   "CU_AD_FORMAT_BC7_UNORM": "CUDA_ERROR_INVALID_VALUE"}


def test_out_of_memory(sim_env):
    out = run_py(sim_env, SETUP, """
        out({"huge": err(cu.cuMemAlloc(16 << 30)),
             "fits": err(cu.cuMemAlloc((16 << 30) - (300 << 20)))})
    """)
    assert out == {"huge": "CUDA_ERROR_OUT_OF_MEMORY", "fits": "CUDA_SUCCESS"}


def test_wrong_programs_get_the_drivers_errors(sim_env):
    out = run_py(sim_env, f"""
        r = {{"before_init": err(cu.cuDeviceGetCount())}}
        ck(cu.cuInit(0))
        r["alloc_without_context"] = err(cu.cuMemAlloc(1 << 20))
        ctx = ck(cu.cuDevicePrimaryCtxRetain(0)); ck(cu.cuCtxSetCurrent(ctx))
        p = ck(cu.cuMemAlloc(1 << 20))
        r["bad_pointer"] = err(cu.cuMemFree(0xdead0000))
        r["interior_pointer"] = err(cu.cuMemFree(int(p) + 64))
        r["first_free"] = err(cu.cuMemFree(p))
        r["double_free"] = err(cu.cuMemFree(p))
        buf = (ctypes.c_uint8 * 16)()
        r["copy_from_freed"] = err(cu.cuMemcpyDtoH(buf, p, 16))
        q = ck(cu.cuMemAlloc(4096))
        r["copy_past_end"] = err(cu.cuMemcpyDtoH(buf, int(q) + 4090, 16))
        r["garbage_image"] = err(cu.cuModuleLoadData(b"\\x7fnot an image\\x00\\x01"))
        mod = ck(cu.cuModuleLoadData({SPIN_PTX!r}))
        r["unknown_function"] = err(cu.cuModuleGetFunction(mod, b"no_such_kernel"))
        fn = ck(cu.cuModuleGetFunction(mod, b"vgpu_spin"))
        r["zero_grid"] = err(cu.cuLaunchKernel(fn, 0, 1, 1, 1, 1, 1, 0, 0,
                                               ((1,), (ctypes.c_uint64,)), 0))
        r["huge_block"] = err(cu.cuLaunchKernel(fn, 1, 1, 1, 2048, 1, 1, 0, 0,
                                                ((1,), (ctypes.c_uint64,)), 0))
        ck(cu.cuCtxPopCurrent())
        r["launch_without_context"] = err(cu.cuLaunchKernel(fn, 1, 1, 1, 1, 1, 1, 0, 0,
                                                            ((1,), (ctypes.c_uint64,)), 0))
        r["sync_without_context"] = err(cu.cuCtxSynchronize())
        out(r)
    """)
    assert out == {
        "before_init": "CUDA_ERROR_NOT_INITIALIZED",
        "alloc_without_context": "CUDA_ERROR_INVALID_CONTEXT",
        "bad_pointer": "CUDA_ERROR_INVALID_VALUE",
        "interior_pointer": "CUDA_ERROR_INVALID_VALUE",
        "first_free": "CUDA_SUCCESS",
        "double_free": "CUDA_ERROR_INVALID_VALUE",
        "copy_from_freed": "CUDA_ERROR_INVALID_VALUE",
        "copy_past_end": "CUDA_ERROR_INVALID_VALUE",
        "garbage_image": "CUDA_ERROR_INVALID_IMAGE",
        "unknown_function": "CUDA_ERROR_NOT_FOUND",
        "zero_grid": "CUDA_ERROR_INVALID_VALUE",
        "huge_block": "CUDA_ERROR_INVALID_VALUE",
        "launch_without_context": "CUDA_ERROR_INVALID_CONTEXT",
        "sync_without_context": "CUDA_ERROR_INVALID_CONTEXT",
    }


def test_launch_is_asynchronous_and_sync_waits(sim_env):
    out = run_py(sim_env, SETUP, """
        t0 = time.monotonic()
        ck(spin(200_000_000))
        launched = time.monotonic() - t0
        busy = err(cu.cuStreamQuery(0))
        ck(cu.cuCtxSynchronize())
        out({"launched": launched, "synced": time.monotonic() - t0, "busy": busy,
             "idle": err(cu.cuStreamQuery(0))})
    """)
    assert out["launched"] < 0.1
    assert out["busy"] == "CUDA_ERROR_NOT_READY" and out["idle"] == "CUDA_SUCCESS"
    assert 0.19 <= out["synced"] < 2


def test_events_time_the_kernels(sim_env):
    out = run_py(sim_env, SETUP, """
        s = ck(cu.cuStreamCreate(0))
        a, b = ck(cu.cuEventCreate(0)), ck(cu.cuEventCreate(0))
        ck(spin(10_000_000, s))  # busy while the host queues the rest
        ck(cu.cuEventRecord(a, s))
        ck(spin(30_000_000, s))
        ck(spin(20_000_000, s))
        ck(cu.cuEventRecord(b, s))
        pending = err(cu.cuEventQuery(b))
        early = err(cu.cuEventElapsedTime(a, b))
        ck(cu.cuEventSynchronize(b))
        out({"pending": pending, "early": early, "ms": ck(cu.cuEventElapsedTime(a, b)),
             "done": err(cu.cuEventQuery(b))})
    """)
    assert out["pending"] == "CUDA_ERROR_NOT_READY" and out["early"] == "CUDA_ERROR_NOT_READY"
    assert out["done"] == "CUDA_SUCCESS"
    assert out["ms"] == pytest.approx(50.0, abs=0.5)


def test_kernel_duration_rule_for_ordinary_kernels(sim_env):
    sim_env["VGPU_SIM_NS_PER_BLOCK"] = "1000000"  # 1 ms per wave of 132 blocks
    out = run_py(sim_env, SETUP, """
        work = ck(cu.cuModuleGetFunction(mod, b"work"))
        p = ck(cu.cuMemAlloc(1024))
        a, b = ck(cu.cuEventCreate(0)), ck(cu.cuEventCreate(0))
        times = []
        for blocks in (1, 132, 133, 132 * 20):
            ck(spin(20_000_000))  # keeps the device busy while the host queues the rest
            ck(cu.cuEventRecord(a, 0))
            ck(cu.cuLaunchKernel(work, blocks, 1, 1, 256, 1, 1, 0, 0,
                                 ((int(p), 256), (ctypes.c_void_p, ctypes.c_uint32)), 0))
            ck(cu.cuEventRecord(b, 0))
            ck(cu.cuEventSynchronize(b))
            times.append(ck(cu.cuEventElapsedTime(a, b)))
        out(times)
    """)
    assert out == pytest.approx([1.0, 1.0, 2.0, 20.0], abs=0.05)


def test_graph_launch(sim_env):
    out = run_py(sim_env, SETUP, """
        g = ck(cu.cuGraphCreate(0))
        p = cu.CUDA_KERNEL_NODE_PARAMS()
        p.func = fn
        p.gridDimX = p.gridDimY = p.gridDimZ = 1
        p.blockDimX = p.blockDimY = p.blockDimZ = 1
        p.sharedMemBytes = 0
        p.kernelParams = ((10_000_000,), (ctypes.c_uint64,))
        n1 = ck(cu.cuGraphAddKernelNode(g, None, 0, p))
        n2 = ck(cu.cuGraphAddKernelNode(g, [n1], 1, p))
        ck(cu.cuGraphAddKernelNode(g, [n2], 1, p))
        ex = ck(cu.cuGraphInstantiate(g, 0))
        a, b = ck(cu.cuEventCreate(0)), ck(cu.cuEventCreate(0))
        ck(spin(10_000_000))  # busy while the host queues the rest
        ck(cu.cuEventRecord(a, 0)); ck(cu.cuGraphLaunch(ex, 0)); ck(cu.cuEventRecord(b, 0))
        ck(cu.cuEventSynchronize(b))
        out({"nodes": len(ck(cu.cuGraphGetNodes(g, 3))[0]), "ms": ck(cu.cuEventElapsedTime(a, b))})
    """)
    assert out["nodes"] == 3
    assert out["ms"] == pytest.approx(30.0, abs=0.5)


def test_virtual_memory_management(sim_env):
    out = run_py(sim_env, SETUP, """
        prop = cu.CUmemAllocationProp()
        prop.type = cu.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED
        prop.location.type = cu.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
        prop.location.id = 0
        gran = ck(cu.cuMemGetAllocationGranularity(
            prop, cu.CUmemAllocationGranularity_flags.CU_MEM_ALLOC_GRANULARITY_MINIMUM))
        free0, _ = ck(cu.cuMemGetInfo())
        h = ck(cu.cuMemCreate(2 * gran, prop, 0))
        free1, _ = ck(cu.cuMemGetInfo())
        va = ck(cu.cuMemAddressReserve(4 * gran, 0, 0, 0))
        ck(cu.cuMemMap(va, 2 * gran, 0, h, 0))
        ck(cu.cuMemMap(int(va) + 2 * gran, 2 * gran, 0, h, 0))
        src = (ctypes.c_uint8 * 16)(*range(16)); back = (ctypes.c_uint8 * 16)()
        ck(cu.cuMemcpyHtoD(va, src, 16))
        ck(cu.cuMemcpyDtoH(back, int(va) + 2 * gran, 16))
        ck(cu.cuMemUnmap(va, 4 * gran)); ck(cu.cuMemRelease(h))
        ck(cu.cuMemAddressFree(va, 4 * gran))
        free2, _ = ck(cu.cuMemGetInfo())
        out({"gran": gran, "charged": free0 - free1, "alias": list(back) == list(src),
             "released": free2 == free0, "odd_size": err(cu.cuMemCreate(gran + 1, prop, 0))})
    """)
    assert out == {"gran": 2 * MiB, "charged": 4 * MiB, "alias": True, "released": True,
                   "odd_size": "CUDA_ERROR_INVALID_VALUE"}


def test_stream_ordered_allocation(sim_env):
    out = run_py(sim_env, SETUP, """
        s = ck(cu.cuStreamCreate(0))
        free0, _ = ck(cu.cuMemGetInfo())
        p = ck(cu.cuMemAllocAsync(3 << 20, s))
        free1, _ = ck(cu.cuMemGetInfo())
        ck(cu.cuMemFreeAsync(p, s)); ck(cu.cuStreamSynchronize(s))
        free2, _ = ck(cu.cuMemGetInfo())
        out([free0 - free1, free0 - free2])
    """)
    assert out == [4 * MiB, 0]


def test_created_contexts_cost_memory_and_stack(sim_env):
    out = run_py(sim_env, """
        ck(cu.cuInit(0))
        def create(dev):
            try:
                return ck(cu.cuCtxCreate(None, 0, dev))   # cuda-bindings 13: _v4
            except TypeError:
                return ck(cu.cuCtxCreate(0, dev))         # cuda-bindings 12
        a = create(0)
        free_a, _ = ck(cu.cuMemGetInfo())
        b = create(0)
        free_b, _ = ck(cu.cuMemGetInfo())
        current_b = int(ck(cu.cuCtxGetCurrent())) == int(b)
        ck(cu.cuCtxDestroy(b))
        current_a = int(ck(cu.cuCtxGetCurrent())) == int(a)
        free_after, _ = ck(cu.cuMemGetInfo())
        out({"each": free_a - free_b, "back": free_after == free_a,
             "stack": [current_b, current_a], "destroyed": err(cu.cuCtxPushCurrent(b))})
    """)
    assert out == {"each": 300 * MiB, "back": True, "stack": [True, True],
                   "destroyed": "CUDA_ERROR_INVALID_CONTEXT"}


def test_extended_and_cooperative_launches(sim_env):
    out = run_py(sim_env, SETUP, """
        def config(blocks, stream):
            c = cu.CUlaunchConfig()
            c.gridDimX, c.gridDimY, c.gridDimZ = blocks, 1, 1
            c.blockDimX = c.blockDimY = c.blockDimZ = 1
            c.sharedMemBytes = 0
            c.hStream = stream
            c.numAttrs = 0
            return c
        s = ck(cu.cuStreamCreate(0))
        a, b = ck(cu.cuEventCreate(0)), ck(cu.cuEventCreate(0))
        ck(spin(10_000_000, s))
        ck(cu.cuEventRecord(a, s))
        ck(cu.cuLaunchKernelEx(config(1, s), fn, ((20_000_000,), (ctypes.c_uint64,)), 0))
        ck(cu.cuEventRecord(b, s))
        ck(cu.cuEventSynchronize(b))
        args = ((1000,), (ctypes.c_uint64,))
        out({"ex_ms": ck(cu.cuEventElapsedTime(a, b)),
             "coop": err(cu.cuLaunchCooperativeKernel(fn, 132, 1, 1, 1, 1, 1, 0, s, args)),
             "coop_too_large": err(cu.cuLaunchCooperativeKernel(fn, 5000, 1, 1, 1, 1, 1, 0, s,
                                                                args))})
    """)
    assert out["ex_ms"] == pytest.approx(20.0, abs=0.5)
    assert out["coop"] == "CUDA_SUCCESS"
    assert out["coop_too_large"] == "CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE"


def test_launches_before_cuLaunchKernel(sim_env):
    """cuLaunch, cuLaunchGrid and cuLaunchGridAsync (CUDA 2.0, deprecated,
    still exported) launch with the block shape, shared memory and parameter
    buffer set on the function; on a capturing stream they are recorded."""
    out = run_py(sim_env, SETUP, """
        ns = ctypes.c_uint64(20_000_000)
        res = {"no_shape": err(cu.cuLaunch(fn))}
        ck(cu.cuFuncSetBlockShape(fn, 1, 1, 1))
        ck(cu.cuFuncSetSharedSize(fn, 0))
        ck(cu.cuParamSetv(fn, 0, ctypes.addressof(ns), 8))
        ck(cu.cuParamSetSize(fn, 8))
        s = ck(cu.cuStreamCreate(0))
        a, b = ck(cu.cuEventCreate(0)), ck(cu.cuEventCreate(0))
        ck(spin(10_000_000, s))
        ck(cu.cuEventRecord(a, s))
        ck(cu.cuLaunchGridAsync(fn, 1, 1, s))
        ck(cu.cuEventRecord(b, s))
        ck(cu.cuEventSynchronize(b))
        res["ms"] = ck(cu.cuEventElapsedTime(a, b))
        ck(cu.cuParamSeti(fn, 0, 1000)); ck(cu.cuParamSeti(fn, 4, 0))
        res["grid"] = err(cu.cuLaunchGrid(fn, 132, 2))
        res["launch"] = err(cu.cuLaunch(fn))
        res["no_grid"] = err(cu.cuLaunchGrid(fn, 0, 1))
        res["float"] = err(cu.cuParamSetf(fn, 4, 1.5))
        res["past_buffer"] = err(cu.cuParamSetv(fn, 4093, ctypes.addressof(ns), 8))
        res["bad_shape"] = err(cu.cuFuncSetBlockShape(fn, 0, 1, 1))
        ck(cu.cuStreamBeginCapture(s, cu.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_GLOBAL))
        ck(cu.cuLaunchGridAsync(fn, 1, 1, s))
        g = ck(cu.cuStreamEndCapture(s))
        res["captured"] = ck(cu.cuGraphGetNodes(g, 0))[1]
        ck(cu.cuCtxSynchronize())
        out(res)
    """)
    assert out.pop("ms") == pytest.approx(20.0, abs=0.5)
    assert out == {"no_shape": "CUDA_ERROR_INVALID_VALUE", "grid": "CUDA_SUCCESS",
                   "launch": "CUDA_SUCCESS", "no_grid": "CUDA_ERROR_INVALID_VALUE",
                   "float": "CUDA_SUCCESS", "past_buffer": "CUDA_ERROR_INVALID_VALUE",
                   "bad_shape": "CUDA_ERROR_INVALID_VALUE", "captured": 1}


def test_a_reset_destroys_the_primary_context(sim_env):
    """cuDevicePrimaryCtxReset destroys the primary context as its last
    release would (its memory back, inactive, calls in it fail), without
    releasing it: the release owed stays harmless, and a retain makes the
    context anew behind the same handle."""
    out = run_py(sim_env, """
        ck(cu.cuInit(0))
        ctx = ck(cu.cuDevicePrimaryCtxRetain(0))
        ck(cu.cuCtxSetCurrent(ctx))
        ck(cu.cuMemAlloc(64 << 20))
        free0, total = ck(cu.cuMemGetInfo())
        ck(cu.cuDevicePrimaryCtxReset(0))
        res = {"state": ck(cu.cuDevicePrimaryCtxGetState(0))[1],
               "in_it": err(cu.cuMemGetInfo())}
        again = ck(cu.cuDevicePrimaryCtxRetain(0))
        res["same_handle"] = int(again) == int(ctx)
        free1, _ = ck(cu.cuMemGetInfo())
        res["given_back"] = (free1 - free0) >> 20
        res["releases"] = [err(cu.cuDevicePrimaryCtxRelease(0)) for _ in range(3)]
        res["after"] = ck(cu.cuDevicePrimaryCtxGetState(0))[1]
        out(res)
    """)
    assert out == {"state": 0, "in_it": "CUDA_ERROR_CONTEXT_IS_DESTROYED", "same_handle": True,
                   "given_back": 64, "releases": ["CUDA_SUCCESS", "CUDA_SUCCESS",
                                                  "CUDA_ERROR_INVALID_CONTEXT"], "after": 0}


def test_pointer_attributes_answer_each_attribute_it_can(sim_env):
    """cuPointerGetAttributes on device memory answers every attribute it
    is asked for: the host address, which device memory has none of, reads
    NULL instead of failing the whole call (what CuPy's and PyTorch's
    hand-over of arrays asks); an unknown pointer reads as no allocation."""
    out = run_py(sim_env, SETUP, """
        A = cu.CUpointer_attribute
        attrs = [A.CU_POINTER_ATTRIBUTE_MEMORY_TYPE, A.CU_POINTER_ATTRIBUTE_HOST_POINTER,
                 A.CU_POINTER_ATTRIBUTE_DEVICE_POINTER, A.CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
                 A.CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE]
        p = ck(cu.cuMemAlloc(4096))
        r = cu.cuPointerGetAttributes(len(attrs), attrs, p)
        stray = cu.cuPointerGetAttributes(len(attrs), attrs, 4096)
        out({"rc": err(r), "values": [int(v) for v in r[1]], "p": int(p),
             "stray": err(stray), "stray_ordinal": int(stray[1][3]),
             "single_host": err(cu.cuPointerGetAttribute(A.CU_POINTER_ATTRIBUTE_HOST_POINTER, p))})
    """)
    assert out["rc"] == "CUDA_SUCCESS"
    assert out["values"] == [2, 0, out["p"], 0, 1]   # CU_MEMORYTYPE_DEVICE, NULL, ...
    assert out["stray"] == "CUDA_SUCCESS" and out["stray_ordinal"] == -2
    assert out["single_host"] == "CUDA_ERROR_INVALID_VALUE"


# A module's variables, as nvcc and NVRTC write them: a __constant__ array
# and a __device__ float with initial values.
GLOBALS_PTX = rb"""
.version 8.0
.target sm_90
.address_size 64
.const .align 4 .b8 cval[16] = {1, 0, 0, 0, 2, 0, 0, 0, 3, 0, 0, 0, 4};
.global .align 4 .f32 dval = 0f40200000;
.global .align 8 .u64 table[3] = {7, 8};
.extern .global .align 4 .u32 elsewhere;
.visible .entry k(.param .u64 o)
{
    ret;
}
"""
GLOBALS_CU = rb"""
__constant__ int cval[4] = {1, 2, 3, 4};
__device__ float dval = 2.5f;
extern "C" __global__ void k(int *o) { o[0] = cval[0] + (int)dval; }
"""


def test_module_globals_of_ptx_and_cubin(sim_env):
    """cuModuleGetGlobal finds the __constant__ and __device__ variables a
    PTX or cubin module declares, at their size and holding their initial
    values (RawModule.get_global in CuPy); one declared elsewhere or never
    declared: CUDA_ERROR_NOT_FOUND."""
    pytest.importorskip("cuda.bindings.nvrtc")
    out = run_py(sim_env, SETUP, f"""
        from cuda.bindings import nvrtc
        e, prog = nvrtc.nvrtcCreateProgram({GLOBALS_CU!r}, b"k.cu", 0, [], [])
        compiled = nvrtc.nvrtcCompileProgram(prog, 1, [b"--gpu-architecture=sm_90"])[0]
        if compiled != nvrtc.nvrtcResult.NVRTC_SUCCESS:
            raise SystemExit(f"NVRTC: {{compiled!r}}")
        n = nvrtc.nvrtcGetCUBINSize(prog)[1]
        cubin = b" " * n
        nvrtc.nvrtcGetCUBIN(prog, cubin)
        res = {{}}
        for kind, image in (("ptx", {GLOBALS_PTX!r}), ("cubin", cubin)):
            m = ck(cu.cuModuleLoadData(image))
            r = {{}}
            for name in (b"cval", b"dval"):
                ptr, size = ck(cu.cuModuleGetGlobal(m, name))
                buf = bytearray(size)
                ck(cu.cuMemcpyDtoH(buf, ptr, size))
                r[name.decode()] = buf.hex()
            r["missing"] = err(cu.cuModuleGetGlobal(m, b"nothing"))
            if kind == "ptx":
                ptr, size = ck(cu.cuModuleGetGlobal(m, b"table"))
                buf = bytearray(size)
                ck(cu.cuMemcpyDtoH(buf, ptr, size))
                r["table"] = buf.hex()
                r["extern"] = err(cu.cuModuleGetGlobal(m, b"elsewhere"))
            res[kind] = r
        out(res)
    """, timeout=120)
    values = {"cval": "01000000020000000300000004000000", "dval": "00002040",
              "missing": "CUDA_ERROR_NOT_FOUND"}
    assert out["cubin"] == values
    assert out["ptx"] == {**values, "table": "07" + "00" * 7 + "08" + "00" * 15,
                          "extern": "CUDA_ERROR_NOT_FOUND"}


def test_entry_points_cuda_13_looks_up(sim_env):
    """A sample of what CUDA 13.0's runtime looks up and the simulator
    lacked (each was cudaErrorCallRequiresNewerDriver): stream attributes
    kept and read back, a stream's device, a texture object made over device
    memory, a batch of copies, advice on managed memory, profiler calls; and
    graphics interop answering as on a device without it."""
    out = run_py(sim_env, SETUP, """
        s = ck(cu.cuStreamCreate(1))
        A = cu.CUstreamAttrID
        v = cu.CUstreamAttrValue()
        v.priority = -3
        ck(cu.cuStreamSetAttribute(s, A.CU_LAUNCH_ATTRIBUTE_PRIORITY, v))
        res = {"priority": ck(cu.cuStreamGetAttribute(s, A.CU_LAUNCH_ATTRIBUTE_PRIORITY)).priority,
               "stream_priority": ck(cu.cuStreamGetPriority(s)),
               "sync_policy": int(ck(cu.cuStreamGetAttribute(
                   s, A.CU_LAUNCH_ATTRIBUTE_SYNCHRONIZATION_POLICY)).syncPolicy),
               "device": int(ck(cu.cuStreamGetDevice(s)))}
        p, q = ck(cu.cuMemAlloc(4096)), ck(cu.cuMemAlloc(4096))
        rd = cu.CUDA_RESOURCE_DESC()
        rd.resType = cu.CUresourcetype.CU_RESOURCE_TYPE_LINEAR
        rd.res.linear.devPtr = p
        rd.res.linear.format = cu.CUarray_format.CU_AD_FORMAT_FLOAT
        rd.res.linear.numChannels = 1
        rd.res.linear.sizeInBytes = 4096
        tex = ck(cu.cuTexObjectCreate(rd, cu.CUDA_TEXTURE_DESC(), None))
        back = ck(cu.cuTexObjectGetResourceDesc(tex))
        res["texture"] = [int(back.res.linear.devPtr) == int(p), back.res.linear.sizeInBytes]
        ck(cu.cuTexObjectDestroy(tex))
        res["destroyed"] = err(cu.cuTexObjectDestroy(tex))
        ck(cu.cuMemcpyHtoD(p, b"batch!", 6))
        attr = cu.CUmemcpyAttributes()
        attr.srcAccessOrder = cu.CUmemcpySrcAccessOrder.CU_MEMCPY_SRC_ACCESS_ORDER_STREAM
        ck(cu.cuMemcpyBatchAsync([q], [p], [6], 1, [attr], [0], 1, s))
        buf = bytearray(6); ck(cu.cuMemcpyDtoH(buf, q, 6))
        res["batch"] = bytes(buf).decode()
        m = ck(cu.cuMemAllocManaged(4096, cu.CUmemAttach_flags.CU_MEM_ATTACH_GLOBAL))
        loc = cu.CUmemLocation()
        loc.type = cu.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
        loc.id = 0
        res["advise"] = err(cu.cuMemAdvise(m, 4096,
            cu.CUmem_advise.CU_MEM_ADVISE_SET_READ_MOSTLY, loc))
        res["advise_device_memory"] = err(cu.cuMemAdvise(p, 4096,
            cu.CUmem_advise.CU_MEM_ADVISE_SET_READ_MOSTLY, loc))
        res["profiler"] = [err(cu.cuProfilerStart()), err(cu.cuProfilerStop())]
        res["graphics"] = err(cu.cuGraphicsUnregisterResource(0))
        out(res)
    """)
    assert out == {"priority": -3, "stream_priority": -3, "sync_policy": 1, "device": 0,
                   "texture": [True, 4096], "destroyed": "CUDA_ERROR_INVALID_VALUE",
                   "batch": "batch!", "advise": "CUDA_SUCCESS",
                   "advise_device_memory": "CUDA_ERROR_INVALID_VALUE",
                   "profiler": ["CUDA_SUCCESS", "CUDA_SUCCESS"],
                   "graphics": "CUDA_ERROR_NOT_SUPPORTED"}
