/*
 * array.h - what one channel of a CUDA array element holds, read one way
 * by the hook (which reserves an array's bytes before the driver makes it)
 * and the simulator (which makes it).
 */
#ifndef VGPU_ARRAY_H
#define VGPU_ARRAY_H

#include <stddef.h>

#include "vgpu/cuda_types.h"

/* Bytes per channel of an element of format f; 0 for a format not listed
 * in cuda_types.h (the simulator refuses it, the hook counts it at the
 * widest, VGPU_FORMAT_BYTES_MAX). */
size_t vgpu_format_bytes(CUarray_format f);

#define VGPU_FORMAT_BYTES_MAX 4

#endif /* VGPU_ARRAY_H */
