/*
 * fields.c - nvmlDeviceGetFieldValues: many readings in one call, each with
 * its own return code, as DCGM-style monitors and nvitop ask for them. The
 * fields the simulator models come from sensors.c; every other field id
 * (NVLink, per-lane PCIe counters, ...) answers NVML_ERROR_NOT_SUPPORTED in
 * its own nvmlReturn while the call succeeds, as NVIDIA's does for a field a
 * board lacks.
 */
#include <time.h>

#include "init.h"
#include "sensors.h"

static void set_uint(nvmlFieldValue_t *v, unsigned int value)
{
    v->valueType = NVML_VALUE_TYPE_UNSIGNED_INT;
    v->value.ullVal = 0;
    v->value.uiVal = value;
}

static void set_ull(nvmlFieldValue_t *v, unsigned long long value)
{
    v->valueType = NVML_VALUE_TYPE_UNSIGNED_LONG_LONG;
    v->value.ullVal = value;
}

/* One field of device i; its nvmlReturn. */
static nvmlReturn_t field(int i, nvmlFieldValue_t *v)
{
    switch (v->fieldId) {
    case NVML_FI_DEV_ECC_CURRENT:
    case NVML_FI_DEV_ECC_PENDING:
        set_uint(v, SIM_ECC_MODE); /* 1: on */
        return NVML_SUCCESS;
    case NVML_FI_DEV_ECC_SBE_VOL_TOTAL:
    case NVML_FI_DEV_ECC_DBE_VOL_TOTAL:
    case NVML_FI_DEV_ECC_SBE_AGG_TOTAL:
    case NVML_FI_DEV_ECC_DBE_AGG_TOTAL:
        set_ull(v, 0);
        return NVML_SUCCESS;
    case NVML_FI_DEV_PCIE_REPLAY_COUNTER:
    case NVML_FI_DEV_PCIE_REPLAY_ROLLOVER_COUNTER:
    case NVML_FI_DEV_REMAPPED_COR:
    case NVML_FI_DEV_REMAPPED_UNC:
    case NVML_FI_DEV_REMAPPED_PENDING:
    case NVML_FI_DEV_REMAPPED_FAILURE:
        set_uint(v, 0);
        return NVML_SUCCESS;
    case NVML_FI_DEV_MEMORY_TEMP:
        set_uint(v, nvml_memory_temp(i));
        return NVML_SUCCESS;
    case NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION:
        set_ull(v, nvml_energy_mj(i));
        return NVML_SUCCESS;
    }
    /* Power fields are per scope: the GPU alone, or (Grace Hopper) the module. */
    if (v->scopeId != NVML_POWER_SCOPE_GPU)
        return NVML_ERROR_NOT_SUPPORTED;
    switch (v->fieldId) {
    case NVML_FI_DEV_POWER_AVERAGE:
    case NVML_FI_DEV_POWER_INSTANT:
        set_uint(v, nvml_power_mw(i));
        return NVML_SUCCESS;
    case NVML_FI_DEV_POWER_MIN_LIMIT:
        set_uint(v, SIM_POWER_MIN_LIMIT_MW);
        return NVML_SUCCESS;
    case NVML_FI_DEV_POWER_MAX_LIMIT:
    case NVML_FI_DEV_POWER_DEFAULT_LIMIT:
    case NVML_FI_DEV_POWER_CURRENT_LIMIT:
    case NVML_FI_DEV_POWER_REQUESTED_LIMIT:
        set_uint(v, SIM_POWER_LIMIT_MW);
        return NVML_SUCCESS;
    }
    return NVML_ERROR_NOT_SUPPORTED;
}

VGPU_EXPORT nvmlReturn_t nvmlDeviceGetFieldValues(nvmlDevice_t d, int count,
                                                  nvmlFieldValue_t *values)
{
    NVML_DEVICE(d, i);
    if (count <= 0 || !values)
        return NVML_ERROR_INVALID_ARGUMENT;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    long long now_us = (long long)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
    for (int k = 0; k < count; k++) {
        nvmlFieldValue_t *v = &values[k];
        v->timestamp = now_us;
        v->latencyUsec = 0;
        v->nvmlReturn = v->fieldId < NVML_FI_MAX ? field(i, v) : NVML_ERROR_INVALID_ARGUMENT;
    }
    return NVML_SUCCESS;
}
