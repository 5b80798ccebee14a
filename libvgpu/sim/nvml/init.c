/*
 * init.c - the simulated NVML's lowest layer: nvmlInit and nvmlShutdown,
 * the error strings, and the device handles every other call starts from.
 * NVML sees physical GPUs: it ignores CUDA_VISIBLE_DEVICES, as NVIDIA's does.
 */
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "init.h"

struct nvmlDevice_st {
    int index;
};

static struct nvmlDevice_st g_devices[VGPU_SIM_MAX_DEVICES];
static int g_refs;
static pthread_mutex_t g_init_lock = PTHREAD_MUTEX_INITIALIZER;

nvmlReturn_t nvml_enter(void)
{
    if (!__atomic_load_n(&g_refs, __ATOMIC_ACQUIRE))
        return NVML_ERROR_UNINITIALIZED;
    return (nvmlReturn_t)sim_nvml_fault();
}

int nvml_slot(nvmlDevice_t d)
{
    if (d < &g_devices[0] || d >= &g_devices[VGPU_SIM_MAX_DEVICES])
        return -1;
    return (int)(d - g_devices);
}

nvmlDevice_t nvml_handle(int slot)
{
    return &g_devices[slot];
}

int nvml_index(nvmlDevice_t d)
{
    if (d < &g_devices[0] || d >= &g_devices[VGPU_SIM_MAX_DEVICES])
        return -1;
    int i = (int)(d - g_devices);
    return i < (int)sim_state()->count ? i : -1;
}

/* ---- init ---- */

VGPU_EXPORT nvmlReturn_t nvmlInitWithFlags(unsigned int flags)
{
    (void)flags;
    if (!sim_state())
        return NVML_ERROR_DRIVER_NOT_LOADED;
    nvmlReturn_t fault = (nvmlReturn_t)sim_nvml_fault();
    if (fault)
        return fault;
    pthread_mutex_lock(&g_init_lock);
    for (int i = 0; i < VGPU_SIM_MAX_DEVICES; i++)
        g_devices[i].index = i;
    __atomic_add_fetch(&g_refs, 1, __ATOMIC_ACQ_REL);
    pthread_mutex_unlock(&g_init_lock);
    return NVML_SUCCESS;
}

VGPU_EXPORT nvmlReturn_t nvmlInit_v2(void)
{
    return nvmlInitWithFlags(0);
}
VGPU_ALIAS(nvmlInit_v2, nvmlInit)

VGPU_EXPORT nvmlReturn_t nvmlShutdown(void)
{
    nvmlReturn_t rc = NVML_SUCCESS;
    pthread_mutex_lock(&g_init_lock);
    if (g_refs == 0)
        rc = NVML_ERROR_UNINITIALIZED;
    else
        __atomic_sub_fetch(&g_refs, 1, __ATOMIC_ACQ_REL);
    pthread_mutex_unlock(&g_init_lock);
    return rc;
}

VGPU_EXPORT const char *nvmlErrorString(nvmlReturn_t r)
{
    switch (r) {
    case NVML_SUCCESS: return "Success";
    case NVML_ERROR_UNINITIALIZED: return "Uninitialized";
    case NVML_ERROR_INVALID_ARGUMENT: return "Invalid Argument";
    case NVML_ERROR_NOT_SUPPORTED: return "Not Supported";
    case NVML_ERROR_NO_PERMISSION: return "Insufficient Permissions";
    case NVML_ERROR_ALREADY_INITIALIZED: return "Already Initialized";
    case NVML_ERROR_NOT_FOUND: return "Not Found";
    case NVML_ERROR_INSUFFICIENT_SIZE: return "Insufficient Size";
    case NVML_ERROR_INSUFFICIENT_POWER: return "Insufficient External Power";
    case NVML_ERROR_DRIVER_NOT_LOADED: return "Driver Not Loaded";
    case NVML_ERROR_TIMEOUT: return "Timeout";
    case NVML_ERROR_IRQ_ISSUE: return "Interrupt Request Issue";
    case NVML_ERROR_LIBRARY_NOT_FOUND: return "NVML Shared Library Not Found";
    case NVML_ERROR_FUNCTION_NOT_FOUND: return "Function Not Found";
    case NVML_ERROR_CORRUPTED_INFOROM: return "Corrupted infoROM";
    case NVML_ERROR_GPU_IS_LOST: return "GPU is lost";
    case NVML_ERROR_RESET_REQUIRED: return "GPU requires restart";
    case NVML_ERROR_OPERATING_SYSTEM: return "The operating system has blocked the request.";
    case NVML_ERROR_LIB_RM_VERSION_MISMATCH: return "RM has detected an NVML/RM version mismatch.";
    case NVML_ERROR_IN_USE: return "In use by another client";
    case NVML_ERROR_MEMORY: return "Insufficient Memory";
    case NVML_ERROR_NO_DATA: return "No data";
    case NVML_ERROR_INSUFFICIENT_RESOURCES: return "Insufficient resources";
    case NVML_ERROR_ARGUMENT_VERSION_MISMATCH: return "Argument version mismatch";
    case NVML_ERROR_DEPRECATED: return "Deprecated";
    case NVML_ERROR_NOT_READY: return "Not Ready";
    case NVML_ERROR_GPU_NOT_FOUND: return "GPU not found";
    case NVML_ERROR_INVALID_STATE: return "Invalid state";
    default: return "Unknown Error";
    }
}

/* ---- handles ---- */

VGPU_EXPORT nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *count)
{
    nvmlReturn_t rc = nvml_enter();
    if (rc)
        return rc;
    if (!count)
        return NVML_ERROR_INVALID_ARGUMENT;
    *count = sim_state()->count;
    return NVML_SUCCESS;
}
VGPU_ALIAS(nvmlDeviceGetCount_v2, nvmlDeviceGetCount)

VGPU_EXPORT nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *dev)
{
    nvmlReturn_t rc = nvml_enter();
    if (rc)
        return rc;
    if (!dev || index >= sim_state()->count)
        return NVML_ERROR_INVALID_ARGUMENT;
    *dev = &g_devices[index];
    return NVML_SUCCESS;
}
VGPU_ALIAS(nvmlDeviceGetHandleByIndex_v2, nvmlDeviceGetHandleByIndex)

VGPU_EXPORT nvmlReturn_t nvmlDeviceGetHandleByPciBusId_v2(const char *bus_id, nvmlDevice_t *dev)
{
    nvmlReturn_t rc = nvml_enter();
    if (rc)
        return rc;
    unsigned int domain, bus, device, fn = 0;
    if (!bus_id || !dev || sscanf(bus_id, "%x:%x:%x.%x", &domain, &bus, &device, &fn) < 3)
        return NVML_ERROR_INVALID_ARGUMENT;
    for (unsigned int i = 0; i < sim_state()->count; i++) {
        if (domain == 0 && bus == i + 1 && device == 0 && fn == 0) {
            *dev = &g_devices[i];
            return NVML_SUCCESS;
        }
    }
    return NVML_ERROR_NOT_FOUND;
}
VGPU_ALIAS(nvmlDeviceGetHandleByPciBusId_v2, nvmlDeviceGetHandleByPciBusId)
