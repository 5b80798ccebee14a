/*
 * handle.h - the simulated driver's process-local objects (contexts,
 * streams, events, modules, functions) and the handle objects they live in
 * (handle.c). The lowest layer of cuda/, with init.h: see docs/simulator.md
 * for the order the driver's files build on each other.
 */
#ifndef VGPU_SIM_CUDA_HANDLE_H
#define VGPU_SIM_CUDA_HANDLE_H

#include <pthread.h>
#include <stddef.h>
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
    int ordinal;          /* device as the process sees it: its GPU is
                             cu_phys[ordinal] (init.h), which a restore onto
                             another GPU changes */
    int primary;
    int refcount;         /* primary: retains; created: 1 */
    int reset_owed;       /* primary: retains a reset destroyed, still to release */
    int reset;            /* primary: destroyed by a reset, not retained since */
    unsigned int flags;
    unsigned long long id;
    uint64_t last_seq;    /* last operation queued in this context */
    uint64_t mem;         /* device memory the context costs */
};

/* A capture sequence (stream.c, capture.c): the graph that stream capture
 * records into, begun on one stream (its origin), which other streams join
 * by waiting on an event recorded in it. All of it under cu_capture_lock. */
struct capture {
    CUgraph graph;
    int own_graph;          /* made by cuStreamBeginCapture (not ...ToGraph) */
    unsigned long long id;
    int mode;               /* CU_STREAM_CAPTURE_MODE_* */
    int invalidated;        /* an operation not permitted during capture */
    CUcontext ctx;
    CUstream origin;
    CUstream *streams;      /* the streams in it, the origin included */
    int members, streams_cap;
    int blocking;           /* members that synchronise with the legacy stream */
    struct capture *next;   /* the process's active sequences */
};

struct CUstream_st {
    uint32_t magic;
    CUcontext ctx;
    unsigned int flags;
    int priority;
    unsigned long long id;
    uint64_t last_seq;
    /* stream capture: the sequence this stream records into, or NULL, and
     * the nodes the next captured one depends on */
    struct capture *capture;
    CUgraphNode *deps;
    size_t ndeps, deps_cap;
    unsigned char (*attrs)[64]; /* cuStreamSetAttribute's values, by id */
};

struct CUevent_st {
    uint32_t magic;
    CUcontext ctx;
    unsigned int flags;
    int recorded;
    uint64_t seq;         /* the record operation */
    uint64_t time_ns;     /* when it executed */
    /* last recorded in a capturing stream: that sequence (NULL: not) and
     * the nodes it stands for */
    struct capture *capture;
    unsigned long long capture_id;
    CUgraphNode *cap_deps;
    size_t cap_ndeps;
    /* an interprocess event (ipc_event.c): the page its records and their
     * completions are counted in, shared with other processes */
    struct ipc_event_page *ipc;
};

struct vgpu_param {
    unsigned int offset;
    unsigned int size;
};

struct CUfunc_st {
    uint32_t magic;
    CUmodule mod;
    char name[4096];      /* C++ template kernels have long mangled names */
    int nparams;
    struct vgpu_param params[64];
    int spin;             /* name starts with vgpu_spin: duration from param 0 */
    /* what the launches before cuLaunchKernel use (launch.c): the block
     * shape, shared memory and parameters set on the function */
    unsigned int legacy_block[3];
    unsigned int legacy_shared;
    unsigned int legacy_param_size;
    unsigned char legacy_params[4096];
};

struct module_global;
struct image_var;

struct CUmod_st {
    uint32_t magic;
    CUcontext ctx;
    int nfuncs;
    struct CUfunc_st *funcs;
    CUlibrary lib;
    /* open: an image that could not be read (a compressed fatbin, the
     * runtime's fatbin wrapper): every name asked for is a function of it,
     * made on first use, as the runtime only asks for names it registered. */
    int open;
    int nextra;
    struct CUfunc_st **extra;
    struct module_global *globals; /* __device__ variables, made on first use */
    struct image_var *vars;        /* the variables the image declares (image.h) */
    int nvars;
};

/* What an explicit synchronisation (cuCtxSynchronize, cuStreamSynchronize,
 * cuEventSynchronize) does besides waiting, once the work is done: set by
 * pool.c (pools give back their spare reserve), NULL until then. */
extern void (*volatile cu_on_sync)(void);

/* Guards every capture sequence and the capture fields of streams and
 * events. */
extern pthread_mutex_t cu_capture_lock;
/* The process's active capture sequences (under cu_capture_lock). */
extern struct capture *cu_captures;

/* Handle objects: never returned to malloc, so a stale handle's magic can
 * always be read; a destroyed object's memory is reused for a new one. */
void *cu_obj_new(size_t size, uint32_t magic);
void cu_obj_del(void *p, size_t size);
int cu_obj_is(const void *p, uint32_t magic);

/* Return CUDA_ERROR_INVALID_HANDLE unless h is a live object of `magic`. */
#define CHECK_HANDLE(h, magic)                     \
    do {                                           \
        if (!cu_obj_is(h, magic))                  \
            return CUDA_ERROR_INVALID_HANDLE;      \
    } while (0)

#endif /* VGPU_SIM_CUDA_HANDLE_H */
