/*
 * vmm.c - virtual memory management (cuMemCreate / cuMemAddressReserve /
 * cuMemMap, as PyTorch's expandable segments use): physical allocation
 * handles, shareable as file descriptors, and reserved address ranges they
 * are mapped into. CUDA arrays are array.c's, stream-ordered pools pool.c's.
 *
 * A cuMemCreate handle is a memfd, so mapping one handle at two addresses
 * shows the same bytes at both, as on the device.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "alloctab.h"
#include "gate.h"
#include "init.h"

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
