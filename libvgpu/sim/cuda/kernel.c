/*
 * kernel.c - checking a launch and the rule that gives a simulated kernel its
 * run time, for launches (launch.c) and graphs' kernel nodes (graph_node.c):
 *
 *   - a function whose name starts with "vgpu_spin" runs for as many
 *     nanoseconds as its first parameter (a u64) says;
 *   - any other kernel runs VGPU_SIM_NS_PER_BLOCK (default 2000) ns per wave
 *     of blocks, a wave being one block per SM (132 SMs), and at least 2 us.
 */
#include <stdlib.h>
#include <string.h>

#include "init.h"
#include "kernel.h"

#define MIN_KERNEL_NS 2000ull
#define MAX_SHARED 232448u

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
        /* waves of blocks over the device's SMs (a MIG device has fewer) */
        uint64_t sms = (uint64_t)(ctx ? sim_slot_sms(cu_phys[ctx->ordinal]) : SIM_SM_COUNT);
        uint64_t waves = (blocks + sms - 1) / sms;
        *ns = waves * ns_per_block();
        if (*ns < MIN_KERNEL_NS)
            *ns = MIN_KERNEL_NS;
    }
    return CUDA_SUCCESS;
}

