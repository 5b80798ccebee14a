/*
 * device.c - the simulated NVML's system queries and what a device is:
 * identity, board, PCI and PCIe link, memory, and its modes. All of it fixed,
 * as an H100 SXM5 (the simulator's SM count and compute capability) answers;
 * what follows the work on the device is in sensors.c, processes and
 * utilization in procs.c.
 */
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "mig.h"

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
    return rc ? rc : copy_str(version, len, sim_driver_version());
}

VGPU_EXPORT nvmlReturn_t nvmlSystemGetNVMLVersion(char *version, unsigned int len)
{
    nvmlReturn_t rc = nvml_enter();
    if (rc)
        return rc;
    char v[48];
    snprintf(v, sizeof v, "%d.%s", sim_cuda_version() / 1000, sim_driver_version());
    return copy_str(version, len, v);
}

VGPU_EXPORT nvmlReturn_t nvmlSystemGetCudaDriverVersion(int *version)
{
    nvmlReturn_t rc = nvml_enter();
    if (rc)
        return rc;
    ANSWER(version, sim_cuda_version());
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

/* S-class units (VCAs): a server's GPUs are not in one. */
VGPU_EXPORT nvmlReturn_t nvmlUnitGetCount(unsigned int *count)
{
    nvmlReturn_t rc = nvml_enter();
    if (rc)
        return rc;
    ANSWER(count, 0);
}

/* ---- identity and board ---- */

VGPU_EXPORT nvmlReturn_t nvmlDeviceGetIndex(nvmlDevice_t d, unsigned int *index)
{
    NVML_DEVICE(d, i);
    ANSWER(index, (unsigned)i);
}
VGPU_ALIAS(nvmlDeviceGetIndex, nvmlDeviceGetMinorNumber)

VGPU_EXPORT nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t d, char *name, unsigned int len)
{
    NVML_ANY_DEVICE(d, slot);
    char own[NVML_DEVICE_NAME_V2_BUFFER_SIZE];
    sim_slot_name(slot, own, sizeof own);
    return copy_str(name, len, own);
}

VGPU_EXPORT nvmlReturn_t nvmlDeviceGetBrand(nvmlDevice_t d, nvmlBrandType_t *brand)
{
    NVML_DEVICE(d, i);
    (void)i;
    ANSWER(brand, NVML_BRAND_NVIDIA);
}

VGPU_EXPORT nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t d, char *uuid, unsigned int len)
{
    NVML_ANY_DEVICE(d, slot);
    char u[NVML_DEVICE_UUID_BUFFER_SIZE];
    sim_slot_uuid_string(slot, u, sizeof u);
    return copy_str(uuid, len, u);
}

VGPU_EXPORT nvmlReturn_t nvmlDeviceGetSerial(nvmlDevice_t d, char *serial, unsigned int len)
{
    NVML_DEVICE(d, i);
    char s[32];
    snprintf(s, sizeof s, "165000000%04d", i);
    return copy_str(serial, len, s);
}

/* As the driver derives it: from the PCI bus the board sits on. */
VGPU_EXPORT nvmlReturn_t nvmlDeviceGetBoardId(nvmlDevice_t d, unsigned int *id)
{
    NVML_DEVICE(d, i);
    ANSWER(id, ((unsigned)i + 1) << 8);
}

VGPU_EXPORT nvmlReturn_t nvmlDeviceGetMultiGpuBoard(nvmlDevice_t d, unsigned int *multi)
{
    NVML_DEVICE(d, i);
    (void)i;
    ANSWER(multi, 0);
}

VGPU_EXPORT nvmlReturn_t nvmlDeviceGetBoardPartNumber(nvmlDevice_t d, char *part, unsigned int len)
{
    NVML_DEVICE(d, i);
    (void)i;
    return copy_str(part, len, "692-2G520-0200-000");
}

VGPU_EXPORT nvmlReturn_t nvmlDeviceGetVbiosVersion(nvmlDevice_t d, char *version, unsigned int len)
{
    NVML_DEVICE(d, i);
    (void)i;
    return copy_str(version, len, "96.00.99.00.01");
}

VGPU_EXPORT nvmlReturn_t nvmlDeviceGetInforomImageVersion(nvmlDevice_t d, char *version,
                                                          unsigned int len)
{
    NVML_DEVICE(d, i);
    (void)i;
    return copy_str(version, len, "G520.0200.00.05");
}

/* An H100 has no power-management or DRAM-encryption infoROM object. */
VGPU_EXPORT nvmlReturn_t nvmlDeviceGetInforomVersion(nvmlDevice_t d, nvmlInforomObject_t object,
                                                     char *version, unsigned int len)
{
    NVML_DEVICE(d, i);
    (void)i;
    switch (object) {
    case NVML_INFOROM_OEM: return copy_str(version, len, "2.1");
    case NVML_INFOROM_ECC: return copy_str(version, len, "7.16");
    case NVML_INFOROM_POWER:
    case NVML_INFOROM_DEN: return NVML_ERROR_NOT_SUPPORTED;
    default: return NVML_ERROR_INVALID_ARGUMENT;
    }
}

VGPU_EXPORT nvmlReturn_t nvmlDeviceGetCudaComputeCapability(nvmlDevice_t d, int *major, int *minor)
{
    NVML_DEVICE(d, i);
    (void)i;
    if (!major || !minor)
        return NVML_ERROR_INVALID_ARGUMENT;
    *major = SIM_CC_MAJOR;
    *minor = SIM_CC_MINOR;
    return NVML_SUCCESS;
}

VGPU_EXPORT nvmlReturn_t nvmlDeviceGetArchitecture(nvmlDevice_t d, unsigned int *arch)
{
    NVML_DEVICE(d, i);
    (void)i;
    ANSWER(arch, 9); /* NVML_DEVICE_ARCH_HOPPER */
}

VGPU_EXPORT nvmlReturn_t nvmlDeviceGetNumGpuCores(nvmlDevice_t d, unsigned int *cores)
{
    NVML_DEVICE(d, i);
    (void)i;
    ANSWER(cores, SIM_SM_COUNT * 128); /* 128 FP32 cores per Hopper SM */
}

VGPU_EXPORT nvmlReturn_t nvmlDeviceGetMemoryBusWidth(nvmlDevice_t d, unsigned int *bits)
{
    NVML_DEVICE(d, i);
    (void)i;
    ANSWER(bits, 5120); /* five HBM3 stacks */
}

/* ---- PCI and the PCIe link: Gen5 x16, at full speed whatever the load ---- */

VGPU_EXPORT nvmlReturn_t nvmlDeviceGetPciInfo_v3(nvmlDevice_t d, nvmlPciInfo_t *pci)
{
    NVML_DEVICE(d, i);
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

#define PCIE_GEN 5
#define PCIE_WIDTH 16

VGPU_EXPORT nvmlReturn_t nvmlDeviceGetCurrPcieLinkGeneration(nvmlDevice_t d, unsigned int *gen)
{
    NVML_DEVICE(d, i);
    (void)i;
    ANSWER(gen, PCIE_GEN);
}
VGPU_ALIAS(nvmlDeviceGetCurrPcieLinkGeneration, nvmlDeviceGetMaxPcieLinkGeneration)
VGPU_ALIAS(nvmlDeviceGetCurrPcieLinkGeneration, nvmlDeviceGetGpuMaxPcieLinkGeneration)

VGPU_EXPORT nvmlReturn_t nvmlDeviceGetCurrPcieLinkWidth(nvmlDevice_t d, unsigned int *width)
{
    NVML_DEVICE(d, i);
    (void)i;
    ANSWER(width, PCIE_WIDTH);
}
VGPU_ALIAS(nvmlDeviceGetCurrPcieLinkWidth, nvmlDeviceGetMaxPcieLinkWidth)

VGPU_EXPORT nvmlReturn_t nvmlDeviceGetPcieLinkMaxSpeed(nvmlDevice_t d, unsigned int *speed)
{
    NVML_DEVICE(d, i);
    (void)i;
    ANSWER(speed, NVML_PCIE_LINK_MAX_SPEED_32000MBPS);
}

VGPU_EXPORT nvmlReturn_t nvmlDeviceGetPcieSpeed(nvmlDevice_t d, unsigned int *mbps)
{
    NVML_DEVICE(d, i);
    (void)i;
    ANSWER(mbps, 32000); /* per lane at Gen5 */
}

/* ---- memory ---- */

/* A MIG device's is its instance's; a GPU in MIG mode's holds what its
 * instances hold. */
static void memory_of(int i, uint64_t *total, uint64_t *used)
{
    struct vgpu_sim_state *s = sim_state();
    sim_lock(1);
    *total = s->dev[i].total;
    *used = s->dev[i].used;
    for (int d = VGPU_SIM_MAX_GPUS; i < VGPU_SIM_MAX_GPUS && d < VGPU_SIM_MAX_DEVICES; d++)
        if (s->dev[d].parent == i)
            *used += s->dev[d].used;
    sim_unlock();
}

VGPU_EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t d, nvmlMemory_t *mem)
{
    NVML_ANY_DEVICE(d, i);
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
    NVML_ANY_DEVICE(d, i);
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

/* The aperture through which the host maps device memory: 128 GiB on an
 * H100, of which the driver itself keeps a little. */
VGPU_EXPORT nvmlReturn_t nvmlDeviceGetBAR1MemoryInfo(nvmlDevice_t d, nvmlBAR1Memory_t *bar1)
{
    NVML_DEVICE(d, i);
    (void)i;
    if (!bar1)
        return NVML_ERROR_INVALID_ARGUMENT;
    bar1->bar1Total = 128ull << 30;
    bar1->bar1Used = 1ull << 20;
    bar1->bar1Free = bar1->bar1Total - bar1->bar1Used;
    return NVML_SUCCESS;
}

/* ---- modes ---- */

VGPU_EXPORT nvmlReturn_t nvmlDeviceGetComputeMode(nvmlDevice_t d, nvmlComputeMode_t *mode)
{
    NVML_DEVICE(d, i);
    (void)i;
    ANSWER(mode, NVML_COMPUTEMODE_DEFAULT);
}

VGPU_EXPORT nvmlReturn_t nvmlDeviceGetPersistenceMode(nvmlDevice_t d, nvmlEnableState_t *mode)
{
    NVML_DEVICE(d, i);
    (void)i;
    ANSWER(mode, NVML_FEATURE_ENABLED);
}

/* No display engine on a data-center board. */
VGPU_EXPORT nvmlReturn_t nvmlDeviceGetDisplayMode(nvmlDevice_t d, nvmlEnableState_t *mode)
{
    NVML_DEVICE(d, i);
    (void)i;
    ANSWER(mode, NVML_FEATURE_DISABLED);
}
VGPU_ALIAS(nvmlDeviceGetDisplayMode, nvmlDeviceGetDisplayActive)

/* Not on a MIG device, nor on a GPU in MIG mode. */
VGPU_EXPORT nvmlReturn_t nvmlDeviceGetAccountingMode(nvmlDevice_t d, nvmlEnableState_t *mode)
{
    NVML_DEVICE_NO_MIG(d, i);
    (void)i;
    ANSWER(mode, NVML_FEATURE_DISABLED);
}

VGPU_EXPORT nvmlReturn_t nvmlDeviceGetVirtualizationMode(nvmlDevice_t d,
                                                         nvmlGpuVirtualizationMode_t *mode)
{
    NVML_DEVICE(d, i);
    (void)i;
    ANSWER(mode, NVML_GPU_VIRTUALIZATION_MODE_NONE); /* bare metal */
}

/* ---- peer to peer ----
 * What the driver says of two GPUs: reads and writes over PCIe unless
 * VGPU_SIM_PEER=0, as cuDeviceCanAccessPeer says; no NVLink, no peer
 * atomics. Of a GPU and itself (NCCL asks for every pair) it answers, with
 * NOT_SUPPORTED, as an H100's driver 580 does (bench/gpu/share_probe.c). */
#define P2P_CAPS_READ 0
#define P2P_CAPS_WRITE 1
#define P2P_CAPS_NVLINK 2
#define P2P_CAPS_ATOMICS 3
#define P2P_CAPS_PCI 4
#define P2P_CAPS_UNKNOWN 5
#define P2P_STATUS_OK 0
#define P2P_STATUS_CHIPSET_NOT_SUPPORTED 1
#define P2P_STATUS_NOT_SUPPORTED 5

VGPU_EXPORT nvmlReturn_t nvmlDeviceGetP2PStatus(nvmlDevice_t d1, nvmlDevice_t d2, int index,
                                                int *status)
{
    NVML_DEVICE(d1, i);
    int j = nvml_index(d2);
    if (j < 0 || !status || index < 0 || index >= P2P_CAPS_UNKNOWN)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (i == j) {
        *status = P2P_STATUS_NOT_SUPPORTED;
        return NVML_SUCCESS;
    }
    switch (index) {
    case P2P_CAPS_READ:
    case P2P_CAPS_WRITE:
    case P2P_CAPS_PCI:
        *status = sim_peer_access() ? P2P_STATUS_OK : P2P_STATUS_CHIPSET_NOT_SUPPORTED;
        break;
    default:
        *status = P2P_STATUS_NOT_SUPPORTED;
        break;
    }
    return NVML_SUCCESS;
}
