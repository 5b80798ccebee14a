/*
 * context.c - a context's own device memory. After the process creates a
 * context (cuDevicePrimaryCtxRetain, cuCtxCreate_v2/_v3/_v4) the hook
 * measures it through the real NVML and reserves it, or destroys the context
 * again and refuses with CUDA_ERROR_OUT_OF_MEMORY. Destroying a context gives
 * back its memory and everything allocated in it.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "hook.h"

#define DEFAULT_CTX_BYTES (300ull << 20)   /* docs/hook.md: fallback only */
#define MAX_ORDINALS 64

static pthread_mutex_t ctx_lock = PTHREAD_MUTEX_INITIALIZER;
static struct primary {
    int refs;
    int accounted;
    int dev;
    CUcontext ctx;
    uint64_t bytes;
} primary[MAX_ORDINALS];
static struct made {
    CUcontext ctx;
    int dev;
    uint64_t bytes;
} *made;
static unsigned n_made, cap_made;

/* A context just created on region device d: how much memory it took. The
 * process's own usedGpuMemory from NVML, less what the process already had
 * reserved there; else the daemon's measure; else a default. */
static uint64_t measure_ctx(int d)
{
    if (d < 0)
        return 0;
    uint64_t nv = vgpu_nvml_process_used(vgpu_dev_uuid(d));
    uint64_t mine = vgpu_slot_used(vgpu_g_slot, d);
    if (nv > mine)
        return nv - mine;
    uint64_t over = __atomic_load_n(&vgpu_g_limits->dev[d].ctx_overhead, __ATOMIC_RELAXED);
    if (over != 0)
        return over;
    vgpu_log(VGPU_LOG_INFO, "context memory on %s not measurable through NVML; counting %llu "
             "bytes", vgpu_dev_uuid(d), (unsigned long long)DEFAULT_CTX_BYTES);
    return DEFAULT_CTX_BYTES;
}

/* A context went away: its memory and everything allocated in it. */
static void drop_ctx(CUcontext ctx, int d, uint64_t bytes)
{
    uint64_t per_dev[VGPU_MAX_DEVICES] = {0};
    vgpu_untrack_ctx(ctx, per_dev);
    for (int i = 0; i < VGPU_MAX_DEVICES; i++)
        vgpu_unreserve(i, per_dev[i], 0);
    vgpu_unreserve(d, bytes, 1);
}

static CUresult primary_release_real(CUdevice dev)
{
    return vgpu_real_present(VGPU_H_cuDevicePrimaryCtxRelease_v2)
               ? REAL(cuDevicePrimaryCtxRelease_v2)(dev)
               : REAL(cuDevicePrimaryCtxRelease)(dev);
}

/* Whether the primary context of dev is still active: the driver's word when
 * it has cuDevicePrimaryCtxGetState, else `guess` (from our own count). */
static int primary_active(CUdevice dev, int guess)
{
    unsigned flags;
    int active;
    if (vgpu_real_present(VGPU_H_cuDevicePrimaryCtxGetState) &&
        REAL(cuDevicePrimaryCtxGetState)(dev, &flags, &active) == CUDA_SUCCESS)
        return active;
    return guess;
}

/* The hook of a primary-context call sym(dev): forward it, then let `after`
 * (primary_release or primary_reset) settle the accounting under ctx_lock. */
#define PRIMARY_HOOK(sym, after)                                                \
    CUresult hook_##sym(CUdevice dev)                                           \
    {                                                                           \
        ENTER(sym, (dev));                                                      \
        CU_PROLOGUE(sym, (dev));                                                \
        pthread_mutex_lock(&ctx_lock);                                          \
        CUresult r = after(REAL(sym)(dev), dev);                                \
        pthread_mutex_unlock(&ctx_lock);                                        \
        return r;                                                               \
    }

CUresult hook_cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev)
{
    ENTER(cuDevicePrimaryCtxRetain, (pctx, dev));
    CU_PROLOGUE(cuDevicePrimaryCtxRetain, (pctx, dev));
    pthread_mutex_lock(&ctx_lock);
    CUresult r = REAL(cuDevicePrimaryCtxRetain)(pctx, dev);
    if (r == CUDA_SUCCESS && dev >= 0 && dev < MAX_ORDINALS) {
        struct primary *p = &primary[dev];
        p->refs++;
        if (!p->accounted) {
            int d = vgpu_dev_of_ordinal(dev);
            uint64_t bytes = measure_ctx(d);
            if (!vgpu_reserve(d, bytes, 1, "context creation")) {
                primary_release_real(dev);
                p->refs--;
                r = CUDA_ERROR_OUT_OF_MEMORY;
            } else {
                p->accounted = 1;
                p->dev = d;
                p->ctx = *pctx;
                p->bytes = bytes;
                vgpu_note_ctx_device(d);
            }
        }
    }
    pthread_mutex_unlock(&ctx_lock);
    return r;
}

static CUresult primary_release(CUresult r, CUdevice dev)
{
    if (r != CUDA_SUCCESS || dev < 0 || dev >= MAX_ORDINALS)
        return r;
    struct primary *p = &primary[dev];
    if (p->refs > 0)
        p->refs--;
    if (!primary_active(dev, p->refs > 0) && p->accounted) {
        drop_ctx(p->ctx, p->dev, p->bytes);
        p->accounted = 0;
        p->refs = 0;
    }
    return r;
}

PRIMARY_HOOK(cuDevicePrimaryCtxRelease, primary_release)
PRIMARY_HOOK(cuDevicePrimaryCtxRelease_v2, primary_release)

/* Reset destroys every allocation of the primary context; the context itself
 * is counted for as long as it is retained. */
static CUresult primary_reset(CUresult r, CUdevice dev)
{
    if (r != CUDA_SUCCESS || dev < 0 || dev >= MAX_ORDINALS)
        return r;
    struct primary *p = &primary[dev];
    if (!p->accounted)
        return r;
    int active = primary_active(dev, p->refs > 0);
    drop_ctx(p->ctx, p->dev, active ? 0 : p->bytes);
    if (!active) {
        p->accounted = 0;
        p->refs = 0;
    }
    return r;
}

PRIMARY_HOOK(cuDevicePrimaryCtxReset, primary_reset)
PRIMARY_HOOK(cuDevicePrimaryCtxReset_v2, primary_reset)

/* After cuCtxCreate_*: count the new context, or destroy it and refuse. */
static CUresult ctx_created(CUresult r, CUcontext *pctx, CUdevice dev)
{
    if (r != CUDA_SUCCESS)
        return r;
    int d = vgpu_dev_of_ordinal(dev);
    uint64_t bytes = measure_ctx(d);
    if (!vgpu_reserve(d, bytes, 1, "context creation")) {
        REAL(cuCtxDestroy_v2)(*pctx);
        *pctx = NULL;
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    if (n_made == cap_made) {
        unsigned cap = cap_made ? cap_made * 2 : 16;
        struct made *m = realloc(made, cap * sizeof(*m));
        if (m == NULL) {
            vgpu_log(VGPU_LOG_ERROR, "out of host memory for the context table");
            return r;
        }
        made = m;
        cap_made = cap;
    }
    made[n_made].ctx = *pctx;
    made[n_made].dev = d;
    made[n_made].bytes = bytes;
    n_made++;
    vgpu_note_ctx_device(d);
    return r;
}

CUresult hook_cuCtxCreate_v2(CUcontext *pctx, unsigned int flags, CUdevice dev)
{
    ENTER(cuCtxCreate_v2, (pctx, flags, dev));
    CU_PROLOGUE(cuCtxCreate_v2, (pctx, flags, dev));
    pthread_mutex_lock(&ctx_lock);
    CUresult r = ctx_created(REAL(cuCtxCreate_v2)(pctx, flags, dev), pctx, dev);
    pthread_mutex_unlock(&ctx_lock);
    return r;
}

CUresult hook_cuCtxCreate_v3(CUcontext *pctx, CUexecAffinityParam *paramsArray, int numParams,
                             unsigned int flags, CUdevice dev)
{
    ENTER(cuCtxCreate_v3, (pctx, paramsArray, numParams, flags, dev));
    CU_PROLOGUE(cuCtxCreate_v3, (pctx, paramsArray, numParams, flags, dev));
    pthread_mutex_lock(&ctx_lock);
    CUresult r = ctx_created(REAL(cuCtxCreate_v3)(pctx, paramsArray, numParams, flags, dev),
                             pctx, dev);
    pthread_mutex_unlock(&ctx_lock);
    return r;
}

CUresult hook_cuCtxCreate_v4(CUcontext *pctx, CUctxCreateParams *ctxCreateParams,
                             unsigned int flags, CUdevice dev)
{
    ENTER(cuCtxCreate_v4, (pctx, ctxCreateParams, flags, dev));
    CU_PROLOGUE(cuCtxCreate_v4, (pctx, ctxCreateParams, flags, dev));
    pthread_mutex_lock(&ctx_lock);
    CUresult r = ctx_created(REAL(cuCtxCreate_v4)(pctx, ctxCreateParams, flags, dev), pctx,
                             dev);
    pthread_mutex_unlock(&ctx_lock);
    return r;
}

CUresult hook_cuCtxDestroy_v2(CUcontext ctx)
{
    ENTER(cuCtxDestroy_v2, (ctx));
    CU_PROLOGUE(cuCtxDestroy_v2, (ctx));
    pthread_mutex_lock(&ctx_lock);
    CUresult r = REAL(cuCtxDestroy_v2)(ctx);
    if (r == CUDA_SUCCESS) {
        for (unsigned i = 0; i < n_made; i++) {
            if (made[i].ctx == ctx) {
                drop_ctx(ctx, made[i].dev, made[i].bytes);
                made[i] = made[--n_made];
                break;
            }
        }
    }
    pthread_mutex_unlock(&ctx_lock);
    return r;
}

void vgpu_context_atfork_child(void)
{
    pthread_mutex_init(&ctx_lock, NULL);
    memset(primary, 0, sizeof(primary));
    n_made = 0;
}
