/*
 * ipc.c - CUDA IPC of device memory: cuIpcGetMemHandle, cuIpcOpenMemHandle,
 * cuIpcCloseMemHandle (event handles are ipc_event.c's).
 *
 * A device pointer here is the address of a host mapping (alloctab.c), so
 * sharing an allocation with another process is sharing its pages: the
 * first export moves the allocation onto a memfd (its bytes kept, at the same
 * address), and the handle names the exporting process and that fd, which
 * the opening process maps through /proc/<pid>/fd (the kernel decides who
 * may: the exporter's own user, as for any process's fds). What one side
 * writes, the other reads. The memory stays charged to the exporter, as the
 * driver counts it.
 *
 * As the driver documents: only cuMemAlloc's memory can be exported
 * (stream-ordered pools have their own export, not simulated); a handle is
 * opened once per context, later opens counting references and returning
 * the same address; a process can't open its own handles
 * (CUDA_ERROR_INVALID_CONTEXT); a handle that names nothing alive is
 * CUDA_ERROR_INVALID_HANDLE.
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "alloctab.h"
#include "context.h"
#include "init.h"

#define IPC_MAGIC 0x43504956u /* "VIPC" */
#define IPC_VERSION 1
#define IPC_MEMFD_NAME "/memfd:vgpu-sim-ipc"

/* The 64 bytes of a CUipcMemHandle. */
struct ipc_mem {
    uint32_t magic;
    uint16_t version;
    uint16_t pad;
    int32_t pid;
    int32_t fd;
    uint64_t start_time;  /* the exporter's, to tell a reused pid */
    uint64_t base;        /* the allocation, in the exporter */
    uint64_t size;        /* bytes mapped */
    int32_t phys;         /* its physical GPU */
    uint32_t pad2;
    uint64_t reserved[1];
};

_Static_assert(sizeof(struct ipc_mem) <= 64, "a CUipcMemHandle holds 64 bytes");

/* What this process opened: one mapping per (handle, context). */
struct opened {
    struct ipc_mem h;
    CUcontext ctx;
    uintptr_t ptr;
    int refs;
    struct opened *next;
};

static struct opened *g_opened;
static pthread_mutex_t g_ipc_lock = PTHREAD_MUTEX_INITIALIZER;

VGPU_EXPORT CUresult cuIpcGetMemHandle(CUipcMemHandle *handle, CUdeviceptr dptr)
{
    CURRENT_CONTEXT(ctx);
    if (!handle)
        return CUDA_ERROR_INVALID_VALUE;
    struct alloc a;
    if (!mem_find(dptr, 1, &a) || a.kind != ALLOC_DEVICE)
        return CUDA_ERROR_INVALID_VALUE;
    int fd = mem_share(a.base);
    if (fd < 0)
        return CUDA_ERROR_MAP_FAILED;
    struct ipc_mem h = {
        .magic = IPC_MAGIC, .version = IPC_VERSION, .pid = (int32_t)getpid(), .fd = fd,
        .start_time = sim_proc_start_time((int)getpid()), .base = a.base, .size = a.mapped,
        .phys = a.phys,
    };
    memset(handle, 0, sizeof *handle);
    memcpy(handle, &h, sizeof h);
    return CUDA_SUCCESS;
}

/* Map the exporter's memfd; the address, or 0. */
static uintptr_t map_remote(const struct ipc_mem *h, CUresult *rc)
{
    char path[64], link[128];
    snprintf(path, sizeof path, "/proc/%d/fd/%d", h->pid, h->fd);
    ssize_t n = readlink(path, link, sizeof link - 1);
    if (n <= 0) {
        *rc = CUDA_ERROR_INVALID_HANDLE;
        return 0;
    }
    link[n] = '\0';
    /* the fd must still be the simulator's memfd (not anything else the
     * exporter has open) */
    if (strncmp(link, IPC_MEMFD_NAME, strlen(IPC_MEMFD_NAME)) != 0) {
        *rc = CUDA_ERROR_INVALID_HANDLE;
        return 0;
    }
    int fd = open(path, O_RDWR | O_CLOEXEC);
    if (fd < 0) {
        *rc = CUDA_ERROR_INVALID_HANDLE;
        return 0;
    }
    struct stat st;
    void *p = MAP_FAILED;
    if (fstat(fd, &st) == 0 && (uint64_t)st.st_size >= h->size)
        p = mmap(NULL, h->size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd); /* the mapping keeps the pages */
    if (p == MAP_FAILED) {
        *rc = CUDA_ERROR_MAP_FAILED;
        return 0;
    }
    return (uintptr_t)p;
}

/* CUDA 4.1's entry point and CUDA 11's _v2 are the same call. */
VGPU_EXPORT CUresult cuIpcOpenMemHandle_v2(CUdeviceptr *pdptr, CUipcMemHandle handle,
                                           unsigned int flags)
{
    CURRENT_CONTEXT(ctx);
    CUresult rc = CUDA_SUCCESS;
    if (!pdptr || (flags & ~1u) /* CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS */)
        return CUDA_ERROR_INVALID_VALUE;
    struct ipc_mem h;
    memcpy(&h, &handle, sizeof h);
    if (h.magic != IPC_MAGIC || h.version != IPC_VERSION || h.size == 0 || h.pid <= 0 ||
        h.fd < 0 || h.size > (1ull << 48) || h.base == 0)
        return CUDA_ERROR_INVALID_VALUE;
    if (h.pid == (int32_t)getpid())
        return CUDA_ERROR_INVALID_CONTEXT; /* a process can't open its own */
    if (h.phys < 0 || h.phys >= VGPU_SIM_MAX_DEVICES)
        return CUDA_ERROR_INVALID_VALUE;
    if (sim_proc_start_time(h.pid) != h.start_time)
        return CUDA_ERROR_INVALID_HANDLE; /* the exporter is gone */
    pthread_mutex_lock(&g_ipc_lock);
    for (struct opened **pp = &g_opened; *pp;) {
        struct opened *o = *pp;
        struct alloc a;
        if (!mem_find(o->ptr, 1, &a) || a.kind != ALLOC_IPC || a.base != o->ptr) {
            *pp = o->next; /* unmapped with its context */
            free(o);
            continue;
        }
        pp = &o->next;
        if (o->ctx == ctx && memcmp(&o->h, &h, sizeof h) == 0) {
            o->refs++;
            *pdptr = o->ptr;
            pthread_mutex_unlock(&g_ipc_lock);
            return CUDA_SUCCESS;
        }
    }
    struct opened *o = calloc(1, sizeof *o);
    uintptr_t p = o ? map_remote(&h, &rc) : 0;
    if (!o)
        rc = CUDA_ERROR_OUT_OF_MEMORY;
    if (p) {
        struct alloc a = {.base = p, .size = h.size, .mapped = h.size, .phys = h.phys,
                          .kind = ALLOC_IPC, .ctx = ctx};
        if (mem_register(&a) < 0) {
            munmap((void *)p, h.size);
            p = 0;
            rc = CUDA_ERROR_OUT_OF_MEMORY;
        }
    }
    if (!p) {
        free(o);
        pthread_mutex_unlock(&g_ipc_lock);
        return rc;
    }
    o->h = h;
    o->ctx = ctx;
    o->ptr = p;
    o->refs = 1;
    o->next = g_opened;
    g_opened = o;
    *pdptr = p;
    pthread_mutex_unlock(&g_ipc_lock);
    return CUDA_SUCCESS;
}

VGPU_EXPORT CUresult cuIpcOpenMemHandle(CUdeviceptr *pdptr, CUipcMemHandle handle,
                                        unsigned int flags)
{
    return cuIpcOpenMemHandle_v2(pdptr, handle, flags);
}

VGPU_EXPORT CUresult cuIpcCloseMemHandle(CUdeviceptr dptr)
{
    CURRENT_CONTEXT(ctx);
    pthread_mutex_lock(&g_ipc_lock);
    struct opened **pp = &g_opened, *o = NULL;
    for (; *pp; pp = &(*pp)->next) {
        if ((*pp)->ptr == dptr) {
            o = *pp;
            break;
        }
    }
    if (!o) {
        pthread_mutex_unlock(&g_ipc_lock);
        return CUDA_ERROR_INVALID_VALUE;
    }
    if (--o->refs == 0) {
        *pp = o->next;
        struct alloc a;
        if (mem_take(dptr, ALLOC_IPC, &a) == 0)
            mem_release(&a); /* gone already if its context was destroyed */
        free(o);
    }
    pthread_mutex_unlock(&g_ipc_lock);
    return CUDA_SUCCESS;
}
