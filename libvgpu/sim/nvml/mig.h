/*
 * mig.h - MIG devices' handles (mig.c), for the files of nvml/ above it
 * that answer on a MIG device too (device.c, procs.c).
 */
#ifndef VGPU_SIM_NVML_MIG_H
#define VGPU_SIM_NVML_MIG_H

#include "init.h"

/* The device slot of a MIG device's handle (one whose GPU instance has its
 * compute instance now), or -1. */
int nvml_mig_slot(nvmlDevice_t d);
/* Whether physical GPU gpu is in MIG mode. */
int nvml_mig_mode(int gpu);

/* A physical GPU's index, or a live MIG device's slot, or -1. */
int nvml_any_slot(nvmlDevice_t d);

/* Start of a query that a MIG device answers too: as NVML_DEVICE, with
 * `slot` the device slot (a physical GPU's index, or a MIG device's). */
#define NVML_ANY_DEVICE(d, slot) NVML_HANDLE(slot, nvml_any_slot(d))

/* Start of a query a MIG device, and a GPU in MIG mode, do not answer
 * (utilization, per-process utilization, accounting): as NVML_DEVICE, then
 * NVML_ERROR_NOT_SUPPORTED for them, as NVIDIA documents. */
#define NVML_DEVICE_NO_MIG(d, i)                  \
    nvmlReturn_t rc_ = nvml_enter();              \
    if (rc_)                                      \
        return rc_;                               \
    if (nvml_mig_slot(d) >= 0)                    \
        return NVML_ERROR_NOT_SUPPORTED;          \
    int i = nvml_index(d);                        \
    if (i < 0)                                    \
        return NVML_ERROR_INVALID_ARGUMENT;       \
    if (nvml_mig_mode(i))                         \
        return NVML_ERROR_NOT_SUPPORTED;

#endif /* VGPU_SIM_NVML_MIG_H */
