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
int cu_ctx_valid(CUcontext ctx);
/* Device memory each context costs (VGPU_SIM_CTX_MEM). */
uint64_t cu_ctx_mem_cost(void);

#endif /* VGPU_SIM_CUDA_CONTEXT_H */
