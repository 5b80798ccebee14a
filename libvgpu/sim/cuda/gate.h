/*
 * gate.h - the process's CUDA API gate (gate.c): what a lock taken through
 * the driver's checkpoint API closes. The lowest layer of cuda/, with
 * handle.h and init.h: every layer above brackets what changes device state
 * (allocations, frees, launches, copies, synchronisation) with
 * gate_enter/gate_leave, and an entry point's first check (cu_current,
 * cu_check_device) holds at a closed gate. checkpoint.c closes and opens it.
 */
#ifndef VGPU_SIM_CUDA_GATE_H
#define VGPU_SIM_CUDA_GATE_H

#include <stdint.h>

/* A bracket: waits while the gate is closed, then counts as in flight
 * until gate_leave. Nested brackets of one thread count once and never
 * wait (the outer one is already in flight). */
void gate_enter(void);
void gate_leave(void);
static inline void gate_leave_at_exit(int *unused)
{
    (void)unused;
    gate_leave();
}
/* The rest of the enclosing block is a bracket. */
#define GATE_BRACKET                                                          \
    __attribute__((cleanup(gate_leave_at_exit))) int gate_bracket_ = (gate_enter(), 1); \
    (void)gate_bracket_

/* An entry point's start: waits while the gate is closed (outside any
 * bracket of this thread). */
void gate_hold(void);

/* The driver's own threads (the restore thread) pass the gate. */
void gate_exempt(void);
/* Close the gate: later brackets and holds wait. */
void gate_close(void);
/* Open it: whoever waits goes on. */
void gate_open(void);
/* Brackets in flight (of threads not exempt). */
int gate_in_flight(void);

/* The restore thread: checkpoint.c names the function it runs (a
 * constructor), cuInit starts it, once per process. */
void gate_set_restore_thread(void *(*fn)(void *));
void gate_start_restore_thread(void);

#endif /* VGPU_SIM_CUDA_GATE_H */
