/*
 * slot.h - a process's records in the state (state.c), for the files of
 * common/ that charge to them: account.c (memory) and timeline.c (kernel
 * time). Not for cuda/ or nvml/, which use sim.h.
 */
#ifndef VGPU_SIM_SLOT_H
#define VGPU_SIM_SLOT_H

#include "sim.h"

/* This process's record (its slot, attached on first call); NULL if the
 * table is full. Needs the lock. */
struct vgpu_sim_proc *sim_self_proc(struct vgpu_sim_state *s);
/* The tag p counts under (VGPU_SIM_TAG), or NULL: none, or no p. */
struct vgpu_sim_tag *sim_proc_tag(struct vgpu_sim_state *s, const struct vgpu_sim_proc *p);

#endif /* VGPU_SIM_SLOT_H */
