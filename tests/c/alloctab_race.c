/*
 * alloctab_race.c - the process's allocation table (libvgpu/hook/alloctab.c)
 * on its own, alone and under threads. Built with alloctab.c by
 * tests/hook/test_alloctab.py.
 *
 * Every entry's size is a token of its own, so that what comes out of the
 * table (a free's entry, the old entry a track replaced, a context's sweep)
 * can be counted: each token put in must come out exactly once, and each
 * free of a pointer the table holds must find it.
 *
 * The first cases run before any thread exists (the table then takes its
 * slots with plain stores, as glibc's locks do in a process of one thread);
 * the rest with threads started, where it takes them with compare-and-swap:
 *
 *   double_frees      threads free one pointer at once, round after round:
 *                     exactly one of them gets it
 *   held_is_waited    one thread keeps replacing a pointer's entry while
 *                     another frees and re-tracks it (as a free the driver
 *                     refused does): every free finds it
 *   sweep_beside      a context's sweep while other threads allocate and free
 *                     in another context: the sweep gives back exactly its
 *                     context's entries, the frees always find theirs
 *   many_crossed      threads track more pointers than the buckets hold
 *                     (spilling into the sharded tables), then free each
 *                     other's
 *
 * Prints "ok NAME" or "FAIL NAME<tab>what" per case, then "cases N failed
 * F"; exits 1 when a case failed.
 */
#define _GNU_SOURCE
#include <inttypes.h>
#include <pthread.h>
#include <sched.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hook.h"

#define THREADS 4
#define BASE 0x7f3a00000000ull
#define CTX(n) ((CUcontext)(uintptr_t)(0x1000 * (n)))

static int n_cases, n_failed;
static char why[512];

static void fail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void fail(const char *fmt, ...)
{
    if (why[0])
        return;   /* the first reason is the one told */
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, sizeof(why), fmt, ap);
    va_end(ap);
}

static void report(const char *name)
{
    n_cases++;
    if (why[0]) {
        n_failed++;
        printf("FAIL %s\t%s\n", name, why);
    } else {
        printf("ok %s\n", name);
    }
    fflush(stdout);
    why[0] = '\0';
}

/* A pointer as the driver hands them out: 512-byte aligned, spread. */
static uint64_t ptr_of(uint64_t i)
{
    return BASE + i * 0x200ull + (i / 7) * 0x200000ull;
}

/* ---- tokens: each entry's size, counted as they come out ------------------- */
#define MAX_TOKENS (1u << 23)
static uint32_t *outs;          /* times each token came out */
static uint64_t next_token = 1;

static uint64_t token(void)
{
    return __atomic_fetch_add(&next_token, 1, __ATOMIC_RELAXED);
}

static void came_out(uint64_t t)
{
    if (t == 0 || t >= MAX_TOKENS) {
        fail("a size that is no token came out: %" PRIu64, t);
        return;
    }
    __atomic_fetch_add(&outs[t], 1, __ATOMIC_RELAXED);
}

/* Every token handed out so far came out exactly once. */
static void tokens_balance(void)
{
    uint64_t n = __atomic_load_n(&next_token, __ATOMIC_RELAXED);
    for (uint64_t t = 1; t < n; t++)
        if (outs[t] != 1) {
            fail("token %" PRIu64 " came out %u times", t, outs[t]);
            return;
        }
}

static void tokens_reset(void)
{
    memset(outs, 0, MAX_TOKENS * sizeof(*outs));
    next_token = 1;
}

static void track(uint64_t key, uint64_t tok, int dev, CUcontext ctx)
{
    struct vgpu_alloc old;
    int r = vgpu_track(VGPU_K_PTR, key, tok, dev, ctx, &old);
    if (r < 0)
        fail("track of %#" PRIx64 ": no memory", key);
    else if (r == 1)
        came_out(old.size);
}

/* Take the pointer out; its token, or 0 when it was not there. */
static uint64_t untrack(uint64_t key)
{
    struct vgpu_alloc e;
    if (!vgpu_untrack(VGPU_K_PTR, key, &e))
        return 0;
    if (e.key != key || e.kind != VGPU_K_PTR)
        fail("untrack of %#" PRIx64 " gave key %#" PRIx64 " kind %u", key, e.key, e.kind);
    came_out(e.size);
    return e.size;
}

/* Sweep a context; the sum of its entries' sizes (tokens counted out). No
 * entry is told apart here, so the sweep's sum is checked by the caller. */
static uint64_t sweep(CUcontext ctx, int dev)
{
    uint64_t per_dev[VGPU_MAX_DEVICES] = {0};
    vgpu_untrack_ctx(ctx, per_dev);
    for (int d = 0; d < VGPU_MAX_DEVICES; d++)
        if (d != dev && per_dev[d] != 0)
            fail("a sweep of device %d's context gave back %" PRIu64 " on device %d", dev,
                 per_dev[d], d);
    return per_dev[dev];
}

/* ---- alone ------------------------------------------------------------------ */
static void case_basics(void)
{
    uint64_t k = ptr_of(1);
    struct vgpu_alloc e;
    uint64_t t1 = token(), t2 = token();
    if (vgpu_track(VGPU_K_PTR, k, t1, 3, CTX(1), &e) != 0)
        fail("a new pointer was not new");
    if (vgpu_track(VGPU_K_PTR, k, t2, 3, CTX(1), &e) != 1 || e.size != t1 || e.dev != 3 ||
        e.ctx != CTX(1) || e.kind != VGPU_K_PTR || e.refs != 1 || e.maps != 0 || e.aux != 0)
        fail("tracking a pointer again did not hand back its old entry");
    else
        came_out(t1);
    /* another kind with the same key is another entry */
    uint64_t t3 = token();
    if (vgpu_track(VGPU_K_ARRAY, k, t3, 3, CTX(1), &e) != 0)
        fail("an array of the same value as a pointer replaced it");
    if (untrack(k) != t2)
        fail("the pointer's entry is not its last");
    if (untrack(k) != 0)
        fail("a pointer was taken out twice");
    if (!vgpu_untrack(VGPU_K_ARRAY, k, &e) || e.size != t3)
        fail("the array went with the pointer");
    else
        came_out(t3);
    /* pointers that can't be keys of the buckets: 0 and odd ones */
    uint64_t odd = ptr_of(2) | 1, t4 = token(), t5 = token(), t6 = token();
    track(0, t4, 0, CTX(1));
    track(odd, t5, 0, CTX(1));
    track(odd, t6, 0, CTX(1));
    if (untrack(0) != t4 || untrack(odd) != t6 || untrack(odd) != 0)
        fail("a null or odd pointer was not kept");
    tokens_balance();
}

/* More pointers than the buckets hold: the rest spill into the sharded
 * tables; a pointer tracked again is found wherever it is, and a context's
 * sweep finds its pointers in both, and gives back exactly theirs. */
static void case_spill_sweep(void)
{
    enum { N = 60000 };
    static uint64_t tok[N];
    uint64_t want[2] = {0, 0};
    for (uint64_t i = 0; i < N; i++) {
        tok[i] = token();
        track(ptr_of(i), tok[i], (int)(i % 2), CTX(1 + i % 2));
    }
    for (uint64_t i = 0; i < N; i += 3)
        if (untrack(ptr_of(i)) != tok[i])
            fail("pointer %" PRIu64 " of %d: wrong entry", i, N);
    for (uint64_t i = 1; i < N; i++) {
        if (i % 3 == 0)
            continue;
        struct vgpu_alloc old;
        uint64_t t = token();
        int r = vgpu_track(VGPU_K_PTR, ptr_of(i), t, (int)(i % 2), CTX(1 + i % 2), &old);
        if (r != 1 || old.size != tok[i])
            fail("pointer %" PRIu64 " tracked again: %d, old %" PRIu64 " not %" PRIu64, i, r,
                 old.size, tok[i]);
        else
            came_out(old.size);
        tok[i] = t;
        want[i % 2] += t;
    }
    for (int c = 0; c < 2; c++) {
        uint64_t got = sweep(CTX(1 + c), c);
        if (got != want[c])
            fail("the sweep of context %d gave back %" PRIu64 ", its entries hold %" PRIu64, c,
                 got, want[c]);
    }
    for (uint64_t i = 0; i < N; i++) {
        if (i % 3 != 0)
            came_out(tok[i]);   /* swept */
        if (untrack(ptr_of(i)) != 0)
            fail("pointer %" PRIu64 " outlived its context's sweep", i);
    }
    tokens_balance();
}

/* ---- threads ------------------------------------------------------------------ */
static uint64_t gate_n;   /* threads arrived, times rounds */

/* All THREADS + 1 threads meet here for round r (1, 2, ...). */
static void meet(uint64_t r)
{
    __atomic_fetch_add(&gate_n, 1, __ATOMIC_ACQ_REL);
    while (__atomic_load_n(&gate_n, __ATOMIC_ACQUIRE) < r * (THREADS + 1))
        sched_yield();   /* fewer cores than threads, often */
}

enum { ROUNDS = 20000 };
static uint64_t round_key[ROUNDS], round_tok[ROUNDS];
static uint32_t round_got[ROUNDS];

static void *double_freer(void *arg)
{
    (void)arg;
    for (uint64_t r = 0; r < ROUNDS; r++) {
        meet(2 * r + 1);
        uint64_t t = untrack(round_key[r]);
        if (t != 0) {
            __atomic_fetch_add(&round_got[r], 1, __ATOMIC_RELAXED);
            if (t != round_tok[r])
                fail("round %" PRIu64 ": a free got token %" PRIu64 ", not %" PRIu64, r, t,
                     round_tok[r]);
        }
        meet(2 * r + 2);
    }
    return NULL;
}

static void case_double_frees(void)
{
    pthread_t th[THREADS];
    gate_n = 0;
    for (int i = 0; i < THREADS; i++)
        pthread_create(&th[i], NULL, double_freer, NULL);
    for (uint64_t r = 0; r < ROUNDS; r++) {
        round_key[r] = ptr_of(r % 64);
        round_tok[r] = token();
        track(round_key[r], round_tok[r], 0, CTX(1));
        meet(2 * r + 1);
        meet(2 * r + 2);
        if (round_got[r] != 1)   /* the threads go on meeting: no break */
            fail("round %" PRIu64 ": %u of %d frees at once got the pointer", r, round_got[r],
                 THREADS);
    }
    for (int i = 0; i < THREADS; i++)
        pthread_join(th[i], NULL);
    tokens_balance();
}

static int stop;
#define HELD_KEY ptr_of(5)

/* Keeps tracking the pointer again (replacing its entry). */
static void *replacer(void *arg)
{
    (void)arg;
    for (int n = 0; n < 2000000 && !__atomic_load_n(&stop, __ATOMIC_RELAXED); n++)
        track(HELD_KEY, token(), 0, CTX(1));
    return NULL;
}

static void case_held_is_waited(void)
{
    enum { FREES = 300000 };
    pthread_t th[2];
    stop = 0;
    track(HELD_KEY, token(), 0, CTX(1));
    for (int i = 0; i < 2; i++)
        pthread_create(&th[i], NULL, replacer, NULL);
    /* the pointer is always there when this thread frees it: the others
     * only replace it, and this one puts it back after each free */
    for (int i = 0; i < FREES && !why[0]; i++) {
        if (untrack(HELD_KEY) == 0) {
            fail("free %d of a pointer in the table did not find it", i);
            break;
        }
        track(HELD_KEY, token(), 0, CTX(1));
    }
    __atomic_store_n(&stop, 1, __ATOMIC_RELAXED);
    for (int i = 0; i < 2; i++)
        pthread_join(th[i], NULL);
    untrack(HELD_KEY);
    tokens_balance();
}

/* Allocate and free in CTX(1) on device 1, each thread its own pointers. */
static void *allocator(void *arg)
{
    uint64_t base = 100000 + 1000 * (uint64_t)(uintptr_t)arg;
    for (uint64_t n = 0; n < 1000000 && !__atomic_load_n(&stop, __ATOMIC_RELAXED); n++) {
        uint64_t k = ptr_of(base + n % 200), t = token();
        track(k, t, 1, CTX(1));
        uint64_t got = untrack(k);
        if (got != t)
            fail("a free in one context beside another's sweep got %" PRIu64 ", not %" PRIu64,
                 got, t);
    }
    return NULL;
}

static void case_sweep_beside(void)
{
    enum { SWEEPS = 3000, BATCH = 40 };
    pthread_t th[THREADS - 1];
    stop = 0;
    for (uint64_t i = 0; i < THREADS - 1; i++)
        pthread_create(&th[i], NULL, allocator, (void *)(uintptr_t)i);
    for (int s = 0; s < SWEEPS && !why[0]; s++) {
        uint64_t want = 0, tok[BATCH];
        for (int i = 0; i < BATCH; i++) {
            tok[i] = token();
            want += tok[i];
            track(ptr_of(500000 + (uint64_t)(s % 3) * BATCH + (uint64_t)i), tok[i], 2, CTX(2));
        }
        uint64_t got = sweep(CTX(2), 2);
        if (got != want)
            fail("sweep %d of a context gave back %" PRIu64 ", its entries hold %" PRIu64, s, got,
                 want);
        for (int i = 0; i < BATCH; i++)
            came_out(tok[i]);
    }
    __atomic_store_n(&stop, 1, __ATOMIC_RELAXED);
    for (int i = 0; i < THREADS - 1; i++)
        pthread_join(th[i], NULL);
    tokens_balance();
}

enum { PER_THREAD = 30000 };
static uint64_t many_tok[THREADS][PER_THREAD];

static void *many(void *arg)
{
    unsigned me = (unsigned)(uintptr_t)arg, other = (me + 1) % THREADS;
    for (uint64_t i = 0; i < PER_THREAD; i++) {
        many_tok[me][i] = token();
        track(ptr_of(1000000 + me * PER_THREAD + i), many_tok[me][i], (int)me, CTX(3));
    }
    meet(1);
    for (uint64_t i = 0; i < PER_THREAD; i++) {
        uint64_t got = untrack(ptr_of(1000000 + other * PER_THREAD + i));
        if (got != many_tok[other][i])
            fail("thread %u's pointer %" PRIu64 ", freed by another: %" PRIu64 " not %" PRIu64,
                 other, i, got, many_tok[other][i]);
    }
    return NULL;
}

static void case_many_crossed(void)
{
    pthread_t th[THREADS];
    gate_n = 0;
    for (uint64_t i = 0; i < THREADS; i++)
        pthread_create(&th[i], NULL, many, (void *)(uintptr_t)i);
    meet(1);
    for (int i = 0; i < THREADS; i++)
        pthread_join(th[i], NULL);
    if (sweep(CTX(3), 0) != 0)
        fail("pointers were left over");
    tokens_balance();
}

int main(void)
{
    outs = calloc(MAX_TOKENS, sizeof(*outs));
    if (outs == NULL)
        return 2;
    case_basics();
    report("basics");
    tokens_reset();
    case_spill_sweep();
    report("spill_sweep");
    /* from here on the process has threads */
    tokens_reset();
    case_double_frees();
    report("double_frees");
    tokens_reset();
    case_held_is_waited();
    report("held_is_waited");
    tokens_reset();
    case_sweep_beside();
    report("sweep_beside");
    tokens_reset();
    case_many_crossed();
    report("many_crossed");
    printf("cases %d failed %d\n", n_cases, n_failed);
    return n_failed ? 1 : 0;
}
