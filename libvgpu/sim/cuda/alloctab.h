/*
 * alloctab.h - the process's table of device, host and address-space
 * allocations (alloctab.c): what every pointer the driver handed out is, and
 * what it charged. Above handle.h; below contexts (destroying one frees its
 * allocations) and every entry point that allocates, frees or checks a
 * pointer.
 */
#ifndef VGPU_SIM_CUDA_ALLOCTAB_H
#define VGPU_SIM_CUDA_ALLOCTAB_H

#include <stddef.h>
#include <stdint.h>

#include "handle.h"

enum alloc_kind {
    ALLOC_DEVICE = 1,
    ALLOC_MANAGED,
    ALLOC_HOST,       /* page-locked host memory: no device memory */
    ALLOC_REGISTERED, /* cuMemHostRegister: the caller's memory */
    ALLOC_ARRAY,
    ALLOC_VA,         /* cuMemAddressReserve */
    ALLOC_GLOBAL,     /* a module's __device__ variable: part of its image */
    ALLOC_POOL,       /* from a memory pool: the pool's reserve is charged */
    ALLOC_IPC,        /* another process's cuMemAlloc memory, opened here
                         (cuIpcOpenMemHandle): charged to that process */
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
    int shared;           /* a memfd backs the mapping (exported for IPC)... */
    int memfd;            /* ...this one */
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

/* Back the allocation starting at base with a memfd that other processes
 * can map (its bytes kept, at the same address); the fd, or -1. */
int mem_share(uintptr_t base);

/* The allocation holding [p, p + len); 0 if none. Copies *a out. */
int mem_find(uintptr_t p, size_t len, struct alloc *a);
/* Free every allocation of ctx (its destruction). */
void mem_free_ctx(CUcontext ctx);
/* The checkpoint API's needs (checkpoint.c): whether an allocation of
 * `kind` exists; device allocations made inaccessible while checkpointed
 * (off) or accessible again, at the same addresses; entries moved to other
 * GPUs (phys d becomes map[d]). */
int mem_has_kind(int kind);
/* Whether an allocation is exported for IPC (cuIpcGetMemHandle). */
int mem_has_shared(void);
void mem_protect_device(int off);
void mem_remap(const int map[VGPU_SIM_MAX_DEVICES]);
/* Device memory is charged in whole granules. */
uint64_t mem_round(uint64_t bytes);

#endif /* VGPU_SIM_CUDA_ALLOCTAB_H */
