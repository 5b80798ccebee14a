/*
 * init.h - what every file of the simulated NVML starts from (init.c).
 */
#ifndef VGPU_SIM_NVML_INIT_H
#define VGPU_SIM_NVML_INIT_H

#include "common/sim.h"
#include "vgpu/nvml_types.h"

/* Start of every NVML call: UNINITIALIZED before nvmlInit, or an injected
 * fault (vgpuctl sim fault --nvml-error); NVML_SUCCESS to go on. */
nvmlReturn_t nvml_enter(void);

/* The physical GPU behind a handle, or -1 if the handle is not one. */
int nvml_index(nvmlDevice_t d);

/* Any handle's device slot (a physical GPU's index, or a MIG device's slot,
 * see state_file.h), or -1; and the handle of a slot. Only mig.c hands out
 * and checks MIG devices' handles (nvml_mig_slot). */
int nvml_slot(nvmlDevice_t d);
nvmlDevice_t nvml_handle(int slot);

/* Store `value` through `out`: the end of a query that answers one value. */
#define ANSWER(out, value) SIM_ANSWER(out, value, NVML_ERROR_INVALID_ARGUMENT, NVML_SUCCESS)

/* Start of a call on a handle: return nvml_enter()'s error, or
 * NVML_ERROR_INVALID_ARGUMENT when `of` (what the handle is, -1 for
 * nothing) is -1; else declare `i` as it. */
#define NVML_HANDLE(i, of)                  \
    nvmlReturn_t rc_ = nvml_enter();        \
    if (rc_)                                \
        return rc_;                         \
    int i = (of);                           \
    if (i < 0)                              \
        return NVML_ERROR_INVALID_ARGUMENT;

/* Start of a device query: `i` is the physical GPU's index. */
#define NVML_DEVICE(d, i) NVML_HANDLE(i, nvml_index(d))

#endif /* VGPU_SIM_NVML_INIT_H */
