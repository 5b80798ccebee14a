/*
 * stream.c - streams and events: what a program queues work on and waits
 * for. Every stream of the process feeds the one queue of exec.c, so a
 * stream's last sequence number is all it needs to know. The page behind an
 * interprocess event is ipc_event.c's.
 *
 * Stream capture's bookkeeping is here too (capture.c records the nodes): a
 * capture sequence begun on one stream, which another stream joins by
 * waiting on an event recorded in it (a fork; waiting back on an event of
 * the joined stream is the join), and what the driver refuses while a
 * stream captures, as NVIDIA's programming guide lists it: synchronising or
 * querying a capturing stream (CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED), or an
 * event recorded in one (CUDA_ERROR_CAPTURED_EVENT), or its context; waiting
 * on an event recorded outside the capture (CUDA_ERROR_STREAM_CAPTURE_ISOLATION)
 * or in another capture (CUDA_ERROR_STREAM_CAPTURE_MERGE); using the legacy
 * default stream while a stream that synchronises with it captures
 * (CUDA_ERROR_STREAM_CAPTURE_IMPLICIT). Such an operation invalidates the
 * sequence: its streams' further work fails with
 * CUDA_ERROR_STREAM_CAPTURE_INVALIDATED until cuStreamEndCapture, which
 * ends it with that error and no graph.
 */
#define _GNU_SOURCE
#include <stdlib.h>
#include <string.h>

#include "alloctab.h"
#include "context.h"
#include "exec.h"
#include "init.h"
#include "ipc_event.h"
#include "stream.h"

static unsigned long long g_stream_ids = 1;

/* ---- capture sequences ---- */

/* A capture of ctx with a member that synchronises with the legacy stream
 * (created without CU_STREAM_NON_BLOCKING). Needs cu_capture_lock. */
static struct capture *blocking_capture(CUcontext ctx)
{
    for (struct capture *c = cu_captures; c; c = c->next)
        if (c->ctx == ctx && c->blocking > 0)
            return c;
    return NULL;
}

void cu_capture_invalidate(struct capture *c)
{
    if (c)
        c->invalidated = 1;
}

CUresult cu_capture_set_deps(CUstream s, const CUgraphNode *deps, size_t n, int add)
{
    size_t base = add ? s->ndeps : 0;
    if (base + n > s->deps_cap) {
        size_t cap = (base + n) * 2 + 4;
        CUgraphNode *t = realloc(s->deps, cap * sizeof *t);
        if (!t)
            return CUDA_ERROR_OUT_OF_MEMORY;
        s->deps = t;
        s->deps_cap = cap;
    }
    size_t k = base;
    for (size_t i = 0; i < n; i++) {
        size_t j = 0;
        while (j < k && s->deps[j] != deps[i])
            j++;
        if (j == k) /* each node once */
            s->deps[k++] = deps[i];
    }
    s->ndeps = k;
    return CUDA_SUCCESS;
}

CUresult cu_capture_join(CUstream s, struct capture *c)
{
    if (c->members == c->streams_cap) {
        int cap = c->streams_cap ? 2 * c->streams_cap : 4;
        CUstream *t = realloc(c->streams, (size_t)cap * sizeof *t);
        if (!t)
            return CUDA_ERROR_OUT_OF_MEMORY;
        c->streams = t;
        c->streams_cap = cap;
    }
    c->streams[c->members++] = s;
    __atomic_store_n(&s->capture, c, __ATOMIC_RELEASE);
    s->ndeps = 0;
    if (!(s->flags & CU_STREAM_NON_BLOCKING))
        c->blocking++;
    return CUDA_SUCCESS;
}

void cu_capture_leave(CUstream s)
{
    struct capture *c = s->capture;
    if (!c)
        return;
    __atomic_store_n(&s->capture, NULL, __ATOMIC_RELEASE);
    s->ndeps = 0;
    for (int i = 0; i < c->members; i++) {
        if (c->streams[i] == s) {
            c->streams[i] = c->streams[--c->members];
            break;
        }
    }
    if (!(s->flags & CU_STREAM_NON_BLOCKING))
        c->blocking--;
}

/* ---- streams ---- */

/* The legacy default stream (NULL, CU_STREAM_LEGACY) may not be used while
 * a stream that synchronises with it captures; `strict` invalidates that
 * capture, as any use but asking whether the legacy stream captures does. */
static CUresult legacy_use(CUstream h, CUcontext ctx, int strict)
{
    if (h != NULL && h != CU_STREAM_LEGACY)
        return CUDA_SUCCESS;
    if (!__atomic_load_n(&cu_captures, __ATOMIC_ACQUIRE))
        return CUDA_SUCCESS;
    pthread_mutex_lock(&cu_capture_lock);
    struct capture *c = blocking_capture(ctx);
    if (c && strict)
        cu_capture_invalidate(c);
    pthread_mutex_unlock(&cu_capture_lock);
    return c ? CUDA_ERROR_STREAM_CAPTURE_IMPLICIT : CUDA_SUCCESS;
}

static CUresult resolve(CUstream h, CUcontext *ctx, CUstream *stream, int strict)
{
    if (h == NULL || h == CU_STREAM_LEGACY || h == CU_STREAM_PER_THREAD) {
        *stream = NULL;
        CUresult rc = cu_current(ctx);
        return rc ? rc : legacy_use(h, *ctx, strict);
    }
    if (!cu_initialized)
        return CUDA_ERROR_NOT_INITIALIZED;
    CHECK_HANDLE(h, MAGIC_STREAM);
    if (!cu_ctx_valid(h->ctx))
        return CUDA_ERROR_CONTEXT_IS_DESTROYED;
    *ctx = h->ctx;
    *stream = h;
    return CUDA_SUCCESS;
}

CUresult cu_stream_resolve(CUstream h, CUcontext *ctx, CUstream *stream)
{
    return resolve(h, ctx, stream, 1);
}

CUresult cu_stream_resolve_query(CUstream h, CUcontext *ctx, CUstream *stream)
{
    return resolve(h, ctx, stream, 0);
}

/* A capturing stream may not be synchronised or queried: that invalidates
 * its capture. */
static CUresult refuse_if_capturing(CUstream s)
{
    if (!s || !__atomic_load_n(&s->capture, __ATOMIC_ACQUIRE))
        return CUDA_SUCCESS;
    pthread_mutex_lock(&cu_capture_lock);
    struct capture *c = s->capture;
    cu_capture_invalidate(c);
    pthread_mutex_unlock(&cu_capture_lock);
    return c ? CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED : CUDA_SUCCESS;
}

/* The last operation queued on a stream (the default stream: its context). */
static uint64_t stream_seq(CUcontext ctx, CUstream s)
{
    return exec_read(s ? &s->last_seq : &ctx->last_seq);
}

VGPU_EXPORT CUresult cuStreamCreateWithPriority(CUstream *ps, unsigned int flags, int priority)
{
    CURRENT_CONTEXT(ctx);
    if (!ps || (flags & ~CU_STREAM_NON_BLOCKING))
        return CUDA_ERROR_INVALID_VALUE;
    struct CUstream_st *s = cu_obj_new(sizeof *s, MAGIC_STREAM);
    if (!s)
        return CUDA_ERROR_OUT_OF_MEMORY;
    s->ctx = ctx;
    s->flags = flags;
    s->priority = priority > 0 ? 0 : (priority < -5 ? -5 : priority);
    s->id = __atomic_fetch_add(&g_stream_ids, 1, __ATOMIC_RELAXED);
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
    CHECK_HANDLE(h, MAGIC_STREAM);
    /* Work already queued still runs; the handle goes now. */
    pthread_mutex_lock(&cu_capture_lock);
    if (h->capture) {
        cu_capture_invalidate(h->capture);
        if (h->capture->origin == h)
            h->capture->origin = NULL;
        cu_capture_leave(h);
    }
    free(h->deps);
    pthread_mutex_unlock(&cu_capture_lock);
    free(h->attrs);
    cu_obj_del(h, sizeof *h);
    return CUDA_SUCCESS;
}
VGPU_ALIAS(cuStreamDestroy_v2, cuStreamDestroy)

VGPU_EXPORT CUresult cuStreamQuery(CUstream h)
{
    CUcontext ctx;
    CUstream s;
    CUresult rc = cu_stream_resolve(h, &ctx, &s);
    if (!rc)
        rc = refuse_if_capturing(s);
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
    if (!rc)
        rc = refuse_if_capturing(s);
    if (rc)
        return rc;
    exec_wait(stream_seq(ctx, s));
    if (cu_on_sync)
        cu_on_sync();
    return CUDA_SUCCESS;
}
VGPU_ALIAS(cuStreamSynchronize, cuStreamSynchronize_ptsz)

VGPU_EXPORT CUresult cuStreamWaitEvent(CUstream h, CUevent e, unsigned int flags)
{
    RESOLVE_STREAM(h, ctx, s);
    CUresult rc = CUDA_SUCCESS;
    CHECK_HANDLE(e, MAGIC_EVENT);
    if (flags & ~1u)
        return CUDA_ERROR_INVALID_VALUE;
    if (e->ipc && !e->capture && !(s && s->capture)) {
        /* another process's work: the queue waits for it */
        return cu_ipc_event_queue_wait(ctx, s, e->ipc);
    }
    if (!s && !e->capture)
        return CUDA_SUCCESS; /* one in-order queue: the event's work is ahead */
    pthread_mutex_lock(&cu_capture_lock);
    struct capture *ec = e->capture, *sc = s ? s->capture : NULL;
    if (ec && !cu_ctx_valid(ec->ctx))
        ec = NULL;
    if (ec && !s) {
        rc = CUDA_ERROR_STREAM_CAPTURE_IMPLICIT; /* the legacy stream joins nothing */
        cu_capture_invalidate(ec);
    } else if (ec && sc && sc != ec) {
        rc = CUDA_ERROR_STREAM_CAPTURE_MERGE;
        cu_capture_invalidate(sc);
        cu_capture_invalidate(ec);
    } else if (ec && (ec->invalidated || (sc && sc->invalidated))) {
        rc = CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
    } else if (ec) {
        /* a fork (s joins the capture) or a join: s now depends on what the
         * event stood for */
        rc = sc ? CUDA_SUCCESS : cu_capture_join(s, ec);
        if (rc == CUDA_SUCCESS)
            rc = cu_capture_set_deps(s, e->cap_deps, e->cap_ndeps, sc != NULL);
    } else if (sc && !(flags & 1u) /* CU_EVENT_WAIT_EXTERNAL */) {
        /* work outside the capture can't be a dependency of the graph */
        rc = CUDA_ERROR_STREAM_CAPTURE_ISOLATION;
        cu_capture_invalidate(sc);
    }
    pthread_mutex_unlock(&cu_capture_lock);
    return rc;
}
VGPU_ALIAS(cuStreamWaitEvent, cuStreamWaitEvent_ptsz)

/* A stream getter and its _ptsz form: resolve the stream h (s is NULL for a
 * context's default stream), refuse a NULL out-pointer, store `value`. */
#define STREAM_GETTER(name, type, value)                                       \
    VGPU_EXPORT CUresult name(CUstream h, type *out)                           \
    {                                                                          \
        RESOLVE_STREAM(h, ctx, s);                                             \
        ANSWER(out, value);                                                    \
    }                                                                          \
    VGPU_ALIAS(name, name##_ptsz)

STREAM_GETTER(cuStreamGetPriority, int, s ? s->priority : 0)
STREAM_GETTER(cuStreamGetFlags, unsigned int, s ? s->flags : 0)
STREAM_GETTER(cuStreamGetCtx, CUcontext, ctx)
STREAM_GETTER(cuStreamGetId, unsigned long long, s ? s->id : 0)
/* CU_STREAM_CAPTURE_STATUS_ACTIVE (1) while a graph is recorded, INVALIDATED
 * (2) once its capture was invalidated, else NONE (0). */
int cu_capture_status(CUstream s)
{
    if (!s)
        return 0;
    pthread_mutex_lock(&cu_capture_lock);
    int st = !s->capture ? 0 : s->capture->invalidated ? 2 : 1;
    pthread_mutex_unlock(&cu_capture_lock);
    return st;
}

/* Asking whether the legacy stream captures is refused
 * (CUDA_ERROR_STREAM_CAPTURE_IMPLICIT) without harm to the capture. */
VGPU_EXPORT CUresult cuStreamIsCapturing(CUstream h, int *out)
{
    CUcontext ctx;
    CUstream s;
    CUresult rc = resolve(h, &ctx, &s, 0);
    if (rc)
        return rc;
    ANSWER(out, cu_capture_status(s));
}
VGPU_ALIAS(cuStreamIsCapturing, cuStreamIsCapturing_ptsz)

/* ---- stream attributes ----
 * The launch attributes that apply to a stream (CUlaunchAttributeID, each
 * value a 64-byte union): the L2 access policy window, the synchronisation
 * policy, the priority and the memory synchronisation domain. They are
 * kept and read back; nothing here acts on them but the priority. */

enum { ATTR_ACCESS_POLICY_WINDOW = 1, ATTR_SYNC_POLICY = 3, ATTR_PRIORITY = 8,
       ATTR_MEM_SYNC_DOMAIN_MAP = 9, ATTR_MEM_SYNC_DOMAIN = 10, ATTR_MAX = 16 };

static unsigned char g_default_attrs[ATTR_MAX][64]; /* the default streams' */
static pthread_mutex_t g_attr_lock = PTHREAD_MUTEX_INITIALIZER;

static int stream_attr(int id)
{
    return id == ATTR_ACCESS_POLICY_WINDOW || id == ATTR_SYNC_POLICY || id == ATTR_PRIORITY ||
           id == ATTR_MEM_SYNC_DOMAIN_MAP || id == ATTR_MEM_SYNC_DOMAIN;
}

/* The stream's table (NULL: the default streams'), made on first use. */
static unsigned char (*attr_table(CUstream s))[64]
{
    if (!s)
        return g_default_attrs;
    if (!s->attrs)
        s->attrs = calloc(ATTR_MAX, 64);
    return s->attrs;
}

static void attr_read(CUstream s, int id, void *out)
{
    unsigned char (*t)[64] = attr_table(s);
    memset(out, 0, 64);
    if (t)
        memcpy(out, t[id], 64);
    if (id == ATTR_SYNC_POLICY && (!t || !*(int *)t[id]))
        *(int *)out = 1; /* CU_SYNC_POLICY_AUTO */
    if (id == ATTR_PRIORITY)
        *(int *)out = s ? s->priority : 0;
}

VGPU_EXPORT CUresult cuStreamGetAttribute(CUstream h, int id, void *value)
{
    RESOLVE_STREAM(h, ctx, s);
    if (!value || !stream_attr(id))
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&g_attr_lock);
    attr_read(s, id, value);
    pthread_mutex_unlock(&g_attr_lock);
    return CUDA_SUCCESS;
}
VGPU_ALIAS(cuStreamGetAttribute, cuStreamGetAttribute_ptsz)

VGPU_EXPORT CUresult cuStreamSetAttribute(CUstream h, int id, const void *value)
{
    RESOLVE_STREAM(h, ctx, s);
    if (!value || !stream_attr(id))
        return CUDA_ERROR_INVALID_VALUE;
    if (id == ATTR_SYNC_POLICY && (*(const int *)value < 1 || *(const int *)value > 4))
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&g_attr_lock);
    unsigned char (*t)[64] = attr_table(s);
    if (t)
        memcpy(t[id], value, 64);
    if (id == ATTR_PRIORITY && s) {
        int p = *(const int *)value;
        s->priority = p > 0 ? 0 : (p < -5 ? -5 : p);
    }
    pthread_mutex_unlock(&g_attr_lock);
    return t ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
}
VGPU_ALIAS(cuStreamSetAttribute, cuStreamSetAttribute_ptsz)

VGPU_EXPORT CUresult cuStreamCopyAttributes(CUstream dst, CUstream src)
{
    CUcontext dctx, sctx;
    CUstream d, s;
    CUresult rc = cu_stream_resolve(dst, &dctx, &d);
    if (!rc)
        rc = cu_stream_resolve(src, &sctx, &s);
    if (rc)
        return rc;
    unsigned char v[64];
    for (int id = 1; id < ATTR_MAX && rc == CUDA_SUCCESS; id++) {
        if (!stream_attr(id))
            continue;
        pthread_mutex_lock(&g_attr_lock);
        attr_read(s, id, v);
        pthread_mutex_unlock(&g_attr_lock);
        rc = cuStreamSetAttribute(dst, id, v);
    }
    return rc;
}
VGPU_ALIAS(cuStreamCopyAttributes, cuStreamCopyAttributes_ptsz)

VGPU_EXPORT CUresult cuStreamGetDevice(CUstream h, CUdevice *dev)
{
    RESOLVE_STREAM(h, ctx, s);
    ANSWER(dev, ctx->ordinal);
}
VGPU_ALIAS(cuStreamGetDevice, cuStreamGetDevice_ptsz)

/* Managed memory is one mapping, visible to every stream and the host:
 * attaching it to a stream changes nothing. */
VGPU_EXPORT CUresult cuStreamAttachMemAsync(CUstream h, CUdeviceptr ptr, size_t len,
                                            unsigned int flags)
{
    RESOLVE_STREAM(h, ctx, s);
    struct alloc a;
    if (!mem_find(ptr, len ? len : 1, &a) || a.kind != ALLOC_MANAGED)
        return CUDA_ERROR_INVALID_VALUE;
    if (flags != CU_MEM_ATTACH_GLOBAL && flags != CU_MEM_ATTACH_HOST &&
        flags != CU_MEM_ATTACH_SINGLE)
        return CUDA_ERROR_INVALID_VALUE;
    if (flags == CU_MEM_ATTACH_SINGLE && !s)
        return CUDA_ERROR_INVALID_VALUE;
    return CUDA_SUCCESS;
}
VGPU_ALIAS(cuStreamAttachMemAsync, cuStreamAttachMemAsync_ptsz)

/* ---- events ---- */

/* Last recorded in a capture still going on: it stands for graph nodes, not
 * for work, and can't be waited for or queried. */
static int captured_event(CUevent e)
{
    if (!__atomic_load_n(&e->capture, __ATOMIC_ACQUIRE))
        return 0;
    pthread_mutex_lock(&cu_capture_lock);
    int in = 0;
    for (struct capture *c = cu_captures; c && !in; c = c->next)
        in = c == e->capture && c->id == e->capture_id;
    pthread_mutex_unlock(&cu_capture_lock);
    return in;
}

VGPU_EXPORT CUresult cuEventCreate(CUevent *pe, unsigned int flags)
{
    CURRENT_CONTEXT(ctx);
    if (!pe || (flags & ~0xfu))
        return CUDA_ERROR_INVALID_VALUE;
    /* an interprocess event is one without timing, as the driver requires */
    if ((flags & CU_EVENT_INTERPROCESS) && !(flags & CU_EVENT_DISABLE_TIMING))
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
    CHECK_HANDLE(e, MAGIC_EVENT);
    pthread_mutex_lock(&cu_capture_lock);
    free(e->cap_deps);
    e->cap_deps = NULL;
    e->capture = NULL;
    pthread_mutex_unlock(&cu_capture_lock);
    cu_ipc_event_put(e->ipc);
    exec_event_del(e);
    return CUDA_SUCCESS;
}
VGPU_ALIAS(cuEventDestroy_v2, cuEventDestroy)

VGPU_EXPORT CUresult cuEventRecord(CUevent e, CUstream h)
{
    RESOLVE_STREAM(h, ctx, s);
    CUresult rc = CUDA_SUCCESS;
    CHECK_HANDLE(e, MAGIC_EVENT);
    if (s && __atomic_load_n(&s->capture, __ATOMIC_ACQUIRE)) {
        /* in a capture the event stands for the stream's nodes so far, for
         * other streams to fork from or join */
        pthread_mutex_lock(&cu_capture_lock);
        struct capture *c = s->capture;
        if (c && c->invalidated) {
            rc = CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
        } else if (c) {
            CUgraphNode *d = s->ndeps ? malloc(s->ndeps * sizeof *d) : NULL;
            if (s->ndeps && !d) {
                rc = CUDA_ERROR_OUT_OF_MEMORY;
            } else {
                if (s->ndeps)
                    memcpy(d, s->deps, s->ndeps * sizeof *d);
                free(e->cap_deps);
                e->cap_deps = d;
                e->cap_ndeps = s->ndeps;
                e->capture = c;
                e->capture_id = c->id;
            }
        }
        pthread_mutex_unlock(&cu_capture_lock);
        if (c)
            return rc;
    }
    pthread_mutex_lock(&cu_capture_lock);
    e->capture = NULL;
    pthread_mutex_unlock(&cu_capture_lock);
    e->recorded = 1;
    exec_event(ctx, s, e);
    if (e->ipc)
        return cu_ipc_event_record(ctx, s, e->ipc);
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
    CHECK_HANDLE(e, MAGIC_EVENT);
    if (captured_event(e))
        return CUDA_ERROR_CAPTURED_EVENT;
    if (e->ipc)
        return cu_ipc_event_done(e->ipc, cu_ipc_event_recorded(e->ipc)) ? CUDA_SUCCESS
                                                                        : CUDA_ERROR_NOT_READY;
    if (!e->recorded)
        return CUDA_SUCCESS;
    return exec_done(exec_read(&e->seq)) ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY;
}

VGPU_EXPORT CUresult cuEventSynchronize(CUevent e)
{
    if (!cu_initialized)
        return CUDA_ERROR_NOT_INITIALIZED;
    CHECK_HANDLE(e, MAGIC_EVENT);
    if (captured_event(e))
        return CUDA_ERROR_CAPTURED_EVENT;
    if (e->ipc)
        cu_ipc_event_wait(e->ipc, cu_ipc_event_recorded(e->ipc));
    else if (e->recorded)
        exec_wait(exec_read(&e->seq));
    if (cu_on_sync)
        cu_on_sync();
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
    if (!exec_done(exec_read(&start->seq)) || !exec_done(exec_read(&end->seq)))
        return CUDA_ERROR_NOT_READY;
    double d = (double)(int64_t)(exec_read(&end->time_ns) - exec_read(&start->time_ns));
    *ms = (float)(d / 1e6);
    return CUDA_SUCCESS;
}
VGPU_ALIAS(cuEventElapsedTime, cuEventElapsedTime_v2)

/* ---- stream memory operations ----
 * A write lands at once (copies do here; see copy.c); a wait is for a value
 * a kernel or another stream would write, and kernels write nothing here, so
 * it is satisfied at once. The address must be in an allocation. */

enum { MEMOP_WAIT_32 = 1, MEMOP_WRITE_32 = 2, MEMOP_FLUSH = 3, MEMOP_WAIT_64 = 4,
       MEMOP_WRITE_64 = 5, MEMOP_BARRIER = 6 };

static CUresult memop(CUstream h, int op, CUdeviceptr addr, uint64_t value)
{
    RESOLVE_STREAM(h, ctx, s);
    if (op == MEMOP_FLUSH || op == MEMOP_BARRIER)
        return CUDA_SUCCESS;
    size_t n = (op == MEMOP_WAIT_64 || op == MEMOP_WRITE_64) ? 8 : 4;
    if (op < MEMOP_WAIT_32 || op > MEMOP_WRITE_64 || addr % n || !mem_find(addr, n, NULL))
        return CUDA_ERROR_INVALID_VALUE;
    if (op == MEMOP_WRITE_32) {
        uint32_t v = (uint32_t)value;
        memcpy((void *)(uintptr_t)addr, &v, 4);
    } else if (op == MEMOP_WRITE_64) {
        memcpy((void *)(uintptr_t)addr, &value, 8);
    }
    return CUDA_SUCCESS;
}

#define STREAM_MEMOP(name, op, type)                                                \
    VGPU_EXPORT CUresult name(CUstream h, CUdeviceptr addr, type value, unsigned int flags) \
    {                                                                               \
        (void)flags;                                                                \
        return memop(h, op, addr, value);                                           \
    }                                                                               \
    VGPU_ALIAS(name, name##_ptsz)                                                  \
    VGPU_ALIAS(name, name##_v2)                                                    \
    VGPU_ALIAS(name, name##_v2_ptsz)

STREAM_MEMOP(cuStreamWriteValue32, MEMOP_WRITE_32, uint32_t)
STREAM_MEMOP(cuStreamWriteValue64, MEMOP_WRITE_64, uint64_t)
STREAM_MEMOP(cuStreamWaitValue32, MEMOP_WAIT_32, uint32_t)
STREAM_MEMOP(cuStreamWaitValue64, MEMOP_WAIT_64, uint64_t)

/* CUstreamBatchMemOpParams: a 48-byte union led by the operation, then the
 * address and the value. */
struct batch_memop {
    uint32_t operation;
    uint32_t pad0;
    CUdeviceptr address;
    uint64_t value;
    uint32_t flags;
    uint32_t pad1;
    uint64_t pad[2];
};

VGPU_EXPORT CUresult cuStreamBatchMemOp(CUstream h, unsigned int count,
                                        const struct batch_memop *ops, unsigned int flags)
{
    if (flags || (count && !ops))
        return CUDA_ERROR_INVALID_VALUE;
    for (unsigned int i = 0; i < count; i++) {
        CUresult rc = memop(h, (int)ops[i].operation, ops[i].address, ops[i].value);
        if (rc)
            return rc;
    }
    return CUDA_SUCCESS;
}
VGPU_ALIAS(cuStreamBatchMemOp, cuStreamBatchMemOp_ptsz)
VGPU_ALIAS(cuStreamBatchMemOp, cuStreamBatchMemOp_v2)
VGPU_ALIAS(cuStreamBatchMemOp, cuStreamBatchMemOp_v2_ptsz)
