/*
 * copy.h - the copies and memsets graphs replay (copy.c).
 */
#ifndef VGPU_SIM_CUDA_COPY_H
#define VGPU_SIM_CUDA_COPY_H

#include <stddef.h>

#include "handle.h"

/* A CUDA_MEMCPY3D copy, done at once (params points to one). */
CUresult cu_copy3d(const void *params);
CUresult cu_memset2d(CUdeviceptr dst, size_t pitch, unsigned int value, unsigned int elem,
                     size_t width, size_t height);

#endif /* VGPU_SIM_CUDA_COPY_H */
