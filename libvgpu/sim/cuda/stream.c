/*
 * stream.c - streams and events: what a program queues work on and waits
 * for. Every stream of the process feeds the one queue of exec.c, so a
 * stream's last sequence number is all it needs to know.
 */
#include <stdlib.h>
#include <string.h>

#include "alloctab.h"
#include "context.h"
#include "exec.h"
#include "init.h"
#include "stream.h"

static unsigned long long g_stream_ids = 1;

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
    return exec_read(s ? &s->last_seq : &ctx->last_seq);
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
/* CU_STREAM_CAPTURE_STATUS_ACTIVE (1) while a graph is recorded, else NONE */
STREAM_GETTER(cuStreamIsCapturing, int, s && s->capture ? 1 : 0)

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
    exec_event_del(e);
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
    return exec_done(exec_read(&e->seq)) ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY;
}

VGPU_EXPORT CUresult cuEventSynchronize(CUevent e)
{
    if (!cu_initialized)
        return CUDA_ERROR_NOT_INITIALIZED;
    if (!cu_obj_is(e, MAGIC_EVENT))
        return CUDA_ERROR_INVALID_HANDLE;
    if (e->recorded)
        exec_wait(exec_read(&e->seq));
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
    CUcontext ctx;
    CUstream s;
    CUresult rc = cu_stream_resolve(h, &ctx, &s);
    if (rc)
        return rc;
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
