/*
 * hook_overhead_null.c - a do-nothing libcuda.so.1 for bench/hook_overhead.py.
 *
 * On the simulated GPU a launch or an allocation costs the simulator far more
 * (queues, locks, mmap) than the hook adds, and that cost varies by more than
 * the hook's whole share. Run against this driver, whose calls return at
 * once, "hooked minus direct" is the hook's own cost. Only what
 * hook_overhead.c and libvgpu.so call is here.
 */
#include <stdint.h>
#include <string.h>

#include "vgpu/cuda_types.h"

#define API __attribute__((visibility("default")))

static CUcontext const CTX = (CUcontext)0x1000;
static unsigned long long next_ptr = 1ull << 40;
static volatile unsigned long long launches;

API CUresult cuInit(unsigned int flags) { return flags ? CUDA_ERROR_INVALID_VALUE : CUDA_SUCCESS; }
API CUresult cuDriverGetVersion(int *v) { *v = 13000; return CUDA_SUCCESS; }
API CUresult cuDeviceGetCount(int *n) { *n = 1; return CUDA_SUCCESS; }
API CUresult cuDeviceGet(CUdevice *d, int ordinal)
{
    if (ordinal != 0)
        return CUDA_ERROR_INVALID_DEVICE;
    *d = 0;
    return CUDA_SUCCESS;
}
API CUresult cuDeviceGetUuid(CUuuid *u, CUdevice d)
{
    (void)d;
    memset(u->bytes, 0, sizeof(u->bytes));
    u->bytes[15] = 1;   /* GPU-00000000-0000-0000-0000-000000000001 */
    return CUDA_SUCCESS;
}
API CUresult cuDeviceGetUuid_v2(CUuuid *u, CUdevice d) { return cuDeviceGetUuid(u, d); }
API CUresult cuDeviceTotalMem_v2(size_t *b, CUdevice d) { (void)d; *b = 80ull << 30; return 0; }
API CUresult cuDevicePrimaryCtxRetain(CUcontext *c, CUdevice d) { (void)d; *c = CTX; return 0; }
API CUresult cuDevicePrimaryCtxRelease_v2(CUdevice d) { (void)d; return CUDA_SUCCESS; }
API CUresult cuCtxSetCurrent(CUcontext c) { (void)c; return CUDA_SUCCESS; }
API CUresult cuCtxGetCurrent(CUcontext *c) { *c = CTX; return CUDA_SUCCESS; }
API CUresult cuCtxGetDevice(CUdevice *d) { *d = 0; return CUDA_SUCCESS; }
API CUresult cuCtxSynchronize(void) { return CUDA_SUCCESS; }
API CUresult cuModuleLoadData(CUmodule *m, const void *image)
{
    (void)image;
    *m = (CUmodule)0x2000;
    return CUDA_SUCCESS;
}
API CUresult cuModuleGetFunction(CUfunction *f, CUmodule m, const char *name)
{
    (void)m;
    (void)name;
    *f = (CUfunction)0x3000;
    return CUDA_SUCCESS;
}
API CUresult cuLaunchKernel(CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz,
                            unsigned int bx, unsigned int by, unsigned int bz, unsigned int shm,
                            CUstream s, void **params, void **extra)
{
    (void)f; (void)gx; (void)gy; (void)gz; (void)bx; (void)by; (void)bz; (void)shm; (void)s;
    (void)params; (void)extra;
    launches++;
    return CUDA_SUCCESS;
}
API CUresult cuMemAlloc_v2(CUdeviceptr *p, size_t n)
{
    *p = __atomic_fetch_add(&next_ptr, (n + 4095) & ~4095ull, __ATOMIC_RELAXED);
    return CUDA_SUCCESS;
}
API CUresult cuMemFree_v2(CUdeviceptr p) { (void)p; return CUDA_SUCCESS; }
API CUresult cuMemGetInfo_v2(size_t *f, size_t *t)
{
    *f = 79ull << 30;
    *t = 80ull << 30;
    return CUDA_SUCCESS;
}
