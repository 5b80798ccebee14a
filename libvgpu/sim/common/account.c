/*
 * account.c - memory on the shared devices: charging device memory to
 * processes and tags, counting their contexts, and what is free. The time
 * kernels take on the devices is timeline.c's.
 */
#include <unistd.h>

#include "sim.h"
#include "slot.h"

static uint64_t sub_sat(uint64_t a, uint64_t b)
{
    return a > b ? a - b : 0;
}

int sim_charge(int dev, uint64_t bytes, int alloc)
{
    struct vgpu_sim_state *s = sim_state();
    int rc = 0;
    sim_lock(1);
    struct vgpu_sim_device *d = &s->dev[dev];
    if (alloc && d->fail_allocs > 0) {
        d->fail_allocs--;
        rc = -1;
    } else if (bytes > d->total || d->used > d->total - bytes) {
        rc = -1;
    } else {
        d->used += bytes;
        struct vgpu_sim_proc *p = sim_self_proc(s);
        if (p) {
            p->used[dev] += bytes;
            if (p->used[dev] > p->peak[dev])
                p->peak[dev] = p->used[dev];
            struct vgpu_sim_tag *t = sim_proc_tag(s, p);
            if (t) {
                t->used[dev] += bytes;
                if (t->used[dev] > t->peak[dev])
                    t->peak[dev] = t->used[dev];
            }
        }
    }
    sim_unlock();
    return rc;
}

void sim_uncharge(int dev, uint64_t bytes)
{
    struct vgpu_sim_state *s = sim_state();
    sim_lock(0);
    struct vgpu_sim_device *d = &s->dev[dev];
    d->used = sub_sat(d->used, bytes);
    struct vgpu_sim_proc *p = sim_self_proc(s);
    if (p) {
        p->used[dev] = sub_sat(p->used[dev], bytes);
        struct vgpu_sim_tag *t = sim_proc_tag(s, p);
        if (t)
            t->used[dev] = sub_sat(t->used[dev], bytes);
    }
    sim_unlock();
}

void sim_context_count(int dev, int delta)
{
    struct vgpu_sim_state *s = sim_state();
    sim_lock(0);
    struct vgpu_sim_proc *p = sim_self_proc(s);
    if (p) {
        if (delta < 0 && p->contexts[dev] < (uint32_t)-delta)
            p->contexts[dev] = 0;
        else
            p->contexts[dev] += (uint32_t)delta;
    }
    sim_unlock();
}

void sim_mem_info(int dev, uint64_t *free_bytes, uint64_t *total_bytes)
{
    struct vgpu_sim_state *s = sim_state();
    sim_lock(1);
    *total_bytes = s->dev[dev].total;
    *free_bytes = sub_sat(s->dev[dev].total, s->dev[dev].used);
    sim_unlock();
}
