/*
 * priority.c - priority classes on a GPU (docs/compute.md, "Priority
 * classes"). The daemon writes, per device of the job's limits:
 *
 *   hold & VGPU_HOLD_SIGNAL  jobs of a lower class share this GPU: every
 *       launch stamps this job's signal (its own System V segment, which
 *       the daemon made and state.c attached read-write): when it last
 *       launched, and until when the work it launched should keep the GPU
 *       busy (each launch adds the daemon's estimate of its GPU time,
 *       launch_cost_ns).
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
#include <stdlib.h>
#include <string.h>
#include <sys/shm.h>
#include <time.h>

#include "hook.h"

/* What applies while the daemon has written no value (0) */
#define DEFAULT_COST_NS 1000000ull      /* a launch's GPU time, unknown: 1 ms */
#define DEFAULT_BUDGET_NS 1000000ull
#define DEFAULT_HOLDOFF_NS 100000000ull
#define GUESS_HORIZON_NS 20000000ull    /* a guessed busy time reaches this far at most */
#define MAX_MARKS 1024                  /* launches tracked in flight (a queue's depth) */
#define MAX_NAP_NS 1000000ull           /* a held thread re-reads the signals this often */
#define POOL_MAX 256

#define CAPTURE_ACTIVE 1                /* CU_STREAM_CAPTURE_STATUS_ACTIVE */

struct mark {
    CUevent ev;
    CUcontext ctx;
    uint64_t cost;
};

struct marks {
    struct mark m[MAX_MARKS];
    uint32_t head, n;
    uint64_t pending;                   /* sum of the costs in flight */
};

struct holders {
    uint64_t gen;
    int valid;
    int n;
    const struct vgpu_signal *sig[VGPU_MAX_HOLDERS];
    uint32_t dev[VGPU_MAX_HOLDERS];
};

static pthread_mutex_t prio_lock = PTHREAD_MUTEX_INITIALIZER;
static struct marks *g_marks[VGPU_MAX_DEVICES];
static struct holders g_holders[VGPU_MAX_DEVICES];
static struct {
    CUevent ev;
    CUcontext ctx;
} g_pool[POOL_MAX];
static int g_npool;

static uint64_t or_default(uint64_t v, uint64_t def)
{
    return v ? v : def;
}

/* ---- this job's signal ---------------------------------------------------------- */
void vgpu_prio_signal(int d)
{
    struct vgpu_signal *s = vgpu_g_signal;
    if (s == NULL)
        return;
    struct vgpu_signal_dev *sd = &s->dev[d];
    uint64_t now = vgpu_now_ns();
    uint64_t cost = __atomic_load_n(&vgpu_g_limits->dev[d].launch_cost_ns, __ATOMIC_RELAXED);
    /* Until the daemon has measured this job's launches (its first NVML
     * windows), a launch is guessed at 1 ms, and what it adds up to is kept
     * within GUESS_HORIZON_NS of now: the lower classes wait a little too
     * long rather than slip in between this job's kernels. */
    uint64_t horizon = cost ? UINT64_MAX : now + GUESS_HORIZON_NS;
    if (!cost)
        cost = DEFAULT_COST_NS;
    __atomic_store_n(&sd->last_launch_ns, now, __ATOMIC_RELAXED);
    uint64_t cur = __atomic_load_n(&sd->busy_until_ns, __ATOMIC_RELAXED);
    uint64_t next;
    do {
        next = (cur > now ? cur : now) + cost;
        if (next > horizon)
            next = horizon > cur ? horizon : cur;
    } while (!__atomic_compare_exchange_n(&sd->busy_until_ns, &cur, next, 1, __ATOMIC_RELAXED,
                                          __ATOMIC_RELAXED));
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
    /* a signal from beyond a launch's reach is no signal */
    if (*busy_until > now + 10 * holdoff)
        *busy_until = now + holdoff;
    return active;
}

/* ---- this job's work in flight (prio_lock held) ------------------------------------- */
static void pool_put(CUevent ev, CUcontext ctx)
{
    if (g_npool < POOL_MAX) {
        g_pool[g_npool].ev = ev;
        g_pool[g_npool].ctx = ctx;
        g_npool++;
    }   /* else: leaked, as a pool that is full never happens */
}

static CUevent pool_get(CUcontext ctx)
{
    for (int i = g_npool - 1; i >= 0; i--) {
        if (g_pool[i].ctx == ctx) {
            CUevent ev = g_pool[i].ev;
            g_pool[i] = g_pool[--g_npool];
            return ev;
        }
    }
    CUevent ev = NULL;
    if (REAL(cuEventCreate)(&ev, CU_EVENT_DISABLE_TIMING | CU_EVENT_BLOCKING_SYNC) !=
        CUDA_SUCCESS)
        return NULL;
    return ev;
}

static struct marks *marks_of(int d)
{
    if (g_marks[d] == NULL)
        g_marks[d] = calloc(1, sizeof(struct marks));
    return g_marks[d];
}

/* Drop the marks whose work has completed. */
static void poll_marks(struct marks *mk)
{
    while (mk->n > 0) {
        struct mark *m = &mk->m[mk->head];
        CUresult rc = REAL(cuEventQuery)(m->ev);
        if (rc == CUDA_ERROR_NOT_READY)
            break;
        if (rc == CUDA_SUCCESS)
            pool_put(m->ev, m->ctx);   /* else its context is gone, and the event too */
        mk->pending -= m->cost;
        mk->head = (mk->head + 1) % MAX_MARKS;
        mk->n--;
    }
}

static int capturing(CUstream s)
{
    int status = 0;
    return REAL(cuStreamIsCapturing)(s, &status) == CUDA_SUCCESS && status == CAPTURE_ACTIVE;
}

/* ---- the held launch ----------------------------------------------------------------- */
int vgpu_prio_hold(int d, CUstream s)
{
    if (capturing(s))
        return 0;
    const struct vgpu_dev_limit *l = &vgpu_g_limits->dev[d];
    for (;;) {
        uint64_t budget = or_default(__atomic_load_n(&l->budget_ns, __ATOMIC_RELAXED),
                                     DEFAULT_BUDGET_NS);
        uint64_t cost = or_default(__atomic_load_n(&l->launch_cost_ns, __ATOMIC_RELAXED),
                                   DEFAULT_COST_NS);
        pthread_mutex_lock(&prio_lock);
        struct marks *mk = marks_of(d);
        if (mk == NULL) {
            pthread_mutex_unlock(&prio_lock);
            return 0;
        }
        poll_marks(mk);
        uint64_t now = vgpu_now_ns(), busy_until;
        int active = holders_active(d, now, &busy_until);
        /* A holder's estimate starts its work when it launched; work of the
         * lower classes in flight then (at most a budget's worth) ran first. */
        if (busy_until != 0)
            busy_until += budget;
        uint64_t nap = 0;
        CUevent wait_for = NULL;
        if (mk->n >= MAX_MARKS)
            wait_for = mk->m[mk->head].ev;                 /* a driver queue's worth */
        else if (active && busy_until > now)
            nap = busy_until - now;                        /* a holder's work runs */
        else if (active && mk->n > 0 && mk->pending + cost > budget)
            wait_for = mk->m[mk->head].ev;                 /* over the budget */
        pthread_mutex_unlock(&prio_lock);
        if (nap == 0 && wait_for == NULL)
            return 1;
        if (wait_for != NULL) {
            /* the event may be reused meanwhile: then this waits for a later
             * launch's work, which is no harm */
            REAL(cuEventSynchronize)(wait_for);
        } else {
            if (nap > MAX_NAP_NS)
                nap = MAX_NAP_NS;
            struct timespec ts = {.tv_sec = 0, .tv_nsec = (long)nap};
            nanosleep(&ts, NULL);
        }
        __atomic_fetch_add(&vgpu_g_usage->dev[d].throttled_ns, vgpu_now_ns() - now,
                           __ATOMIC_RELAXED);
    }
}

void vgpu_prio_track(int d, CUstream s)
{
    uint64_t cost = or_default(
        __atomic_load_n(&vgpu_g_limits->dev[d].launch_cost_ns, __ATOMIC_RELAXED),
        DEFAULT_COST_NS);
    struct vgpu_signal *sig = vgpu_g_signal;
    if (sig != NULL)
        __atomic_fetch_add(&sig->dev[d].launches, 1, __ATOMIC_RELAXED);
    CUcontext ctx = NULL;
    if (REAL(cuCtxGetCurrent)(&ctx) != CUDA_SUCCESS || ctx == NULL)
        return;
    pthread_mutex_lock(&prio_lock);
    struct marks *mk = marks_of(d);
    CUevent ev = mk && mk->n < MAX_MARKS ? pool_get(ctx) : NULL;
    if (ev != NULL) {
        if (REAL(cuEventRecord)(ev, s) == CUDA_SUCCESS) {
            struct mark *m = &mk->m[(mk->head + mk->n) % MAX_MARKS];
            m->ev = ev;
            m->ctx = ctx;
            m->cost = cost;
            mk->n++;
            mk->pending += cost;
        } else {
            pool_put(ev, ctx);   /* another context's stream, say: not tracked */
        }
    }
    pthread_mutex_unlock(&prio_lock);
}

/* A forked child has no context, no events and no work in flight; its
 * signal is the job's (the attachment is inherited), its holders' signals
 * are attached anew on first need. */
void vgpu_priority_atfork_child(void)
{
    pthread_mutex_init(&prio_lock, NULL);
    for (int d = 0; d < VGPU_MAX_DEVICES; d++) {
        if (g_marks[d] != NULL)
            memset(g_marks[d], 0, sizeof(struct marks));
        close_holders(&g_holders[d]);
        g_holders[d].gen = 0;
    }
    g_npool = 0;
}
