/*
 * turns.c - when a job gated by turns may launch (docs/compute.md, "Turns").
 *
 * The daemon divides each GPU's time into a cycle (cycle_ns from epoch_ns,
 * CLOCK_MONOTONIC, the same for every job there) and gives each job with a
 * share a turn in it, the jobs' turns apart: [turn_start_ns, + turn_len_ns).
 * In its turn a job launches while its credit lasts: turn_credit_ns of GPU
 * time a cycle, less what its own events measured (flight.c) and what it
 * has in flight (estimated). Credit comes at each turn's start, a turn's
 * worth a turn passed (a thread that woke late loses nothing), and never
 * piles up beyond a turn and one launch: an idle job banks nothing, and a
 * turn that could not fit its last launch carries what is left to the next.
 * So a launch that ran past its turn (an overrun, a kernel longer than the
 * turn, a kernel that got longer after it was measured) is paid for by the
 * job's next turns, and its GPU time follows its share by construction,
 * whatever its kernels. A launch that finds nothing of the job in flight
 * goes if any credit is left (a kernel longer than the whole turn runs, and
 * the turns after it pay).
 *
 * A turn begins when the turn before it is over, as that job's signal says
 * (its hook stamps when its work in flight should be done, and when its
 * turn ends: at once when its credit is spent, later while the work it
 * launched in its turn runs), at most VGPU_TURN_WAIT_MAX_NS late, and ends
 * as much later (up to VGPU_TURN_EXTEND_MAX_NS): the spans a job measures
 * hold no other job's time-slices, and a job that carried a launch past its
 * turn's end pays for it alone. A job that writes a lie into its signal delays the turn after
 * it by that bound at most, and takes nothing of it.
 *
 * Outside its turn a job waits for it; a job that may borrow (soft, or one
 * without a share) launches in the spans no one holds (open[]: the cycle's
 * unpromised part and the turns of jobs the daemon saw idle), keeping at
 * most borrow_ns in flight there, so that a job coming back to its turn
 * waits for little. Borrowed work waits, as a turn does, for the work in
 * flight of the job whose turn the open span follows (open[].prev_signal_id):
 * it would time-slice with it, and count in that job's spans. Borrowed time
 * costs no credit.
 *
 * decide() is the whole rule: pure, driven by tests/c/turns_table.c.
 */
#define _GNU_SOURCE
#include <sys/shm.h>
#include <time.h>

#include "hook.h"
#include "turns_rule.h"

#define MAX_NAP_NS 50000000ull    /* a waiting thread re-reads the schedule this often */
#define MIN_NAP_NS 20000ull

#define CAPTURE_ACTIVE 1          /* CU_STREAM_CAPTURE_STATUS_ACTIVE */

int vgpu_capturing(CUstream s)
{
    int status = 0;
    return REAL(cuStreamIsCapturing)(s, &status) == CUDA_SUCCESS && status == CAPTURE_ACTIVE;
}

/* The schedule as the daemon wrote it, consistently (turn_gen is odd while it
 * writes); 0 while it is being rewritten. */
static int read_schedule(const struct vgpu_dev_limit *l, struct vgpu_schedule *sc)
{
    uint64_t g1 = __atomic_load_n(&l->turn_gen, __ATOMIC_ACQUIRE);
    if (g1 & 1)
        return 0;
    sc->gen = g1;
    sc->epoch_ns = __atomic_load_n(&l->epoch_ns, __ATOMIC_RELAXED);
    sc->cycle_ns = __atomic_load_n(&l->cycle_ns, __ATOMIC_RELAXED);
    sc->start_ns = __atomic_load_n(&l->turn_start_ns, __ATOMIC_RELAXED);
    sc->len_ns = __atomic_load_n(&l->turn_len_ns, __ATOMIC_RELAXED);
    sc->credit_ns = __atomic_load_n(&l->turn_credit_ns, __ATOMIC_RELAXED);
    sc->borrow_ns = __atomic_load_n(&l->borrow_ns, __ATOMIC_RELAXED);
    sc->borrow = __atomic_load_n(&l->borrow, __ATOMIC_RELAXED);
    sc->prev_signal_id = __atomic_load_n(&l->prev_signal_id, __ATOMIC_RELAXED);
    sc->prev_dev = __atomic_load_n(&l->prev_dev, __ATOMIC_RELAXED);
    sc->prev = sc->prev_signal_id >= 0;
    uint32_t n = sc->borrow ? __atomic_load_n(&l->nopen, __ATOMIC_RELAXED) : 0;
    sc->nopen = n > VGPU_MAX_OPEN ? VGPU_MAX_OPEN : n;
    for (uint32_t i = 0; i < sc->nopen; i++) {
        sc->open[i].start_ns = __atomic_load_n(&l->open[i].start_ns, __ATOMIC_RELAXED);
        sc->open[i].len_ns = __atomic_load_n(&l->open[i].len_ns, __ATOMIC_RELAXED);
        sc->open[i].prev_signal_id =
            __atomic_load_n(&l->open[i].prev_signal_id, __ATOMIC_RELAXED);
        sc->open[i].prev_dev = __atomic_load_n(&l->open[i].prev_dev, __ATOMIC_RELAXED);
    }
    __atomic_thread_fence(__ATOMIC_ACQUIRE);
    return __atomic_load_n(&l->turn_gen, __ATOMIC_RELAXED) == g1;
}

/* Each device's schedule as last read, kept until the daemon writes a new
 * one (its turn_gen moves): a launch reads one word of it, not the whole.
 * Guarded by the flight lock. */
static struct vgpu_schedule g_sched[VGPU_MAX_DEVICES];

static const struct vgpu_schedule *schedule_of(int d, const struct vgpu_dev_limit *l)
{
    struct vgpu_schedule *sc = &g_sched[d];
    uint64_t gen = __atomic_load_n(&l->turn_gen, __ATOMIC_ACQUIRE);
    if (gen != 0 && sc->gen == gen)
        return sc;
    if (!read_schedule(l, sc)) {
        sc->gen = 0;
        return NULL;
    }
    return sc;
}

/* Other jobs' signals (the turn before this one's, and those before the
 * open spans), attached read-only when the daemon made them (state.c) and
 * kept while the limits name them: a few, the least recently used detached
 * when a new one is needed. Guarded by the flight lock. */
#define MAX_SIGNALS 24
static struct {
    int32_t id;             /* -1: free */
    const struct vgpu_signal *sig;   /* NULL: it would not attach */
    uint64_t used;
} g_sigs[MAX_SIGNALS] = {[0 ... MAX_SIGNALS - 1] = {.id = -1}};
static uint64_t g_sig_tick;

/* Until when a job says its work on its device dev runs or its turn there
 * lasts (turn_only: its turn, with the work it launched in it), whichever is
 * later; 0: unknown. */
static uint64_t busy_until(int32_t id, uint32_t dev, int turn_only)
{
    if (id < 0 || dev >= VGPU_MAX_DEVICES)
        return 0;
    int at = -1, victim = 0;
    for (int i = 0; i < MAX_SIGNALS; i++) {
        if (g_sigs[i].id == id) {
            at = i;
            break;
        }
        if (g_sigs[i].id < 0 || (g_sigs[victim].id >= 0 && g_sigs[i].used < g_sigs[victim].used))
            victim = i;
    }
    if (at < 0) {
        at = victim;
        if (g_sigs[at].sig != NULL)
            shmdt(g_sigs[at].sig);
        g_sigs[at].sig = vgpu_attach_signal(id);
        g_sigs[at].id = id;
    }
    g_sigs[at].used = ++g_sig_tick;
    const struct vgpu_signal *sig = g_sigs[at].sig;
    if (sig == NULL)
        return 0;
    uint64_t busy = turn_only ? 0 : __atomic_load_n(&sig->dev[dev].busy_until_ns,
                                                    __ATOMIC_RELAXED);
    uint64_t end = __atomic_load_n(&sig->dev[dev].turn_end_ns, __ATOMIC_RELAXED);
    return busy > end ? busy : end;
}

void vgpu_turns_atfork_child(void)
{
    for (int i = 0; i < MAX_SIGNALS; i++) {
        g_sigs[i].id = -1;         /* the attachments are inherited: kept */
        g_sigs[i].sig = NULL;
    }
}

static void nap(uint64_t ns)
{
    if (ns > MAX_NAP_NS)
        ns = MAX_NAP_NS;
    if (ns < MIN_NAP_NS)
        ns = MIN_NAP_NS;
    struct timespec ts = {.tv_sec = 0, .tv_nsec = (long)ns};
    nanosleep(&ts, NULL);
}

int vgpu_turn_gate(struct vgpu_launch *ln)
{
    int d = ln->d;
    const struct vgpu_dev_limit *l = &vgpu_g_limits->dev[d];
    for (int tries = 0;; tries++) {
        uint32_t gate = __atomic_load_n(&l->throttle, __ATOMIC_RELAXED);
        if (gate == VGPU_GATE_CLOSED)
            return VGPU_GO_CLOSED;
        if (gate != VGPU_GATE_TURNS)
            return VGPU_GO_OWN;   /* lifted while we waited */
        vgpu_flight_lock();     /* the schedules' and the signals' caches too */
        const struct vgpu_schedule *sc = schedule_of(d, l);
        if (sc == NULL) {
            vgpu_flight_unlock();
            nap(MIN_NAP_NS);
            continue;
        }
        uint64_t now = tries == 0 ? ln->now : vgpu_now_ns();
        ln->now = now;
        int o = vgpu_turn_open_at(sc, now);
        struct vgpu_flight_view v;
        uint64_t before = sc->prev ? busy_until(sc->prev_signal_id, sc->prev_dev, 0) : 0;
        /* (borrowers in the span share it, each with a little in flight: one
         * waits for the turn before the span, not for another's borrowing) */
        uint64_t open_before =
            o >= 0 ? busy_until(sc->open[o].prev_signal_id, sc->open[o].prev_dev, 1) : 0;
        if (!vgpu_flight_poll(d, now, ln->kind, &v)) {
            vgpu_flight_unlock();
            return VGPU_GO_OWN;
        }
        struct vgpu_verdict vd =
            vgpu_turn_decide(sc, v.turn, now, v.n, v.cost_ns, v.pending_ns, before,
                             open_before);
        CUevent head = v.head;
        vgpu_flight_tell_end(d, vd.turn_end_ns);
        int go = vd.action == VGPU_TURN_GO_OWN        ? VGPU_GO_OWN
                 : vd.action == VGPU_TURN_GO_BORROWED ? VGPU_GO_BORROWED
                                                      : 0;
        if (go)
            vgpu_flight_begin_locked(ln, v.n);
        vgpu_flight_unlock();
        if (go)
            return go;
        switch (vd.action) {
        case VGPU_TURN_WAIT_HEAD:
            if (head != NULL) {
                vgpu_flight_wait(head, d, now);
                break;
            }
            /* fall through */
        default:
            nap(vd.nap_ns);
            __atomic_fetch_add(&vgpu_g_usage->dev[d].throttled_ns, vgpu_now_ns() - now,
                               __ATOMIC_RELAXED);
            break;
        }
    }
}
