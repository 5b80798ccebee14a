/*
 * exec.h - the process's one in-order queue and the worker that drains it
 * (exec.c). Above handle.h; below contexts and streams, which wait on it.
 */
#ifndef VGPU_SIM_CUDA_EXEC_H
#define VGPU_SIM_CUDA_EXEC_H

#include "handle.h"

/* Queue a kernel of ns, an event record or a host function behind
 * everything queued so far (s NULL: ctx's default stream); each returns the
 * sequence number of what it queued. */
uint64_t exec_kernel(CUcontext ctx, CUstream s, uint64_t ns);
uint64_t exec_event(CUcontext ctx, CUstream s, CUevent e);
uint64_t exec_host_fn(CUcontext ctx, CUstream s, void (*fn)(void *), void *data);
void exec_wait(uint64_t seq);
int exec_done(uint64_t seq);
/* Wait for everything queued in ctx (or in the process when ctx is NULL). */
void exec_sync_ctx(CUcontext ctx);
/* Nothing queued is left to complete. */
int exec_idle(void);
/* Read a field the worker writes (a stream's or event's sequence number, an
 * event's time) under the queue's lock. */
uint64_t exec_read(const uint64_t *field);
/* Delete an event's handle; the worker may be stamping it. */
void exec_event_del(CUevent e);

#endif /* VGPU_SIM_CUDA_EXEC_H */
