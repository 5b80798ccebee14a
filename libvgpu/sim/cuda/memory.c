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
#include "vmm.h"

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
    /* Device, managed and stream-ordered memory all go back through cuMemFree. */
    int pooled = 0;
    if (mem_take(dptr, ALLOC_DEVICE, &a) < 0 && mem_take(dptr, ALLOC_MANAGED, &a) < 0) {
        if (mem_take(dptr, ALLOC_POOL, &a) < 0)
            return CUDA_ERROR_INVALID_VALUE;
        pooled = 1;
    }
    /* The driver frees once the device is done with what is queued. */
    exec_sync_ctx(NULL);
    if (pooled)
        cu_pool_free(&a);
    else
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
    sim_mem_info(cu_phys[ctx->ordinal], &f, &t);
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
    struct alloc a = {.base = (uintptr_t)p, .size = size, .phys = cu_phys[ctx->ordinal],
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

/* ---- prefetching managed memory ----
 * Managed memory is one mapping here: a prefetch has nothing to move. */

VGPU_EXPORT CUresult cuMemPrefetchAsync(CUdeviceptr ptr, size_t n, CUdevice dev, CUstream h)
{
    (void)h;
    if (!cu_initialized)
        return CUDA_ERROR_NOT_INITIALIZED;
    struct alloc a;
    if (!n || !mem_find(ptr, n, &a) || a.kind != ALLOC_MANAGED)
        return CUDA_ERROR_INVALID_VALUE;
    if (dev != -1 /* CU_DEVICE_CPU */ && (dev < 0 || dev >= cu_count))
        return CUDA_ERROR_INVALID_DEVICE;
    return CUDA_SUCCESS;
}
VGPU_ALIAS(cuMemPrefetchAsync, cuMemPrefetchAsync_ptsz)

VGPU_EXPORT CUresult cuMemPrefetchAsync_v2(CUdeviceptr ptr, size_t n, CUmemLocation loc,
                                           unsigned int flags, CUstream h)
{
    if (flags)
        return CUDA_ERROR_INVALID_VALUE;
    int dev = loc.type == CU_MEM_LOCATION_TYPE_DEVICE ? loc.id : -1;
    return cuMemPrefetchAsync(ptr, n, dev, h);
}
VGPU_ALIAS(cuMemPrefetchAsync_v2, cuMemPrefetchAsync_v2_ptsz)

/* ---- tensor maps (TMA descriptors, sm_90) ----
 * A CUtensorMap is 128 opaque bytes the kernel reads; kernels do not run
 * here, so the descriptor is checked and zeroed. */

#define TENSOR_MAP_BYTES 128

static CUresult tensor_map(void *map, unsigned int rank, void *addr)
{
    if (!map || rank == 0 || rank > 5 || !addr || (uintptr_t)addr % 16)
        return CUDA_ERROR_INVALID_VALUE;
    memset(map, 0, TENSOR_MAP_BYTES);
    memcpy(map, &addr, sizeof addr);
    return CUDA_SUCCESS;
}

VGPU_EXPORT CUresult cuTensorMapEncodeTiled(void *map, int dtype, unsigned int rank, void *addr,
                                            const uint64_t *dims, const uint64_t *strides,
                                            const unsigned int *box, const unsigned int *elem,
                                            int interleave, int swizzle, int l2, int oob)
{
    (void)dtype, (void)interleave, (void)swizzle, (void)l2, (void)oob;
    if (!dims || !box || !elem || (rank > 1 && !strides))
        return CUDA_ERROR_INVALID_VALUE;
    return tensor_map(map, rank, addr);
}

VGPU_EXPORT CUresult cuTensorMapEncodeIm2col(void *map, int dtype, unsigned int rank, void *addr,
                                             const uint64_t *dims, const uint64_t *strides,
                                             const int *lower, const int *upper,
                                             unsigned int channels, unsigned int pixels,
                                             const unsigned int *elem, int interleave,
                                             int swizzle, int l2, int oob)
{
    (void)dtype, (void)channels, (void)pixels, (void)interleave, (void)swizzle, (void)l2,
        (void)oob;
    if (!dims || !elem || !lower || !upper || (rank > 1 && !strides) || rank < 3)
        return CUDA_ERROR_INVALID_VALUE;
    return tensor_map(map, rank, addr);
}

VGPU_EXPORT CUresult cuTensorMapReplaceAddress(void *map, void *addr)
{
    if (!map || !addr || (uintptr_t)addr % 16)
        return CUDA_ERROR_INVALID_VALUE;
    memcpy(map, &addr, sizeof addr);
    return CUDA_SUCCESS;
}
