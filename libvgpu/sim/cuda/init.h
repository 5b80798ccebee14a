/*
 * init.h - cuInit and the devices this process sees (init.c): the lowest
 * layer of cuda/, with handle.h.
 */
#ifndef VGPU_SIM_CUDA_INIT_H
#define VGPU_SIM_CUDA_INIT_H

#include <pthread.h>

#include "common/sim.h"
#include "vgpu/cuda_types.h"

extern int cu_initialized;
extern int cu_count;                       /* visible devices */
extern int cu_phys[VGPU_SIM_MAX_DEVICES];  /* ordinal -> physical GPU */
extern pthread_mutex_t cu_lock;            /* guards the process-local objects */
extern int cu_peer;                        /* VGPU_SIM_PEER: GPUs reach each other */

/* The ordinal of physical GPU phys in this process, or -1 (not visible). */
int cu_ordinal_of(int phys);

CUresult cu_check_device(CUdevice dev);    /* NOT_INITIALIZED / INVALID_DEVICE */

/* Start of an entry point on the device dev: return cu_check_device()'s error. */
#define CHECK_DEVICE(dev)                        \
    do {                                         \
        CUresult rc_ = cu_check_device(dev);     \
        if (rc_)                                 \
            return rc_;                          \
    } while (0)

/* Store `value` through `out`: the end of a query that answers one value
 * (CUDA_ERROR_INVALID_VALUE for a NULL out). */
#define ANSWER(out, value) SIM_ANSWER(out, value, CUDA_ERROR_INVALID_VALUE, CUDA_SUCCESS)

#endif /* VGPU_SIM_CUDA_INIT_H */
