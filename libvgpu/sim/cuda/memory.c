/*
 * memory.c - device memory's entry points: allocating and freeing (linear,
 * pitch, managed, host, registered), cuMemGetInfo, address ranges and
 * pointer attributes, on the allocation table of alloctab.c.
 */
#include <string.h>

#include "alloctab.h"
#include "context.h"
#include "exec.h"
#include "init.h"

VGPU_EXPORT CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t size)
{
    CUcontext ctx;
    CUresult rc = cu_current(&ctx);
    if (rc)
        return rc;
    if (!dptr)
        return CUDA_ERROR_INVALID_VALUE;
    uintptr_t p;
    rc = mem_alloc(ctx, size, ALLOC_DEVICE, 0, &p);
    if (rc == CUDA_SUCCESS)
        *dptr = p;
    return rc;
}

VGPU_EXPORT CUresult cuMemAllocPitch_v2(CUdeviceptr *dptr, size_t *pitch, size_t width,
                                        size_t height, unsigned int elem)
{
    CUcontext ctx;
    CUresult rc = cu_current(&ctx);
    if (rc)
        return rc;
    if (!dptr || !pitch || width == 0 || height == 0 ||
        (elem != 4 && elem != 8 && elem != 16))
        return CUDA_ERROR_INVALID_VALUE;
    size_t p = (width + 511) / 512 * 512;
    uintptr_t base;
    rc = mem_alloc(ctx, p * height, ALLOC_DEVICE, 0, &base);
    if (rc == CUDA_SUCCESS) {
        *dptr = base;
        *pitch = p;
    }
    return rc;
}

VGPU_EXPORT CUresult cuMemAllocManaged(CUdeviceptr *dptr, size_t size, unsigned int flags)
{
    CUcontext ctx;
    CUresult rc = cu_current(&ctx);
    if (rc)
        return rc;
    if (!dptr || (flags != CU_MEM_ATTACH_GLOBAL && flags != CU_MEM_ATTACH_HOST))
        return CUDA_ERROR_INVALID_VALUE;
    uintptr_t p;
    rc = mem_alloc(ctx, size, ALLOC_MANAGED, flags, &p);
    if (rc == CUDA_SUCCESS)
        *dptr = p;
    return rc;
}

VGPU_EXPORT CUresult cuMemFree_v2(CUdeviceptr dptr)
{
    CUcontext ctx;
    CUresult rc = cu_current(&ctx);
    if (rc)
        return rc;
    if (dptr == 0)
        return CUDA_SUCCESS;
    struct alloc a;
    /* Device and managed memory both go back through cuMemFree. */
    if (mem_take(dptr, ALLOC_DEVICE, &a) < 0 && mem_take(dptr, ALLOC_MANAGED, &a) < 0)
        return CUDA_ERROR_INVALID_VALUE;
    /* The driver frees once the device is done with what is queued. */
    exec_sync_ctx(NULL);
    mem_release(&a);
    return CUDA_SUCCESS;
}

VGPU_EXPORT CUresult cuMemGetInfo_v2(size_t *free_bytes, size_t *total_bytes)
{
    CUcontext ctx;
    CUresult rc = cu_current(&ctx);
    if (rc)
        return rc;
    if (!free_bytes || !total_bytes)
        return CUDA_ERROR_INVALID_VALUE;
    uint64_t f, t;
    sim_mem_info(ctx->phys, &f, &t);
    *free_bytes = (size_t)f;
    *total_bytes = (size_t)t;
    return CUDA_SUCCESS;
}

VGPU_EXPORT CUresult cuMemGetAddressRange_v2(CUdeviceptr *base, size_t *size, CUdeviceptr dptr)
{
    CUcontext ctx;
    CUresult rc = cu_current(&ctx);
    if (rc)
        return rc;
    struct alloc a;
    if (!mem_find(dptr, 1, &a) || a.kind == ALLOC_HOST || a.kind == ALLOC_REGISTERED)
        return CUDA_ERROR_NOT_FOUND;
    if (base)
        *base = a.base;
    if (size)
        *size = a.size;
    return CUDA_SUCCESS;
}

VGPU_EXPORT CUresult cuMemHostAlloc(void **pp, size_t size, unsigned int flags)
{
    CUcontext ctx;
    CUresult rc = cu_current(&ctx);
    if (rc)
        return rc;
    if (!pp || (flags & ~0xfu))
        return CUDA_ERROR_INVALID_VALUE;
    uintptr_t p;
    rc = mem_alloc(ctx, size, ALLOC_HOST, flags, &p);
    if (rc == CUDA_SUCCESS)
        *pp = (void *)p;
    return rc;
}

VGPU_EXPORT CUresult cuMemAllocHost_v2(void **pp, size_t size)
{
    return cuMemHostAlloc(pp, size, 0);
}

VGPU_EXPORT CUresult cuMemFreeHost(void *p)
{
    CUcontext ctx;
    CUresult rc = cu_current(&ctx);
    if (rc)
        return rc;
    return mem_free((uintptr_t)p, ALLOC_HOST);
}

VGPU_EXPORT CUresult cuMemHostGetDevicePointer_v2(CUdeviceptr *dptr, void *p, unsigned int flags)
{
    CUcontext ctx;
    CUresult rc = cu_current(&ctx);
    if (rc)
        return rc;
    struct alloc a;
    if (!dptr || flags != 0 || !mem_find((uintptr_t)p, 1, &a) ||
        (a.kind != ALLOC_HOST && a.kind != ALLOC_REGISTERED))
        return CUDA_ERROR_INVALID_VALUE;
    *dptr = (CUdeviceptr)(uintptr_t)p;
    return CUDA_SUCCESS;
}

VGPU_EXPORT CUresult cuMemHostGetFlags(unsigned int *flags, void *p)
{
    CUcontext ctx;
    CUresult rc = cu_current(&ctx);
    if (rc)
        return rc;
    struct alloc a;
    if (!flags || !mem_find((uintptr_t)p, 1, &a) ||
        (a.kind != ALLOC_HOST && a.kind != ALLOC_REGISTERED))
        return CUDA_ERROR_INVALID_VALUE;
    *flags = a.flags;
    return CUDA_SUCCESS;
}

VGPU_EXPORT CUresult cuMemHostRegister_v2(void *p, size_t size, unsigned int flags)
{
    CUcontext ctx;
    CUresult rc = cu_current(&ctx);
    if (rc)
        return rc;
    if (!p || size == 0 || (flags & ~0xfu))
        return CUDA_ERROR_INVALID_VALUE;
    if (mem_find((uintptr_t)p, size, NULL) || mem_find((uintptr_t)p, 1, NULL))
        return CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED;
    struct alloc a = {.base = (uintptr_t)p, .size = size, .phys = ctx->phys,
                      .kind = ALLOC_REGISTERED, .flags = flags, .ctx = ctx};
    return mem_register(&a) < 0 ? CUDA_ERROR_OUT_OF_MEMORY : CUDA_SUCCESS;
}
VGPU_ALIAS(cuMemHostRegister_v2, cuMemHostRegister)

VGPU_EXPORT CUresult cuMemHostUnregister(void *p)
{
    CUcontext ctx;
    CUresult rc = cu_current(&ctx);
    if (rc)
        return rc;
    struct alloc a;
    return mem_take((uintptr_t)p, ALLOC_REGISTERED, &a) < 0
               ? CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED
               : CUDA_SUCCESS;
}

/* ---- pointer attributes ---- */

static CUresult pointer_attribute(void *data, int attr, CUdeviceptr ptr, int lenient)
{
    struct alloc a;
    int found = mem_find(ptr, 1, &a);
    if (!found) {
        if (!lenient)
            return CUDA_ERROR_INVALID_VALUE;
        memset(data, 0, attr == CU_POINTER_ATTRIBUTE_CONTEXT ||
                                attr == CU_POINTER_ATTRIBUTE_DEVICE_POINTER ||
                                attr == CU_POINTER_ATTRIBUTE_HOST_POINTER ||
                                attr == CU_POINTER_ATTRIBUTE_RANGE_START_ADDR ||
                                attr == CU_POINTER_ATTRIBUTE_RANGE_SIZE ? 8 : 4);
        if (attr == CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL)
            *(int *)data = -2;
        return CUDA_SUCCESS;
    }
    int host = a.kind == ALLOC_HOST || a.kind == ALLOC_REGISTERED;
    switch (attr) {
    case CU_POINTER_ATTRIBUTE_CONTEXT:
        *(CUcontext *)data = a.ctx;
        break;
    case CU_POINTER_ATTRIBUTE_MEMORY_TYPE:
        *(unsigned int *)data = host ? CU_MEMORYTYPE_HOST : CU_MEMORYTYPE_DEVICE;
        break;
    case CU_POINTER_ATTRIBUTE_DEVICE_POINTER:
        *(CUdeviceptr *)data = ptr;
        break;
    case CU_POINTER_ATTRIBUTE_HOST_POINTER:
        if (!host && a.kind != ALLOC_MANAGED)
            return CUDA_ERROR_INVALID_VALUE;
        *(void **)data = (void *)(uintptr_t)ptr;
        break;
    case 6: /* SYNC_MEMOPS */
        *(unsigned int *)data = 1;
        break;
    case 7: /* BUFFER_ID */
        *(unsigned long long *)data = a.base;
        break;
    case CU_POINTER_ATTRIBUTE_IS_MANAGED:
        *(unsigned int *)data = a.kind == ALLOC_MANAGED;
        break;
    case CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL:
        *(int *)data = a.ctx ? a.ctx->ordinal : 0;
        break;
    case CU_POINTER_ATTRIBUTE_RANGE_START_ADDR:
        *(CUdeviceptr *)data = a.base;
        break;
    case CU_POINTER_ATTRIBUTE_RANGE_SIZE:
        *(size_t *)data = a.size;
        break;
    case 13: /* MAPPED */
        *(unsigned int *)data = 1;
        break;
    default:
        return lenient ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
    }
    return CUDA_SUCCESS;
}

VGPU_EXPORT CUresult cuPointerGetAttribute(void *data, int attr, CUdeviceptr ptr)
{
    if (!cu_initialized)
        return CUDA_ERROR_NOT_INITIALIZED;
    if (!data)
        return CUDA_ERROR_INVALID_VALUE;
    return pointer_attribute(data, attr, ptr, 0);
}

VGPU_EXPORT CUresult cuPointerGetAttributes(unsigned int n, int *attrs, void **data,
                                            CUdeviceptr ptr)
{
    if (!cu_initialized)
        return CUDA_ERROR_NOT_INITIALIZED;
    if (!attrs || !data)
        return CUDA_ERROR_INVALID_VALUE;
    for (unsigned int i = 0; i < n; i++) {
        CUresult rc = pointer_attribute(data[i], attrs[i], ptr, 1);
        if (rc)
            return rc;
    }
    return CUDA_SUCCESS;
}
