/*
 * memory.c - device memory: the allocation table and the allocating and
 * freeing entry points (linear, pitch, managed, host, registered, arrays),
 * cuMemGetInfo, address ranges and pointer attributes.
 *
 * A device pointer is the address of a lazily backed host mapping
 * (MAP_NORESERVE), so copies and memsets work on it; the table tells valid
 * pointers from bad ones. Device memory is charged in whole 2 MiB granules.
 */
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "handle.h"

static struct alloc *g_tab; /* sorted by base */
static size_t g_n, g_cap;
static pthread_mutex_t g_mem_lock = PTHREAD_MUTEX_INITIALIZER;

uint64_t mem_round(uint64_t bytes)
{
    return (bytes + SIM_GRANULARITY - 1) / SIM_GRANULARITY * SIM_GRANULARITY;
}

static size_t page_round(size_t n)
{
    size_t pg = (size_t)sysconf(_SC_PAGESIZE);
    return (n + pg - 1) / pg * pg;
}

/* Index of the first entry with base > p. */
static size_t upper(uintptr_t p)
{
    size_t lo = 0, hi = g_n;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (g_tab[mid].base <= p)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

static struct alloc *containing(uintptr_t p, size_t len)
{
    size_t i = upper(p);
    if (i == 0)
        return NULL;
    struct alloc *a = &g_tab[i - 1];
    size_t span = a->size ? a->size : 1;
    if (p - a->base >= span || len > span - (p - a->base))
        return NULL;
    return a;
}

int mem_find(uintptr_t p, size_t len, struct alloc *out)
{
    pthread_mutex_lock(&g_mem_lock);
    struct alloc *a = containing(p, len);
    if (a && out)
        *out = *a;
    pthread_mutex_unlock(&g_mem_lock);
    return a != NULL;
}

static int table_insert(const struct alloc *a)
{
    if (g_n == g_cap) {
        size_t cap = g_cap ? g_cap * 2 : 256;
        struct alloc *t = realloc(g_tab, cap * sizeof *t);
        if (!t)
            return -1;
        g_tab = t;
        g_cap = cap;
    }
    size_t i = upper(a->base);
    memmove(&g_tab[i + 1], &g_tab[i], (g_n - i) * sizeof *g_tab);
    g_tab[i] = *a;
    g_n++;
    return 0;
}

int mem_register(const struct alloc *a)
{
    pthread_mutex_lock(&g_mem_lock);
    int rc = table_insert(a);
    pthread_mutex_unlock(&g_mem_lock);
    return rc;
}

static int charged_kind(int kind)
{
    return kind == ALLOC_DEVICE || kind == ALLOC_MANAGED || kind == ALLOC_ARRAY;
}

CUresult mem_alloc(CUcontext ctx, size_t size, int kind, unsigned int flags, uintptr_t *out)
{
    if (size == 0)
        return CUDA_ERROR_INVALID_VALUE;
    struct alloc a = {.size = size, .phys = ctx->phys, .kind = kind, .flags = flags, .ctx = ctx};
    a.charged = charged_kind(kind) ? mem_round(size) : 0;
    if (a.charged && sim_charge(ctx->phys, a.charged, 1) < 0)
        return CUDA_ERROR_OUT_OF_MEMORY;
    a.mapped = page_round(size);
    void *p = mmap(NULL, a.mapped, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) {
        if (a.charged)
            sim_uncharge(ctx->phys, a.charged);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    a.base = (uintptr_t)p;
    if (mem_register(&a) < 0) {
        munmap(p, a.mapped);
        if (a.charged)
            sim_uncharge(ctx->phys, a.charged);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    *out = a.base;
    return CUDA_SUCCESS;
}

void mem_release(const struct alloc *a)
{
    if (a->kind != ALLOC_REGISTERED && a->mapped)
        munmap((void *)a->base, a->mapped);
    if (a->charged)
        sim_uncharge(a->phys, a->charged);
}

void mem_set_pool(uintptr_t ptr, void *pool)
{
    pthread_mutex_lock(&g_mem_lock);
    size_t i = upper(ptr);
    if (i > 0 && g_tab[i - 1].base == ptr)
        g_tab[i - 1].pool = pool;
    pthread_mutex_unlock(&g_mem_lock);
}

int mem_take(uintptr_t ptr, int kind, struct alloc *out)
{
    pthread_mutex_lock(&g_mem_lock);
    size_t i = upper(ptr);
    int rc = -1;
    if (i > 0 && g_tab[i - 1].base == ptr && g_tab[i - 1].kind == kind) {
        *out = g_tab[i - 1];
        memmove(&g_tab[i - 1], &g_tab[i], (g_n - i) * sizeof *g_tab);
        g_n--;
        rc = 0;
    }
    pthread_mutex_unlock(&g_mem_lock);
    return rc;
}

CUresult mem_free(uintptr_t ptr, int kind)
{
    struct alloc a;
    if (mem_take(ptr, kind, &a) < 0)
        return CUDA_ERROR_INVALID_VALUE;
    mem_release(&a);
    return CUDA_SUCCESS;
}

void mem_free_ctx(CUcontext ctx)
{
    for (;;) {
        struct alloc a;
        int found = 0;
        pthread_mutex_lock(&g_mem_lock);
        for (size_t i = 0; i < g_n; i++) {
            if (g_tab[i].ctx == ctx && g_tab[i].kind != ALLOC_REGISTERED &&
                g_tab[i].kind != ALLOC_VA) {
                a = g_tab[i];
                memmove(&g_tab[i], &g_tab[i + 1], (g_n - i - 1) * sizeof *g_tab);
                g_n--;
                found = 1;
                break;
            }
        }
        pthread_mutex_unlock(&g_mem_lock);
        if (!found)
            return;
        mem_release(&a);
    }
}

/* ---- entry points ---- */

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
