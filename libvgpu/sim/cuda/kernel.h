/*
 * kernel.h - checking a launch and giving a kernel its run time (kernel.c),
 * for launches and graphs' kernel nodes.
 */
#ifndef VGPU_SIM_CUDA_KERNEL_H
#define VGPU_SIM_CUDA_KERNEL_H

#include <stdint.h>

#include "handle.h"

/* The `extra` of a launch (cuLaunchKernel's last argument). */
#define CU_LAUNCH_PARAM_END ((void *)0x00)
#define CU_LAUNCH_PARAM_BUFFER_POINTER ((void *)0x01)
#define CU_LAUNCH_PARAM_BUFFER_SIZE ((void *)0x02)

/* Check a launch of f in ctx and give its run time in *ns. */
CUresult cu_kernel_check(CUfunction f, CUcontext ctx, unsigned int gx, unsigned int gy,
                         unsigned int gz, unsigned int bx, unsigned int by, unsigned int bz,
                         unsigned int shmem, void **params, void **extra, uint64_t *ns);

#endif /* VGPU_SIM_CUDA_KERNEL_H */
