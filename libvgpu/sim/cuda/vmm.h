/*
 * vmm.h - what other files need of arrays, virtual memory and pools
 * (vmm.c): the bytes behind a CUDA array, for copies.
 */
#ifndef VGPU_SIM_CUDA_VMM_H
#define VGPU_SIM_CUDA_VMM_H

#include <stddef.h>
#include <stdint.h>

#include "alloctab.h"
#include "handle.h"

/* A CUDA array's backing memory: base, bytes per row and rows; -1 if invalid. */
int cu_array_span(CUarray a, uintptr_t *base, size_t *row, size_t *rows);

/* Give an allocation taken out of the table (ALLOC_POOL) back to its pool,
 * which keeps the memory up to its release threshold. */
void cu_pool_free(const struct alloc *a);

#endif /* VGPU_SIM_CUDA_VMM_H */
