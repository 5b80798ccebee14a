/*
 * ckpt.c - a checkpointed process's device memory on the shared devices:
 * given back to the GPUs it was on when the process is checkpointed (the
 * contents are in host memory then), charged again, on the same GPUs or
 * others, when it is restored. The driver's checkpoint API itself, and the
 * process's side of it, are cuda/checkpoint.c.
 */
#include "sim.h"

static uint64_t sub_sat(uint64_t a, uint64_t b)
{
    return a > b ? a - b : 0;
}

static struct vgpu_sim_tag *tag_of(struct vgpu_sim_state *s, const struct vgpu_sim_proc *p)
{
    return (p->tag >= 0 && p->tag < VGPU_SIM_MAX_TAGS) ? &s->tags[p->tag] : NULL;
}

uint64_t sim_ckpt_release(int slot)
{
    struct vgpu_sim_state *s = sim_state();
    uint64_t total = 0;
    sim_lock(0);
    struct vgpu_sim_proc *p = &s->procs[slot];
    struct vgpu_sim_tag *t = tag_of(s, p);
    for (int d = 0; d < VGPU_SIM_MAX_DEVICES; d++) {
        uint64_t u = p->used[d];
        p->ckpt.held[d] += u;
        p->ckpt.held_ctx[d] += p->contexts[d];
        s->dev[d].used = sub_sat(s->dev[d].used, u);
        if (t)
            t->used[d] = sub_sat(t->used[d], u);
        p->used[d] = 0;
        p->contexts[d] = 0;
        total += p->ckpt.held[d];
    }
    sim_unlock();
    return total;
}

int sim_ckpt_restore(int slot, const int map[VGPU_SIM_MAX_DEVICES], uint64_t *bytes)
{
    struct vgpu_sim_state *s = sim_state();
    uint64_t need[VGPU_SIM_MAX_DEVICES] = {0};
    uint64_t total = 0;
    int rc = 0;
    sim_lock(1);
    struct vgpu_sim_proc *p = &s->procs[slot];
    for (int d = 0; d < VGPU_SIM_MAX_DEVICES; d++) {
        need[map[d]] += p->ckpt.held[d];
        total += p->ckpt.held[d];
    }
    for (int d = 0; d < VGPU_SIM_MAX_DEVICES && rc == 0; d++) {
        const struct vgpu_sim_device *dev = &s->dev[d];
        if (need[d] && (need[d] > dev->total || dev->used > dev->total - need[d]))
            rc = -1;
    }
    if (rc == 0) {
        struct vgpu_sim_tag *t = tag_of(s, p);
        for (int d = 0; d < VGPU_SIM_MAX_DEVICES; d++) {
            int to = map[d];
            uint64_t u = p->ckpt.held[d];
            s->dev[to].used += u;
            p->used[to] += u;
            if (p->used[to] > p->peak[to])
                p->peak[to] = p->used[to];
            if (t) {
                t->used[to] += u;
                if (t->used[to] > t->peak[to])
                    t->peak[to] = t->used[to];
            }
            p->contexts[to] += p->ckpt.held_ctx[d];
        }
        for (int d = 0; d < VGPU_SIM_MAX_DEVICES; d++) {
            p->ckpt.held[d] = 0;
            p->ckpt.held_ctx[d] = 0;
        }
    }
    sim_unlock();
    *bytes = rc == 0 ? total : 0;
    return rc;
}
