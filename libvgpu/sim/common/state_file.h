/*
 * state_file.h - the layout of the simulated GPU's shared device state.
 *
 * One file (VGPU_SIM_STATE, default /dev/shm/vgpu-sim-<uid>) that every
 * process using the simulated libcuda.so.1 or libnvidia-ml.so.1 maps, so all
 * of them see the same GPUs: memory one process holds is gone for the others,
 * and kernels from all processes share one timeline per device.
 *
 * Everything below `lock` is read and written only with `lock` held (a
 * process-shared, robust mutex: a process killed while holding it does not
 * wedge the others). The layout is private to the simulator; other programs read
 * it through the control functions (vgpu_sim_ctl_*, see sim.h) so that the
 * reclaim of dead processes' memory happens in one place.
 */
#ifndef VGPU_SIM_STATE_H
#define VGPU_SIM_STATE_H

#include <pthread.h>
#include <stdint.h>

#define VGPU_SIM_MAGIC 0x4d495356u /* "VSIM" */
#define VGPU_SIM_LAYOUT 8
/* Device slots: the physical GPUs (at most VGPU_SIM_MAX_GPUS, slots 0 to
 * count - 1), then the MIG devices' (one per GPU instance, slots
 * VGPU_SIM_MAX_GPUS and up, taken when an instance is created). Memory,
 * timeline and per-process records are per slot, so a MIG device is a
 * device of its own to all of them. */
#define VGPU_SIM_MAX_GPUS 16
#define VGPU_SIM_MAX_DEVICES 32
#define VGPU_SIM_MIG_SLICES 8      /* memory slices of a GPU in MIG mode */
#define VGPU_SIM_MAX_GI 7          /* GPU instances per GPU (ids 1 to 7) */
#define VGPU_SIM_MIG_SPEC_LEN 256
#define VGPU_SIM_MAX_PROCS 256
#define VGPU_SIM_MAX_TAGS 256       /* VGPU_SIM_TAG names a state has seen */
#define VGPU_SIM_TAG_LEN 64
#define VGPU_SIM_RING 65536        /* runs of processes remembered per device */
#define VGPU_SIM_PERIODS 64        /* utilization sample periods kept */
#define VGPU_SIM_RUNS 8            /* a process's last runs on a device, remembered */
/* Processes per sample period: as many as can hold a slot, so that every
 * process that runs a kernel has its busy time recorded however many share
 * the device. */
#define VGPU_SIM_PERIOD_PIDS VGPU_SIM_MAX_PROCS

/* What NVML's per-process utilization makes of a period inside the window in
 * which a process ran nothing (VGPU_SIM_UTIL_IDLE): averaged in as zero, or
 * skipped. */
#define VGPU_SIM_UTIL_IDLE_AVERAGE 0
#define VGPU_SIM_UTIL_IDLE_SKIP 1

/* Which processes a sample period's per-process utilization names
 * (VGPU_SIM_UTIL_PROCS): one, the process whose work ran last in the period,
 * with the whole device's utilization (what an H100 with driver 580 does);
 * one, the process that ran most in it, with the same; each process that
 * ran, with its own busy time; or none: per-process utilization is not
 * supported (NVML_ERROR_NOT_SUPPORTED, as on a MIG instance). */
#define VGPU_SIM_UTIL_PROCS_LAST 0
#define VGPU_SIM_UTIL_PROCS_BUSIEST 1
#define VGPU_SIM_UTIL_PROCS_EACH 2
#define VGPU_SIM_UTIL_PROCS_NONE 3

/* One stretch of a device's timeline during which one process's kernels
 * ran (CLOCK_MONOTONIC ns); a kernel preempted at the end of a time slice
 * spans several. */
struct vgpu_sim_kernel {
    int32_t pid;
    uint32_t pad;
    uint64_t start_ns;
    uint64_t end_ns;
};

/* One run of a process on a device: from start_ns to end_ns its kernels
 * ran, taking its executed kernel time from done_ns to done_ns + (end_ns -
 * start_ns). A kernel completes when done_ns passes its mark. */
struct vgpu_sim_run_rec {
    uint64_t start_ns;
    uint64_t end_ns;
    uint64_t done_ns;
};

/* A process's work on one device (its context's queue, as the device's
 * scheduler sees it). */
struct vgpu_sim_queue {
    uint64_t submitted_ns;   /* kernel time it has submitted, in all */
    uint64_t done_ns;        /* ...and the part the device has executed */
    uint32_t nruns;          /* runs recorded (ring slot = nruns % VGPU_SIM_RUNS) */
    uint32_t pad;
    struct vgpu_sim_run_rec runs[VGPU_SIM_RUNS];
};

/* Busy time per process within one utilization sample period. */
struct vgpu_sim_period {
    uint64_t index; /* period number: start = index * sample_ns */
    uint32_t n;
    uint32_t last;  /* e[] index of the process whose kernel ran last in it */
    struct {
        int32_t pid;
        uint32_t pad;
        uint64_t busy_ns;
    } e[VGPU_SIM_PERIOD_PIDS];
};

/* The device's scheduler: processes with pending kernels take turns in time
 * slices (see timeline.c). The timeline is played up to played_ns. */
struct vgpu_sim_sched {
    uint64_t played_ns;      /* the timeline is decided up to here */
    int32_t cur;             /* process slot holding the device, -1: none */
    int32_t next;            /* slot being switched to, -1: no switch under way */
    uint64_t slice_end_ns;   /* end of cur's time slice; 0: none started */
    uint64_t switch_end_ns;  /* end of the context switch under way */
    uint64_t switches;       /* context switches since the state was created */
    uint64_t pending[(VGPU_SIM_MAX_PROCS + 63) / 64]; /* slots that may have pending
                                                         kernels (a bit each) */
};

struct vgpu_sim_device {
    uint64_t total;          /* bytes */
    uint32_t sms;            /* multiprocessors (SIM_SM_COUNT, or a MIG profile's) */
    int32_t parent;          /* a MIG device's physical GPU; -1: a physical GPU or
                                a free slot */
    uint64_t used;           /* bytes held by live processes, contexts included */
    uint64_t busy_ns;        /* kernel time executed since the state was created */
    uint64_t kernels;        /* kernels submitted since the state was created */
    uint64_t runs;           /* runs recorded; ring slot = runs % VGPU_SIM_RING */
    int64_t fail_allocs;     /* fault injection: fail this many next allocations */
    struct vgpu_sim_sched sched;
    struct vgpu_sim_period periods[VGPU_SIM_PERIODS];
    struct vgpu_sim_kernel ring[VGPU_SIM_RING];
};

/* One GPU instance of a GPU in MIG mode, with at most one compute instance
 * (the one that spans it: the simulator models no smaller compute
 * profiles). Its MIG device is dev[slot]. */
struct vgpu_sim_gi {
    uint32_t used;           /* 1: the instance exists */
    uint32_t profile;        /* NVML_GPU_INSTANCE_PROFILE_* */
    uint32_t start;          /* placement: first memory slice */
    uint32_t has_ci;         /* 1: its compute instance (id 0) exists */
    int32_t slot;            /* dev[] slot of its memory and MIG device */
    uint32_t pad;
    uint64_t serial;         /* its compute instance's creation number (its UUID) */
};

struct vgpu_sim_mig {
    uint32_t mode;           /* NVML_DEVICE_MIG_ENABLE or _DISABLE (current = pending) */
    uint32_t pad;
    struct vgpu_sim_gi gi[VGPU_SIM_MAX_GI]; /* gi[id - 1] */
};

/* CUprocessState, as cuCheckpointProcessGetState reports it */
#define VGPU_SIM_CKPT_RUNNING 0
#define VGPU_SIM_CKPT_LOCKED 1
#define VGPU_SIM_CKPT_CHECKPOINTED 2
#define VGPU_SIM_CKPT_FAILED 3

/* What the driver's checkpoint API asks of a process (cuda/checkpoint.c):
 * a controlling process posts a request (op, arguments) and bumps `req`;
 * the process's restore thread answers (result) and bumps `ans`. Both are
 * futex words; one controller at a time (`caller`). The process writes
 * state, tid and held[]. */
struct vgpu_sim_ckpt {
    uint32_t req;            /* requests posted (futex) */
    uint32_t ans;            /* requests answered (futex) */
    int32_t caller;          /* pid of the controller whose request is open, 0: none */
    int32_t op;              /* VGPU_SIM_CKPT_OP_* (checkpoint.c) */
    int32_t result;          /* CUresult of the last answer */
    uint32_t state;          /* VGPU_SIM_CKPT_* */
    int32_t tid;             /* the process's restore thread; 0: it has none */
    uint32_t timeout_ms;     /* lock: 0 waits for ever */
    uint32_t npairs;         /* restore: UUID pairs in pairs[] */
    uint32_t pad;
    unsigned char pairs[VGPU_SIM_MAX_DEVICES][2][16]; /* restore: old, new UUID */
    uint64_t held[VGPU_SIM_MAX_DEVICES];      /* checkpointed: device memory it held
                                                 per GPU, now in host memory */
    uint32_t held_ctx[VGPU_SIM_MAX_DEVICES];  /* ...and its contexts there */
};

struct vgpu_sim_proc {
    int32_t pid;             /* 0: free slot */
    int32_t tag;             /* index into tags[], -1: none */
    uint32_t locked;         /* the process holds its slot's lock (see state.c) */
    uint32_t pad;
    uint64_t start_time;     /* /proc/<pid>/stat field 22, tells pid reuse apart */
    uint64_t used[VGPU_SIM_MAX_DEVICES];
    uint64_t peak[VGPU_SIM_MAX_DEVICES];
    uint64_t busy_ns[VGPU_SIM_MAX_DEVICES];
    uint32_t contexts[VGPU_SIM_MAX_DEVICES];
    struct vgpu_sim_queue queue[VGPU_SIM_MAX_DEVICES];
    struct vgpu_sim_ckpt ckpt;
};

/* Per VGPU_SIM_TAG: what all processes carrying the tag hold, and their peak:
 * the simulated device's own record of a job's memory high-water mark. */
struct vgpu_sim_tag {
    char name[VGPU_SIM_TAG_LEN];
    uint64_t used[VGPU_SIM_MAX_DEVICES];
    uint64_t peak[VGPU_SIM_MAX_DEVICES];
    uint64_t busy_ns[VGPU_SIM_MAX_DEVICES];
};

/* vgpu_sim_state.ckpt_flags */
#define VGPU_SIM_CKPT_F_PAIRS_ALL 1  /* restore pairs must list every GPU, not only
                                        the checkpointed ones */
#define VGPU_SIM_CKPT_F_REFUSED_LOCKED 2 /* a refused checkpoint leaves the process
                                            LOCKED, not FAILED */

struct vgpu_sim_state {
    uint32_t magic;
    uint32_t layout;
    uint32_t count;          /* simulated GPUs */
    uint32_t ready;          /* set last, once the rest is initialised */
    uint64_t memory;         /* bytes per GPU */
    uint64_t sample_ns;      /* utilization sample period */
    uint32_t util_idle;      /* VGPU_SIM_UTIL_IDLE_AVERAGE or _SKIP */
    uint32_t ckpt_flags;     /* VGPU_SIM_CKPT_F_* (VGPU_SIM_CKPT_PAIRS, _REFUSED) */
    uint64_t slice_ns;       /* time slice between processes (VGPU_SIM_TIMESLICE_US) */
    uint64_t switch_ns;      /* what a switch between processes costs (VGPU_SIM_SWITCH_US) */
    uint64_t ckpt_rate;      /* checkpoint and restore copy rate, bytes/s
                                (VGPU_SIM_CKPT_RATE) */
    char driver[32];         /* the driver version reported (VGPU_SIM_DRIVER) */
    int32_t cuda_version;    /* ...and the CUDA version it supports (13000) */
    uint32_t util_procs;     /* VGPU_SIM_UTIL_PROCS_* */
    int64_t realtime_offset_ns; /* CLOCK_REALTIME - CLOCK_MONOTONIC at creation */
    union {
        pthread_mutex_t lock;
        char lock_space[64];
    };
    int32_t nvml_error;      /* fault injection: NVML calls return this... */
    int32_t pad;
    int64_t nvml_error_count; /* ...this many more times (-1: until cleared) */
    struct vgpu_sim_proc procs[VGPU_SIM_MAX_PROCS];
    struct vgpu_sim_tag tags[VGPU_SIM_MAX_TAGS];
    char mig_spec[VGPU_SIM_MIG_SPEC_LEN]; /* VGPU_SIM_MIG it was created with */
    uint64_t mig_serial;     /* compute instances created so far */
    struct vgpu_sim_mig mig[VGPU_SIM_MAX_GPUS];
    struct vgpu_sim_device dev[VGPU_SIM_MAX_DEVICES];
};

#endif /* VGPU_SIM_STATE_H */
