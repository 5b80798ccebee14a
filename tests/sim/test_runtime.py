"""NVIDIA's CUDA runtime and CuPy, unmodified, on the simulated GPU: the
runtime's handshake with the driver (cuGetExportTable) and what the
frameworks built on it call first. The wheels are pinned in the test extras;
docs/simulator.md has the version matrix."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest
from support.sim import SPIN_PTX, run_py, script

SITE = Path(importlib.util.find_spec("nvidia").submodule_search_locations[0]) \
    if importlib.util.find_spec("nvidia") else None


def _cudart(rel: str) -> Path:
    if SITE is None or not (SITE / rel).exists():
        pytest.skip(f"the CUDA runtime wheel is not installed ({rel})")
    return SITE / rel


CUDART_12 = "cuda_runtime/lib/libcudart.so.12"
CUDART_13 = "cu13/lib/libcudart.so.13"

# Through ctypes, as a program linked to libcudart calls it.
CUDART_SNIPPET = """
lib = ctypes.CDLL(PATH)
n = ctypes.c_int(); v = ctypes.c_int()
free, total = ctypes.c_size_t(), ctypes.c_size_t()
p, q = ctypes.c_void_p(), ctypes.c_void_p()
res = {
    "count": (lib.cudaGetDeviceCount(ctypes.byref(n)), n.value),
    "version": (lib.cudaRuntimeGetVersion(ctypes.byref(v)), v.value),
    "malloc": lib.cudaMalloc(ctypes.byref(p), ctypes.c_size_t(1 << 30)),
}
res["info"] = (lib.cudaMemGetInfo(ctypes.byref(free), ctypes.byref(total)), free.value,
               total.value)
res["oom"] = lib.cudaMalloc(ctypes.byref(q), ctypes.c_size_t(64 << 30))
res["free"] = lib.cudaFree(p)
res["reset"] = lib.cudaDeviceReset()
out(res)
"""


@pytest.mark.parametrize(("rel", "major"), [(CUDART_12, 12), (CUDART_13, 13)])
def test_cudart_runs_on_the_simulator(sim, rel, major):
    """cudart 12.x and 13.x: device count, malloc, memGetInfo, OOM as
    cudaErrorMemoryAllocation (2), free."""
    lib = _cudart(rel)
    res = run_py(sim.env, f"PATH = {str(lib)!r}\n", CUDART_SNIPPET)
    assert res["count"] == [0, 2]
    assert res["version"][0] == 0 and res["version"][1] // 1000 == major
    assert res["malloc"] == 0
    rc, free, total = res["info"]
    assert rc == 0 and total == 16 << 30
    # the context (300 MiB) and the 1 GiB allocation are in use
    assert total - free == (300 << 20) + (1 << 30)
    assert res["oom"] == 2          # cudaErrorMemoryAllocation
    assert res["free"] == 0 and res["reset"] == 0


def _count_devices_logged(sim) -> subprocess.CompletedProcess[str]:
    """CUDA 13's runtime asked for the device count (its error printed last)
    with VGPU_SIM_DARKAPI_LOG=1, in a process that must succeed: what the
    simulator logged is on its stderr."""
    lib = _cudart(CUDART_13)
    env = dict(sim.env, VGPU_SIM_DARKAPI_LOG="1")
    code = (f"lib = ctypes.CDLL({str(lib)!r}); n = ctypes.c_int()\n"
            "out(lib.cudaGetDeviceCount(ctypes.byref(n)))\n")
    res = subprocess.run([sys.executable, "-c", script(code)], env=env, capture_output=True,
                         text=True, timeout=60, check=False)
    assert res.returncode == 0, res.stderr
    return res


def test_darkapi_log_names_each_table_asked_for(sim):
    """VGPU_SIM_DARKAPI_LOG names the tables a runtime asks for, and the
    unknown one every runtime asks for first, refused as the driver does."""
    res = _count_devices_logged(sim)
    assert res.stdout.strip().splitlines()[-1] == "0"
    for table in ("CUDART_INTERFACE", "CONTEXT_LOCAL_STORAGE_INTERFACE_V0301",
                  "INTEGRITY_CHECK"):
        assert f"darkapi: table {table}" in res.stderr
    assert "darkapi: unknown table f8cff95121468b4eb9e2fb469e7c0dd9 refused" in res.stderr


CUPY_SNIPPET = r"""
import cupy as cp
res = {"count": cp.cuda.runtime.getDeviceCount(),
       "cc": cp.cuda.Device(0).compute_capability,
       "info": list(cp.cuda.runtime.memGetInfo())}
k = cp.RawKernel(r'''
extern "C" __global__ void scale(float *x, float a, int n) {
    int i = blockDim.x * blockIdx.x + threadIdx.x;
    if (i < n) x[i] *= a;
}''', "scale")
x = cp.zeros(1024, dtype=cp.float32)
k((4,), (256,), (x, cp.float32(2.0), cp.int32(1024)))
cp.cuda.Device().synchronize()
res["launched"] = True
try:
    cp.empty(64 << 30, dtype=cp.uint8)
    res["oom"] = None
except cp.cuda.memory.OutOfMemoryError as e:
    res["oom"] = str(e)
out(res)
"""


def test_cupy_runs_on_the_simulator(sim):
    """CuPy: the device, memGetInfo, an NVRTC-compiled RawKernel launched,
    and OutOfMemoryError past the device's memory."""
    pytest.importorskip("cupy")
    res = run_py(sim.env, CUPY_SNIPPET, timeout=120)
    assert res["count"] == 2
    assert res["cc"] == "90"
    assert res["info"][1] == 16 << 30
    assert res["launched"]
    assert res["oom"] and "Out of memory" in res["oom"]


CAPTURE_SNIPPET = """
ck(cu.cuInit(0))
ctx = ck(cu.cuDevicePrimaryCtxRetain(0)); ck(cu.cuCtxSetCurrent(ctx))
mod = ck(cu.cuModuleLoadData(SPIN_PTX)); fn = ck(cu.cuModuleGetFunction(mod, b"vgpu_spin"))
res = {"legacy": err(cu.cuStreamBeginCapture(cu.CUstream(0),
       cu.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_GLOBAL))}
s = ck(cu.cuStreamCreate(1))
ck(cu.cuStreamBeginCapture(s, cu.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_GLOBAL))
res["capturing"] = ck(cu.cuStreamIsCapturing(s)).name
arg = ctypes.c_uint64(1_000_000)
args = (ctypes.c_void_p * 1)(ctypes.addressof(arg))
for _ in range(3):
    ck(cu.cuLaunchKernel(fn, 1, 1, 1, 1, 1, 1, 0, s, ctypes.addressof(args), 0))
g = ck(cu.cuStreamEndCapture(s))
res["nodes"] = ck(cu.cuGraphGetNodes(g, 0))[1]
ge = ck(cu.cuGraphInstantiate(g, 0))
t0 = time.monotonic(); ck(cu.cuGraphLaunch(ge, s)); ck(cu.cuStreamSynchronize(s))
res["replay_s"] = time.monotonic() - t0
res["after"] = ck(cu.cuStreamIsCapturing(s)).name
out(res)
"""


def test_stream_capture_records_launches_as_a_graph(sim):
    """Kernels launched on a capturing stream do not run: they become the
    graph's nodes, which run when the graph is launched. The legacy default
    stream cannot capture."""
    res = run_py(sim.env, f"SPIN_PTX = {SPIN_PTX!r}\n", CAPTURE_SNIPPET)
    assert res["legacy"] == "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED"
    assert res["capturing"] == "CU_STREAM_CAPTURE_STATUS_ACTIVE"
    assert res["nodes"] == 3
    assert res["replay_s"] >= 0.003  # three 1 ms kernels ran on replay
    assert res["after"] == "CU_STREAM_CAPTURE_STATUS_NONE"


# The runtime's per-context state, through the table it asks for: a value
# stored for a context is read back, and its destructor runs when the
# context dies (here: the primary context's last release).
CLS_SNIPPET = """
lib = ctypes.CDLL("libcuda.so.1")
assert lib.cuInit(0) == 0
uuid = bytes.fromhex("c693336e1121df11a8c368f355d89593")
table = ctypes.POINTER(ctypes.c_void_p)()
res = {"table": lib.cuGetExportTable(ctypes.byref(table), uuid)}
DTOR = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p)
PUT = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, DTOR)
GET = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(ctypes.c_void_p), ctypes.c_void_p,
                       ctypes.c_void_p)
put, get = PUT(table[0]), GET(table[2])
died = []
dtor = DTOR(lambda ctx, key, value: died.append(value))
v = ctypes.c_void_p()
res["get_no_ctx"] = get(ctypes.byref(v), None, 7)
ctx = ctypes.c_void_p()
assert lib.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), 0) == 0
assert lib.cuCtxSetCurrent(ctx) == 0
res["get_absent"] = get(ctypes.byref(v), None, 7)
res["put"] = put(None, 7, 1234, dtor)
res["get"] = [get(ctypes.byref(v), ctx, 7), v.value]
res["died_before"] = list(died)
assert lib.cuDevicePrimaryCtxRelease_v2(0) == 0
res["died_after"] = list(died)
out(res)
"""


def test_context_local_storage_destructors_run_when_the_context_dies(sim):
    res = run_py(sim.env, CLS_SNIPPET)
    assert res["table"] == 0
    assert res["get_no_ctx"] == 201      # CUDA_ERROR_INVALID_CONTEXT: none current
    assert res["get_absent"] == 400      # CUDA_ERROR_INVALID_HANDLE: no such key
    assert res["put"] == 0 and res["get"] == [0, 1234]
    assert res["died_before"] == [] and res["died_after"] == [1234]


CUPY_LIBRARIES = r"""
import cupy as cp
res = {}
a = cp.ones((512, 256), dtype=cp.float16)
b = cp.ones((256, 128), dtype=cp.float16)
res["fp16_matmul"] = list((a @ b).shape)           # cuBLAS -> cuBLASLt's heuristic
x = cp.ones(1024, dtype=cp.complex64)
res["fft"] = list(cp.fft.fft(x).shape)             # cuFFT: a plan and its kernel
res["rfft2"] = list(cp.fft.rfft2(cp.ones((64, 64), dtype=cp.float32)).shape)
cp.cuda.Device().synchronize()
out(res)
"""


def _nvidia_lib(name: str) -> bool:
    """Whether NVIDIA's wheels put `name` (any version) under site-packages."""
    import glob
    import site
    return any(glob.glob(f"{d}/nvidia/**/{name}*", recursive=True)
               for d in site.getsitepackages())


def test_cupy_half_precision_matmul_and_fft_run(sim):
    """CuPy's fp16 matmul reaches cuBLASLt's algorithm heuristic, which asks
    the driver for a private table (26dc3417-...) and calls into it without
    checking the answer (it crashed when the table was refused); cuFFT's
    plans need the ToolsModule table and the LZ4-compressed PTX of its
    kernels read (CUFFT_INTERNAL_ERROR without)."""
    pytest.importorskip("cupy")
    for lib in ("libcublasLt.so", "libcufft.so"):
        if not _nvidia_lib(lib):
            # cuBLAS and cuFFT come with torch: .ci/run's frameworks step,
            # which installs it, runs this test too
            pytest.skip(f"{lib}* is not installed (it comes with torch)")
    res = run_py(sim.env, CUPY_LIBRARIES, timeout=180)
    assert res == {"fp16_matmul": [512, 128], "fft": [1024], "rfft2": [64, 33]}


def test_cudart_13_finds_every_entry_point_it_looks_up(sim):
    """CUDA 13.0's runtime looks up about 350 driver entry points at its
    start; every one exists (implemented, or answering as the driver does
    for a feature the device lacks), so no runtime call fails with
    cudaErrorCallRequiresNewerDriver for want of one. The one name not found
    is the runtime's own probe of an empty name."""
    res = _count_devices_logged(sim)
    missing = [ln for ln in res.stderr.splitlines() if "procaddr:" in ln]
    assert missing and all("procaddr:  (0) not found" in ln for ln in missing), missing
