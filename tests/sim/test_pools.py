"""Stream-ordered memory pools keep what their allocations free, as the
driver's do: up to the release threshold (0 by default, so everything goes
back at the next synchronisation), or all of it with the threshold at its
maximum, as PyTorch's cudaMallocAsync backend sets it, until cuMemPoolTrimTo;
and small allocations share the chunks of reserve the pool grows by."""

from __future__ import annotations

from support.sim import run_py

GiB = 1 << 30

# GPU 0's primary context current, `pool` its default pool and A the pool
# attributes: what each snippet here starts from.
POOL_SETUP = """
ck(cu.cuInit(0))
ctx = ck(cu.cuDevicePrimaryCtxRetain(0)); ck(cu.cuCtxSetCurrent(ctx))
pool = ck(cu.cuDeviceGetDefaultMemPool(0))
A = cu.CUmemPool_attribute
"""

# Allocate and free 1 GiB from the default pool; report the device's free
# memory and the pool's reserve after each step.
POOL_SNIPPET = POOL_SETUP + """\
def state():
    free = ck(cu.cuMemGetInfo())[0]
    reserved = int(ck(cu.cuMemPoolGetAttribute(pool, A.CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT)))
    used = int(ck(cu.cuMemPoolGetAttribute(pool, A.CU_MEMPOOL_ATTR_USED_MEM_CURRENT)))
    return [free, reserved, used]
res = {"start": state()}
if KEEP:
    ck(cu.cuMemPoolSetAttribute(pool, A.CU_MEMPOOL_ATTR_RELEASE_THRESHOLD,
                                cu.cuuint64_t(2**64 - 1)))
p = ck(cu.cuMemAllocFromPoolAsync(1 << 30, pool, cu.CUstream(0)))
res["allocated"] = state()
ck(cu.cuMemFreeAsync(p, cu.CUstream(0))); ck(cu.cuCtxSynchronize())
res["freed"] = state()
p = ck(cu.cuMemAllocFromPoolAsync(1 << 30, pool, cu.CUstream(0)))
res["again"] = state()
ck(cu.cuMemFreeAsync(p, cu.CUstream(0))); ck(cu.cuCtxSynchronize())
ck(cu.cuMemPoolTrimTo(pool, 0))
res["trimmed"] = state()
out(res)
"""


def test_a_pool_gives_freed_memory_back_by_default(sim):
    res = run_py(sim.env, "KEEP = False\n", POOL_SNIPPET)
    free0 = res["start"][0]
    assert res["allocated"] == [free0 - GiB, GiB, GiB]
    assert res["freed"] == [free0, 0, 0]


def test_a_pool_keeps_freed_memory_up_to_its_threshold(sim):
    """With the threshold at its maximum the reserve stays the device's
    loss after the free, serves the next allocation without growing, and
    goes back on cuMemPoolTrimTo."""
    res = run_py(sim.env, "KEEP = True\n", POOL_SNIPPET)
    free0 = res["start"][0]
    assert res["allocated"] == [free0 - GiB, GiB, GiB]
    assert res["freed"] == [free0 - GiB, GiB, 0]
    assert res["again"] == [free0 - GiB, GiB, GiB]
    assert res["trimmed"] == [free0, 0, 0]


# Small allocations from the default pool: the reserve in whole chunks that
# they share, the bytes in use as the allocations' sizes; what a free leaves
# goes back at the next synchronisation, not at the free.
SMALL_SNIPPET = POOL_SETUP + """\
def state():
    return [int(ck(cu.cuMemPoolGetAttribute(pool, A.CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT))),
            int(ck(cu.cuMemPoolGetAttribute(pool, A.CU_MEMPOOL_ATTR_USED_MEM_CURRENT)))]
s0 = cu.CUstream(0)
ps = [ck(cu.cuMemAllocAsync(n, s0)) for n in (1024, 2048, 512)]
res = {"three": state()}
for p in ps:
    ck(cu.cuMemFreeAsync(p, s0))
res["freed"] = state()
ck(cu.cuStreamSynchronize(s0))
res["synced"] = state()
out(res)
"""


def test_small_allocations_share_the_pools_reserve(sim):
    """Three allocations of 1, 2 and 0.5 KiB take one 2 MiB chunk of reserve,
    not a granule each, and use their own sizes; freed, the reserve stays
    until the stream is synchronised (as CuPy's MemoryAsyncPool tests
    expect of the driver)."""
    res = run_py(sim.env, SMALL_SNIPPET)
    assert res == {"three": [2 << 20, 3584], "freed": [2 << 20, 0], "synced": [0, 0]}
