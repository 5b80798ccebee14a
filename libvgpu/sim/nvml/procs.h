/*
 * procs.h - work on a device (procs.c): what the device queries of device.c
 * derive from utilization. Above init.h.
 */
#ifndef VGPU_SIM_NVML_PROCS_H
#define VGPU_SIM_NVML_PROCS_H

/* GPU utilization (percent) over the last complete sample period. */
unsigned int nvml_recent_util(int dev);

#endif /* VGPU_SIM_NVML_PROCS_H */
