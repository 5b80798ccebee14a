/*
 * reserve.c - the job's memory count: reserve before allocating, with a
 * compare-and-swap on the job's per-device total (usage->dev[d].used) that
 * never takes it past the limit, and give back exactly what was reserved.
 * The common case of both is inline in hook.h (vgpu_reserve, one
 * compare-and-swap that fits; vgpu_unreserve); here the rest. Also the
 * re-entrancy guard of the accounting wrappers.
 */
#define _GNU_SOURCE
#include <stdint.h>

#include "hook.h"

__thread int vgpu_t_inside __attribute__((tls_model("initial-exec")));

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
    __atomic_fetch_add(&vgpu_g_slot->used[d], bytes, __ATOMIC_RELAXED);
}

/* A slot whose process is gone (or exiting): its bytes leave the job. */
void vgpu_release_slot_memory(struct vgpu_proc_slot *slot)
{
    for (int d = 0; d < VGPU_MAX_DEVICES; d++) {
        uint64_t n = __atomic_exchange_n(&slot->used[d], 0, __ATOMIC_ACQ_REL);
        __atomic_store_n(&slot->ctx_bytes[d], 0, __ATOMIC_RELAXED);
        if (n != 0)
            vgpu_sub_sat(&vgpu_g_usage->dev[d].used, n);
    }
}
