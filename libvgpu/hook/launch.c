/*
 * launch.c - the compute gate on every kernel launch path the hook wraps
 * (hooks.def): cuLaunchKernel, cuLaunchKernelEx, cuLaunchCooperativeKernel,
 * cuGraphLaunch (and their _ptsz forms), cuLaunch, cuLaunchGrid and
 * cuLaunchGridAsync.
 *
 * Not throttled, no class to heed (limits.dev[d].throttle == 0, hold == 0):
 * one relaxed atomic add on the process's launch counter, then the real call
 * - no lock, no syscall, no clock read. A class to heed (hold != 0) is
 * priority.c's. Throttled: a lock-free token bucket in usage.dev[d] (tokens,
 * last_refill_ns), refilled lazily from CLOCK_MONOTONIC at the rate the
 * daemon writes; a launch takes VGPU_TOKEN_SCALE tokens. When the bucket is
 * empty only the launching thread waits, in naps of at most 5 ms that
 * re-read the rate, so a live change applies at once. The hook never talks
 * to the daemon here. A gate with no rate and no bucket is closed: the
 * daemon found the job's region tampered with, and launches fail with
 * CUDA_ERROR_NOT_PERMITTED.
 */
#define _GNU_SOURCE
#include <time.h>

#include "hook.h"

#define MAX_NAP_NS 5000000ull     /* 5 ms */
#define MIN_NAP_NS 20000ull       /* 20 us */

/* Add the tokens accrued since last_refill_ns, capped at the bucket size.
 * Whoever moves last_refill_ns forward (CAS) owns that interval's tokens. */
static void refill(struct vgpu_dev_usage *u, uint64_t rate, int64_t cap, uint64_t now)
{
    uint64_t last = __atomic_load_n(&u->last_refill_ns, __ATOMIC_ACQUIRE);
    if (now <= last)
        return;
    uint64_t elapsed = now - last;
    uint64_t add, next;
    if (rate == 0)
        return;
    unsigned __int128 t = (unsigned __int128)elapsed * rate / 1000000000u;
    if (t >= (unsigned __int128)cap) {
        add = (uint64_t)cap;   /* a full bucket's worth: start over from now */
        next = now;
    } else {
        add = (uint64_t)t;
        if (add == 0)
            return;
        /* advance by exactly the time those tokens took, keeping the rest */
        next = last + (uint64_t)((unsigned __int128)add * 1000000000u / rate);
    }
    if (!__atomic_compare_exchange_n(&u->last_refill_ns, &last, next, 0, __ATOMIC_ACQ_REL,
                                     __ATOMIC_RELAXED))
        return;   /* another thread refilled */
    int64_t cur = __atomic_load_n(&u->tokens, __ATOMIC_RELAXED);
    int64_t want;
    do {
        want = cur + (int64_t)add;
        if (want > cap || want < cur)
            want = cap > cur ? cap : cur;
    } while (!__atomic_compare_exchange_n(&u->tokens, &cur, want, 1, __ATOMIC_ACQ_REL,
                                          __ATOMIC_RELAXED));
}

/* 0 with a token taken (and counted in usage.dev[d].launches), or with the
 * gate lifted while we waited (not counted: the daemon bounds the gated
 * launches by the tokens it granted); -1 when the gate is closed. */
static __attribute__((noinline)) int take_token(int d)
{
    const struct vgpu_dev_limit *l = &vgpu_g_limits->dev[d];
    struct vgpu_dev_usage *u = &vgpu_g_usage->dev[d];
    for (;;) {
        if (!__atomic_load_n(&l->throttle, __ATOMIC_RELAXED))
            return 0;   /* throttling was lifted while we waited */
        uint64_t rate = __atomic_load_n(&l->refill_rate, __ATOMIC_RELAXED);
        uint64_t bucket = __atomic_load_n(&l->bucket_size, __ATOMIC_RELAXED);
        int64_t cap = bucket < VGPU_TOKEN_SCALE ? VGPU_TOKEN_SCALE
                      : bucket > INT64_MAX / 2  ? INT64_MAX / 2 : (int64_t)bucket;
        uint64_t now = vgpu_now_ns();
        if (VGPU_UNLIKELY(rate == 0 && bucket == 0)) {
            /* Closed by the daemon (the job tampered with its region): the
             * launch fails, whatever the bucket in the job's region says
             * (failing, not waiting: a job must still be able to stop). */
            vgpu_log(VGPU_LOG_ERROR, "the daemon closed this job's compute gate (see "
                     "region_error in vgpuctl ps --json); kernel launches fail");
            return -1;
        }
        refill(u, rate, cap, now);
        int64_t cur = __atomic_load_n(&u->tokens, __ATOMIC_RELAXED);
        /* The bucket is in the job's own region: more than it can hold was
         * written there, not granted. Take it back down (the daemon counts
         * gated launches against what it granted and catches the rest). */
        while (cur > cap && !__atomic_compare_exchange_n(&u->tokens, &cur, cap, 1,
                                                         __ATOMIC_ACQ_REL, __ATOMIC_RELAXED))
            ;
        if (cur > cap)
            cur = cap;
        while (cur >= VGPU_TOKEN_SCALE) {
            if (__atomic_compare_exchange_n(&u->tokens, &cur, cur - VGPU_TOKEN_SCALE, 1,
                                            __ATOMIC_ACQ_REL, __ATOMIC_RELAXED)) {
                /* counted at once: a launch the daemon sees took a token */
                __atomic_fetch_add(&u->launches, 1, __ATOMIC_RELAXED);
                return 0;
            }
        }
        /* about the time the missing tokens take to arrive, bounded */
        uint64_t need = (uint64_t)(VGPU_TOKEN_SCALE - (cur > 0 ? cur : 0));
        uint64_t nap = rate ? (uint64_t)((unsigned __int128)need * 1000000000u / rate)
                            : MAX_NAP_NS;
        if (nap > MAX_NAP_NS)
            nap = MAX_NAP_NS;
        if (nap < MIN_NAP_NS)
            nap = MIN_NAP_NS;
        struct timespec ts = {.tv_sec = 0, .tv_nsec = (long)nap};
        nanosleep(&ts, NULL);
        /* counted nap by nap, so the daemon sees a thread that is waiting */
        __atomic_fetch_add(&u->throttled_ns, vgpu_now_ns() - now, __ATOMIC_RELAXED);
    }
}

/* The slow path, before the launch: a class to heed, a token to take, or
 * both (w: throttle in the low half, hold in the high half). 0: launch,
 * *track set when the launch is to be tracked after it; -1: the gate is
 * closed. */
static __attribute__((noinline)) int gate_slow(int d, uint64_t w, CUstream s, int *track)
{
    uint32_t throttle = (uint32_t)w, hold = (uint32_t)(w >> 32);
    if (hold & VGPU_HOLD_SIGNAL)
        vgpu_prio_signal(d);
    if (hold & VGPU_HOLD_HELD)
        *track = vgpu_prio_hold(d, s);
    if (throttle && take_token(d) != 0)
        return -1;
    __atomic_fetch_add(&vgpu_g_slot->launches[d], 1, __ATOMIC_RELAXED);
    return 0;
}

typedef uint64_t __attribute__((may_alias)) gate_pair;
_Static_assert(__builtin_offsetof(struct vgpu_dev_limit, hold) ==
                   __builtin_offsetof(struct vgpu_dev_limit, throttle) + 4 &&
               __builtin_offsetof(struct vgpu_dev_limit, throttle) % 8 == 0,
               "throttle and hold make one aligned 64-bit word");
#if __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "gate_word reads throttle as the low half of its word"
#endif

/* The launch's device in *dev, and what it goes through there (0: the fast
 * path, the launch already counted; else gate_slow's word). */
static inline __attribute__((always_inline)) uint64_t gate_word(int *dev)
{
    int d = vgpu_dev_for_launch();
    *dev = d;
    if (VGPU_UNLIKELY(d < 0))
        return 0;
    /* throttle and hold side by side (region.h, 8-byte aligned): one load.
     * Little-endian: throttle in the low half. */
    const gate_pair *p = (const gate_pair *)&vgpu_g_limits->dev[d].throttle;
    uint64_t w = __atomic_load_n(p, __ATOMIC_RELAXED);
    if (VGPU_LIKELY(w == 0))
        __atomic_fetch_add(&vgpu_g_slot->launches[d], 1, __ATOMIC_RELAXED);
    return w;
}

/* A launch entry point: the fast path is the count and a tail call to the
 * driver; the slow path the gate, the call, and for a held launch the
 * record of its work in flight. `stream` is the stream it launches into
 * (for a _ptsz form, NULL is the calling thread's default stream), only
 * evaluated on the slow path. */
#define GATED(sym, args, stream) \
    do { \
        CU_PROLOGUE(sym, args); \
        int dev_; \
        uint64_t w_ = gate_word(&dev_); \
        if (VGPU_UNLIKELY(w_ != 0)) { \
            int track_ = 0; \
            CUstream s_ = (stream); \
            if (gate_slow(dev_, w_, s_, &track_) != 0) \
                return CUDA_ERROR_NOT_PERMITTED; \
            CUresult rc_ = REAL(sym) args; \
            if (track_ && rc_ == CUDA_SUCCESS) \
                vgpu_prio_track(dev_, s_); \
            return rc_; \
        } \
        return REAL(sym) args; \
    } while (0)

/* The per-thread default stream, for the _ptsz forms. */
static inline CUstream ptsz(CUstream s)
{
    return s ? s : CU_STREAM_PER_THREAD;
}

static inline CUstream config_stream(const CUlaunchConfig *config)
{
    return config ? config->hStream : NULL;
}

CUresult hook_cuLaunchKernel VGPU_LAUNCH_PARAMS
{
    GATED(cuLaunchKernel, VGPU_LAUNCH_ARGS, hStream);
}

CUresult hook_cuLaunchKernel_ptsz VGPU_LAUNCH_PARAMS
{
    GATED(cuLaunchKernel_ptsz, VGPU_LAUNCH_ARGS, ptsz(hStream));
}

CUresult hook_cuLaunchKernelEx(const CUlaunchConfig *config, CUfunction f, void **kernelParams,
                               void **extra)
{
    GATED(cuLaunchKernelEx, (config, f, kernelParams, extra), config_stream(config));
}

CUresult hook_cuLaunchKernelEx_ptsz(const CUlaunchConfig *config, CUfunction f,
                                    void **kernelParams, void **extra)
{
    GATED(cuLaunchKernelEx_ptsz, (config, f, kernelParams, extra),
          ptsz(config_stream(config)));
}

CUresult hook_cuLaunchCooperativeKernel VGPU_COOP_PARAMS
{
    GATED(cuLaunchCooperativeKernel, VGPU_COOP_ARGS, hStream);
}

CUresult hook_cuLaunchCooperativeKernel_ptsz VGPU_COOP_PARAMS
{
    GATED(cuLaunchCooperativeKernel_ptsz, VGPU_COOP_ARGS, ptsz(hStream));
}

CUresult hook_cuGraphLaunch(CUgraphExec hGraphExec, CUstream hStream)
{
    GATED(cuGraphLaunch, (hGraphExec, hStream), hStream);
}

CUresult hook_cuGraphLaunch_ptsz(CUgraphExec hGraphExec, CUstream hStream)
{
    GATED(cuGraphLaunch_ptsz, (hGraphExec, hStream), ptsz(hStream));
}

CUresult hook_cuLaunch(CUfunction f)
{
    GATED(cuLaunch, (f), NULL);
}

CUresult hook_cuLaunchGrid(CUfunction f, int grid_width, int grid_height)
{
    GATED(cuLaunchGrid, (f, grid_width, grid_height), NULL);
}

CUresult hook_cuLaunchGridAsync(CUfunction f, int grid_width, int grid_height, CUstream hStream)
{
    GATED(cuLaunchGridAsync, (f, grid_width, grid_height, hStream), hStream);
}
