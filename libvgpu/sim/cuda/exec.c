/*
 * exec.c - asynchronous execution: one in-order queue per process and
 * the worker thread that drains it. Streams and events (stream.c) feed it.
 *
 * Every stream of the process feeds the one queue in submission order, which
 * keeps each stream's order and makes cross-stream event waits hold
 * trivially. A kernel goes to its device's timeline (sim_submit_kernel) the
 * moment it is queued, unless a host function before it has not run yet
 * (then when that one has returned), as a GPU's front end takes work as soon
 * as it is pushed; the device's scheduler (common/timeline.c) runs the
 * kernels of all processes in time slices. The worker completes the queue's
 * ops in order at the times the timeline gives them. Copies and memsets do
 * not wait in the queue: kernels never touch memory here, so doing them at
 * once, in program order, gives the same bytes.
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

enum { OP_KERNEL, OP_EVENT, OP_HOST };

struct op {
    struct op *next;
    int kind;
    uint64_t seq;
    int phys;
    uint64_t ns;
    uint64_t mark;      /* a kernel on its device's timeline (0: not submitted yet) */
    uint64_t queued_at; /* when the host queued it (CLOCK_MONOTONIC) */
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
static struct fifo q_ops;     /* queued, not yet completed, in order */
static struct op *q_gate;     /* the first host function not yet run: what is behind
                                 it is not submitted */
static int q_len;
static uint64_t q_submitted, q_completed;
static uint64_t q_last_done;  /* when the last completed op completed */
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

/* Submit the kernels from op on, up to the next host function (which then
 * holds the rest back). Needs q_lock. */
static void submit_from(struct op *op)
{
    for (; op; op = op->next) {
        if (op->kind == OP_HOST) {
            q_gate = op;
            return;
        }
        if (op->kind == OP_KERNEL && !op->mark)
            op->mark = sim_submit_kernel(op->phys, op->ns);
    }
    q_gate = NULL;
}

/* ---- the worker ----
 * Completes the ops in queue order: a kernel when its device's timeline has
 * run it (it sleeps until the time the timeline projects, and looks again:
 * other processes' work can only delay it), an event with the op before
 * it (stamped with that time), a host function by running it on this
 * thread; what was held back behind it is then submitted. */

static void complete(struct op *op, uint64_t at)
{
    if (op->kind == OP_EVENT && cu_obj_is(op->event, MAGIC_EVENT) && op->event->seq == op->seq)
        op->event->time_ns = at;
    q_last_done = at;
    q_completed = op->seq;
    pthread_cond_broadcast(&q_done);
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
        struct op *op = q_ops.head;
        if (!op) {
            pthread_cond_wait(&q_work, &q_lock);
            continue;
        }
        uint64_t at;
        if (op->kind == OP_KERNEL) {
            uint64_t mark = op->mark;
            int phys = op->phys;
            pthread_mutex_unlock(&q_lock);
            int done = sim_kernel_done(phys, mark, &at);
            pthread_mutex_lock(&q_lock);
            if (!done) {
                struct timespec ts = {.tv_sec = (time_t)(at / 1000000000ull),
                                      .tv_nsec = (long)(at % 1000000000ull)};
                pthread_cond_timedwait(&q_work, &q_lock, &ts);
                continue;
            }
        } else if (op->kind == OP_HOST) {
            pthread_mutex_unlock(&q_lock);
            op->fn(op->data);
            pthread_mutex_lock(&q_lock);
            at = sim_now_ns();
        } else {
            at = op->queued_at;
        }
        if (at < q_last_done)
            at = q_last_done;     /* in queue order */
        pop(&q_ops);
        q_len--;
        if (op == q_gate)
            submit_from(q_ops.head);
        complete(op, at);
        free(op);
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
    q_ops.head = q_ops.tail = NULL;
    q_gate = NULL;
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
    int was_empty = q_ops.head == NULL;
    push(&q_ops, op);
    q_len++;
    if (!q_gate)
        submit_from(op);
    if (s)
        s->last_seq = op->seq;
    if (ctx)
        ctx->last_seq = op->seq;
    if (op->kind == OP_EVENT)
        op->event->seq = op->seq;
    if (was_empty)   /* the worker waits for an op; a later one can't be sooner */
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
