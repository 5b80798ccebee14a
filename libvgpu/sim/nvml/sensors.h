/*
 * sensors.h - what the device measures (sensors.c), for the field values of
 * fields.c. Above procs.h.
 */
#ifndef VGPU_SIM_NVML_SENSORS_H
#define VGPU_SIM_NVML_SENSORS_H

#define SIM_POWER_LIMIT_MW 700000u     /* default, current and enforced: the board's TDP */
#define SIM_POWER_MIN_LIMIT_MW 200000u /* the lowest limit one may set */
#define SIM_ECC_MODE NVML_FEATURE_ENABLED

unsigned int nvml_power_mw(int dev);
unsigned int nvml_memory_temp(int dev);     /* degrees C */
unsigned long long nvml_energy_mj(int dev); /* since boot */

#endif /* VGPU_SIM_NVML_SENSORS_H */
