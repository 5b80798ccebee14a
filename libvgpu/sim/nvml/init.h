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

#endif /* VGPU_SIM_NVML_INIT_H */
