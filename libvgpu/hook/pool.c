/*
 * pool.c - what stream-ordered memory pools hold. A pool keeps the memory
 * its allocations free (its reserve) up to its release threshold: PyTorch's
 * cudaMallocAsync backend sets that threshold to "everything", so the pool
 * never gives memory back on its own. The job is therefore charged, per
 * pool, what the pool holds as the driver reports it
 * (CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT), not what its live allocations use:
 *
 *   - an allocation from a pool reserves only what the pool lacks (the size
 *     less the pool's spare reserve), calls the driver, then settles the
 *     pool's charge on the reserve the driver reports;
 *   - a free, a trim, a new release threshold, the pool's destruction and
 *     every explicit synchronisation settle it again (the driver may have
 *     given memory back: it gives a pool's spare reserve beyond its release
 *     threshold back at the next cuCtx/cuStream/cuEventSynchronize, as
 *     NVIDIA documents). With no pool in use a synchronisation costs one
 *     atomic load here.
 *
 * The table of pools is small and guarded by a mutex: pool allocations
 * already cost two attribute queries.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdint.h>

#include "hook.h"

#define MAX_POOLS 64

struct pool_charge {
    CUmemoryPool pool;
    int dev;          /* region device */
    uint64_t charged; /* bytes of the job's use that are this pool's reserve */
};

static struct pool_charge g_pools[MAX_POOLS];
static int g_npools;
static pthread_mutex_t g_pool_lock = PTHREAD_MUTEX_INITIALIZER;

static int pool_attr(CUmemoryPool pool, int attr, uint64_t *out)
{
    cuuint64_t v = 0;
    if (REAL(cuMemPoolGetAttribute)(pool, attr, &v) != CUDA_SUCCESS)
        return -1;
    *out = v;
    return 0;
}

/* What the pool can serve without growing; 0 if unknown. */
uint64_t vgpu_pool_spare(CUmemoryPool pool)
{
    uint64_t reserved, used;
    if (pool_attr(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT, &reserved) < 0 ||
        pool_attr(pool, CU_MEMPOOL_ATTR_USED_MEM_CURRENT, &used) < 0)
        return 0;
    return reserved > used ? reserved - used : 0;
}

/* Bring p's charge to the reserve the driver reports, `extra` bytes having
 * been reserved for it by the caller. Needs g_pool_lock. */
static void settle(struct pool_charge *p, uint64_t extra)
{
    uint64_t now;
    if (pool_attr(p->pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT, &now) < 0)
        now = 0; /* destroyed: its memory is the device's again */
    uint64_t have = p->charged + extra;
    if (have > now)
        vgpu_unreserve(p->dev, have - now, 0);
    else if (now > have)
        vgpu_reserve_anyway(p->dev, now - have);
    p->charged = now;
}

static struct pool_charge *find(CUmemoryPool pool)
{
    for (int i = 0; i < g_npools; i++)
        if (g_pools[i].pool == pool)
            return &g_pools[i];
    return NULL;
}

void vgpu_pool_settle(CUmemoryPool pool, int dev, uint64_t extra)
{
    pthread_mutex_lock(&g_pool_lock);
    struct pool_charge *p = find(pool);
    if (!p && g_npools < MAX_POOLS) {
        p = &g_pools[g_npools++];
        *p = (struct pool_charge){.pool = pool, .dev = dev};
    }
    if (p) {
        settle(p, extra);
    } else {
        /* more pools than the table holds: count the allocation itself */
        vgpu_log(VGPU_LOG_WARN, "more than %d memory pools: a pool's reserve is not counted",
                 MAX_POOLS);
    }
    pthread_mutex_unlock(&g_pool_lock);
}

void vgpu_pool_settle_all(void)
{
    if (!__atomic_load_n(&g_npools, __ATOMIC_RELAXED))
        return;
    pthread_mutex_lock(&g_pool_lock);
    for (int i = 0; i < g_npools; i++)
        settle(&g_pools[i], 0);
    pthread_mutex_unlock(&g_pool_lock);
}

void vgpu_pool_forget(CUmemoryPool pool)
{
    pthread_mutex_lock(&g_pool_lock);
    struct pool_charge *p = find(pool);
    if (p) {
        vgpu_unreserve(p->dev, p->charged, 0);
        *p = g_pools[--g_npools];
    }
    pthread_mutex_unlock(&g_pool_lock);
}

/* ---- the pools' own entry points ---------------------------------------- */

CUresult hook_cuMemPoolTrimTo(CUmemoryPool pool, size_t keep)
{
    ENTER(cuMemPoolTrimTo, (pool, keep));
    CU_PROLOGUE(cuMemPoolTrimTo, (pool, keep));
    CUresult r = REAL(cuMemPoolTrimTo)(pool, keep);
    vgpu_pool_settle_all();
    return r;
}

CUresult hook_cuMemPoolSetAttribute(CUmemoryPool pool, CUmemPool_attribute attr, void *value)
{
    ENTER(cuMemPoolSetAttribute, (pool, attr, value));
    CU_PROLOGUE(cuMemPoolSetAttribute, (pool, attr, value));
    CUresult r = REAL(cuMemPoolSetAttribute)(pool, attr, value);
    vgpu_pool_settle_all();
    return r;
}

CUresult hook_cuMemPoolDestroy(CUmemoryPool pool)
{
    ENTER(cuMemPoolDestroy, (pool));
    CU_PROLOGUE(cuMemPoolDestroy, (pool));
    CUresult r = REAL(cuMemPoolDestroy)(pool);
    if (r == CUDA_SUCCESS)
        vgpu_pool_forget(pool);
    return r;
}

/* ---- synchronisations: the driver may have given a pool's reserve back, and
 * the job's work in flight may have completed (flight.c) ---- */

/* A synchronisation's hook: the real call, then the pools and the work in
 * flight settled. */
#define SETTLING_HOOK(sym, params, args)    \
    CUresult hook_##sym params              \
    {                                       \
        ENTER(sym, args);                   \
        CU_PROLOGUE(sym, args);             \
        CUresult r = REAL(sym) args;        \
        vgpu_pool_settle_all();             \
        vgpu_flight_settle();               \
        return r;                           \
    }

SETTLING_HOOK(cuCtxSynchronize, (void), ())
SETTLING_HOOK(cuStreamSynchronize, (CUstream h), (h))
SETTLING_HOOK(cuStreamSynchronize_ptsz, (CUstream h), (h))
SETTLING_HOOK(cuEventSynchronize, (CUevent e), (e))
