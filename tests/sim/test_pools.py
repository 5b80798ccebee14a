"""Stream-ordered memory pools keep what their allocations free, as the
driver's do: up to the release threshold (0 by default, so everything goes
back at once), or all of it with the threshold at its maximum, as PyTorch's
cudaMallocAsync backend sets it, until cuMemPoolTrimTo."""

from __future__ import annotations

from support.sim import run_py

GiB = 1 << 30

# Allocate and free 1 GiB from the default pool; report the device's free
# memory and the pool's reserve after each step.
POOL_SNIPPET = """
ck(cu.cuInit(0))
ctx = ck(cu.cuDevicePrimaryCtxRetain(0)); ck(cu.cuCtxSetCurrent(ctx))
pool = ck(cu.cuDeviceGetDefaultMemPool(0))
A = cu.CUmemPool_attribute
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
