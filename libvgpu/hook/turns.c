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
 * A turn begins when the work in flight of the turn before it has run, as
 * that job's signal says (its hook stamps when its work in flight should be
 * done), at most VGPU_TURN_WAIT_MAX_NS late, and ends as much later: the
 * spans a job measures hold no other job's time-slices, and a job that
 * carried a launch past its turn's end pays for it alone. A job that writes
 * a lie into its signal delays the turn after it by that bound at most, and
 * takes nothing of it.
 *
 * Outside its turn a job waits for it; a job that may borrow (soft, or one
 * without a share) launches in the spans no one holds (open[]: the cycle's
 * unpromised part and the turns of jobs the daemon saw idle), keeping at
 * most borrow_ns in flight there, so that a job coming back to its turn
 * waits for little. Borrowed time costs no credit.
 *
 * decide() is the whole rule: pure, driven by tests/c/turns_table.c.
 */
#define _GNU_SOURCE
#include <pthread.h>
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
    sc->prev = __atomic_load_n(&l->prev_signal_id, __ATOMIC_RELAXED) >= 0;
    uint32_t n = __atomic_load_n(&l->nopen, __ATOMIC_RELAXED);
    sc->nopen = n > VGPU_MAX_OPEN ? VGPU_MAX_OPEN : n;
    for (uint32_t i = 0; i < sc->nopen; i++) {
        sc->open[i].start_ns = __atomic_load_n(&l->open[i].start_ns, __ATOMIC_RELAXED);
        sc->open[i].len_ns = __atomic_load_n(&l->open[i].len_ns, __ATOMIC_RELAXED);
    }
    __atomic_thread_fence(__ATOMIC_ACQUIRE);
    return __atomic_load_n(&l->turn_gen, __ATOMIC_RELAXED) == g1;
}

/* The job of the turn before: its signal, attached read-only when the daemon
 * made it (state.c), kept while the limits name it. */
static struct {
    int32_t id;
    uint32_t dev;
    const struct vgpu_signal *sig;
} g_prev[VGPU_MAX_DEVICES];
static pthread_mutex_t prev_lock = PTHREAD_MUTEX_INITIALIZER;

/* Until when the job of the turn before says its work runs; 0: unknown. */
static uint64_t prev_busy(int d, const struct vgpu_dev_limit *l)
{
    int32_t id = __atomic_load_n(&l->prev_signal_id, __ATOMIC_RELAXED);
    uint32_t dev = __atomic_load_n(&l->prev_dev, __ATOMIC_RELAXED);
    if (id < 0 || dev >= VGPU_MAX_DEVICES)
        return 0;
    pthread_mutex_lock(&prev_lock);
    if (g_prev[d].sig == NULL || g_prev[d].id != id) {
        if (g_prev[d].sig != NULL)
            shmdt(g_prev[d].sig);
        g_prev[d].sig = vgpu_attach_signal(id);
        g_prev[d].id = id;
    }
    g_prev[d].dev = dev;
    const struct vgpu_signal *sig = g_prev[d].sig;
    pthread_mutex_unlock(&prev_lock);
    return sig != NULL ? __atomic_load_n(&sig->dev[dev].busy_until_ns, __ATOMIC_RELAXED) : 0;
}

void vgpu_turns_atfork_child(void)
{
    pthread_mutex_init(&prev_lock, NULL);
    for (int d = 0; d < VGPU_MAX_DEVICES; d++)
        g_prev[d].sig = NULL;      /* the attachment is inherited: kept */
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

int vgpu_turn_gate(int d, CUstream s)
{
    const struct vgpu_dev_limit *l = &vgpu_g_limits->dev[d];
    for (;;) {
        uint32_t gate = __atomic_load_n(&l->throttle, __ATOMIC_RELAXED);
        if (gate == VGPU_GATE_CLOSED)
            return VGPU_GO_CLOSED;
        if (gate != VGPU_GATE_TURNS)
            return VGPU_GO_OWN;   /* lifted while we waited */
        struct vgpu_schedule sc;
        if (!read_schedule(l, &sc)) {
            nap(MIN_NAP_NS);
            continue;
        }
        uint64_t before = sc.prev ? prev_busy(d, l) : 0;
        uint64_t now = vgpu_now_ns();
        struct vgpu_flight_view v;
        vgpu_flight_lock();
        if (!vgpu_flight_poll(d, &v)) {
            vgpu_flight_unlock();
            return VGPU_GO_OWN;
        }
        struct vgpu_verdict vd =
            vgpu_turn_decide(&sc, v.turn, now, v.n, v.cost_ns, v.pending_ns, before);
        CUevent head = v.head;
        vgpu_flight_unlock();
        switch (vd.action) {
        case VGPU_TURN_GO_OWN:
            return VGPU_GO_OWN;
        case VGPU_TURN_GO_BORROWED:
            return VGPU_GO_BORROWED;
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
        (void)s;
    }
}
