/*
 * launch.c - kernel launches (plain, extended, cooperative), occupancy,
 * and the rule that gives a simulated kernel its run time:
 *
 *   - a function whose name starts with "vgpu_spin" runs for as many
 *     nanoseconds as its first parameter (a u64) says;
 *   - any other kernel runs VGPU_SIM_NS_PER_BLOCK (default 2000) ns per wave
 *     of blocks, a wave being one block per SM (132 SMs), and at least 2 us.
 */
#include <stdlib.h>
#include <string.h>

#include "context.h"
#include "exec.h"
#include "launch.h"
#include "stream.h"

#define MIN_KERNEL_NS 2000ull
#define MAX_SHARED 232448u
#define CU_LAUNCH_PARAM_END ((void *)0x00)
#define CU_LAUNCH_PARAM_BUFFER_POINTER ((void *)0x01)
#define CU_LAUNCH_PARAM_BUFFER_SIZE ((void *)0x02)

static uint64_t ns_per_block(void)
{
    static uint64_t v;
    if (!v) {
        const char *s = getenv("VGPU_SIM_NS_PER_BLOCK");
        char *end;
        unsigned long long n = s ? strtoull(s, &end, 10) : 0;
        v = (s && *s && *end == '\0' && n > 0) ? n : 2000;
    }
    return v;
}

/* The first parameter's bytes, from kernelParams or the `extra` buffer. */
static int first_param(void **params, void **extra, uint64_t *out)
{
    if (params && params[0]) {
        memcpy(out, params[0], sizeof *out);
        return 0;
    }
    for (int i = 0; extra && extra[i] != CU_LAUNCH_PARAM_END && i < 16; i += 2) {
        if (extra[i] == CU_LAUNCH_PARAM_BUFFER_POINTER && extra[i + 1]) {
            memcpy(out, extra[i + 1], sizeof *out);
            return 0;
        }
    }
    return -1;
}

CUresult cu_kernel_check(CUfunction f, CUcontext ctx, unsigned int gx, unsigned int gy,
                         unsigned int gz, unsigned int bx, unsigned int by, unsigned int bz,
                         unsigned int shmem, void **params, void **extra, uint64_t *ns)
{
    if (!cu_obj_is(f, MAGIC_FUNC) || !cu_obj_is(f->mod, MAGIC_MODULE))
        return CUDA_ERROR_INVALID_HANDLE;
    if (f->mod->ctx && f->mod->ctx != ctx)
        return CUDA_ERROR_INVALID_HANDLE;
    if (!gx || !gy || !gz || gy > 65535 || gz > 65535 || !bx || !by || !bz || bx > 1024 ||
        by > 1024 || bz > 64 || (uint64_t)bx * by * bz > 1024 || shmem > MAX_SHARED)
        return CUDA_ERROR_INVALID_VALUE;
    if (params && extra)
        return CUDA_ERROR_INVALID_VALUE;
    if (f->nparams > 0 && !params && !extra)
        return CUDA_ERROR_INVALID_VALUE;
    if (f->spin) {
        if (first_param(params, extra, ns) < 0)
            return CUDA_ERROR_INVALID_VALUE;
    } else {
        uint64_t blocks = (uint64_t)gx * gy * gz;
        uint64_t waves = (blocks + SIM_SM_COUNT - 1) / SIM_SM_COUNT;
        *ns = waves * ns_per_block();
        if (*ns < MIN_KERNEL_NS)
            *ns = MIN_KERNEL_NS;
    }
    return CUDA_SUCCESS;
}

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
