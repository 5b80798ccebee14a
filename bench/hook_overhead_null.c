/*
 * hook_overhead_null.c - a do-nothing libcuda.so.1 for bench/hook_overhead.py.
 *
 * On the simulated GPU a launch or an allocation costs the simulator far more
 * (queues, locks, mmap) than the hook adds, and that cost varies by more than
 * the hook's whole share. Run against this driver, whose calls return at
 * once, "hooked minus direct" is the hook's own cost. Only what
 * hook_overhead.c and libvgpu.so call is here, the entry points of a gated
 * launch's slow path included (libvgpu/hook/launch.c, turns.c, flight.c):
 * no stream captures, an event is done as soon as it is recorded, and the
 * time between two is VGPU_NULL_SPAN_MS, tiny, so that a turn's credit
 * never runs out and a gated launch never waits.
 *
 * Events are fake handles (nothing is allocated for them); the hook keeps
 * its own pool of them, reusing each once it has measured it, so a run
 * creates a few and no more: vgpu_null_events_created counts them, and
 * hook_overhead.c reports it.
 */
#include <stdint.h>
#include <string.h>

#include "vgpu/cuda_types.h"

#define API __attribute__((visibility("default")))

static CUcontext const CTX = (CUcontext)0x1000;
static unsigned long long next_ptr = 1ull << 40;
static volatile unsigned long long launches;

/* The time between any two events, in ms: 10 ns. */
#define VGPU_NULL_SPAN_MS 1e-5f
/* Events created so far (each a fake handle: 0x100000 + 16 * n). */
API unsigned long vgpu_null_events_created;

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

API CUresult cuStreamIsCapturing(CUstream s, int *status)
{
    (void)s;
    *status = 0;   /* CU_STREAM_CAPTURE_STATUS_NONE */
    return CUDA_SUCCESS;
}
API CUresult cuEventCreate(CUevent *e, unsigned int flags)
{
    (void)flags;
    unsigned long n = __atomic_fetch_add(&vgpu_null_events_created, 1, __ATOMIC_RELAXED);
    *e = (CUevent)(uintptr_t)(0x100000ul + 16ul * n);
    return CUDA_SUCCESS;
}
API CUresult cuEventRecord(CUevent e, CUstream s)
{
    (void)e;
    (void)s;
    return CUDA_SUCCESS;
}
API CUresult cuEventQuery(CUevent e) { (void)e; return CUDA_SUCCESS; }
API CUresult cuEventSynchronize(CUevent e) { (void)e; return CUDA_SUCCESS; }
API CUresult cuEventElapsedTime(float *ms, CUevent start, CUevent end)
{
    (void)start;
    (void)end;
    *ms = VGPU_NULL_SPAN_MS;
    return CUDA_SUCCESS;
}
