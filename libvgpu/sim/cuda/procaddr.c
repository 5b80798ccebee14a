/*
 * procaddr.c - cuGetProcAddress and cuGetProcAddress_v2: resolve
 * (name, cudaVersion, flags) to an entry point the way the driver does, from
 * the one table in api.def. The top of cuda/: the table names every entry
 * point, these two included.
 */
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/sim.h"
#include "vgpu/cuda_types.h"

/* Every entry point of the table, declared under a C name of its own bound
 * to the exported symbol (an asm label): only addresses are taken here, and
 * the placeholder type must not meet the real declarations of the two entry
 * points this file defines. */
#define CU_API(name, version, symbol) extern void api_##symbol(void) __asm__(#symbol);
#define CU_API_PT(name, version, symbol) CU_API(name, version, symbol)
#include "api.def"
#undef CU_API
#undef CU_API_PT

struct proc_entry {
    const char *name;
    int version;
    int per_thread;
    void (*fn)(void);
};

static const struct proc_entry k_table[] = {
#define CU_API(name, version, symbol) {#name, version, 0, api_##symbol},
#define CU_API_PT(name, version, symbol) {#name, version, 1, api_##symbol},
#include "api.def"
#undef CU_API
#undef CU_API_PT
};

static CUresult resolve(const char *symbol, void **pfn, int version, cuuint64_t flags,
                        CUdriverProcAddressQueryResult *status)
{
    if (status)
        *status = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
    if (!symbol || !pfn)
        return CUDA_ERROR_INVALID_VALUE;
    *pfn = NULL;
    if (flags & ~(cuuint64_t)(CU_GET_PROC_ADDRESS_LEGACY_STREAM |
                              CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM))
        return CUDA_ERROR_INVALID_VALUE;
    int want_pt = (flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) != 0;
    int driver = sim_cuda_version(); /* an older driver knows no newer entry point */
    const struct proc_entry *best = NULL;
    int known = 0;
    for (size_t i = 0; i < sizeof k_table / sizeof k_table[0]; i++) {
        const struct proc_entry *e = &k_table[i];
        if (strcmp(e->name, symbol) != 0 || e->version > driver)
            continue;
        known = 1;
        if (e->version > version || (e->per_thread && !want_pt))
            continue;
        /* the newest version wins; at equal versions, the per-thread form */
        if (!best || e->version > best->version ||
            (e->version == best->version && e->per_thread))
            best = e;
    }
    if (!best) {
        /* VGPU_SIM_DARKAPI_LOG names what a runtime asks for and lacks */
        const char *log = getenv("VGPU_SIM_DARKAPI_LOG");
        if (log && *log && strcmp(log, "0") != 0)
            fprintf(stderr, "vgpu-sim: procaddr: %s (%d%s) not found\n", symbol, version,
                    want_pt ? ", per-thread" : "");
        if (known && status)
            *status = CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT;
        return CUDA_ERROR_NOT_FOUND;
    }
    *pfn = (void *)best->fn;
    if (status)
        *status = CU_GET_PROC_ADDRESS_SUCCESS;
    return CUDA_SUCCESS;
}

VGPU_EXPORT CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int version,
                                         cuuint64_t flags, CUdriverProcAddressQueryResult *status)
{
    return resolve(symbol, pfn, version, flags, status);
}

VGPU_EXPORT CUresult cuGetProcAddress(const char *symbol, void **pfn, int version,
                                      cuuint64_t flags)
{
    return resolve(symbol, pfn, version, flags, NULL);
}
