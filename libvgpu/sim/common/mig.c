/*
 * mig.c - what a device slot is (common/mig_layout.c lays them out): the
 * physical GPU it is on, its SMs, its GPU instance, and a MIG device's
 * name and UUID.
 */
#include <stdio.h>
#include <string.h>

#include "sim.h"

/* ---- device slots ---- */

int sim_slot_parent(int slot)
{
    const struct vgpu_sim_state *s = sim_state();
    return s->dev[slot].parent >= 0 ? s->dev[slot].parent : slot;
}

int sim_slot_sms(int slot)
{
    const struct vgpu_sim_state *s = sim_state();
    return s->dev[slot].sms ? (int)s->dev[slot].sms : SIM_SM_COUNT;
}

const struct vgpu_sim_gi *sim_slot_gi(int slot, int *gpu, int *gi_id)
{
    const struct vgpu_sim_state *s = sim_state();
    int p = s->dev[slot].parent;
    if (p < 0)
        return NULL;
    for (int i = 0; i < VGPU_SIM_MAX_GI; i++)
        if (s->mig[p].gi[i].used && s->mig[p].gi[i].slot == slot) {
            if (gpu)
                *gpu = p;
            if (gi_id)
                *gi_id = i + 1;
            return &s->mig[p].gi[i];
        }
    return NULL;
}

int sim_slot_is_mig_device(int slot)
{
    const struct vgpu_sim_gi *g = sim_slot_gi(slot, NULL, NULL);
    return g && g->has_ci;
}

void sim_slot_name(int slot, char *out, size_t len)
{
    const struct vgpu_sim_gi *g = sim_slot_gi(slot, NULL, NULL);
    if (!g) {
        snprintf(out, len, "%s", SIM_NAME);
        return;
    }
    char prof[32];
    sim_mig_profile_name(sim_state(), sim_mig_profile(g->profile), prof, sizeof prof);
    snprintf(out, len, "%s MIG %s", SIM_NAME, prof);
}

/* A version-4 UUID of the compute instance: from its GPU, GPU instance,
 * compute instance (0) and creation number, so a new one each time. */
void sim_slot_mig_uuid(int slot, unsigned char out[16])
{
    int gpu = 0, gi = 0;
    const struct vgpu_sim_gi *g = sim_slot_gi(slot, &gpu, &gi);
    uint64_t seed = 0x4d49470000000000ull ^ ((uint64_t)gpu << 40) ^ ((uint64_t)gi << 32) ^
                    (g ? g->serial : 0);
    sim_uuid_of(seed * 2, seed * 2 + 1, out);
}

void sim_slot_uuid_string(int slot, char *out, size_t len)
{
    if (!sim_slot_gi(slot, NULL, NULL)) {
        sim_device_uuid_string(sim_slot_parent(slot), out, len);
        return;
    }
    unsigned char u[16];
    sim_slot_mig_uuid(slot, u);
    sim_uuid_text("MIG", u, out, len);
}

