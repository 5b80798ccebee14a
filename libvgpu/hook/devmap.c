/*
 * devmap.c - which device of the job's region a call is about.
 *
 * The driver has already applied CUDA_VISIBLE_DEVICES (indices or UUIDs), so
 * a CUDA ordinal is turned into the physical GPU's UUID with the real
 * cuDeviceGetUuid and matched against limits.dev[i].uuid; NVML handles are
 * matched the same way through nvmlDeviceGetUUID. Both answers are cached.
 *
 * When the daemon moves the job to another GPU (docs/suspend.md), the
 * process's CUDA devices become the new GPUs and the daemon writes their
 * UUIDs into the same places of the region (and bumps its generation): an
 * ordinal keeps its place, so that cache holds; an NVML handle names a
 * physical GPU, so that cache is dropped whenever the generation moves.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "hook.h"

#define MAX_ORDINALS 64
#define MAX_NVML 64

static pthread_mutex_t map_lock = PTHREAD_MUTEX_INITIALIZER;
/* ordinal -> region index + 2; 1 = not part of the job; 0 = not asked yet */
static int ord_cache[MAX_ORDINALS];
static struct {
    nvmlDevice_t handle;
    int dev;
} nvml_cache[MAX_NVML];
static unsigned nvml_count;
static uint64_t nvml_gen;   /* the limits' generation nvml_cache was filled at */

int vgpu_g_single_dev = -1;
static uint32_t ctx_mask;
static int ctx_elsewhere;

static void uuid_text(const CUuuid *u, char *out, size_t len)
{
    const unsigned char *b = (const unsigned char *)u->bytes;
    snprintf(out, len,
             "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x",
             b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12],
             b[13], b[14], b[15]);
}

/* A UUID's hex part, past its "GPU-" or "MIG-". CUDA gives a MIG device's
 * UUID as 16 bytes, as it gives a GPU's, so an ordinal's text always says
 * "GPU-"; NVML and the region name a MIG device "MIG-" (docs/mig.md). The
 * two kinds never share their hex. */
static const char *uuid_hex(const char *u)
{
    if (strncasecmp(u, "GPU-", 4) == 0 || strncasecmp(u, "MIG-", 4) == 0)
        return u + 4;
    return u;
}

/* Needs map_lock. In private mode every GPU joins on first sight. */
static int find_uuid(const char *uuid)
{
    const char *hex = uuid_hex(uuid);
    const struct vgpu_limits *lim = vgpu_g_limits;
    uint32_t n = __atomic_load_n(&lim->ndevices, __ATOMIC_ACQUIRE);
    if (n > VGPU_MAX_DEVICES)
        n = VGPU_MAX_DEVICES;
    for (uint32_t i = 0; i < n; i++)
        if (strncasecmp(uuid_hex(lim->dev[i].uuid), hex, VGPU_UUID_LEN - 4) == 0)
            return (int)i;
    if (vgpu_g_private)
        return vgpu_private_add_device(uuid);
    return -1;
}

const char *vgpu_dev_uuid(int d)
{
    return vgpu_g_limits->dev[d].uuid;
}

int vgpu_dev_of_ordinal(CUdevice ordinal)
{
    if (ordinal >= 0 && ordinal < MAX_ORDINALS) {
        int v = __atomic_load_n(&ord_cache[ordinal], __ATOMIC_ACQUIRE);
        if (VGPU_LIKELY(v != 0))
            return v - 2;
    }
    CUuuid u;
    CUresult r = vgpu_real_present(VGPU_H_cuDeviceGetUuid_v2)
                     ? REAL(cuDeviceGetUuid_v2)(&u, ordinal)
                     : REAL(cuDeviceGetUuid)(&u, ordinal);
    if (r != CUDA_SUCCESS)
        return -1;
    char text[64];
    uuid_text(&u, text, sizeof(text));
    pthread_mutex_lock(&map_lock);
    int d = find_uuid(text);
    if (ordinal >= 0 && ordinal < MAX_ORDINALS)
        __atomic_store_n(&ord_cache[ordinal], d + 2, __ATOMIC_RELEASE);
    pthread_mutex_unlock(&map_lock);
    if (d < 0)
        vgpu_log(VGPU_LOG_WARN, "CUDA device %d (%s) is not one of the job's GPUs; "
                 "nothing can be allocated on it", ordinal, text);
    return d;
}

int vgpu_dev_current(void)
{
    CUdevice o;
    if (REAL(cuCtxGetDevice)(&o) != CUDA_SUCCESS)
        return VGPU_DEV_NO_CONTEXT;
    return vgpu_dev_of_ordinal(o);
}

int vgpu_dev_of_nvml(nvmlDevice_t h)
{
    uint64_t gen = __atomic_load_n(&vgpu_g_limits->generation, __ATOMIC_ACQUIRE);
    if (gen != __atomic_load_n(&nvml_gen, __ATOMIC_ACQUIRE)) {
        pthread_mutex_lock(&map_lock);
        __atomic_store_n(&nvml_count, 0, __ATOMIC_RELEASE);
        __atomic_store_n(&nvml_gen, gen, __ATOMIC_RELEASE);
        pthread_mutex_unlock(&map_lock);
    }
    unsigned n = __atomic_load_n(&nvml_count, __ATOMIC_ACQUIRE);
    for (unsigned i = 0; i < n; i++)
        if (nvml_cache[i].handle == h)
            return nvml_cache[i].dev;
    char uuid[NVML_DEVICE_UUID_V2_BUFFER_SIZE];
    if (REAL(nvmlDeviceGetUUID)(h, uuid, sizeof(uuid)) != NVML_SUCCESS)
        return -1;
    pthread_mutex_lock(&map_lock);
    int d = find_uuid(uuid);
    n = nvml_count;
    if (n < MAX_NVML) {
        nvml_cache[n].handle = h;
        nvml_cache[n].dev = d;
        __atomic_store_n(&nvml_count, n + 1, __ATOMIC_RELEASE);
    }
    pthread_mutex_unlock(&map_lock);
    return d;
}

/* A context was created on region device d (-1: a GPU outside the job).
 * While all of the process's contexts are on one device, the launch gate
 * knows the device without asking the driver. */
void vgpu_note_ctx_device(int d)
{
    pthread_mutex_lock(&map_lock);
    if (d < 0)
        ctx_elsewhere = 1;
    else
        ctx_mask |= 1u << d;
    int single = (!ctx_elsewhere && ctx_mask != 0 && (ctx_mask & (ctx_mask - 1)) == 0)
                     ? __builtin_ctz(ctx_mask) : -1;
    __atomic_store_n(&vgpu_g_single_dev, single, __ATOMIC_RELEASE);
    pthread_mutex_unlock(&map_lock);
}

void vgpu_devmap_atfork_child(void)
{
    pthread_mutex_init(&map_lock, NULL);
    ctx_mask = 0;
    ctx_elsewhere = 0;
    vgpu_g_single_dev = -1;
}
