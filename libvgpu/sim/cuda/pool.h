/*
 * pool.h - what other files need of stream-ordered pools (pool.c): freeing
 * an allocation of one.
 */
#ifndef VGPU_SIM_CUDA_POOL_H
#define VGPU_SIM_CUDA_POOL_H

#include "alloctab.h"

/* Give an allocation taken out of the table (ALLOC_POOL) back to its pool,
 * which keeps the memory up to its release threshold. */
void cu_pool_free(const struct alloc *a);

#endif /* VGPU_SIM_CUDA_POOL_H */
