/*
 * memory.c - the memory limit on every allocating entry point and its free,
 * and the job's view of memory.
 *
 * Reserve (reserve.c), call the driver, roll back when the call fails, and
 * remember the reservation (alloctab.c) so the free gives back exactly that.
 * What is reserved is what the driver really takes: sizes rounded up to its
 * 2 MiB granularity, pitch x height from the real pitch, arrays from their
 * descriptor.
 */
#define _GNU_SOURCE
#include <limits.h>
#include <stdint.h>

#include "hook.h"
#include "vgpu/array.h"

#define PITCH_ALIGN 512ull

static uint64_t mul_sat(uint64_t a, uint64_t b)
{
    uint64_t r;
    return __builtin_mul_overflow(a, b, &r) ? UINT64_MAX : r;
}

/* ---- common steps ------------------------------------------------------------ */
static CUcontext current_ctx(void)
{
    CUcontext c = NULL;
    if (REAL(cuCtxGetCurrent)(&c) != CUDA_SUCCESS)
        return NULL;
    return c;
}

/* The slot's count of allocating calls, a diagnostic (does the hook see
 * them?): a load and a store, not a locked add, so that it costs an
 * allocation nothing it needs; two threads of the process allocating at the
 * same instant may count one. */
static inline void count_alloc(void)
{
    uint64_t *n = &vgpu_g_slot->allocs;
    __atomic_store_n(n, __atomic_load_n(n, __ATOMIC_RELAXED) + 1, __ATOMIC_RELAXED);
}

/* What vgpu_track answered, when not 0: the key was there (its free went
 * another way: its old reservation goes back), or no host memory. */
static void remembered(int r, const struct vgpu_alloc *old)
{
    if (r == 1)
        vgpu_unreserve(old->dev, old->size, 0);
    else if (r < 0)
        vgpu_log(VGPU_LOG_ERROR, "out of host memory for the allocation table; "
                 "a free will not give its bytes back");
}

/* After a successful allocation: remember it. */
static inline void remember(uint32_t kind, uint64_t key, uint64_t size, int d, CUcontext ctx)
{
    struct vgpu_alloc old;
    int r = kind == VGPU_K_PTR ? vgpu_track_ptr(key, size, d, ctx, &old)
                               : vgpu_track(kind, key, size, d, ctx, &old);
    if (VGPU_UNLIKELY(r != 0))
        remembered(r, &old);
}

/* A free the driver refused: the allocation is still there, its entry goes
 * back in the table. */
static void kept(const struct vgpu_alloc *e)
{
    struct vgpu_alloc old;
    if (vgpu_track(e->kind, e->key, e->size, e->dev, e->ctx, &old) == 1)
        vgpu_unreserve(old.dev, old.size, 0);
}

/* After the real free: give back the reservation, or put it back in the
 * table when the free failed. */
static inline void settle_free(int had, const struct vgpu_alloc *e, CUresult r)
{
    if (!had)
        return;
    /* Freed: by this call, or (a device pointer the driver no longer
     * knows) by another thread's free of the same pointer, which found the
     * entry taken by this one and went to the driver first. Either way it
     * holds nothing now; kept only when the driver refused for another
     * reason (the allocation is still there). */
    if (VGPU_LIKELY(r == CUDA_SUCCESS) || (e->kind == VGPU_K_PTR && r == CUDA_ERROR_INVALID_VALUE))
        vgpu_unreserve(e->dev, e->size, 0);
    else
        kept(e);
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
        uint64_t sz_ = vgpu_round_gran(bytes); \
        if (!vgpu_reserve(d_, sz_, 0, #sym)) \
            return CUDA_ERROR_OUT_OF_MEMORY; \
        CUresult r_ = REAL(sym) args; \
        if (r_ != CUDA_SUCCESS) { \
            vgpu_unreserve(d_, sz_, 0); \
            return r_; \
        } \
        remember(VGPU_K_PTR, *dptr, sz_, d_, current_ctx()); \
        return r_; \
    } while (0)

#define PLAIN_FREE(sym, args, kind, key) \
    do { \
        ENTER(sym, args); \
        CU_PROLOGUE(sym, args); \
        struct vgpu_alloc e_; \
        uint64_t k_ = (uint64_t)(uintptr_t)(key); \
        int had_ = (kind) == VGPU_K_PTR ? vgpu_untrack_ptr(k_, &e_) \
                                        : vgpu_untrack(kind, k_, &e_); \
        CUresult r_ = REAL(sym) args; \
        settle_free(had_, &e_, r_); \
        if (!had_) /* perhaps a pool's: what the pool holds now */ \
            vgpu_pool_settle_all(); \
        return r_; \
    } while (0)

/* A stream-ordered allocation from `pool` (see pool.c): reserve what the pool
 * lacks, call, then charge the job what the pool holds. */
#define POOL_ALLOC(sym, args, pool, bytes) \
    do { \
        ENTER(sym, args); \
        CU_PROLOGUE(sym, args); \
        count_alloc(); \
        int d_ = vgpu_dev_for_launch(); \
        CUmemoryPool pool_ = d_ == VGPU_DEV_NO_CONTEXT ? NULL : (pool); \
        if (!pool_) \
            return REAL(sym) args; \
        uint64_t sz_ = vgpu_round_gran(bytes), spare_ = vgpu_pool_spare(pool_); \
        uint64_t need_ = sz_ > spare_ ? sz_ - spare_ : 0; \
        if (need_ && !vgpu_reserve(d_, need_, 0, #sym)) \
            return CUDA_ERROR_OUT_OF_MEMORY; \
        CUresult r_ = REAL(sym) args; \
        if (r_ != CUDA_SUCCESS) { \
            vgpu_unreserve(d_, need_, 0); \
            return r_; \
        } \
        vgpu_pool_settle(pool_, d_, need_); \
        return r_; \
    } while (0)

/* The pool cuMemAllocAsync takes from: the current device's. */
static CUmemoryPool current_pool(void)
{
    CUdevice dev;
    CUmemoryPool pool = NULL;
    if (REAL(cuCtxGetDevice)(&dev) != CUDA_SUCCESS ||
        REAL(cuDeviceGetMemPool)(&pool, dev) != CUDA_SUCCESS)
        return NULL;
    return pool;
}

/* ---- allocations -------------------------------------------------------------- */
CUresult hook_cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize)
{
    PLAIN_ALLOC(cuMemAlloc_v2, (dptr, bytesize), bytesize);
}

/* What the process used that the driver can't checkpoint (region.h). */
static void note_feature(uint32_t bit)
{
    if (vgpu_g_slot != NULL)
        __atomic_fetch_or(&vgpu_g_slot->features, bit, __ATOMIC_RELAXED);
}

CUresult hook_cuMemAllocManaged(CUdeviceptr *dptr, size_t bytesize, unsigned int flags)
{
    CU_PROLOGUE(cuMemAllocManaged, (dptr, bytesize, flags));
    if (!vgpu_t_inside)
        note_feature(VGPU_FEATURE_MANAGED);   /* asked for: it may yet succeed elsewhere */
    PLAIN_ALLOC(cuMemAllocManaged, (dptr, bytesize, flags), bytesize);
}

/* CUDA IPC: the exporter's and the importer's process both hold memory the
 * driver can't checkpoint (R570). Nothing else is counted here: the memory
 * is the exporter's. */
CUresult hook_cuIpcGetMemHandle(CUipcMemHandle *pHandle, CUdeviceptr dptr)
{
    CU_PROLOGUE(cuIpcGetMemHandle, (pHandle, dptr));
    CUresult r = REAL(cuIpcGetMemHandle)(pHandle, dptr);
    if (r == CUDA_SUCCESS)
        note_feature(VGPU_FEATURE_IPC);
    return r;
}

CUresult hook_cuIpcOpenMemHandle_v2(CUdeviceptr *pdptr, CUipcMemHandle handle,
                                    unsigned int Flags)
{
    CU_PROLOGUE(cuIpcOpenMemHandle_v2, (pdptr, handle, Flags));
    CUresult r = REAL(cuIpcOpenMemHandle_v2)(pdptr, handle, Flags);
    if (r == CUDA_SUCCESS)
        note_feature(VGPU_FEATURE_IPC);
    return r;
}

CUresult hook_cuMemAllocAsync(CUdeviceptr *dptr, size_t bytesize, CUstream hStream)
{
    POOL_ALLOC(cuMemAllocAsync, (dptr, bytesize, hStream), current_pool(), bytesize);
}

CUresult hook_cuMemAllocAsync_ptsz(CUdeviceptr *dptr, size_t bytesize, CUstream hStream)
{
    POOL_ALLOC(cuMemAllocAsync_ptsz, (dptr, bytesize, hStream), current_pool(), bytesize);
}

CUresult hook_cuMemAllocFromPoolAsync(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool,
                                      CUstream hStream)
{
    POOL_ALLOC(cuMemAllocFromPoolAsync, (dptr, bytesize, pool, hStream), pool, bytesize);
}

CUresult hook_cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool,
                                           CUstream hStream)
{
    POOL_ALLOC(cuMemAllocFromPoolAsync_ptsz, (dptr, bytesize, pool, hStream), pool, bytesize);
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
    uint64_t est = vgpu_round_gran(mul_sat(w, Height));
    if (!vgpu_reserve(d, est, 0, "cuMemAllocPitch_v2"))
        return CUDA_ERROR_OUT_OF_MEMORY;
    CUresult r = REAL(cuMemAllocPitch_v2)(dptr, pPitch, WidthInBytes, Height, ElementSizeBytes);
    if (r != CUDA_SUCCESS) {
        vgpu_unreserve(d, est, 0);
        return r;
    }
    uint64_t real = vgpu_round_gran(mul_sat(*pPitch, Height));
    if (real > est) {
        if (!vgpu_reserve(d, real - est, 0, "cuMemAllocPitch_v2")) {
            REAL(cuMemFree_v2)(*dptr);
            vgpu_unreserve(d, est, 0);
            return CUDA_ERROR_OUT_OF_MEMORY;
        }
    } else if (real < est) {
        vgpu_unreserve(d, est - real, 0);
    }
    remember(VGPU_K_PTR, *dptr, real, d, current_ctx());
    return r;
}

CUresult hook_cuMemFree_v2(CUdeviceptr dptr)
{
    PLAIN_FREE(cuMemFree_v2, (dptr), VGPU_K_PTR, dptr);
}

CUresult hook_cuMemFreeAsync(CUdeviceptr dptr, CUstream hStream)
{
    PLAIN_FREE(cuMemFreeAsync, (dptr, hStream), VGPU_K_PTR, dptr);
}

CUresult hook_cuMemFreeAsync_ptsz(CUdeviceptr dptr, CUstream hStream)
{
    PLAIN_FREE(cuMemFreeAsync_ptsz, (dptr, hStream), VGPU_K_PTR, dptr);
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
    uint64_t sz = vgpu_round_gran(size);
    if (!vgpu_reserve(d, sz, 0, "cuMemCreate"))
        return CUDA_ERROR_OUT_OF_MEMORY;
    CUresult r = REAL(cuMemCreate)(handle, size, prop, flags);
    if (r != CUDA_SUCCESS) {
        vgpu_unreserve(d, sz, 0);
        return r;
    }
    remember(VGPU_K_HANDLE, *handle, sz, d, NULL);
    return r;
}


/* ---- arrays ------------------------------------------------------------------- */
static uint64_t dim(size_t v, unsigned level)
{
    uint64_t x = (uint64_t)v >> level;
    return x ? x : 1;
}

static uint64_t array_bytes(size_t w, size_t h, size_t depth, CUarray_format f, unsigned ch,
                            unsigned levels)
{
    /* a format the header does not list (newer drivers have more) is
     * counted at the widest it lists, never below what it may hold */
    uint64_t fb = vgpu_format_bytes(f);
    uint64_t elem = (fb ? fb : VGPU_FORMAT_BYTES_MAX) * (ch ? ch : 1);
    uint64_t total = 0;
    if (levels == 0)
        levels = 1;
    for (unsigned l = 0; l < levels && l < 64; l++) {
        uint64_t n = mul_sat(mul_sat(mul_sat(dim(w, l), dim(h, l)), dim(depth, l)), elem);
        total = total > UINT64_MAX - n ? UINT64_MAX : total + n;
    }
    return vgpu_round_gran(total);
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
        if (!vgpu_reserve(d_, sz_, 0, #sym)) \
            return CUDA_ERROR_OUT_OF_MEMORY; \
        CUresult r_ = REAL(sym) args; \
        if (r_ != CUDA_SUCCESS) { \
            vgpu_unreserve(d_, sz_, 0); \
            return r_; \
        } \
        remember(kind, (uint64_t)(uintptr_t)*pHandle, sz_, d_, current_ctx()); \
        return r_; \
    } while (0)

CUresult hook_cuArrayCreate_v2(CUarray *pHandle, const CUDA_ARRAY_DESCRIPTOR *pAllocateArray)
{
    const CUDA_ARRAY_DESCRIPTOR *desc = pAllocateArray;
    ARRAY_ALLOC(cuArrayCreate_v2, (pHandle, pAllocateArray), VGPU_K_ARRAY,
                array_bytes(desc->Width, desc->Height, 0, desc->Format, desc->NumChannels, 1));
}

CUresult hook_cuArray3DCreate_v2(CUarray *pHandle, const CUDA_ARRAY3D_DESCRIPTOR *pAllocateArray)
{
    const CUDA_ARRAY3D_DESCRIPTOR *desc = pAllocateArray;
    ARRAY_ALLOC(cuArray3DCreate_v2, (pHandle, pAllocateArray), VGPU_K_ARRAY,
                array_bytes(desc->Width, desc->Height, desc->Depth, desc->Format,
                            desc->NumChannels, 1));
}

CUresult hook_cuMipmappedArrayCreate(CUmipmappedArray *pHandle,
                                     const CUDA_ARRAY3D_DESCRIPTOR *pMipmappedArrayDesc,
                                     unsigned int numMipmapLevels)
{
    const CUDA_ARRAY3D_DESCRIPTOR *desc = pMipmappedArrayDesc;
    ARRAY_ALLOC(cuMipmappedArrayCreate, (pHandle, pMipmappedArrayDesc, numMipmapLevels),
                VGPU_K_MIPMAP,
                array_bytes(desc->Width, desc->Height, desc->Depth, desc->Format,
                            desc->NumChannels, numMipmapLevels));
}

CUresult hook_cuArrayDestroy(CUarray hArray)
{
    PLAIN_FREE(cuArrayDestroy, (hArray), VGPU_K_ARRAY, hArray);
}

CUresult hook_cuMipmappedArrayDestroy(CUmipmappedArray hMipmappedArray)
{
    PLAIN_FREE(cuMipmappedArrayDestroy, (hMipmappedArray), VGPU_K_MIPMAP, hMipmappedArray);
}

/* ---- what the job sees ------------------------------------------------------------ */

int vgpu_job_mem_view(int d, uint64_t *free_b, uint64_t *total_b, uint64_t *used_b)
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
    if (used_b != NULL)
        *used_b = used;
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
    if (vgpu_job_mem_view(vgpu_dev_for_launch(), &f, &t, NULL)) {
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
    if (vgpu_job_mem_view(vgpu_dev_for_launch(), &f, &t, NULL)) {
        *free = clamp32(f);
        *total = clamp32(t);
    }
    return r;
}

/* The job's memory limit on device ordinal dev; 0 when it has none there. */
static uint64_t ordinal_limit(CUdevice dev)
{
    int d = vgpu_dev_of_ordinal(dev);
    return d >= 0 ? vgpu_dev_limit(d) : 0;
}

CUresult hook_cuDeviceTotalMem_v2(size_t *bytes, CUdevice dev)
{
    ENTER(cuDeviceTotalMem_v2, (bytes, dev));
    CU_PROLOGUE(cuDeviceTotalMem_v2, (bytes, dev));
    CUresult r = REAL(cuDeviceTotalMem_v2)(bytes, dev);
    if (r != CUDA_SUCCESS)
        return r;
    uint64_t limit = ordinal_limit(dev);
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
    uint64_t limit = ordinal_limit(dev);
    if (limit != 0)
        *bytes = clamp32(limit);
    return r;
}
