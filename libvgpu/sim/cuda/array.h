/*
 * array.h - what other files need of CUDA arrays (array.c): the bytes
 * behind an array, for copies.
 */
#ifndef VGPU_SIM_CUDA_ARRAY_H
#define VGPU_SIM_CUDA_ARRAY_H

#include <stddef.h>
#include <stdint.h>

#include "handle.h"

/* A CUDA array's backing memory: base, bytes per row and rows; -1 if invalid. */
int cu_array_span(CUarray a, uintptr_t *base, size_t *row, size_t *rows);

#endif /* VGPU_SIM_CUDA_ARRAY_H */
