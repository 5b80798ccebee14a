/*
 * hook.h - internals shared by the files of libvgpu.so (not installed).
 *
 *   interpose.c  exports, dlsym, cuGetProcAddress, real entry points
 *   dlsym_entry.S  the exported dlsym: jumps to the real one for other names
 *   state.c      configuration, the job's region, process slots, sweeping
 *   devmap.c     CUDA ordinal / NVML handle -> device of the region
 *   reserve.c    the job's memory count: reserve, give back, dead slots
 *   alloctab.c   the process's allocations and what each reserved
 *   vmm.c        VMM handles: charged until released and unmapped
 *   memory.c     allocating entry points, their frees, memory info
 *   pool.c       stream-ordered pools: what their reserve holds
 *   context.c    contexts: measured, reserved, given back
 *   launch.c     the launch gate: fast path, or the slow one below
 *   flight.c     work in flight, GPU time measured by events
 *   turns.c      turns: when a gated job may launch
 *   turns_rule.c the rule of turns, pure (tests/c/turns_table.c drives it)
 *   priority.c   classes: held launches, the job's signal
 *   nvml.c       NVML memory info and process lists
 *   log.c        "vgpu:" messages, each once
 *   clock.c      CLOCK_MONOTONIC from the time-stamp counter, between anchors
 */
#ifndef VGPU_HOOK_H
#define VGPU_HOOK_H

#include <stdint.h>

#include "vgpu/cuda_types.h"
#include "vgpu/nvml_types.h"
#include "vgpu/region.h"

#define VGPU_EXPORT __attribute__((visibility("default")))
#define VGPU_LIKELY(x) __builtin_expect(!!(x), 1)
#define VGPU_UNLIKELY(x) __builtin_expect(!!(x), 0)

/* Types only passed through by pointer (not in cuda_types.h). */
typedef struct CUexecAffinityParam_st CUexecAffinityParam;
typedef struct CUctxCreateParams_st CUctxCreateParams;

/* ---- the generated list ------------------------------------------------ */
enum vgpu_hook_id {
#define CU_HOOK(base, sym, params, args) VGPU_H_##sym,
#define NVML_HOOK(sym, params, args) VGPU_H_##sym,
#define CU_REAL(sym, params) VGPU_H_##sym,
#define NVML_REAL(sym, params) VGPU_H_##sym,
#include "hooks.def"
    VGPU_H_COUNT
};

#define CU_HOOK(base, sym, params, args) \
    typedef CUresult (*vgpu_fn_##sym) params; \
    CUresult hook_##sym params;
#define NVML_HOOK(sym, params, args) \
    typedef nvmlReturn_t (*vgpu_fn_##sym) params; \
    nvmlReturn_t hook_##sym params;
#define CU_REAL(sym, params) typedef CUresult (*vgpu_fn_##sym) params;
#define NVML_REAL(sym, params) typedef nvmlReturn_t (*vgpu_fn_##sym) params;
#include "hooks.def"

/* The dlsym entry (dlsym_entry.S) asks this what to do: it returns the real
 * dlsym, for the entry to jump to with the caller's return address in
 * place, or NULL with the answer in *answer (interpose.c). */
typedef void *(*vgpu_dlsym_fn)(void *handle, const char *name);
vgpu_dlsym_fn vgpu_dlsym_route(void *handle, const char *name, const void *caller,
                               void **answer);
/* The same for dlvsym (the entry in dlsym_entry.S too): a program asking
 * dlvsym for the real dlsym gets the hook's. */
typedef void *(*vgpu_dlvsym_fn)(void *handle, const char *name, const char *version);
vgpu_dlvsym_fn vgpu_dlvsym_route(void *handle, const char *name, const char *version,
                                 const void *caller, void **answer);

/* Real entry points, by id. Never NULL once the library is loaded: a
 * function the real library lacks gets a stub returning NOT_FOUND. */
extern void *vgpu_real[VGPU_H_COUNT];
#define REAL(sym) ((vgpu_fn_##sym)vgpu_real[VGPU_H_##sym])
/* Non-zero when the real library really has the symbol. */
int vgpu_real_present(int id);

/* ---- state ---------------------------------------------------------------- */
enum vgpu_state {
    VGPU_UNINIT = 0,
    VGPU_PASS,      /* no VGPU_REGION, no VGPU_MEM_LIMIT: forward untouched */
    VGPU_BROKEN,    /* a limit was asked for but can't be applied: calls fail */
    VGPU_ACTIVE     /* limits apply */
};

/* What a wrapped call returns when the configuration is broken (see
 * docs/hook.md): the runtime reports "CUDA-capable device(s) is/are busy or
 * unavailable", and the hook printed the reason on stderr. */
#define VGPU_BROKEN_CU CUDA_ERROR_DEVICE_UNAVAILABLE
#define VGPU_BROKEN_NVML NVML_ERROR_NO_PERMISSION

extern int vgpu_g_state;                 /* enum vgpu_state, configuration */
extern int vgpu_g_cu_state;              /* same, once libcuda is resolved */
extern int vgpu_g_nvml_state;            /* same, once NVML is resolved */
extern const struct vgpu_limits *vgpu_g_limits;
extern struct vgpu_usage *vgpu_g_usage;
extern struct vgpu_proc_slot *vgpu_g_slot;
extern int vgpu_g_private;               /* VGPU_MEM_LIMIT without a region */
extern uint64_t vgpu_g_private_limit;

int vgpu_state_init_slow(void);
int vgpu_cu_init_slow(void);
int vgpu_nvml_init_slow(void);

static inline int vgpu_state(void)
{
    int s = __atomic_load_n(&vgpu_g_state, __ATOMIC_ACQUIRE);
    return VGPU_LIKELY(s != VGPU_UNINIT) ? s : vgpu_state_init_slow();
}

static inline int vgpu_cu_state(void)
{
    int s = __atomic_load_n(&vgpu_g_cu_state, __ATOMIC_ACQUIRE);
    return VGPU_LIKELY(s != VGPU_UNINIT) ? s : vgpu_cu_init_slow();
}

static inline int vgpu_nvml_state(void)
{
    int s = __atomic_load_n(&vgpu_g_nvml_state, __ATOMIC_ACQUIRE);
    return VGPU_LIKELY(s != VGPU_UNINIT) ? s : vgpu_nvml_init_slow();
}

/* Start of a wrapper: pass through or fail (with `broken`) as the state
 * that state_fn reads says. */
#define VGPU_PROLOGUE(state_fn, broken, sym, args) \
    do { \
        int s_ = state_fn(); \
        if (s_ == VGPU_PASS) \
            return REAL(sym) args; \
        if (s_ != VGPU_ACTIVE) \
            return broken; \
    } while (0)
/* A CUDA wrapper's and an NVML wrapper's. */
#define CU_PROLOGUE(sym, args) VGPU_PROLOGUE(vgpu_cu_state, VGPU_BROKEN_CU, sym, args)
#define NVML_PROLOGUE(sym, args) VGPU_PROLOGUE(vgpu_nvml_state, VGPU_BROKEN_NVML, sym, args)

/* Sweep slots of dead processes (state.c); returns bytes given back. */
uint64_t vgpu_sweep(void);
/* Pids of the job's live slots (at most max); returns how many. */
int vgpu_job_pids(int32_t *pids, int max);
int vgpu_private_add_device(const char *uuid);
void vgpu_interpose_atfork_child(void);

/* ---- devices (devmap.c) --------------------------------------------------- */
/* Region device index of a CUDA ordinal; -1 when not part of the job. */
int vgpu_dev_of_ordinal(CUdevice ordinal);
/* Region device index of the current context's device; -1 when that GPU is
 * not part of the job, VGPU_DEV_NO_CONTEXT when there is no current context
 * (the real call then fails by itself). */
#define VGPU_DEV_NO_CONTEXT (-2)
int vgpu_dev_current(void);
/* Region device index for an NVML handle; -1 when not part of the job. */
int vgpu_dev_of_nvml(nvmlDevice_t dev);
/* The UUID text ("GPU-...") of a region device. */
const char *vgpu_dev_uuid(int d);
void vgpu_devmap_atfork_child(void);

/* Fast path for the launch gate: the only device this process has contexts
 * on, or -1 (then ask the driver). */
extern int vgpu_g_single_dev;
void vgpu_note_ctx_device(int d);

static inline int vgpu_dev_for_launch(void)
{
    int d = __atomic_load_n(&vgpu_g_single_dev, __ATOMIC_RELAXED);
    return d >= 0 ? d : vgpu_dev_current();
}

/* ---- memory (reserve.c, alloctab.c, memory.c, context.c) -------------------- */
#define VGPU_GRANULARITY (2ull << 20)   /* what the driver reserves in */

static inline uint64_t vgpu_round_gran(uint64_t n)
{
    if (n > UINT64_MAX - VGPU_GRANULARITY)
        return UINT64_MAX;
    return (n + VGPU_GRANULARITY - 1) & ~(VGPU_GRANULARITY - 1);
}
uint64_t vgpu_job_used(int d);
uint64_t vgpu_dev_limit(int d);
/* What the job sees of region device d: total = the limit, free = what is
 * left of it (saturating at 0) and never more than the GPU really has free
 * (*free_b holds the driver's figure on entry), used = the job's bytes.
 * 0 (nothing written) when the device has no limit. used_b may be NULL. */
int vgpu_job_mem_view(int d, uint64_t *free_b, uint64_t *total_b, uint64_t *used_b);
/* Reserve bytes on region device d for this process (is_ctx: a context's
 * memory); 1 on success, 0 when over the limit (after sweeping dead slots).
 * Inline, the common case: one compare-and-swap on the job's count that
 * fits; anything else (a GPU not the job's, no room, a lost race) is the
 * whole procedure in reserve.c, from the start. */
int vgpu_reserve_slow(int d, uint64_t bytes, int is_ctx, const char *what);
/* What the process holds in its slot (region.h: used[] and the lanes).
 * The calling thread's lane, 1 + its index, or 0 when it has none yet
 * (reserve.c: it takes one at its first change, or adds to used[] when
 * every lane is taken). */
extern __thread uint32_t vgpu_t_lane __attribute__((tls_model("initial-exec")));
void vgpu_slot_add_slow(struct vgpu_proc_slot *s, int d, uint64_t delta);
/* The process's count on device d changes by delta (modulo 2^64: -n
 * takes n off): in the thread's own lane, a load and a store. */
static inline void vgpu_slot_add(struct vgpu_proc_slot *s, int d, uint64_t delta)
{
    uint32_t l = vgpu_t_lane;
    if (VGPU_LIKELY(l - 1 < VGPU_SLOT_LANES)) {
        uint64_t *w = &s->lane_used[l - 1][d];
        __atomic_store_n(w, __atomic_load_n(w, __ATOMIC_RELAXED) + delta, __ATOMIC_RELAXED);
        return;
    }
    vgpu_slot_add_slow(s, d, delta);
}
/* What slot s holds on device d: its words' sum, read as signed (a sum
 * torn between two lanes while the process runs may fall below 0). */
uint64_t vgpu_slot_used(const struct vgpu_proc_slot *s, int d);

/* After a reservation took the job's count of d to `now`: its peak, and the
 * process's slot. */
static inline void vgpu_reserved(int d, uint64_t now, uint64_t bytes, int is_ctx)
{
    struct vgpu_dev_usage *u = &vgpu_g_usage->dev[d];
    uint64_t peak = __atomic_load_n(&u->peak, __ATOMIC_RELAXED);
    while (now > peak && !__atomic_compare_exchange_n(&u->peak, &peak, now, 1, __ATOMIC_RELAXED,
                                                      __ATOMIC_RELAXED))
        ;
    struct vgpu_proc_slot *s = vgpu_g_slot;
    vgpu_slot_add(s, d, bytes);
    if (is_ctx)
        __atomic_fetch_add(&s->ctx_bytes[d], bytes, __ATOMIC_RELAXED);
}

static inline int vgpu_reserve(int d, uint64_t bytes, int is_ctx, const char *what)
{
    if (VGPU_LIKELY(d >= 0)) {
        uint64_t *used = &vgpu_g_usage->dev[d].used;
        uint64_t limit = __atomic_load_n(&vgpu_g_limits->dev[d].mem_limit, __ATOMIC_RELAXED);
        uint64_t cur = __atomic_load_n(used, __ATOMIC_RELAXED);
        int fits = limit == 0 ? bytes <= UINT64_MAX - cur : (bytes <= limit && cur <= limit - bytes);
        if (VGPU_LIKELY(fits) &&
            __atomic_compare_exchange_n(used, &cur, cur + bytes, 0, __ATOMIC_ACQ_REL,
                                        __ATOMIC_RELAXED)) {
            vgpu_reserved(d, cur + bytes, bytes, is_ctx);
            return 1;
        }
    }
    return vgpu_reserve_slow(d, bytes, is_ctx, what);
}

/* *p -= v, never below 0. */
static inline void vgpu_sub_sat(uint64_t *p, uint64_t v)
{
    uint64_t cur = __atomic_load_n(p, __ATOMIC_RELAXED);
    while (!__atomic_compare_exchange_n(p, &cur, cur > v ? cur - v : 0, 1, __ATOMIC_ACQ_REL,
                                        __ATOMIC_RELAXED))
        ;
}

/* Give back what vgpu_reserve(d, bytes, is_ctx) reserved. */
static inline void vgpu_unreserve(int d, uint64_t bytes, int is_ctx)
{
    if (d < 0 || bytes == 0)
        return;
    struct vgpu_proc_slot *s = vgpu_g_slot;
    vgpu_slot_add(s, d, -bytes);
    if (is_ctx)
        vgpu_sub_sat(&s->ctx_bytes[d], bytes);
    vgpu_sub_sat(&vgpu_g_usage->dev[d].used, bytes);
}
/* Count bytes the driver took beyond what was reserved (a pool that grew by
 * more than an allocation): past the limit if need be, as it is taken. */
void vgpu_reserve_anyway(int d, uint64_t bytes);
/* Memory pools (pool.c): what a pool can serve without growing; settle a
 * pool's charge on the reserve the driver reports (extra: bytes reserved for
 * it by the caller), every known pool's, or forget a destroyed one's. */
uint64_t vgpu_pool_spare(CUmemoryPool pool);
void vgpu_pool_settle(CUmemoryPool pool, int dev, uint64_t extra);
void vgpu_pool_settle_all(void);
void vgpu_pool_forget(CUmemoryPool pool);
uint64_t vgpu_release_slot_memory(struct vgpu_proc_slot *slot);
uint64_t vgpu_nvml_process_used(const char *uuid);   /* nvml.c */

enum { VGPU_K_EMPTY = 0, VGPU_K_PTR, VGPU_K_HANDLE, VGPU_K_ARRAY, VGPU_K_MIPMAP,
       VGPU_K_MAP /* a mapping of a handle: reserves nothing (vmm.c) */ };

struct vgpu_alloc {
    uint64_t key;      /* device pointer, or handle */
    uint64_t size;     /* bytes reserved for it (a mapping: bytes mapped) */
    CUcontext ctx;     /* made in; NULL for cuMemCreate handles */
    int32_t dev;       /* region device */
    uint32_t kind;     /* VGPU_K_* */
    uint32_t refs;     /* a handle: the process's references (cuMemCreate,
                          cuMemRetainAllocationHandle) not yet released */
    uint32_t maps;     /* a handle: its mappings not yet unmapped */
    uint64_t aux;      /* a mapping: its handle */
};

/* Remember an allocation: 0, or 1 when the key was there already (its free
 * went another way; the old entry is in *old), or -1 (no host memory). */
int vgpu_track(uint32_t kind, uint64_t key, uint64_t size, int dev, CUcontext ctx,
               struct vgpu_alloc *old);
/* The same, with the entry's aux (a mapping's handle). */
int vgpu_track_aux(uint32_t kind, uint64_t key, uint64_t size, int dev, CUcontext ctx,
                   uint64_t aux, struct vgpu_alloc *old);
/* Take an allocation out of the table; 1 if it was there. */
int vgpu_untrack(uint32_t kind, uint64_t key, struct vgpu_alloc *out);
/* vgpu_track and vgpu_untrack of a device pointer (VGPU_K_PTR). */
int vgpu_track_ptr(uint64_t key, uint64_t size, int dev, CUcontext ctx, struct vgpu_alloc *old);
int vgpu_untrack_ptr(uint64_t key, struct vgpu_alloc *out);
/* A handle's references and mappings change by dr and dm: 1 when both are
 * then 0 (its entry taken out, into *out), 0 when it stays, -1 when the
 * handle is not ours (an import). */
int vgpu_handle_adjust(uint64_t handle, int dr, int dm, struct vgpu_alloc *out);
/* Take out every allocation made in ctx, adding their sizes per device. */
void vgpu_untrack_ctx(CUcontext ctx, uint64_t per_dev[VGPU_MAX_DEVICES]);
void vgpu_alloctab_atfork_child(void);
void vgpu_lanes_atfork_child(void);
void vgpu_context_atfork_child(void);

/* Accounting happens once, at the outermost call: when a driver implements
 * one entry point by calling another exported one (the call then comes back
 * through our export), the inner call goes straight to the driver. */
extern __thread int vgpu_t_inside __attribute__((tls_model("initial-exec")));

static inline void vgpu_leave_hook(int *unused)
{
    (void)unused;
    vgpu_t_inside = 0;
}

#define ENTER(sym, args) \
    if (VGPU_UNLIKELY(vgpu_t_inside)) \
        return REAL(sym) args; \
    vgpu_t_inside = 1; \
    __attribute__((cleanup(vgpu_leave_hook))) int guard_ = 1; \
    (void)guard_

/* ---- work in flight and GPU time (flight.c) ------------------------------------ */
/* A job's turn on one device, as this process keeps it: turns_rule.h. */
#include "turns_rule.h"
/* What is in flight on a device, polled (with the flight lock held). */
struct vgpu_flight_view {
    uint32_t n;             /* launches in flight */
    int measured;           /* cost_ns was measured (else a default) */
    uint64_t cost_ns;       /* GPU time of the launch asking (its kind's) */
    uint64_t pending_ns;    /* estimated GPU time of what is in flight */
    CUevent head;           /* the oldest launch's mark; NULL when none */
    struct vgpu_turn_state *turn;
};
/* A launch on the slow path (launch.c): its region device, its stream, the
 * context current when it was made (NULL: none, not tracked) and the time,
 * each read once. */
struct vgpu_launch {
    int d;
    CUstream s;
    CUcontext ctx;
    uint64_t now;
    uint64_t kind;          /* its function (or graph) and shape, hashed (flight.c) */
};
void vgpu_flight_lock(void);
void vgpu_flight_unlock(void);
/* Take in the completed launches and describe what is in flight (lock held);
 * 0 when out of memory. */
int vgpu_flight_poll(int d, uint64_t now, uint64_t kind, struct vgpu_flight_view *v);
/* The GPU time one launch takes, as measured (*measured 0: a default). */
uint64_t vgpu_flight_cost(int d, int *measured);
/* Before a tracked launch: start a stretch if nothing is in flight. The
 * _locked form is for a caller that holds the lock and has just polled
 * (n: what it found in flight). */
void vgpu_flight_begin(const struct vgpu_launch *l);
void vgpu_flight_begin_locked(const struct vgpu_launch *l, uint32_t n);
/* The turn's end the rule tells the job of the next turn (lock held; 0:
 * nothing new). */
void vgpu_flight_tell_end(int d, uint64_t end);
/* After it: mark it (own: in the job's turn, else borrowed time). */
void vgpu_flight_track(const struct vgpu_launch *l, int own);
/* Wait for a mark, counting the wait as throttled since `since`. */
void vgpu_flight_wait(CUevent ev, int d, uint64_t since);
/* After a synchronisation: measure the marks that completed. */
void vgpu_flight_settle(void);
void vgpu_flight_atfork_child(void);

/* ---- turns (turns.c) -------------------------------------------------------------- */
enum { VGPU_GO_CLOSED = -1, VGPU_GO_UNTRACKED = 0, VGPU_GO_OWN = 1, VGPU_GO_BORROWED = 2 };
/* Before a launch of a job gated by turns: wait for its turn (or an open
 * span), then start its stretch if nothing is in flight; VGPU_GO_*.
 * l->now is the time it went. */
int vgpu_turn_gate(struct vgpu_launch *l);
/* Whether a launch into s is captured (runs nothing now: neither gated nor
 * tracked). */
int vgpu_capturing(CUstream s);
void vgpu_turns_atfork_child(void);

/* ---- priority classes (priority.c) ------------------------------------------------ */
/* The job's own signal (NULL without a region of the daemon's). */
extern struct vgpu_signal *vgpu_g_signal;
/* Another job's signal segment, attached read-only when the daemon made it
 * (state.c); NULL when not. */
const struct vgpu_signal *vgpu_attach_signal(int id);
/* A launch on region device d at `now` of a job with lower classes beside
 * it: stamp its signal. */
void vgpu_prio_signal(int d, uint64_t now);
/* Before a launch on d of a job with higher classes beside it: wait while
 * they need the GPU; the time it went (now, if it did not wait). */
uint64_t vgpu_prio_hold(int d, uint64_t now, uint64_t kind);
void vgpu_priority_atfork_child(void);

/* ---- logging (log.c) -------------------------------------------------------- */
enum { VGPU_LOG_ERROR = 0, VGPU_LOG_WARN, VGPU_LOG_INFO, VGPU_LOG_DEBUG };
void vgpu_log(int level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Format a byte count the way users write it (512M, 1.5G). */
const char *vgpu_fmt_size(uint64_t n, char *buf, unsigned len);

/* ---- the clock (clock.c) ------------------------------------------------------ */
/* Read the clocksource once (the hook's first use); before, and where the
 * time-stamp counter isn't it, vgpu_now_ns is clock_gettime. */
void vgpu_clock_init(void);
/* CLOCK_MONOTONIC in ns; a thread's readings never go back. */
uint64_t vgpu_now_ns(void);
/* 1: vgpu_now_ns reads the time-stamp counter between anchors. */
int vgpu_clock_counts(void);

#endif /* VGPU_HOOK_H */
