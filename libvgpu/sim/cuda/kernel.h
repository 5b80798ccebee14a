/*
 * kernel.h - checking a launch and giving a kernel its run time (kernel.c),
 * for launches and graphs' kernel nodes.
 */
#ifndef VGPU_SIM_CUDA_KERNEL_H
#define VGPU_SIM_CUDA_KERNEL_H

#include <stdint.h>

#include "handle.h"

/* Check a launch of f in ctx and give its run time in *ns. */
CUresult cu_kernel_check(CUfunction f, CUcontext ctx, unsigned int gx, unsigned int gy,
                         unsigned int gz, unsigned int bx, unsigned int by, unsigned int bz,
                         unsigned int shmem, void **params, void **extra, uint64_t *ns);

#endif /* VGPU_SIM_CUDA_KERNEL_H */
