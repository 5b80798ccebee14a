/*
 * init.c - cuInit, the driver version, CUDA_VISIBLE_DEVICES and the
 * device queries.
 */
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gate.h"
#include "init.h"

int cu_initialized;
int cu_count;
int cu_phys[VGPU_SIM_MAX_DEVICES];
int cu_peer = 1;
pthread_mutex_t cu_lock = PTHREAD_MUTEX_INITIALIZER;
static CUresult g_init_result = CUDA_ERROR_NOT_INITIALIZED;
static pthread_once_t g_init_once = PTHREAD_ONCE_INIT;

/* Append GPU gpu's devices to out: itself, or in MIG mode its MIG devices
 * (by GPU instance id). */
static int expand(int gpu, int *out, int n)
{
    const struct vgpu_sim_state *s = sim_state();
    if (!s->mig[gpu].mode) {
        out[n++] = gpu;
        return n;
    }
    for (int i = 0; i < VGPU_SIM_MAX_GI; i++) {
        const struct vgpu_sim_gi *g = &s->mig[gpu].gi[i];
        if (g->used && g->has_ci && n < VGPU_SIM_MAX_DEVICES)
            out[n++] = g->slot;
    }
    return n;
}

/* The slot of the one device whose UUID string (GPU- or MIG-) starts with
 * tok, or -1. */
static int by_uuid(const char *tok)
{
    int matches = 0, dev = -1;
    for (int d = 0; d < VGPU_SIM_MAX_DEVICES; d++) {
        if (d >= (int)sim_state()->count && !sim_slot_is_mig_device(d))
            continue;
        char uuid[64];
        sim_slot_uuid_string(d, uuid, sizeof uuid);
        if (strncmp(uuid, tok, strlen(tok)) == 0) {
            matches++;
            dev = d;
        }
    }
    return matches == 1 ? dev : -1;
}

/* The devices CUDA_VISIBLE_DEVICES selects, as the driver reads it: indices,
 * GPU- or MIG- UUIDs (a unique prefix is enough), in the order given, up to
 * the first entry that is invalid, unknown or repeated. Unset: every GPU. A
 * GPU in MIG mode stands for its MIG devices; and when the list holds any
 * MIG device, CUDA enumerates that one alone (one MIG device per process),
 * and no plain GPU. */
static int visible_devices(int physical, int *out)
{
    const char *env = getenv("CUDA_VISIBLE_DEVICES");
    int n = 0;
    if (!env) {
        for (int i = 0; i < physical; i++)
            n = expand(i, out, n);
    }
    const char *p = env;
    while (p && n < VGPU_SIM_MAX_DEVICES) {
        char tok[128];
        size_t len = strcspn(p, ",");
        size_t a = 0, b = len;
        while (a < b && isspace((unsigned char)p[a]))
            a++;
        while (b > a && isspace((unsigned char)p[b - 1]))
            b--;
        if (b - a == 0 || b - a >= sizeof tok)
            break;
        memcpy(tok, p + a, b - a);
        tok[b - a] = '\0';
        int dev = -1;
        if (strncmp(tok, "GPU-", 4) == 0 || strncmp(tok, "MIG-", 4) == 0) {
            dev = by_uuid(tok);
        } else if (isdigit((unsigned char)tok[0])) {
            char *end;
            long v = strtol(tok, &end, 10);
            if (*end == '\0' && v >= 0 && v < physical)
                dev = (int)v;
        }
        for (int i = 0; i < n && dev >= 0; i++)
            if (out[i] == dev || sim_slot_parent(out[i]) == dev)
                dev = -1;
        if (dev < 0)
            break;
        n = dev < physical ? expand(dev, out, n) : (out[n] = dev, n + 1);
        if (p[len] != ',')
            break;
        p += len + 1;
    }
    for (int i = 0; i < n; i++)
        if (sim_slot_gi(out[i], NULL, NULL)) {
            out[0] = out[i];
            return 1;
        }
    return n;
}

static void do_init(void)
{
    struct vgpu_sim_state *s = sim_state();
    if (!s) {
        g_init_result = CUDA_ERROR_NO_DEVICE;
        return;
    }
    cu_count = visible_devices((int)s->count, cu_phys);
    /* Whether a GPU can reach another's memory (peer access) is the
     * machine's: NVLink or a PCIe switch that allows it, or not. */
    cu_peer = sim_peer_access();
    g_init_result = cu_count > 0 ? CUDA_SUCCESS : CUDA_ERROR_NO_DEVICE;
    __atomic_store_n(&cu_initialized, g_init_result == CUDA_SUCCESS, __ATOMIC_RELEASE);
    if (g_init_result == CUDA_SUCCESS)
        gate_start_restore_thread(); /* what the checkpoint API talks to */
}

VGPU_EXPORT CUresult cuInit(unsigned int flags)
{
    if (flags != 0)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_once(&g_init_once, do_init);
    return g_init_result;
}

VGPU_EXPORT CUresult cuDriverGetVersion(int *version)
{
    ANSWER(version, sim_cuda_version());
}

CUresult cu_check_device(CUdevice dev)
{
    if (!__atomic_load_n(&cu_initialized, __ATOMIC_ACQUIRE))
        return CUDA_ERROR_NOT_INITIALIZED;
    gate_hold();
    return (dev < 0 || dev >= cu_count) ? CUDA_ERROR_INVALID_DEVICE : CUDA_SUCCESS;
}

int cu_ordinal_of(int phys)
{
    for (int i = 0; i < cu_count; i++)
        if (cu_phys[i] == phys)
            return i;
    return -1;
}

VGPU_EXPORT CUresult cuDeviceGetCount(int *count)
{
    if (!cu_initialized)
        return CUDA_ERROR_NOT_INITIALIZED;
    ANSWER(count, cu_count);
}

VGPU_EXPORT CUresult cuDeviceGet(CUdevice *dev, int ordinal)
{
    if (!cu_initialized)
        return CUDA_ERROR_NOT_INITIALIZED;
    if (!dev)
        return CUDA_ERROR_INVALID_VALUE;
    if (ordinal < 0 || ordinal >= cu_count)
        return CUDA_ERROR_INVALID_DEVICE;
    *dev = ordinal;
    return CUDA_SUCCESS;
}

VGPU_EXPORT CUresult cuDeviceGetName(char *name, int len, CUdevice dev)
{
    CHECK_DEVICE(dev);
    if (!name || len <= 0)
        return CUDA_ERROR_INVALID_VALUE;
    char own[64];
    sim_slot_name(cu_phys[dev], own, sizeof own);
    snprintf(name, (size_t)len, "%s", own);
    return CUDA_SUCCESS;
}

VGPU_EXPORT CUresult cuDeviceGetUuid(CUuuid *uuid, CUdevice dev)
{
    CHECK_DEVICE(dev);
    if (!uuid)
        return CUDA_ERROR_INVALID_VALUE;
    sim_device_uuid(sim_slot_parent(cu_phys[dev]), (unsigned char *)uuid->bytes);
    return CUDA_SUCCESS;
}

/* On a MIG device: the MIG device's UUID (cuDeviceGetUuid, the first form,
 * gives its GPU's, as NVIDIA's driver does). */
VGPU_EXPORT CUresult cuDeviceGetUuid_v2(CUuuid *uuid, CUdevice dev)
{
    CUresult rc = cuDeviceGetUuid(uuid, dev);
    if (rc == CUDA_SUCCESS && sim_slot_gi(cu_phys[dev], NULL, NULL))
        sim_slot_mig_uuid(cu_phys[dev], (unsigned char *)uuid->bytes);
    return rc;
}

VGPU_EXPORT CUresult cuDeviceGetLuid(char *luid, unsigned int *mask, CUdevice dev)
{
    (void)luid;
    (void)mask;
    CUresult rc = cu_check_device(dev);
    return rc ? rc : CUDA_ERROR_NOT_SUPPORTED; /* Windows only */
}

VGPU_EXPORT CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice dev)
{
    CHECK_DEVICE(dev);
    ANSWER(bytes, (size_t)sim_state()->dev[cu_phys[dev]].total);
}

/* The pre-3.2 form reports 32 bits. */
VGPU_EXPORT CUresult cuDeviceTotalMem(unsigned int *bytes, CUdevice dev)
{
    size_t b;
    CUresult rc = cuDeviceTotalMem_v2(&b, dev);
    if (rc == CUDA_SUCCESS)
        *bytes = b > 0xffffffffu ? 0xffffffffu : (unsigned int)b;
    return rc;
}

static const struct { int attr; int value; } k_attrs[] = {
    {1, 1024},        /* MAX_THREADS_PER_BLOCK */
    {2, 1024}, {3, 1024}, {4, 64},                /* MAX_BLOCK_DIM_X/Y/Z */
    {5, 2147483647}, {6, 65535}, {7, 65535},      /* MAX_GRID_DIM_X/Y/Z */
    {8, 49152},       /* MAX_SHARED_MEMORY_PER_BLOCK */
    {9, 65536},       /* TOTAL_CONSTANT_MEMORY */
    {10, 32},         /* WARP_SIZE */
    {11, 2147483647}, /* MAX_PITCH */
    {12, 65536},      /* MAX_REGISTERS_PER_BLOCK */
    {13, 1980000},    /* CLOCK_RATE (kHz) */
    {14, 512},        /* TEXTURE_ALIGNMENT */
    {15, 1},          /* GPU_OVERLAP */
    {16, SIM_SM_COUNT}, /* MULTIPROCESSOR_COUNT */
    {19, 1},          /* CAN_MAP_HOST_MEMORY */
    {30, 512},        /* SURFACE_ALIGNMENT */
    {31, 1},          /* CONCURRENT_KERNELS */
    {32, 1},          /* ECC_ENABLED */
    {36, 2619000},    /* MEMORY_CLOCK_RATE (kHz) */
    {37, 5120},       /* GLOBAL_MEMORY_BUS_WIDTH */
    {38, 52428800},   /* L2_CACHE_SIZE */
    {39, 2048},       /* MAX_THREADS_PER_MULTIPROCESSOR */
    {40, 3},          /* ASYNC_ENGINE_COUNT */
    {41, 1},          /* UNIFIED_ADDRESSING */
    {75, SIM_CC_MAJOR}, {76, SIM_CC_MINOR},       /* COMPUTE_CAPABILITY */
    {78, 1},          /* STREAM_PRIORITIES_SUPPORTED */
    {79, 1}, {80, 1}, /* GLOBAL/LOCAL_L1_CACHE_SUPPORTED */
    {81, 233472},     /* MAX_SHARED_MEMORY_PER_MULTIPROCESSOR */
    {82, 65536},      /* MAX_REGISTERS_PER_MULTIPROCESSOR */
    {83, 1},          /* MANAGED_MEMORY */
    {87, 2},          /* SINGLE_TO_DOUBLE_PRECISION_PERF_RATIO */
    {89, 1},          /* CONCURRENT_MANAGED_ACCESS */
    {90, 1},          /* COMPUTE_PREEMPTION_SUPPORTED */
    {91, 1},          /* CAN_USE_HOST_POINTER_FOR_REGISTERED_MEM */
    {95, 1},          /* COOPERATIVE_LAUNCH */
    {97, 232448},     /* MAX_SHARED_MEMORY_PER_BLOCK_OPTIN */
    {99, 1},          /* CAN_FLUSH_REMOTE_WRITES */
    {100, 1},         /* HOST_REGISTER_SUPPORTED */
    {102, 1},         /* VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED */
    {103, 1},         /* HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED */
    {106, 32},        /* MAX_BLOCKS_PER_MULTIPROCESSOR */
    {108, 1},         /* MAX_PERSISTING_L2_CACHE_SIZE: see below */
    {111, 1024},      /* RESERVED_SHARED_MEMORY_PER_BLOCK */
    {115, 1},         /* MEMORY_POOLS_SUPPORTED */
    {119, 1},         /* MEMPOOL_SUPPORTED_HANDLE_TYPES: POSIX fd */
    {120, 1},         /* CLUSTER_LAUNCH */
};

VGPU_EXPORT CUresult cuDeviceGetAttribute(int *value, CUdevice_attribute attr, CUdevice dev)
{
    CHECK_DEVICE(dev);
    if (!value || (int)attr <= 0 || (int)attr >= 160)
        return CUDA_ERROR_INVALID_VALUE;
    switch ((int)attr) {
    case 33: /* PCI_BUS_ID */
        *value = sim_slot_parent(cu_phys[dev]) + 1;
        return CUDA_SUCCESS;
    case 16: /* MULTIPROCESSOR_COUNT: a MIG device's are its profile's */
        *value = sim_slot_sms(cu_phys[dev]);
        return CUDA_SUCCESS;
    case 108: /* MAX_PERSISTING_L2_CACHE_SIZE */
        *value = 82837504;
        return CUDA_SUCCESS;
    }
    *value = 0;
    for (size_t i = 0; i < sizeof k_attrs / sizeof k_attrs[0]; i++)
        if (k_attrs[i].attr == (int)attr)
            *value = k_attrs[i].value;
    return CUDA_SUCCESS;
}

typedef struct {
    int maxThreadsPerBlock;
    int maxThreadsDim[3];
    int maxGridSize[3];
    int sharedMemPerBlock;
    int totalConstantMemory;
    int SIMDWidth;
    int memPitch;
    int regsPerBlock;
    int clockRate;
    int textureAlign;
} CUdevprop;

VGPU_EXPORT CUresult cuDeviceGetProperties(CUdevprop *p, CUdevice dev)
{
    CHECK_DEVICE(dev);
    if (!p)
        return CUDA_ERROR_INVALID_VALUE;
    *p = (CUdevprop){1024, {1024, 1024, 64}, {2147483647, 65535, 65535}, 49152, 65536,
                     32, 2147483647, 65536, 1980000, 512};
    return CUDA_SUCCESS;
}

VGPU_EXPORT CUresult cuDeviceComputeCapability(int *major, int *minor, CUdevice dev)
{
    CHECK_DEVICE(dev);
    if (!major || !minor)
        return CUDA_ERROR_INVALID_VALUE;
    *major = SIM_CC_MAJOR;
    *minor = SIM_CC_MINOR;
    return CUDA_SUCCESS;
}

VGPU_EXPORT CUresult cuDeviceGetPCIBusId(char *bus_id, int len, CUdevice dev)
{
    CHECK_DEVICE(dev);
    if (!bus_id || len <= 0)
        return CUDA_ERROR_INVALID_VALUE;
    sim_device_bus_id(sim_slot_parent(cu_phys[dev]), bus_id, (size_t)len, 0);
    return CUDA_SUCCESS;
}

VGPU_EXPORT CUresult cuDeviceGetByPCIBusId(CUdevice *dev, const char *bus_id)
{
    if (!cu_initialized)
        return CUDA_ERROR_NOT_INITIALIZED;
    if (!dev || !bus_id)
        return CUDA_ERROR_INVALID_VALUE;
    unsigned int domain, bus, device, fn = 0;
    if (sscanf(bus_id, "%x:%x:%x.%x", &domain, &bus, &device, &fn) < 3)
        return CUDA_ERROR_INVALID_VALUE;
    for (int i = 0; i < cu_count; i++) {
        if (domain == 0 && device == 0 && fn == 0 && bus == (unsigned)sim_slot_parent(cu_phys[i]) + 1) {
            *dev = i;
            return CUDA_SUCCESS;
        }
    }
    return CUDA_ERROR_INVALID_DEVICE;
}

/* Peer access: every GPU reaches every other, unless VGPU_SIM_PEER=0 (a
 * machine whose GPUs can't: the driver then says no here, and refuses
 * cuCtxEnablePeerAccess with CUDA_ERROR_PEER_ACCESS_UNSUPPORTED). A device
 * is not its own peer. */
VGPU_EXPORT CUresult cuDeviceCanAccessPeer(int *can, CUdevice dev, CUdevice peer)
{
    CUresult rc = cu_check_device(dev);
    if (!rc)
        rc = cu_check_device(peer);
    if (rc)
        return rc;
    ANSWER(can, cu_peer && dev != peer);
}

/* CUdevice_P2PAttribute: 1 performance rank, 2 access supported, 3 native
 * atomics (none: no NVLink here), 4 CUDA array access. */
VGPU_EXPORT CUresult cuDeviceGetP2PAttribute(int *value, int attr, CUdevice src, CUdevice dst)
{
    CUresult rc = cu_check_device(src);
    if (!rc)
        rc = cu_check_device(dst);
    if (rc)
        return rc;
    if (!value)
        return CUDA_ERROR_INVALID_VALUE;
    if (src == dst)
        return CUDA_ERROR_INVALID_DEVICE;
    switch (attr) {
    case 1:
    case 3:
        *value = 0;
        return CUDA_SUCCESS;
    case 2:
    case 4:
        *value = cu_peer;
        return CUDA_SUCCESS;
    default:
        return CUDA_ERROR_INVALID_VALUE;
    }
}

/* The widest 1D texture over linear memory: 2^28 elements, whatever the
 * format (an H100's). */
VGPU_EXPORT CUresult cuDeviceGetTexture1DLinearMaxWidth(size_t *width, int format,
                                                        unsigned int channels, CUdevice dev)
{
    CHECK_DEVICE(dev);
    if (!width || format <= 0 || (channels != 1 && channels != 2 && channels != 4))
        return CUDA_ERROR_INVALID_VALUE;
    *width = (size_t)1 << 28;
    return CUDA_SUCCESS;
}

/* Atomic operations the device can do natively on host memory, or on a
 * peer's over the link: none here (a PCIe board with no NVLink; the
 * simulator's devices model no host or peer atomics). */
static CUresult atomic_caps(unsigned int *caps, const int *ops, unsigned int count)
{
    if (!caps || (count && !ops))
        return CUDA_ERROR_INVALID_VALUE;
    for (unsigned int i = 0; i < count; i++)
        caps[i] = 0;
    return CUDA_SUCCESS;
}

VGPU_EXPORT CUresult cuDeviceGetHostAtomicCapabilities(unsigned int *caps, const int *ops,
                                                       unsigned int count, CUdevice dev)
{
    CUresult rc = cu_check_device(dev);
    return rc ? rc : atomic_caps(caps, ops, count);
}

VGPU_EXPORT CUresult cuDeviceGetP2PAtomicCapabilities(unsigned int *caps, const int *ops,
                                                      unsigned int count, CUdevice src,
                                                      CUdevice dst)
{
    CUresult rc = cu_check_device(src);
    if (!rc)
        rc = cu_check_device(dst);
    return rc ? rc : atomic_caps(caps, ops, count);
}
