/*
 * exec.c - asynchronous execution: one in-order queue per process and
 * the worker thread that drains it, streams, events and synchronisation.
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

#include "handle.h"

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
static unsigned long long g_stream_ids = 1;

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
    op->phys = ctx->phys;
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
    pthread_mutex_lock(&q_lock);
    while (q_completed < seq)
        pthread_cond_wait(&q_done, &q_lock);
    pthread_mutex_unlock(&q_lock);
}

static uint64_t read_seq(const uint64_t *p)
{
    pthread_mutex_lock(&q_lock);
    uint64_t v = *p;
    pthread_mutex_unlock(&q_lock);
    return v;
}

void exec_sync_ctx(CUcontext ctx)
{
    exec_wait(read_seq(ctx ? &ctx->last_seq : &q_submitted));
}

/* ---- streams ---- */

CUresult cu_stream_resolve(CUstream h, CUcontext *ctx, CUstream *stream)
{
    if (h == NULL || h == CU_STREAM_LEGACY || h == CU_STREAM_PER_THREAD) {
        *stream = NULL;
        return cu_current(ctx);
    }
    if (!cu_initialized)
        return CUDA_ERROR_NOT_INITIALIZED;
    if (!cu_obj_is(h, MAGIC_STREAM))
        return CUDA_ERROR_INVALID_HANDLE;
    if (!cu_ctx_valid(h->ctx))
        return CUDA_ERROR_CONTEXT_IS_DESTROYED;
    *ctx = h->ctx;
    *stream = h;
    return CUDA_SUCCESS;
}

/* The last operation queued on a stream (the default stream: its context). */
static uint64_t stream_seq(CUcontext ctx, CUstream s)
{
    return read_seq(s ? &s->last_seq : &ctx->last_seq);
}

VGPU_EXPORT CUresult cuStreamCreateWithPriority(CUstream *ps, unsigned int flags, int priority)
{
    CUcontext ctx;
    CUresult rc = cu_current(&ctx);
    if (rc)
        return rc;
    if (!ps || (flags & ~CU_STREAM_NON_BLOCKING))
        return CUDA_ERROR_INVALID_VALUE;
    struct CUstream_st *s = cu_obj_new(sizeof *s, MAGIC_STREAM);
    if (!s)
        return CUDA_ERROR_OUT_OF_MEMORY;
    s->ctx = ctx;
    s->flags = flags;
    s->priority = priority > 0 ? 0 : (priority < -5 ? -5 : priority);
    pthread_mutex_lock(&q_lock);
    s->id = g_stream_ids++;
    pthread_mutex_unlock(&q_lock);
    *ps = s;
    return CUDA_SUCCESS;
}

VGPU_EXPORT CUresult cuStreamCreate(CUstream *ps, unsigned int flags)
{
    return cuStreamCreateWithPriority(ps, flags, 0);
}

VGPU_EXPORT CUresult cuStreamDestroy_v2(CUstream h)
{
    if (!cu_initialized)
        return CUDA_ERROR_NOT_INITIALIZED;
    if (!cu_obj_is(h, MAGIC_STREAM))
        return CUDA_ERROR_INVALID_HANDLE;
    /* Work already queued still runs; the handle goes now. */
    cu_obj_del(h, sizeof *h);
    return CUDA_SUCCESS;
}
VGPU_ALIAS(cuStreamDestroy_v2, cuStreamDestroy)

VGPU_EXPORT CUresult cuStreamQuery(CUstream h)
{
    CUcontext ctx;
    CUstream s;
    CUresult rc = cu_stream_resolve(h, &ctx, &s);
    if (rc)
        return rc;
    return exec_done(stream_seq(ctx, s)) ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY;
}
VGPU_ALIAS(cuStreamQuery, cuStreamQuery_ptsz)

VGPU_EXPORT CUresult cuStreamSynchronize(CUstream h)
{
    CUcontext ctx;
    CUstream s;
    CUresult rc = cu_stream_resolve(h, &ctx, &s);
    if (rc)
        return rc;
    exec_wait(stream_seq(ctx, s));
    return CUDA_SUCCESS;
}
VGPU_ALIAS(cuStreamSynchronize, cuStreamSynchronize_ptsz)

VGPU_EXPORT CUresult cuStreamWaitEvent(CUstream h, CUevent e, unsigned int flags)
{
    CUcontext ctx;
    CUstream s;
    CUresult rc = cu_stream_resolve(h, &ctx, &s);
    if (rc)
        return rc;
    if (!cu_obj_is(e, MAGIC_EVENT))
        return CUDA_ERROR_INVALID_HANDLE;
    if (flags & ~1u)
        return CUDA_ERROR_INVALID_VALUE;
    /* One in-order queue: the event's work is ahead of anything queued now. */
    return CUDA_SUCCESS;
}
VGPU_ALIAS(cuStreamWaitEvent, cuStreamWaitEvent_ptsz)

/* A stream getter and its _ptsz form: resolve the stream h (s is NULL for a
 * context's default stream), refuse a NULL out-pointer, store `value`. */
#define STREAM_GETTER(name, type, value)                                       \
    VGPU_EXPORT CUresult name(CUstream h, type *out)                           \
    {                                                                          \
        CUcontext ctx;                                                         \
        CUstream s;                                                            \
        CUresult rc = cu_stream_resolve(h, &ctx, &s);                          \
        if (rc)                                                                \
            return rc;                                                         \
        if (!out)                                                              \
            return CUDA_ERROR_INVALID_VALUE;                                   \
        *out = (value);                                                        \
        return CUDA_SUCCESS;                                                   \
    }                                                                          \
    VGPU_ALIAS(name, name##_ptsz)

STREAM_GETTER(cuStreamGetPriority, int, s ? s->priority : 0)
STREAM_GETTER(cuStreamGetFlags, unsigned int, s ? s->flags : 0)
STREAM_GETTER(cuStreamGetCtx, CUcontext, ctx)
STREAM_GETTER(cuStreamGetId, unsigned long long, s ? s->id : 0)
/* CU_STREAM_CAPTURE_STATUS_NONE: capture is not simulated */
STREAM_GETTER(cuStreamIsCapturing, int, 0)

VGPU_EXPORT CUresult cuLaunchHostFunc(CUstream h, void (*fn)(void *), void *data)
{
    CUcontext ctx;
    CUstream s;
    CUresult rc = cu_stream_resolve(h, &ctx, &s);
    if (rc)
        return rc;
    if (!fn)
        return CUDA_ERROR_INVALID_VALUE;
    exec_host_fn(ctx, s, fn, data);
    return CUDA_SUCCESS;
}
VGPU_ALIAS(cuLaunchHostFunc, cuLaunchHostFunc_ptsz)

struct callback {
    void (*fn)(CUstream, CUresult, void *);
    CUstream stream;
    void *data;
};

static void run_callback(void *arg)
{
    struct callback *cb = arg;
    cb->fn(cb->stream, CUDA_SUCCESS, cb->data);
    free(cb);
}

VGPU_EXPORT CUresult cuStreamAddCallback(CUstream h, void (*fn)(CUstream, CUresult, void *),
                                         void *data, unsigned int flags)
{
    CUcontext ctx;
    CUstream s;
    CUresult rc = cu_stream_resolve(h, &ctx, &s);
    if (rc)
        return rc;
    if (!fn || flags != 0)
        return CUDA_ERROR_INVALID_VALUE;
    struct callback *cb = malloc(sizeof *cb);
    if (!cb)
        return CUDA_ERROR_OUT_OF_MEMORY;
    *cb = (struct callback){fn, h, data};
    exec_host_fn(ctx, s, run_callback, cb);
    return CUDA_SUCCESS;
}
VGPU_ALIAS(cuStreamAddCallback, cuStreamAddCallback_ptsz)

/* ---- events ---- */

VGPU_EXPORT CUresult cuEventCreate(CUevent *pe, unsigned int flags)
{
    CUcontext ctx;
    CUresult rc = cu_current(&ctx);
    if (rc)
        return rc;
    if (!pe || (flags & ~0xfu))
        return CUDA_ERROR_INVALID_VALUE;
    struct CUevent_st *e = cu_obj_new(sizeof *e, MAGIC_EVENT);
    if (!e)
        return CUDA_ERROR_OUT_OF_MEMORY;
    e->ctx = ctx;
    e->flags = flags;
    *pe = e;
    return CUDA_SUCCESS;
}

VGPU_EXPORT CUresult cuEventDestroy_v2(CUevent e)
{
    if (!cu_initialized)
        return CUDA_ERROR_NOT_INITIALIZED;
    if (!cu_obj_is(e, MAGIC_EVENT))
        return CUDA_ERROR_INVALID_HANDLE;
    pthread_mutex_lock(&q_lock); /* the worker may be stamping it */
    cu_obj_del(e, sizeof *e);
    pthread_mutex_unlock(&q_lock);
    return CUDA_SUCCESS;
}
VGPU_ALIAS(cuEventDestroy_v2, cuEventDestroy)

VGPU_EXPORT CUresult cuEventRecord(CUevent e, CUstream h)
{
    CUcontext ctx;
    CUstream s;
    CUresult rc = cu_stream_resolve(h, &ctx, &s);
    if (rc)
        return rc;
    if (!cu_obj_is(e, MAGIC_EVENT))
        return CUDA_ERROR_INVALID_HANDLE;
    e->recorded = 1;
    exec_event(ctx, s, e);
    return CUDA_SUCCESS;
}
VGPU_ALIAS(cuEventRecord, cuEventRecord_ptsz)

VGPU_EXPORT CUresult cuEventRecordWithFlags(CUevent e, CUstream h, unsigned int flags)
{
    if (flags & ~1u)
        return CUDA_ERROR_INVALID_VALUE;
    return cuEventRecord(e, h);
}
VGPU_ALIAS(cuEventRecordWithFlags, cuEventRecordWithFlags_ptsz)

VGPU_EXPORT CUresult cuEventQuery(CUevent e)
{
    if (!cu_initialized)
        return CUDA_ERROR_NOT_INITIALIZED;
    if (!cu_obj_is(e, MAGIC_EVENT))
        return CUDA_ERROR_INVALID_HANDLE;
    if (!e->recorded)
        return CUDA_SUCCESS;
    return exec_done(read_seq(&e->seq)) ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY;
}

VGPU_EXPORT CUresult cuEventSynchronize(CUevent e)
{
    if (!cu_initialized)
        return CUDA_ERROR_NOT_INITIALIZED;
    if (!cu_obj_is(e, MAGIC_EVENT))
        return CUDA_ERROR_INVALID_HANDLE;
    if (e->recorded)
        exec_wait(read_seq(&e->seq));
    return CUDA_SUCCESS;
}

VGPU_EXPORT CUresult cuEventElapsedTime(float *ms, CUevent start, CUevent end)
{
    if (!cu_initialized)
        return CUDA_ERROR_NOT_INITIALIZED;
    if (!ms)
        return CUDA_ERROR_INVALID_VALUE;
    if (!cu_obj_is(start, MAGIC_EVENT) || !cu_obj_is(end, MAGIC_EVENT))
        return CUDA_ERROR_INVALID_HANDLE;
    if ((start->flags | end->flags) & CU_EVENT_DISABLE_TIMING)
        return CUDA_ERROR_INVALID_HANDLE;
    if (!start->recorded || !end->recorded)
        return CUDA_ERROR_INVALID_HANDLE;
    if (!exec_done(read_seq(&start->seq)) || !exec_done(read_seq(&end->seq)))
        return CUDA_ERROR_NOT_READY;
    pthread_mutex_lock(&q_lock);
    double d = (double)(int64_t)(end->time_ns - start->time_ns);
    pthread_mutex_unlock(&q_lock);
    *ms = (float)(d / 1e6);
    return CUDA_SUCCESS;
}
VGPU_ALIAS(cuEventElapsedTime, cuEventElapsedTime_v2)
