/*
 * launch.c - the compute gate on every kernel launch path the hook wraps
 * (hooks.def): cuLaunchKernel, cuLaunchKernelEx, cuLaunchCooperativeKernel,
 * cuGraphLaunch (and their _ptsz forms), cuLaunch, cuLaunchGrid and
 * cuLaunchGridAsync.
 *
 * Not gated, no class to heed (limits.dev[d].throttle == VGPU_GATE_OPEN,
 * hold == 0): one relaxed atomic add on the process's launch counter, then
 * the real call - no lock, no syscall, no clock read. Otherwise the slow
 * path: the classes (priority.c), the turns (turns.c), the launch, and a
 * mark after it that measures its GPU time (flight.c). The hook never talks
 * to the daemon here. A closed gate (the daemon found the job's region
 * tampered with) fails the launch with CUDA_ERROR_NOT_PERMITTED.
 */
#define _GNU_SOURCE
#include <time.h>

#include "hook.h"

/* The slow path, before the launch: a class to heed, turns to keep, or
 * both (w: throttle in the low half, hold in the high half). VGPU_GO_*:
 * VGPU_GO_CLOSED fails the launch; VGPU_GO_UNTRACKED launches it as it is
 * (a captured launch runs nothing now); the others launch and mark it. */
static int closed(void)
{
    vgpu_log(VGPU_LOG_ERROR, "the daemon closed this job's compute gate (see "
             "region_error in vgpuctl ps --json); kernel launches fail");
    return VGPU_GO_CLOSED;
}

static CUcontext current_ctx(void)
{
    CUcontext ctx = NULL;
    if (REAL(cuCtxGetCurrent)(&ctx) != CUDA_SUCCESS)
        return NULL;
    return ctx;
}

static __attribute__((noinline)) int gate_slow(uint64_t w, struct vgpu_launch *l)
{
    int d = l->d;
    uint32_t throttle = (uint32_t)w, hold = (uint32_t)(w >> 32);
    __atomic_fetch_add(&vgpu_g_slot->launches[d], 1, __ATOMIC_RELAXED);
    if (VGPU_UNLIKELY(throttle == VGPU_GATE_CLOSED))
        return closed();
    if (vgpu_capturing(l->s))
        return VGPU_GO_UNTRACKED;
    l->ctx = current_ctx();
    l->now = vgpu_now_ns();
    if (hold & VGPU_HOLD_SIGNAL)
        vgpu_prio_signal(d, l->now);
    if (hold & VGPU_HOLD_HELD)
        l->now = vgpu_prio_hold(d, l->now, l->kind);
    if (throttle != VGPU_GATE_TURNS) {
        vgpu_flight_begin(l);
        return VGPU_GO_OWN;
    }
    int go = vgpu_turn_gate(l);   /* the stretch begun too, if it goes */
    if (go == VGPU_GO_CLOSED)     /* closed while it waited for its turn */
        return closed();
    return go;
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

/* A launch's kind: its function (or graph) and its shape, hashed (never 0).
 * The same kernel at the same shape takes about the same time from one step
 * of a program to the next; flight.c learns a cost for each kind. */
static inline uint64_t kind_of(const void *fn, uint64_t gx, uint64_t gy, uint64_t gz,
                               uint64_t block, uint64_t shm)
{
    /* each part by its own odd constant (the products side by side, not
     * one after another), then mixed once */
    uint64_t k = (uint64_t)(uintptr_t)fn ^ gx * 0x9E3779B97F4A7C15ull ^
                 gy * 0xC2B2AE3D27D4EB4Full ^ gz * 0x165667B19E3779F9ull ^
                 block * 0xD6E8FEB86659FD93ull ^ shm * 0xFF51AFD7ED558CCDull;
    k ^= k >> 32;
    k *= 0x9E3779B97F4A7C15ull;
    k ^= k >> 29;
    return k ? k : 1;
}

#define LAUNCH_KIND(f, c) \
    kind_of((f), (c)->gridDimX, (c)->gridDimY, (c)->gridDimZ, \
            (uint64_t)(c)->blockDimX * (c)->blockDimY * (c)->blockDimZ, (c)->sharedMemBytes)

/* A launch entry point: the fast path is the count and a tail call to the
 * driver; the slow path the gate, the call, and the mark of its
 * work in flight (flight.c). `stream` is the stream it launches into
 * (for a _ptsz form, NULL is the calling thread's default stream) and
 * `kind` its kind, both only evaluated on the slow path. */
#define GATED(sym, args, stream, kind_expr) \
    do { \
        CU_PROLOGUE(sym, args); \
        int dev_; \
        uint64_t w_ = gate_word(&dev_); \
        if (VGPU_UNLIKELY(w_ != 0)) { \
            struct vgpu_launch l_ = {.d = dev_, .s = (stream), .kind = (kind_expr)}; \
            int go_ = gate_slow(w_, &l_); \
            if (go_ == VGPU_GO_CLOSED) \
                return CUDA_ERROR_NOT_PERMITTED; \
            CUresult rc_ = REAL(sym) args; \
            if (go_ != VGPU_GO_UNTRACKED && rc_ == CUDA_SUCCESS) \
                vgpu_flight_track(&l_, go_ == VGPU_GO_OWN); \
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

/* The kind of a launch given its grid and block one by one. */
#define GRID_KIND(f) \
    kind_of((f), gridDimX, gridDimY, gridDimZ, \
            (uint64_t)blockDimX * blockDimY * blockDimZ, sharedMemBytes)

static inline uint64_t config_kind(const CUlaunchConfig *config, CUfunction f)
{
    return config ? LAUNCH_KIND(f, config) : kind_of(f, 0, 0, 0, 0, 0);
}

CUresult hook_cuLaunchKernel VGPU_LAUNCH_PARAMS
{
    GATED(cuLaunchKernel, VGPU_LAUNCH_ARGS, hStream, GRID_KIND(f));
}

CUresult hook_cuLaunchKernel_ptsz VGPU_LAUNCH_PARAMS
{
    GATED(cuLaunchKernel_ptsz, VGPU_LAUNCH_ARGS, ptsz(hStream), GRID_KIND(f));
}

CUresult hook_cuLaunchKernelEx(const CUlaunchConfig *config, CUfunction f, void **kernelParams,
                               void **extra)
{
    GATED(cuLaunchKernelEx, (config, f, kernelParams, extra), config_stream(config),
          config_kind(config, f));
}

CUresult hook_cuLaunchKernelEx_ptsz(const CUlaunchConfig *config, CUfunction f,
                                    void **kernelParams, void **extra)
{
    GATED(cuLaunchKernelEx_ptsz, (config, f, kernelParams, extra),
          ptsz(config_stream(config)), config_kind(config, f));
}

CUresult hook_cuLaunchCooperativeKernel VGPU_COOP_PARAMS
{
    GATED(cuLaunchCooperativeKernel, VGPU_COOP_ARGS, hStream, GRID_KIND(f));
}

CUresult hook_cuLaunchCooperativeKernel_ptsz VGPU_COOP_PARAMS
{
    GATED(cuLaunchCooperativeKernel_ptsz, VGPU_COOP_ARGS, ptsz(hStream), GRID_KIND(f));
}

CUresult hook_cuGraphLaunch(CUgraphExec hGraphExec, CUstream hStream)
{
    GATED(cuGraphLaunch, (hGraphExec, hStream), hStream, kind_of(hGraphExec, 0, 0, 0, 0, 0));
}

CUresult hook_cuGraphLaunch_ptsz(CUgraphExec hGraphExec, CUstream hStream)
{
    GATED(cuGraphLaunch_ptsz, (hGraphExec, hStream), ptsz(hStream),
          kind_of(hGraphExec, 0, 0, 0, 0, 0));
}

CUresult hook_cuLaunch(CUfunction f)
{
    GATED(cuLaunch, (f), NULL, kind_of(f, 1, 1, 1, 0, 0));
}

CUresult hook_cuLaunchGrid(CUfunction f, int grid_width, int grid_height)
{
    GATED(cuLaunchGrid, (f, grid_width, grid_height), NULL,
          kind_of(f, (unsigned)grid_width, (unsigned)grid_height, 1, 0, 0));
}

CUresult hook_cuLaunchGridAsync(CUfunction f, int grid_width, int grid_height, CUstream hStream)
{
    GATED(cuLaunchGridAsync, (f, grid_width, grid_height, hStream), hStream,
          kind_of(f, (unsigned)grid_width, (unsigned)grid_height, 1, 0, 0));
}
