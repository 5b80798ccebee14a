/*
 * context.c - contexts: primary (retain/release/state/reset) and created
 * ones (create/destroy), the per-thread context stack, and what a context
 * costs in device memory, and what runtimes store per context (their
 * context-local storage, reached through the export tables of darkapi.c).
 */
#include <stdlib.h>
#include <string.h>

#include "alloctab.h"
#include "context.h"
#include "exec.h"
#include "gate.h"
#include "init.h"
#include "vgpu/size.h"

#define STACK_MAX 64

static __thread CUcontext t_stack[STACK_MAX];
static __thread int t_depth;
static struct CUctx_st *g_primary[VGPU_SIM_MAX_DEVICES];
static unsigned long long g_next_id = 1;

/* ---- context-local storage ----
 *
 * A runtime keeps its per-context state here (CONTEXT_LOCAL_STORAGE in
 * darkapi.c): a value per (context, key), with a destructor the driver runs
 * when the context dies (its last primary release, a reset, cuCtxDestroy).
 * The destructors call back into the driver, so they run with no lock held.
 */

struct cls_entry {
    CUcontext ctx;
    void *key;
    void *value;
    cu_cls_dtor dtor;
    struct cls_entry *next;
};

static struct cls_entry *g_cls;
static pthread_mutex_t g_cls_lock = PTHREAD_MUTEX_INITIALIZER;

static struct cls_entry **cls_find(CUcontext ctx, void *key)
{
    struct cls_entry **e = &g_cls;
    while (*e && !((*e)->ctx == ctx && (*e)->key == key))
        e = &(*e)->next;
    return e;
}

CUresult cu_cls_put(CUcontext ctx, void *key, void *value, cu_cls_dtor dtor)
{
    pthread_mutex_lock(&g_cls_lock);
    struct cls_entry **e = cls_find(ctx, key);
    if (!*e) {
        *e = calloc(1, sizeof **e);
        if (!*e) {
            pthread_mutex_unlock(&g_cls_lock);
            return CUDA_ERROR_OUT_OF_MEMORY;
        }
        (*e)->ctx = ctx;
        (*e)->key = key;
    }
    (*e)->value = value;
    (*e)->dtor = dtor;
    pthread_mutex_unlock(&g_cls_lock);
    return CUDA_SUCCESS;
}

CUresult cu_cls_get(CUcontext ctx, void *key, void **value)
{
    pthread_mutex_lock(&g_cls_lock);
    struct cls_entry *e = *cls_find(ctx, key);
    if (e)
        *value = e->value;
    pthread_mutex_unlock(&g_cls_lock);
    return e ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
}

CUresult cu_cls_delete(CUcontext ctx, void *key)
{
    pthread_mutex_lock(&g_cls_lock);
    struct cls_entry **e = cls_find(ctx, key);
    struct cls_entry *gone = *e;
    if (gone)
        *e = gone->next;
    pthread_mutex_unlock(&g_cls_lock);
    free(gone);
    return gone ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
}

/* The context is dying: take its entries out, then run their destructors
 * (with no lock held: they call the driver, on this very context). */
static void cls_context_dies(CUcontext ctx)
{
    pthread_mutex_lock(&g_cls_lock);
    struct cls_entry *dying = NULL, **e = &g_cls;
    while (*e) {
        if ((*e)->ctx == ctx) {
            struct cls_entry *d = *e;
            *e = d->next;
            d->next = dying;
            dying = d;
        } else {
            e = &(*e)->next;
        }
    }
    pthread_mutex_unlock(&g_cls_lock);
    while (dying) {
        struct cls_entry *d = dying;
        dying = d->next;
        if (d->dtor)
            d->dtor(ctx, d->key, d->value);
        free(d);
    }
}

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
    gate_hold();
    CUcontext c = t_depth > 0 ? t_stack[t_depth - 1] : NULL;
    if (!c)
        return CUDA_ERROR_INVALID_CONTEXT;
    if (!cu_ctx_valid(c))
        return cu_obj_is(c, MAGIC_CTX) && !c->reset ? CUDA_ERROR_INVALID_CONTEXT
                                                    : CUDA_ERROR_CONTEXT_IS_DESTROYED;
    *ctx = c;
    return CUDA_SUCCESS;
}

/* Bring a context to life on its device: it costs device memory. */
static CUresult ctx_activate(struct CUctx_st *c)
{
    GATE_BRACKET;
    c->mem = cu_ctx_mem_cost();
    if (c->mem && sim_charge(cu_phys[c->ordinal], c->mem, 0) < 0)
        return CUDA_ERROR_OUT_OF_MEMORY;
    sim_context_count(cu_phys[c->ordinal], 1);
    c->reset = 0;
    return CUDA_SUCCESS;
}

static void ctx_deactivate(struct CUctx_st *c)
{
    GATE_BRACKET;
    exec_sync_ctx(c);
    mem_free_ctx(c);
    if (c->mem)
        sim_uncharge(cu_phys[c->ordinal], c->mem);
    sim_context_count(cu_phys[c->ordinal], -1);
}

static void stack_remove(CUcontext c)
{
    int j = 0;
    for (int i = 0; i < t_depth; i++)
        if (t_stack[i] != c)
            t_stack[j++] = t_stack[i];
    t_depth = j;
}

/* The device's primary context object, created inactive if need be. Needs
 * cu_lock. */
static struct CUctx_st *primary_of(CUdevice dev)
{
    struct CUctx_st *c = g_primary[dev];
    if (!c) {
        c = cu_obj_new(sizeof *c, MAGIC_CTX);
        if (!c)
            return NULL;
        c->ordinal = dev;
                c->primary = 1;
        c->id = g_next_id++;
        g_primary[dev] = c;
    }
    return c;
}

/* The arguments of a primary context call: a device and somewhere to put it. */
static CUresult primary_args(CUcontext *pctx, CUdevice dev)
{
    CUresult rc = cu_check_device(dev);
    return rc ? rc : (pctx ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE);
}

CUresult cu_primary_handle(CUcontext *pctx, CUdevice dev)
{
    CUresult rc = primary_args(pctx, dev);
    if (rc)
        return rc;
    pthread_mutex_lock(&cu_lock);
    *pctx = primary_of(dev);
    pthread_mutex_unlock(&cu_lock);
    return *pctx ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
}

VGPU_EXPORT CUresult cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev)
{
    CUresult rc = primary_args(pctx, dev);
    if (rc)
        return rc;
    pthread_mutex_lock(&cu_lock);
    struct CUctx_st *c = primary_of(dev);
    if (!c) {
        pthread_mutex_unlock(&cu_lock);
        return CUDA_ERROR_OUT_OF_MEMORY;
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
    CHECK_DEVICE(dev);
    CUresult rc = CUDA_SUCCESS;
    pthread_mutex_lock(&cu_lock);
    struct CUctx_st *c = g_primary[dev];
    int last = c && c->refcount == 1;
    pthread_mutex_unlock(&cu_lock);
    if (last)
        cls_context_dies(c);
    pthread_mutex_lock(&cu_lock);
    if (c && c->refcount == 0 && c->reset_owed > 0) {
        c->reset_owed--;    /* a retain from before a reset: already destroyed */
    } else if (!c || c->refcount == 0) {
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
    CHECK_DEVICE(dev);
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
    CHECK_DEVICE(dev);
    if (flags & ~0x1fu)
        return CUDA_ERROR_INVALID_VALUE;
    CUcontext c;
    CUresult rc = cuDevicePrimaryCtxRetain(&c, dev);
    if (rc)
        return rc;
    c->flags = flags;
    return cuDevicePrimaryCtxRelease_v2(dev);
}
VGPU_ALIAS(cuDevicePrimaryCtxSetFlags_v2, cuDevicePrimaryCtxSetFlags)

/* A reset destroys the primary context as its last release would: its
 * allocations and its own memory go, cuDevicePrimaryCtxGetState says
 * inactive, and calls in it fail with CUDA_ERROR_CONTEXT_IS_DESTROYED until
 * it is retained again (the handle stays the same). It does not release:
 * the retains made before it may still be released, harmlessly. */
VGPU_EXPORT CUresult cuDevicePrimaryCtxReset_v2(CUdevice dev)
{
    CHECK_DEVICE(dev);
    pthread_mutex_lock(&cu_lock);
    struct CUctx_st *c = g_primary[dev];
    int active = c && c->refcount > 0;
    pthread_mutex_unlock(&cu_lock);
    if (!active)
        return CUDA_SUCCESS;
    cls_context_dies(c);
    pthread_mutex_lock(&cu_lock);
    if (c->refcount > 0) {
        c->reset_owed += c->refcount;
        c->refcount = 0;
        c->reset = 1;
        ctx_deactivate(c);
    }
    pthread_mutex_unlock(&cu_lock);
    return CUDA_SUCCESS;
}
VGPU_ALIAS(cuDevicePrimaryCtxReset_v2, cuDevicePrimaryCtxReset)

static CUresult ctx_create(CUcontext *pctx, unsigned int flags, CUdevice dev)
{
    CHECK_DEVICE(dev);
    if (!pctx)
        return CUDA_ERROR_INVALID_VALUE;
    if (t_depth >= STACK_MAX)
        return CUDA_ERROR_INVALID_VALUE;
    struct CUctx_st *c = cu_obj_new(sizeof *c, MAGIC_CTX);
    if (!c)
        return CUDA_ERROR_OUT_OF_MEMORY;
    c->ordinal = dev;
        c->flags = flags;
    c->refcount = 1;
    pthread_mutex_lock(&cu_lock);
    c->id = g_next_id++;
    pthread_mutex_unlock(&cu_lock);
    CUresult rc = ctx_activate(c);
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
    cls_context_dies(ctx);
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

VGPU_ALIAS(cuCtxPushCurrent_v2, cuCtxPushCurrent)

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

VGPU_ALIAS(cuCtxPopCurrent_v2, cuCtxPopCurrent)

VGPU_EXPORT CUresult cuCtxSetCurrent(CUcontext ctx)
{
    if (!cu_initialized)
        return CUDA_ERROR_NOT_INITIALIZED;
    if (!ctx) {
        if (t_depth > 0)
            t_depth--;
        return CUDA_SUCCESS;
    }
    /* A primary context may be made current before it is retained (the
     * runtime does so with the handle CUDART_INTERFACE gives it): calls that
     * need it fail until it is active. */
    if (!cu_ctx_valid(ctx) && !(cu_obj_is(ctx, MAGIC_CTX) && ctx->primary))
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
    ANSWER(pctx, t_depth > 0 ? t_stack[t_depth - 1] : NULL);
}

/* A getter of the current context c: refuse a NULL out-pointer, store `value`. */
#define CURRENT_CTX_GETTER(name, type, value)                                  \
    VGPU_EXPORT CUresult name(type *out)                                       \
    {                                                                          \
        CURRENT_CONTEXT(c);                                                    \
        ANSWER(out, value);                                                    \
    }

CURRENT_CTX_GETTER(cuCtxGetDevice, CUdevice, c->ordinal)
CURRENT_CTX_GETTER(cuCtxGetFlags, unsigned int, c->flags)

VGPU_EXPORT CUresult cuCtxSetFlags(unsigned int flags)
{
    CURRENT_CONTEXT(c);
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
    ANSWER(id, ctx->id);
}

VGPU_EXPORT CUresult cuCtxGetApiVersion(CUcontext ctx, unsigned int *version)
{
    CUresult rc = ctx_arg(&ctx);
    if (rc)
        return rc;
    ANSWER(version, 3020);
}

VGPU_EXPORT CUresult cuCtxSynchronize(void)
{
    CURRENT_CONTEXT(c);
    /* a context in which a stream captures can't be synchronised: that
     * invalidates its captures */
    if (__atomic_load_n(&cu_captures, __ATOMIC_ACQUIRE)) {
        int capturing = 0;
        pthread_mutex_lock(&cu_capture_lock);
        for (struct capture *k = cu_captures; k; k = k->next) {
            if (k->ctx == c) {
                k->invalidated = 1;
                capturing = 1;
            }
        }
        pthread_mutex_unlock(&cu_capture_lock);
        if (capturing)
            return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    }
    exec_sync_ctx(c);
    if (cu_on_sync)
        cu_on_sync();
    return CUDA_SUCCESS;
}

/* CUlimit values: stack size, printf FIFO, malloc heap, sync depth, pending
 * launches, max L2 fetch granularity, persisting L2 size. */
static size_t g_limits[8] = {1024, 1 << 20, 8 << 20, 2, 2048, 32, 0, 0};

VGPU_EXPORT CUresult cuCtxSetLimit(int limit, size_t value)
{
    CURRENT_CONTEXT(c);
    if (limit < 0 || limit >= 8)
        return CUDA_ERROR_INVALID_VALUE;
    g_limits[limit] = value;
    return CUDA_SUCCESS;
}

VGPU_EXPORT CUresult cuCtxGetLimit(size_t *value, int limit)
{
    CURRENT_CONTEXT(c);
    if (!value || limit < 0 || limit >= 8)
        return CUDA_ERROR_INVALID_VALUE;
    *value = g_limits[limit];
    return CUDA_SUCCESS;
}

/* CU_FUNC_CACHE_PREFER_NONE */
CURRENT_CTX_GETTER(cuCtxGetCacheConfig, int, 0)

VGPU_EXPORT CUresult cuCtxSetCacheConfig(int config)
{
    CURRENT_CONTEXT(c);
    return (config < 0 || config > 3) ? CUDA_ERROR_INVALID_VALUE : CUDA_SUCCESS;
}

VGPU_EXPORT CUresult cuCtxGetStreamPriorityRange(int *least, int *greatest)
{
    CURRENT_CONTEXT(c);
    if (least)
        *least = 0;
    if (greatest)
        *greatest = -5;
    return CUDA_SUCCESS;
}

/* ---- peer access ----
 * Every simulated GPU can reach every other unless VGPU_SIM_PEER=0
 * (cuDeviceCanAccessPeer says which): enabling access from the current
 * context to peer's device is remembered per pair, as the driver refuses
 * enabling it twice. */

static unsigned char g_peer[VGPU_SIM_MAX_DEVICES][VGPU_SIM_MAX_DEVICES];

static CUresult peer_pair(CUcontext peer, CUcontext *cur)
{
    CUresult rc = cu_current(cur);
    if (rc)
        return rc;
    if (!cu_ctx_valid(peer))
        return CUDA_ERROR_INVALID_CONTEXT;
    if (peer->ordinal == (*cur)->ordinal)
        return CUDA_ERROR_INVALID_DEVICE;
    return CUDA_SUCCESS;
}

VGPU_EXPORT CUresult cuCtxEnablePeerAccess(CUcontext peer, unsigned int flags)
{
    CUcontext cur;
    CUresult rc = peer_pair(peer, &cur);
    if (rc)
        return rc;
    if (flags)
        return CUDA_ERROR_INVALID_VALUE;
    if (!cu_peer)
        return CUDA_ERROR_PEER_ACCESS_UNSUPPORTED;
    unsigned char *on = &g_peer[cur->ordinal][peer->ordinal];
    if (__atomic_exchange_n(on, 1, __ATOMIC_RELAXED))
        return CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED;
    return CUDA_SUCCESS;
}

VGPU_EXPORT CUresult cuCtxDisablePeerAccess(CUcontext peer)
{
    CUcontext cur;
    CUresult rc = peer_pair(peer, &cur);
    if (rc)
        return rc;
    unsigned char *on = &g_peer[cur->ordinal][peer->ordinal];
    if (!__atomic_exchange_n(on, 0, __ATOMIC_RELAXED))
        return CUDA_ERROR_PEER_ACCESS_NOT_ENABLED;
    return CUDA_SUCCESS;
}

/* ---- what CUDA 13's runtime also looks up ---- */

/* CUDA 2.0's detach: a context made by cuCtxCreate is destroyed. */
VGPU_EXPORT CUresult cuCtxDetach(CUcontext ctx)
{
    return cuCtxDestroy_v2(ctx);
}

/* Shared memory bank size: Hopper has 4-byte banks and ignores the setting
 * (the driver accepts it). */
VGPU_EXPORT CUresult cuCtxGetSharedMemConfig(int *config)
{
    CURRENT_CONTEXT(c);
    ANSWER(config, 1); /* CU_SHARED_MEM_CONFIG_FOUR_BYTE_BANK_SIZE */
}

VGPU_EXPORT CUresult cuCtxSetSharedMemConfig(int config)
{
    CURRENT_CONTEXT(c);
    return (config < 0 || config > 2) ? CUDA_ERROR_INVALID_VALUE : CUDA_SUCCESS;
}

/* No L2 lines are persisting here: nothing to reset. */
VGPU_EXPORT CUresult cuCtxResetPersistingL2Cache(void)
{
    CUcontext c;
    return cu_current(&c);
}

/* No profiler is attached: starting and stopping it does nothing, as on the
 * driver. */
VGPU_EXPORT CUresult cuProfilerInitialize(const char *config, const char *out, int mode)
{
    (void)config, (void)out, (void)mode;
    return cu_initialized ? CUDA_SUCCESS : CUDA_ERROR_NOT_INITIALIZED;
}

VGPU_EXPORT CUresult cuProfilerStart(void)
{
    CUcontext c;
    return cu_current(&c);
}

VGPU_EXPORT CUresult cuProfilerStop(void)
{
    CUcontext c;
    return cu_current(&c);
}
