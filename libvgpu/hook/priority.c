/*
 * priority.c - priority classes on a GPU (docs/compute.md, "Priority
 * classes"). The daemon writes, per device of the job's limits:
 *
 *   hold & VGPU_HOLD_SIGNAL  jobs of a lower class share this GPU: every
 *       launch stamps this job's signal (its own System V segment, which
 *       the daemon made and state.c attached read-write): when it last
 *       launched, and until when the work it launched should keep the GPU
 *       busy (each launch adds its GPU time as the hook's own events last
 *       measured it, flight.c).
 *   hold & VGPU_HOLD_HELD    jobs of a higher class share this GPU (the
 *       limits name them and their signals' segments, holders[]): before a
 *       launch the hook reads their signals, attached read-only (a segment
 *       can't shrink: no read through it can fault), only those the
 *       daemon's user made. While one is busy (its work should still be
 *       running: its estimate, plus the budget that may have run before
 *       it) nothing is launched; while one is active (busy, or launched
 *       within holdoff_ns) the job keeps at most budget_ns of estimated
 *       GPU time in flight (a launch that finds nothing in flight always
 *       goes). What is in flight is known from an event recorded after
 *       each launch (one cuEventRecord; cuEventQuery tells which have
 *       completed), each counted at launch_cost_ns.
 *
 * With hold == 0 (and throttle == 0) none of this runs: the launch fast path
 * is launch.c's one atomic add. The class itself is in the limits, which the
 * job attaches read-only; holders[] names only jobs the daemon admitted with
 * a higher class, so what a job writes into its own signal holds back no
 * one but the lower classes a busy job of its class would hold back anyway.
 *
 * Launches into a capturing stream run nothing: they are neither held nor
 * tracked (and nothing is queried that the capture would object to).
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stddef.h>
#include <string.h>
#include <sys/shm.h>
#include <time.h>

#include "hook.h"

/* What applies while the daemon has written no value (0) */
#define DEFAULT_BUDGET_NS 1000000ull
#define DEFAULT_HOLDOFF_NS 100000000ull
#define MAX_NAP_NS 1000000ull           /* a held thread re-reads the signals this often */
#define FINE_NAP_NS 100000ull           /* ... and this often past a holder's estimate */

struct holders {
    uint64_t gen;
    int valid;
    int n;
    const struct vgpu_signal *sig[VGPU_MAX_HOLDERS];
    uint32_t dev[VGPU_MAX_HOLDERS];
};

static pthread_mutex_t prio_lock = PTHREAD_MUTEX_INITIALIZER;
static struct holders g_holders[VGPU_MAX_DEVICES];

static uint64_t or_default(uint64_t v, uint64_t def)
{
    return v ? v : def;
}

/* ---- this job's signal ---------------------------------------------------------- */
void vgpu_prio_signal(int d, uint64_t now)
{
    struct vgpu_signal *s = vgpu_g_signal;
    if (s == NULL)
        return;
    struct vgpu_signal_dev *sd = &s->dev[d];
    /* busy_until_ns is flight.c's: when the work in flight (this launch's
     * too, once marked) should be done, at its measured cost; until the mark,
     * a launch's worth from now */
    int measured;
    uint64_t cost = vgpu_flight_cost(d, &measured);
    __atomic_store_n(&sd->last_launch_ns, now, __ATOMIC_RELAXED);
    uint64_t cur = __atomic_load_n(&sd->busy_until_ns, __ATOMIC_RELAXED);
    if (cur < now + cost)
        __atomic_store_n(&sd->busy_until_ns, now + cost, __ATOMIC_RELAXED);
    __atomic_fetch_add(&sd->launches, 1, __ATOMIC_RELAXED);
}

/* ---- the holders' signals (prio_lock held) ------------------------------------------ */
static void close_holders(struct holders *h)
{
    for (int i = 0; i < h->n; i++)
        if (h->sig[i] != NULL)
            shmdt(h->sig[i]);
    h->n = 0;
    h->valid = 0;
}

/* Attach the signals the limits name now; 0 when they were being rewritten. */
static int open_holders(int d, struct holders *h)
{
    const struct vgpu_dev_limit *l = &vgpu_g_limits->dev[d];
    uint64_t g1 = __atomic_load_n(&l->holders_gen, __ATOMIC_ACQUIRE);
    if (g1 & 1)
        return 0;
    close_holders(h);
    uint32_t n = __atomic_load_n(&l->nholders, __ATOMIC_RELAXED);
    if (n > VGPU_MAX_HOLDERS)
        n = VGPU_MAX_HOLDERS;
    for (uint32_t i = 0; i < n; i++) {
        int32_t id = __atomic_load_n(&l->holders[i].signal_id, __ATOMIC_RELAXED);
        uint32_t dev = __atomic_load_n(&l->holders[i].dev, __ATOMIC_RELAXED);
        if (dev >= VGPU_MAX_DEVICES)
            continue;
        const struct vgpu_signal *sig = vgpu_attach_signal(id);
        if (sig == NULL)
            continue;
        h->sig[h->n] = sig;
        h->dev[h->n] = dev;
        h->n++;
    }
    if (__atomic_load_n(&l->holders_gen, __ATOMIC_ACQUIRE) != g1) {
        close_holders(h);
        return 0;
    }
    h->gen = g1;
    h->valid = 1;
    return 1;
}

/* Whether a holder is active now, and until when the busiest is busy. */
static int holders_active(int d, uint64_t now, uint64_t *busy_until)
{
    const struct vgpu_dev_limit *l = &vgpu_g_limits->dev[d];
    pthread_mutex_lock(&prio_lock);
    struct holders *h = &g_holders[d];
    uint64_t gen = __atomic_load_n(&l->holders_gen, __ATOMIC_ACQUIRE);
    if (!h->valid || (gen != h->gen && !(gen & 1)))
        open_holders(d, h);
    uint64_t holdoff = or_default(__atomic_load_n(&l->holdoff_ns, __ATOMIC_RELAXED),
                                  DEFAULT_HOLDOFF_NS);
    int active = 0;
    *busy_until = 0;
    for (int i = 0; i < h->n; i++) {
        const struct vgpu_signal_dev *sd = &h->sig[i]->dev[h->dev[i]];
        uint64_t busy = __atomic_load_n(&sd->busy_until_ns, __ATOMIC_RELAXED);
        uint64_t last = __atomic_load_n(&sd->last_launch_ns, __ATOMIC_RELAXED);
        if (busy > now || (last <= now && now - last < holdoff))
            active = 1;
        if (busy > *busy_until)
            *busy_until = busy;
    }
    pthread_mutex_unlock(&prio_lock);
    /* a signal from beyond a launch's reach is no signal */
    if (*busy_until > now + 10 * holdoff)
        *busy_until = now + holdoff;
    return active;
}

/* ---- the held launch ----------------------------------------------------------------- */
uint64_t vgpu_prio_hold(int d, uint64_t now, uint64_t kind)
{
    const struct vgpu_dev_limit *l = &vgpu_g_limits->dev[d];
    for (;; now = vgpu_now_ns()) {
        uint64_t budget = or_default(__atomic_load_n(&l->budget_ns, __ATOMIC_RELAXED),
                                     DEFAULT_BUDGET_NS);
        uint64_t busy_until;
        int active = holders_active(d, now, &busy_until);
        if (!active)
            return now;
        struct vgpu_flight_view v;
        vgpu_flight_lock();
        int ok = vgpu_flight_poll(d, now, kind, &v);
        vgpu_flight_unlock();
        if (!ok)
            return now;
        /* A holder's estimate starts its work when it launched; work of the
         * lower classes in flight then (at most a budget's worth) ran first,
         * so its work may run a budget past it: in that budget, the signals
         * are read again each FINE_NAP_NS (a holder that saw its work
         * complete says so at once: busy_until 0, flight.c). */
        uint64_t nap = 0;
        CUevent wait_for = NULL;
        if (busy_until > now)
            nap = busy_until - now;                        /* a holder's work runs */
        else if (busy_until != 0 && busy_until + budget > now)
            nap = FINE_NAP_NS;                             /* ... may still run */
        else if (v.n > 0 && v.pending_ns + v.cost_ns > budget)
            wait_for = v.head;                             /* over the budget */
        if (nap == 0 && wait_for == NULL)
            return now;
        if (wait_for != NULL) {
            vgpu_flight_wait(wait_for, d, now);
            continue;
        }
        if (nap > MAX_NAP_NS)
            nap = MAX_NAP_NS;
        struct timespec ts = {.tv_sec = 0, .tv_nsec = (long)nap};
        nanosleep(&ts, NULL);
        __atomic_fetch_add(&vgpu_g_usage->dev[d].throttled_ns, vgpu_now_ns() - now,
                           __ATOMIC_RELAXED);
    }
}

/* A forked child's holders' signals are attached anew on first need; its
 * signal is the job's (the attachment is inherited). */
void vgpu_priority_atfork_child(void)
{
    pthread_mutex_init(&prio_lock, NULL);
    for (int d = 0; d < VGPU_MAX_DEVICES; d++) {
        close_holders(&g_holders[d]);
        g_holders[d].gen = 0;
    }
}
