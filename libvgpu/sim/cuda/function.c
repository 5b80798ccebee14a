/*
 * function.c - functions and kernels: their attributes, names, parameters
 * and modules, and the cache and shared memory configurations, accepted and
 * ignored. Modules and libraries, which hold them, are module.c's.
 */
#include "handle.h"
#include "init.h"

VGPU_EXPORT CUresult cuFuncGetAttribute(int *value, CUfunction_attribute attr, CUfunction f)
{
    CHECK_HANDLE(f, MAGIC_FUNC);
    if (!value)
        return CUDA_ERROR_INVALID_VALUE;
    switch ((int)attr) {
    case 0: *value = 1024; break;          /* MAX_THREADS_PER_BLOCK */
    case 4: *value = 16; break;            /* NUM_REGS */
    case 5: *value = 90; break;            /* PTX_VERSION */
    case 6: *value = 90; break;            /* BINARY_VERSION */
    case 8: *value = 232448 - 1024; break; /* MAX_DYNAMIC_SHARED_SIZE_BYTES */
    case 9: *value = -1; break;            /* PREFERRED_SHARED_MEMORY_CARVEOUT */
    case 1: case 2: case 3: case 7: case 10: case 11: case 12: case 13: case 14: case 15:
        *value = 0;
        break;
    default:
        return CUDA_ERROR_INVALID_VALUE;
    }
    return CUDA_SUCCESS;
}

VGPU_EXPORT CUresult cuFuncSetAttribute(CUfunction f, CUfunction_attribute attr, int value)
{
    (void)value;
    CHECK_HANDLE(f, MAGIC_FUNC);
    return ((int)attr < 0 || (int)attr > 15) ? CUDA_ERROR_INVALID_VALUE : CUDA_SUCCESS;
}

VGPU_EXPORT CUresult cuKernelGetAttribute(int *value, CUfunction_attribute attr, CUkernel k,
                                          CUdevice dev)
{
    CUresult rc = cu_check_device(dev);
    return rc ? rc : cuFuncGetAttribute(value, attr, (CUfunction)k);
}

VGPU_EXPORT CUresult cuKernelSetAttribute(CUfunction_attribute attr, int value, CUkernel k,
                                          CUdevice dev)
{
    CUresult rc = cu_check_device(dev);
    return rc ? rc : cuFuncSetAttribute((CUfunction)k, attr, value);
}

VGPU_EXPORT CUresult cuFuncSetCacheConfig(CUfunction f, int config)
{
    CHECK_HANDLE(f, MAGIC_FUNC);
    return (config < 0 || config > 3) ? CUDA_ERROR_INVALID_VALUE : CUDA_SUCCESS;
}

VGPU_EXPORT CUresult cuFuncGetName(const char **name, CUfunction f)
{
    CHECK_HANDLE(f, MAGIC_FUNC);
    ANSWER(name, f->name);
}
VGPU_ALIAS(cuFuncGetName, cuKernelGetName)

VGPU_EXPORT CUresult cuFuncGetModule(CUmodule *m, CUfunction f)
{
    CHECK_HANDLE(f, MAGIC_FUNC);
    ANSWER(m, f->mod);
}

VGPU_EXPORT CUresult cuFuncGetParamInfo(CUfunction f, size_t index, size_t *offset, size_t *size)
{
    CHECK_HANDLE(f, MAGIC_FUNC);
    if (f->nparams < 0)
        return CUDA_ERROR_NOT_SUPPORTED;
    if (index >= (size_t)f->nparams)
        return CUDA_ERROR_INVALID_VALUE;
    if (offset)
        *offset = f->params[index].offset;
    if (size)
        *size = f->params[index].size;
    return CUDA_SUCCESS;
}
VGPU_ALIAS(cuFuncGetParamInfo, cuKernelGetParamInfo)

VGPU_EXPORT CUresult cuFuncIsLoaded(int *state, CUfunction f)
{
    CHECK_HANDLE(f, MAGIC_FUNC);
    ANSWER(state, 1); /* CU_FUNCTION_LOADING_STATE_LOADED */
}

VGPU_EXPORT CUresult cuFuncLoad(CUfunction f)
{
    return cu_obj_is(f, MAGIC_FUNC) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
}

/* Shared memory bank size and the cache preference of a kernel: accepted
 * and ignored, as Hopper does. */
VGPU_EXPORT CUresult cuFuncSetSharedMemConfig(CUfunction f, int config)
{
    CHECK_HANDLE(f, MAGIC_FUNC);
    return (config < 0 || config > 2) ? CUDA_ERROR_INVALID_VALUE : CUDA_SUCCESS;
}

VGPU_EXPORT CUresult cuKernelSetCacheConfig(CUkernel k, int config, CUdevice dev)
{
    CHECK_DEVICE(dev);
    CHECK_HANDLE(k, MAGIC_FUNC);
    return (config < 0 || config > 3) ? CUDA_ERROR_INVALID_VALUE : CUDA_SUCCESS;
}
