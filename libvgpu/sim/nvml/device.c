/*
 * device.c - the simulated NVML's system and per-device queries, on the
 * handles of init.c. Processes and utilization are in procs.c.
 */
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "init.h"
#include "procs.h"

static nvmlReturn_t copy_str(char *dst, unsigned int len, const char *src)
{
    if (!dst)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (strlen(src) + 1 > len)
        return NVML_ERROR_INSUFFICIENT_SIZE;
    memcpy(dst, src, strlen(src) + 1);
    return NVML_SUCCESS;
}

/* ---- system ---- */

VGPU_EXPORT nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned int len)
{
    nvmlReturn_t rc = nvml_enter();
    return rc ? rc : copy_str(version, len, SIM_DRIVER_VERSION);
}

VGPU_EXPORT nvmlReturn_t nvmlSystemGetNVMLVersion(char *version, unsigned int len)
{
    nvmlReturn_t rc = nvml_enter();
    return rc ? rc : copy_str(version, len, "13." SIM_DRIVER_VERSION);
}

VGPU_EXPORT nvmlReturn_t nvmlSystemGetCudaDriverVersion(int *version)
{
    nvmlReturn_t rc = nvml_enter();
    if (rc)
        return rc;
    if (!version)
        return NVML_ERROR_INVALID_ARGUMENT;
    *version = SIM_CUDA_VERSION;
    return NVML_SUCCESS;
}
VGPU_ALIAS(nvmlSystemGetCudaDriverVersion, nvmlSystemGetCudaDriverVersion_v2)

VGPU_EXPORT nvmlReturn_t nvmlSystemGetProcessName(unsigned int pid, char *name, unsigned int len)
{
    nvmlReturn_t rc = nvml_enter();
    if (rc)
        return rc;
    if (!name || len == 0)
        return NVML_ERROR_INVALID_ARGUMENT;
    char path[64], buf[4096];
    snprintf(path, sizeof path, "/proc/%u/exe", pid);
    ssize_t n = readlink(path, buf, sizeof buf - 1);
    if (n < 0) {
        FILE *f;
        snprintf(path, sizeof path, "/proc/%u/comm", pid);
        if (!(f = fopen(path, "r")))
            return NVML_ERROR_NOT_FOUND;
        n = (ssize_t)fread(buf, 1, sizeof buf - 1, f);
        fclose(f);
        while (n > 0 && buf[n - 1] == '\n')
            n--;
    }
    buf[n] = '\0';
    snprintf(name, len, "%s", buf);
    return NVML_SUCCESS;
}

#define DEVICE(d, i)                        \
    nvmlReturn_t rc_ = nvml_enter();        \
    if (rc_)                                \
        return rc_;                         \
    int i = nvml_index(d);                  \
    if (i < 0)                              \
        return NVML_ERROR_INVALID_ARGUMENT;

VGPU_EXPORT nvmlReturn_t nvmlDeviceGetIndex(nvmlDevice_t d, unsigned int *index)
{
    DEVICE(d, i);
    if (!index)
        return NVML_ERROR_INVALID_ARGUMENT;
    *index = (unsigned)i;
    return NVML_SUCCESS;
}
VGPU_ALIAS(nvmlDeviceGetIndex, nvmlDeviceGetMinorNumber)

VGPU_EXPORT nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t d, char *name, unsigned int len)
{
    DEVICE(d, i);
    (void)i;
    return copy_str(name, len, SIM_NAME);
}

VGPU_EXPORT nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t d, char *uuid, unsigned int len)
{
    DEVICE(d, i);
    char u[NVML_DEVICE_UUID_BUFFER_SIZE];
    sim_device_uuid_string(i, u, sizeof u);
    return copy_str(uuid, len, u);
}

VGPU_EXPORT nvmlReturn_t nvmlDeviceGetSerial(nvmlDevice_t d, char *serial, unsigned int len)
{
    DEVICE(d, i);
    char s[32];
    snprintf(s, sizeof s, "165000000%04d", i);
    return copy_str(serial, len, s);
}

VGPU_EXPORT nvmlReturn_t nvmlDeviceGetPciInfo_v3(nvmlDevice_t d, nvmlPciInfo_t *pci)
{
    DEVICE(d, i);
    if (!pci)
        return NVML_ERROR_INVALID_ARGUMENT;
    memset(pci, 0, sizeof *pci);
    sim_device_bus_id(i, pci->busId, sizeof pci->busId, 1);
    sim_device_bus_id(i, pci->busIdLegacy, sizeof pci->busIdLegacy, 1);
    pci->bus = (unsigned)i + 1;
    pci->pciDeviceId = 0x233010de;     /* H100 SXM5 */
    pci->pciSubSystemId = 0x16c110de;
    return NVML_SUCCESS;
}
VGPU_ALIAS(nvmlDeviceGetPciInfo_v3, nvmlDeviceGetPciInfo_v2)
VGPU_ALIAS(nvmlDeviceGetPciInfo_v3, nvmlDeviceGetPciInfo)

static void memory_of(int i, uint64_t *total, uint64_t *used)
{
    struct vgpu_sim_state *s = sim_state();
    sim_lock(1);
    *total = s->dev[i].total;
    *used = s->dev[i].used;
    sim_unlock();
}

VGPU_EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t d, nvmlMemory_t *mem)
{
    DEVICE(d, i);
    if (!mem)
        return NVML_ERROR_INVALID_ARGUMENT;
    uint64_t total, used;
    memory_of(i, &total, &used);
    mem->total = total;
    mem->used = used;
    mem->free = total > used ? total - used : 0;
    return NVML_SUCCESS;
}

VGPU_EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t d, nvmlMemory_v2_t *mem)
{
    DEVICE(d, i);
    if (!mem)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (mem->version != nvmlMemory_v2)
        return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    uint64_t total, used;
    memory_of(i, &total, &used);
    mem->total = total;
    mem->reserved = 0;
    mem->used = used;
    mem->free = total > used ? total - used : 0;
    return NVML_SUCCESS;
}

VGPU_EXPORT nvmlReturn_t nvmlDeviceGetCudaComputeCapability(nvmlDevice_t d, int *major, int *minor)
{
    DEVICE(d, i);
    (void)i;
    if (!major || !minor)
        return NVML_ERROR_INVALID_ARGUMENT;
    *major = SIM_CC_MAJOR;
    *minor = SIM_CC_MINOR;
    return NVML_SUCCESS;
}

VGPU_EXPORT nvmlReturn_t nvmlDeviceGetArchitecture(nvmlDevice_t d, unsigned int *arch)
{
    DEVICE(d, i);
    (void)i;
    if (!arch)
        return NVML_ERROR_INVALID_ARGUMENT;
    *arch = 9; /* NVML_DEVICE_ARCH_HOPPER */
    return NVML_SUCCESS;
}

VGPU_EXPORT nvmlReturn_t nvmlDeviceGetTemperature(nvmlDevice_t d, nvmlTemperatureSensors_t sensor,
                                                  unsigned int *temp)
{
    DEVICE(d, i);
    if (!temp || sensor != NVML_TEMPERATURE_GPU)
        return NVML_ERROR_INVALID_ARGUMENT;
    *temp = 30 + nvml_recent_util(i) / 2;
    return NVML_SUCCESS;
}

VGPU_EXPORT nvmlReturn_t nvmlDeviceGetPowerUsage(nvmlDevice_t d, unsigned int *mw)
{
    DEVICE(d, i);
    if (!mw)
        return NVML_ERROR_INVALID_ARGUMENT;
    *mw = 70000 + 6300 * nvml_recent_util(i);
    return NVML_SUCCESS;
}

VGPU_EXPORT nvmlReturn_t nvmlDeviceGetEnforcedPowerLimit(nvmlDevice_t d, unsigned int *mw)
{
    DEVICE(d, i);
    (void)i;
    if (!mw)
        return NVML_ERROR_INVALID_ARGUMENT;
    *mw = 700000;
    return NVML_SUCCESS;
}

static nvmlReturn_t clock_of(nvmlClockType_t type, unsigned int *mhz)
{
    if (!mhz)
        return NVML_ERROR_INVALID_ARGUMENT;
    switch (type) {
    case NVML_CLOCK_GRAPHICS:
    case NVML_CLOCK_SM:
        *mhz = 1980;
        return NVML_SUCCESS;
    case NVML_CLOCK_MEM:
        *mhz = 2619;
        return NVML_SUCCESS;
    case NVML_CLOCK_VIDEO:
        *mhz = 1545;
        return NVML_SUCCESS;
    default:
        return NVML_ERROR_INVALID_ARGUMENT;
    }
}

VGPU_EXPORT nvmlReturn_t nvmlDeviceGetClockInfo(nvmlDevice_t d, nvmlClockType_t type,
                                                unsigned int *mhz)
{
    DEVICE(d, i);
    (void)i;
    return clock_of(type, mhz);
}
VGPU_ALIAS(nvmlDeviceGetClockInfo, nvmlDeviceGetMaxClockInfo)

VGPU_EXPORT nvmlReturn_t nvmlDeviceGetComputeMode(nvmlDevice_t d, nvmlComputeMode_t *mode)
{
    DEVICE(d, i);
    (void)i;
    if (!mode)
        return NVML_ERROR_INVALID_ARGUMENT;
    *mode = NVML_COMPUTEMODE_DEFAULT;
    return NVML_SUCCESS;
}

VGPU_EXPORT nvmlReturn_t nvmlDeviceGetPersistenceMode(nvmlDevice_t d, nvmlEnableState_t *mode)
{
    DEVICE(d, i);
    (void)i;
    if (!mode)
        return NVML_ERROR_INVALID_ARGUMENT;
    *mode = NVML_FEATURE_ENABLED;
    return NVML_SUCCESS;
}

VGPU_EXPORT nvmlReturn_t nvmlDeviceGetFanSpeed(nvmlDevice_t d, unsigned int *speed)
{
    DEVICE(d, i);
    (void)i;
    (void)speed;
    return NVML_ERROR_NOT_SUPPORTED; /* passively cooled, as an SXM board */
}

VGPU_EXPORT nvmlReturn_t nvmlDeviceGetMigMode(nvmlDevice_t d, unsigned int *cur, unsigned int *pending)
{
    DEVICE(d, i);
    (void)i;
    (void)cur;
    (void)pending;
    return NVML_ERROR_NOT_SUPPORTED;
}
