/*
 * sensors.c - what the simulated device measures, as an H100 SXM5 reports
 * it: clocks, performance state, power and energy, temperatures, the video
 * engines, PCIe traffic and ECC. The SM and graphics clocks, power and
 * temperature follow the device's utilization over the last sample period
 * (procs.c), from idle to full load, as a real board's do.
 */
#include <string.h>

#include "init.h"
#include "procs.h"
#include "sensors.h"


/* from idle (util 0) to full load (util 100), in a straight line */
static unsigned int scale(unsigned int idle, unsigned int full, unsigned int util)
{
    return idle + (full - idle) * util / 100;
}

/* ---- clocks (MHz) ---- */

static const struct {
    unsigned int idle, max;
} k_clocks[] = {
    [NVML_CLOCK_GRAPHICS] = {345, 1980},
    [NVML_CLOCK_SM] = {345, 1980},
    [NVML_CLOCK_MEM] = {2619, 2619}, /* HBM3 runs at one clock */
    [NVML_CLOCK_VIDEO] = {765, 1545},
};

#define KNOWN_CLOCK(type) ((unsigned)(type) < sizeof k_clocks / sizeof k_clocks[0])
#define GRAPHICS_STEP 15 /* MHz between supported graphics clocks */

VGPU_EXPORT nvmlReturn_t nvmlDeviceGetClockInfo(nvmlDevice_t d, nvmlClockType_t type,
                                                unsigned int *mhz)
{
    NVML_DEVICE(d, i);
    if (!KNOWN_CLOCK(type))
        return NVML_ERROR_INVALID_ARGUMENT;
    ANSWER(mhz, scale(k_clocks[type].idle, k_clocks[type].max, nvml_recent_util(i)));
}

/* Boost, applications (target and default) and customer-boost clocks are all
 * the maximum: nobody has set applications clocks. */
VGPU_EXPORT nvmlReturn_t nvmlDeviceGetMaxClockInfo(nvmlDevice_t d, nvmlClockType_t type,
                                                   unsigned int *mhz)
{
    NVML_DEVICE(d, i);
    (void)i;
    if (!KNOWN_CLOCK(type))
        return NVML_ERROR_INVALID_ARGUMENT;
    ANSWER(mhz, k_clocks[type].max);
}
VGPU_ALIAS(nvmlDeviceGetMaxClockInfo, nvmlDeviceGetApplicationsClock)
VGPU_ALIAS(nvmlDeviceGetMaxClockInfo, nvmlDeviceGetDefaultApplicationsClock)
VGPU_ALIAS(nvmlDeviceGetMaxClockInfo, nvmlDeviceGetMaxCustomerBoostClock)

VGPU_EXPORT nvmlReturn_t nvmlDeviceGetClock(nvmlDevice_t d, nvmlClockType_t type, nvmlClockId_t id,
                                            unsigned int *mhz)
{
    switch (id) {
    case NVML_CLOCK_ID_CURRENT:
        return nvmlDeviceGetClockInfo(d, type, mhz);
    case NVML_CLOCK_ID_APP_CLOCK_TARGET:
    case NVML_CLOCK_ID_APP_CLOCK_DEFAULT:
    case NVML_CLOCK_ID_CUSTOMER_BOOST_MAX:
        return nvmlDeviceGetMaxClockInfo(d, type, mhz);
    default: {
        NVML_DEVICE(d, i);
        (void)i;
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    }
}

/* Fill `out` (room for *count) with n values from `first` down by `step`. */
static nvmlReturn_t clock_list(unsigned int *count, unsigned int *out, unsigned int first,
                               unsigned int n, unsigned int step)
{
    if (!count)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (*count < n || !out) {
        *count = n;
        return NVML_ERROR_INSUFFICIENT_SIZE;
    }
    for (unsigned int k = 0; k < n; k++)
        out[k] = first - k * step;
    *count = n;
    return NVML_SUCCESS;
}

VGPU_EXPORT nvmlReturn_t nvmlDeviceGetSupportedMemoryClocks(nvmlDevice_t d, unsigned int *count,
                                                            unsigned int *mhz)
{
    NVML_DEVICE(d, i);
    (void)i;
    return clock_list(count, mhz, k_clocks[NVML_CLOCK_MEM].max, 1, 0);
}

VGPU_EXPORT nvmlReturn_t nvmlDeviceGetSupportedGraphicsClocks(nvmlDevice_t d, unsigned int mem_mhz,
                                                              unsigned int *count,
                                                              unsigned int *mhz)
{
    NVML_DEVICE(d, i);
    (void)i;
    if (mem_mhz != k_clocks[NVML_CLOCK_MEM].max)
        return NVML_ERROR_NOT_FOUND;
    unsigned int top = k_clocks[NVML_CLOCK_GRAPHICS].max, low = k_clocks[NVML_CLOCK_GRAPHICS].idle;
    return clock_list(count, mhz, top, (top - low) / GRAPHICS_STEP + 1, GRAPHICS_STEP);
}

/* Data-center boards stay in P0 while the driver is loaded (persistence
 * mode); an idle one says so in its clocks event reasons. */
VGPU_EXPORT nvmlReturn_t nvmlDeviceGetPerformanceState(nvmlDevice_t d, nvmlPstates_t *state)
{
    NVML_DEVICE(d, i);
    (void)i;
    ANSWER(state, NVML_PSTATE_0);
}
VGPU_ALIAS(nvmlDeviceGetPerformanceState, nvmlDeviceGetPowerState)

VGPU_EXPORT nvmlReturn_t nvmlDeviceGetCurrentClocksEventReasons(nvmlDevice_t d,
                                                                unsigned long long *reasons)
{
    NVML_DEVICE(d, i);
    ANSWER(reasons, nvml_recent_util(i) ? nvmlClocksEventReasonNone
                                        : (unsigned long long)nvmlClocksEventReasonGpuIdle);
}
VGPU_ALIAS(nvmlDeviceGetCurrentClocksEventReasons, nvmlDeviceGetCurrentClocksThrottleReasons)

VGPU_EXPORT nvmlReturn_t nvmlDeviceGetSupportedClocksEventReasons(nvmlDevice_t d,
                                                                  unsigned long long *reasons)
{
    NVML_DEVICE(d, i);
    (void)i;
    ANSWER(reasons, (unsigned long long)(nvmlClocksEventReasonGpuIdle |
                                         nvmlClocksEventReasonApplicationsClocksSetting |
                                         nvmlClocksEventReasonSwPowerCap |
                                         nvmlClocksThrottleReasonHwSlowdown |
                                         nvmlClocksEventReasonSyncBoost |
                                         nvmlClocksEventReasonSwThermalSlowdown |
                                         nvmlClocksThrottleReasonHwThermalSlowdown |
                                         nvmlClocksThrottleReasonHwPowerBrakeSlowdown));
}
VGPU_ALIAS(nvmlDeviceGetSupportedClocksEventReasons, nvmlDeviceGetSupportedClocksThrottleReasons)

/* ---- power (mW) and energy (mJ) ---- */

#define IDLE_MW 70000u

unsigned int nvml_power_mw(int dev)
{
    return scale(IDLE_MW, SIM_POWER_LIMIT_MW, nvml_recent_util(dev));
}

/* Idle power since boot, plus the difference to full power for the time the
 * device's timeline was busy: rises with the power drawn, never falls. */
unsigned long long nvml_energy_mj(int dev)
{
    struct vgpu_sim_state *s = sim_state();
    sim_lock(0);
    sim_timeline_catch_up(dev);
    uint64_t busy_ms = s->dev[dev].busy_ns / 1000000;
    sim_unlock();
    uint64_t now_ms = sim_now_ns() / 1000000;
    return (now_ms * IDLE_MW + busy_ms * (SIM_POWER_LIMIT_MW - IDLE_MW)) / 1000;
}

VGPU_EXPORT nvmlReturn_t nvmlDeviceGetPowerUsage(nvmlDevice_t d, unsigned int *mw)
{
    NVML_DEVICE(d, i);
    ANSWER(mw, nvml_power_mw(i));
}

VGPU_EXPORT nvmlReturn_t nvmlDeviceGetTotalEnergyConsumption(nvmlDevice_t d,
                                                             unsigned long long *mj)
{
    NVML_DEVICE(d, i);
    ANSWER(mj, nvml_energy_mj(i));
}

VGPU_EXPORT nvmlReturn_t nvmlDeviceGetPowerManagementLimit(nvmlDevice_t d, unsigned int *mw)
{
    NVML_DEVICE(d, i);
    (void)i;
    ANSWER(mw, SIM_POWER_LIMIT_MW);
}
VGPU_ALIAS(nvmlDeviceGetPowerManagementLimit, nvmlDeviceGetPowerManagementDefaultLimit)
VGPU_ALIAS(nvmlDeviceGetPowerManagementLimit, nvmlDeviceGetEnforcedPowerLimit)

VGPU_EXPORT nvmlReturn_t nvmlDeviceGetPowerManagementLimitConstraints(nvmlDevice_t d,
                                                                      unsigned int *min_mw,
                                                                      unsigned int *max_mw)
{
    NVML_DEVICE(d, i);
    (void)i;
    if (!min_mw || !max_mw)
        return NVML_ERROR_INVALID_ARGUMENT;
    *min_mw = SIM_POWER_MIN_LIMIT_MW;
    *max_mw = SIM_POWER_LIMIT_MW;
    return NVML_SUCCESS;
}

VGPU_EXPORT nvmlReturn_t nvmlDeviceGetPowerManagementMode(nvmlDevice_t d, nvmlEnableState_t *mode)
{
    NVML_DEVICE(d, i);
    (void)i;
    ANSWER(mode, NVML_FEATURE_ENABLED);
}

/* ---- temperature (degrees C) ---- */

static unsigned int gpu_temp(int dev)
{
    return scale(30, 80, nvml_recent_util(dev));
}

unsigned int nvml_memory_temp(int dev)
{
    return scale(38, 78, nvml_recent_util(dev));
}

VGPU_EXPORT nvmlReturn_t nvmlDeviceGetTemperature(nvmlDevice_t d, nvmlTemperatureSensors_t sensor,
                                                  unsigned int *temp)
{
    NVML_DEVICE(d, i);
    if (sensor != NVML_TEMPERATURE_GPU)
        return NVML_ERROR_INVALID_ARGUMENT;
    ANSWER(temp, gpu_temp(i));
}

VGPU_EXPORT nvmlReturn_t nvmlDeviceGetTemperatureV(nvmlDevice_t d, nvmlTemperature_v1_t *temp)
{
    NVML_DEVICE(d, i);
    if (!temp)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (temp->version != nvmlTemperature_v1)
        return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    if (temp->sensorType != NVML_TEMPERATURE_GPU)
        return NVML_ERROR_INVALID_ARGUMENT;
    temp->temperature = (int)gpu_temp(i);
    return NVML_SUCCESS;
}

/* An SXM5 board's: no fan, so no acoustic thresholds. */
VGPU_EXPORT nvmlReturn_t nvmlDeviceGetTemperatureThreshold(nvmlDevice_t d,
                                                           nvmlTemperatureThresholds_t which,
                                                           unsigned int *temp)
{
    NVML_DEVICE(d, i);
    (void)i;
    switch (which) {
    case NVML_TEMPERATURE_THRESHOLD_SHUTDOWN: ANSWER(temp, 92);
    case NVML_TEMPERATURE_THRESHOLD_SLOWDOWN: ANSWER(temp, 89);
    case NVML_TEMPERATURE_THRESHOLD_MEM_MAX: ANSWER(temp, 95);
    case NVML_TEMPERATURE_THRESHOLD_GPU_MAX: ANSWER(temp, 87);
    case NVML_TEMPERATURE_THRESHOLD_ACOUSTIC_MIN:
    case NVML_TEMPERATURE_THRESHOLD_ACOUSTIC_CURR:
    case NVML_TEMPERATURE_THRESHOLD_ACOUSTIC_MAX:
    case NVML_TEMPERATURE_THRESHOLD_GPS_CURR:
        return NVML_ERROR_NOT_SUPPORTED;
    default:
        return NVML_ERROR_INVALID_ARGUMENT;
    }
}

/* ---- video engines: idle (the simulator runs no video work) ---- */

/* 0 percent over the utilization sample period, in microseconds. */
static nvmlReturn_t engine_idle(nvmlDevice_t d, unsigned int *util, unsigned int *period_us)
{
    NVML_DEVICE(d, i);
    (void)i;
    if (!util || !period_us)
        return NVML_ERROR_INVALID_ARGUMENT;
    *util = 0;
    *period_us = (unsigned int)(sim_state()->sample_ns / 1000);
    return NVML_SUCCESS;
}

/* An H100 has NVDEC, NVJPG and OFA engines and no NVENC; NVML still answers
 * encoder utilization and statistics with zeros (its encoder capacity is
 * NOT_SUPPORTED, see api.def). */
VGPU_EXPORT nvmlReturn_t nvmlDeviceGetEncoderUtilization(nvmlDevice_t d, unsigned int *util,
                                                         unsigned int *period_us)
{
    return engine_idle(d, util, period_us);
}
VGPU_ALIAS(nvmlDeviceGetEncoderUtilization, nvmlDeviceGetDecoderUtilization)
VGPU_ALIAS(nvmlDeviceGetEncoderUtilization, nvmlDeviceGetJpgUtilization)
VGPU_ALIAS(nvmlDeviceGetEncoderUtilization, nvmlDeviceGetOfaUtilization)

VGPU_EXPORT nvmlReturn_t nvmlDeviceGetEncoderStats(nvmlDevice_t d, unsigned int *sessions,
                                                   unsigned int *avg_fps,
                                                   unsigned int *avg_latency_us)
{
    NVML_DEVICE(d, i);
    (void)i;
    if (!sessions || !avg_fps || !avg_latency_us)
        return NVML_ERROR_INVALID_ARGUMENT;
    *sessions = *avg_fps = *avg_latency_us = 0;
    return NVML_SUCCESS;
}

VGPU_EXPORT nvmlReturn_t nvmlDeviceGetFBCStats(nvmlDevice_t d, nvmlFBCStats_t *stats)
{
    NVML_DEVICE(d, i);
    (void)i;
    if (!stats)
        return NVML_ERROR_INVALID_ARGUMENT;
    memset(stats, 0, sizeof *stats);
    return NVML_SUCCESS;
}

/* No encoder (or frame-capture) sessions: a count of 0, nothing written. */
VGPU_EXPORT nvmlReturn_t nvmlDeviceGetEncoderSessions(nvmlDevice_t d, unsigned int *count,
                                                      nvmlEncoderSessionInfo_t *infos)
{
    NVML_DEVICE(d, i);
    (void)i;
    (void)infos;
    ANSWER(count, 0);
}

VGPU_EXPORT nvmlReturn_t nvmlDeviceGetFBCSessions(nvmlDevice_t d, unsigned int *count,
                                                  nvmlFBCSessionInfo_t *infos)
{
    NVML_DEVICE(d, i);
    (void)i;
    (void)infos;
    ANSWER(count, 0);
}

/* ---- PCIe traffic: none is simulated (copies take no time here) ---- */

VGPU_EXPORT nvmlReturn_t nvmlDeviceGetPcieThroughput(nvmlDevice_t d, nvmlPcieUtilCounter_t counter,
                                                     unsigned int *kb_per_s)
{
    NVML_DEVICE(d, i);
    (void)i;
    if ((unsigned)counter >= NVML_PCIE_UTIL_COUNT)
        return NVML_ERROR_INVALID_ARGUMENT;
    ANSWER(kb_per_s, 0);
}

VGPU_EXPORT nvmlReturn_t nvmlDeviceGetPcieReplayCounter(nvmlDevice_t d, unsigned int *count)
{
    NVML_DEVICE(d, i);
    (void)i;
    ANSWER(count, 0);
}

/* ---- ECC: on, and no error ever; rows are remapped, pages not retired ---- */

VGPU_EXPORT nvmlReturn_t nvmlDeviceGetEccMode(nvmlDevice_t d, nvmlEnableState_t *cur,
                                              nvmlEnableState_t *pending)
{
    NVML_DEVICE(d, i);
    (void)i;
    if (!cur || !pending)
        return NVML_ERROR_INVALID_ARGUMENT;
    *cur = *pending = SIM_ECC_MODE;
    return NVML_SUCCESS;
}

VGPU_EXPORT nvmlReturn_t nvmlDeviceGetDefaultEccMode(nvmlDevice_t d, nvmlEnableState_t *mode)
{
    NVML_DEVICE(d, i);
    (void)i;
    ANSWER(mode, SIM_ECC_MODE);
}

VGPU_EXPORT nvmlReturn_t nvmlDeviceGetTotalEccErrors(nvmlDevice_t d, nvmlMemoryErrorType_t type,
                                                     nvmlEccCounterType_t counter,
                                                     unsigned long long *count)
{
    NVML_DEVICE(d, i);
    (void)i;
    if ((unsigned)type >= NVML_MEMORY_ERROR_TYPE_COUNT ||
        (unsigned)counter >= NVML_ECC_COUNTER_TYPE_COUNT)
        return NVML_ERROR_INVALID_ARGUMENT;
    ANSWER(count, 0);
}

VGPU_EXPORT nvmlReturn_t nvmlDeviceGetMemoryErrorCounter(nvmlDevice_t d, nvmlMemoryErrorType_t type,
                                                         nvmlEccCounterType_t counter,
                                                         nvmlMemoryLocation_t where,
                                                         unsigned long long *count)
{
    NVML_DEVICE(d, i);
    (void)i;
    if ((unsigned)type >= NVML_MEMORY_ERROR_TYPE_COUNT ||
        (unsigned)counter >= NVML_ECC_COUNTER_TYPE_COUNT ||
        (unsigned)where >= NVML_MEMORY_LOCATION_COUNT)
        return NVML_ERROR_INVALID_ARGUMENT;
    ANSWER(count, 0);
}

VGPU_EXPORT nvmlReturn_t nvmlDeviceGetRemappedRows(nvmlDevice_t d, unsigned int *corrected,
                                                   unsigned int *uncorrected,
                                                   unsigned int *pending, unsigned int *failed)
{
    NVML_DEVICE(d, i);
    (void)i;
    if (!corrected || !uncorrected || !pending || !failed)
        return NVML_ERROR_INVALID_ARGUMENT;
    *corrected = *uncorrected = *pending = *failed = 0;
    return NVML_SUCCESS;
}
