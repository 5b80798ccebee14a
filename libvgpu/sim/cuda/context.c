/*
 * context.c - contexts: primary (retain/release/state/reset) and created
 * ones (create/destroy), the per-thread context stack, and what a context
 * costs in device memory.
 */
#include <stdlib.h>
#include <string.h>

#include "alloctab.h"
#include "context.h"
#include "exec.h"
#include "init.h"
#include "vgpu/size.h"

#define STACK_MAX 64

static __thread CUcontext t_stack[STACK_MAX];
static __thread int t_depth;
static struct CUctx_st *g_primary[VGPU_SIM_MAX_DEVICES];
static unsigned long long g_next_id = 1;

/* ---- contexts ---- */

uint64_t cu_ctx_mem_cost(void)
{
    const char *s = getenv("VGPU_SIM_CTX_MEM");
    uint64_t v;
    if (s && strcmp(s, "0") == 0)
        return 0;
    if (s && *s && vgpu_parse_size(s, &v) == 0)
        return v;
    return SIM_DEFAULT_CTX_MEM;
}

int cu_ctx_valid(CUcontext ctx)
{
    return cu_obj_is(ctx, MAGIC_CTX) && ctx->refcount > 0;
}

CUresult cu_current(CUcontext *ctx)
{
    if (!cu_initialized)
        return CUDA_ERROR_NOT_INITIALIZED;
    CUcontext c = t_depth > 0 ? t_stack[t_depth - 1] : NULL;
    if (!c)
        return CUDA_ERROR_INVALID_CONTEXT;
    if (!cu_ctx_valid(c))
        return cu_obj_is(c, MAGIC_CTX) ? CUDA_ERROR_INVALID_CONTEXT
                                       : CUDA_ERROR_CONTEXT_IS_DESTROYED;
    *ctx = c;
    return CUDA_SUCCESS;
}

/* Bring a context to life on its device: it costs device memory. */
static CUresult ctx_activate(struct CUctx_st *c)
{
    c->mem = cu_ctx_mem_cost();
    if (c->mem && sim_charge(c->phys, c->mem, 0) < 0)
        return CUDA_ERROR_OUT_OF_MEMORY;
    sim_context_count(c->phys, 1);
    return CUDA_SUCCESS;
}

static void ctx_deactivate(struct CUctx_st *c)
{
    exec_sync_ctx(c);
    mem_free_ctx(c);
    if (c->mem)
        sim_uncharge(c->phys, c->mem);
    sim_context_count(c->phys, -1);
}

static void stack_remove(CUcontext c)
{
    int j = 0;
    for (int i = 0; i < t_depth; i++)
        if (t_stack[i] != c)
            t_stack[j++] = t_stack[i];
    t_depth = j;
}

VGPU_EXPORT CUresult cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev)
{
    CUresult rc = cu_check_device(dev);
    if (rc)
        return rc;
    if (!pctx)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&cu_lock);
    struct CUctx_st *c = g_primary[dev];
    if (!c) {
        c = cu_obj_new(sizeof *c, MAGIC_CTX);
        c->ordinal = dev;
        c->phys = cu_phys[dev];
        c->primary = 1;
        c->id = g_next_id++;
        g_primary[dev] = c;
    }
    if (c->refcount == 0)
        rc = ctx_activate(c);
    if (rc == CUDA_SUCCESS) {
        c->refcount++;
        *pctx = c;
    }
    pthread_mutex_unlock(&cu_lock);
    return rc;
}

VGPU_EXPORT CUresult cuDevicePrimaryCtxRelease_v2(CUdevice dev)
{
    CUresult rc = cu_check_device(dev);
    if (rc)
        return rc;
    pthread_mutex_lock(&cu_lock);
    struct CUctx_st *c = g_primary[dev];
    if (!c || c->refcount == 0) {
        rc = CUDA_ERROR_INVALID_CONTEXT;
    } else if (--c->refcount == 0) {
        ctx_deactivate(c);
        stack_remove(c);
    }
    pthread_mutex_unlock(&cu_lock);
    return rc;
}
VGPU_ALIAS(cuDevicePrimaryCtxRelease_v2, cuDevicePrimaryCtxRelease)

VGPU_EXPORT CUresult cuDevicePrimaryCtxGetState(CUdevice dev, unsigned int *flags, int *active)
{
    CUresult rc = cu_check_device(dev);
    if (rc)
        return rc;
    if (!flags || !active)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&cu_lock);
    struct CUctx_st *c = g_primary[dev];
    *flags = c ? c->flags : 0;
    *active = c && c->refcount > 0;
    pthread_mutex_unlock(&cu_lock);
    return CUDA_SUCCESS;
}

VGPU_EXPORT CUresult cuDevicePrimaryCtxSetFlags_v2(CUdevice dev, unsigned int flags)
{
    CUresult rc = cu_check_device(dev);
    if (rc)
        return rc;
    if (flags & ~0x1fu)
        return CUDA_ERROR_INVALID_VALUE;
    CUcontext c;
    rc = cuDevicePrimaryCtxRetain(&c, dev);
    if (rc)
        return rc;
    c->flags = flags;
    return cuDevicePrimaryCtxRelease_v2(dev);
}
VGPU_ALIAS(cuDevicePrimaryCtxSetFlags_v2, cuDevicePrimaryCtxSetFlags)

VGPU_EXPORT CUresult cuDevicePrimaryCtxReset_v2(CUdevice dev)
{
    CUresult rc = cu_check_device(dev);
    if (rc)
        return rc;
    pthread_mutex_lock(&cu_lock);
    struct CUctx_st *c = g_primary[dev];
    if (c && c->refcount > 0) {
        exec_sync_ctx(c);
        mem_free_ctx(c);
    }
    pthread_mutex_unlock(&cu_lock);
    return CUDA_SUCCESS;
}
VGPU_ALIAS(cuDevicePrimaryCtxReset_v2, cuDevicePrimaryCtxReset)

static CUresult ctx_create(CUcontext *pctx, unsigned int flags, CUdevice dev)
{
    CUresult rc = cu_check_device(dev);
    if (rc)
        return rc;
    if (!pctx)
        return CUDA_ERROR_INVALID_VALUE;
    if (t_depth >= STACK_MAX)
        return CUDA_ERROR_INVALID_VALUE;
    struct CUctx_st *c = cu_obj_new(sizeof *c, MAGIC_CTX);
    if (!c)
        return CUDA_ERROR_OUT_OF_MEMORY;
    c->ordinal = dev;
    c->phys = cu_phys[dev];
    c->flags = flags;
    c->refcount = 1;
    pthread_mutex_lock(&cu_lock);
    c->id = g_next_id++;
    pthread_mutex_unlock(&cu_lock);
    rc = ctx_activate(c);
    if (rc) {
        cu_obj_del(c, sizeof *c);
        return rc;
    }
    t_stack[t_depth++] = c;
    *pctx = c;
    return CUDA_SUCCESS;
}

VGPU_EXPORT CUresult cuCtxCreate_v2(CUcontext *pctx, unsigned int flags, CUdevice dev)
{
    return ctx_create(pctx, flags, dev);
}

VGPU_EXPORT CUresult cuCtxCreate_v3(CUcontext *pctx, void *params, int nparams,
                                    unsigned int flags, CUdevice dev)
{
    (void)params;
    if (nparams < 0)
        return CUDA_ERROR_INVALID_VALUE;
    return ctx_create(pctx, flags, dev);
}

VGPU_EXPORT CUresult cuCtxCreate_v4(CUcontext *pctx, void *create_params, unsigned int flags,
                                    CUdevice dev)
{
    (void)create_params;
    return ctx_create(pctx, flags, dev);
}

VGPU_EXPORT CUresult cuCtxDestroy_v2(CUcontext ctx)
{
    if (!cu_initialized)
        return CUDA_ERROR_NOT_INITIALIZED;
    if (!cu_ctx_valid(ctx) || ctx->primary)
        return CUDA_ERROR_INVALID_CONTEXT;
    pthread_mutex_lock(&cu_lock);
    ctx->refcount = 0;
    pthread_mutex_unlock(&cu_lock);
    ctx_deactivate(ctx);
    stack_remove(ctx);
    cu_obj_del(ctx, sizeof *ctx);
    return CUDA_SUCCESS;
}

VGPU_EXPORT CUresult cuCtxPushCurrent_v2(CUcontext ctx)
{
    if (!cu_initialized)
        return CUDA_ERROR_NOT_INITIALIZED;
    if (!cu_ctx_valid(ctx))
        return CUDA_ERROR_INVALID_CONTEXT;
    if (t_depth >= STACK_MAX)
        return CUDA_ERROR_INVALID_VALUE;
    t_stack[t_depth++] = ctx;
    return CUDA_SUCCESS;
}

VGPU_EXPORT CUresult cuCtxPopCurrent_v2(CUcontext *pctx)
{
    if (!cu_initialized)
        return CUDA_ERROR_NOT_INITIALIZED;
    if (t_depth == 0)
        return CUDA_ERROR_INVALID_CONTEXT;
    CUcontext c = t_stack[--t_depth];
    if (pctx)
        *pctx = c;
    return CUDA_SUCCESS;
}

VGPU_EXPORT CUresult cuCtxSetCurrent(CUcontext ctx)
{
    if (!cu_initialized)
        return CUDA_ERROR_NOT_INITIALIZED;
    if (!ctx) {
        if (t_depth > 0)
            t_depth--;
        return CUDA_SUCCESS;
    }
    if (!cu_ctx_valid(ctx))
        return CUDA_ERROR_INVALID_CONTEXT;
    if (t_depth == 0)
        t_depth = 1;
    t_stack[t_depth - 1] = ctx;
    return CUDA_SUCCESS;
}

VGPU_EXPORT CUresult cuCtxGetCurrent(CUcontext *pctx)
{
    if (!cu_initialized)
        return CUDA_ERROR_NOT_INITIALIZED;
    if (!pctx)
        return CUDA_ERROR_INVALID_VALUE;
    *pctx = t_depth > 0 ? t_stack[t_depth - 1] : NULL;
    return CUDA_SUCCESS;
}

/* A getter of the current context c: refuse a NULL out-pointer, store `value`. */
#define CURRENT_CTX_GETTER(name, type, value)                                  \
    VGPU_EXPORT CUresult name(type *out)                                       \
    {                                                                          \
        CUcontext c;                                                           \
        CUresult rc = cu_current(&c);                                          \
        if (rc)                                                                \
            return rc;                                                         \
        if (!out)                                                              \
            return CUDA_ERROR_INVALID_VALUE;                                   \
        *out = (value);                                                        \
        return CUDA_SUCCESS;                                                   \
    }

CURRENT_CTX_GETTER(cuCtxGetDevice, CUdevice, c->ordinal)
CURRENT_CTX_GETTER(cuCtxGetFlags, unsigned int, c->flags)

VGPU_EXPORT CUresult cuCtxSetFlags(unsigned int flags)
{
    CUcontext c;
    CUresult rc = cu_current(&c);
    if (rc)
        return rc;
    c->flags = flags;
    return CUDA_SUCCESS;
}

/* A context argument: NULL stands for the current context; any other must
 * be a live one. */
static CUresult ctx_arg(CUcontext *ctx)
{
    if (!*ctx) {
        CUresult rc = cu_current(ctx);
        if (rc)
            return rc;
    }
    return cu_ctx_valid(*ctx) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_CONTEXT;
}

VGPU_EXPORT CUresult cuCtxGetId(CUcontext ctx, unsigned long long *id)
{
    CUresult rc = ctx_arg(&ctx);
    if (rc)
        return rc;
    if (!id)
        return CUDA_ERROR_INVALID_VALUE;
    *id = ctx->id;
    return CUDA_SUCCESS;
}

VGPU_EXPORT CUresult cuCtxGetApiVersion(CUcontext ctx, unsigned int *version)
{
    CUresult rc = ctx_arg(&ctx);
    if (rc)
        return rc;
    if (!version)
        return CUDA_ERROR_INVALID_VALUE;
    *version = 3020;
    return CUDA_SUCCESS;
}

VGPU_EXPORT CUresult cuCtxSynchronize(void)
{
    CUcontext c;
    CUresult rc = cu_current(&c);
    if (rc)
        return rc;
    exec_sync_ctx(c);
    return CUDA_SUCCESS;
}

/* CUlimit values: stack size, printf FIFO, malloc heap, sync depth, pending
 * launches, max L2 fetch granularity, persisting L2 size. */
static size_t g_limits[8] = {1024, 1 << 20, 8 << 20, 2, 2048, 32, 0, 0};

VGPU_EXPORT CUresult cuCtxSetLimit(int limit, size_t value)
{
    CUcontext c;
    CUresult rc = cu_current(&c);
    if (rc)
        return rc;
    if (limit < 0 || limit >= 8)
        return CUDA_ERROR_INVALID_VALUE;
    g_limits[limit] = value;
    return CUDA_SUCCESS;
}

VGPU_EXPORT CUresult cuCtxGetLimit(size_t *value, int limit)
{
    CUcontext c;
    CUresult rc = cu_current(&c);
    if (rc)
        return rc;
    if (!value || limit < 0 || limit >= 8)
        return CUDA_ERROR_INVALID_VALUE;
    *value = g_limits[limit];
    return CUDA_SUCCESS;
}

/* CU_FUNC_CACHE_PREFER_NONE */
CURRENT_CTX_GETTER(cuCtxGetCacheConfig, int, 0)

VGPU_EXPORT CUresult cuCtxSetCacheConfig(int config)
{
    CUcontext c;
    CUresult rc = cu_current(&c);
    if (rc)
        return rc;
    return (config < 0 || config > 3) ? CUDA_ERROR_INVALID_VALUE : CUDA_SUCCESS;
}

VGPU_EXPORT CUresult cuCtxGetStreamPriorityRange(int *least, int *greatest)
{
    CUcontext c;
    CUresult rc = cu_current(&c);
    if (rc)
        return rc;
    if (least)
        *least = 0;
    if (greatest)
        *greatest = -5;
    return CUDA_SUCCESS;
}
