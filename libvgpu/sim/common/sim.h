/*
 * sim.h - the simulated GPU's common layer, shared by both libraries:
 * the files of common/ (in libcuda.so.1 and libnvidia-ml.so.1) implement it;
 * cuda/ and nvml/ build the two public APIs on it and never on each other.
 */
#ifndef VGPU_SIM_H
#define VGPU_SIM_H

#include <stddef.h>
#include <stdint.h>

#include "state_file.h"

#define VGPU_EXPORT __attribute__((visibility("default")))
/* Export `sym` as an entry point that behaves as `impl` (older versions and
 * per-thread-stream forms that are the same here). It is a one-instruction
 * tail jump rather than a linker alias so that it has an address of its own,
 * as in NVIDIA's driver: a preload library that hands out the wrong variant
 * is then caught on the simulator too. */
#if defined(__x86_64__)
#define VGPU_TAIL_JUMP "jmp"
#elif defined(__aarch64__)
#define VGPU_TAIL_JUMP "b"
#else
#error "VGPU_ALIAS needs this architecture's tail jump"
#endif
#define VGPU_ALIAS(impl, sym)                                                        \
    __asm__(".text\n.globl " #sym "\n.type " #sym ", @function\n.p2align 4\n" #sym \
            ":\n\t" VGPU_TAIL_JUMP " " #impl "\n.size " #sym ", .-" #sym "\n");

/* Store `value` through `out` and return `ok`, or `invalid` for a NULL out:
 * the end of a query that answers one value (each library's ANSWER). */
#define SIM_ANSWER(out, value, invalid, ok)     \
    do {                                        \
        if (!(out))                             \
            return (invalid);                   \
        *(out) = (value);                       \
        return (ok);                            \
    } while (0)

#define SIM_NAME "vgpu-sim GPU"
#define SIM_SM_COUNT 132
#define SIM_CC_MAJOR 9
#define SIM_CC_MINOR 0
#define SIM_DRIVER_VERSION "580.65.06"
#define SIM_CUDA_VERSION 13000 /* what cuDriverGetVersion reports */
#define SIM_GRANULARITY (2ull << 20) /* allocation granularity: 2 MiB */
#define SIM_DEFAULT_MEMORY (16ull << 30)
#define SIM_DEFAULT_CTX_MEM (300ull << 20)
#define SIM_DEFAULT_CKPT_RATE (20ull << 30) /* checkpoint copies: bytes/s */
#define SIM_DEFAULT_SAMPLE_MS 167 /* 1/6 s: the fastest period NVML documents */
/* Time slicing between processes (contexts) on one device, as a GPU without
 * MPS does: the slice, and what switching the device to another process
 * costs (VGPU_SIM_TIMESLICE_US, VGPU_SIM_SWITCH_US). */
#define SIM_DEFAULT_TIMESLICE_US 2000
#define SIM_DEFAULT_SWITCH_US 25
/* A sample period is published this long after it ends (its readers play
 * the timeline up to now first, so nothing can still land in it; the lag
 * is the driver's, which publishes a period after it closed). */
#define SIM_SAMPLE_LAG_NS 25000000ull

/* ---- state.c: the mapped state ---- */

/* The state, mapped and initialised on first use; NULL if the file cannot be
 * created or VGPU_SIM is malformed (said once on stderr). Everything else
 * here needs it to have succeeded. */
struct vgpu_sim_state *sim_state(void);
/* The same, but an existing state is kept whatever its configuration (what
 * `vgpuctl sim` reads must not be replaced by reading it). */
struct vgpu_sim_state *sim_state_as_is(void);

/* The state lock. sim_lock() reclaims the memory of dead processes when
 * `reclaim` is set, as the real driver frees a process's memory when it dies. */
void sim_lock(int reclaim);
void sim_unlock(void);

/* This process's slot (attached on first call, with VGPU_SIM_TAG); -1 if
 * the table is full. Needs the lock. */
int sim_self_slot(void);

uint64_t sim_now_ns(void); /* CLOCK_MONOTONIC */

/* The slot of the live process pid, or -1. Needs the lock. */
int sim_proc_slot(int32_t pid);

/* The driver this simulated machine has (VGPU_SIM_DRIVER, default
 * SIM_DRIVER_VERSION) and the CUDA version it supports (cuDriverGetVersion,
 * NVML; cuGetProcAddress knows no entry point newer). */
const char *sim_driver_version(void);
int sim_cuda_version(void);
/* The CUDA version of a driver version ("570.86.10": 12080); 0 when the
 * simulator can't be that driver (before R525, after R580). */
int sim_cuda_of_driver(const char *driver);

/* VGPU_SIM_STATE, or /dev/shm/vgpu-sim-<uid>. */
const char *sim_state_path(char *buf, size_t len);

/* Processes other than this one that use the state and are alive. Needs the
 * lock. */
int sim_live_processes(void);
/* Whether process slot i belongs to a live process (this one included).
 * Needs the lock. */
int sim_slot_alive(int i);
/* /proc/<pid>/stat's start time (field 22, clock ticks), which tells a
 * reused pid apart; 0 if the process is gone. */
uint64_t sim_proc_start_time(int pid);

/* pid is alive and holds a context or memory on device dev. Needs the lock. */
int sim_proc_on_device(int dev, int32_t pid);

/* Parse "2x16G" (count x size per GPU, the size as vgpu/size.h reads it);
 * 0 on success. */
int sim_parse_spec(const char *text, uint32_t *count, uint64_t *memory);

/* Device identity, the same in both libraries. A UUID of two seeds, and
 * its text with a prefix ("GPU", "MIG"). */
void sim_uuid_of(uint64_t seed_hi, uint64_t seed_lo, unsigned char out[16]);
void sim_uuid_text(const char *prefix, const unsigned char u[16], char *out, size_t len);
void sim_device_uuid(int index, unsigned char out[16]);
void sim_device_uuid_string(int index, char *out, size_t len); /* "GPU-..." */
void sim_device_bus_id(int index, char *out, size_t len, int nvml_form);
/* VGPU_SIM_PEER: whether the machine's GPUs reach each other's memory
 * (peer access over PCIe); 1 unless set to 0. */
int sim_peer_access(void);

/* ---- account.c: memory on the shared devices ---- */

/* Charge `bytes` of device `dev` to this process. `alloc` marks a device
 * allocation (fault injection applies to those, not to contexts).
 * Returns 0, or -1 when the device is out of memory. */
int sim_charge(int dev, uint64_t bytes, int alloc);
void sim_uncharge(int dev, uint64_t bytes);
void sim_context_count(int dev, int delta);

/* Device memory as seen by everyone: total and free bytes. */
void sim_mem_info(int dev, uint64_t *free_bytes, uint64_t *total_bytes);

/* ---- timeline.c: kernel time on the shared devices ---- */

/* The device's timeline (timeline.c): every process has one in-order queue
 * of kernel time per device, and processes with pending kernels take turns
 * in time slices (see docs/simulator.md).
 *
 * sim_submit_kernel: queue a kernel of ns on dev for this process, now;
 * returns its mark: the kernel completes when the process's executed time
 * on dev reaches it.
 * sim_kernel_done: 1 when the kernel of that mark has completed, with *at
 * the instant it did; 0 if not yet, with *at when it will if no other
 * process submits anything meanwhile (others' work can only delay it).
 * sim_timeline_catch_up: play dev's timeline up to now (the lock held), so
 * that its busy time and sample periods are up to date. */
uint64_t sim_submit_kernel(int dev, uint64_t ns);
int sim_kernel_done(int dev, uint64_t mark, uint64_t *at);
void sim_timeline_catch_up(int dev);

/* ---- ckpt.c: a checkpointed process's device memory ---- */

/* Checkpoint: what process slot `slot` holds on every GPU (memory and
 * contexts) is given back to the GPUs and kept in its held[] and
 * held_ctx[]. Returns the bytes held. */
uint64_t sim_ckpt_release(int slot);
/* Restore: put what slot holds back on the GPUs, held[d] going to GPU
 * map[d]. Returns 0, or -1 (nothing changed) when some GPU lacks the room;
 * *bytes gets the bytes restored. */
int sim_ckpt_restore(int slot, const int map[VGPU_SIM_MAX_DEVICES], uint64_t *bytes);

/* ---- mig_layout.c (profiles, instances, VGPU_SIM_MIG) and mig.c (slots): MIG ---- */

/* A GPU instance profile: its NVML_GPU_INSTANCE_PROFILE_* index, the id the
 * driver gives it, compute and memory slices, instances that fit (its
 * placements: start k * size for k < count), multiprocessors, and the
 * NVML_COMPUTE_INSTANCE_PROFILE_* of the compute instance spanning it. */
struct sim_mig_profile {
    unsigned int nvml, id, compute, mem, count, size, sms, ci_profile;
};
const struct sim_mig_profile *sim_mig_profile(unsigned int nvml_profile); /* NULL: none */
const struct sim_mig_profile *sim_mig_profile_by_id(unsigned int id);
uint64_t sim_mig_memory(const struct vgpu_sim_state *s, const struct sim_mig_profile *p);
void sim_mig_profile_name(const struct vgpu_sim_state *s, const struct sim_mig_profile *p,
                          char *out, size_t len); /* "1g.10gb" */
/* How many more instances of p GPU gpu has room for. */
unsigned int sim_mig_remaining(const struct vgpu_sim_state *s, int gpu,
                               const struct sim_mig_profile *p);

/* Device slots (physical GPUs and MIG devices): the physical GPU a slot is
 * on (itself for a physical one), its multiprocessors, the GPU instance
 * whose slot it is (NULL for a physical GPU; *gpu, *gi_id set), whether it
 * is a MIG device now (its instance has its compute instance), its name
 * ("vgpu-sim GPU MIG 1g.10gb"), its UUID ("GPU-..." or "MIG-...", and a MIG
 * device's 16 bytes), and whether a process holds memory or a context on it
 * (the lock held, dead processes reclaimed). */
int sim_slot_parent(int slot);
int sim_slot_sms(int slot);
const struct vgpu_sim_gi *sim_slot_gi(int slot, int *gpu, int *gi_id);
int sim_slot_is_mig_device(int slot);
void sim_slot_name(int slot, char *out, size_t len);
void sim_slot_uuid_string(int slot, char *out, size_t len);
void sim_slot_mig_uuid(int slot, unsigned char out[16]);
int sim_slot_in_use(const struct vgpu_sim_state *s, int slot);

/* Changing the layout, the lock held and dead processes reclaimed: MIG
 * mode on or off (refused IN_USE while a process uses the GPU, or, to turn
 * it off, while it has instances), a GPU instance of profile p at start
 * (-1: the first free placement; *gi_id its id, the lowest free from 1), its
 * compute instance (id 0), and destroying them (IN_USE while a process
 * uses it, or, for a GPU instance, while it has its compute instance). */
enum { SIM_MIG_OK, SIM_MIG_NOT_SUPPORTED, SIM_MIG_INVALID, SIM_MIG_NO_ROOM, SIM_MIG_IN_USE };
int sim_mig_set_mode(struct vgpu_sim_state *s, int gpu, unsigned int mode);
int sim_mig_create_gi(struct vgpu_sim_state *s, int gpu, const struct sim_mig_profile *p,
                      int start, int *gi_id);
int sim_mig_destroy_gi(struct vgpu_sim_state *s, int gpu, int gi_id);
int sim_mig_create_ci(struct vgpu_sim_state *s, int gpu, int gi_id);
int sim_mig_destroy_ci(struct vgpu_sim_state *s, int gpu, int gi_id);

/* VGPU_SIM_MIG read (with the GPUs' count and memory: profile names follow
 * it) into a plan, applied to a state being created. A malformed value is
 * said on stderr and -1 returned. */
struct sim_mig_plan {
    uint32_t enabled; /* GPUs in MIG mode, a bit each */
    uint32_t n;
    struct sim_mig_plan_entry {
        int gpu, profile, start;
    } e[VGPU_SIM_MAX_DEVICES - VGPU_SIM_MAX_GPUS];
};
int sim_mig_parse(const char *spec, uint32_t count, uint64_t memory, struct sim_mig_plan *plan);
void sim_mig_apply(struct vgpu_sim_state *s, const struct sim_mig_plan *plan);

/* ---- ctl.c: fault injection, and control functions for vgpuctl ---- */

/* Fault injection for NVML: the error to fail this call with, or 0. */
int sim_nvml_fault(void);

/* Exported from both libraries for `vgpuctl sim` (vgpuctl/system/simstate.py).
 * stats: the state as one JSON object into buf; returns its length (call
 *   again with a bigger buffer if that is >= len), -1 if there is no state.
 * fail_allocs: the next n allocations on gpu fail; -1 if no such gpu.
 * nvml_error: the next n NVML calls (n < 0: all, until cleared) return code.
 * clear_faults: no more injected faults.
 * reset: delete the state file; returns the number of live processes using
 *   it instead when there are some and force is 0. */
VGPU_EXPORT int vgpu_sim_ctl_stats(char *buf, size_t len);
VGPU_EXPORT int vgpu_sim_ctl_fail_allocs(int gpu, long long n);
VGPU_EXPORT int vgpu_sim_ctl_nvml_error(int code, long long n);
VGPU_EXPORT int vgpu_sim_ctl_clear_faults(void);
VGPU_EXPORT int vgpu_sim_ctl_reset(int force);

#endif /* VGPU_SIM_H */
