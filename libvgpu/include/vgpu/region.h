/*
 * region.h - the shared region: the one contract between the C hook
 * (libvgpu.so) and the Python daemon (vgpuctl/system/region.py reads this very file
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
#define VGPU_REGION_VERSION 2
#define VGPU_MAX_DEVICES 16
#define VGPU_MAX_PROCS 128
#define VGPU_UUID_LEN 96
#define VGPU_JOB_ID_LEN 32

/* vgpu_dev_limit.policy */
#define VGPU_POLICY_HARD 0
#define VGPU_POLICY_SOFT 1

/* vgpu_dev_limit.priority: the job's class */
#define VGPU_PRIORITY_LOW 0
#define VGPU_PRIORITY_NORMAL 1
#define VGPU_PRIORITY_HIGH 2

/* vgpu_dev_limit.hold: bits; 0 with throttle 0 is the launch fast path */
#define VGPU_HOLD_HELD 1     /* jobs of a higher class are on this GPU (holders):
                                keep at most budget_ns in flight while one is
                                active, launch nothing while one is busy */
#define VGPU_HOLD_SIGNAL 2   /* jobs of a lower class are on this GPU: keep this
                                job's signal up to date */

#define VGPU_MAX_HOLDERS 8

/* One launch costs VGPU_TOKEN_SCALE tokens; refill_rate is in tokens per
 * second, so the rate can express fractions of a launch per second. */
#define VGPU_TOKEN_SCALE 1000

/* A job of a higher class on the same GPU, whose signal a held job reads:
 * the segment signal_id (the daemon made it: shm_perm.cuid), its dev[dev]. */
struct vgpu_holder {
    char job_id[VGPU_JOB_ID_LEN];  /* digits; "" = unused */
    uint32_t dev;              /* this GPU's index in that job's region */
    uint32_t priority;         /* its class */
    int32_t signal_id;         /* its signal's System V segment; -1: none */
    uint32_t pad0;
};

/* Written by the daemon only. */
struct vgpu_dev_limit {
    char uuid[VGPU_UUID_LEN];  /* physical GPU UUID, "GPU-..."; "" = unused */
    uint64_t mem_limit;        /* bytes for the whole job on this GPU; 0 = none */
    uint64_t ctx_overhead;     /* bytes per context, measured by the daemon
                                  from NVML; 0 = not yet measured */
    uint32_t core_share;       /* target share of compute, percent 1..100 */
    uint32_t policy;           /* VGPU_POLICY_* */
    uint32_t throttle;         /* 0: launches are not gated (fast path) */
    uint32_t hold;             /* VGPU_HOLD_* bits; 0: no class to heed */
    uint64_t refill_rate;      /* tokens per second (see VGPU_TOKEN_SCALE) */
    uint64_t bucket_size;      /* tokens the bucket holds at most */
    uint32_t priority;         /* VGPU_PRIORITY_*: this job's class */
    uint32_t nholders;         /* entries of holders[] in use */
    uint64_t holders_gen;      /* odd while holders[] is being rewritten */
    uint64_t budget_ns;        /* GPU time it may keep in flight while a holder
                                  is active */
    uint64_t holdoff_ns;       /* a holder is active this long after it launched */
    uint64_t launch_cost_ns;   /* the daemon's estimate of the GPU time one launch
                                  of this job takes; 0: none yet */
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
    int64_t tokens;            /* token bucket level */
    uint64_t last_refill_ns;   /* CLOCK_MONOTONIC of the last refill */
    uint64_t launches;         /* launches that went through the token bucket
                                  (throttled); every launch is in procs[] */
    uint64_t throttled_ns;     /* time launching threads spent waiting */
    uint64_t oom_refusals;     /* allocations refused for the limit */
    uint64_t pad0;
};

/* vgpu_proc_slot.features: what the process used that the driver can't
 * checkpoint (R570): the daemon does not suspend a job one of whose
 * processes has any of these. Set by the hook, never cleared while the
 * process lives. */
#define VGPU_FEATURE_MANAGED 1   /* cuMemAllocManaged (unified memory) */
#define VGPU_FEATURE_IPC 2       /* cuIpcGetMemHandle / cuIpcOpenMemHandle */

/* One per process of the job. A slot is claimed by CAS on pid (0 = free). */
struct vgpu_proc_slot {
    int32_t pid;
    uint32_t features;         /* VGPU_FEATURE_* bits */
    uint64_t start_time;       /* /proc/<pid>/stat starttime (clock ticks),
                                  tells a reused pid from the original */
    uint64_t used[VGPU_MAX_DEVICES];      /* bytes this process reserved */
    uint64_t ctx_bytes[VGPU_MAX_DEVICES]; /* part of used[] for contexts */
    uint64_t launches[VGPU_MAX_DEVICES];
    uint64_t allocs;           /* allocation calls through the hook */
    uint64_t get_proc_calls;   /* cuGetProcAddress lookups through the hook */
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
    uint64_t busy_until_ns;    /* when the work it launched should be done (each
                                  launch adds its launch_cost_ns) */
    uint64_t launches;         /* launches counted here (held or signalling) */
    uint64_t pad0;
};

struct vgpu_signal {
    uint32_t magic;            /* VGPU_SIGNAL_MAGIC (not a region's: a segment
                                  id reused for another struct is told apart) */
    uint32_t version;          /* VGPU_REGION_VERSION */
    uint64_t pad0;
    struct vgpu_signal_dev dev[VGPU_MAX_DEVICES];
};

#endif /* VGPU_REGION_H */
