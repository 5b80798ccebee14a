/*
 * stream.h - streams and events (stream.c). Above context.h, exec.h and
 * ipc_event.h.
 */
#ifndef VGPU_SIM_CUDA_STREAM_H
#define VGPU_SIM_CUDA_STREAM_H

#include "handle.h"

/* Resolve a stream handle (0, CU_STREAM_LEGACY, CU_STREAM_PER_THREAD or a
 * stream) against the current context; *stream is NULL for a default
 * stream. */
CUresult cu_stream_resolve(CUstream h, CUcontext *ctx, CUstream *stream);
/* Start of an entry point on the stream h: return cu_stream_resolve()'s
 * error, else declare `ctx` and `s`, its context and stream. */
#define RESOLVE_STREAM(h, ctx, s)                   \
    CUcontext ctx;                                  \
    CUstream s;                                     \
    CUresult rc_ = cu_stream_resolve(h, &ctx, &s);  \
    if (rc_)                                        \
        return rc_
/* The same for a query of the stream's capture status: using the legacy
 * stream during a blocking stream's capture is refused
 * (CUDA_ERROR_STREAM_CAPTURE_IMPLICIT) but does not invalidate the capture,
 * as any other use of it does. */
CUresult cu_stream_resolve_query(CUstream h, CUcontext *ctx, CUstream *stream);

/* Entry points graphs replay (an event record or wait node). */
CUresult cuEventRecord(CUevent e, CUstream h);
CUresult cuStreamWaitEvent(CUstream h, CUevent e, unsigned int flags);

/* Capture sequences (handle.h's struct capture); all but cu_capture_status
 * need cu_capture_lock. */
void cu_capture_invalidate(struct capture *c);
/* Set (or, with add, add to) the nodes the stream's next captured node
 * depends on. */
CUresult cu_capture_set_deps(CUstream s, const CUgraphNode *deps, size_t n, int add);
CUresult cu_capture_join(CUstream s, struct capture *c);
void cu_capture_leave(CUstream s);
/* CU_STREAM_CAPTURE_STATUS_* of a stream (NULL: a default stream). */
int cu_capture_status(CUstream s);

#endif /* VGPU_SIM_CUDA_STREAM_H */
