/*
 * launch.c - kernel launches (plain, extended, cooperative) and occupancy.
 * A launch on a capturing stream becomes a node of its graph (graph.c); how
 * long a kernel runs is kernel.c's rule.
 */
#include <stdlib.h>
#include <string.h>

#include "context.h"
#include "exec.h"
#include "graph.h"
#include "kernel.h"
#include "stream.h"

#define MAX_SHARED 232448u /* shared memory per SM (kernel.h checks launches) */

static CUresult launch(CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz,
                       unsigned int bx, unsigned int by, unsigned int bz, unsigned int shmem,
                       CUstream h, void **params, void **extra, int cooperative)
{
    CUcontext cur, ctx;
    CUstream s;
    CUresult rc = cu_current(&cur);
    if (!rc)
        rc = cu_stream_resolve(h, &ctx, &s);
    if (rc)
        return rc;
    uint64_t ns;
    rc = cu_kernel_check(f, ctx, gx, gy, gz, bx, by, bz, shmem, params, extra, &ns);
    if (rc)
        return rc;
    if (cooperative) {
        uint64_t threads = (uint64_t)bx * by * bz;
        uint64_t per_sm = 2048 / threads;
        if (per_sm > 32)
            per_sm = 32;
        if ((uint64_t)gx * gy * gz > per_sm * SIM_SM_COUNT)
            return CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE;
    }
    if (s && s->capture)
        return cu_capture_kernel(s, f, gx, gy, gz, bx, by, bz, shmem, params, extra);
    exec_kernel(ctx, s, ns);
    return CUDA_SUCCESS;
}

VGPU_EXPORT CUresult cuLaunchKernel(CUfunction f, unsigned int gx, unsigned int gy,
                                    unsigned int gz, unsigned int bx, unsigned int by,
                                    unsigned int bz, unsigned int shmem, CUstream h,
                                    void **params, void **extra)
{
    return launch(f, gx, gy, gz, bx, by, bz, shmem, h, params, extra, 0);
}
VGPU_ALIAS(cuLaunchKernel, cuLaunchKernel_ptsz)

VGPU_EXPORT CUresult cuLaunchCooperativeKernel(CUfunction f, unsigned int gx, unsigned int gy,
                                               unsigned int gz, unsigned int bx,
                                               unsigned int by, unsigned int bz,
                                               unsigned int shmem, CUstream h, void **params)
{
    return launch(f, gx, gy, gz, bx, by, bz, shmem, h, params, NULL, 1);
}
VGPU_ALIAS(cuLaunchCooperativeKernel, cuLaunchCooperativeKernel_ptsz)

VGPU_EXPORT CUresult cuLaunchKernelEx(const CUlaunchConfig *c, CUfunction f, void **params,
                                      void **extra)
{
    if (!c || (c->numAttrs && !c->attrs))
        return CUDA_ERROR_INVALID_VALUE;
    int coop = 0;
    for (unsigned int i = 0; i < c->numAttrs; i++)
        if (c->attrs[i].id == CU_LAUNCH_ATTRIBUTE_COOPERATIVE && c->attrs[i].value.cooperative)
            coop = 1;
    return launch(f, c->gridDimX, c->gridDimY, c->gridDimZ, c->blockDimX, c->blockDimY,
                  c->blockDimZ, c->sharedMemBytes, c->hStream, params, extra, coop);
}
VGPU_ALIAS(cuLaunchKernelEx, cuLaunchKernelEx_ptsz)

VGPU_EXPORT CUresult cuOccupancyMaxActiveBlocksPerMultiprocessor(int *blocks, CUfunction f,
                                                                 int block_size, size_t shmem)
{
    if (!cu_obj_is(f, MAGIC_FUNC))
        return CUDA_ERROR_INVALID_HANDLE;
    if (!blocks || block_size <= 0 || block_size > 1024 || shmem > MAX_SHARED)
        return CUDA_ERROR_INVALID_VALUE;
    int n = 2048 / block_size;
    *blocks = n > 32 ? 32 : n;
    return CUDA_SUCCESS;
}

VGPU_EXPORT CUresult cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(
    int *blocks, CUfunction f, int block_size, size_t shmem, unsigned int flags)
{
    (void)flags;
    return cuOccupancyMaxActiveBlocksPerMultiprocessor(blocks, f, block_size, shmem);
}

VGPU_EXPORT CUresult cuOccupancyMaxPotentialBlockSize(int *min_grid, int *block_size, CUfunction f,
                                                      size_t (*smem_fn)(int), size_t shmem,
                                                      int limit)
{
    (void)smem_fn;
    (void)shmem;
    if (!cu_obj_is(f, MAGIC_FUNC))
        return CUDA_ERROR_INVALID_HANDLE;
    if (!min_grid || !block_size)
        return CUDA_ERROR_INVALID_VALUE;
    int b = (limit > 0 && limit < 1024) ? limit : 1024;
    *block_size = b;
    *min_grid = SIM_SM_COUNT * (2048 / b > 32 ? 32 : 2048 / b);
    return CUDA_SUCCESS;
}

VGPU_EXPORT CUresult cuOccupancyMaxPotentialBlockSizeWithFlags(int *min_grid, int *block_size,
                                                               CUfunction f,
                                                               size_t (*smem_fn)(int),
                                                               size_t shmem, int limit,
                                                               unsigned int flags)
{
    if (flags > 1)
        return CUDA_ERROR_INVALID_VALUE;
    return cuOccupancyMaxPotentialBlockSize(min_grid, block_size, f, smem_fn, shmem, limit);
}

/* Shared memory a block may still ask for dynamically: the SM's, shared by
 * the blocks that fit. */
VGPU_EXPORT CUresult cuOccupancyAvailableDynamicSMemPerBlock(size_t *smem, CUfunction f,
                                                             int blocks, int block_size)
{
    if (!cu_obj_is(f, MAGIC_FUNC))
        return CUDA_ERROR_INVALID_HANDLE;
    if (!smem || blocks <= 0 || block_size <= 0 || block_size > 1024)
        return CUDA_ERROR_INVALID_VALUE;
    size_t per_block = MAX_SHARED / (size_t)blocks;
    *smem = per_block > MAX_SHARED - 1024 ? MAX_SHARED - 1024 : per_block;
    return CUDA_SUCCESS;
}

/* Thread block clusters: an H100 runs clusters of up to 8 blocks (16 with
 * the non-portable attribute); one cluster per GPC pair of SMs here. */
VGPU_EXPORT CUresult cuOccupancyMaxPotentialClusterSize(int *size, CUfunction f,
                                                        const CUlaunchConfig *config)
{
    if (!cu_obj_is(f, MAGIC_FUNC))
        return CUDA_ERROR_INVALID_HANDLE;
    if (!size || !config)
        return CUDA_ERROR_INVALID_VALUE;
    *size = 8;
    return CUDA_SUCCESS;
}

VGPU_EXPORT CUresult cuOccupancyMaxActiveClusters(int *clusters, CUfunction f,
                                                  const CUlaunchConfig *config)
{
    if (!cu_obj_is(f, MAGIC_FUNC))
        return CUDA_ERROR_INVALID_HANDLE;
    if (!clusters || !config)
        return CUDA_ERROR_INVALID_VALUE;
    *clusters = SIM_SM_COUNT / 8;
    return CUDA_SUCCESS;
}
