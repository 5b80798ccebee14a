/*
 * launch.c - kernel launches (plain, extended, cooperative, and the launches
 * before cuLaunchKernel: cuLaunch, cuLaunchGrid, cuLaunchGridAsync, whose
 * block shape and parameters are set on the function beforehand) and
 * occupancy. A launch on a capturing stream becomes a node of its graph
 * (capture.c); how long a kernel runs is kernel.c's rule.
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "capture.h"
#include "context.h"
#include "exec.h"
#include "init.h"
#include "kernel.h"
#include "stream.h"

#define MAX_SHARED 232448u /* shared memory per SM (kernel.h checks launches) */

/* VGPU_SIM_LAUNCH_STALL=US[/N]: every Nth launch of the process (every one
 * without /N) returns US microseconds after its kernel was queued, as a
 * launching thread that lost its CPU inside the driver's call on a loaded
 * host does: the kernel runs meanwhile, and what the caller does next (an
 * event it records after it, say) comes that much later. */
static struct {
    long us, every;
} g_stall;
static pthread_once_t g_stall_once = PTHREAD_ONCE_INIT;

static void stall_setting(void)
{
    const char *s = getenv("VGPU_SIM_LAUNCH_STALL");
    char *end = NULL;
    long v = s ? strtol(s, &end, 10) : 0;
    long k = 1;
    if (end && *end == '/')
        k = strtol(end + 1, &end, 10);
    int ok = s && *s && end && *end == '\0' && v > 0 && v <= 10000000 && k > 0;
    g_stall.every = ok ? k : 1;
    g_stall.us = ok ? v : 0;
}

static void stall(void)
{
    static unsigned long n;
    pthread_once(&g_stall_once, stall_setting);
    long us = g_stall.us;
    if (us == 0 ||
        __atomic_add_fetch(&n, 1, __ATOMIC_RELAXED) % (unsigned long)g_stall.every != 0)
        return;
    struct timespec ts = {.tv_sec = us / 1000000, .tv_nsec = (us % 1000000) * 1000};
    nanosleep(&ts, NULL);
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
        if ((uint64_t)gx * gy * gz > per_sm * (uint64_t)sim_slot_sms(cu_phys[ctx->ordinal]))
            return CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE;
    }
    if (s && s->capture)
        return cu_capture_kernel(s, f, gx, gy, gz, bx, by, bz, shmem, params, extra);
    exec_kernel(ctx, s, ns);
    stall();
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

/* ---- the launches before cuLaunchKernel (CUDA 2.0; deprecated) ----
 *
 * cuFuncSetBlockShape, cuFuncSetSharedSize and cuParamSet* store a block
 * shape, a dynamic shared memory size and a parameter buffer on the
 * function; cuLaunch, cuLaunchGrid and cuLaunchGridAsync launch it with
 * them, as cuLaunchKernel would with the buffer passed in `extra`. Until a
 * block shape is set a launch fails with CUDA_ERROR_INVALID_VALUE (a block
 * of no threads). The state is the function's, as in the driver: threads
 * configuring one function at once race. */

#define LEGACY_PARAMS_MAX (sizeof(((struct CUfunc_st *)0)->legacy_params))

static CUresult legacy_func(CUfunction f)
{
    if (!cu_initialized)
        return CUDA_ERROR_NOT_INITIALIZED;
    return cu_obj_is(f, MAGIC_FUNC) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
}

VGPU_EXPORT CUresult cuFuncSetBlockShape(CUfunction f, int x, int y, int z)
{
    CUresult rc = legacy_func(f);
    if (rc)
        return rc;
    if (x <= 0 || y <= 0 || z <= 0)
        return CUDA_ERROR_INVALID_VALUE;
    f->legacy_block[0] = (unsigned int)x;
    f->legacy_block[1] = (unsigned int)y;
    f->legacy_block[2] = (unsigned int)z;
    return CUDA_SUCCESS;
}

VGPU_EXPORT CUresult cuFuncSetSharedSize(CUfunction f, unsigned int bytes)
{
    CUresult rc = legacy_func(f);
    if (rc)
        return rc;
    f->legacy_shared = bytes;
    return CUDA_SUCCESS;
}

VGPU_EXPORT CUresult cuParamSetSize(CUfunction f, unsigned int bytes)
{
    CUresult rc = legacy_func(f);
    if (rc)
        return rc;
    if (bytes > LEGACY_PARAMS_MAX)
        return CUDA_ERROR_INVALID_VALUE;
    f->legacy_param_size = bytes;
    return CUDA_SUCCESS;
}

VGPU_EXPORT CUresult cuParamSetv(CUfunction f, int offset, void *ptr, unsigned int bytes)
{
    CUresult rc = legacy_func(f);
    if (rc)
        return rc;
    if (offset < 0 || (bytes && !ptr) || bytes > LEGACY_PARAMS_MAX ||
        (size_t)offset > LEGACY_PARAMS_MAX - bytes)
        return CUDA_ERROR_INVALID_VALUE;
    if (bytes)
        memcpy(f->legacy_params + offset, ptr, bytes);
    return CUDA_SUCCESS;
}

VGPU_EXPORT CUresult cuParamSeti(CUfunction f, int offset, unsigned int value)
{
    return cuParamSetv(f, offset, &value, sizeof value);
}

VGPU_EXPORT CUresult cuParamSetf(CUfunction f, int offset, float value)
{
    return cuParamSetv(f, offset, &value, sizeof value);
}

VGPU_EXPORT CUresult cuLaunchGridAsync(CUfunction f, int width, int height, CUstream h)
{
    CUresult rc = legacy_func(f);
    if (rc)
        return rc;
    if (width <= 0 || height <= 0)
        return CUDA_ERROR_INVALID_VALUE;
    size_t size = f->legacy_param_size;
    void *extra[] = {CU_LAUNCH_PARAM_BUFFER_POINTER, f->legacy_params,
                     CU_LAUNCH_PARAM_BUFFER_SIZE, &size, CU_LAUNCH_PARAM_END};
    return launch(f, (unsigned int)width, (unsigned int)height, 1, f->legacy_block[0],
                  f->legacy_block[1], f->legacy_block[2], f->legacy_shared, h, NULL, extra, 0);
}

VGPU_EXPORT CUresult cuLaunchGrid(CUfunction f, int width, int height)
{
    return cuLaunchGridAsync(f, width, height, NULL);
}

VGPU_EXPORT CUresult cuLaunch(CUfunction f)
{
    return cuLaunchGridAsync(f, 1, 1, NULL);
}

VGPU_EXPORT CUresult cuOccupancyMaxActiveBlocksPerMultiprocessor(int *blocks, CUfunction f,
                                                                 int block_size, size_t shmem)
{
    CHECK_HANDLE(f, MAGIC_FUNC);
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

/* The SMs of the current context's device (a MIG device has its profile's). */
static int current_sms(void)
{
    CUcontext c;
    return cu_current(&c) == CUDA_SUCCESS && c ? sim_slot_sms(cu_phys[c->ordinal])
                                               : SIM_SM_COUNT;
}

VGPU_EXPORT CUresult cuOccupancyMaxPotentialBlockSize(int *min_grid, int *block_size, CUfunction f,
                                                      size_t (*smem_fn)(int), size_t shmem,
                                                      int limit)
{
    (void)smem_fn;
    (void)shmem;
    CHECK_HANDLE(f, MAGIC_FUNC);
    if (!min_grid || !block_size)
        return CUDA_ERROR_INVALID_VALUE;
    int b = (limit > 0 && limit < 1024) ? limit : 1024;
    *block_size = b;
    *min_grid = current_sms() * (2048 / b > 32 ? 32 : 2048 / b);
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
    CHECK_HANDLE(f, MAGIC_FUNC);
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
    CHECK_HANDLE(f, MAGIC_FUNC);
    if (!size || !config)
        return CUDA_ERROR_INVALID_VALUE;
    *size = 8;
    return CUDA_SUCCESS;
}

VGPU_EXPORT CUresult cuOccupancyMaxActiveClusters(int *clusters, CUfunction f,
                                                  const CUlaunchConfig *config)
{
    CHECK_HANDLE(f, MAGIC_FUNC);
    if (!clusters || !config)
        return CUDA_ERROR_INVALID_VALUE;
    *clusters = current_sms() / 8;
    return CUDA_SUCCESS;
}
