/*
 * context.h - contexts and the calling thread's current one (context.c).
 * Above exec.h and alloctab.h: destroying a context waits for its work and
 * frees its allocations.
 */
#ifndef VGPU_SIM_CUDA_CONTEXT_H
#define VGPU_SIM_CUDA_CONTEXT_H

#include <stdint.h>

#include "handle.h"

/* The calling thread's current context, or NOT_INITIALIZED/INVALID_CONTEXT. */
CUresult cu_current(CUcontext *ctx);
/* Start of an entry point in the current context: return cu_current()'s
 * error, else declare `ctx`, the current context. */
#define CURRENT_CONTEXT(ctx)             \
    CUcontext ctx;                       \
    CUresult rc_ = cu_current(&ctx);     \
    if (rc_)                             \
        return rc_
int cu_ctx_valid(CUcontext ctx);
/* Device memory each context costs (VGPU_SIM_CTX_MEM). */
uint64_t cu_ctx_mem_cost(void);
/* Entry points other layers call. */
CUresult cuCtxGetCurrent(CUcontext *pctx);
CUresult cuCtxGetId(CUcontext ctx, unsigned long long *id);

/* The device's primary context handle, active or not, without retaining it. */
CUresult cu_primary_handle(CUcontext *pctx, CUdevice dev);

/* Context-local storage: a value per (context, key) whose destructor runs
 * when the context dies. get/delete of a missing key: INVALID_HANDLE. */
typedef void (*cu_cls_dtor)(CUcontext ctx, void *key, void *value);
CUresult cu_cls_put(CUcontext ctx, void *key, void *value, cu_cls_dtor dtor);
CUresult cu_cls_get(CUcontext ctx, void *key, void **value);
CUresult cu_cls_delete(CUcontext ctx, void *key);

#endif /* VGPU_SIM_CUDA_CONTEXT_H */
