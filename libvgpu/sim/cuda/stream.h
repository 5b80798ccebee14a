/*
 * stream.h - streams and events (stream.c). Above context.h and exec.h.
 */
#ifndef VGPU_SIM_CUDA_STREAM_H
#define VGPU_SIM_CUDA_STREAM_H

#include "handle.h"

/* Resolve a stream handle (0, CU_STREAM_LEGACY, CU_STREAM_PER_THREAD or a
 * stream) against the current context; *stream is NULL for a default
 * stream. */
CUresult cu_stream_resolve(CUstream h, CUcontext *ctx, CUstream *stream);

#endif /* VGPU_SIM_CUDA_STREAM_H */
