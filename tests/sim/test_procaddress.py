"""cuGetProcAddress on the simulated driver resolves (symbol, cudaVersion,
flags) as NVIDIA's does: the newest versioned entry point the caller's CUDA
version knows, the per-thread-default-stream form when asked for, and
CUDA_ERROR_NOT_FOUND with the reason for names it cannot give."""

from __future__ import annotations

import pytest
from support import REPO
from support.sim import run_py

RESOLVE = """
lib = ctypes.CDLL("libcuda.so.1")
proc = lib.cuGetProcAddress_v2
proc.argtypes = [ctypes.c_char_p, ctypes.POINTER(ctypes.c_void_p), ctypes.c_int,
                 ctypes.c_uint64, ctypes.POINTER(ctypes.c_int)]
PER_THREAD = 2
def resolve(name, version, flags=0):
    fn, status = ctypes.c_void_p(), ctypes.c_int(-1)
    rc = proc(name.encode(), ctypes.byref(fn), version, flags, ctypes.byref(status))
    if rc != 0:
        return [rc, status.value]
    for sym in dir_symbols:
        if ctypes.cast(getattr(lib, sym), ctypes.c_void_p).value == fn.value:
            return sym
    return "unexported address"
"""

CASES = [
    # (name, cudaVersion, flags, expected symbol or [CUresult, status])
    ("cuMemAlloc", 12000, 0, "cuMemAlloc_v2"),
    ("cuMemAlloc", 3020, 0, "cuMemAlloc_v2"),
    ("cuCtxCreate", 3020, 0, "cuCtxCreate_v2"),
    ("cuCtxCreate", 11040, 0, "cuCtxCreate_v3"),
    ("cuCtxCreate", 12000, 0, "cuCtxCreate_v3"),
    ("cuCtxCreate", 12050, 0, "cuCtxCreate_v4"),
    ("cuGetProcAddress", 11030, 0, "cuGetProcAddress"),
    ("cuGetProcAddress", 12000, 0, "cuGetProcAddress_v2"),
    ("cuDeviceGetUuid", 9020, 0, "cuDeviceGetUuid"),
    ("cuDeviceGetUuid", 11040, 0, "cuDeviceGetUuid_v2"),
    ("cuDevicePrimaryCtxRelease", 7000, 0, "cuDevicePrimaryCtxRelease"),
    ("cuDevicePrimaryCtxRelease", 11000, 0, "cuDevicePrimaryCtxRelease_v2"),
    ("cuStreamDestroy", 4000, 0, "cuStreamDestroy_v2"),
    ("cuGraphInstantiate", 12000, 0, "cuGraphInstantiateWithFlags"),
    ("cuLaunchKernel", 12000, 0, "cuLaunchKernel"),
    ("cuLaunchKernel", 12000, 2, "cuLaunchKernel_ptsz"),
    ("cuLaunchKernel", 4000, 2, "cuLaunchKernel"),  # no per-thread form before 7.0
    ("cuMemcpyHtoD", 12000, 2, "cuMemcpyHtoD_v2_ptds"),
    ("cuMemcpyHtoD", 3020, 2, "cuMemcpyHtoD_v2"),
    ("cuMemcpyHtoDAsync", 12000, 2, "cuMemcpyHtoDAsync_v2_ptsz"),
    ("cuStreamSynchronize", 12000, 1, "cuStreamSynchronize"),  # legacy stream asked
    ("cuInit", 2000, 0, "cuInit"),
    ("cuLaunchKernelEx", 11000, 0, [500, 2]),  # VERSION_NOT_SUFFICIENT
    ("cuMemAlloc", 2000, 0, [500, 2]),
    ("cuNoSuchFunction", 12000, 0, [500, 1]),  # SYMBOL_NOT_FOUND
    ("cuMemAlloc_v2", 12000, 0, [500, 1]),     # lookups take base names
    ("cuInit", 12000, 8, [1, 1]),              # unknown flag: INVALID_VALUE
    ("cuCheckpointProcessLock", 12080, 0, "cuCheckpointProcessLock"),   # CUDA 12.8
    ("cuCheckpointProcessRestore", 13000, 0, "cuCheckpointProcessRestore"),
    ("cuCheckpointProcessLock", 12060, 0, [500, 2]),
]


def test_resolution(sim_env):
    symbols = sorted({c[3] for c in CASES if isinstance(c[3], str)})
    out = run_py(sim_env, f"dir_symbols = {symbols!r}\n", RESOLVE, f"""
        out([resolve(n, v, f) for n, v, f, _ in {[c[:3] + (None,) for c in CASES]!r}])
    """)
    assert out == [c[3] for c in CASES]


def test_every_symbol_the_table_names_is_exported(sim_env, sim_libdir):
    """sim/cuda/api.def lists (name, version, symbol); each symbol must be what
    dlsym finds under that name, so programs linked to libcuda and those
    using cuGetProcAddress reach the same functions."""
    import re

    table = REPO / "libvgpu" / "sim" / "cuda" / "api.def"
    rows = re.findall(r"^CU_API(?:_PT)?\((\w+), (\d+), (\w+)\)", table.read_text(), re.MULTILINE)
    assert len(rows) > 200
    out = run_py(sim_env, RESOLVE, f"""
        rows = {rows!r}
        bad = []
        for name, version, sym in rows:
            fn = ctypes.c_void_p()
            st = ctypes.c_int()
            flags = PER_THREAD if sym.endswith(("_ptsz", "_ptds")) else 0
            rc = proc(name.encode(), ctypes.byref(fn), int(version), flags, ctypes.byref(st))
            if rc != 0 or fn.value is None:
                bad.append([name, version, sym, rc])
            elif not hasattr(lib, sym):
                bad.append([name, version, sym, "not exported"])
        out(bad)
    """)
    assert out == []


@pytest.mark.parametrize("flags", [0, 2])
def test_cuda_bindings_runs_through_it(sim_env, flags):
    """cuda-bindings fetches every entry point with cuGetProcAddress_v2, in
    per-thread-default-stream mode too."""
    sim_env["CUDA_PYTHON_CUDA_PER_THREAD_DEFAULT_STREAM"] = "1" if flags else "0"
    out = run_py(sim_env, """
        ck(cu.cuInit(0))
        ctx = ck(cu.cuDevicePrimaryCtxRetain(0)); ck(cu.cuCtxSetCurrent(ctx))
        p = ck(cu.cuMemAlloc(64))
        src = (ctypes.c_uint8 * 64)(*range(64)); back = (ctypes.c_uint8 * 64)()
        ck(cu.cuMemcpyHtoD(p, src, 64)); ck(cu.cuMemcpyDtoH(back, p, 64))
        ck(cu.cuStreamSynchronize(0))
        out(list(back) == list(src))
    """)
    assert out is True
