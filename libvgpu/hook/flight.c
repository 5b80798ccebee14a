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
 * process), to the turn's credit (turns.c) and to the cost of a launch of
 * its kind (its function or graph, and its shape: launch.c), by which the
 * work still in flight is estimated, launch by launch.
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
/* What a launch costs, by kind. A program's launches differ widely in
 * length (a training step's convolutions, then its optimizer's many small
 * kernels), and one average of all of them is wrong for each: the big
 * ones went into a turn on a fraction of their cost, ran past it, and
 * time-sliced with the next turn's job, both jobs' spans then counting the
 * other's slices (two different PyTorch programs at 30 / 60 read 27.5 /
 * 57.4 on the simulator's timeline while each hook counted 30 / 60). The
 * same kernel at the same shape takes about the same time from one step
 * to the next, so each kind has its cost: the mean of its last
 * KIND_LAUNCHES launches (a plain mean until there are as many, so that a
 * first span that waited behind another's work is diluted at once). A
 * kind not seen yet costs the job's average over about its last
 * COST_LAUNCHES launches of any kind (a plain mean until then too). A job
 * whose kernels of one kind change their length is learnt in a few
 * launches, and what it ran over its turn meanwhile is paid by its next
 * turns (turns.c). The table keeps KINDS kinds a device, the least taught
 * of KIND_PROBE places replaced by a new one. */
#define KINDS 512                       /* a power of two */
#define KIND_PROBE 8
#define KIND_LAUNCHES 8.0
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
    uint64_t kind;      /* the launch's kind */
    double est_ns;      /* its cost when it was launched (in pending_ns) */
};

struct kind {
    uint64_t key;       /* 0: a free place */
    double ns, n;       /* its cost, over n launches (up to KIND_LAUNCHES) */
    double w;           /* 1 / n */
};

struct flight {
    struct mark m[MAX_MARKS];
    uint32_t head, n;
    CUevent ref;        /* the last completed event of this stretch: spans start here */
    CUcontext ref_ctx;
    double cost_ns;     /* any launch's, 0: none measured yet */
    double cost_n;      /* launches in that average, up to COST_LAUNCHES */
    double cost_w;      /* 1 / cost_n */
    double pending_ns;  /* the est_ns of the marks in flight */
    struct kind kinds[KINDS];
    struct kind *last;  /* the place kind_at found last (a launch asks for its
                         * kind two or three times: its estimate, its mark's,
                         * its lesson) */
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

/* A kind's place (NULL: not there, or no room when make). Places are only
 * ever overwritten, never emptied, so a search stops at a free one. */
static struct kind *kind_at(struct flight *f, uint64_t key, int make)
{
    if (key == 0)
        return NULL;
    if (f->last != NULL && f->last->key == key)
        return f->last;
    uint32_t h = (uint32_t)(key >> 32) ^ (uint32_t)key;
    struct kind *victim = NULL;
    for (uint32_t i = 0; i < KIND_PROBE; i++) {
        struct kind *k = &f->kinds[(h + i) & (KINDS - 1)];
        if (k->key == key)
            return f->last = k;
        if (k->key == 0) {
            victim = k;
            break;
        }
        if (victim == NULL || k->n < victim->n)
            victim = k;
    }
    if (!make)
        return NULL;
    *victim = (struct kind){.key = key};
    return f->last = victim;
}

/* What a launch of this kind should cost. */
static double est_of(struct flight *f, uint64_t key)
{
    const struct kind *k = kind_at(f, key, 0);
    return k != NULL && k->n > 0.0 ? k->ns : cost_of(f);
}

/* The job's first launch measured: what it launched before, each estimated
 * at the default (DEFAULT_COST_NS), is estimated again. A job of 5 ms
 * kernels had its first turn's launches let in at 1 ms each, ran 10 ms
 * past its turn, and the turns after it began late for seconds. */
static void reestimate(struct flight *f)
{
    double pending = 0.0;
    for (uint32_t i = 0; i < f->n; i++) {
        struct mark *m = &f->m[(f->head + i) % MAX_MARKS];
        m->est_ns = est_of(f, m->kind);
        pending += m->est_ns;
    }
    f->pending_ns = pending;
}

/* (the weights' inverses kept, so that a launch divides only while its
 * averages fill) */
static void teach(struct flight *f, uint64_t key, uint64_t span)
{
    if (f->cost_n < COST_LAUNCHES) {
        f->cost_n += 1.0;
        f->cost_w = 1.0 / f->cost_n;
    }
    f->cost_ns += ((double)span - f->cost_ns) * f->cost_w;
    struct kind *k = kind_at(f, key, 1);
    if (k != NULL) {
        if (k->n < KIND_LAUNCHES) {
            k->n += 1.0;
            k->w = 1.0 / k->n;
        }
        k->ns += ((double)span - k->ns) * k->w;
    }
}

/* (flight_lock held: the process's own figure needs no locked add; the
 * job's is shared by its processes) */
static void add_busy(int d, uint64_t ns, int own)
{
    __atomic_fetch_add(&vgpu_g_usage->dev[d].busy_ns, ns, __ATOMIC_RELAXED);
    if (!own)
        __atomic_fetch_add(&vgpu_g_usage->dev[d].borrowed_ns, ns, __ATOMIC_RELAXED);
    if (vgpu_g_slot != NULL) {
        uint64_t *mine = &vgpu_g_slot->busy_ns[d];
        __atomic_store_n(mine, __atomic_load_n(mine, __ATOMIC_RELAXED) + ns, __ATOMIC_RELAXED);
    }
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
                       : (uint64_t)(f->cost_ns > 0.0 ? m->est_ns : 0.0);
    if (ok && m->wait_ns > MARK_LATE_NS) {
        /* the launch ran at least the span less the wait, at most the span:
         * its kind's cost, within those bounds (and no lesson for it) */
        uint64_t lo = span > m->wait_ns ? span - m->wait_ns : 0;
        double est = m->est_ns;
        span = est < (double)lo ? lo : est > (double)span ? span : (uint64_t)est;
    } else if (ok) {
        int first = f->cost_ns <= 0.0;
        teach(f, m->kind, span);
        __atomic_store_n(&vgpu_g_usage->dev[d].cost_ns, (uint64_t)f->cost_ns, __ATOMIC_RELAXED);
        if (first)
            reestimate(f);
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
 * (priority.c). Before a launch was measured, at most GUESS_HORIZON_NS.
 * Nothing in flight (all of it seen completed): 0, not the time it was
 * seen, which the lower classes would take for an estimate made at a
 * launch and wait a budget past (priority.c). */
#define GUESS_HORIZON_NS 20000000ull
static void publish(int d, struct flight *f, uint64_t now)
{
    struct vgpu_signal *sig = vgpu_g_signal;
    if (sig == NULL)
        return;
    uint64_t pending = (uint64_t)f->pending_ns;
    if (f->cost_ns <= 0.0 && pending > GUESS_HORIZON_NS)
        pending = GUESS_HORIZON_NS;
    __atomic_store_n(&sig->dev[d].busy_until_ns, f->n == 0 ? 0 : now + pending,
                     __ATOMIC_RELAXED);
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
    uint64_t until = now + (uint64_t)f->pending_ns;
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
        f->pending_ns = f->n > 1 && f->pending_ns > m->est_ns ? f->pending_ns - m->est_ns : 0.0;
        f->head = (f->head + 1) % MAX_MARKS;
        f->n--;
    }
    if (f->n != n0) {
        publish(d, f, now);
        /* what is left in flight bounds what is left of its own work */
        uint64_t left = now + (uint64_t)f->pending_ns;
        if (f->own_until > left) {
            f->own_until = left;
            tell_end(d, f);
        }
    }
}

int vgpu_flight_poll(int d, uint64_t now, uint64_t kind, struct vgpu_flight_view *v)
{
    struct flight *f = flight_of(d);
    if (f == NULL)
        return 0;
    poll(d, f, now);
    v->n = f->n;
    v->cost_ns = (uint64_t)est_of(f, kind);
    v->measured = f->cost_ns > 0.0;
    v->pending_ns = (uint64_t)f->pending_ns;
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
            m->kind = l->kind;
            m->est_ns = est_of(f, l->kind);
            f->pending_ns += m->est_ns;
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
