/*
 * launch.c - the compute gate on every kernel launch path the hook wraps
 * (hooks.def): cuLaunchKernel, cuLaunchKernelEx, cuLaunchCooperativeKernel,
 * cuGraphLaunch (and their _ptsz forms), cuLaunch, cuLaunchGrid and
 * cuLaunchGridAsync.
 *
 * Not throttled (limits.dev[d].throttle == 0): one relaxed atomic add on the
 * process's launch counter, then the real call - no lock, no syscall, no
 * clock read. Throttled: a lock-free token bucket in usage.dev[d] (tokens,
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

/* 0: launch; -1: the gate is closed. */
static inline __attribute__((always_inline)) int gate(void)
{
    int d = vgpu_dev_for_launch();
    if (VGPU_UNLIKELY(d < 0))
        return 0;
    if (VGPU_UNLIKELY(__atomic_load_n(&vgpu_g_limits->dev[d].throttle, __ATOMIC_RELAXED)) &&
        take_token(d) != 0)
        return -1;
    __atomic_fetch_add(&vgpu_g_slot->launches[d], 1, __ATOMIC_RELAXED);
    return 0;
}

#define GATED(sym, args) \
    do { \
        CU_PROLOGUE(sym, args); \
        if (VGPU_UNLIKELY(gate() != 0)) \
            return CUDA_ERROR_NOT_PERMITTED; \
        return REAL(sym) args; \
    } while (0)

CUresult hook_cuLaunchKernel VGPU_LAUNCH_PARAMS
{
    GATED(cuLaunchKernel, VGPU_LAUNCH_ARGS);
}

CUresult hook_cuLaunchKernel_ptsz VGPU_LAUNCH_PARAMS
{
    GATED(cuLaunchKernel_ptsz, VGPU_LAUNCH_ARGS);
}

CUresult hook_cuLaunchKernelEx(const CUlaunchConfig *config, CUfunction f, void **kernelParams,
                               void **extra)
{
    GATED(cuLaunchKernelEx, (config, f, kernelParams, extra));
}

CUresult hook_cuLaunchKernelEx_ptsz(const CUlaunchConfig *config, CUfunction f,
                                    void **kernelParams, void **extra)
{
    GATED(cuLaunchKernelEx_ptsz, (config, f, kernelParams, extra));
}

CUresult hook_cuLaunchCooperativeKernel VGPU_COOP_PARAMS
{
    GATED(cuLaunchCooperativeKernel, VGPU_COOP_ARGS);
}

CUresult hook_cuLaunchCooperativeKernel_ptsz VGPU_COOP_PARAMS
{
    GATED(cuLaunchCooperativeKernel_ptsz, VGPU_COOP_ARGS);
}

CUresult hook_cuGraphLaunch(CUgraphExec hGraphExec, CUstream hStream)
{
    GATED(cuGraphLaunch, (hGraphExec, hStream));
}

CUresult hook_cuGraphLaunch_ptsz(CUgraphExec hGraphExec, CUstream hStream)
{
    GATED(cuGraphLaunch_ptsz, (hGraphExec, hStream));
}

CUresult hook_cuLaunch(CUfunction f)
{
    GATED(cuLaunch, (f));
}

CUresult hook_cuLaunchGrid(CUfunction f, int grid_width, int grid_height)
{
    GATED(cuLaunchGrid, (f, grid_width, grid_height));
}

CUresult hook_cuLaunchGridAsync(CUfunction f, int grid_width, int grid_height, CUstream hStream)
{
    GATED(cuLaunchGridAsync, (f, grid_width, grid_height, hStream));
}
