/*
 * region.h - the shared region: the one contract between the C hook
 * (libvgpu.so) and the Python daemon (vgpuctl/system/structs.py reads this very file
 * through cffi, so the two sides cannot drift).
 *
 * A job's region is three System V shared memory segments, created (every
 * page allocated) by the daemon, and named by the daemon's file
 * <job directory>/region ("vgpu-region VERSION LIMITS_ID USAGE_ID SIGNAL_ID"):
 *
 *   limits  struct vgpu_limits   written by the daemon only. Owned by the
 *                                daemon's user, mode 0644: the job attaches
 *                                it read-only and cannot raise its own limits
 *                                (nor its class).
 *   usage   struct vgpu_usage    written by the hook with atomic builtins,
 *                                owned by the job's user, mode 0600.
 *   signal  struct vgpu_signal   written by the hook: when the job last
 *                                launched and how long its launched work
 *                                should take. Owned by the job's user, mode
 *                                0644: the hooks of jobs of a lower class on
 *                                the same GPU attach it read-only, but only
 *                                the segments the daemon named in their
 *                                limits (holders) and made itself.
 *
 * A segment keeps its size for good: no one can truncate or grow it, and no
 * store into it needs space on a filesystem. The job's environment carries
 * VGPU_REGION=<job directory>.
 *
 * Rules for this file (cffi parses it after dropping preprocessor lines
 * other than simple integer #defines):
 *   - only fixed-width integer types, char arrays and nested structs;
 *   - no _Atomic, no bitfields, no unions, no expressions in #defines;
 *   - every field naturally aligned (libvgpu/hook checks sizes at build time).
 * Atomics on the C side use the __atomic builtins on these plain fields.
 * Bump VGPU_REGION_VERSION on every layout change.
 */
#ifndef VGPU_REGION_H
#define VGPU_REGION_H

#include <stdint.h>

#define VGPU_REGION_MAGIC 0x55504756
#define VGPU_SIGNAL_MAGIC 0x4c474953
#define VGPU_REGION_VERSION 5
#define VGPU_MAX_DEVICES 16
#define VGPU_MAX_PROCS 128
#define VGPU_SLOT_LANES 4
#define VGPU_UUID_LEN 96
#define VGPU_JOB_ID_LEN 32

/* vgpu_dev_limit.policy */
#define VGPU_POLICY_HARD 0
#define VGPU_POLICY_SOFT 1

/* vgpu_dev_limit.priority: the job's class */
#define VGPU_PRIORITY_LOW 0
#define VGPU_PRIORITY_NORMAL 1
#define VGPU_PRIORITY_HIGH 2

/* vgpu_dev_limit.throttle: the compute gate */
#define VGPU_GATE_OPEN 0     /* launches are not gated: the fast path (with hold 0) */
#define VGPU_GATE_TURNS 1    /* launches keep to the job's turns (below) */
#define VGPU_GATE_CLOSED 2   /* the daemon found the region tampered with: launches fail */

/* vgpu_dev_limit.hold: bits; 0 with throttle 0 is the launch fast path */
#define VGPU_HOLD_HELD 1     /* jobs of a higher class are on this GPU (holders):
                                keep at most budget_ns in flight while one is
                                active, launch nothing while one is busy */
#define VGPU_HOLD_SIGNAL 2   /* jobs of a lower class are on this GPU: keep this
                                job's signal up to date */

#define VGPU_MAX_HOLDERS 8

/* Spans of a GPU's cycle of turns that no job holds now (open[]). */
#define VGPU_MAX_OPEN 8

/* An open span of the cycle: from start_ns after the cycle's start, len_ns
 * long; prev_signal_id is the signal of the job whose turn ends where it
 * begins (-1: none), its dev[prev_dev]: borrowed work waits for that job's
 * work in flight, as the next turn does. */
struct vgpu_span {
    uint64_t start_ns;
    uint64_t len_ns;
    int32_t prev_signal_id;
    uint32_t prev_dev;
};

/* A job of a higher class on the same GPU, whose signal a held job reads:
 * the segment signal_id (the daemon made it: shm_perm.cuid), its dev[dev]. */
struct vgpu_holder {
    char job_id[VGPU_JOB_ID_LEN];  /* digits; "" = unused */
    uint32_t dev;              /* this GPU's index in that job's region */
    uint32_t priority;         /* its class */
    int32_t signal_id;         /* its signal's System V segment; -1: none */
    uint32_t pad0;
};

/* Written by the daemon only.
 *
 * Turns (throttle == VGPU_GATE_TURNS; docs/compute.md): the GPU's time is a
 * cycle of cycle_ns from epoch_ns (CLOCK_MONOTONIC), the same for every job
 * on it. The job's turn is [turn_start_ns, turn_start_ns + turn_len_ns) of
 * each cycle: it launches there, up to turn_credit_ns of GPU time a cycle
 * (measured by its own hook's events), and nothing outside it, except in
 * the open spans when borrow is 1 (soft jobs, jobs without a share), with
 * at most borrow_ns of work in flight. Its turn begins once the job of the
 * turn before (prev_signal_id) has no work in flight, a few ms at most, and
 * ends as much later. turn_gen is odd while the daemon rewrites these
 * fields (a seqlock). */
struct vgpu_dev_limit {
    char uuid[VGPU_UUID_LEN];  /* physical GPU UUID, "GPU-..."; "" = unused */
    uint64_t mem_limit;        /* bytes for the whole job on this GPU; 0 = none */
    uint64_t ctx_overhead;     /* bytes per context, measured by the daemon
                                  from NVML; 0 = not yet measured */
    uint32_t core_share;       /* target share of compute, percent 1..100 */
    uint32_t policy;           /* VGPU_POLICY_* */
    uint32_t throttle;         /* VGPU_GATE_*; 0: launches are not gated */
    uint32_t hold;             /* VGPU_HOLD_* bits; 0: no class to heed */
    uint64_t turn_gen;         /* odd while the turn fields are rewritten */
    uint64_t epoch_ns;         /* CLOCK_MONOTONIC at which a cycle began */
    uint64_t cycle_ns;         /* the cycle's length */
    uint64_t turn_start_ns;    /* this job's turn in the cycle */
    uint64_t turn_len_ns;      /* ...its length; 0: none (it only borrows) */
    uint64_t turn_credit_ns;   /* GPU time it may use a cycle in its turn */
    uint64_t borrow_ns;        /* work it may keep in flight in an open span */
    uint32_t borrow;           /* 1: it may launch in the open spans */
    uint32_t nopen;            /* entries of open[] in use */
    int32_t prev_signal_id;    /* the signal of the job whose turn ends where this
                                  one begins (see turns.c); -1: none */
    uint32_t prev_dev;         /* ...its device there */
    struct vgpu_span open[VGPU_MAX_OPEN];
    uint32_t priority;         /* VGPU_PRIORITY_*: this job's class */
    uint32_t nholders;         /* entries of holders[] in use */
    uint64_t holders_gen;      /* odd while holders[] is being rewritten */
    uint64_t budget_ns;        /* GPU time it may keep in flight while a holder
                                  is active */
    uint64_t holdoff_ns;       /* a holder is active this long after it launched */
    struct vgpu_holder holders[VGPU_MAX_HOLDERS];
};

struct vgpu_limits {
    uint32_t magic;            /* VGPU_REGION_MAGIC, written last at creation */
    uint32_t version;          /* VGPU_REGION_VERSION */
    char job_id[VGPU_JOB_ID_LEN];
    uint32_t owner_uid;        /* uid the job runs as */
    uint32_t ndevices;         /* entries of dev[] in use */
    uint64_t generation;       /* bumped by the daemon after each change */
    struct vgpu_dev_limit dev[VGPU_MAX_DEVICES];
};

/* Written by the hook (atomics). One per device, job-wide. */
struct vgpu_dev_usage {
    uint64_t used;             /* bytes reserved by all processes of the job,
                                  contexts included */
    uint64_t peak;             /* highest value of used */
    uint64_t busy_ns;          /* GPU time of the job's launched work, measured
                                  by its hooks' events (docs/compute.md) */
    uint64_t cost_ns;          /* the GPU time of one launch, as last measured */
    uint64_t launches;         /* launches that went through the gate */
    uint64_t throttled_ns;     /* time launching threads spent waiting */
    uint64_t oom_refusals;     /* allocations refused for the limit */
    uint64_t borrowed_ns;      /* part of busy_ns run in open spans */
};

/* vgpu_proc_slot.features: what the process used that the driver can't
 * checkpoint (R570): the daemon does not suspend a job one of whose
 * processes has any of these. Set by the hook, never cleared while the
 * process lives. */
#define VGPU_FEATURE_MANAGED 1   /* cuMemAllocManaged (unified memory) */
#define VGPU_FEATURE_IPC 2       /* cuIpcGetMemHandle / cuIpcOpenMemHandle */

/* One per process of the job. A slot is claimed by CAS on pid (0 = free).
 *
 * What the process holds on device d is used[d] plus each lane's
 * lane_used[l][d], added modulo 2^64. A lane belongs to one thread of the
 * process at a time, which alone writes it, with a plain load and store (no
 * locked instruction an allocation); a thread without a lane (more threads
 * than lanes) adds to used[d] with an atomic add. A lane's word may wrap
 * below 0 (a thread freeing what another allocated); a sum read while the
 * process runs may be torn between two lanes: read as signed, below 0 is 0. */
struct vgpu_proc_slot {
    int32_t pid;
    uint32_t features;         /* VGPU_FEATURE_* bits */
    uint64_t start_time;       /* /proc/<pid>/stat starttime (clock ticks),
                                  tells a reused pid from the original */
    uint64_t used[VGPU_MAX_DEVICES];      /* bytes this process reserved,
                                             besides its lanes' (above) */
    uint64_t ctx_bytes[VGPU_MAX_DEVICES]; /* part of what it holds for contexts */
    uint64_t launches[VGPU_MAX_DEVICES];
    uint64_t busy_ns[VGPU_MAX_DEVICES];   /* this process's part of busy_ns */
    uint64_t allocs;           /* allocating calls through the hook: a
                                  diagnostic, kept without a locked add (two
                                  threads allocating at once may count one) */
    uint64_t get_proc_calls;   /* cuGetProcAddress lookups through the hook */
    uint64_t lane_used[VGPU_SLOT_LANES][VGPU_MAX_DEVICES];
};

struct vgpu_usage {
    uint32_t magic;            /* VGPU_REGION_MAGIC */
    uint32_t version;          /* VGPU_REGION_VERSION */
    uint64_t pad0;
    struct vgpu_dev_usage dev[VGPU_MAX_DEVICES];
    struct vgpu_proc_slot procs[VGPU_MAX_PROCS];
};

/* Written by the job's hook (its own segment; readable by all). */
struct vgpu_signal_dev {
    uint64_t last_launch_ns;   /* CLOCK_MONOTONIC of its last launch */
    uint64_t busy_until_ns;    /* when the work it has in flight should be done
                                  (its launches at their measured cost) */
    uint64_t launches;         /* launches counted here (held or signalling) */
    uint64_t turn_end_ns;      /* when its turn ends, as its hook keeps it (now
                                  when it has spent its credit; later while its
                                  work launched in it runs): the next turn waits
                                  for it too */
};

struct vgpu_signal {
    uint32_t magic;            /* VGPU_SIGNAL_MAGIC (not a region's: a segment
                                  id reused for another struct is told apart) */
    uint32_t version;          /* VGPU_REGION_VERSION */
    uint64_t pad0;
    struct vgpu_signal_dev dev[VGPU_MAX_DEVICES];
};

#endif /* VGPU_REGION_H */
