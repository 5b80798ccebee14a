/*
 * account.c - memory and time on the shared devices: charging device
 * memory to processes and tags, and the per-device kernel timeline that
 * serialises kernels from every process (time slicing, as a GPU does across
 * contexts without MPS).
 */
#include <unistd.h>

#include "sim.h"

static struct vgpu_sim_proc *self_proc(struct vgpu_sim_state *s)
{
    int slot = sim_self_slot();
    return slot < 0 ? NULL : &s->procs[slot];
}

static struct vgpu_sim_tag *proc_tag(struct vgpu_sim_state *s, const struct vgpu_sim_proc *p)
{
    return (p && p->tag >= 0 && p->tag < VGPU_SIM_MAX_TAGS) ? &s->tags[p->tag] : NULL;
}

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
        struct vgpu_sim_proc *p = self_proc(s);
        if (p) {
            p->used[dev] += bytes;
            if (p->used[dev] > p->peak[dev])
                p->peak[dev] = p->used[dev];
            struct vgpu_sim_tag *t = proc_tag(s, p);
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
    struct vgpu_sim_proc *p = self_proc(s);
    if (p) {
        p->used[dev] = sub_sat(p->used[dev], bytes);
        struct vgpu_sim_tag *t = proc_tag(s, p);
        if (t)
            t->used[dev] = sub_sat(t->used[dev], bytes);
    }
    sim_unlock();
}

void sim_context_count(int dev, int delta)
{
    struct vgpu_sim_state *s = sim_state();
    sim_lock(0);
    struct vgpu_sim_proc *p = self_proc(s);
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

/* Add [start, end) of pid's kernel time to the utilization sample periods it
 * covers, and make pid the one that ran last in each. Periods more than
 * VGPU_SIM_PERIODS/2 ahead are not kept (a kernel longer than that is
 * counted up to there). */
static void add_period_busy(struct vgpu_sim_state *s, struct vgpu_sim_device *d, int32_t pid,
                            uint64_t now, uint64_t start, uint64_t end)
{
    uint64_t P = s->sample_ns;
    uint64_t last = (end - 1) / P, limit = now / P + VGPU_SIM_PERIODS / 2;
    if (last > limit)
        last = limit;
    for (uint64_t idx = start / P; idx <= last; idx++) {
        uint64_t a = idx * P, b = a + P;
        uint64_t busy = (end < b ? end : b) - (start > a ? start : a);
        struct vgpu_sim_period *per = &d->periods[idx % VGPU_SIM_PERIODS];
        if (per->index != idx) {
            per->index = idx;
            per->n = 0;
        }
        uint32_t i;
        for (i = 0; i < per->n && per->e[i].pid != pid; i++)
            ;
        if (i == per->n) {
            if (per->n == VGPU_SIM_PERIOD_PIDS)
                continue; /* more processes than a period keeps */
            per->e[i].pid = pid;
            per->e[i].busy_ns = 0;
            per->n++;
        }
        per->e[i].busy_ns += busy;
        /* Kernels are reserved in timeline order: this one runs last so far. */
        per->last = i;
    }
}

uint64_t sim_reserve_kernel(int dev, uint64_t ns, uint64_t not_before)
{
    struct vgpu_sim_state *s = sim_state();
    int32_t pid = (int32_t)getpid();
    if (ns == 0)
        ns = 1;
    sim_lock(0);
    struct vgpu_sim_device *d = &s->dev[dev];
    uint64_t now = sim_now_ns();
    uint64_t start = d->busy_until_ns > not_before ? d->busy_until_ns : not_before;
    uint64_t end = start + ns;
    d->busy_until_ns = end;
    struct vgpu_sim_kernel *k = &d->ring[d->kernels % VGPU_SIM_RING];
    k->pid = pid;
    k->start_ns = start;
    k->end_ns = end;
    d->kernels++;
    d->busy_ns += ns;
    struct vgpu_sim_proc *p = self_proc(s);
    if (p) {
        p->busy_ns[dev] += ns;
        struct vgpu_sim_tag *t = proc_tag(s, p);
        if (t)
            t->busy_ns[dev] += ns;
    }
    add_period_busy(s, d, pid, now, start, end);
    sim_unlock();
    return end;
}
