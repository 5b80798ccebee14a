/*
 * ipc_event.h - the page behind an interprocess event (ipc_event.c), for
 * events (stream.c): its records, their completions, waits on them. Above
 * context.h and exec.h.
 */
#ifndef VGPU_SIM_CUDA_IPC_EVENT_H
#define VGPU_SIM_CUDA_IPC_EVENT_H

#include <stdint.h>

#include "handle.h"

/* Drop a reference to the page (the event's, when it is destroyed). */
void cu_ipc_event_put(struct ipc_event_page *p);
/* Records made on the page, by any process. */
uint64_t cu_ipc_event_recorded(struct ipc_event_page *p);
/* Record `gen` is complete. */
int cu_ipc_event_done(struct ipc_event_page *p, uint64_t gen);
/* Wait until record `gen` is complete, or its recorder is gone. */
void cu_ipc_event_wait(struct ipc_event_page *p, uint64_t gen);
/* A record: counted at once, completed behind the stream's work. */
CUresult cu_ipc_event_record(CUcontext ctx, CUstream s, struct ipc_event_page *p);
/* The stream waits for the page's last record (cuStreamWaitEvent). */
CUresult cu_ipc_event_queue_wait(CUcontext ctx, CUstream s, struct ipc_event_page *p);

#endif /* VGPU_SIM_CUDA_IPC_EVENT_H */
