/*
 * pool.c - stream-ordered pools (cuMemAllocAsync and friends): the device's
 * default and current pools, pools of its own a program creates, and their
 * allocations, taken from the allocation table (ALLOC_POOL).
 */
#include <pthread.h>
#include <stdlib.h>

#include "alloctab.h"
#include "gate.h"
#include "init.h"
#include "pool.h"
#include "stream.h"
#include "vgpu/size.h"

/* A pool holds device memory (its reserve, charged to the device) of which
 * its live allocations use part (`used`: their sizes, each rounded up to
 * POOL_ALIGN). An allocation is carved out of the spare reserve; when that is
 * short, the reserve grows by whole chunks (VGPU_SIM_POOL_CHUNK, 2 MiB by
 * default: the driver's chunk size is not documented, and it reserves "much
 * more than requested" for a small first allocation, as CuPy's tests put
 * it), so many small allocations share one chunk. A free returns its bytes to
 * the reserve; the reserve beyond the live allocations and the release
 * threshold (default 0) is given back to the device at the next explicit
 * synchronisation (cuCtxSynchronize, cuStreamSynchronize,
 * cuEventSynchronize), as the driver documents, or by cuMemPoolTrimTo. */
#define POOL_ALIGN 512u

struct CUmemPoolHandle_st {
    uint32_t magic;
    int ordinal;
    CUmemPoolProps props;
    int reuse[3];
    uint64_t threshold;
    uint64_t used, used_high;
    uint64_t reserved, reserved_high;
    struct CUmemPoolHandle_st *next; /* every pool of the process */
};

static struct CUmemPoolHandle_st *g_pools;
static pthread_mutex_t g_pool_lock = PTHREAD_MUTEX_INITIALIZER; /* the pools and their list */

static uint64_t pool_chunk(void)
{
    static uint64_t chunk;
    if (!chunk) {
        uint64_t c = 0;
        const char *s = getenv("VGPU_SIM_POOL_CHUNK");
        if (!s || vgpu_parse_size(s, &c) != 0 || c == 0)
            c = SIM_GRANULARITY;
        chunk = mem_round(c);
    }
    return chunk;
}

static uint64_t pool_bytes(size_t size)
{
    return ((uint64_t)size + POOL_ALIGN - 1) / POOL_ALIGN * POOL_ALIGN;
}

/* Give reserve back to the device down to max(used, keep), in whole
 * chunks. Needs g_pool_lock. */
static void pool_release(struct CUmemPoolHandle_st *p, uint64_t keep)
{
    uint64_t floor = p->used > keep ? p->used : keep;
    uint64_t chunk = pool_chunk();
    if (floor <= UINT64_MAX - chunk)
        floor = (floor + chunk - 1) / chunk * chunk;
    if (p->reserved > floor) {
        sim_uncharge(cu_phys[p->ordinal], p->reserved - floor);
        p->reserved = floor;
    }
}

static uint64_t sat_add(uint64_t a, uint64_t b)
{
    return a > UINT64_MAX - b ? UINT64_MAX : a + b;
}

/* An explicit synchronisation: every pool gives back its spare reserve
 * beyond its release threshold. */
static void pools_on_sync(void)
{
    pthread_mutex_lock(&g_pool_lock);
    for (struct CUmemPoolHandle_st *p = g_pools; p; p = p->next)
        if (cu_obj_is(p, MAGIC_POOL))
            pool_release(p, sat_add(p->used, p->threshold));
    pthread_mutex_unlock(&g_pool_lock);
}

void cu_pool_free(const struct alloc *a)
{
    GATE_BRACKET;
    struct CUmemPoolHandle_st *pool = a->pool;
    mem_release(a); /* unmaps: the pool's reserve holds the charge */
    if (!cu_obj_is(pool, MAGIC_POOL))
        return;
    pthread_mutex_lock(&g_pool_lock);
    uint64_t n = pool_bytes(a->size);
    pool->used = pool->used > n ? pool->used - n : 0;
    pthread_mutex_unlock(&g_pool_lock);
}

static struct CUmemPoolHandle_st *g_default_pool[VGPU_SIM_MAX_DEVICES];
static struct CUmemPoolHandle_st *g_current_pool[VGPU_SIM_MAX_DEVICES];

static struct CUmemPoolHandle_st *pool_new(int ordinal)
{
    struct CUmemPoolHandle_st *p = cu_obj_new(sizeof *p, MAGIC_POOL);
    p->ordinal = ordinal;
    p->next = g_pools; /* callers hold g_pool_lock or are alone */
    g_pools = p;
    cu_on_sync = pools_on_sync;
    p->props.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
    p->props.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    p->props.location.id = ordinal;
    p->reuse[0] = p->reuse[1] = p->reuse[2] = 1;
    return p;
}

static struct CUmemPoolHandle_st *default_pool(int ordinal)
{
    pthread_mutex_lock(&g_pool_lock);
    if (!g_default_pool[ordinal])
        g_default_pool[ordinal] = pool_new(ordinal);
    struct CUmemPoolHandle_st *p = g_current_pool[ordinal] ? g_current_pool[ordinal]
                                                           : g_default_pool[ordinal];
    pthread_mutex_unlock(&g_pool_lock);
    return p;
}

VGPU_EXPORT CUresult cuDeviceGetDefaultMemPool(CUmemoryPool *pool, CUdevice dev)
{
    CHECK_DEVICE(dev);
    if (!pool)
        return CUDA_ERROR_INVALID_VALUE;
    default_pool(dev);
    *pool = g_default_pool[dev];
    return CUDA_SUCCESS;
}

VGPU_EXPORT CUresult cuDeviceGetMemPool(CUmemoryPool *pool, CUdevice dev)
{
    CHECK_DEVICE(dev);
    ANSWER(pool, default_pool(dev));
}

VGPU_EXPORT CUresult cuDeviceSetMemPool(CUdevice dev, CUmemoryPool pool)
{
    CHECK_DEVICE(dev);
    if (!cu_obj_is(pool, MAGIC_POOL) || pool->ordinal != dev)
        return CUDA_ERROR_INVALID_VALUE;
    g_current_pool[dev] = pool;
    return CUDA_SUCCESS;
}

VGPU_EXPORT CUresult cuMemPoolCreate(CUmemoryPool *pool, const CUmemPoolProps *props)
{
    if (!cu_initialized)
        return CUDA_ERROR_NOT_INITIALIZED;
    if (!pool || !props || props->allocType != CU_MEM_ALLOCATION_TYPE_PINNED ||
        props->location.type != CU_MEM_LOCATION_TYPE_DEVICE)
        return CUDA_ERROR_INVALID_VALUE;
    if (props->location.id < 0 || props->location.id >= cu_count)
        return CUDA_ERROR_INVALID_DEVICE;
    pthread_mutex_lock(&g_pool_lock);
    struct CUmemPoolHandle_st *p = pool_new(props->location.id);
    pthread_mutex_unlock(&g_pool_lock);
    p->props = *props;
    *pool = p;
    return CUDA_SUCCESS;
}

VGPU_EXPORT CUresult cuMemPoolDestroy(CUmemoryPool pool)
{
    GATE_BRACKET;
    if (!cu_obj_is(pool, MAGIC_POOL) || pool == g_default_pool[pool->ordinal])
        return CUDA_ERROR_INVALID_VALUE;
    if (g_current_pool[pool->ordinal] == pool)
        g_current_pool[pool->ordinal] = NULL;
    pthread_mutex_lock(&g_pool_lock);
    pool_release(pool, 0);
    if (pool->reserved) /* live allocations keep their memory until freed */
        sim_uncharge(cu_phys[pool->ordinal], pool->reserved);
    for (struct CUmemPoolHandle_st **q = &g_pools; *q; q = &(*q)->next) {
        if (*q == pool) {
            *q = pool->next;
            break;
        }
    }
    pthread_mutex_unlock(&g_pool_lock);
    cu_obj_del(pool, sizeof *pool);
    return CUDA_SUCCESS;
}

VGPU_EXPORT CUresult cuMemPoolSetAttribute(CUmemoryPool pool, CUmemPool_attribute attr, void *value)
{
    GATE_BRACKET;
    if (!cu_obj_is(pool, MAGIC_POOL) || !value)
        return CUDA_ERROR_INVALID_VALUE;
    switch (attr) {
    case CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES:
    case CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC:
    case CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES:
        pool->reuse[attr - 1] = *(int *)value;
        return CUDA_SUCCESS;
    case CU_MEMPOOL_ATTR_RELEASE_THRESHOLD:
        pthread_mutex_lock(&g_pool_lock);
        pool->threshold = *(cuuint64_t *)value;
        pthread_mutex_unlock(&g_pool_lock);
        return CUDA_SUCCESS;
    case CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH:
        if (*(cuuint64_t *)value != 0)
            return CUDA_ERROR_INVALID_VALUE;
        pool->reserved_high = pool->reserved;
        return CUDA_SUCCESS;
    case CU_MEMPOOL_ATTR_USED_MEM_HIGH:
        if (*(cuuint64_t *)value != 0)
            return CUDA_ERROR_INVALID_VALUE;
        pool->used_high = pool->used;
        return CUDA_SUCCESS;
    default:
        return CUDA_ERROR_INVALID_VALUE;
    }
}

VGPU_EXPORT CUresult cuMemPoolGetAttribute(CUmemoryPool pool, CUmemPool_attribute attr, void *value)
{
    if (!cu_obj_is(pool, MAGIC_POOL) || !value)
        return CUDA_ERROR_INVALID_VALUE;
    switch (attr) {
    case CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES:
    case CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC:
    case CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES:
        *(int *)value = pool->reuse[attr - 1];
        return CUDA_SUCCESS;
    case CU_MEMPOOL_ATTR_RELEASE_THRESHOLD:
        *(cuuint64_t *)value = pool->threshold;
        return CUDA_SUCCESS;
    case CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT:
        *(cuuint64_t *)value = pool->reserved;
        return CUDA_SUCCESS;
    case CU_MEMPOOL_ATTR_USED_MEM_CURRENT:
        *(cuuint64_t *)value = pool->used;
        return CUDA_SUCCESS;
    case CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH:
        *(cuuint64_t *)value = pool->reserved_high;
        return CUDA_SUCCESS;
    case CU_MEMPOOL_ATTR_USED_MEM_HIGH:
        *(cuuint64_t *)value = pool->used_high;
        return CUDA_SUCCESS;
    default:
        return CUDA_ERROR_INVALID_VALUE;
    }
}

VGPU_EXPORT CUresult cuMemPoolTrimTo(CUmemoryPool pool, size_t keep)
{
    GATE_BRACKET;
    if (!cu_obj_is(pool, MAGIC_POOL))
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&g_pool_lock);
    pool_release(pool, keep);
    pthread_mutex_unlock(&g_pool_lock);
    return CUDA_SUCCESS;
}

VGPU_EXPORT CUresult cuMemPoolSetAccess(CUmemoryPool pool, const CUmemAccessDesc *desc, size_t n)
{
    (void)desc;
    (void)n;
    return cu_obj_is(pool, MAGIC_POOL) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

VGPU_EXPORT CUresult cuMemPoolGetAccess(CUmemAccess_flags *flags, CUmemoryPool pool,
                                        CUmemLocation *loc)
{
    if (!cu_obj_is(pool, MAGIC_POOL) || !flags || !loc)
        return CUDA_ERROR_INVALID_VALUE;
    *flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    return CUDA_SUCCESS;
}

VGPU_EXPORT CUresult cuMemAllocFromPoolAsync(CUdeviceptr *dptr, size_t size, CUmemoryPool pool,
                                             CUstream h)
{
    GATE_BRACKET;
    RESOLVE_STREAM(h, ctx, s);
    if (!dptr || !cu_obj_is(pool, MAGIC_POOL))
        return CUDA_ERROR_INVALID_VALUE;
    if (size == 0)
        return CUDA_ERROR_INVALID_VALUE;
    /* free reserve first, then grow the reserve by whole chunks */
    uint64_t n = pool_bytes(size), chunk = pool_chunk();
    pthread_mutex_lock(&g_pool_lock);
    uint64_t spare = pool->reserved > pool->used ? pool->reserved - pool->used : 0;
    uint64_t grow = n > spare ? (n - spare + chunk - 1) / chunk * chunk : 0;
    if (grow && sim_charge(cu_phys[pool->ordinal], grow, 1) < 0) {
        pthread_mutex_unlock(&g_pool_lock);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    pool->reserved += grow;
    pool->used += n;
    if (pool->used > pool->used_high)
        pool->used_high = pool->used;
    if (pool->reserved > pool->reserved_high)
        pool->reserved_high = pool->reserved;
    pthread_mutex_unlock(&g_pool_lock);
    uintptr_t p;
    CUresult rc = mem_alloc(ctx, size, ALLOC_POOL, 0, &p);
    if (rc) {
        pthread_mutex_lock(&g_pool_lock);
        pool->used -= n;
        pthread_mutex_unlock(&g_pool_lock);
        return rc;
    }
    mem_set_pool(p, pool);
    *dptr = p;
    return CUDA_SUCCESS;
}
VGPU_ALIAS(cuMemAllocFromPoolAsync, cuMemAllocFromPoolAsync_ptsz)

VGPU_EXPORT CUresult cuMemAllocAsync(CUdeviceptr *dptr, size_t size, CUstream h)
{
    RESOLVE_STREAM(h, ctx, s);
    return cuMemAllocFromPoolAsync(dptr, size, default_pool(ctx->ordinal), h);
}
VGPU_ALIAS(cuMemAllocAsync, cuMemAllocAsync_ptsz)

VGPU_EXPORT CUresult cuMemFreeAsync(CUdeviceptr dptr, CUstream h)
{
    GATE_BRACKET;
    RESOLVE_STREAM(h, ctx, s);
    struct alloc a;
    if (mem_take(dptr, ALLOC_POOL, &a) == 0) {
        cu_pool_free(&a);
        return CUDA_SUCCESS;
    }
    /* cuMemAlloc memory may be freed stream-ordered too */
    if (mem_take(dptr, ALLOC_DEVICE, &a) < 0)
        return CUDA_ERROR_INVALID_VALUE;
    mem_release(&a);
    return CUDA_SUCCESS;
}
VGPU_ALIAS(cuMemFreeAsync, cuMemFreeAsync_ptsz)

/* CUDA 13's pools by location: a device's, as cuDeviceGet(Default)MemPool
 * and cuDeviceSetMemPool answer; pools of host or managed memory are not
 * simulated. */
static CUresult device_location(const CUmemLocation *loc, int type, CUdevice *dev)
{
    if (!cu_initialized)
        return CUDA_ERROR_NOT_INITIALIZED;
    if (!loc)
        return CUDA_ERROR_INVALID_VALUE;
    if (loc->type != CU_MEM_LOCATION_TYPE_DEVICE || type != CU_MEM_ALLOCATION_TYPE_PINNED)
        return CUDA_ERROR_NOT_SUPPORTED;
    if (loc->id < 0 || loc->id >= cu_count)
        return CUDA_ERROR_INVALID_DEVICE;
    *dev = loc->id;
    return CUDA_SUCCESS;
}

VGPU_EXPORT CUresult cuMemGetDefaultMemPool(CUmemoryPool *pool, CUmemLocation *loc, int type)
{
    CUdevice dev;
    CUresult rc = device_location(loc, type, &dev);
    return rc ? rc : cuDeviceGetDefaultMemPool(pool, dev);
}

VGPU_EXPORT CUresult cuMemGetMemPool(CUmemoryPool *pool, CUmemLocation *loc, int type)
{
    CUdevice dev;
    CUresult rc = device_location(loc, type, &dev);
    return rc ? rc : cuDeviceGetMemPool(pool, dev);
}

VGPU_EXPORT CUresult cuMemSetMemPool(CUmemLocation *loc, int type, CUmemoryPool pool)
{
    CUdevice dev;
    CUresult rc = device_location(loc, type, &dev);
    return rc ? rc : cuDeviceSetMemPool(dev, pool);
}
