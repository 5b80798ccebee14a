/*
 * memory.c - the memory limit.
 *
 * Reserve before allocating: an atomic compare-and-swap on the job's
 * per-device total (usage->dev[d].used) that never takes it past the limit,
 * then the real call, rolled back when the call fails. What is reserved is
 * what the driver really takes: sizes rounded up to its 2 MiB granularity,
 * pitch x height from the real pitch, arrays from their descriptor, and each
 * context's own memory measured through NVML. A process-local table
 * remembers every allocation's reservation so its free gives back exactly
 * that; destroying a context gives back what was allocated in it.
 */
#define _GNU_SOURCE
#include <limits.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "hook.h"

#define GRANULARITY (2ull << 20)
#define PITCH_ALIGN 512ull
#define DEFAULT_CTX_BYTES (300ull << 20)   /* docs/hook.md: fallback only */
#define MAX_ORDINALS 64

uint64_t vgpu_nvml_process_used(const char *uuid);   /* nvml.c */

/* Accounting happens once, at the outermost call: when a driver implements
 * one entry point by calling another exported one (the call then comes back
 * through our export), the inner call goes straight to the driver. */
static __thread int t_inside __attribute__((tls_model("initial-exec")));

static inline void leave_hook(int *unused)
{
    (void)unused;
    t_inside = 0;
}

#define ENTER(sym, args) \
    if (VGPU_UNLIKELY(t_inside)) \
        return REAL(sym) args; \
    t_inside = 1; \
    __attribute__((cleanup(leave_hook))) int guard_ = 1; \
    (void)guard_

static uint64_t round_gran(uint64_t n)
{
    if (n > UINT64_MAX - GRANULARITY)
        return UINT64_MAX;
    return (n + GRANULARITY - 1) & ~(GRANULARITY - 1);
}

static uint64_t mul_sat(uint64_t a, uint64_t b)
{
    uint64_t r;
    return __builtin_mul_overflow(a, b, &r) ? UINT64_MAX : r;
}

static void sub_sat(uint64_t *p, uint64_t v)
{
    uint64_t cur = __atomic_load_n(p, __ATOMIC_RELAXED);
    while (!__atomic_compare_exchange_n(p, &cur, cur > v ? cur - v : 0, 1, __ATOMIC_ACQ_REL,
                                        __ATOMIC_RELAXED))
        ;
}

uint64_t vgpu_job_used(int d)
{
    return __atomic_load_n(&vgpu_g_usage->dev[d].used, __ATOMIC_ACQUIRE);
}

uint64_t vgpu_dev_limit(int d)
{
    return __atomic_load_n(&vgpu_g_limits->dev[d].mem_limit, __ATOMIC_RELAXED);
}

/* ---- reservation ------------------------------------------------------------ */

/* Reserve `bytes` on region device d for this process; 1 on success. A
 * refusal sweeps dead processes' slots first and retries once. */
static int reserve(int d, uint64_t bytes, int is_ctx, const char *what)
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
        vgpu_log(VGPU_LOG_WARN, "%s of %s refused: the job holds %s of its %s on %s", what,
                 vgpu_fmt_size(bytes, a, sizeof(a)), vgpu_fmt_size(cur, b, sizeof(b)),
                 vgpu_fmt_size(limit, c, sizeof(c)), vgpu_dev_uuid(d));
        return 0;
    }
    uint64_t now = cur + bytes;
    uint64_t peak = __atomic_load_n(&u->peak, __ATOMIC_RELAXED);
    while (now > peak && !__atomic_compare_exchange_n(&u->peak, &peak, now, 1, __ATOMIC_RELAXED,
                                                      __ATOMIC_RELAXED))
        ;
    struct vgpu_proc_slot *s = vgpu_g_slot;
    __atomic_fetch_add(&s->used[d], bytes, __ATOMIC_RELAXED);
    if (is_ctx)
        __atomic_fetch_add(&s->ctx_bytes[d], bytes, __ATOMIC_RELAXED);
    return 1;
}

static void unreserve(int d, uint64_t bytes, int is_ctx)
{
    if (d < 0 || bytes == 0)
        return;
    struct vgpu_proc_slot *s = vgpu_g_slot;
    sub_sat(&s->used[d], bytes);
    if (is_ctx)
        sub_sat(&s->ctx_bytes[d], bytes);
    sub_sat(&vgpu_g_usage->dev[d].used, bytes);
}

/* A slot whose process is gone (or exiting): its bytes leave the job. */
void vgpu_release_slot_memory(struct vgpu_proc_slot *slot)
{
    for (int d = 0; d < VGPU_MAX_DEVICES; d++) {
        uint64_t n = __atomic_exchange_n(&slot->used[d], 0, __ATOMIC_ACQ_REL);
        __atomic_store_n(&slot->ctx_bytes[d], 0, __ATOMIC_RELAXED);
        if (n != 0)
            sub_sat(&vgpu_g_usage->dev[d].used, n);
    }
}

/* ---- the allocation table: (kind, key) -> reservation ------------------------ */
enum { K_EMPTY = 0, K_PTR, K_HANDLE, K_ARRAY, K_MIPMAP };

struct entry {
    uint64_t key;
    uint64_t size;
    CUcontext ctx;
    int32_t dev;
    uint32_t kind;
};

#define NSHARDS 64
static struct shard {
    pthread_mutex_t lock;
    struct entry *e;
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
static struct entry *slot_for(struct shard *sh, uint32_t kind, uint64_t key, uint64_t h)
{
    uint32_t mask = sh->cap - 1;
    for (uint32_t i = (uint32_t)h & mask;; i = (i + 1) & mask) {
        struct entry *e = &sh->e[i];
        if (e->kind == K_EMPTY || (e->kind == kind && e->key == key))
            return e;
    }
}

static int grow(struct shard *sh)
{
    uint32_t cap = sh->cap ? sh->cap * 2 : 64;
    struct entry *ne = calloc(cap, sizeof(*ne));
    if (ne == NULL)
        return 0;
    struct entry *old = sh->e;
    uint32_t ocap = sh->cap;
    sh->e = ne;
    sh->cap = cap;
    for (uint32_t i = 0; i < ocap; i++)
        if (old[i].kind != K_EMPTY)
            *slot_for(sh, old[i].kind, old[i].key, hash_of(old[i].kind, old[i].key)) = old[i];
    free(old);
    return 1;
}

/* Remember an allocation; when the key was already there (its free went by
 * another way), the old reservation is returned in *old. */
static int track(uint32_t kind, uint64_t key, uint64_t size, int dev, CUcontext ctx,
                 struct entry *old)
{
    uint64_t h = hash_of(kind, key);
    struct shard *sh = shard_of(h);
    int replaced = 0;
    pthread_mutex_lock(&sh->lock);
    if (2 * (sh->n + 1) > sh->cap && !grow(sh)) {
        pthread_mutex_unlock(&sh->lock);
        return -1;
    }
    struct entry *e = slot_for(sh, kind, key, h);
    if (e->kind != K_EMPTY) {
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
    pthread_mutex_unlock(&sh->lock);
    return replaced;
}

/* Remove entry i, closing the gap (linear probing, backward shift). */
static void erase_at(struct shard *sh, uint32_t i)
{
    uint32_t mask = sh->cap - 1;
    for (uint32_t j = (i + 1) & mask; sh->e[j].kind != K_EMPTY; j = (j + 1) & mask) {
        uint32_t home = (uint32_t)hash_of(sh->e[j].kind, sh->e[j].key) & mask;
        int stays = i <= j ? (i < home && home <= j) : (i < home || home <= j);
        if (!stays) {
            sh->e[i] = sh->e[j];
            i = j;
        }
    }
    sh->e[i].kind = K_EMPTY;
    sh->n--;
}

static int untrack(uint32_t kind, uint64_t key, struct entry *out)
{
    uint64_t h = hash_of(kind, key);
    struct shard *sh = shard_of(h);
    int found = 0;
    pthread_mutex_lock(&sh->lock);
    if (sh->cap != 0) {
        struct entry *e = slot_for(sh, kind, key, h);
        if (e->kind != K_EMPTY) {
            *out = *e;
            erase_at(sh, (uint32_t)(e - sh->e));
            found = 1;
        }
    }
    pthread_mutex_unlock(&sh->lock);
    return found;
}

/* Forget every allocation made in ctx; add their sizes per device. */
static void untrack_ctx(CUcontext ctx, uint64_t per_dev[VGPU_MAX_DEVICES])
{
    for (int s = 0; s < NSHARDS; s++) {
        struct shard *sh = &shards[s];
        pthread_mutex_lock(&sh->lock);
        for (uint32_t i = 0; i < sh->cap;) {
            struct entry *e = &sh->e[i];
            if (e->kind != K_EMPTY && e->ctx == ctx && e->kind != K_HANDLE) {
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

/* ---- common steps ------------------------------------------------------------ */
static CUcontext current_ctx(void)
{
    CUcontext c = NULL;
    if (REAL(cuCtxGetCurrent)(&c) != CUDA_SUCCESS)
        return NULL;
    return c;
}

static void count_alloc(void)
{
    __atomic_fetch_add(&vgpu_g_slot->allocs, 1, __ATOMIC_RELAXED);
}

/* After a successful allocation: remember it. */
static void remember(uint32_t kind, uint64_t key, uint64_t size, int d, CUcontext ctx)
{
    struct entry old;
    int r = track(kind, key, size, d, ctx, &old);
    if (r == 1)
        unreserve(old.dev, old.size, 0);
    else if (r < 0)
        vgpu_log(VGPU_LOG_ERROR, "out of host memory for the allocation table; "
                 "a free will not give its bytes back");
}

/* After the real free: give back the reservation, or put it back in the
 * table when the free failed. */
static void settle_free(int had, const struct entry *e, CUresult r)
{
    if (!had)
        return;
    if (r == CUDA_SUCCESS) {
        unreserve(e->dev, e->size, 0);
        return;
    }
    struct entry old;
    if (track(e->kind, e->key, e->size, e->dev, e->ctx, &old) == 1)
        unreserve(old.dev, old.size, 0);
}

/* The plain allocations: reserve round(bytes) on the current device, call,
 * roll back or remember. */
#define PLAIN_ALLOC(sym, args, bytes) \
    do { \
        ENTER(sym, args); \
        CU_PROLOGUE(sym, args); \
        count_alloc(); \
        int d_ = vgpu_dev_for_launch(); \
        if (d_ == VGPU_DEV_NO_CONTEXT) \
            return REAL(sym) args; \
        uint64_t sz_ = round_gran(bytes); \
        if (!reserve(d_, sz_, 0, #sym)) \
            return CUDA_ERROR_OUT_OF_MEMORY; \
        CUresult r_ = REAL(sym) args; \
        if (r_ != CUDA_SUCCESS) { \
            unreserve(d_, sz_, 0); \
            return r_; \
        } \
        remember(K_PTR, *dptr, sz_, d_, current_ctx()); \
        return r_; \
    } while (0)

#define PLAIN_FREE(sym, args, kind, key) \
    do { \
        ENTER(sym, args); \
        CU_PROLOGUE(sym, args); \
        struct entry e_; \
        int had_ = untrack(kind, (uint64_t)(uintptr_t)(key), &e_); \
        CUresult r_ = REAL(sym) args; \
        settle_free(had_, &e_, r_); \
        return r_; \
    } while (0)

/* ---- allocations -------------------------------------------------------------- */
CUresult hook_cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize)
{
    PLAIN_ALLOC(cuMemAlloc_v2, (dptr, bytesize), bytesize);
}

CUresult hook_cuMemAllocManaged(CUdeviceptr *dptr, size_t bytesize, unsigned int flags)
{
    PLAIN_ALLOC(cuMemAllocManaged, (dptr, bytesize, flags), bytesize);
}

CUresult hook_cuMemAllocAsync(CUdeviceptr *dptr, size_t bytesize, CUstream hStream)
{
    PLAIN_ALLOC(cuMemAllocAsync, (dptr, bytesize, hStream), bytesize);
}

CUresult hook_cuMemAllocAsync_ptsz(CUdeviceptr *dptr, size_t bytesize, CUstream hStream)
{
    PLAIN_ALLOC(cuMemAllocAsync_ptsz, (dptr, bytesize, hStream), bytesize);
}

CUresult hook_cuMemAllocFromPoolAsync(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool,
                                      CUstream hStream)
{
    PLAIN_ALLOC(cuMemAllocFromPoolAsync, (dptr, bytesize, pool, hStream), bytesize);
}

CUresult hook_cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool,
                                           CUstream hStream)
{
    PLAIN_ALLOC(cuMemAllocFromPoolAsync_ptsz, (dptr, bytesize, pool, hStream), bytesize);
}

/* The pitch is only known after the call: reserve for the smallest pitch the
 * driver may choose, then settle on pitch x height. */
CUresult hook_cuMemAllocPitch_v2(CUdeviceptr *dptr, size_t *pPitch, size_t WidthInBytes,
                                 size_t Height, unsigned int ElementSizeBytes)
{
    ENTER(cuMemAllocPitch_v2, (dptr, pPitch, WidthInBytes, Height, ElementSizeBytes));
    CU_PROLOGUE(cuMemAllocPitch_v2, (dptr, pPitch, WidthInBytes, Height, ElementSizeBytes));
    count_alloc();
    int d = vgpu_dev_for_launch();
    if (d == VGPU_DEV_NO_CONTEXT)
        return REAL(cuMemAllocPitch_v2)(dptr, pPitch, WidthInBytes, Height, ElementSizeBytes);
    uint64_t w = WidthInBytes > UINT64_MAX - PITCH_ALIGN
                     ? UINT64_MAX : (WidthInBytes + PITCH_ALIGN - 1) & ~(PITCH_ALIGN - 1);
    uint64_t est = round_gran(mul_sat(w, Height));
    if (!reserve(d, est, 0, "cuMemAllocPitch_v2"))
        return CUDA_ERROR_OUT_OF_MEMORY;
    CUresult r = REAL(cuMemAllocPitch_v2)(dptr, pPitch, WidthInBytes, Height, ElementSizeBytes);
    if (r != CUDA_SUCCESS) {
        unreserve(d, est, 0);
        return r;
    }
    uint64_t real = round_gran(mul_sat(*pPitch, Height));
    if (real > est) {
        if (!reserve(d, real - est, 0, "cuMemAllocPitch_v2")) {
            REAL(cuMemFree_v2)(*dptr);
            unreserve(d, est, 0);
            return CUDA_ERROR_OUT_OF_MEMORY;
        }
    } else if (real < est) {
        unreserve(d, est - real, 0);
    }
    remember(K_PTR, *dptr, real, d, current_ctx());
    return r;
}

CUresult hook_cuMemFree_v2(CUdeviceptr dptr)
{
    PLAIN_FREE(cuMemFree_v2, (dptr), K_PTR, dptr);
}

CUresult hook_cuMemFreeAsync(CUdeviceptr dptr, CUstream hStream)
{
    PLAIN_FREE(cuMemFreeAsync, (dptr, hStream), K_PTR, dptr);
}

CUresult hook_cuMemFreeAsync_ptsz(CUdeviceptr dptr, CUstream hStream)
{
    PLAIN_FREE(cuMemFreeAsync_ptsz, (dptr, hStream), K_PTR, dptr);
}

/* Physical memory for the virtual memory API (PyTorch's expandable
 * segments): on the device the properties name, not the current one. */
CUresult hook_cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size,
                          const CUmemAllocationProp *prop, unsigned long long flags)
{
    ENTER(cuMemCreate, (handle, size, prop, flags));
    CU_PROLOGUE(cuMemCreate, (handle, size, prop, flags));
    count_alloc();
    if (prop == NULL || prop->location.type != CU_MEM_LOCATION_TYPE_DEVICE)
        return REAL(cuMemCreate)(handle, size, prop, flags);
    int d = vgpu_dev_of_ordinal(prop->location.id);
    uint64_t sz = round_gran(size);
    if (!reserve(d, sz, 0, "cuMemCreate"))
        return CUDA_ERROR_OUT_OF_MEMORY;
    CUresult r = REAL(cuMemCreate)(handle, size, prop, flags);
    if (r != CUDA_SUCCESS) {
        unreserve(d, sz, 0);
        return r;
    }
    remember(K_HANDLE, *handle, sz, d, NULL);
    return r;
}

CUresult hook_cuMemRelease(CUmemGenericAllocationHandle handle)
{
    PLAIN_FREE(cuMemRelease, (handle), K_HANDLE, handle);
}

/* ---- arrays ------------------------------------------------------------------- */
static uint64_t format_bytes(CUarray_format f)
{
    switch ((int)f) {
    case CU_AD_FORMAT_UNSIGNED_INT8:
    case CU_AD_FORMAT_SIGNED_INT8:
        return 1;
    case CU_AD_FORMAT_UNSIGNED_INT16:
    case CU_AD_FORMAT_SIGNED_INT16:
    case CU_AD_FORMAT_HALF:
        return 2;
    default:   /* 32-bit formats, and the rarer ones counted generously */
        return 4;
    }
}

static uint64_t dim(size_t v, unsigned level)
{
    uint64_t x = (uint64_t)v >> level;
    return x ? x : 1;
}

static uint64_t array_bytes(size_t w, size_t h, size_t depth, CUarray_format f, unsigned ch,
                            unsigned levels)
{
    uint64_t elem = format_bytes(f) * (ch ? ch : 1);
    uint64_t total = 0;
    if (levels == 0)
        levels = 1;
    for (unsigned l = 0; l < levels && l < 64; l++) {
        uint64_t n = mul_sat(mul_sat(mul_sat(dim(w, l), dim(h, l)), dim(depth, l)), elem);
        total = total > UINT64_MAX - n ? UINT64_MAX : total + n;
    }
    return round_gran(total);
}

#define ARRAY_ALLOC(sym, args, kind, bytes) \
    do { \
        ENTER(sym, args); \
        CU_PROLOGUE(sym, args); \
        count_alloc(); \
        int d_ = vgpu_dev_for_launch(); \
        if (d_ == VGPU_DEV_NO_CONTEXT || desc == NULL) \
            return REAL(sym) args; \
        uint64_t sz_ = (bytes); \
        if (!reserve(d_, sz_, 0, #sym)) \
            return CUDA_ERROR_OUT_OF_MEMORY; \
        CUresult r_ = REAL(sym) args; \
        if (r_ != CUDA_SUCCESS) { \
            unreserve(d_, sz_, 0); \
            return r_; \
        } \
        remember(kind, (uint64_t)(uintptr_t)*pHandle, sz_, d_, current_ctx()); \
        return r_; \
    } while (0)

CUresult hook_cuArrayCreate_v2(CUarray *pHandle, const CUDA_ARRAY_DESCRIPTOR *pAllocateArray)
{
    const CUDA_ARRAY_DESCRIPTOR *desc = pAllocateArray;
    ARRAY_ALLOC(cuArrayCreate_v2, (pHandle, pAllocateArray), K_ARRAY,
                array_bytes(desc->Width, desc->Height, 0, desc->Format, desc->NumChannels, 1));
}

CUresult hook_cuArray3DCreate_v2(CUarray *pHandle, const CUDA_ARRAY3D_DESCRIPTOR *pAllocateArray)
{
    const CUDA_ARRAY3D_DESCRIPTOR *desc = pAllocateArray;
    ARRAY_ALLOC(cuArray3DCreate_v2, (pHandle, pAllocateArray), K_ARRAY,
                array_bytes(desc->Width, desc->Height, desc->Depth, desc->Format,
                            desc->NumChannels, 1));
}

CUresult hook_cuMipmappedArrayCreate(CUmipmappedArray *pHandle,
                                     const CUDA_ARRAY3D_DESCRIPTOR *pMipmappedArrayDesc,
                                     unsigned int numMipmapLevels)
{
    const CUDA_ARRAY3D_DESCRIPTOR *desc = pMipmappedArrayDesc;
    ARRAY_ALLOC(cuMipmappedArrayCreate, (pHandle, pMipmappedArrayDesc, numMipmapLevels),
                K_MIPMAP,
                array_bytes(desc->Width, desc->Height, desc->Depth, desc->Format,
                            desc->NumChannels, numMipmapLevels));
}

CUresult hook_cuArrayDestroy(CUarray hArray)
{
    PLAIN_FREE(cuArrayDestroy, (hArray), K_ARRAY, hArray);
}

CUresult hook_cuMipmappedArrayDestroy(CUmipmappedArray hMipmappedArray)
{
    PLAIN_FREE(cuMipmappedArrayDestroy, (hMipmappedArray), K_MIPMAP, hMipmappedArray);
}

/* ---- contexts ----------------------------------------------------------------- */
static pthread_mutex_t ctx_lock = PTHREAD_MUTEX_INITIALIZER;
static struct primary {
    int refs;
    int accounted;
    int dev;
    CUcontext ctx;
    uint64_t bytes;
} primary[MAX_ORDINALS];
static struct made {
    CUcontext ctx;
    int dev;
    uint64_t bytes;
} *made;
static unsigned n_made, cap_made;

/* A context just created on region device d: how much memory it took. The
 * process's own usedGpuMemory from NVML, less what the process already had
 * reserved there; else the daemon's measure; else a default. */
static uint64_t measure_ctx(int d)
{
    if (d < 0)
        return 0;
    uint64_t nv = vgpu_nvml_process_used(vgpu_dev_uuid(d));
    uint64_t mine = __atomic_load_n(&vgpu_g_slot->used[d], __ATOMIC_RELAXED);
    if (nv > mine)
        return nv - mine;
    uint64_t over = __atomic_load_n(&vgpu_g_limits->dev[d].ctx_overhead, __ATOMIC_RELAXED);
    if (over != 0)
        return over;
    vgpu_log(VGPU_LOG_INFO, "context memory on %s not measurable through NVML; counting %llu "
             "bytes", vgpu_dev_uuid(d), (unsigned long long)DEFAULT_CTX_BYTES);
    return DEFAULT_CTX_BYTES;
}

/* A context went away: its memory and everything allocated in it. */
static void drop_ctx(CUcontext ctx, int d, uint64_t bytes)
{
    uint64_t per_dev[VGPU_MAX_DEVICES] = {0};
    untrack_ctx(ctx, per_dev);
    for (int i = 0; i < VGPU_MAX_DEVICES; i++)
        unreserve(i, per_dev[i], 0);
    unreserve(d, bytes, 1);
}

static CUresult primary_release_real(CUdevice dev)
{
    return vgpu_real_present(VGPU_H_cuDevicePrimaryCtxRelease_v2)
               ? REAL(cuDevicePrimaryCtxRelease_v2)(dev)
               : REAL(cuDevicePrimaryCtxRelease)(dev);
}

CUresult hook_cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev)
{
    ENTER(cuDevicePrimaryCtxRetain, (pctx, dev));
    CU_PROLOGUE(cuDevicePrimaryCtxRetain, (pctx, dev));
    pthread_mutex_lock(&ctx_lock);
    CUresult r = REAL(cuDevicePrimaryCtxRetain)(pctx, dev);
    if (r == CUDA_SUCCESS && dev >= 0 && dev < MAX_ORDINALS) {
        struct primary *p = &primary[dev];
        p->refs++;
        if (!p->accounted) {
            int d = vgpu_dev_of_ordinal(dev);
            uint64_t bytes = measure_ctx(d);
            if (!reserve(d, bytes, 1, "context creation")) {
                primary_release_real(dev);
                p->refs--;
                r = CUDA_ERROR_OUT_OF_MEMORY;
            } else {
                p->accounted = 1;
                p->dev = d;
                p->ctx = *pctx;
                p->bytes = bytes;
                vgpu_note_ctx_device(d);
            }
        }
    }
    pthread_mutex_unlock(&ctx_lock);
    return r;
}

static CUresult primary_release(CUresult r, CUdevice dev)
{
    if (r != CUDA_SUCCESS || dev < 0 || dev >= MAX_ORDINALS)
        return r;
    struct primary *p = &primary[dev];
    if (p->refs > 0)
        p->refs--;
    int gone = p->refs == 0;
    if (vgpu_real_present(VGPU_H_cuDevicePrimaryCtxGetState)) {
        unsigned flags;
        int active;
        if (REAL(cuDevicePrimaryCtxGetState)(dev, &flags, &active) == CUDA_SUCCESS)
            gone = !active;
    }
    if (gone && p->accounted) {
        drop_ctx(p->ctx, p->dev, p->bytes);
        p->accounted = 0;
        p->refs = 0;
    }
    return r;
}

CUresult hook_cuDevicePrimaryCtxRelease(CUdevice dev)
{
    ENTER(cuDevicePrimaryCtxRelease, (dev));
    CU_PROLOGUE(cuDevicePrimaryCtxRelease, (dev));
    pthread_mutex_lock(&ctx_lock);
    CUresult r = primary_release(REAL(cuDevicePrimaryCtxRelease)(dev), dev);
    pthread_mutex_unlock(&ctx_lock);
    return r;
}

CUresult hook_cuDevicePrimaryCtxRelease_v2(CUdevice dev)
{
    ENTER(cuDevicePrimaryCtxRelease_v2, (dev));
    CU_PROLOGUE(cuDevicePrimaryCtxRelease_v2, (dev));
    pthread_mutex_lock(&ctx_lock);
    CUresult r = primary_release(REAL(cuDevicePrimaryCtxRelease_v2)(dev), dev);
    pthread_mutex_unlock(&ctx_lock);
    return r;
}

/* Reset destroys every allocation of the primary context; the context itself
 * is counted for as long as it is retained. */
static CUresult primary_reset(CUresult r, CUdevice dev)
{
    if (r != CUDA_SUCCESS || dev < 0 || dev >= MAX_ORDINALS)
        return r;
    struct primary *p = &primary[dev];
    if (!p->accounted)
        return r;
    int active = p->refs > 0;
    if (vgpu_real_present(VGPU_H_cuDevicePrimaryCtxGetState)) {
        unsigned flags;
        int a;
        if (REAL(cuDevicePrimaryCtxGetState)(dev, &flags, &a) == CUDA_SUCCESS)
            active = a;
    }
    drop_ctx(p->ctx, p->dev, active ? 0 : p->bytes);
    if (!active) {
        p->accounted = 0;
        p->refs = 0;
    }
    return r;
}

CUresult hook_cuDevicePrimaryCtxReset(CUdevice dev)
{
    ENTER(cuDevicePrimaryCtxReset, (dev));
    CU_PROLOGUE(cuDevicePrimaryCtxReset, (dev));
    pthread_mutex_lock(&ctx_lock);
    CUresult r = primary_reset(REAL(cuDevicePrimaryCtxReset)(dev), dev);
    pthread_mutex_unlock(&ctx_lock);
    return r;
}

CUresult hook_cuDevicePrimaryCtxReset_v2(CUdevice dev)
{
    ENTER(cuDevicePrimaryCtxReset_v2, (dev));
    CU_PROLOGUE(cuDevicePrimaryCtxReset_v2, (dev));
    pthread_mutex_lock(&ctx_lock);
    CUresult r = primary_reset(REAL(cuDevicePrimaryCtxReset_v2)(dev), dev);
    pthread_mutex_unlock(&ctx_lock);
    return r;
}

/* After cuCtxCreate_*: count the new context, or destroy it and refuse. */
static CUresult ctx_created(CUresult r, CUcontext *pctx, CUdevice dev)
{
    if (r != CUDA_SUCCESS)
        return r;
    int d = vgpu_dev_of_ordinal(dev);
    uint64_t bytes = measure_ctx(d);
    if (!reserve(d, bytes, 1, "context creation")) {
        REAL(cuCtxDestroy_v2)(*pctx);
        *pctx = NULL;
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    if (n_made == cap_made) {
        unsigned cap = cap_made ? cap_made * 2 : 16;
        struct made *m = realloc(made, cap * sizeof(*m));
        if (m == NULL) {
            vgpu_log(VGPU_LOG_ERROR, "out of host memory for the context table");
            return r;
        }
        made = m;
        cap_made = cap;
    }
    made[n_made].ctx = *pctx;
    made[n_made].dev = d;
    made[n_made].bytes = bytes;
    n_made++;
    vgpu_note_ctx_device(d);
    return r;
}

CUresult hook_cuCtxCreate_v2(CUcontext *pctx, unsigned int flags, CUdevice dev)
{
    ENTER(cuCtxCreate_v2, (pctx, flags, dev));
    CU_PROLOGUE(cuCtxCreate_v2, (pctx, flags, dev));
    pthread_mutex_lock(&ctx_lock);
    CUresult r = ctx_created(REAL(cuCtxCreate_v2)(pctx, flags, dev), pctx, dev);
    pthread_mutex_unlock(&ctx_lock);
    return r;
}

CUresult hook_cuCtxCreate_v3(CUcontext *pctx, CUexecAffinityParam *paramsArray, int numParams,
                             unsigned int flags, CUdevice dev)
{
    ENTER(cuCtxCreate_v3, (pctx, paramsArray, numParams, flags, dev));
    CU_PROLOGUE(cuCtxCreate_v3, (pctx, paramsArray, numParams, flags, dev));
    pthread_mutex_lock(&ctx_lock);
    CUresult r = ctx_created(REAL(cuCtxCreate_v3)(pctx, paramsArray, numParams, flags, dev),
                             pctx, dev);
    pthread_mutex_unlock(&ctx_lock);
    return r;
}

CUresult hook_cuCtxCreate_v4(CUcontext *pctx, CUctxCreateParams *ctxCreateParams,
                             unsigned int flags, CUdevice dev)
{
    ENTER(cuCtxCreate_v4, (pctx, ctxCreateParams, flags, dev));
    CU_PROLOGUE(cuCtxCreate_v4, (pctx, ctxCreateParams, flags, dev));
    pthread_mutex_lock(&ctx_lock);
    CUresult r = ctx_created(REAL(cuCtxCreate_v4)(pctx, ctxCreateParams, flags, dev), pctx,
                             dev);
    pthread_mutex_unlock(&ctx_lock);
    return r;
}

CUresult hook_cuCtxDestroy_v2(CUcontext ctx)
{
    ENTER(cuCtxDestroy_v2, (ctx));
    CU_PROLOGUE(cuCtxDestroy_v2, (ctx));
    pthread_mutex_lock(&ctx_lock);
    CUresult r = REAL(cuCtxDestroy_v2)(ctx);
    if (r == CUDA_SUCCESS) {
        for (unsigned i = 0; i < n_made; i++) {
            if (made[i].ctx == ctx) {
                drop_ctx(ctx, made[i].dev, made[i].bytes);
                made[i] = made[--n_made];
                break;
            }
        }
    }
    pthread_mutex_unlock(&ctx_lock);
    return r;
}

/* ---- what the job sees ------------------------------------------------------------ */

/* total = the limit, free = what is left of it (never below 0), and never
 * more than the GPU really has free. */
static int job_view(int d, uint64_t *free_b, uint64_t *total_b)
{
    if (d < 0)
        return 0;
    uint64_t limit = vgpu_dev_limit(d);
    if (limit == 0)
        return 0;
    uint64_t used = vgpu_job_used(d);
    uint64_t left = limit > used ? limit - used : 0;
    if (left < *free_b)
        *free_b = left;
    *total_b = limit;
    return 1;
}

CUresult hook_cuMemGetInfo_v2(size_t *free, size_t *total)
{
    ENTER(cuMemGetInfo_v2, (free, total));
    CU_PROLOGUE(cuMemGetInfo_v2, (free, total));
    CUresult r = REAL(cuMemGetInfo_v2)(free, total);
    if (r != CUDA_SUCCESS)
        return r;
    uint64_t f = *free, t = *total;
    if (job_view(vgpu_dev_for_launch(), &f, &t)) {
        *free = (size_t)f;
        *total = (size_t)t;
    }
    return r;
}

static unsigned int clamp32(uint64_t v)
{
    return v > UINT_MAX ? UINT_MAX : (unsigned int)v;
}

CUresult hook_cuMemGetInfo(unsigned int *free, unsigned int *total)
{
    ENTER(cuMemGetInfo, (free, total));
    CU_PROLOGUE(cuMemGetInfo, (free, total));
    CUresult r = REAL(cuMemGetInfo)(free, total);
    if (r != CUDA_SUCCESS)
        return r;
    /* The 32-bit call saturates; ask the 64-bit one for the real free bytes. */
    size_t rf = *free, rt = *total;
    if (vgpu_real_present(VGPU_H_cuMemGetInfo_v2))
        REAL(cuMemGetInfo_v2)(&rf, &rt);
    uint64_t f = rf, t = rt;
    if (job_view(vgpu_dev_for_launch(), &f, &t)) {
        *free = clamp32(f);
        *total = clamp32(t);
    }
    return r;
}

CUresult hook_cuDeviceTotalMem_v2(size_t *bytes, CUdevice dev)
{
    ENTER(cuDeviceTotalMem_v2, (bytes, dev));
    CU_PROLOGUE(cuDeviceTotalMem_v2, (bytes, dev));
    CUresult r = REAL(cuDeviceTotalMem_v2)(bytes, dev);
    if (r != CUDA_SUCCESS)
        return r;
    int d = vgpu_dev_of_ordinal(dev);
    uint64_t limit = d >= 0 ? vgpu_dev_limit(d) : 0;
    if (limit != 0)
        *bytes = (size_t)limit;
    return r;
}

CUresult hook_cuDeviceTotalMem(unsigned int *bytes, CUdevice dev)
{
    ENTER(cuDeviceTotalMem, (bytes, dev));
    CU_PROLOGUE(cuDeviceTotalMem, (bytes, dev));
    CUresult r = REAL(cuDeviceTotalMem)(bytes, dev);
    if (r != CUDA_SUCCESS)
        return r;
    int d = vgpu_dev_of_ordinal(dev);
    uint64_t limit = d >= 0 ? vgpu_dev_limit(d) : 0;
    if (limit != 0)
        *bytes = clamp32(limit);
    return r;
}

/* ---- fork ------------------------------------------------------------------------------ */
void vgpu_memory_atfork_child(void)
{
    for (int s = 0; s < NSHARDS; s++) {
        pthread_mutex_init(&shards[s].lock, NULL);
        free(shards[s].e);
        shards[s].e = NULL;
        shards[s].cap = shards[s].n = 0;
    }
    pthread_mutex_init(&ctx_lock, NULL);
    memset(primary, 0, sizeof(primary));
    n_made = 0;
}
