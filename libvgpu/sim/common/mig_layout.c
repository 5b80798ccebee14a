/*
 * mig_layout.c - MIG (Multi-Instance GPU) layouts on the shared device
 * state: the profiles of a GPU, its GPU instances and their compute
 * instances, the device slot each instance's memory and kernels live on,
 * and the layout VGPU_SIM_MIG presets when the state is created (state.c
 * calls it, so it uses nothing of state.c; mig.c, above both, tells what a
 * slot is).
 *
 * As an H100 has it (NVIDIA's MIG user guide, the H100-80GB profiles): 8
 * memory slices and 7 compute slices; a GPU instance takes a placement of
 * memory slices (start, size) that overlaps no other instance's; its memory
 * is the GPU's times its memory slices / 8. Each instance is a device slot
 * of its own (dev[slot], slots from VGPU_SIM_MAX_GPUS), so that memory,
 * the timeline and the per-process records work on it unchanged.
 */
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sim.h"

/* Indexed by NVML_GPU_INSTANCE_PROFILE_*; placements start at k * size for
 * k < count (1_SLICE: size 1, starts 0 to 6). `id` is the profile id the
 * driver reports for it on an H100 (nvidia-smi mig -lgip). */
static const struct sim_mig_profile k_profiles[] = {
    {0, 19, 1, 1, 7, 1, 16, 0},  /* 1_SLICE:      1g.10gb */
    {1, 14, 2, 2, 3, 2, 32, 1},  /* 2_SLICE:      2g.20gb */
    {2, 9, 3, 4, 2, 4, 48, 2},   /* 3_SLICE:      3g.40gb */
    {3, 5, 4, 4, 1, 4, 64, 3},   /* 4_SLICE:      4g.40gb */
    {4, 0, 7, 8, 1, 8, 112, 4},  /* 7_SLICE:      7g.80gb */
    {9, 15, 1, 2, 4, 2, 16, 0},  /* 1_SLICE_REV2: 1g.20gb */
};
#define NPROFILES (sizeof k_profiles / sizeof k_profiles[0])

const struct sim_mig_profile *sim_mig_profile(unsigned int nvml_profile)
{
    for (size_t i = 0; i < NPROFILES; i++)
        if (k_profiles[i].nvml == nvml_profile)
            return &k_profiles[i];
    return NULL;
}

const struct sim_mig_profile *sim_mig_profile_by_id(unsigned int id)
{
    for (size_t i = 0; i < NPROFILES; i++)
        if (k_profiles[i].id == id)
            return &k_profiles[i];
    return NULL;
}

uint64_t sim_mig_memory(const struct vgpu_sim_state *s, const struct sim_mig_profile *p)
{
    return s->memory / VGPU_SIM_MIG_SLICES * p->mem;
}

/* NVIDIA's names: compute slices, then the instance's memory in GB rounded
 * (80G: 1g.10gb ... 7g.80gb; 141G, an H200: 1g.18gb, 1g.35gb, 3g.71gb ...). */
static void name_of(uint64_t memory, const struct sim_mig_profile *p, char *out, size_t len)
{
    uint64_t gb = (memory * p->mem / VGPU_SIM_MIG_SLICES + (512ull << 20)) >> 30;
    snprintf(out, len, "%ug.%llugb", p->compute, (unsigned long long)gb);
}

void sim_mig_profile_name(const struct vgpu_sim_state *s, const struct sim_mig_profile *p,
                          char *out, size_t len)
{
    name_of(s->memory, p, out, len);
}

static uint32_t span(const struct sim_mig_profile *p, uint32_t start)
{
    return ((1u << p->size) - 1) << start;
}

/* Memory slices the instances of GPU gpu hold. */
static uint32_t taken(const struct vgpu_sim_mig *m)
{
    uint32_t mask = 0;
    for (int i = 0; i < VGPU_SIM_MAX_GI; i++)
        if (m->gi[i].used)
            mask |= span(sim_mig_profile(m->gi[i].profile), m->gi[i].start);
    return mask;
}

/* Whether start is one of p's placements. */
static int placement_of(const struct sim_mig_profile *p, uint32_t start)
{
    return start % p->size == 0 && start / p->size < p->count;
}

/* The first of p's placements free in mask, or -1. */
static int first_free(const struct sim_mig_profile *p, uint32_t mask)
{
    for (uint32_t k = 0; k < p->count; k++)
        if (!(span(p, k * p->size) & mask))
            return (int)(k * p->size);
    return -1;
}

unsigned int sim_mig_remaining(const struct vgpu_sim_state *s, int gpu,
                               const struct sim_mig_profile *p)
{
    uint32_t mask = taken(&s->mig[gpu]);
    unsigned int n = 0;
    for (uint32_t k = 0; k < p->count; k++)
        if (!(span(p, k * p->size) & mask)) {
            mask |= span(p, k * p->size);
            n++;
        }
    return n;
}

int sim_slot_in_use(const struct vgpu_sim_state *s, int slot)
{
    for (int i = 0; i < VGPU_SIM_MAX_PROCS; i++) {
        const struct vgpu_sim_proc *p = &s->procs[i];
        if (p->pid && (p->contexts[slot] || p->used[slot]))
            return 1;
    }
    return 0;
}

/* A free slot for a new instance, its records cleared; -1 if none. */
static int take_slot(struct vgpu_sim_state *s, int gpu, const struct sim_mig_profile *p)
{
    for (int d = VGPU_SIM_MAX_GPUS; d < VGPU_SIM_MAX_DEVICES; d++) {
        struct vgpu_sim_device *dv = &s->dev[d];
        if (dv->parent >= 0)
            continue;
        dv->total = sim_mig_memory(s, p);
        dv->sms = p->sms;
        dv->parent = gpu;
        dv->used = dv->busy_ns = dv->kernels = dv->runs = 0;
        dv->fail_allocs = 0;
        memset(&dv->sched, 0, sizeof dv->sched);
        dv->sched.cur = dv->sched.next = -1;
        memset(dv->periods, 0, sizeof dv->periods);
        for (int i = 0; i < VGPU_SIM_MAX_PROCS; i++) {
            struct vgpu_sim_proc *pr = &s->procs[i];
            pr->used[d] = pr->peak[d] = pr->busy_ns[d] = 0;
            pr->contexts[d] = 0;
            memset(&pr->queue[d], 0, sizeof pr->queue[d]);
        }
        for (int i = 0; i < VGPU_SIM_MAX_TAGS; i++)
            s->tags[i].used[d] = s->tags[i].peak[d] = s->tags[i].busy_ns[d] = 0;
        return d;
    }
    return -1;
}

/* ---- changing the layout (the state lock held, dead processes reclaimed) ---- */

int sim_mig_set_mode(struct vgpu_sim_state *s, int gpu, unsigned int mode)
{
    struct vgpu_sim_mig *m = &s->mig[gpu];
    if (mode > 1)
        return SIM_MIG_INVALID;
    if (mode == m->mode)
        return SIM_MIG_OK;
    if (mode) {
        if (sim_slot_in_use(s, gpu))
            return SIM_MIG_IN_USE;
    } else if (taken(m)) {
        return SIM_MIG_IN_USE;
    }
    m->mode = mode;
    return SIM_MIG_OK;
}

int sim_mig_create_gi(struct vgpu_sim_state *s, int gpu, const struct sim_mig_profile *p,
                      int start, int *gi_id)
{
    struct vgpu_sim_mig *m = &s->mig[gpu];
    if (!m->mode)
        return SIM_MIG_NOT_SUPPORTED;
    uint32_t mask = taken(m);
    if (start < 0)
        start = first_free(p, mask);
    else if (!placement_of(p, (uint32_t)start))
        return SIM_MIG_INVALID;
    if (start < 0 || (span(p, (uint32_t)start) & mask))
        return SIM_MIG_NO_ROOM;
    int id = 0;
    while (id < VGPU_SIM_MAX_GI && m->gi[id].used)
        id++;
    if (id == VGPU_SIM_MAX_GI)
        return SIM_MIG_NO_ROOM;
    int slot = take_slot(s, gpu, p);
    if (slot < 0)
        return SIM_MIG_NO_ROOM;
    m->gi[id] = (struct vgpu_sim_gi){.used = 1, .profile = p->nvml, .start = (uint32_t)start,
                                     .slot = slot};
    *gi_id = id + 1;
    return SIM_MIG_OK;
}

int sim_mig_destroy_gi(struct vgpu_sim_state *s, int gpu, int gi_id)
{
    struct vgpu_sim_gi *g = &s->mig[gpu].gi[gi_id - 1];
    if (!g->used)
        return SIM_MIG_INVALID;
    if (g->has_ci || sim_slot_in_use(s, g->slot))
        return SIM_MIG_IN_USE;
    struct vgpu_sim_device *dv = &s->dev[g->slot];
    dv->total = dv->used = 0;
    dv->sms = 0;
    dv->parent = -1;
    memset(g, 0, sizeof *g);
    return SIM_MIG_OK;
}

int sim_mig_create_ci(struct vgpu_sim_state *s, int gpu, int gi_id)
{
    struct vgpu_sim_gi *g = &s->mig[gpu].gi[gi_id - 1];
    if (!g->used)
        return SIM_MIG_INVALID;
    if (g->has_ci)
        return SIM_MIG_NO_ROOM;
    g->has_ci = 1;
    g->serial = ++s->mig_serial;
    return SIM_MIG_OK;
}

int sim_mig_destroy_ci(struct vgpu_sim_state *s, int gpu, int gi_id)
{
    struct vgpu_sim_gi *g = &s->mig[gpu].gi[gi_id - 1];
    if (!g->used || !g->has_ci)
        return SIM_MIG_INVALID;
    if (sim_slot_in_use(s, g->slot))
        return SIM_MIG_IN_USE;
    g->has_ci = 0;
    return SIM_MIG_OK;
}

/* ---- VGPU_SIM_MIG: the layout a new state starts with ---- */

/* Read one entry, PROFILE[@START], of GPU gpu; 0 on success. */
static int preset_entry(const char *tok, int gpu, uint64_t memory, struct sim_mig_plan *plan,
                        uint32_t *mask)
{
    char name[32];
    size_t n = strcspn(tok, "@");
    if (n == 0 || n >= sizeof name)
        return -1;
    memcpy(name, tok, n);
    name[n] = '\0';
    const struct sim_mig_profile *p = NULL;
    for (size_t i = 0; i < NPROFILES && !p; i++) {
        char own[32];
        name_of(memory, &k_profiles[i], own, sizeof own);
        if (strcmp(own, name) == 0)
            p = &k_profiles[i];
    }
    if (!p)
        return -1;
    int start = -1;
    if (tok[n] == '@') {
        char *end;
        if (!isdigit((unsigned char)tok[n + 1]))
            return -1;
        long v = strtol(tok + n + 1, &end, 10);
        if (*end || v < 0 || v >= VGPU_SIM_MIG_SLICES || !placement_of(p, (uint32_t)v))
            return -1;
        start = (int)v;
    } else {
        start = first_free(p, *mask);
    }
    if (start < 0 || (span(p, (uint32_t)start) & *mask) ||
        plan->n == VGPU_SIM_MAX_DEVICES - VGPU_SIM_MAX_GPUS)
        return -1;
    *mask |= span(p, (uint32_t)start);
    plan->e[plan->n++] = (struct sim_mig_plan_entry){gpu, (int)p->nvml, start};
    return 0;
}

int sim_mig_parse(const char *spec, uint32_t count, uint64_t memory, struct sim_mig_plan *plan)
{
    memset(plan, 0, sizeof *plan);
    char buf[VGPU_SIM_MIG_SPEC_LEN];
    int ok = strlen(spec) < sizeof buf;
    if (ok)
        snprintf(buf, sizeof buf, "%s", spec);
    char *save_gpu = NULL;
    for (char *g = ok ? strtok_r(buf, ";", &save_gpu) : NULL; g && ok;
         g = strtok_r(NULL, ";", &save_gpu)) {
        char *end;
        while (isspace((unsigned char)*g))
            g++;
        long gpu = isdigit((unsigned char)*g) ? strtol(g, &end, 10) : -1;
        if (gpu < 0 || gpu >= (long)count || *end != '=' || (plan->enabled >> gpu) & 1) {
            ok = 0;
            break;
        }
        plan->enabled |= 1u << gpu;
        uint32_t mask = 0;
        char *save = NULL;
        for (char *t = strtok_r(end + 1, ",", &save); t && ok; t = strtok_r(NULL, ",", &save)) {
            int gis = 0;
            for (uint32_t i = 0; i < plan->n; i++)
                gis += plan->e[i].gpu == gpu;
            ok = gis < VGPU_SIM_MAX_GI && preset_entry(t, (int)gpu, memory, plan, &mask) == 0;
        }
    }
    if (!ok) {
        char names[128] = "";
        for (size_t i = 0; i < NPROFILES; i++) {
            char own[32];
            name_of(memory, &k_profiles[i], own, sizeof own);
            snprintf(names + strlen(names), sizeof names - strlen(names), "%s%s",
                     i ? ", " : "", own);
        }
        fprintf(stderr, "vgpu-sim: VGPU_SIM_MIG=%s: expected GPU=PROFILE[@START],... for each "
                "GPU in MIG mode, ';' between GPUs, the instances fitting the GPU; this GPU's "
                "profiles are %s (the names follow VGPU_SIM's memory: 1g.10gb needs an 80G "
                "GPU)\n", spec, names);
        return -1;
    }
    return 0;
}

void sim_mig_apply(struct vgpu_sim_state *s, const struct sim_mig_plan *plan)
{
    for (int g = 0; g < VGPU_SIM_MAX_GPUS; g++)
        s->mig[g].mode = (plan->enabled >> g) & 1;
    for (uint32_t i = 0; i < plan->n; i++) {
        int id;
        if (sim_mig_create_gi(s, plan->e[i].gpu, sim_mig_profile((unsigned)plan->e[i].profile),
                              plan->e[i].start, &id) == SIM_MIG_OK)
            sim_mig_create_ci(s, plan->e[i].gpu, id);
    }
}
