/*
 * handle.h - the simulated driver API's process-local objects (contexts,
 * streams, events, modules, functions) and the helpers the driver's files
 * share.
 */
#ifndef VGPU_SIM_CUDA_HANDLE_H
#define VGPU_SIM_CUDA_HANDLE_H

#include <pthread.h>
#include <stdint.h>

#include "common/sim.h"
#include "vgpu/cuda_types.h"

/* Per-thread variants (_ptsz/_ptds) behave as the legacy ones here: every
 * stream of a process executes in one in-order queue, so the default streams
 * need no separate semantics. They are exported as aliases (VGPU_ALIAS) of
 * the legacy entry point, defined next to it. */

/* Handle magics: a handle whose magic does not match is invalid. */
#define MAGIC_CTX 0x56435458u
#define MAGIC_STREAM 0x56535452u
#define MAGIC_EVENT 0x56455654u
#define MAGIC_MODULE 0x564d4f44u
#define MAGIC_FUNC 0x5646554eu
#define MAGIC_LIBRARY 0x564c4942u
#define MAGIC_GRAPH 0x56475250u
#define MAGIC_GEXEC 0x56474558u
#define MAGIC_POOL 0x56504f4cu
#define MAGIC_ARRAY 0x56415252u
#define DEAD 0xdeadu

struct CUctx_st {
    uint32_t magic;
    int ordinal;          /* device as the process sees it */
    int phys;             /* physical simulated GPU */
    int primary;
    int refcount;         /* primary: retains; created: 1 */
    unsigned int flags;
    unsigned long long id;
    uint64_t last_seq;    /* last operation queued in this context */
    uint64_t mem;         /* device memory the context costs */
};

struct CUstream_st {
    uint32_t magic;
    CUcontext ctx;
    unsigned int flags;
    int priority;
    unsigned long long id;
    uint64_t last_seq;
};

struct CUevent_st {
    uint32_t magic;
    CUcontext ctx;
    unsigned int flags;
    int recorded;
    uint64_t seq;         /* the record operation */
    uint64_t time_ns;     /* when it executed */
};

struct vgpu_param {
    unsigned int offset;
    unsigned int size;
};

struct CUfunc_st {
    uint32_t magic;
    CUmodule mod;
    char name[256];
    int nparams;
    struct vgpu_param params[64];
    int spin;             /* name starts with vgpu_spin: duration from param 0 */
};

struct CUmod_st {
    uint32_t magic;
    CUcontext ctx;
    int nfuncs;
    struct CUfunc_st *funcs;
    CUlibrary lib;
};

/* ---- init.c ---- */
extern int cu_initialized;
extern int cu_count;                       /* visible devices */
extern int cu_phys[VGPU_SIM_MAX_DEVICES];  /* ordinal -> physical GPU */
extern pthread_mutex_t cu_lock;            /* guards the process-local objects */

CUresult cu_check_device(CUdevice dev);    /* NOT_INITIALIZED / INVALID_DEVICE */

/* ---- context.c ---- */
/* Handle objects: never returned to malloc, so a stale handle's magic can
 * always be read; a destroyed object's memory is reused for a new one. */
void *cu_obj_new(size_t size, uint32_t magic);
void cu_obj_del(void *p, size_t size);
int cu_obj_is(const void *p, uint32_t magic);

/* The calling thread's current context, or NOT_INITIALIZED/INVALID_CONTEXT. */
CUresult cu_current(CUcontext *ctx);
int cu_ctx_valid(CUcontext ctx);
uint64_t cu_ctx_mem_cost(void);

/* ---- exec.c: the in-order queue and its worker ---- */
/* Resolve a stream handle (0, CU_STREAM_LEGACY, CU_STREAM_PER_THREAD or a
 * stream) against the current context. */
CUresult cu_stream_resolve(CUstream h, CUcontext *ctx, CUstream *stream);
uint64_t exec_kernel(CUcontext ctx, CUstream s, uint64_t ns);
uint64_t exec_event(CUcontext ctx, CUstream s, CUevent e);
uint64_t exec_host_fn(CUcontext ctx, CUstream s, void (*fn)(void *), void *data);
void exec_wait(uint64_t seq);
int exec_done(uint64_t seq);
/* Wait for everything queued in ctx (or in the process when ctx is NULL). */
void exec_sync_ctx(CUcontext ctx);

/* ---- memory.c ---- */
enum alloc_kind {
    ALLOC_DEVICE = 1,
    ALLOC_MANAGED,
    ALLOC_HOST,       /* page-locked host memory: no device memory */
    ALLOC_REGISTERED, /* cuMemHostRegister: the caller's memory */
    ALLOC_ARRAY,
    ALLOC_VA,         /* cuMemAddressReserve */
};

struct alloc {
    uintptr_t base;
    size_t size;          /* as requested */
    size_t mapped;        /* bytes mapped at base */
    uint64_t charged;     /* device memory charged */
    int phys;
    int kind;
    unsigned int flags;
    CUcontext ctx;
    void *pool;           /* cuMemAllocFromPoolAsync: its pool */
};

/* Reserve device memory and address space; the error the driver gives. */
CUresult mem_alloc(CUcontext ctx, size_t size, int kind, unsigned int flags, uintptr_t *out);
CUresult mem_free(uintptr_t ptr, int kind);
/* Add an entry made elsewhere (registered host memory, VA reservations). */
int mem_register(const struct alloc *a);
/* Remove the entry starting exactly at ptr if it is of `kind`; 0 on success. */
int mem_take(uintptr_t ptr, int kind, struct alloc *out);
/* Unmap and uncharge an entry taken out of the table. */
void mem_release(const struct alloc *a);
void mem_set_pool(uintptr_t ptr, void *pool);

/* ---- vmm.c ---- */
/* A CUDA array's backing memory: base, bytes per row and rows; -1 if invalid. */
int cu_array_span(CUarray a, uintptr_t *base, size_t *row, size_t *rows);
/* The allocation holding [p, p + len); 0 if none. Copies *a out. */
int mem_find(uintptr_t p, size_t len, struct alloc *a);
/* Free every allocation of ctx (its destruction). */
void mem_free_ctx(CUcontext ctx);
uint64_t mem_round(uint64_t bytes);

#endif /* VGPU_SIM_CUDA_HANDLE_H */
