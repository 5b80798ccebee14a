/*
 * alloctab.c - the allocation table: every range the simulated driver handed
 * out (device, managed, host, registered, arrays, address reservations),
 * sorted by address, with what it charged on which device.
 *
 * A device pointer is the address of a lazily backed host mapping
 * (MAP_NORESERVE), so copies and memsets work on it; the table tells valid
 * pointers from bad ones. Device memory is charged in whole 2 MiB granules.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "alloctab.h"
#include "gate.h"
#include "init.h"

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
    GATE_BRACKET;
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
    GATE_BRACKET;
    if (size == 0)
        return CUDA_ERROR_INVALID_VALUE;
    struct alloc a = {.size = size, .phys = cu_phys[ctx->ordinal], .kind = kind, .flags = flags, .ctx = ctx};
    a.charged = charged_kind(kind) ? mem_round(size) : 0;
    if (a.charged && sim_charge(cu_phys[ctx->ordinal], a.charged, 1) < 0)
        return CUDA_ERROR_OUT_OF_MEMORY;
    a.mapped = page_round(size);
    void *p = mmap(NULL, a.mapped, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) {
        if (a.charged)
            sim_uncharge(cu_phys[ctx->ordinal], a.charged);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    a.base = (uintptr_t)p;
    if (mem_register(&a) < 0) {
        munmap(p, a.mapped);
        if (a.charged)
            sim_uncharge(cu_phys[ctx->ordinal], a.charged);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    *out = a.base;
    return CUDA_SUCCESS;
}

void mem_release(const struct alloc *a)
{
    GATE_BRACKET;
    if (a->kind != ALLOC_REGISTERED && a->mapped)
        munmap((void *)a->base, a->mapped);
    if (a->shared)
        close(a->memfd);
    /* its context's GPU now: a restore may have moved it since it was taken out */
    if (a->charged)
        sim_uncharge(a->ctx ? cu_phys[a->ctx->ordinal] : a->phys, a->charged);
}

/* Copy the pages of [p, p + n) that were ever touched (the rest read as
 * zeros either way) to the same offsets of fd. */
static int copy_resident(const unsigned char *p, size_t n, int fd)
{
    size_t pg = (size_t)sysconf(_SC_PAGESIZE);
    size_t pages = n / pg;
    unsigned char *vec = malloc(pages ? pages : 1);
    if (!vec)
        return -1;
    int rc = mincore((void *)p, n, vec);
    for (size_t i = 0; rc == 0 && i < pages; i++) {
        if (!(vec[i] & 1))
            continue;
        const unsigned char *src = p + i * pg;
        size_t off = 0;
        while (off < pg) {
            ssize_t w = pwrite(fd, src + off, pg - off, (off_t)(i * pg + off));
            if (w <= 0) {
                rc = -1;
                break;
            }
            off += (size_t)w;
        }
    }
    free(vec);
    return rc;
}

int mem_share(uintptr_t base)
{
    pthread_mutex_lock(&g_mem_lock);
    size_t i = upper(base);
    struct alloc *a = i > 0 && g_tab[i - 1].base == base ? &g_tab[i - 1] : NULL;
    int fd = -1;
    if (a && a->shared) {
        fd = a->memfd;
    } else if (a) {
        fd = memfd_create("vgpu-sim-ipc", MFD_CLOEXEC);
        if (fd >= 0 && (ftruncate(fd, (off_t)a->mapped) != 0 ||
                        copy_resident((const unsigned char *)a->base, a->mapped, fd) != 0 ||
                        mmap((void *)a->base, a->mapped, PROT_READ | PROT_WRITE,
                             MAP_SHARED | MAP_FIXED, fd, 0) == MAP_FAILED)) {
            close(fd);
            fd = -1;
        }
        if (fd >= 0) {
            a->shared = 1;
            a->memfd = fd;
        }
    }
    pthread_mutex_unlock(&g_mem_lock);
    return fd;
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
    GATE_BRACKET;
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
    GATE_BRACKET;
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

/* ---- what the checkpoint API asks of the table (checkpoint.c) ----
 * Called by the restore thread while the process is locked: no bracket is
 * in flight, so the table holds still. */

int mem_has_kind(int kind)
{
    int found = 0;
    pthread_mutex_lock(&g_mem_lock);
    for (size_t i = 0; i < g_n && !found; i++)
        found = g_tab[i].kind == kind;
    pthread_mutex_unlock(&g_mem_lock);
    return found;
}

int mem_has_shared(void)
{
    int found = 0;
    pthread_mutex_lock(&g_mem_lock);
    for (size_t i = 0; i < g_n && !found; i++)
        found = g_tab[i].shared;
    pthread_mutex_unlock(&g_mem_lock);
    return found;
}

static int device_kind(int kind)
{
    return kind == ALLOC_DEVICE || kind == ALLOC_POOL || kind == ALLOC_ARRAY;
}

void mem_protect_device(int off)
{
    pthread_mutex_lock(&g_mem_lock);
    for (size_t i = 0; i < g_n; i++)
        if (device_kind(g_tab[i].kind) && g_tab[i].mapped)
            mprotect((void *)g_tab[i].base, g_tab[i].mapped,
                     off ? PROT_NONE : PROT_READ | PROT_WRITE);
    pthread_mutex_unlock(&g_mem_lock);
}

void mem_remap(const int map[VGPU_SIM_MAX_DEVICES])
{
    pthread_mutex_lock(&g_mem_lock);
    for (size_t i = 0; i < g_n; i++)
        if (g_tab[i].phys >= 0 && g_tab[i].phys < VGPU_SIM_MAX_DEVICES)
            g_tab[i].phys = map[g_tab[i].phys];
    pthread_mutex_unlock(&g_mem_lock);
}
