/*
 * reserve.c - the job's memory count: reserve before allocating, with a
 * compare-and-swap on the job's per-device total (usage->dev[d].used) that
 * never takes it past the limit, and give back exactly what was reserved.
 * The common case of both is inline in hook.h (vgpu_reserve, one
 * compare-and-swap that fits; vgpu_unreserve); here the rest. Also the
 * process's own count in its slot, in lanes of one thread each (region.h),
 * and the re-entrancy guard of the accounting wrappers.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdint.h>

#include "hook.h"

__thread int vgpu_t_inside __attribute__((tls_model("initial-exec")));

/* ---- the process's count: lanes (region.h) ------------------------------------ */
__thread uint32_t vgpu_t_lane __attribute__((tls_model("initial-exec")));

#define NO_LANE UINT32_MAX   /* vgpu_t_lane: every lane was taken when it asked */

static uint32_t lanes_taken;         /* bit l: lane l has a thread */
static pthread_key_t lane_key;       /* its value: 1 + the thread's lane */
static pthread_once_t lane_once = PTHREAD_ONCE_INIT;
static int lane_key_made;

/* A thread that had a lane ended: the lane goes to the next thread that
 * asks, its words as they are (what the thread allocated is still held). */
static void lane_free(void *v)
{
    uint32_t l = (uint32_t)(uintptr_t)v;
    if (l - 1 < VGPU_SLOT_LANES)
        __atomic_fetch_and(&lanes_taken, ~(1u << (l - 1)), __ATOMIC_RELEASE);
}

static void lane_key_make(void)
{
    lane_key_made = pthread_key_create(&lane_key, lane_free) == 0;
}

/* A lane for the calling thread (1 + its index), or NO_LANE. */
static uint32_t lane_take(void)
{
    pthread_once(&lane_once, lane_key_make);
    if (!lane_key_made)
        return NO_LANE;   /* no key, no way to give a lane back at the thread's end */
    uint32_t taken = __atomic_load_n(&lanes_taken, __ATOMIC_RELAXED);
    for (;;) {
        uint32_t free_ = ~taken & ((1u << VGPU_SLOT_LANES) - 1);
        if (free_ == 0)
            return NO_LANE;
        uint32_t bit = free_ & -free_;
        if (__atomic_compare_exchange_n(&lanes_taken, &taken, taken | bit, 1, __ATOMIC_ACQUIRE,
                                        __ATOMIC_RELAXED)) {
            uint32_t l = (uint32_t)__builtin_ctz(bit) + 1;
            if (pthread_setspecific(lane_key, (void *)(uintptr_t)l) != 0) {
                lane_free((void *)(uintptr_t)l);
                return NO_LANE;
            }
            return l;
        }
    }
}

void vgpu_slot_add_slow(struct vgpu_proc_slot *s, int d, uint64_t delta)
{
    if (vgpu_t_lane == 0)
        vgpu_t_lane = lane_take();
    if (vgpu_t_lane != NO_LANE) {
        vgpu_slot_add(s, d, delta);
        return;
    }
    /* every lane has a thread: the shared word, with an atomic add; asked
     * again at the thread's next change (a lane may have come free) */
    __atomic_fetch_add(&s->used[d], delta, __ATOMIC_RELAXED);
    vgpu_t_lane = 0;
}

uint64_t vgpu_slot_used(const struct vgpu_proc_slot *s, int d)
{
    uint64_t n = __atomic_load_n(&s->used[d], __ATOMIC_RELAXED);
    for (int l = 0; l < VGPU_SLOT_LANES; l++)
        n += __atomic_load_n(&s->lane_used[l][d], __ATOMIC_RELAXED);
    return (int64_t)n < 0 ? 0 : n;
}

/* The child of a fork is one thread in a new slot: every lane is free, its
 * thread has none. */
void vgpu_lanes_atfork_child(void)
{
    __atomic_store_n(&lanes_taken, 0, __ATOMIC_RELAXED);
    vgpu_t_lane = 0;
    if (lane_key_made)
        pthread_setspecific(lane_key, NULL);
}

uint64_t vgpu_job_used(int d)
{
    return __atomic_load_n(&vgpu_g_usage->dev[d].used, __ATOMIC_ACQUIRE);
}

uint64_t vgpu_dev_limit(int d)
{
    return __atomic_load_n(&vgpu_g_limits->dev[d].mem_limit, __ATOMIC_RELAXED);
}

/* Reserve `bytes` on region device d for this process; 1 on success. A
 * refusal sweeps dead processes' slots first and retries once. The whole
 * procedure, for what vgpu_reserve (hook.h) does not settle inline. */
int vgpu_reserve_slow(int d, uint64_t bytes, int is_ctx, const char *what)
{
    char a[32], b[32], c[32];
    if (d < 0) {
        vgpu_log(VGPU_LOG_WARN, "%s refused: the current GPU is not one of the job's GPUs",
                 what);
        return 0;
    }
    struct vgpu_dev_usage *u = &vgpu_g_usage->dev[d];
    uint64_t cur = 0, limit = 0;
    for (int attempt = 0;; attempt++) {
        limit = vgpu_dev_limit(d);
        cur = __atomic_load_n(&u->used, __ATOMIC_RELAXED);
        int fits;
        for (;;) {
            fits = limit == 0 ? bytes <= UINT64_MAX - cur : (bytes <= limit && cur <= limit - bytes);
            if (!fits || __atomic_compare_exchange_n(&u->used, &cur, cur + bytes, 1,
                                                     __ATOMIC_ACQ_REL, __ATOMIC_RELAXED))
                break;
        }
        if (fits)
            break;
        if (attempt == 0 && vgpu_sweep() != 0)
            continue;
        __atomic_fetch_add(&u->oom_refusals, 1, __ATOMIC_RELAXED);
        /* The first refusal is a warning, so that a CUDA out-of-memory error
         * at half a GPU's memory comes with the job's limit and what holds
         * it; later ones only at debug (a training loop retries). */
        static int told;
        int first = !__atomic_exchange_n(&told, 1, __ATOMIC_RELAXED);
        vgpu_log(first ? VGPU_LOG_WARN : VGPU_LOG_DEBUG,
                 "%s of %s refused (CUDA_ERROR_OUT_OF_MEMORY): the job holds %s of its "
                 "%s limit on %s, CUDA contexts included; said once per process", what,
                 vgpu_fmt_size(bytes, a, sizeof(a)), vgpu_fmt_size(cur, b, sizeof(b)),
                 vgpu_fmt_size(limit, c, sizeof(c)), vgpu_dev_uuid(d));
        return 0;
    }
    vgpu_reserved(d, cur + bytes, bytes, is_ctx);
    return 1;
}

void vgpu_reserve_anyway(int d, uint64_t bytes)
{
    if (d < 0 || bytes == 0)
        return;
    struct vgpu_dev_usage *u = &vgpu_g_usage->dev[d];
    uint64_t now = __atomic_add_fetch(&u->used, bytes, __ATOMIC_ACQ_REL);
    uint64_t peak = __atomic_load_n(&u->peak, __ATOMIC_RELAXED);
    while (now > peak && !__atomic_compare_exchange_n(&u->peak, &peak, now, 1, __ATOMIC_RELAXED,
                                                      __ATOMIC_RELAXED))
        ;
    vgpu_slot_add(vgpu_g_slot, d, bytes);
}

/* A slot whose process is gone (or exiting): its bytes leave the job.
 * Returns how many. */
uint64_t vgpu_release_slot_memory(struct vgpu_proc_slot *slot)
{
    uint64_t freed = 0;
    for (int d = 0; d < VGPU_MAX_DEVICES; d++) {
        uint64_t n = __atomic_exchange_n(&slot->used[d], 0, __ATOMIC_ACQ_REL);
        for (int l = 0; l < VGPU_SLOT_LANES; l++)
            n += __atomic_exchange_n(&slot->lane_used[l][d], 0, __ATOMIC_ACQ_REL);
        __atomic_store_n(&slot->ctx_bytes[d], 0, __ATOMIC_RELAXED);
        if ((int64_t)n > 0) {
            vgpu_sub_sat(&vgpu_g_usage->dev[d].used, n);
            freed += n;
        }
    }
    return freed;
}
