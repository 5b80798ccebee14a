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
#include "pool.h"

VGPU_EXPORT CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t size)
{
    CURRENT_CONTEXT(ctx);
    if (!dptr)
        return CUDA_ERROR_INVALID_VALUE;
    uintptr_t p;
    CUresult rc = mem_alloc(ctx, size, ALLOC_DEVICE, 0, &p);
    if (rc == CUDA_SUCCESS)
        *dptr = p;
    return rc;
}

VGPU_EXPORT CUresult cuMemAllocPitch_v2(CUdeviceptr *dptr, size_t *pitch, size_t width,
                                        size_t height, unsigned int elem)
{
    CURRENT_CONTEXT(ctx);
    if (!dptr || !pitch || width == 0 || height == 0 ||
        (elem != 4 && elem != 8 && elem != 16))
        return CUDA_ERROR_INVALID_VALUE;
    size_t p = (width + 511) / 512 * 512;
    uintptr_t base;
    CUresult rc = mem_alloc(ctx, p * height, ALLOC_DEVICE, 0, &base);
    if (rc == CUDA_SUCCESS) {
        *dptr = base;
        *pitch = p;
    }
    return rc;
}

VGPU_EXPORT CUresult cuMemAllocManaged(CUdeviceptr *dptr, size_t size, unsigned int flags)
{
    CURRENT_CONTEXT(ctx);
    if (!dptr || (flags != CU_MEM_ATTACH_GLOBAL && flags != CU_MEM_ATTACH_HOST))
        return CUDA_ERROR_INVALID_VALUE;
    uintptr_t p;
    CUresult rc = mem_alloc(ctx, size, ALLOC_MANAGED, flags, &p);
    if (rc == CUDA_SUCCESS)
        *dptr = p;
    return rc;
}

VGPU_EXPORT CUresult cuMemFree_v2(CUdeviceptr dptr)
{
    CURRENT_CONTEXT(ctx);
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
    CURRENT_CONTEXT(ctx);
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
    CURRENT_CONTEXT(ctx);
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
    CURRENT_CONTEXT(ctx);
    if (!pp || (flags & ~0xfu))
        return CUDA_ERROR_INVALID_VALUE;
    uintptr_t p;
    CUresult rc = mem_alloc(ctx, size, ALLOC_HOST, flags, &p);
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
    CURRENT_CONTEXT(ctx);
    return mem_free((uintptr_t)p, ALLOC_HOST);
}

VGPU_EXPORT CUresult cuMemHostGetDevicePointer_v2(CUdeviceptr *dptr, void *p, unsigned int flags)
{
    CURRENT_CONTEXT(ctx);
    struct alloc a;
    if (!dptr || flags != 0 || !mem_find((uintptr_t)p, 1, &a) ||
        (a.kind != ALLOC_HOST && a.kind != ALLOC_REGISTERED))
        return CUDA_ERROR_INVALID_VALUE;
    *dptr = (CUdeviceptr)(uintptr_t)p;
    return CUDA_SUCCESS;
}

VGPU_EXPORT CUresult cuMemHostGetFlags(unsigned int *flags, void *p)
{
    CURRENT_CONTEXT(ctx);
    struct alloc a;
    if (!flags || !mem_find((uintptr_t)p, 1, &a) ||
        (a.kind != ALLOC_HOST && a.kind != ALLOC_REGISTERED))
        return CUDA_ERROR_INVALID_VALUE;
    *flags = a.flags;
    return CUDA_SUCCESS;
}

VGPU_EXPORT CUresult cuMemHostRegister_v2(void *p, size_t size, unsigned int flags)
{
    CURRENT_CONTEXT(ctx);
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
    CURRENT_CONTEXT(ctx);
    struct alloc a;
    return mem_take((uintptr_t)p, ALLOC_REGISTERED, &a) < 0
               ? CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED
               : CUDA_SUCCESS;
}

/* ---- pointer attributes ---- */

/* The size of what an attribute writes: a pointer, a size or an id (8), or
 * an int or a boolean (4). */
static size_t attribute_size(int attr)
{
    switch (attr) {
    case CU_POINTER_ATTRIBUTE_CONTEXT:
    case CU_POINTER_ATTRIBUTE_DEVICE_POINTER:
    case CU_POINTER_ATTRIBUTE_HOST_POINTER:
    case 7: /* BUFFER_ID */
    case CU_POINTER_ATTRIBUTE_RANGE_START_ADDR:
    case CU_POINTER_ATTRIBUTE_RANGE_SIZE:
    case 14: /* ALLOWED_HANDLE_TYPES */
    case 17: /* MEMPOOL_HANDLE */
    case 18: /* MAPPING_SIZE */
    case 19: /* MAPPING_BASE_ADDR */
    case 20: /* MEMORY_BLOCK_ID */
        return 8;
    default:
        return 4;
    }
}

/* One attribute of the allocation at ptr. `lenient` is
 * cuPointerGetAttributes: a pointer the driver does not know, and an
 * attribute that does not apply to it (the host address of device memory),
 * read as the attribute's empty value rather than fail the call. */
static CUresult pointer_attribute(void *data, int attr, CUdeviceptr ptr, int lenient)
{
    struct alloc a;
    int found = mem_find(ptr, 1, &a);
    if (attr < CU_POINTER_ATTRIBUTE_CONTEXT || attr > 21 || attr == 5 /* P2P_TOKENS */)
        return CUDA_ERROR_INVALID_VALUE;
    if (!found) {
        if (!lenient)
            return CUDA_ERROR_INVALID_VALUE;
        memset(data, 0, attribute_size(attr));
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
        if (!host && a.kind != ALLOC_MANAGED) {
            if (!lenient)
                return CUDA_ERROR_INVALID_VALUE;
            *(void **)data = NULL;
            break;
        }
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
    case 10: /* IS_LEGACY_CUDA_IPC_CAPABLE: cuMemAlloc's memory */
        *(unsigned int *)data = a.kind == ALLOC_DEVICE;
        break;
    case 13: /* MAPPED */
        *(unsigned int *)data = 1;
        break;
    case 14: /* ALLOWED_HANDLE_TYPES (of cuMemCreate's handles; none here) */
        *(unsigned long long *)data = 0;
        break;
    case 15: /* IS_GPU_DIRECT_RDMA_CAPABLE */
        *(unsigned int *)data = 0;
        break;
    case 16: /* ACCESS_FLAGS: read and write */
        *(unsigned int *)data = 3;
        break;
    case 17: /* MEMPOOL_HANDLE */
        *(void **)data = a.pool;
        break;
    case 18: /* MAPPING_SIZE */
        *(size_t *)data = a.size;
        break;
    case 19: /* MAPPING_BASE_ADDR */
        *(CUdeviceptr *)data = a.base;
        break;
    case 20: /* MEMORY_BLOCK_ID */
        *(unsigned long long *)data = a.base;
        break;
    case 21: /* IS_HW_DECOMPRESS_CAPABLE */
        *(unsigned int *)data = 0;
        break;
    default:
        return CUDA_ERROR_INVALID_VALUE;
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

/* Batches of prefetches and discards (CUDA 13): each range must be managed
 * memory; there is nothing to move or to drop here. */
static CUresult batch_ranges(CUdeviceptr *ptrs, size_t *sizes, size_t count,
                             unsigned long long flags)
{
    if (!cu_initialized)
        return CUDA_ERROR_NOT_INITIALIZED;
    if (flags || !count || !ptrs || !sizes)
        return CUDA_ERROR_INVALID_VALUE;
    for (size_t i = 0; i < count; i++) {
        struct alloc a;
        if (!sizes[i] || !mem_find(ptrs[i], sizes[i], &a) || a.kind != ALLOC_MANAGED)
            return CUDA_ERROR_INVALID_VALUE;
    }
    return CUDA_SUCCESS;
}

static CUresult batch_locations(const CUmemLocation *locs, const size_t *idx, size_t n,
                                size_t count)
{
    if (!n || !locs || !idx)
        return CUDA_ERROR_INVALID_VALUE;
    for (size_t i = 0; i < n; i++) {
        if (idx[i] >= count || (i && idx[i] <= idx[i - 1]) || (i == 0 && idx[0] != 0))
            return CUDA_ERROR_INVALID_VALUE;
        if (locs[i].type == CU_MEM_LOCATION_TYPE_DEVICE &&
            (locs[i].id < 0 || locs[i].id >= cu_count))
            return CUDA_ERROR_INVALID_DEVICE;
    }
    return CUDA_SUCCESS;
}

VGPU_EXPORT CUresult cuMemPrefetchBatchAsync(CUdeviceptr *ptrs, size_t *sizes, size_t count,
                                             CUmemLocation *locs, size_t *idx, size_t nlocs,
                                             unsigned long long flags, CUstream h)
{
    (void)h;
    CUresult rc = batch_ranges(ptrs, sizes, count, flags);
    return rc ? rc : batch_locations(locs, idx, nlocs, count);
}
VGPU_ALIAS(cuMemPrefetchBatchAsync, cuMemPrefetchBatchAsync_ptsz)

VGPU_EXPORT CUresult cuMemDiscardBatchAsync(CUdeviceptr *ptrs, size_t *sizes, size_t count,
                                            unsigned long long flags, CUstream h)
{
    (void)h;
    return batch_ranges(ptrs, sizes, count, flags);
}
VGPU_ALIAS(cuMemDiscardBatchAsync, cuMemDiscardBatchAsync_ptsz)

VGPU_EXPORT CUresult cuMemDiscardAndPrefetchBatchAsync(CUdeviceptr *ptrs, size_t *sizes,
                                                       size_t count, CUmemLocation *locs,
                                                       size_t *idx, size_t nlocs,
                                                       unsigned long long flags, CUstream h)
{
    return cuMemPrefetchBatchAsync(ptrs, sizes, count, locs, idx, nlocs, flags, h);
}
VGPU_ALIAS(cuMemDiscardAndPrefetchBatchAsync, cuMemDiscardAndPrefetchBatchAsync_ptsz)

/* ---- advice on managed memory ----
 * Advice is accepted on managed memory and changes nothing here (one
 * mapping, nothing migrates); the range attributes read as a range never
 * advised nor prefetched. */

enum { ADVISE_SET_READ_MOSTLY = 1, ADVISE_UNSET_ACCESSED_BY = 6 };

VGPU_EXPORT CUresult cuMemAdvise_v2(CUdeviceptr ptr, size_t n, int advice, CUmemLocation loc)
{
    if (!cu_initialized)
        return CUDA_ERROR_NOT_INITIALIZED;
    struct alloc a;
    if (advice < ADVISE_SET_READ_MOSTLY || advice > ADVISE_UNSET_ACCESSED_BY || !n ||
        !mem_find(ptr, n, &a) || a.kind != ALLOC_MANAGED)
        return CUDA_ERROR_INVALID_VALUE;
    if (advice > 2 && loc.type == CU_MEM_LOCATION_TYPE_DEVICE &&
        (loc.id < 0 || loc.id >= cu_count))
        return CUDA_ERROR_INVALID_DEVICE;
    return CUDA_SUCCESS;
}

VGPU_EXPORT CUresult cuMemAdvise(CUdeviceptr ptr, size_t n, int advice, CUdevice dev)
{
    CUmemLocation loc = {.type = dev == -1 /* CU_DEVICE_CPU */ ? 2 /* HOST */
                                                                 : CU_MEM_LOCATION_TYPE_DEVICE,
                         .id = dev};
    return cuMemAdvise_v2(ptr, n, advice, loc);
}

enum { RANGE_READ_MOSTLY = 1, RANGE_PREFERRED_LOCATION, RANGE_ACCESSED_BY,
       RANGE_LAST_PREFETCH_LOCATION, RANGE_PREFERRED_LOCATION_TYPE, RANGE_PREFERRED_LOCATION_ID,
       RANGE_LAST_PREFETCH_LOCATION_TYPE, RANGE_LAST_PREFETCH_LOCATION_ID };

VGPU_EXPORT CUresult cuMemRangeGetAttribute(void *data, size_t size, int attr, CUdeviceptr ptr,
                                            size_t n)
{
    if (!cu_initialized)
        return CUDA_ERROR_NOT_INITIALIZED;
    struct alloc a;
    if (!data || !n || !mem_find(ptr, n, &a) || a.kind != ALLOC_MANAGED)
        return CUDA_ERROR_INVALID_VALUE;
    if (attr == RANGE_ACCESSED_BY) {
        if (size % 4)
            return CUDA_ERROR_INVALID_VALUE;
        for (size_t i = 0; i < size / 4; i++)
            ((int *)data)[i] = -2; /* CU_DEVICE_INVALID: no device listed */
        return CUDA_SUCCESS;
    }
    if (attr < RANGE_READ_MOSTLY || attr > RANGE_LAST_PREFETCH_LOCATION_ID || size != 4)
        return CUDA_ERROR_INVALID_VALUE;
    int v = 0; /* not read-mostly; location type CU_MEM_LOCATION_TYPE_INVALID */
    if (attr == RANGE_PREFERRED_LOCATION || attr == RANGE_LAST_PREFETCH_LOCATION ||
        attr == RANGE_PREFERRED_LOCATION_ID || attr == RANGE_LAST_PREFETCH_LOCATION_ID)
        v = -2; /* CU_DEVICE_INVALID */
    *(int *)data = v;
    return CUDA_SUCCESS;
}

VGPU_EXPORT CUresult cuMemRangeGetAttributes(void **data, size_t *sizes, int *attrs, size_t n,
                                             CUdeviceptr ptr, size_t count)
{
    if (!data || !sizes || !attrs || !n)
        return CUDA_ERROR_INVALID_VALUE;
    for (size_t i = 0; i < n; i++) {
        CUresult rc = cuMemRangeGetAttribute(data[i], sizes[i], attrs[i], ptr, count);
        if (rc)
            return rc;
    }
    return CUDA_SUCCESS;
}

/* GPUDirect RDMA writes are flushed: there are none here. */
VGPU_EXPORT CUresult cuFlushGPUDirectRDMAWrites(int target, int scope)
{
    CURRENT_CONTEXT(ctx);
    /* the current context, to the owner or to all devices */
    return target != 0 || (scope != 100 && scope != 200) ? CUDA_ERROR_INVALID_VALUE
                                                         : CUDA_SUCCESS;
}

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
