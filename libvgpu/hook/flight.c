/*
 * flight.c - a gated job's work in flight, and its GPU time measured by its
 * own events (docs/compute.md, "Each job's GPU time").
 *
 * Every gated launch (turns, or a class to heed) is followed by a timing
 * event recorded into its stream: a mark. cuEventQuery tells which marks
 * have completed, in launch order; cuEventElapsedTime between a mark and
 * the one completed before it is the GPU time of the launch between them.
 * A stretch of back-to-back work starts with an event recorded just before
 * its first launch, when nothing of the process is in flight on the device
 * (polled right then), so the time the GPU sat idle between two stretches
 * is never counted. The spans add up to the time the process had work on
 * the GPU: its own GPU time while it holds the GPU alone, which turns make
 * the rule; while another context's work time-slices with it, a span holds
 * the other's slices too (one device clock), which is why turns keep what a
 * job has in flight outside its turn small.
 *
 * What is measured goes to the job's usage (busy_ns, per device and per
 * process), to the turn's credit (turns.c) and to the cost of one launch
 * (an average over its last few hundred launches), by which the work
 * still in flight is estimated.
 *
 * One mutex guards the marks; it is taken only on the slow path, twice a
 * launch: for the gate's poll and the stretch's start, and for the mark;
 * and after a synchronisation while marks are in flight (what completed is
 * measured then, not at the next launch).
 * The slow path reads the clock and the current context once a launch
 * (struct vgpu_launch).
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "hook.h"

#define MAX_MARKS 1024                  /* launches tracked in flight (a queue's depth) */
#define POOL_MAX 256
/* The cost of a launch is an average over about the last COST_LAUNCHES
 * launches (each new span weighs 1/COST_LAUNCHES), a plain mean of all of
 * them until there are as many. A program's launches differ (a training step's convolutions, then its
 * optimizer's many small kernels): an average over the last few follows
 * the small ones, and the big ones after them are let into a turn
 * on a fraction of their cost, overrun it, and make the next turn wait
 * (two PyTorch loops at 30 / 60 read 27.4 / 57.4 over the last 8, 29.1 /
 * 59.1 over these; tests/frameworks/test_torch_share.py). The plain mean
 * first: a first span that waited behind another's work is diluted
 * by the next few, not kept for hundreds (the 3 s demo's 5 ms job, which
 * launches about 120 times, read 16.0 of 20 with a slow average of it). */
#define COST_LAUNCHES 256.0
#define DEFAULT_COST_NS 1000000ull      /* a launch's GPU time before any was measured */

/* A mark recorded more than this after its launch was decided came late:
 * the launching thread lost its CPU in between (a loaded host, a signal),
 * the launch may have run and ended meanwhile, and its event then stamps
 * when it was recorded, not when the launch ended: its span holds up to
 * that wait more than the launch ran. */
#define MARK_LATE_NS 50000ull

struct mark {
    CUevent ev;
    CUcontext ctx;
    uint32_t own;       /* run in the job's turn (1) or borrowed (0) */
    uint64_t wait_ns;   /* from the launch's decision to its mark's record */
};

struct flight {
    struct mark m[MAX_MARKS];
    uint32_t head, n;
    CUevent ref;        /* the last completed event of this stretch: spans start here */
    CUcontext ref_ctx;
    double cost_ns;     /* 0: none measured yet */
    double cost_n;      /* launches in that average, up to COST_LAUNCHES */
    uint64_t own_until; /* until when its work launched in its turn should run */
    uint64_t told_end;  /* its turn's end as the rule told it (turns.c) */
    struct vgpu_turn_state turn;   /* turns.c's */
};

static pthread_mutex_t flight_lock = PTHREAD_MUTEX_INITIALIZER;
static struct flight *g_flight[VGPU_MAX_DEVICES];
static struct {
    CUevent ev;
    CUcontext ctx;
} g_pool[POOL_MAX];
static int g_npool;

void vgpu_flight_lock(void)
{
    pthread_mutex_lock(&flight_lock);
}

void vgpu_flight_unlock(void)
{
    pthread_mutex_unlock(&flight_lock);
}

static struct flight *flight_of(int d)
{
    if (g_flight[d] == NULL)    /* (read unlocked by vgpu_flight_settle) */
        __atomic_store_n(&g_flight[d], calloc(1, sizeof(struct flight)), __ATOMIC_RELEASE);
    return g_flight[d];
}

static void pool_put(CUevent ev, CUcontext ctx)
{
    if (ev != NULL && g_npool < POOL_MAX) {
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
    if (REAL(cuEventCreate)(&ev, CU_EVENT_BLOCKING_SYNC) != CUDA_SUCCESS)
        return NULL;
    return ev;
}

/* One launch's GPU time as measured, or the default before any was. */
static double cost_of(const struct flight *f)
{
    return f->cost_ns > 0.0 ? f->cost_ns : (double)DEFAULT_COST_NS;
}

static void add_busy(int d, uint64_t ns, int own)
{
    __atomic_fetch_add(&vgpu_g_usage->dev[d].busy_ns, ns, __ATOMIC_RELAXED);
    if (!own)
        __atomic_fetch_add(&vgpu_g_usage->dev[d].borrowed_ns, ns, __ATOMIC_RELAXED);
    if (vgpu_g_slot != NULL)
        __atomic_fetch_add(&vgpu_g_slot->busy_ns[d], ns, __ATOMIC_RELAXED);
}

/* A completed mark: the span since the stretch's last completed event. */
static void measure(int d, struct flight *f, struct mark *m)
{
    float ms = -1.0f;
    int ok = f->ref != NULL && f->ref_ctx == m->ctx &&
             REAL(cuEventElapsedTime)(&ms, f->ref, m->ev) == CUDA_SUCCESS;
    if (ok && ms < 0.0f) {
        /* completed before the reference (another stream's): its time is
         * inside a span already counted */
        pool_put(m->ev, m->ctx);
        return;
    }
    uint64_t span = ok ? (uint64_t)((double)ms * 1e6)
                       : (uint64_t)(f->cost_ns > 0.0 ? f->cost_ns : 0.0);
    if (ok && m->wait_ns > MARK_LATE_NS) {
        /* the launch ran at least the span less the wait, at most the span:
         * its measured cost, within those bounds (and no lesson for it) */
        uint64_t lo = span > m->wait_ns ? span - m->wait_ns : 0;
        double est = cost_of(f);
        span = est < (double)lo ? lo : est > (double)span ? span : (uint64_t)est;
    } else if (ok) {
        if (f->cost_n < COST_LAUNCHES)
            f->cost_n += 1.0;
        f->cost_ns += ((double)span - f->cost_ns) / f->cost_n;
        __atomic_store_n(&vgpu_g_usage->dev[d].cost_ns, (uint64_t)f->cost_ns, __ATOMIC_RELAXED);
    }
    add_busy(d, span, (int)m->own);
    if (m->own)
        f->turn.credit_ns -= (int64_t)span;
    pool_put(f->ref, f->ref_ctx);
    f->ref = m->ev;
    f->ref_ctx = m->ctx;
}

/* Until when this job's work in flight should run, into its signal: the job
 * of the next turn waits for it (turns.c), and the lower classes do
 * (priority.c). Before a launch was measured, at most GUESS_HORIZON_NS. */
#define GUESS_HORIZON_NS 20000000ull
static void publish(int d, struct flight *f, uint64_t now)
{
    struct vgpu_signal *sig = vgpu_g_signal;
    if (sig == NULL)
        return;
    uint64_t pending = (uint64_t)(cost_of(f) * f->n);
    if (f->cost_ns <= 0.0 && pending > GUESS_HORIZON_NS)
        pending = GUESS_HORIZON_NS;
    __atomic_store_n(&sig->dev[d].busy_until_ns, now + pending, __ATOMIC_RELAXED);
}

/* The turn's end the job tells (its signal's turn_end_ns): the rule's, or,
 * if later, when the work it launched in its turn should be done (its turn
 * is over for the borrowers of the open span after it only then). */
static void tell_end(int d, struct flight *f)
{
    struct vgpu_signal *sig = vgpu_g_signal;
    uint64_t end = f->told_end > f->own_until ? f->told_end : f->own_until;
    if (sig != NULL && __atomic_load_n(&sig->dev[d].turn_end_ns, __ATOMIC_RELAXED) != end)
        __atomic_store_n(&sig->dev[d].turn_end_ns, end, __ATOMIC_RELAXED);
}

static void own_until(int d, struct flight *f, uint64_t now)
{
    uint64_t until = now + (uint64_t)(cost_of(f) * f->n);
    if (until <= f->own_until)
        return;
    f->own_until = until;
    tell_end(d, f);
}

void vgpu_flight_tell_end(int d, uint64_t end)
{
    struct flight *f = g_flight[d];
    if (f == NULL || end == 0)
        return;
    f->told_end = end;
    tell_end(d, f);
}

/* Take in the marks that have completed (flight_lock held). */
static void poll(int d, struct flight *f, uint64_t now)
{
    uint32_t n0 = f->n;
    while (f->n > 0) {
        struct mark *m = &f->m[f->head];
        CUresult rc = REAL(cuEventQuery)(m->ev);
        if (rc == CUDA_ERROR_NOT_READY)
            break;
        if (rc == CUDA_SUCCESS)
            measure(d, f, m);
        /* else its context is gone, and the event with it */
        f->head = (f->head + 1) % MAX_MARKS;
        f->n--;
    }
    if (f->n != n0) {
        publish(d, f, now);
        /* what is left in flight bounds what is left of its own work */
        uint64_t left = now + (uint64_t)(cost_of(f) * f->n);
        if (f->own_until > left) {
            f->own_until = left;
            tell_end(d, f);
        }
    }
}

int vgpu_flight_poll(int d, uint64_t now, struct vgpu_flight_view *v)
{
    struct flight *f = flight_of(d);
    if (f == NULL)
        return 0;
    poll(d, f, now);
    double cost = cost_of(f);
    v->n = f->n;
    v->cost_ns = (uint64_t)cost;
    v->measured = f->cost_ns > 0.0;
    v->pending_ns = (uint64_t)(cost * f->n);
    v->head = f->n > 0 ? f->m[f->head].ev : NULL;
    v->turn = &f->turn;
    return 1;
}

uint64_t vgpu_flight_cost(int d, int *measured)
{
    /* the job's figure (any of its processes), not this process's: read
     * without the lock, on the signalling path */
    uint64_t c = __atomic_load_n(&vgpu_g_usage->dev[d].cost_ns, __ATOMIC_RELAXED);
    *measured = c > 0;
    return c > 0 ? c : DEFAULT_COST_NS;
}

void vgpu_flight_begin_locked(const struct vgpu_launch *l, uint32_t n)
{
    struct flight *f = g_flight[l->d];
    if (f == NULL || n != 0 || l->ctx == NULL)
        return;
    /* nothing in flight: a new stretch starts with this launch */
    CUevent ev = pool_get(l->ctx);
    if (ev != NULL && REAL(cuEventRecord)(ev, l->s) == CUDA_SUCCESS) {
        pool_put(f->ref, f->ref_ctx);
        f->ref = ev;
        f->ref_ctx = l->ctx;
    } else {
        pool_put(ev, l->ctx);
    }
}

void vgpu_flight_begin(const struct vgpu_launch *l)
{
    if (l->ctx == NULL)
        return;
    pthread_mutex_lock(&flight_lock);
    struct flight *f = flight_of(l->d);
    if (f != NULL) {
        poll(l->d, f, l->now);
        vgpu_flight_begin_locked(l, f->n);
    }
    pthread_mutex_unlock(&flight_lock);
}

void vgpu_flight_track(const struct vgpu_launch *l, int own)
{
    int d = l->d;
    __atomic_fetch_add(&vgpu_g_usage->dev[d].launches, 1, __ATOMIC_RELAXED);
    if (l->ctx == NULL)
        return;
    pthread_mutex_lock(&flight_lock);
    struct flight *f = flight_of(d);
    CUevent ev = f != NULL && f->n < MAX_MARKS ? pool_get(l->ctx) : NULL;
    if (ev != NULL) {
        if (REAL(cuEventRecord)(ev, l->s) == CUDA_SUCCESS) {
            struct mark *m = &f->m[(f->head + f->n) % MAX_MARKS];
            m->ev = ev;
            m->ctx = l->ctx;
            m->own = (uint32_t)own;
            m->wait_ns = vgpu_now_ns() - l->now;
            f->n++;
            publish(d, f, l->now);
            if (own)
                own_until(d, f, l->now);
        } else {
            pool_put(ev, l->ctx);   /* another context's stream, say: not tracked */
        }
    }
    pthread_mutex_unlock(&flight_lock);
}

void vgpu_flight_settle(void)
{
    /* After a synchronisation: what completed is measured now, not at the
     * next launch, which may be long in coming (a loop's CPU phase, the
     * process's end): the job's GPU time is its own the moment it ran. */
    uint64_t now = 0;
    for (int d = 0; d < VGPU_MAX_DEVICES; d++) {
        struct flight *f = __atomic_load_n(&g_flight[d], __ATOMIC_ACQUIRE);
        if (f == NULL || __atomic_load_n(&f->n, __ATOMIC_RELAXED) == 0)
            continue;
        if (now == 0)
            now = vgpu_now_ns();
        pthread_mutex_lock(&flight_lock);
        poll(d, f, now);
        pthread_mutex_unlock(&flight_lock);
    }
}

void vgpu_flight_wait(CUevent ev, int d, uint64_t since)
{
    /* the event may be reused meanwhile: then this waits for a later
     * launch's work, which is no harm */
    REAL(cuEventSynchronize)(ev);
    __atomic_fetch_add(&vgpu_g_usage->dev[d].throttled_ns, vgpu_now_ns() - since,
                       __ATOMIC_RELAXED);
}

/* A forked child has no context, no events and no work in flight. */
void vgpu_flight_atfork_child(void)
{
    pthread_mutex_init(&flight_lock, NULL);
    for (int d = 0; d < VGPU_MAX_DEVICES; d++)
        if (g_flight[d] != NULL)
            memset(g_flight[d], 0, sizeof(struct flight));
    g_npool = 0;
}
