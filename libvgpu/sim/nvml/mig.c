/*
 * mig.c - MIG in the simulated NVML: a GPU's MIG mode, its GPU instance
 * profiles and placements, GPU and compute instances, and the MIG devices
 * (one per compute instance) with their handles; the layout itself is the
 * shared state's (common/mig.c), so every process sees one.
 *
 * Changing the layout (MIG mode, creating and destroying instances) takes a
 * privileged caller: here the uid VGPU_SIM_MIG_ADMIN (default 0); anyone
 * else gets NVML_ERROR_NO_PERMISSION. Reads need no privilege. MIG mode
 * changes at once, as on Hopper (no GPU reset).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "mig.h"

struct nvmlGpuInstance_st {
    int gpu, id;
};
struct nvmlComputeInstance_st {
    int gpu, gi;
};

/* One handle per (GPU, GPU instance id): reused by the next instance of
 * that id, as NVIDIA's handles may be. */
static struct nvmlGpuInstance_st g_gi[VGPU_SIM_MAX_GPUS][VGPU_SIM_MAX_GI];
static struct nvmlComputeInstance_st g_ci[VGPU_SIM_MAX_GPUS][VGPU_SIM_MAX_GI];

static nvmlGpuInstance_t gi_handle(int gpu, int id)
{
    g_gi[gpu][id - 1] = (struct nvmlGpuInstance_st){gpu, id};
    return &g_gi[gpu][id - 1];
}

static nvmlComputeInstance_t ci_handle(int gpu, int gi)
{
    g_ci[gpu][gi - 1] = (struct nvmlComputeInstance_st){gpu, gi};
    return &g_ci[gpu][gi - 1];
}

/* The GPU instance at offset k of a handle table (gpu-major, then id - 1),
 * if it is in use (and, with need_ci, has its compute instance); else NULL. */
static const struct vgpu_sim_gi *instance_at(ptrdiff_t k, int *gpu, int *id, int need_ci)
{
    if (k < 0 || k >= VGPU_SIM_MAX_GPUS * VGPU_SIM_MAX_GI)
        return NULL;
    *gpu = (int)k / VGPU_SIM_MAX_GI;
    *id = (int)k % VGPU_SIM_MAX_GI + 1;
    const struct vgpu_sim_gi *g = &sim_state()->mig[*gpu].gi[*id - 1];
    return *gpu < (int)sim_state()->count && g->used && (g->has_ci || !need_ci) ? g : NULL;
}

/* The instance behind a GPU instance handle, or NULL. */
static const struct vgpu_sim_gi *gi_of(nvmlGpuInstance_t h, int *gpu, int *id)
{
    return h ? instance_at(h - &g_gi[0][0], gpu, id, 0) : NULL;
}

/* The GPU instance of a compute instance handle, or NULL. */
static const struct vgpu_sim_gi *ci_of(nvmlComputeInstance_t h, int *gpu, int *gi)
{
    return h ? instance_at(h - &g_ci[0][0], gpu, gi, 1) : NULL;
}

/* Start of a call on a GPU instance's handle h (of: gi_of), or a compute
 * instance's (ci_of): nvml_enter()'s error, or NVML_ERROR_INVALID_ARGUMENT
 * for a handle that is not one now; else declare `rc`, `gpu`, `id` and `g`,
 * the GPU instance. */
#define NVML_INSTANCE(of, h, gpu, id, g)              \
    nvmlReturn_t rc = nvml_enter();                   \
    if (rc)                                           \
        return rc;                                    \
    int gpu, id;                                      \
    const struct vgpu_sim_gi *g = of(h, &gpu, &id);   \
    if (!g)                                           \
        return NVML_ERROR_INVALID_ARGUMENT;

int nvml_mig_slot(nvmlDevice_t d)
{
    int slot = nvml_slot(d);
    return slot >= VGPU_SIM_MAX_GPUS && sim_slot_is_mig_device(slot) ? slot : -1;
}

int nvml_any_slot(nvmlDevice_t d)
{
    int i = nvml_index(d);
    return i >= 0 ? i : nvml_mig_slot(d);
}

int nvml_mig_mode(int gpu)
{
    return sim_state()->mig[gpu].mode != 0;
}

/* The caller may change the MIG layout: its uid is VGPU_SIM_MIG_ADMIN's. */
static int privileged(void)
{
    const char *s = getenv("VGPU_SIM_MIG_ADMIN");
    long uid = 0;
    if (s && *s) {
        char *end;
        uid = strtol(s, &end, 10);
        if (*end)
            uid = 0;
    }
    return (long)geteuid() == uid;
}

static nvmlReturn_t nvml_of(int rc)
{
    switch (rc) {
    case SIM_MIG_OK: return NVML_SUCCESS;
    case SIM_MIG_NOT_SUPPORTED: return NVML_ERROR_NOT_SUPPORTED;
    case SIM_MIG_NO_ROOM: return NVML_ERROR_INSUFFICIENT_RESOURCES;
    case SIM_MIG_IN_USE: return NVML_ERROR_IN_USE;
    default: return NVML_ERROR_INVALID_ARGUMENT;
    }
}

/* ---- MIG mode and MIG devices ---- */

/* A change of the layout (root's): fn(state, gpu, id) under the lock. */
static nvmlReturn_t change(int gpu, int id, int (*fn)(struct vgpu_sim_state *, int, int))
{
    if (!privileged())
        return NVML_ERROR_NO_PERMISSION;
    sim_lock(1);
    nvmlReturn_t rc = nvml_of(fn(sim_state(), gpu, id));
    sim_unlock();
    return rc;
}

static int set_mode(struct vgpu_sim_state *s, int gpu, int mode)
{
    return sim_mig_set_mode(s, gpu, (unsigned int)mode);
}

VGPU_EXPORT nvmlReturn_t nvmlDeviceGetMigMode(nvmlDevice_t d, unsigned int *cur, unsigned int *pending)
{
    NVML_DEVICE(d, i);
    if (!cur || !pending)
        return NVML_ERROR_INVALID_ARGUMENT;
    *cur = *pending = (unsigned int)nvml_mig_mode(i); /* Hopper: no reset pending */
    return NVML_SUCCESS;
}

/* Refused with IN_USE (as the activation status too) while a process holds
 * memory or a context on the GPU, or, to turn MIG off, while it has GPU
 * instances. */
VGPU_EXPORT nvmlReturn_t nvmlDeviceSetMigMode(nvmlDevice_t d, unsigned int mode,
                                              nvmlReturn_t *status)
{
    NVML_DEVICE(d, i);
    if (!status || mode > NVML_DEVICE_MIG_ENABLE)
        return NVML_ERROR_INVALID_ARGUMENT;
    nvmlReturn_t rc = change(i, (int)mode, set_mode);
    if (rc != NVML_ERROR_NO_PERMISSION)
        *status = rc;
    return rc;
}

VGPU_EXPORT nvmlReturn_t nvmlDeviceIsMigDeviceHandle(nvmlDevice_t d, unsigned int *is_mig)
{
    NVML_ANY_DEVICE(d, slot);
    ANSWER(is_mig, slot >= VGPU_SIM_MAX_GPUS);
}

VGPU_EXPORT nvmlReturn_t nvmlDeviceGetMaxMigDeviceCount(nvmlDevice_t d, unsigned int *count)
{
    NVML_DEVICE(d, i);
    ANSWER(count, nvml_mig_mode(i) ? VGPU_SIM_MAX_GI : 0);
}

/* Index i is GPU instance i + 1's MIG device: NOT_FOUND where there is
 * none (callers skip the gaps). */
VGPU_EXPORT nvmlReturn_t nvmlDeviceGetMigDeviceHandleByIndex(nvmlDevice_t d, unsigned int index,
                                                             nvmlDevice_t *mig)
{
    NVML_DEVICE(d, i);
    if (!mig || !nvml_mig_mode(i) || index >= VGPU_SIM_MAX_GI)
        return NVML_ERROR_INVALID_ARGUMENT;
    const struct vgpu_sim_gi *g = &sim_state()->mig[i].gi[index];
    if (!g->used || !g->has_ci)
        return NVML_ERROR_NOT_FOUND;
    *mig = nvml_handle(g->slot);
    return NVML_SUCCESS;
}

VGPU_EXPORT nvmlReturn_t nvmlDeviceGetDeviceHandleFromMigDeviceHandle(nvmlDevice_t mig,
                                                                      nvmlDevice_t *d)
{
    nvmlReturn_t rc = nvml_enter();
    if (rc)
        return rc;
    int slot = nvml_mig_slot(mig);
    if (slot < 0 || !d)
        return NVML_ERROR_INVALID_ARGUMENT;
    *d = nvml_handle(sim_slot_parent(slot));
    return NVML_SUCCESS;
}

/* A MIG device's GPU instance id; a GPU is no MIG device: NOT_SUPPORTED. */
VGPU_EXPORT nvmlReturn_t nvmlDeviceGetGpuInstanceId(nvmlDevice_t d, unsigned int *id)
{
    NVML_ANY_DEVICE(d, slot);
    int gpu, gi;
    if (!id)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (!sim_slot_gi(slot, &gpu, &gi))
        return NVML_ERROR_NOT_SUPPORTED;
    *id = (unsigned int)gi;
    return NVML_SUCCESS;
}

VGPU_EXPORT nvmlReturn_t nvmlDeviceGetComputeInstanceId(nvmlDevice_t d, unsigned int *id)
{
    NVML_ANY_DEVICE(d, slot);
    if (!id)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (!sim_slot_gi(slot, NULL, NULL))
        return NVML_ERROR_NOT_SUPPORTED;
    *id = 0; /* the one compute instance of its GPU instance */
    return NVML_SUCCESS;
}

/* GPUs by their GPU- UUID, MIG devices by their MIG- one. */
VGPU_EXPORT nvmlReturn_t nvmlDeviceGetHandleByUUID(const char *uuid, nvmlDevice_t *dev)
{
    nvmlReturn_t rc = nvml_enter();
    if (rc)
        return rc;
    if (!uuid || !dev)
        return NVML_ERROR_INVALID_ARGUMENT;
    for (int d = 0; d < VGPU_SIM_MAX_DEVICES; d++) {
        if (d < VGPU_SIM_MAX_GPUS ? d >= (int)sim_state()->count : !sim_slot_is_mig_device(d))
            continue;
        char u[NVML_DEVICE_UUID_BUFFER_SIZE];
        sim_slot_uuid_string(d, u, sizeof u);
        if (strcmp(u, uuid) == 0) {
            *dev = nvml_handle(d);
            return NVML_SUCCESS;
        }
    }
    return NVML_ERROR_NOT_FOUND;
}

/* ---- GPU instance profiles ---- */

/* What an H100's instances have besides SMs: copy engines, decoders,
 * JPEG and optical-flow engines, by compute slices. */
static void engines(const struct sim_mig_profile *p, unsigned int *ce, unsigned int *dec,
                    unsigned int *jpeg, unsigned int *ofa)
{
    *ce = p->compute == 7 ? 8 : p->compute;
    *dec = p->compute == 7 ? 7 : (p->compute + 1) / 2;
    *jpeg = *dec;
    *ofa = p->compute == 7;
}

/* The profile of index `profile` on GPU i in MIG mode, or an error. */
static nvmlReturn_t profile_at(int i, unsigned int profile, const struct sim_mig_profile **p)
{
    if (profile >= NVML_GPU_INSTANCE_PROFILE_COUNT)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (!nvml_mig_mode(i) || !(*p = sim_mig_profile(profile)))
        return NVML_ERROR_NOT_SUPPORTED;
    return NVML_SUCCESS;
}

static nvmlReturn_t gi_profile_info(nvmlDevice_t d, unsigned int profile,
                                    nvmlGpuInstanceProfileInfo_v2_t *info, int v2)
{
    NVML_DEVICE(d, i);
    const struct sim_mig_profile *p;
    if (!info)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (v2 && info->version != nvmlGpuInstanceProfileInfo_v2)
        return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    nvmlReturn_t rc = profile_at(i, profile, &p);
    if (rc)
        return rc;
    nvmlGpuInstanceProfileInfo_t v1 = {.id = p->id, .sliceCount = p->compute,
                                       .instanceCount = p->count,
                                       .multiprocessorCount = p->sms,
                                       .memorySizeMB = sim_mig_memory(sim_state(), p) >> 20};
    engines(p, &v1.copyEngineCount, &v1.decoderCount, &v1.jpegCount, &v1.ofaCount);
    if (!v2) {
        memcpy(info, &v1, sizeof v1);
        return NVML_SUCCESS;
    }
    memcpy(&info->id, &v1, offsetof(nvmlGpuInstanceProfileInfo_t, memorySizeMB));
    info->memorySizeMB = v1.memorySizeMB;
    sim_mig_profile_name(sim_state(), p, info->name, sizeof info->name);
    return NVML_SUCCESS;
}

VGPU_EXPORT nvmlReturn_t nvmlDeviceGetGpuInstanceProfileInfo(nvmlDevice_t d, unsigned int profile,
                                                             nvmlGpuInstanceProfileInfo_t *info)
{
    return gi_profile_info(d, profile, (nvmlGpuInstanceProfileInfo_v2_t *)info, 0);
}

VGPU_EXPORT nvmlReturn_t nvmlDeviceGetGpuInstanceProfileInfoV(nvmlDevice_t d, unsigned int profile,
                                                              nvmlGpuInstanceProfileInfo_v2_t *info)
{
    return gi_profile_info(d, profile, info, 1);
}

VGPU_EXPORT nvmlReturn_t nvmlDeviceGetGpuInstanceProfileInfoByIdV(
    nvmlDevice_t d, unsigned int id, nvmlGpuInstanceProfileInfo_v2_t *info)
{
    const struct sim_mig_profile *p = sim_mig_profile_by_id(id);
    return gi_profile_info(d, p ? p->nvml : NVML_GPU_INSTANCE_PROFILE_COUNT, info, 1);
}

/* A profile id (what the profile info's id says) on GPU i in MIG mode. */
static nvmlReturn_t profile_id(int i, unsigned int id, const struct sim_mig_profile **p)
{
    if (!(*p = sim_mig_profile_by_id(id)))
        return NVML_ERROR_INVALID_ARGUMENT;
    return nvml_mig_mode(i) ? NVML_SUCCESS : NVML_ERROR_NOT_SUPPORTED;
}

/* Every placement of the profile, taken or not, in MIG mode or not (as
 * NVIDIA documents); placements NULL: *count is set to how many. */
VGPU_EXPORT nvmlReturn_t nvmlDeviceGetGpuInstancePossiblePlacements_v2(
    nvmlDevice_t d, unsigned int id, nvmlGpuInstancePlacement_t *placements, unsigned int *count)
{
    NVML_DEVICE(d, i);
    (void)i;
    const struct sim_mig_profile *p = sim_mig_profile_by_id(id);
    if (!p || !count)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (placements && *count < p->count) {
        *count = p->count;
        return NVML_ERROR_INSUFFICIENT_SIZE;
    }
    for (unsigned int k = 0; placements && k < p->count; k++)
        placements[k] = (nvmlGpuInstancePlacement_t){k * p->size, p->size};
    *count = p->count;
    return NVML_SUCCESS;
}
VGPU_ALIAS(nvmlDeviceGetGpuInstancePossiblePlacements_v2,
           nvmlDeviceGetGpuInstancePossiblePlacements)

VGPU_EXPORT nvmlReturn_t nvmlDeviceGetGpuInstanceRemainingCapacity(nvmlDevice_t d,
                                                                   unsigned int id,
                                                                   unsigned int *count)
{
    NVML_DEVICE(d, i);
    const struct sim_mig_profile *p;
    nvmlReturn_t rc = count ? profile_id(i, id, &p) : NVML_ERROR_INVALID_ARGUMENT;
    if (rc)
        return rc;
    sim_lock(0);
    *count = sim_mig_remaining(sim_state(), i, p);
    sim_unlock();
    return NVML_SUCCESS;
}

/* ---- GPU instances ---- */

static nvmlReturn_t create_gi(nvmlDevice_t d, unsigned int id,
                              const nvmlGpuInstancePlacement_t *placement, int with_placement,
                              nvmlGpuInstance_t *out)
{
    NVML_DEVICE(d, i);
    const struct sim_mig_profile *p;
    if (!out || (with_placement && !placement))
        return NVML_ERROR_INVALID_ARGUMENT;
    nvmlReturn_t rc = profile_id(i, id, &p);
    if (rc)
        return rc;
    if (with_placement && placement->size != p->size)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (!privileged())
        return NVML_ERROR_NO_PERMISSION;
    int start = with_placement ? (int)(placement->start < 8 ? placement->start : 99) : -1;
    int gi;
    sim_lock(1);
    rc = nvml_of(sim_mig_create_gi(sim_state(), i, p, start, &gi));
    sim_unlock();
    if (rc == NVML_SUCCESS)
        *out = gi_handle(i, gi);
    return rc;
}

VGPU_EXPORT nvmlReturn_t nvmlDeviceCreateGpuInstance(nvmlDevice_t d, unsigned int id,
                                                     nvmlGpuInstance_t *gi)
{
    return create_gi(d, id, NULL, 0, gi);
}

VGPU_EXPORT nvmlReturn_t nvmlDeviceCreateGpuInstanceWithPlacement(
    nvmlDevice_t d, unsigned int id, const nvmlGpuInstancePlacement_t *placement,
    nvmlGpuInstance_t *gi)
{
    return create_gi(d, id, placement, 1, gi);
}

VGPU_EXPORT nvmlReturn_t nvmlDeviceGetGpuInstances(nvmlDevice_t d, unsigned int id,
                                                   nvmlGpuInstance_t *gis, unsigned int *count)
{
    NVML_DEVICE(d, i);
    const struct sim_mig_profile *p;
    nvmlReturn_t rc = count ? profile_id(i, id, &p) : NVML_ERROR_INVALID_ARGUMENT;
    if (rc)
        return rc;
    unsigned int n = 0;
    sim_lock(0);
    for (int k = 0; k < VGPU_SIM_MAX_GI; k++) {
        const struct vgpu_sim_gi *g = &sim_state()->mig[i].gi[k];
        if (g->used && g->profile == p->nvml) {
            if (gis)
                gis[n] = gi_handle(i, k + 1);
            n++;
        }
    }
    sim_unlock();
    *count = n;
    return NVML_SUCCESS;
}

VGPU_EXPORT nvmlReturn_t nvmlDeviceGetGpuInstanceById(nvmlDevice_t d, unsigned int id,
                                                      nvmlGpuInstance_t *gi)
{
    NVML_DEVICE(d, i);
    if (!gi || id < 1 || id > VGPU_SIM_MAX_GI)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (!nvml_mig_mode(i))
        return NVML_ERROR_NOT_SUPPORTED;
    if (!sim_state()->mig[i].gi[id - 1].used)
        return NVML_ERROR_NOT_FOUND;
    *gi = gi_handle(i, (int)id);
    return NVML_SUCCESS;
}

VGPU_EXPORT nvmlReturn_t nvmlGpuInstanceGetInfo(nvmlGpuInstance_t h, nvmlGpuInstanceInfo_t *info)
{
    NVML_INSTANCE(gi_of, h, gpu, id, g)
    if (!info)
        return NVML_ERROR_INVALID_ARGUMENT;
    const struct sim_mig_profile *p = sim_mig_profile(g->profile);
    *info = (nvmlGpuInstanceInfo_t){nvml_handle(gpu), (unsigned int)id, p->id,
                                    {g->start, p->size}};
    return NVML_SUCCESS;
}

/* IN_USE while it has its compute instance, or a process uses it. */
VGPU_EXPORT nvmlReturn_t nvmlGpuInstanceDestroy(nvmlGpuInstance_t h)
{
    NVML_INSTANCE(gi_of, h, gpu, id, g)
    (void)g;
    return change(gpu, id, sim_mig_destroy_gi);
}

/* ---- compute instances: the one that spans its GPU instance ---- */

/* The compute profile of GPU instance g: the one spanning it. Smaller
 * ones are not modelled (NOT_SUPPORTED). */
static nvmlReturn_t ci_profile(const struct vgpu_sim_gi *g, unsigned int profile,
                               const struct sim_mig_profile **p)
{
    if (profile >= NVML_COMPUTE_INSTANCE_PROFILE_COUNT)
        return NVML_ERROR_INVALID_ARGUMENT;
    *p = sim_mig_profile(g->profile);
    return profile == (*p)->ci_profile ? NVML_SUCCESS : NVML_ERROR_NOT_SUPPORTED;
}

static nvmlReturn_t ci_profile_info(nvmlGpuInstance_t h, unsigned int profile, unsigned int eng,
                                    nvmlComputeInstanceProfileInfo_v2_t *info, int v2)
{
    NVML_INSTANCE(gi_of, h, gpu, id, g)
    if (!info || eng != NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (v2 && info->version != nvmlComputeInstanceProfileInfo_v2)
        return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    const struct sim_mig_profile *p;
    if ((rc = ci_profile(g, profile, &p)))
        return rc;
    nvmlComputeInstanceProfileInfo_t v1 = {.id = p->ci_profile, .sliceCount = p->compute,
                                           .instanceCount = 1, .multiprocessorCount = p->sms};
    engines(p, &v1.sharedCopyEngineCount, &v1.sharedDecoderCount, &v1.sharedJpegCount,
            &v1.sharedOfaCount);
    if (!v2) {
        memcpy(info, &v1, sizeof v1);
        return NVML_SUCCESS;
    }
    memcpy(&info->id, &v1, sizeof v1);
    char name[32];
    sim_mig_profile_name(sim_state(), p, name, sizeof name);
    snprintf(info->name, sizeof info->name, "%uc.%s", p->compute, name);
    return NVML_SUCCESS;
}

/* The start of a call on GPU instance h with compute instance profile
 * `profile`: NVML entered, h a GPU instance (*gpu, *id, *g), `out` given,
 * the profile one of h's (*p). */
static nvmlReturn_t gi_call(nvmlGpuInstance_t h, unsigned int profile, const void *out, int *gpu,
                            int *id, const struct vgpu_sim_gi **g,
                            const struct sim_mig_profile **p)
{
    nvmlReturn_t rc = nvml_enter();
    if (rc)
        return rc;
    *g = gi_of(h, gpu, id);
    if (!*g || !out)
        return NVML_ERROR_INVALID_ARGUMENT;
    return ci_profile(*g, profile, p);
}

/* gi_call's start, declaring `gpu`, `id`, `g`, `p` and `rc`. */
#define GI_CALL(h, profile, out)                                      \
    int gpu, id;                                                      \
    const struct vgpu_sim_gi *g;                                      \
    const struct sim_mig_profile *p;                                  \
    nvmlReturn_t rc = gi_call(h, profile, out, &gpu, &id, &g, &p);    \
    if (rc)                                                           \
        return rc;

VGPU_EXPORT nvmlReturn_t nvmlGpuInstanceGetComputeInstanceProfileInfo(
    nvmlGpuInstance_t h, unsigned int profile, unsigned int eng,
    nvmlComputeInstanceProfileInfo_t *info)
{
    return ci_profile_info(h, profile, eng, (nvmlComputeInstanceProfileInfo_v2_t *)info, 0);
}

VGPU_EXPORT nvmlReturn_t nvmlGpuInstanceGetComputeInstanceProfileInfoV(
    nvmlGpuInstance_t h, unsigned int profile, unsigned int eng,
    nvmlComputeInstanceProfileInfo_v2_t *info)
{
    return ci_profile_info(h, profile, eng, info, 1);
}

VGPU_EXPORT nvmlReturn_t nvmlGpuInstanceGetComputeInstanceRemainingCapacity(
    nvmlGpuInstance_t h, unsigned int profile, unsigned int *count)
{
    GI_CALL(h, profile, count)
    *count = !g->has_ci;
    return NVML_SUCCESS;
}

VGPU_EXPORT nvmlReturn_t nvmlGpuInstanceGetComputeInstancePossiblePlacements(
    nvmlGpuInstance_t h, unsigned int profile, nvmlComputeInstancePlacement_t *placements,
    unsigned int *count)
{
    GI_CALL(h, profile, count)
    if (placements && *count < 1) {
        *count = 1;
        return NVML_ERROR_INSUFFICIENT_SIZE;
    }
    if (placements)
        placements[0] = (nvmlComputeInstancePlacement_t){0, p->compute};
    *count = 1;
    return NVML_SUCCESS;
}

VGPU_EXPORT nvmlReturn_t nvmlGpuInstanceCreateComputeInstance(nvmlGpuInstance_t h,
                                                              unsigned int profile,
                                                              nvmlComputeInstance_t *ci)
{
    GI_CALL(h, profile, ci)
    rc = change(gpu, id, sim_mig_create_ci);
    if (rc == NVML_SUCCESS)
        *ci = ci_handle(gpu, id);
    return rc;
}

VGPU_EXPORT nvmlReturn_t nvmlGpuInstanceGetComputeInstances(nvmlGpuInstance_t h,
                                                            unsigned int profile,
                                                            nvmlComputeInstance_t *cis,
                                                            unsigned int *count)
{
    GI_CALL(h, profile, count)
    if (g->has_ci && cis)
        cis[0] = ci_handle(gpu, id);
    *count = g->has_ci;
    return NVML_SUCCESS;
}

VGPU_EXPORT nvmlReturn_t nvmlGpuInstanceGetComputeInstanceById(nvmlGpuInstance_t h,
                                                               unsigned int ci_id,
                                                               nvmlComputeInstance_t *ci)
{
    NVML_INSTANCE(gi_of, h, gpu, id, g)
    if (!ci)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (ci_id != 0 || !g->has_ci)
        return NVML_ERROR_NOT_FOUND;
    *ci = ci_handle(gpu, id);
    return NVML_SUCCESS;
}

VGPU_EXPORT nvmlReturn_t nvmlComputeInstanceGetInfo_v2(nvmlComputeInstance_t h,
                                                       nvmlComputeInstanceInfo_t *info)
{
    NVML_INSTANCE(ci_of, h, gpu, gi, g)
    if (!info)
        return NVML_ERROR_INVALID_ARGUMENT;
    const struct sim_mig_profile *p = sim_mig_profile(g->profile);
    *info = (nvmlComputeInstanceInfo_t){nvml_handle(gpu), gi_handle(gpu, gi), 0, p->ci_profile,
                                        {0, p->compute}};
    return NVML_SUCCESS;
}
VGPU_ALIAS(nvmlComputeInstanceGetInfo_v2, nvmlComputeInstanceGetInfo)

/* IN_USE while a process uses it. */
VGPU_EXPORT nvmlReturn_t nvmlComputeInstanceDestroy(nvmlComputeInstance_t h)
{
    NVML_INSTANCE(ci_of, h, gpu, gi, g)
    (void)g;
    return change(gpu, gi, sim_mig_destroy_ci);
}
