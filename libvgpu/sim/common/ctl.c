/*
 * ctl.c - fault injection and the control functions `vgpuctl sim`
 * calls (stats, fault, reset). They live in the libraries so that what they
 * report goes through the same reclaim of dead processes as everything else.
 */
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "sim.h"

int sim_nvml_fault(void)
{
    struct vgpu_sim_state *s = sim_state();
    if (!s || __atomic_load_n(&s->nvml_error_count, __ATOMIC_ACQUIRE) == 0)
        return 0; /* the usual case: no lock taken */
    int code = 0;
    sim_lock(0);
    if (s->nvml_error_count != 0 && s->nvml_error) {
        code = s->nvml_error;
        if (s->nvml_error_count > 0)
            s->nvml_error_count--;
    }
    sim_unlock();
    return code;
}

static int state_exists(void)
{
    char buf[PATH_MAX];
    struct stat st;
    return stat(sim_state_path(buf, sizeof buf), &st) == 0 && st.st_size > 0;
}

/* The state for a control function: as it is if it exists; created from
 * VGPU_SIM only when `create` (a fault injected before any program ran). */
static struct vgpu_sim_state *ctl_state(int create)
{
    if (state_exists())
        return sim_state_as_is();
    return create ? sim_state() : NULL;
}

/* ---- stats as JSON ---- */

struct out {
    char *buf;
    size_t len, pos;
};

static void put(struct out *o, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    char *dst = o->pos < o->len ? o->buf + o->pos : NULL;
    int n = vsnprintf(dst, dst ? o->len - o->pos : 0, fmt, ap);
    va_end(ap);
    if (n > 0)
        o->pos += (size_t)n;
}

static void put_string(struct out *o, const char *s)
{
    put(o, "\"");
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\')
            put(o, "\\%c", c);
        else if (c < 0x20)
            put(o, "\\u%04x", c);
        else
            put(o, "%c", c);
    }
    put(o, "\"");
}

/* The GPUs' MIG mode, and every GPU instance: "mig_devices", each with its
 * device slot (the "index" of the processes' "mig_devices" rows). */
static void put_mig(struct out *o, const struct vgpu_sim_state *s)
{
    put(o, "], \"mig_mode\": [");
    for (uint32_t g = 0; g < s->count; g++)
        put(o, "%s%u", g ? ", " : "", s->mig[g].mode);
    put(o, "], \"mig_devices\": [");
    int n = 0;
    for (uint32_t g = 0; g < s->count; g++)
        for (int i = 0; i < VGPU_SIM_MAX_GI; i++) {
            const struct vgpu_sim_gi *gi = &s->mig[g].gi[i];
            if (!gi->used)
                continue;
            char uuid[64], prof[32];
            sim_slot_uuid_string(gi->slot, uuid, sizeof uuid);
            sim_mig_profile_name(s, sim_mig_profile(gi->profile), prof, sizeof prof);
            const struct vgpu_sim_device *dv = &s->dev[gi->slot];
            put(o, "%s{\"slot\": %d, \"parent\": %u, \"gi\": %d, \"ci\": ", n++ ? ", " : "",
                gi->slot, g, i + 1);
            put(o, gi->has_ci ? "0, \"uuid\": \"%s\"" : "null, \"uuid\": null%.0s", uuid);
            put(o, ", \"profile\": \"%s\", \"start\": %u, \"total\": %llu, \"used\": %llu, "
                   "\"busy_ns\": %llu, \"kernels\": %llu}",
                prof, gi->start, (unsigned long long)dv->total, (unsigned long long)dv->used,
                (unsigned long long)dv->busy_ns, (unsigned long long)dv->kernels);
        }
}

VGPU_EXPORT int vgpu_sim_ctl_stats(char *buf, size_t len)
{
    struct vgpu_sim_state *s = ctl_state(0);
    if (!s)
        return -1;
    struct out o = {buf, len, 0};
    char path[PATH_MAX];
    sim_lock(1);
    for (uint32_t d = 0; d < VGPU_SIM_MAX_DEVICES; d++)
        if (d < s->count || s->dev[d].parent >= 0)
            sim_timeline_catch_up((int)d);
    put(&o, "{\"path\": ");
    put_string(&o, sim_state_path(path, sizeof path));
    put(&o, ", \"count\": %u, \"memory\": %llu, \"sample_ms\": %llu, \"util_idle\": \"%s\", "
            "\"util_procs\": \"%s\"",
        s->count, (unsigned long long)s->memory, (unsigned long long)(s->sample_ns / 1000000),
        s->util_idle == VGPU_SIM_UTIL_IDLE_SKIP ? "skip" : "average",
        s->util_procs == VGPU_SIM_UTIL_PROCS_EACH      ? "each"
        : s->util_procs == VGPU_SIM_UTIL_PROCS_BUSIEST ? "busiest"
        : s->util_procs == VGPU_SIM_UTIL_PROCS_NONE    ? "none"
                                                       : "last");
    put(&o, ", \"checkpoint\": {\"rate\": %llu, \"pairs\": \"%s\", \"refused\": \"%s\"}",
        (unsigned long long)s->ckpt_rate,
        s->ckpt_flags & VGPU_SIM_CKPT_F_PAIRS_ALL ? "all" : "checkpointed",
        s->ckpt_flags & VGPU_SIM_CKPT_F_REFUSED_LOCKED ? "locked" : "failed");
    put(&o, ", \"timeslice_us\": %llu, \"switch_us\": %llu",
        (unsigned long long)(s->slice_ns / 1000), (unsigned long long)(s->switch_ns / 1000));
    put(&o, ", \"faults\": {\"nvml_error\": %d, \"nvml_error_count\": %lld}", s->nvml_error,
        (long long)s->nvml_error_count);
    put(&o, ", \"devices\": [");
    for (uint32_t d = 0; d < s->count; d++) {
        const struct vgpu_sim_device *dv = &s->dev[d];
        char uuid[64];
        sim_device_uuid_string((int)d, uuid, sizeof uuid);
        put(&o, "%s{\"index\": %u, \"uuid\": \"%s\", \"total\": %llu, \"used\": %llu, "
                "\"busy_ns\": %llu, \"kernels\": %llu, \"switches\": %llu, "
                "\"fail_allocs\": %lld}",
            d ? ", " : "", d, uuid, (unsigned long long)dv->total, (unsigned long long)dv->used,
            (unsigned long long)dv->busy_ns, (unsigned long long)dv->kernels,
            (unsigned long long)dv->sched.switches, (long long)dv->fail_allocs);
    }
    put_mig(&o, s);
    put(&o, "], \"processes\": [");
    int first = 1;
    for (int i = 0; i < VGPU_SIM_MAX_PROCS; i++) {
        const struct vgpu_sim_proc *p = &s->procs[i];
        if (!p->pid)
            continue;
        static const char *const ckpt_state[] = {"running", "locked", "checkpointed", "failed"};
        put(&o, "%s{\"pid\": %d, \"checkpoint\": \"%s\", \"tag\": ", first ? "" : ", ",
            p->pid, p->ckpt.state < 4 ? ckpt_state[p->ckpt.state] : "?");
        if (p->tag >= 0 && p->tag < VGPU_SIM_MAX_TAGS)
            put_string(&o, s->tags[p->tag].name);
        else
            put(&o, "null");
        put(&o, ", \"devices\": [");
        for (uint32_t d = 0; d < s->count; d++) {
            const struct vgpu_sim_queue *q = &p->queue[d];
            put(&o, "%s{\"index\": %u, \"used\": %llu, \"peak\": %llu, \"busy_ns\": %llu, "
                    "\"contexts\": %u, \"queued_ns\": %llu, \"held\": %llu}",
                d ? ", " : "", d, (unsigned long long)p->used[d], (unsigned long long)p->peak[d],
                (unsigned long long)p->busy_ns[d], p->contexts[d],
                (unsigned long long)(q->submitted_ns > q->done_ns
                                         ? q->submitted_ns - q->done_ns : 0),
                (unsigned long long)p->ckpt.held[d]);
        }
        put(&o, "], \"mig_devices\": [");
        for (int d = VGPU_SIM_MAX_GPUS, n = 0; d < VGPU_SIM_MAX_DEVICES; d++)
            if (s->dev[d].parent >= 0 && (p->used[d] || p->contexts[d] || p->busy_ns[d]))
                put(&o, "%s{\"index\": %d, \"used\": %llu, \"peak\": %llu, "
                        "\"busy_ns\": %llu, \"contexts\": %u}",
                    n++ ? ", " : "", d, (unsigned long long)p->used[d],
                    (unsigned long long)p->peak[d], (unsigned long long)p->busy_ns[d],
                    p->contexts[d]);
        put(&o, "]}");
        first = 0;
    }
    put(&o, "], \"tags\": [");
    first = 1;
    for (int i = 0; i < VGPU_SIM_MAX_TAGS; i++) {
        const struct vgpu_sim_tag *t = &s->tags[i];
        if (!t->name[0])
            continue;
        put(&o, "%s{\"name\": ", first ? "" : ", ");
        put_string(&o, t->name);
        put(&o, ", \"devices\": [");
        for (uint32_t d = 0; d < s->count; d++)
            put(&o, "%s{\"index\": %u, \"used\": %llu, \"peak\": %llu, \"busy_ns\": %llu}",
                d ? ", " : "", d, (unsigned long long)t->used[d], (unsigned long long)t->peak[d],
                (unsigned long long)t->busy_ns[d]);
        put(&o, "], \"mig_devices\": [");
        for (int d = VGPU_SIM_MAX_GPUS, n = 0; d < VGPU_SIM_MAX_DEVICES; d++)
            if (s->dev[d].parent >= 0 && (t->used[d] || t->peak[d] || t->busy_ns[d]))
                put(&o, "%s{\"index\": %d, \"used\": %llu, \"peak\": %llu, \"busy_ns\": %llu}",
                    n++ ? ", " : "", d, (unsigned long long)t->used[d],
                    (unsigned long long)t->peak[d], (unsigned long long)t->busy_ns[d]);
        put(&o, "]}");
        first = 0;
    }
    put(&o, "]}");
    sim_unlock();
    if (len)
        buf[o.pos < len ? o.pos : len - 1] = '\0';
    return (int)o.pos;
}

/* ---- faults ---- */

VGPU_EXPORT int vgpu_sim_ctl_fail_allocs(int gpu, long long n)
{
    struct vgpu_sim_state *s = ctl_state(1);
    if (!s || gpu < 0 || (uint32_t)gpu >= s->count || n < 0)
        return -1;
    sim_lock(0);
    s->dev[gpu].fail_allocs = n;
    sim_unlock();
    return 0;
}

VGPU_EXPORT int vgpu_sim_ctl_nvml_error(int code, long long n)
{
    struct vgpu_sim_state *s = ctl_state(1);
    if (!s || code <= 0)
        return -1;
    sim_lock(0);
    s->nvml_error = code;
    __atomic_store_n(&s->nvml_error_count, n, __ATOMIC_RELEASE);
    sim_unlock();
    return 0;
}

VGPU_EXPORT int vgpu_sim_ctl_clear_faults(void)
{
    struct vgpu_sim_state *s = ctl_state(0);
    if (!s)
        return state_exists() ? -1 : 0; /* no state: nothing to clear */
    sim_lock(0);
    for (uint32_t d = 0; d < VGPU_SIM_MAX_DEVICES; d++)
        s->dev[d].fail_allocs = 0;
    s->nvml_error = 0;
    __atomic_store_n(&s->nvml_error_count, 0, __ATOMIC_RELEASE);
    sim_unlock();
    return 0;
}

VGPU_EXPORT int vgpu_sim_ctl_reset(int force)
{
    if (!state_exists())
        return 0;
    struct vgpu_sim_state *s = ctl_state(0);
    if (!s)
        return -1;
    sim_lock(1);
    int live = sim_live_processes();
    sim_unlock();
    if (live && !force)
        return live;
    char path[PATH_MAX];
    unlink(sim_state_path(path, sizeof path));
    return 0;
}
