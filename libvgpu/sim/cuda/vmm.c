/*
 * vmm.c - the other ways to get device memory: CUDA arrays, virtual
 * memory management (cuMemCreate / cuMemAddressReserve / cuMemMap, as
 * PyTorch's expandable segments use) and stream-ordered pools
 * (cuMemAllocAsync and friends).
 *
 * A cuMemCreate handle is a memfd, so mapping one handle at two addresses
 * shows the same bytes at both, as on the device.
 */
#define _GNU_SOURCE
#include <stdlib.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "alloctab.h"
#include "gate.h"
#include "context.h"
#include "init.h"
#include "stream.h"
#include "vmm.h"
#include "vgpu/array.h"
#include "vgpu/size.h"

/* ---- arrays ---- */

struct CUarray_st {
    uint32_t magic;
    CUDA_ARRAY3D_DESCRIPTOR desc;
    uintptr_t base;
    size_t row;  /* bytes per row */
    size_t rows; /* height x depth */
};

int cu_array_span(CUarray a, uintptr_t *base, size_t *row, size_t *rows)
{
    if (!cu_obj_is(a, MAGIC_ARRAY))
        return -1;
    *base = a->base;
    *row = a->row;
    *rows = a->rows;
    return 0;
}

static CUresult array_create(CUarray *pa, const CUDA_ARRAY3D_DESCRIPTOR *d)
{
    CUcontext ctx;
    CUresult rc = cu_current(&ctx);
    if (rc)
        return rc;
    size_t fb = d ? vgpu_format_bytes(d->Format) : 0;
    if (!pa || !fb || d->Width == 0 ||
        (d->NumChannels != 1 && d->NumChannels != 2 && d->NumChannels != 4))
        return CUDA_ERROR_INVALID_VALUE;
    struct CUarray_st *a = cu_obj_new(sizeof *a, MAGIC_ARRAY);
    if (!a)
        return CUDA_ERROR_OUT_OF_MEMORY;
    a->desc = *d;
    a->row = d->Width * fb * d->NumChannels;
    a->rows = (d->Height ? d->Height : 1) * (d->Depth ? d->Depth : 1);
    rc = mem_alloc(ctx, a->row * a->rows, ALLOC_ARRAY, 0, &a->base);
    if (rc) {
        cu_obj_del(a, sizeof *a);
        return rc;
    }
    *pa = a;
    return CUDA_SUCCESS;
}

VGPU_EXPORT CUresult cuArrayCreate_v2(CUarray *pa, const CUDA_ARRAY_DESCRIPTOR *d)
{
    if (!d)
        return CUDA_ERROR_INVALID_VALUE;
    CUDA_ARRAY3D_DESCRIPTOR d3 = {d->Width, d->Height, 0, d->Format, d->NumChannels, 0};
    return array_create(pa, &d3);
}

VGPU_EXPORT CUresult cuArray3DCreate_v2(CUarray *pa, const CUDA_ARRAY3D_DESCRIPTOR *d)
{
    return array_create(pa, d);
}

VGPU_EXPORT CUresult cuArrayDestroy(CUarray a)
{
    if (!cu_initialized)
        return CUDA_ERROR_NOT_INITIALIZED;
    if (!cu_obj_is(a, MAGIC_ARRAY))
        return CUDA_ERROR_INVALID_HANDLE;
    mem_free(a->base, ALLOC_ARRAY);
    cu_obj_del(a, sizeof *a);
    return CUDA_SUCCESS;
}

VGPU_EXPORT CUresult cuArrayGetDescriptor_v2(CUDA_ARRAY_DESCRIPTOR *d, CUarray a)
{
    if (!cu_obj_is(a, MAGIC_ARRAY))
        return CUDA_ERROR_INVALID_HANDLE;
    if (!d)
        return CUDA_ERROR_INVALID_VALUE;
    *d = (CUDA_ARRAY_DESCRIPTOR){a->desc.Width, a->desc.Height, a->desc.Format,
                                 a->desc.NumChannels};
    return CUDA_SUCCESS;
}

VGPU_EXPORT CUresult cuArray3DGetDescriptor_v2(CUDA_ARRAY3D_DESCRIPTOR *d, CUarray a)
{
    if (!cu_obj_is(a, MAGIC_ARRAY))
        return CUDA_ERROR_INVALID_HANDLE;
    if (!d)
        return CUDA_ERROR_INVALID_VALUE;
    *d = a->desc;
    return CUDA_SUCCESS;
}

/* ---- virtual memory management ---- */

#define MAGIC_VMM 0x56564d4du

struct vmm_handle {
    uint32_t magic;
    int fd;
    size_t size;
    int phys;     /* its physical GPU; -1: host memory (not device memory) */
    int ordinal;  /* device memory: its device as the process sees it, whose GPU
                     (cu_phys[ordinal]) a restore onto another GPU changes */
    int refs; /* the handle itself, plus one per mapping */
    int imported; /* from a shareable handle: the exporter's memory, not charged here */
    CUmemAllocationProp prop;
};

/* The memfd behind a handle is named after where its memory is, so that a
 * process importing it (cuMemImportFromShareableHandle) knows: the
 * exporter's GPU, or host memory. */
#define VMM_MEMFD "vgpu-sim-vmm-"
#define VMM_MEMFD_HOST VMM_MEMFD "host"

struct vmm_map {
    uintptr_t base;
    size_t size;
    struct vmm_handle *h;
};

static struct vmm_map *g_maps;
static size_t g_nmaps, g_capmaps;
static pthread_mutex_t g_vmm_lock = PTHREAD_MUTEX_INITIALIZER;

static struct vmm_handle *handle_of(CUmemGenericAllocationHandle h)
{
    struct vmm_handle *p = (struct vmm_handle *)(uintptr_t)h;
    return cu_obj_is(p, MAGIC_VMM) ? p : NULL;
}

static void handle_unref(struct vmm_handle *h)
{
    if (--h->refs == 0) {
        close(h->fd);
        if (!h->imported && h->phys >= 0)
            sim_uncharge(cu_phys[h->ordinal], h->size);
        cu_obj_del(h, sizeof *h);
    }
}

/* Where an allocation's memory is: a device's (*phys its physical GPU) or,
 * since CUDA 12.2, host memory (*phys -1: page-locked host memory the
 * devices map, as NCCL's ncclCuMemHostEnable asks for; the simulated host
 * has one NUMA node, 0). */
static CUresult check_prop(const CUmemAllocationProp *prop, int *phys)
{
    if (!cu_initialized)
        return CUDA_ERROR_NOT_INITIALIZED;
    if (!prop || prop->type != CU_MEM_ALLOCATION_TYPE_PINNED)
        return CUDA_ERROR_INVALID_VALUE;
    switch ((int)prop->location.type) {
    case CU_MEM_LOCATION_TYPE_DEVICE:
        if (prop->location.id < 0 || prop->location.id >= cu_count)
            return CUDA_ERROR_INVALID_DEVICE;
        *phys = cu_phys[prop->location.id];
        return CUDA_SUCCESS;
    case CU_MEM_LOCATION_TYPE_HOST_NUMA:
        if (prop->location.id != 0)
            return CUDA_ERROR_INVALID_VALUE;
        /* fall through */
    case CU_MEM_LOCATION_TYPE_HOST:
    case CU_MEM_LOCATION_TYPE_HOST_NUMA_CURRENT:
        *phys = -1;
        return CUDA_SUCCESS;
    default:
        return CUDA_ERROR_INVALID_VALUE;
    }
}

VGPU_EXPORT CUresult cuMemGetAllocationGranularity(size_t *gran, const CUmemAllocationProp *prop,
                                                   CUmemAllocationGranularity_flags flags)
{
    int phys;
    CUresult rc = check_prop(prop, &phys);
    if (rc)
        return rc;
    if (!gran || (unsigned)flags > CU_MEM_ALLOC_GRANULARITY_RECOMMENDED)
        return CUDA_ERROR_INVALID_VALUE;
    *gran = SIM_GRANULARITY;
    return CUDA_SUCCESS;
}

VGPU_EXPORT CUresult cuMemCreate(CUmemGenericAllocationHandle *out, size_t size,
                                 const CUmemAllocationProp *prop, unsigned long long flags)
{
    GATE_BRACKET;
    int phys;
    CUresult rc = check_prop(prop, &phys);
    if (rc)
        return rc;
    if (!out || size == 0 || size % SIM_GRANULARITY || flags)
        return CUDA_ERROR_INVALID_VALUE;
    if (phys >= 0 && sim_charge(phys, size, 1) < 0)
        return CUDA_ERROR_OUT_OF_MEMORY;
    char name[64];
    if (phys >= 0)
        snprintf(name, sizeof name, VMM_MEMFD "%d", phys);
    else
        snprintf(name, sizeof name, VMM_MEMFD_HOST);
    int fd = memfd_create(name, MFD_CLOEXEC);
    if (fd < 0 || ftruncate(fd, (off_t)size) < 0) {
        if (fd >= 0)
            close(fd);
        if (phys >= 0)
            sim_uncharge(phys, size);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    struct vmm_handle *h = cu_obj_new(sizeof *h, MAGIC_VMM);
    h->fd = fd;
    h->size = size;
    h->phys = phys;
    h->ordinal = phys >= 0 ? prop->location.id : 0;
    h->refs = 1;
    h->prop = *prop;
    *out = (CUmemGenericAllocationHandle)(uintptr_t)h;
    return CUDA_SUCCESS;
}

VGPU_EXPORT CUresult cuMemRelease(CUmemGenericAllocationHandle handle)
{
    GATE_BRACKET;
    if (!cu_initialized)
        return CUDA_ERROR_NOT_INITIALIZED;
    pthread_mutex_lock(&g_vmm_lock);
    struct vmm_handle *h = handle_of(handle);
    if (h)
        handle_unref(h);
    pthread_mutex_unlock(&g_vmm_lock);
    return h ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

#define HANDLE_TYPE_POSIX_FD 1

/* A POSIX file descriptor for an allocation created to be shared that way
 * (requestedHandleTypes); another process maps the same memory with it. */
VGPU_EXPORT CUresult cuMemExportToShareableHandle(void *out, CUmemGenericAllocationHandle handle,
                                                  int type, unsigned long long flags)
{
    if (!cu_initialized)
        return CUDA_ERROR_NOT_INITIALIZED;
    if (!out || flags)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&g_vmm_lock);
    struct vmm_handle *h = handle_of(handle);
    CUresult rc = CUDA_SUCCESS;
    if (!h || type != HANDLE_TYPE_POSIX_FD ||
        !(h->prop.requestedHandleTypes & HANDLE_TYPE_POSIX_FD)) {
        rc = CUDA_ERROR_INVALID_VALUE;
    } else {
        int fd = dup(h->fd);
        if (fd < 0)
            rc = CUDA_ERROR_OUT_OF_MEMORY;
        else
            *(int *)out = fd;
    }
    pthread_mutex_unlock(&g_vmm_lock);
    return rc;
}

/* Where the memory behind a shareable fd is: its physical GPU, -1 for host
 * memory; -2 when the fd is no simulator allocation. */
static int shared_location(int fd)
{
    char path[64], link[128];
    snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
    ssize_t n = readlink(path, link, sizeof link - 1);
    if (n <= 0)
        return -2;
    link[n] = '\0';
    const char *prefix = "/memfd:" VMM_MEMFD;
    if (strncmp(link, prefix, strlen(prefix)) != 0)
        return -2;
    const char *rest = link + strlen(prefix);
    if (strncmp(rest, "host", 4) == 0)
        return -1;
    char *end;
    long phys = strtol(rest, &end, 10);
    if (end == rest || phys < 0 || phys >= VGPU_SIM_MAX_DEVICES)
        return -2;
    return (int)phys;
}

/* The memory another process exported (or this one): a handle of its own,
 * on the exporter's GPU, never charged again here. */
VGPU_EXPORT CUresult cuMemImportFromShareableHandle(CUmemGenericAllocationHandle *out, void *shared,
                                                    int type)
{
    if (!cu_initialized)
        return CUDA_ERROR_NOT_INITIALIZED;
    if (!out || type != HANDLE_TYPE_POSIX_FD)
        return CUDA_ERROR_INVALID_VALUE;
    int fd = dup((int)(intptr_t)shared);
    off_t size = fd >= 0 ? lseek(fd, 0, SEEK_END) : -1;
    int phys = fd >= 0 ? shared_location(fd) : -2;
    if (size <= 0 || size % SIM_GRANULARITY || phys == -2) {
        if (fd >= 0)
            close(fd);
        return CUDA_ERROR_INVALID_VALUE;
    }
    /* a GPU this process does not see is not one it can map memory of */
    int ordinal = phys >= 0 ? cu_ordinal_of(phys) : 0;
    if (ordinal < 0) {
        close(fd);
        return CUDA_ERROR_INVALID_DEVICE;
    }
    struct vmm_handle *h = cu_obj_new(sizeof *h, MAGIC_VMM);
    if (!h) {
        close(fd);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    h->fd = fd;
    h->size = (size_t)size;
    h->phys = phys;
    h->ordinal = ordinal;
    h->refs = 1;
    h->imported = 1;
    h->prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    h->prop.requestedHandleTypes = HANDLE_TYPE_POSIX_FD;
    h->prop.location.type = phys >= 0 ? CU_MEM_LOCATION_TYPE_DEVICE
                                      : CU_MEM_LOCATION_TYPE_HOST_NUMA;
    h->prop.location.id = ordinal;
    *out = (CUmemGenericAllocationHandle)(uintptr_t)h;
    return CUDA_SUCCESS;
}

VGPU_EXPORT CUresult cuMemAddressReserve(CUdeviceptr *ptr, size_t size, size_t align,
                                         CUdeviceptr addr, unsigned long long flags)
{
    (void)addr; /* a hint */
    if (!cu_initialized)
        return CUDA_ERROR_NOT_INITIALIZED;
    if (!ptr || size == 0 || size % SIM_GRANULARITY || flags || (align & (align - 1)))
        return CUDA_ERROR_INVALID_VALUE;
    if (align < SIM_GRANULARITY)
        align = SIM_GRANULARITY;
    size_t span = size + align;
    char *p = mmap(NULL, span, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED)
        return CUDA_ERROR_OUT_OF_MEMORY;
    uintptr_t base = ((uintptr_t)p + align - 1) & ~(uintptr_t)(align - 1);
    if (base > (uintptr_t)p)
        munmap(p, base - (uintptr_t)p);
    if ((uintptr_t)p + span > base + size)
        munmap((void *)(base + size), (uintptr_t)p + span - (base + size));
    struct alloc a = {.base = base, .size = size, .mapped = size, .kind = ALLOC_VA};
    if (mem_register(&a) < 0) {
        munmap((void *)base, size);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    *ptr = base;
    return CUDA_SUCCESS;
}

VGPU_EXPORT CUresult cuMemAddressFree(CUdeviceptr ptr, size_t size)
{
    if (!cu_initialized)
        return CUDA_ERROR_NOT_INITIALIZED;
    struct alloc a;
    if (mem_take(ptr, ALLOC_VA, &a) < 0)
        return CUDA_ERROR_INVALID_VALUE;
    if (a.size != size) {
        mem_register(&a);
        return CUDA_ERROR_INVALID_VALUE;
    }
    munmap((void *)a.base, a.size);
    return CUDA_SUCCESS;
}

VGPU_EXPORT CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t offset,
                              CUmemGenericAllocationHandle handle, unsigned long long flags)
{
    if (!cu_initialized)
        return CUDA_ERROR_NOT_INITIALIZED;
    struct alloc a;
    if (flags || size == 0 || !mem_find(ptr, size, &a) || a.kind != ALLOC_VA)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult rc = CUDA_SUCCESS;
    pthread_mutex_lock(&g_vmm_lock);
    struct vmm_handle *h = handle_of(handle);
    if (!h || offset > h->size || size > h->size - offset) {
        rc = CUDA_ERROR_INVALID_VALUE;
        goto out;
    }
    for (size_t i = 0; i < g_nmaps; i++) {
        if (ptr < g_maps[i].base + g_maps[i].size && g_maps[i].base < ptr + size) {
            rc = CUDA_ERROR_ALREADY_MAPPED;
            goto out;
        }
    }
    if (g_nmaps == g_capmaps) {
        size_t cap = g_capmaps ? g_capmaps * 2 : 64;
        struct vmm_map *m = realloc(g_maps, cap * sizeof *m);
        if (!m) {
            rc = CUDA_ERROR_OUT_OF_MEMORY;
            goto out;
        }
        g_maps = m;
        g_capmaps = cap;
    }
    if (mmap((void *)ptr, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, h->fd,
             (off_t)offset) == MAP_FAILED) {
        rc = CUDA_ERROR_OUT_OF_MEMORY;
        goto out;
    }
    g_maps[g_nmaps++] = (struct vmm_map){ptr, size, h};
    h->refs++;
out:
    pthread_mutex_unlock(&g_vmm_lock);
    return rc;
}

VGPU_EXPORT CUresult cuMemUnmap(CUdeviceptr ptr, size_t size)
{
    GATE_BRACKET;
    if (!cu_initialized)
        return CUDA_ERROR_NOT_INITIALIZED;
    int found = 0;
    pthread_mutex_lock(&g_vmm_lock);
    for (size_t i = 0; i < g_nmaps;) {
        struct vmm_map *m = &g_maps[i];
        if (m->base >= ptr && m->base + m->size <= ptr + size) {
            mmap((void *)m->base, m->size, PROT_NONE,
                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0);
            handle_unref(m->h);
            *m = g_maps[--g_nmaps];
            found = 1;
        } else {
            i++;
        }
    }
    pthread_mutex_unlock(&g_vmm_lock);
    return found ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

VGPU_EXPORT CUresult cuMemSetAccess(CUdeviceptr ptr, size_t size, const CUmemAccessDesc *desc,
                                    size_t count)
{
    if (!cu_initialized)
        return CUDA_ERROR_NOT_INITIALIZED;
    struct alloc a;
    if (!desc || count == 0 || !mem_find(ptr, size, &a) || a.kind != ALLOC_VA)
        return CUDA_ERROR_INVALID_VALUE;
    /* access by a device, or (CUDA 12.2: host-located memory) by the host */
    for (size_t i = 0; i < count; i++) {
        switch ((int)desc[i].location.type) {
        case CU_MEM_LOCATION_TYPE_DEVICE:
            if (desc[i].location.id < 0 || desc[i].location.id >= cu_count)
                return CUDA_ERROR_INVALID_DEVICE;
            break;
        case CU_MEM_LOCATION_TYPE_HOST_NUMA:
            if (desc[i].location.id != 0)
                return CUDA_ERROR_INVALID_VALUE;
            break;
        case CU_MEM_LOCATION_TYPE_HOST:
        case CU_MEM_LOCATION_TYPE_HOST_NUMA_CURRENT:
            break;
        default:
            return CUDA_ERROR_INVALID_DEVICE;
        }
    }
    return CUDA_SUCCESS;
}

VGPU_EXPORT CUresult cuMemGetAccess(unsigned long long *flags, const CUmemLocation *loc,
                                    CUdeviceptr ptr)
{
    if (!cu_initialized)
        return CUDA_ERROR_NOT_INITIALIZED;
    if (!flags || !loc || !mem_find(ptr, 1, NULL))
        return CUDA_ERROR_INVALID_VALUE;
    *flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    return CUDA_SUCCESS;
}

VGPU_EXPORT CUresult cuMemGetAllocationPropertiesFromHandle(CUmemAllocationProp *prop,
                                                            CUmemGenericAllocationHandle handle)
{
    struct vmm_handle *h = handle_of(handle);
    if (!h || !prop)
        return CUDA_ERROR_INVALID_VALUE;
    *prop = h->prop;
    return CUDA_SUCCESS;
}

VGPU_EXPORT CUresult cuMemRetainAllocationHandle(CUmemGenericAllocationHandle *out, void *addr)
{
    if (!out)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult rc = CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&g_vmm_lock);
    for (size_t i = 0; i < g_nmaps; i++) {
        if ((uintptr_t)addr >= g_maps[i].base &&
            (uintptr_t)addr < g_maps[i].base + g_maps[i].size) {
            g_maps[i].h->refs++;
            *out = (CUmemGenericAllocationHandle)(uintptr_t)g_maps[i].h;
            rc = CUDA_SUCCESS;
            break;
        }
    }
    pthread_mutex_unlock(&g_vmm_lock);
    return rc;
}

/* ---- stream-ordered pools ---- */

/* A pool holds device memory (its reserve, charged to the device) of which
 * its live allocations use part (`used`: their sizes, each rounded up to
 * POOL_ALIGN). An allocation is carved out of the spare reserve; when that is
 * short, the reserve grows by whole chunks (VGPU_SIM_POOL_CHUNK, 2 MiB by
 * default: the driver's chunk size is not documented, and it reserves "much
 * more than requested" for a small first allocation, as CuPy's tests put
 * it), so many small allocations share one chunk. A free returns its bytes to
 * the reserve; the reserve beyond the live allocations and the release
 * threshold (default 0) is given back to the device at the next explicit
 * synchronisation (cuCtxSynchronize, cuStreamSynchronize,
 * cuEventSynchronize), as the driver documents, or by cuMemPoolTrimTo. */
#define POOL_ALIGN 512u

struct CUmemPoolHandle_st {
    uint32_t magic;
    int ordinal;
    CUmemPoolProps props;
    int reuse[3];
    uint64_t threshold;
    uint64_t used, used_high;
    uint64_t reserved, reserved_high;
    struct CUmemPoolHandle_st *next; /* every pool of the process */
};

static struct CUmemPoolHandle_st *g_pools;

static uint64_t pool_chunk(void)
{
    static uint64_t chunk;
    if (!chunk) {
        uint64_t c = 0;
        const char *s = getenv("VGPU_SIM_POOL_CHUNK");
        if (!s || vgpu_parse_size(s, &c) != 0 || c == 0)
            c = SIM_GRANULARITY;
        chunk = mem_round(c);
    }
    return chunk;
}

static uint64_t pool_bytes(size_t size)
{
    return ((uint64_t)size + POOL_ALIGN - 1) / POOL_ALIGN * POOL_ALIGN;
}

/* Give reserve back to the device down to max(used, keep), in whole
 * chunks. Needs g_vmm_lock. */
static void pool_release(struct CUmemPoolHandle_st *p, uint64_t keep)
{
    uint64_t floor = p->used > keep ? p->used : keep;
    uint64_t chunk = pool_chunk();
    if (floor <= UINT64_MAX - chunk)
        floor = (floor + chunk - 1) / chunk * chunk;
    if (p->reserved > floor) {
        sim_uncharge(cu_phys[p->ordinal], p->reserved - floor);
        p->reserved = floor;
    }
}

static uint64_t sat_add(uint64_t a, uint64_t b)
{
    return a > UINT64_MAX - b ? UINT64_MAX : a + b;
}

/* An explicit synchronisation: every pool gives back its spare reserve
 * beyond its release threshold. */
static void pools_on_sync(void)
{
    pthread_mutex_lock(&g_vmm_lock);
    for (struct CUmemPoolHandle_st *p = g_pools; p; p = p->next)
        if (cu_obj_is(p, MAGIC_POOL))
            pool_release(p, sat_add(p->used, p->threshold));
    pthread_mutex_unlock(&g_vmm_lock);
}

void cu_pool_free(const struct alloc *a)
{
    GATE_BRACKET;
    struct CUmemPoolHandle_st *pool = a->pool;
    mem_release(a); /* unmaps: the pool's reserve holds the charge */
    if (!cu_obj_is(pool, MAGIC_POOL))
        return;
    pthread_mutex_lock(&g_vmm_lock);
    uint64_t n = pool_bytes(a->size);
    pool->used = pool->used > n ? pool->used - n : 0;
    pthread_mutex_unlock(&g_vmm_lock);
}

static struct CUmemPoolHandle_st *g_default_pool[VGPU_SIM_MAX_DEVICES];
static struct CUmemPoolHandle_st *g_current_pool[VGPU_SIM_MAX_DEVICES];

static struct CUmemPoolHandle_st *pool_new(int ordinal)
{
    struct CUmemPoolHandle_st *p = cu_obj_new(sizeof *p, MAGIC_POOL);
    p->ordinal = ordinal;
    p->next = g_pools; /* callers hold g_vmm_lock or are alone */
    g_pools = p;
    cu_on_sync = pools_on_sync;
    p->props.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
    p->props.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    p->props.location.id = ordinal;
    p->reuse[0] = p->reuse[1] = p->reuse[2] = 1;
    return p;
}

static struct CUmemPoolHandle_st *default_pool(int ordinal)
{
    pthread_mutex_lock(&g_vmm_lock);
    if (!g_default_pool[ordinal])
        g_default_pool[ordinal] = pool_new(ordinal);
    struct CUmemPoolHandle_st *p = g_current_pool[ordinal] ? g_current_pool[ordinal]
                                                           : g_default_pool[ordinal];
    pthread_mutex_unlock(&g_vmm_lock);
    return p;
}

VGPU_EXPORT CUresult cuDeviceGetDefaultMemPool(CUmemoryPool *pool, CUdevice dev)
{
    CUresult rc = cu_check_device(dev);
    if (rc)
        return rc;
    if (!pool)
        return CUDA_ERROR_INVALID_VALUE;
    default_pool(dev);
    *pool = g_default_pool[dev];
    return CUDA_SUCCESS;
}

VGPU_EXPORT CUresult cuDeviceGetMemPool(CUmemoryPool *pool, CUdevice dev)
{
    CUresult rc = cu_check_device(dev);
    if (rc)
        return rc;
    if (!pool)
        return CUDA_ERROR_INVALID_VALUE;
    *pool = default_pool(dev);
    return CUDA_SUCCESS;
}

VGPU_EXPORT CUresult cuDeviceSetMemPool(CUdevice dev, CUmemoryPool pool)
{
    CUresult rc = cu_check_device(dev);
    if (rc)
        return rc;
    if (!cu_obj_is(pool, MAGIC_POOL) || pool->ordinal != dev)
        return CUDA_ERROR_INVALID_VALUE;
    g_current_pool[dev] = pool;
    return CUDA_SUCCESS;
}

VGPU_EXPORT CUresult cuMemPoolCreate(CUmemoryPool *pool, const CUmemPoolProps *props)
{
    if (!cu_initialized)
        return CUDA_ERROR_NOT_INITIALIZED;
    if (!pool || !props || props->allocType != CU_MEM_ALLOCATION_TYPE_PINNED ||
        props->location.type != CU_MEM_LOCATION_TYPE_DEVICE)
        return CUDA_ERROR_INVALID_VALUE;
    if (props->location.id < 0 || props->location.id >= cu_count)
        return CUDA_ERROR_INVALID_DEVICE;
    pthread_mutex_lock(&g_vmm_lock);
    struct CUmemPoolHandle_st *p = pool_new(props->location.id);
    pthread_mutex_unlock(&g_vmm_lock);
    p->props = *props;
    *pool = p;
    return CUDA_SUCCESS;
}

VGPU_EXPORT CUresult cuMemPoolDestroy(CUmemoryPool pool)
{
    GATE_BRACKET;
    if (!cu_obj_is(pool, MAGIC_POOL) || pool == g_default_pool[pool->ordinal])
        return CUDA_ERROR_INVALID_VALUE;
    if (g_current_pool[pool->ordinal] == pool)
        g_current_pool[pool->ordinal] = NULL;
    pthread_mutex_lock(&g_vmm_lock);
    pool_release(pool, 0);
    if (pool->reserved) /* live allocations keep their memory until freed */
        sim_uncharge(cu_phys[pool->ordinal], pool->reserved);
    for (struct CUmemPoolHandle_st **q = &g_pools; *q; q = &(*q)->next) {
        if (*q == pool) {
            *q = pool->next;
            break;
        }
    }
    pthread_mutex_unlock(&g_vmm_lock);
    cu_obj_del(pool, sizeof *pool);
    return CUDA_SUCCESS;
}

VGPU_EXPORT CUresult cuMemPoolSetAttribute(CUmemoryPool pool, CUmemPool_attribute attr, void *value)
{
    GATE_BRACKET;
    if (!cu_obj_is(pool, MAGIC_POOL) || !value)
        return CUDA_ERROR_INVALID_VALUE;
    switch (attr) {
    case CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES:
    case CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC:
    case CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES:
        pool->reuse[attr - 1] = *(int *)value;
        return CUDA_SUCCESS;
    case CU_MEMPOOL_ATTR_RELEASE_THRESHOLD:
        pthread_mutex_lock(&g_vmm_lock);
        pool->threshold = *(cuuint64_t *)value;
        pthread_mutex_unlock(&g_vmm_lock);
        return CUDA_SUCCESS;
    case CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH:
        if (*(cuuint64_t *)value != 0)
            return CUDA_ERROR_INVALID_VALUE;
        pool->reserved_high = pool->reserved;
        return CUDA_SUCCESS;
    case CU_MEMPOOL_ATTR_USED_MEM_HIGH:
        if (*(cuuint64_t *)value != 0)
            return CUDA_ERROR_INVALID_VALUE;
        pool->used_high = pool->used;
        return CUDA_SUCCESS;
    default:
        return CUDA_ERROR_INVALID_VALUE;
    }
}

VGPU_EXPORT CUresult cuMemPoolGetAttribute(CUmemoryPool pool, CUmemPool_attribute attr, void *value)
{
    if (!cu_obj_is(pool, MAGIC_POOL) || !value)
        return CUDA_ERROR_INVALID_VALUE;
    switch (attr) {
    case CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES:
    case CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC:
    case CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES:
        *(int *)value = pool->reuse[attr - 1];
        return CUDA_SUCCESS;
    case CU_MEMPOOL_ATTR_RELEASE_THRESHOLD:
        *(cuuint64_t *)value = pool->threshold;
        return CUDA_SUCCESS;
    case CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT:
        *(cuuint64_t *)value = pool->reserved;
        return CUDA_SUCCESS;
    case CU_MEMPOOL_ATTR_USED_MEM_CURRENT:
        *(cuuint64_t *)value = pool->used;
        return CUDA_SUCCESS;
    case CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH:
        *(cuuint64_t *)value = pool->reserved_high;
        return CUDA_SUCCESS;
    case CU_MEMPOOL_ATTR_USED_MEM_HIGH:
        *(cuuint64_t *)value = pool->used_high;
        return CUDA_SUCCESS;
    default:
        return CUDA_ERROR_INVALID_VALUE;
    }
}

VGPU_EXPORT CUresult cuMemPoolTrimTo(CUmemoryPool pool, size_t keep)
{
    GATE_BRACKET;
    if (!cu_obj_is(pool, MAGIC_POOL))
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&g_vmm_lock);
    pool_release(pool, keep);
    pthread_mutex_unlock(&g_vmm_lock);
    return CUDA_SUCCESS;
}

VGPU_EXPORT CUresult cuMemPoolSetAccess(CUmemoryPool pool, const CUmemAccessDesc *desc, size_t n)
{
    (void)desc;
    (void)n;
    return cu_obj_is(pool, MAGIC_POOL) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

VGPU_EXPORT CUresult cuMemPoolGetAccess(CUmemAccess_flags *flags, CUmemoryPool pool,
                                        CUmemLocation *loc)
{
    if (!cu_obj_is(pool, MAGIC_POOL) || !flags || !loc)
        return CUDA_ERROR_INVALID_VALUE;
    *flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    return CUDA_SUCCESS;
}

VGPU_EXPORT CUresult cuMemAllocFromPoolAsync(CUdeviceptr *dptr, size_t size, CUmemoryPool pool,
                                             CUstream h)
{
    GATE_BRACKET;
    CUcontext ctx;
    CUstream s;
    CUresult rc = cu_stream_resolve(h, &ctx, &s);
    if (rc)
        return rc;
    if (!dptr || !cu_obj_is(pool, MAGIC_POOL))
        return CUDA_ERROR_INVALID_VALUE;
    if (size == 0)
        return CUDA_ERROR_INVALID_VALUE;
    /* free reserve first, then grow the reserve by whole chunks */
    uint64_t n = pool_bytes(size), chunk = pool_chunk();
    pthread_mutex_lock(&g_vmm_lock);
    uint64_t spare = pool->reserved > pool->used ? pool->reserved - pool->used : 0;
    uint64_t grow = n > spare ? (n - spare + chunk - 1) / chunk * chunk : 0;
    if (grow && sim_charge(cu_phys[pool->ordinal], grow, 1) < 0) {
        pthread_mutex_unlock(&g_vmm_lock);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    pool->reserved += grow;
    pool->used += n;
    if (pool->used > pool->used_high)
        pool->used_high = pool->used;
    if (pool->reserved > pool->reserved_high)
        pool->reserved_high = pool->reserved;
    pthread_mutex_unlock(&g_vmm_lock);
    uintptr_t p;
    rc = mem_alloc(ctx, size, ALLOC_POOL, 0, &p);
    if (rc) {
        pthread_mutex_lock(&g_vmm_lock);
        pool->used -= n;
        pthread_mutex_unlock(&g_vmm_lock);
        return rc;
    }
    mem_set_pool(p, pool);
    *dptr = p;
    return CUDA_SUCCESS;
}
VGPU_ALIAS(cuMemAllocFromPoolAsync, cuMemAllocFromPoolAsync_ptsz)

VGPU_EXPORT CUresult cuMemAllocAsync(CUdeviceptr *dptr, size_t size, CUstream h)
{
    CUcontext ctx;
    CUstream s;
    CUresult rc = cu_stream_resolve(h, &ctx, &s);
    if (rc)
        return rc;
    return cuMemAllocFromPoolAsync(dptr, size, default_pool(ctx->ordinal), h);
}
VGPU_ALIAS(cuMemAllocAsync, cuMemAllocAsync_ptsz)

VGPU_EXPORT CUresult cuMemFreeAsync(CUdeviceptr dptr, CUstream h)
{
    GATE_BRACKET;
    CUcontext ctx;
    CUstream s;
    CUresult rc = cu_stream_resolve(h, &ctx, &s);
    if (rc)
        return rc;
    struct alloc a;
    if (mem_take(dptr, ALLOC_POOL, &a) == 0) {
        cu_pool_free(&a);
        return CUDA_SUCCESS;
    }
    /* cuMemAlloc memory may be freed stream-ordered too */
    if (mem_take(dptr, ALLOC_DEVICE, &a) < 0)
        return CUDA_ERROR_INVALID_VALUE;
    mem_release(&a);
    return CUDA_SUCCESS;
}
VGPU_ALIAS(cuMemFreeAsync, cuMemFreeAsync_ptsz)

/* CUDA 13's pools by location: a device's, as cuDeviceGet(Default)MemPool
 * and cuDeviceSetMemPool answer; pools of host or managed memory are not
 * simulated. */
static CUresult device_location(const CUmemLocation *loc, int type, CUdevice *dev)
{
    if (!cu_initialized)
        return CUDA_ERROR_NOT_INITIALIZED;
    if (!loc)
        return CUDA_ERROR_INVALID_VALUE;
    if (loc->type != CU_MEM_LOCATION_TYPE_DEVICE || type != CU_MEM_ALLOCATION_TYPE_PINNED)
        return CUDA_ERROR_NOT_SUPPORTED;
    if (loc->id < 0 || loc->id >= cu_count)
        return CUDA_ERROR_INVALID_DEVICE;
    *dev = loc->id;
    return CUDA_SUCCESS;
}

VGPU_EXPORT CUresult cuMemGetDefaultMemPool(CUmemoryPool *pool, CUmemLocation *loc, int type)
{
    CUdevice dev;
    CUresult rc = device_location(loc, type, &dev);
    return rc ? rc : cuDeviceGetDefaultMemPool(pool, dev);
}

VGPU_EXPORT CUresult cuMemGetMemPool(CUmemoryPool *pool, CUmemLocation *loc, int type)
{
    CUdevice dev;
    CUresult rc = device_location(loc, type, &dev);
    return rc ? rc : cuDeviceGetMemPool(pool, dev);
}

VGPU_EXPORT CUresult cuMemSetMemPool(CUmemLocation *loc, int type, CUmemoryPool pool)
{
    CUdevice dev;
    CUresult rc = device_location(loc, type, &dev);
    return rc ? rc : cuDeviceSetMemPool(dev, pool);
}
