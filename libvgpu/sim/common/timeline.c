/*
 * timeline.c - the per-device kernel timeline that serialises kernels from
 * every process (time slicing, as a GPU does across contexts without MPS),
 * and the time it records.
 *
 * Each process has one in-order queue of kernel time per device
 * (vgpu_sim_queue: what it submitted, what ran). The device runs one
 * process at a time, as a GPU without MPS runs one context at a time:
 *
 *   - the process holding the device runs its kernels back to back; when
 *     its queue empties the device goes to the next process with pending
 *     kernels, in slot order after it (round robin);
 *   - while another process has pending kernels, the holder keeps the device
 *     for at most one time slice (slice_ns; alone, its slices renew on the
 *     same grid), so a newcomer waits at most what is left of the slice;
 *   - a kernel longer than what is left of its process's slice is preempted
 *     and resumes in that process's next slice (compute preemption);
 *   - handing the device to another process costs switch_ns, during which
 *     nothing runs.
 *
 * The timeline is played lazily, up to "now", by whoever looks at it (a
 * submission, a worker waiting for a completion, NVML's readers): what a
 * kernel's completion depends on is only what was submitted before, so a
 * process's worker can ask when its kernel will complete if nobody else
 * submits anything, sleep until then, and look again. Runs are recorded as
 * they are played: the device's busy time, each process's and tag's, the
 * utilization sample periods and the ring. */
#include <string.h>

#include "sim.h"
#include "slot.h"

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

struct play {
    struct vgpu_sim_sched sc;
    uint64_t slice, sw;
    uint64_t pend[VGPU_SIM_MAX_PROCS];   /* each slot's pending kernel time */
    uint64_t loaded[(VGPU_SIM_MAX_PROCS + 63) / 64];  /* slots pend[] may be set for */
    int npend;                           /* slots with some */
    int check_alive;                     /* drop the pending work of dead slots */
    int dev;
    int stop;                            /* set by a run callback: stop playing */
};

typedef void (*run_fn)(struct play *p, void *arg, int slot, uint64_t a, uint64_t b);

static void drop_pending(struct play *p, int slot)
{
    struct vgpu_sim_state *s = sim_state();
    struct vgpu_sim_queue *q = &s->procs[slot].queue[p->dev];
    q->done_ns = q->submitted_ns;   /* a dead process's work goes with its context */
    p->pend[slot] = 0;
    p->npend--;
}

/* The next slot after `after` (round robin) with pending work, -1 if none:
 * among the slots loaded, not all of them (this runs at every launch that
 * finds the device idle). */
static int pick_next(struct play *p, int after)
{
    for (;;) {
        int best = -1, bestd = VGPU_SIM_MAX_PROCS;
        for (int w = 0; w < (VGPU_SIM_MAX_PROCS + 63) / 64; w++) {
            uint64_t bits = p->loaded[w];
            while (bits) {
                int i = w * 64 + __builtin_ctzll(bits);
                bits &= bits - 1;
                if (p->pend[i] == 0)
                    continue;
                int d = ((i - after - 1) % VGPU_SIM_MAX_PROCS + VGPU_SIM_MAX_PROCS) %
                        VGPU_SIM_MAX_PROCS;
                if (d < bestd) {
                    bestd = d;
                    best = i;
                }
            }
        }
        if (best < 0 || !p->check_alive || sim_slot_alive(best))
            return best;
        drop_pending(p, best);
    }
}

/* Play the timeline from p->sc.played_ns up to `to`, calling run for every
 * stretch a process runs; at most max_steps steps (0: no limit). */
static void play(struct play *p, uint64_t to, run_fn run, void *arg, int max_steps)
{
    struct vgpu_sim_sched *sc = &p->sc;
    for (int steps = 0; sc->played_ns < to && !p->stop; steps++) {
        if (max_steps && steps >= max_steps)
            break;
        uint64_t t = sc->played_ns;
        if (sc->next >= 0) {                       /* a switch under way */
            if (sc->switch_end_ns > to) {
                sc->played_ns = to;
                break;
            }
            sc->played_ns = sc->switch_end_ns;
            sc->cur = sc->next;
            sc->next = -1;
            sc->slice_end_ns = sc->played_ns + p->slice;
            continue;
        }
        int c = sc->cur;
        if (c >= 0 && p->pend[c] > 0) {
            int others = p->npend > 1;
            if (sc->slice_end_ns == 0)
                sc->slice_end_ns = t + p->slice;    /* resumed after an idle spell */
            if (sc->slice_end_ns <= t) {
                int n = others ? pick_next(p, c) : -1;
                if (n >= 0 && n != c) {
                    sc->next = n;
                    sc->switch_end_ns = t + p->sw;
                    sc->switches++;
                    continue;
                }
                others = 0;
                sc->slice_end_ns += ((t - sc->slice_end_ns) / p->slice + 1) * p->slice;
            }
            uint64_t end = t + p->pend[c];
            if (others && sc->slice_end_ns < end)
                end = sc->slice_end_ns;
            if (end > to)
                end = to;
            run(p, arg, c, t, end);
            p->pend[c] -= end - t;
            if (p->pend[c] == 0) {
                p->npend--;
                sc->slice_end_ns = 0;
            }
            sc->played_ns = end;
            continue;
        }
        int n = pick_next(p, c);
        if (n < 0) {
            sc->played_ns = to;                    /* idle */
            break;
        }
        sc->next = n;
        sc->switch_end_ns = t + p->sw;
        sc->switches++;
    }
}

/* The slots with pending kernels on dev, from its pending bits (a slot's
 * bit is set when it submits, and cleared here once its queue is empty: a
 * look at the timeline costs what the busy slots cost, not all of them). */
static void load(struct play *p, struct vgpu_sim_state *s, int dev, int check_alive)
{
    struct vgpu_sim_sched *sc = &s->dev[dev].sched;
    p->sc = *sc;
    p->slice = s->slice_ns ? s->slice_ns : (uint64_t)SIM_DEFAULT_TIMESLICE_US * 1000;
    p->sw = s->switch_ns;
    p->npend = 0;
    p->check_alive = check_alive;
    p->dev = dev;
    p->stop = 0;
    /* pend[] is zero but where the last load set it (cheaper than clearing
     * it all: a look at the timeline is made at every launch) */
    for (int w = 0; w < (VGPU_SIM_MAX_PROCS + 63) / 64; w++) {
        uint64_t bits = p->loaded[w];
        while (bits) {
            p->pend[w * 64 + __builtin_ctzll(bits)] = 0;
            bits &= bits - 1;
        }
        p->loaded[w] = sc->pending[w];
    }
    for (int w = 0; w < (VGPU_SIM_MAX_PROCS + 63) / 64; w++) {
        uint64_t bits = sc->pending[w];
        while (bits) {
            int i = w * 64 + __builtin_ctzll(bits);
            bits &= bits - 1;
            const struct vgpu_sim_queue *q = &s->procs[i].queue[dev];
            p->pend[i] = (s->procs[i].pid && q->submitted_ns > q->done_ns)
                             ? q->submitted_ns - q->done_ns : 0;
            if (p->pend[i])
                p->npend++;
            else
                sc->pending[w] &= ~(1ull << (i % 64));
        }
    }
}

/* Record a stretch [a, b) of slot's kernels on the device. */
static void account_run(struct play *p, void *arg, int slot, uint64_t a, uint64_t b)
{
    struct vgpu_sim_state *s = arg;
    struct vgpu_sim_device *d = &s->dev[p->dev];
    struct vgpu_sim_proc *pr = &s->procs[slot];
    struct vgpu_sim_queue *q = &pr->queue[p->dev];
    uint64_t ns = b - a;
    struct vgpu_sim_run_rec *last = q->nruns ? &q->runs[(q->nruns - 1) % VGPU_SIM_RUNS] : NULL;
    if (last && last->end_ns == a) {
        last->end_ns = b;
    } else {
        struct vgpu_sim_run_rec *r = &q->runs[q->nruns++ % VGPU_SIM_RUNS];
        r->start_ns = a;
        r->end_ns = b;
        r->done_ns = q->done_ns;
    }
    q->done_ns += ns;
    struct vgpu_sim_kernel *k = d->runs ? &d->ring[(d->runs - 1) % VGPU_SIM_RING] : NULL;
    if (k && k->pid == pr->pid && k->end_ns == a) {
        k->end_ns = b;
    } else {
        k = &d->ring[d->runs++ % VGPU_SIM_RING];
        k->pid = pr->pid;
        k->start_ns = a;
        k->end_ns = b;
    }
    d->busy_ns += ns;
    pr->busy_ns[p->dev] += ns;
    struct vgpu_sim_tag *t = sim_proc_tag(s, pr);
    if (t)
        t->busy_ns[p->dev] += ns;
    add_period_busy(s, d, pr->pid, b, a, b);
}

/* Play dev's timeline up to now; needs the lock. */
static void catch_up(struct vgpu_sim_state *s, int dev, uint64_t now)
{
    static __thread struct play p;
    if (s->dev[dev].sched.played_ns >= now)
        return;
    load(&p, s, dev, 1);
    play(&p, now, account_run, s, 0);
    uint64_t bits[(VGPU_SIM_MAX_PROCS + 63) / 64];
    memcpy(bits, s->dev[dev].sched.pending, sizeof bits);
    s->dev[dev].sched = p.sc;
    memcpy(s->dev[dev].sched.pending, bits, sizeof bits);
}

void sim_timeline_catch_up(int dev)
{
    struct vgpu_sim_state *s = sim_state();
    catch_up(s, dev, sim_now_ns());
}

uint64_t sim_submit_kernel(int dev, uint64_t ns)
{
    struct vgpu_sim_state *s = sim_state();
    if (ns == 0)
        ns = 1;
    sim_lock(0);
    uint64_t mark = 0;
    struct vgpu_sim_proc *p = sim_self_proc(s);
    if (p) {
        catch_up(s, dev, sim_now_ns());
        struct vgpu_sim_queue *q = &p->queue[dev];
        q->submitted_ns += ns;
        mark = q->submitted_ns;
        s->dev[dev].kernels++;
        int slot = (int)(p - s->procs);
        s->dev[dev].sched.pending[slot / 64] |= 1ull << (slot % 64);
    }
    sim_unlock();
    return mark;
}

struct watch {
    int slot;
    uint64_t left;  /* kernel time the slot must still run */
    uint64_t at;
};

static void watch_run(struct play *p, void *arg, int slot, uint64_t a, uint64_t b)
{
    struct watch *w = arg;
    if (slot != w->slot)
        return;
    if (b - a >= w->left) {
        w->at = a + w->left;
        p->stop = 1;
    } else {
        w->left -= b - a;
    }
}

/* When the queue's executed time passed mark, from its recorded runs. */
static uint64_t crossing(const struct vgpu_sim_queue *q, uint64_t mark, uint64_t now)
{
    uint32_t n = q->nruns < VGPU_SIM_RUNS ? q->nruns : VGPU_SIM_RUNS;
    uint64_t at = now;
    for (uint32_t k = 0; k < n; k++) {
        const struct vgpu_sim_run_rec *r = &q->runs[(q->nruns - 1 - k) % VGPU_SIM_RUNS];
        if (mark > r->done_ns)
            return r->start_ns + (mark - r->done_ns);
        at = r->start_ns;   /* older than what is remembered: about then */
    }
    return at;
}

int sim_kernel_done(int dev, uint64_t mark, uint64_t *at)
{
    struct vgpu_sim_state *s = sim_state();
    static __thread struct play p;
    sim_lock(0);
    uint64_t now = sim_now_ns();
    int slot = sim_self_slot();
    if (slot < 0 || mark == 0) {
        sim_unlock();
        *at = now;
        return 1;
    }
    catch_up(s, dev, now);
    const struct vgpu_sim_queue *q = &s->procs[slot].queue[dev];
    if (q->done_ns >= mark) {
        *at = crossing(q, mark, now);
        sim_unlock();
        return 1;
    }
    /* Not yet: when, if nobody else submits anything? */
    load(&p, s, dev, 0);
    struct watch w = {slot, mark - q->done_ns, 0};
    play(&p, UINT64_MAX, watch_run, &w, 20000);
    sim_unlock();
    *at = w.at ? w.at : (p.sc.played_ns > now ? p.sc.played_ns : now + 1000000);
    return 0;
}
