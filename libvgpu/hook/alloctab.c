/*
 * alloctab.c - the process's allocations: (kind, handle) -> what was
 * reserved for it, on which device, in which context. So a free gives back
 * exactly its reservation, and a destroyed context everything made in it.
 * Open addressing with linear probing, 64 shards each with its own lock,
 * keyed by a hash of the handle: allocating threads rarely meet.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdlib.h>

#include "hook.h"

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

/* Remember an allocation; when the key was already there (its free went by
 * another way), the old reservation is returned in *old. */
int vgpu_track(uint32_t kind, uint64_t key, uint64_t size, int dev, CUcontext ctx,
                 struct vgpu_alloc *old)
{
    return vgpu_track_aux(kind, key, size, dev, ctx, 0, old);
}

int vgpu_track_aux(uint32_t kind, uint64_t key, uint64_t size, int dev, CUcontext ctx,
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

int vgpu_untrack(uint32_t kind, uint64_t key, struct vgpu_alloc *out)
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

/* Forget every allocation made in ctx; add their sizes per device. */
void vgpu_untrack_ctx(CUcontext ctx, uint64_t per_dev[VGPU_MAX_DEVICES])
{
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
    for (int s = 0; s < NSHARDS; s++) {
        pthread_mutex_init(&shards[s].lock, NULL);
        free(shards[s].e);
        shards[s].e = NULL;
        shards[s].cap = shards[s].n = 0;
    }
}
