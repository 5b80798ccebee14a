/*
 * absent.c - entry points of features the simulated GPU does not offer.
 * Each exists (programs look them up, and a lookup that fails leaves an
 * error behind in the runtime) and answers as the driver does where the
 * feature is unavailable: CUDA_ERROR_NOT_SUPPORTED.
 *
 *   multicast objects: need NVLink multicast (NVSwitch systems), which
 *     CU_DEVICE_ATTRIBUTE_MULTICAST_SUPPORTED reports absent;
 *   green contexts and device resources: SM partitions are not simulated.
 */
#include "init.h"

/* The parameters document each entry point's signature; none is read. */
#pragma GCC diagnostic ignored "-Wunused-parameter"

#define ABSENT(name, ...)                                                      \
    VGPU_EXPORT CUresult name(__VA_ARGS__)                                     \
    {                                                                          \
        return cu_initialized ? CUDA_ERROR_NOT_SUPPORTED : CUDA_ERROR_NOT_INITIALIZED; \
    }

ABSENT(cuMulticastCreate, void *handle, const void *prop)
ABSENT(cuMulticastAddDevice, unsigned long long handle, CUdevice dev)
ABSENT(cuMulticastBindMem, unsigned long long handle, size_t mc_offset, unsigned long long mem,
       size_t mem_offset, size_t size, unsigned long long flags)
ABSENT(cuMulticastBindAddr, unsigned long long handle, size_t mc_offset, CUdeviceptr ptr,
       size_t size, unsigned long long flags)
ABSENT(cuMulticastUnbind, unsigned long long handle, CUdevice dev, size_t mc_offset, size_t size)
ABSENT(cuMulticastGetGranularity, size_t *gran, const void *prop, int option)

ABSENT(cuGreenCtxCreate, void *phctx, void *desc, CUdevice dev, unsigned int flags)
ABSENT(cuGreenCtxDestroy, void *hctx)
ABSENT(cuCtxFromGreenCtx, CUcontext *pctx, void *hctx)
ABSENT(cuGreenCtxStreamCreate, CUstream *phstream, void *hctx, unsigned int flags, int priority)
ABSENT(cuDeviceGetDevResource, CUdevice dev, void *resource, int type)
ABSENT(cuDevSmResourceSplitByCount, void *result, unsigned int *nb_groups, const void *input,
       void *remaining, unsigned int flags, unsigned int min_count)
ABSENT(cuDevResourceGenerateDesc, void *desc, void *resources, unsigned int n)
