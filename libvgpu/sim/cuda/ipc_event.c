/*
 * ipc_event.c - interprocess events: cuIpcGetEventHandle,
 * cuIpcOpenEventHandle, and the page behind such an event, which events
 * (stream.c) record on and wait on through ipc_event.h.
 *
 * An event created with CU_EVENT_INTERPROCESS has a page, on a memfd, that
 * counts its records and their completions: a record adds one to `recorded`
 * at once and queues the completion behind the work before it (a host
 * function that sets `completed`). cuIpcGetEventHandle names the exporter's
 * fd; cuIpcOpenEventHandle maps it in another process (through /proc, as
 * ipc.c does memory), where querying, synchronising and cuStreamWaitEvent see
 * the exporter's records, and a record there counts on the same page. A wait
 * gives up if the process that recorded is gone. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "context.h"
#include "exec.h"
#include "init.h"
#include "ipc_event.h"

#define IPC_EVENT_MAGIC 0x45504956u /* "VIPE" */
#define IPC_EVENT_NAME "/memfd:vgpu-sim-ipc-event"

struct ipc_event_shared {
    uint64_t recorded;   /* records made, by any process */
    uint64_t completed;  /* the highest record whose work is done */
    int32_t pid;         /* the process that recorded last */
    uint32_t pad;
};

struct ipc_event_page {
    volatile struct ipc_event_shared *shm;
    int fd;              /* the exporter's memfd (-1 in an importer) */
    int refs;            /* the event, and each completion still queued */
};

struct ipc_event_handle {
    uint32_t magic;
    int32_t pid;
    int32_t fd;
    uint32_t pad;
    uint64_t start_time;
};

_Static_assert(sizeof(struct ipc_event_handle) <= sizeof(CUipcEventHandle), "handle size");

static pthread_mutex_t g_ipc_ev_lock = PTHREAD_MUTEX_INITIALIZER;

void cu_ipc_event_put(struct ipc_event_page *p)
{
    if (!p)
        return;
    pthread_mutex_lock(&g_ipc_ev_lock);
    int last = --p->refs == 0;
    pthread_mutex_unlock(&g_ipc_ev_lock);
    if (!last)
        return;
    munmap((void *)p->shm, sizeof *p->shm);
    if (p->fd >= 0)
        close(p->fd);
    free(p);
}

static struct ipc_event_page *ipc_page_map(int fd, int own)
{
    void *m = mmap(NULL, sizeof(struct ipc_event_shared), PROT_READ | PROT_WRITE, MAP_SHARED,
                   fd, 0);
    if (m == MAP_FAILED)
        return NULL;
    struct ipc_event_page *p = calloc(1, sizeof *p);
    if (!p) {
        munmap(m, sizeof(struct ipc_event_shared));
        return NULL;
    }
    p->shm = m;
    p->fd = own ? fd : -1;
    p->refs = 1;
    return p;
}

uint64_t cu_ipc_event_recorded(struct ipc_event_page *p)
{
    return __atomic_load_n(&p->shm->recorded, __ATOMIC_ACQUIRE);
}

int cu_ipc_event_done(struct ipc_event_page *p, uint64_t gen)
{
    return __atomic_load_n(&p->shm->completed, __ATOMIC_ACQUIRE) >= gen;
}

static int pid_alive(int pid)
{
    return pid <= 0 || kill(pid, 0) == 0 || errno == EPERM;
}

/* Wait until record `gen` is complete, or its recorder is gone. */
void cu_ipc_event_wait(struct ipc_event_page *p, uint64_t gen)
{
    unsigned us = 20;
    while (!cu_ipc_event_done(p, gen)) {
        if (!pid_alive(__atomic_load_n(&p->shm->pid, __ATOMIC_RELAXED)))
            return;
        usleep(us);
        if (us < 2000)
            us *= 2;
    }
}

struct ipc_completion {
    struct ipc_event_page *page;
    uint64_t gen;
};

static void ipc_complete(void *arg)
{
    struct ipc_completion *c = arg;
    volatile struct ipc_event_shared *shm = c->page->shm;
    uint64_t cur = __atomic_load_n(&shm->completed, __ATOMIC_RELAXED);
    while (cur < c->gen &&
           !__atomic_compare_exchange_n(&shm->completed, &cur, c->gen, 0, __ATOMIC_RELEASE,
                                        __ATOMIC_RELAXED))
        ;
    cu_ipc_event_put(c->page);
    free(c);
}

static void ipc_await(void *arg)
{
    struct ipc_completion *c = arg;
    cu_ipc_event_wait(c->page, c->gen);
    cu_ipc_event_put(c->page);
    free(c);
}

/* Queue fn(page, gen) behind the stream's work, holding a reference. */
static CUresult ipc_queue(CUcontext ctx, CUstream s, struct ipc_event_page *p, uint64_t gen,
                          void (*fn)(void *))
{
    struct ipc_completion *c = malloc(sizeof *c);
    if (!c)
        return CUDA_ERROR_OUT_OF_MEMORY;
    pthread_mutex_lock(&g_ipc_ev_lock);
    p->refs++;
    pthread_mutex_unlock(&g_ipc_ev_lock);
    c->page = p;
    c->gen = gen;
    exec_host_fn(ctx, s, fn, c);
    return CUDA_SUCCESS;
}

CUresult cu_ipc_event_record(CUcontext ctx, CUstream s, struct ipc_event_page *p)
{
    __atomic_store_n(&p->shm->pid, (int32_t)getpid(), __ATOMIC_RELAXED);
    uint64_t gen = __atomic_add_fetch(&p->shm->recorded, 1, __ATOMIC_ACQ_REL);
    return ipc_queue(ctx, s, p, gen, ipc_complete);
}

CUresult cu_ipc_event_queue_wait(CUcontext ctx, CUstream s, struct ipc_event_page *p)
{
    uint64_t gen = cu_ipc_event_recorded(p);
    if (cu_ipc_event_done(p, gen))
        return CUDA_SUCCESS;
    return ipc_queue(ctx, s, p, gen, ipc_await);
}

VGPU_EXPORT CUresult cuIpcGetEventHandle(CUipcEventHandle *handle, CUevent e)
{
    if (!cu_initialized)
        return CUDA_ERROR_NOT_INITIALIZED;
    if (!handle)
        return CUDA_ERROR_INVALID_VALUE;
    CHECK_HANDLE(e, MAGIC_EVENT);
    if (!(e->flags & CU_EVENT_INTERPROCESS))
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&g_ipc_ev_lock);
    if (!e->ipc) {
        int fd = memfd_create("vgpu-sim-ipc-event", MFD_CLOEXEC);
        if (fd >= 0 && ftruncate(fd, sizeof(struct ipc_event_shared)) == 0)
            e->ipc = ipc_page_map(fd, 1);
        if (!e->ipc && fd >= 0)
            close(fd);
    }
    struct ipc_event_page *p = e->ipc;
    pthread_mutex_unlock(&g_ipc_ev_lock);
    if (!p)
        return CUDA_ERROR_MAP_FAILED;
    if (p->fd < 0)
        return CUDA_ERROR_INVALID_VALUE; /* an event opened from another process */
    struct ipc_event_handle h = {.magic = IPC_EVENT_MAGIC, .pid = (int32_t)getpid(),
                                 .fd = p->fd, .start_time = sim_proc_start_time((int)getpid())};
    memset(handle, 0, sizeof *handle);
    memcpy(handle, &h, sizeof h);
    return CUDA_SUCCESS;
}

VGPU_EXPORT CUresult cuIpcOpenEventHandle(CUevent *pe, CUipcEventHandle handle)
{
    CURRENT_CONTEXT(ctx);
    if (!pe)
        return CUDA_ERROR_INVALID_VALUE;
    struct ipc_event_handle h;
    memcpy(&h, &handle, sizeof h);
    if (h.magic != IPC_EVENT_MAGIC || h.pid <= 0 || h.fd < 0)
        return CUDA_ERROR_INVALID_VALUE;
    if (h.pid == (int32_t)getpid())
        return CUDA_ERROR_INVALID_CONTEXT;
    if (sim_proc_start_time(h.pid) != h.start_time)
        return CUDA_ERROR_INVALID_HANDLE;
    char path[64], link[128];
    snprintf(path, sizeof path, "/proc/%d/fd/%d", h.pid, h.fd);
    ssize_t n = readlink(path, link, sizeof link - 1);
    if (n <= 0)
        return CUDA_ERROR_INVALID_HANDLE;
    link[n] = '\0';
    if (strncmp(link, IPC_EVENT_NAME, strlen(IPC_EVENT_NAME)) != 0)
        return CUDA_ERROR_INVALID_HANDLE;
    int fd = open(path, O_RDWR | O_CLOEXEC);
    if (fd < 0)
        return CUDA_ERROR_INVALID_HANDLE;
    struct stat st;
    struct ipc_event_page *p = NULL;
    if (fstat(fd, &st) == 0 && (size_t)st.st_size >= sizeof(struct ipc_event_shared))
        p = ipc_page_map(fd, 0);
    close(fd);
    if (!p)
        return CUDA_ERROR_MAP_FAILED;
    struct CUevent_st *e = cu_obj_new(sizeof *e, MAGIC_EVENT);
    if (!e) {
        cu_ipc_event_put(p);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    e->ctx = ctx;
    e->flags = CU_EVENT_INTERPROCESS | CU_EVENT_DISABLE_TIMING;
    e->ipc = p;
    *pe = e;
    return CUDA_SUCCESS;
}
