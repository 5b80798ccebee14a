/*
 * exec.c - asynchronous execution: one in-order queue per process and
 * the worker thread that drains it. Streams and events (stream.c) feed it.
 *
 * Every stream of the process feeds the one queue in submission order, which
 * keeps each stream's order and makes cross-stream event waits hold
 * trivially. The worker gives each kernel its slot on the device's shared
 * timeline (sim_reserve_kernel) and completes it when the slot ends, so
 * kernels of all processes take turns on the device. Copies and memsets do not
 * wait in the queue: kernels never touch memory here, so doing them at once,
 * in program order, gives the same bytes.
 */
#include <signal.h>
#include <stdlib.h>
#include <sys/prctl.h>
#include <time.h>
#include <unistd.h>

#include "exec.h"
#include "gate.h"
#include "init.h"

#define QUEUE_MAX 1024 /* launches queued before a launch blocks, as the driver's */
#define LEAD_NS 1000000ull /* how far ahead of the device the worker plans */
/* How far back a late worker may place work that was queued in time. */
#define BACKFILL_NS 20000000ull

enum { OP_KERNEL, OP_EVENT, OP_HOST };

struct op {
    struct op *next;
    int kind;
    uint64_t seq;
    int phys;
    uint64_t ns;
    uint64_t queued_at; /* when the host queued it (CLOCK_MONOTONIC) */
    uint64_t done_at; /* when it completes (CLOCK_MONOTONIC), once planned */
    CUevent event;
    void (*fn)(void *);
    void *data;
};

struct fifo {
    struct op *head, *tail;
};

static pthread_mutex_t q_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t q_work; /* CLOCK_MONOTONIC; set up in init_conds */
static pthread_cond_t q_done = PTHREAD_COND_INITIALIZER;
static struct fifo q_queued;  /* launched, not yet planned */
static struct fifo q_planned; /* given their place on the device timeline */
static int q_len;
static uint64_t q_submitted, q_completed;
static uint64_t q_horizon;    /* completion time of the last planned op */
static int q_worker;
static pthread_once_t q_once = PTHREAD_ONCE_INIT;

static void push(struct fifo *f, struct op *op)
{
    op->next = NULL;
    if (f->tail)
        f->tail->next = op;
    else
        f->head = op;
    f->tail = op;
}

static struct op *pop(struct fifo *f)
{
    struct op *op = f->head;
    f->head = op->next;
    if (!f->head)
        f->tail = NULL;
    return op;
}

static void init_conds(void)
{
    pthread_condattr_t a;
    pthread_condattr_init(&a);
    pthread_condattr_setclock(&a, CLOCK_MONOTONIC);
    pthread_cond_init(&q_work, &a);
    pthread_condattr_destroy(&a);
    pthread_cond_init(&q_done, NULL);
}

/* ---- the worker ----
 * Like a GPU's front end, the worker keeps the device fed: it gives the next
 * queued kernel its slot on the shared timeline while the current one still
 * runs (up to LEAD_NS ahead), so kernels run back to back however late the
 * host thread wakes. Ops complete in queue order at their planned times;
 * events are stamped with the time their predecessors completed; a host
 * function runs on this thread when it is reached, and nothing behind it is
 * planned until it has returned. */

static int may_plan(uint64_t now)
{
    if (!q_queued.head)
        return 0;
    if (!q_planned.head)
        return 1;
    return q_planned.tail->kind != OP_HOST && q_horizon <= now + LEAD_NS;
}

static void *worker(void *arg)
{
    (void)arg;
    sigset_t all;
    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, NULL);
    prctl(PR_SET_TIMERSLACK, 1UL, 0, 0, 0); /* wake on time, not 50 us later */
    pthread_mutex_lock(&q_lock);
    for (;;) {
        uint64_t now = sim_now_ns();
        if (may_plan(now)) {
            struct op *op = pop(&q_queued);
            q_len--;
            pthread_cond_broadcast(&q_done); /* room in the queue */
            /* An op is ready once it is queued and the one before it is
             * done, however late this thread wakes (as a GPU starts a queued
             * kernel the moment its predecessor ends); a wake later than
             * BACKFILL_NS counts from then. */
            uint64_t ready = q_horizon > op->queued_at ? q_horizon : op->queued_at;
            if (ready + BACKFILL_NS < now)
                ready = now - BACKFILL_NS;
            if (op->kind == OP_KERNEL) {
                pthread_mutex_unlock(&q_lock);
                uint64_t end = sim_reserve_kernel(op->phys, op->ns, ready);
                pthread_mutex_lock(&q_lock);
                op->done_at = end > ready ? end : ready;
            } else {
                op->done_at = ready;
            }
            q_horizon = op->done_at;
            push(&q_planned, op);
            continue;
        }
        if (q_planned.head && q_planned.head->done_at <= now) {
            struct op *op = pop(&q_planned);
            if (op->kind == OP_HOST) {
                pthread_mutex_unlock(&q_lock);
                op->fn(op->data);
                pthread_mutex_lock(&q_lock);
            } else if (op->kind == OP_EVENT && cu_obj_is(op->event, MAGIC_EVENT) &&
                       op->event->seq == op->seq) {
                op->event->time_ns = op->done_at;
            }
            q_completed = op->seq;
            pthread_cond_broadcast(&q_done);
            free(op);
            continue;
        }
        if (!q_planned.head) {
            pthread_cond_wait(&q_work, &q_lock);
            continue;
        }
        uint64_t wake = q_planned.head->done_at;
        if (q_queued.head && q_planned.tail->kind != OP_HOST && q_horizon - LEAD_NS < wake)
            wake = q_horizon - LEAD_NS;
        struct timespec ts = {.tv_sec = (time_t)(wake / 1000000000ull),
                              .tv_nsec = (long)(wake % 1000000000ull)};
        pthread_cond_timedwait(&q_work, &q_lock, &ts);
    }
    return NULL;
}

/* A forked child has no worker; what its parent had queued is not its own. */
static void atfork_prepare(void) { pthread_mutex_lock(&q_lock); }
static void atfork_parent(void) { pthread_mutex_unlock(&q_lock); }
static void atfork_child(void)
{
    pthread_mutex_init(&q_lock, NULL);
    init_conds();
    q_queued.head = q_queued.tail = q_planned.head = q_planned.tail = NULL;
    q_len = 0;
    q_completed = q_submitted;
    q_worker = 0;
}

static void setup(void)
{
    init_conds();
    pthread_atfork(atfork_prepare, atfork_parent, atfork_child);
}

/* Queue op; returns its sequence number. */
static uint64_t enqueue(CUcontext ctx, CUstream s, struct op *op)
{
    GATE_BRACKET;
    pthread_once(&q_once, setup);
    pthread_mutex_lock(&q_lock);
    if (!q_worker) {
        pthread_t t;
        pthread_attr_t a;
        pthread_attr_init(&a);
        pthread_attr_setdetachstate(&a, PTHREAD_CREATE_DETACHED);
        if (pthread_create(&t, &a, worker, NULL) == 0)
            q_worker = 1;
        pthread_attr_destroy(&a);
    }
    while (q_len >= QUEUE_MAX)
        pthread_cond_wait(&q_done, &q_lock);
    op->seq = ++q_submitted;
    op->queued_at = sim_now_ns();
    push(&q_queued, op);
    q_len++;
    if (s)
        s->last_seq = op->seq;
    if (ctx)
        ctx->last_seq = op->seq;
    if (op->kind == OP_EVENT)
        op->event->seq = op->seq;
    pthread_cond_signal(&q_work);
    pthread_mutex_unlock(&q_lock);
    return op->seq;
}

static struct op *new_op(int kind)
{
    struct op *op = calloc(1, sizeof *op);
    if (!op)
        abort();
    op->kind = kind;
    return op;
}

uint64_t exec_kernel(CUcontext ctx, CUstream s, uint64_t ns)
{
    struct op *op = new_op(OP_KERNEL);
    op->phys = cu_phys[ctx->ordinal];
    op->ns = ns;
    return enqueue(ctx, s, op);
}

uint64_t exec_event(CUcontext ctx, CUstream s, CUevent e)
{
    struct op *op = new_op(OP_EVENT);
    op->event = e;
    return enqueue(ctx, s, op);
}

uint64_t exec_host_fn(CUcontext ctx, CUstream s, void (*fn)(void *), void *data)
{
    struct op *op = new_op(OP_HOST);
    op->fn = fn;
    op->data = data;
    return enqueue(ctx, s, op);
}

int exec_done(uint64_t seq)
{
    pthread_mutex_lock(&q_lock);
    int done = q_completed >= seq;
    pthread_mutex_unlock(&q_lock);
    return done;
}

void exec_wait(uint64_t seq)
{
    GATE_BRACKET;
    pthread_mutex_lock(&q_lock);
    while (q_completed < seq)
        pthread_cond_wait(&q_done, &q_lock);
    pthread_mutex_unlock(&q_lock);
}

uint64_t exec_read(const uint64_t *field)
{
    pthread_mutex_lock(&q_lock);
    uint64_t v = *field;
    pthread_mutex_unlock(&q_lock);
    return v;
}

void exec_sync_ctx(CUcontext ctx)
{
    exec_wait(exec_read(ctx ? &ctx->last_seq : &q_submitted));
}

void exec_event_del(CUevent e)
{
    pthread_mutex_lock(&q_lock); /* the worker may be stamping it */
    cu_obj_del(e, sizeof *e);
    pthread_mutex_unlock(&q_lock);
}

int exec_idle(void)
{
    pthread_mutex_lock(&q_lock);
    int idle = q_completed == q_submitted;
    pthread_mutex_unlock(&q_lock);
    return idle;
}
