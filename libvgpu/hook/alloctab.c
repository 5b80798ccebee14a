/*
 * alloctab.c - the process's allocations: (kind, handle) -> what was
 * reserved for it, on which device, in which context. So a free gives back
 * exactly its reservation, and a destroyed context everything made in it.
 *
 * Device pointers (cuMemAlloc_v2 and the others of VGPU_K_PTR: what a
 * training loop allocates and frees) are kept without a lock, in buckets of
 * BUCKET slots: a pointer's bucket is a multiplicative hash of it, and it
 * may take any slot there. A slot's key word says what the slot holds: 0
 * nothing, a pointer, or a pointer with its low bit set (HELD) while one
 * thread holds the slot to fill it, take it out, or read its context. A
 * slot is taken with one compare-and-swap (0 -> key|HELD to fill it, key ->
 * key|HELD to take it out), its value written or read while held, and let
 * go with a store (the key, or 0) that releases it. A thread that finds the
 * pointer it looks for held waits for the holder's few stores, so a pointer
 * that is in the table is always found: two frees of one pointer at once
 * take it out once, and a destroyed context's sweep never hides one from a
 * free. A bucket is 128 bytes, two cache lines (its keys first). Four slots
 * a bucket, not eight: an allocation looks through the keys of its bucket
 * (a pointer the driver hands out again may still be there), and four take
 * half the time; 4096 buckets hold as many pointers as 2048 of eight.
 * In a process of one thread (glibc's __libc_single_threaded, as its own
 * locks use it) there is no other thread to race with: a slot is taken with
 * a load and a store.
 *
 * A pointer whose bucket is full (or a pointer that can't be a key: 0, or
 * odd), and every other kind (arrays, VMM handles and their mappings), is
 * kept in the sharded tables: open addressing with linear probing, 64
 * shards each with its own lock, keyed by a hash of the handle. `spilled`
 * counts the pointers there, so that a free of a pointer not in its bucket
 * looks there only when there are any. A pointer is in one of the two.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <stdlib.h>
#include <sys/mman.h>

#include "hook.h"

/* ---- device pointers, without a lock ---------------------------------------------- */
#define FAST_BUCKET_BITS 12
#define FAST_BUCKETS (1u << FAST_BUCKET_BITS)   /* 4096 x 4 slots: 512 KiB */
#define BUCKET 4u
#define HELD 1ull

struct fast_val {
    uint64_t size;
    CUcontext ctx;
    int64_t dev;
};

struct bucket {
    uint64_t key[BUCKET];   /* 0, a pointer, or a pointer | HELD */
    struct fast_val val[BUCKET];
};

_Static_assert(sizeof(struct bucket) == 128, "a bucket: two cache lines");

static struct bucket *fast;   /* FAST_BUCKETS, mapped at the first pointer; NULL: none yet */
static uint32_t spilled;      /* VGPU_K_PTR entries in the sharded tables */

/* glibc (2.32 on): non-zero while the process has never had a second
 * thread; pthread_create clears it before the thread exists. Absent
 * elsewhere: never alone. */
extern char __libc_single_threaded __attribute__((weak));

static int alone(void)
{
    return &__libc_single_threaded != NULL && __libc_single_threaded;
}

static int fast_key(uint64_t key)
{
    return key != 0 && (key & HELD) == 0;
}

static struct bucket *bucket_of(struct bucket *t, uint64_t key)
{
    return &t[(key * 0x9e3779b97f4a7c15ull) >> (64 - FAST_BUCKET_BITS)];
}

static struct bucket *fast_table(int make)
{
    struct bucket *t = __atomic_load_n(&fast, __ATOMIC_ACQUIRE);
    if (VGPU_LIKELY(t != NULL) || !make)
        return t;
    /* zeroed pages, taken from the system as the buckets are used */
    size_t len = FAST_BUCKETS * sizeof(struct bucket);
    void *m = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED)
        return NULL;
    if (!__atomic_compare_exchange_n(&fast, &t, (struct bucket *)m, 0, __ATOMIC_ACQ_REL,
                                     __ATOMIC_ACQUIRE)) {
        munmap(m, len);   /* another thread's is there */
        return t;
    }
    return m;
}

/* Take a slot: its key word from `from` to `to` (a compare-and-swap, or
 * where the process is alone a load and a store); 0 if it was not `from`. */
static int take(uint64_t *k, uint64_t from, uint64_t to)
{
    if (alone()) {
        if (__atomic_load_n(k, __ATOMIC_RELAXED) != from)
            return 0;
        __atomic_store_n(k, to, __ATOMIC_RELAXED);
        return 1;
    }
    return __atomic_compare_exchange_n(k, &from, to, 0, __ATOMIC_ACQUIRE, __ATOMIC_RELAXED);
}

/* Waiting for a holder: it lets go after a few stores, unless it was
 * preempted meanwhile. */
static void relax(unsigned *spins)
{
    if (++*spins % 128 == 0) {
        sched_yield();
        return;
    }
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

static void val_get(const struct fast_val *v, uint64_t key, struct vgpu_alloc *out)
{
    out->key = key;
    out->size = __atomic_load_n(&v->size, __ATOMIC_RELAXED);
    out->ctx = __atomic_load_n(&v->ctx, __ATOMIC_RELAXED);
    out->dev = (int32_t)__atomic_load_n(&v->dev, __ATOMIC_RELAXED);
    out->kind = VGPU_K_PTR;
    out->refs = 1;
    out->maps = 0;
    out->aux = 0;
}

static void val_put(struct fast_val *v, uint64_t size, CUcontext ctx, int dev)
{
    __atomic_store_n(&v->size, size, __ATOMIC_RELAXED);
    __atomic_store_n(&v->ctx, ctx, __ATOMIC_RELAXED);
    __atomic_store_n(&v->dev, (int64_t)dev, __ATOMIC_RELAXED);
}

/* The slot of `key` in bucket b, or -1; *held: there, but held. */
static int find(const struct bucket *b, uint64_t key, int *held)
{
#pragma GCC unroll 4
    for (unsigned i = 0; i < BUCKET; i++) {
        uint64_t k = __atomic_load_n(&b->key[i], __ATOMIC_RELAXED);
        if ((k | HELD) == (key | HELD)) {
            if (k == key)
                return (int)i;
            *held = 1;
        }
    }
    return -1;
}

static int first_empty(const struct bucket *b)
{
    for (unsigned i = 0; i < BUCKET; i++)
        if (__atomic_load_n(&b->key[i], __ATOMIC_RELAXED) == 0)
            return (int)i;
    return -1;
}

/* ---- the sharded tables ------------------------------------------------------------ */
#define NSHARDS 64
static struct shard {
    pthread_mutex_t lock;
    struct vgpu_alloc *e;
    uint32_t cap;   /* power of two, or 0 */
    uint32_t n;
} __attribute__((aligned(64))) shards[NSHARDS] = {
    [0 ... NSHARDS - 1] = {.lock = PTHREAD_MUTEX_INITIALIZER}};

static uint64_t mix(uint64_t k)
{
    k ^= k >> 30;
    k *= 0xbf58476d1ce4e5b9ull;
    k ^= k >> 27;
    k *= 0x94d049bb133111ebull;
    k ^= k >> 31;
    return k;
}

static uint64_t hash_of(uint32_t kind, uint64_t key)
{
    return mix(key ^ ((uint64_t)kind << 60) ^ kind);
}

static struct shard *shard_of(uint64_t h)
{
    return &shards[h >> 58];
}

/* Needs the shard's lock; the table has room. */
static struct vgpu_alloc *slot_for(struct shard *sh, uint32_t kind, uint64_t key,
                                    uint64_t h)
{
    uint32_t mask = sh->cap - 1;
    for (uint32_t i = (uint32_t)h & mask;; i = (i + 1) & mask) {
        struct vgpu_alloc *e = &sh->e[i];
        if (e->kind == VGPU_K_EMPTY || (e->kind == kind && e->key == key))
            return e;
    }
}

static int grow(struct shard *sh)
{
    uint32_t cap = sh->cap ? sh->cap * 2 : 64;
    struct vgpu_alloc *ne = calloc(cap, sizeof(*ne));
    if (ne == NULL)
        return 0;
    struct vgpu_alloc *old = sh->e;
    uint32_t ocap = sh->cap;
    sh->e = ne;
    sh->cap = cap;
    for (uint32_t i = 0; i < ocap; i++)
        if (old[i].kind != VGPU_K_EMPTY)
            *slot_for(sh, old[i].kind, old[i].key, hash_of(old[i].kind, old[i].key)) = old[i];
    free(old);
    return 1;
}

static int shard_track(uint32_t kind, uint64_t key, uint64_t size, int dev, CUcontext ctx,
                       uint64_t aux, struct vgpu_alloc *old)
{
    uint64_t h = hash_of(kind, key);
    struct shard *sh = shard_of(h);
    int replaced = 0;
    pthread_mutex_lock(&sh->lock);
    if (2 * (sh->n + 1) > sh->cap && !grow(sh)) {
        pthread_mutex_unlock(&sh->lock);
        return -1;
    }
    struct vgpu_alloc *e = slot_for(sh, kind, key, h);
    if (e->kind != VGPU_K_EMPTY) {
        *old = *e;
        replaced = 1;
    } else {
        sh->n++;
        if (kind == VGPU_K_PTR)
            __atomic_fetch_add(&spilled, 1, __ATOMIC_RELAXED);
    }
    e->key = key;
    e->size = size;
    e->ctx = ctx;
    e->dev = dev;
    e->kind = kind;
    e->refs = 1;
    e->maps = 0;
    e->aux = aux;
    pthread_mutex_unlock(&sh->lock);
    return replaced;
}

/* Remove entry i, closing the gap (linear probing, backward shift). */
static void erase_at(struct shard *sh, uint32_t i)
{
    if (sh->e[i].kind == VGPU_K_PTR)
        __atomic_fetch_sub(&spilled, 1, __ATOMIC_RELAXED);
    uint32_t mask = sh->cap - 1;
    for (uint32_t j = (i + 1) & mask; sh->e[j].kind != VGPU_K_EMPTY; j = (j + 1) & mask) {
        uint32_t home = (uint32_t)hash_of(sh->e[j].kind, sh->e[j].key) & mask;
        int stays = i <= j ? (i < home && home <= j) : (i < home || home <= j);
        if (!stays) {
            sh->e[i] = sh->e[j];
            i = j;
        }
    }
    sh->e[i].kind = VGPU_K_EMPTY;
    sh->n--;
}

int vgpu_handle_adjust(uint64_t handle, int dr, int dm, struct vgpu_alloc *out)
{
    uint64_t h = hash_of(VGPU_K_HANDLE, handle);
    struct shard *sh = shard_of(h);
    int r = -1;
    pthread_mutex_lock(&sh->lock);
    if (sh->cap != 0) {
        struct vgpu_alloc *e = slot_for(sh, VGPU_K_HANDLE, handle, h);
        if (e->kind != VGPU_K_EMPTY) {
            /* never below 0: a release or unmap the driver refuses is
             * settled by the caller */
            e->refs = (dr < 0 && e->refs < (uint32_t)-dr) ? 0 : e->refs + (uint32_t)dr;
            e->maps = (dm < 0 && e->maps < (uint32_t)-dm) ? 0 : e->maps + (uint32_t)dm;
            r = 0;
            if (e->refs == 0 && e->maps == 0) {
                if (out)
                    *out = *e;
                erase_at(sh, (uint32_t)(e - sh->e));
                r = 1;
            }
        }
    }
    pthread_mutex_unlock(&sh->lock);
    return r;
}

static int shard_untrack(uint32_t kind, uint64_t key, struct vgpu_alloc *out)
{
    uint64_t h = hash_of(kind, key);
    struct shard *sh = shard_of(h);
    int found = 0;
    pthread_mutex_lock(&sh->lock);
    if (sh->cap != 0) {
        struct vgpu_alloc *e = slot_for(sh, kind, key, h);
        if (e->kind != VGPU_K_EMPTY) {
            *out = *e;
            erase_at(sh, (uint32_t)(e - sh->e));
            found = 1;
        }
    }
    pthread_mutex_unlock(&sh->lock);
    return found;
}

/* ---- the process's allocations ------------------------------------------------------ */
/* A device pointer: in its bucket, or in the sharded tables. */
int vgpu_track_ptr(uint64_t key, uint64_t size, int dev, CUcontext ctx, struct vgpu_alloc *old)
{
    struct bucket *t = fast_key(key) ? fast_table(1) : NULL;
    if (VGPU_UNLIKELY(t == NULL))
        return shard_track(VGPU_K_PTR, key, size, dev, ctx, 0, old);
    struct bucket *b = bucket_of(t, key);
    unsigned spins = 0;
    for (;;) {
        int held = 0;
        int at = find(b, key, &held);
        if (at >= 0) {
            /* there already: its free went another way */
            if (!take(&b->key[at], key, key | HELD))
                continue;
            val_get(&b->val[at], key, old);
            val_put(&b->val[at], size, ctx, dev);
            __atomic_store_n(&b->key[at], key, __ATOMIC_RELEASE);
            return 1;
        }
        if (held) {
            relax(&spins);
            continue;
        }
        at = first_empty(b);
        if (at < 0)   /* its bucket is full (the sharded tables look for it too) */
            return shard_track(VGPU_K_PTR, key, size, dev, ctx, 0, old);
        if (!take(&b->key[at], 0, key | HELD))
            continue;
        /* held: it may be in the sharded tables from when its bucket was
         * full; then it moves here */
        int r = __atomic_load_n(&spilled, __ATOMIC_RELAXED) != 0 &&
                shard_untrack(VGPU_K_PTR, key, old);
        val_put(&b->val[at], size, ctx, dev);
        __atomic_store_n(&b->key[at], key, __ATOMIC_RELEASE);
        return r;
    }
}

int vgpu_untrack_ptr(uint64_t key, struct vgpu_alloc *out)
{
    struct bucket *t = fast_table(0);
    if (VGPU_LIKELY(t != NULL && fast_key(key))) {
        struct bucket *b = bucket_of(t, key);
        unsigned spins = 0;
        for (;;) {
            int held = 0;
            int at = find(b, key, &held);
            if (at >= 0) {
                if (!take(&b->key[at], key, key | HELD))
                    continue;
                val_get(&b->val[at], key, out);
                __atomic_store_n(&b->key[at], 0, __ATOMIC_RELEASE);
                return 1;
            }
            if (!held)
                break;
            relax(&spins);
        }
    }
    if (__atomic_load_n(&spilled, __ATOMIC_RELAXED) == 0)
        return 0;
    return shard_untrack(VGPU_K_PTR, key, out);
}

/* Remember an allocation; when the key was already there (its free went by
 * another way), the old reservation is returned in *old. */
int vgpu_track(uint32_t kind, uint64_t key, uint64_t size, int dev, CUcontext ctx,
               struct vgpu_alloc *old)
{
    if (kind == VGPU_K_PTR)
        return vgpu_track_ptr(key, size, dev, ctx, old);
    return shard_track(kind, key, size, dev, ctx, 0, old);
}

int vgpu_track_aux(uint32_t kind, uint64_t key, uint64_t size, int dev, CUcontext ctx,
                   uint64_t aux, struct vgpu_alloc *old)
{
    if (kind == VGPU_K_PTR && aux == 0)
        return vgpu_track_ptr(key, size, dev, ctx, old);
    return shard_track(kind, key, size, dev, ctx, aux, old);
}

int vgpu_untrack(uint32_t kind, uint64_t key, struct vgpu_alloc *out)
{
    if (kind == VGPU_K_PTR)
        return vgpu_untrack_ptr(key, out);
    return shard_untrack(kind, key, out);
}

/* Forget every allocation made in ctx; add their sizes per device. */
void vgpu_untrack_ctx(CUcontext ctx, uint64_t per_dev[VGPU_MAX_DEVICES])
{
    struct bucket *t = fast_table(0);
    for (uint32_t i = 0; t != NULL && i < FAST_BUCKETS * BUCKET; i++) {
        uint64_t *key = &t[i / BUCKET].key[i % BUCKET];
        struct fast_val *v = &t[i / BUCKET].val[i % BUCKET];
        unsigned spins = 0;
        for (;;) {
            uint64_t k = __atomic_load_n(key, __ATOMIC_RELAXED);
            if (k == 0)
                break;
            if (k & HELD) {
                relax(&spins);
                continue;
            }
            if (__atomic_load_n(&v->ctx, __ATOMIC_RELAXED) != ctx)
                break;
            if (!take(key, k, k | HELD))
                continue;   /* changed meanwhile: look again */
            struct vgpu_alloc e;
            val_get(v, k, &e);
            if (e.ctx != ctx) {
                /* the slot changed hands between the look and the take */
                __atomic_store_n(key, k, __ATOMIC_RELEASE);
                break;
            }
            if (e.dev >= 0 && e.dev < VGPU_MAX_DEVICES)
                per_dev[e.dev] += e.size;
            __atomic_store_n(key, 0, __ATOMIC_RELEASE);
            break;
        }
    }
    for (int s = 0; s < NSHARDS; s++) {
        struct shard *sh = &shards[s];
        pthread_mutex_lock(&sh->lock);
        for (uint32_t i = 0; i < sh->cap;) {
            struct vgpu_alloc *e = &sh->e[i];
            if (e->kind != VGPU_K_EMPTY && e->ctx == ctx && e->kind != VGPU_K_HANDLE &&
                e->kind != VGPU_K_MAP) {
                if (e->dev >= 0 && e->dev < VGPU_MAX_DEVICES)
                    per_dev[e->dev] += e->size;
                erase_at(sh, i);   /* i now holds the next candidate */
            } else {
                i++;
            }
        }
        pthread_mutex_unlock(&sh->lock);
    }
}

void vgpu_alloctab_atfork_child(void)
{
    /* the child holds no device memory (and is alone: nobody holds a slot) */
    if (fast != NULL)
        munmap(fast, FAST_BUCKETS * sizeof(struct bucket));
    fast = NULL;
    spilled = 0;
    for (int s = 0; s < NSHARDS; s++) {
        pthread_mutex_init(&shards[s].lock, NULL);
        free(shards[s].e);
        shards[s].e = NULL;
        shards[s].cap = shards[s].n = 0;
    }
}
