/*
 * capture.h - stream capture (capture.c), for launches. Above graph_node.h,
 * exec.h and stream.h.
 */
#ifndef VGPU_SIM_CUDA_CAPTURE_H
#define VGPU_SIM_CUDA_CAPTURE_H

#include "handle.h"

/* A kernel launched on a capturing stream becomes a node of its graph
 * (capture.c); the launch parameters as cuGraphAddKernelNode takes them. */
CUresult cu_capture_kernel(CUstream s, CUfunction f, unsigned int gx, unsigned int gy,
                           unsigned int gz, unsigned int bx, unsigned int by, unsigned int bz,
                           unsigned int shmem, void **params, void **extra);

#endif /* VGPU_SIM_CUDA_CAPTURE_H */
