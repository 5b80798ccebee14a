/*
 * copy.c - memcpy and memset, synchronous and asynchronous, 1D, 2D and
 * 3D. Device pointers are checked against the allocation table: a range that
 * is not inside one allocation gets CUDA_ERROR_INVALID_VALUE, as the driver
 * gives, instead of a crash. Synchronous forms first wait for the work queued
 * in the context; asynchronous ones copy at once (see exec.c).
 */
#include <string.h>

#include "alloctab.h"
#include "array.h"
#include "context.h"
#include "copy.h"
#include "exec.h"
#include "gate.h"
#include "stream.h"

typedef struct {
    size_t srcXInBytes, srcY;
    CUmemorytype srcMemoryType;
    const void *srcHost;
    CUdeviceptr srcDevice;
    CUarray srcArray;
    size_t srcPitch;
    size_t dstXInBytes, dstY;
    CUmemorytype dstMemoryType;
    void *dstHost;
    CUdeviceptr dstDevice;
    CUarray dstArray;
    size_t dstPitch;
    size_t WidthInBytes, Height;
} CUDA_MEMCPY2D;

typedef struct {
    size_t srcXInBytes, srcY, srcZ, srcLOD;
    CUmemorytype srcMemoryType;
    const void *srcHost;
    CUdeviceptr srcDevice;
    CUarray srcArray;
    void *reserved0;
    size_t srcPitch, srcHeight;
    size_t dstXInBytes, dstY, dstZ, dstLOD;
    CUmemorytype dstMemoryType;
    void *dstHost;
    CUdeviceptr dstDevice;
    CUarray dstArray;
    void *reserved1;
    size_t dstPitch, dstHeight;
    size_t WidthInBytes, Height, Depth;
} CUDA_MEMCPY3D;

static int dev_ok(uintptr_t p, size_t n)
{
    return n == 0 || mem_find(p, n, NULL);
}

/* Context for a synchronous call: the current one, after its queued work. */
static CUresult sync_begin(void)
{
    CUcontext ctx;
    CUresult rc = cu_current(&ctx);
    if (rc == CUDA_SUCCESS)
        exec_sync_ctx(ctx);
    return rc;
}

static CUresult async_begin(CUstream h)
{
    CUcontext ctx;
    CUstream s;
    return cu_stream_resolve(h, &ctx, &s);
}

/* ---- linear copies ---- */

static CUresult copy_htod(CUdeviceptr dst, const void *src, size_t n)
{
    if ((!src && n) || !dev_ok(dst, n))
        return CUDA_ERROR_INVALID_VALUE;
    if (n)
        memmove((void *)(uintptr_t)dst, src, n);
    return CUDA_SUCCESS;
}

static CUresult copy_dtoh(void *dst, CUdeviceptr src, size_t n)
{
    if ((!dst && n) || !dev_ok(src, n))
        return CUDA_ERROR_INVALID_VALUE;
    if (n)
        memmove(dst, (const void *)(uintptr_t)src, n);
    return CUDA_SUCCESS;
}

static CUresult copy_dtod(CUdeviceptr dst, CUdeviceptr src, size_t n)
{
    if (!dev_ok(dst, n) || !dev_ok(src, n))
        return CUDA_ERROR_INVALID_VALUE;
    if (n)
        memmove((void *)(uintptr_t)dst, (const void *)(uintptr_t)src, n);
    return CUDA_SUCCESS;
}

/* Unified addressing: either side may be host memory. A range that starts
 * inside an allocation must end inside it too. */
static CUresult copy_any(CUdeviceptr dst, CUdeviceptr src, size_t n)
{
    if (n == 0)
        return CUDA_SUCCESS;
    if (!dst || !src)
        return CUDA_ERROR_INVALID_VALUE;
    if ((mem_find(dst, 1, NULL) && !dev_ok(dst, n)) || (mem_find(src, 1, NULL) && !dev_ok(src, n)))
        return CUDA_ERROR_INVALID_VALUE;
    memmove((void *)(uintptr_t)dst, (const void *)(uintptr_t)src, n);
    return CUDA_SUCCESS;
}

/* A copy is a bracket of the API gate (gate.h): it must not touch device
 * memory while a checkpoint has it. */
#define SYNC(call)                     \
    do {                               \
        GATE_BRACKET;                  \
        CUresult rc_ = sync_begin();   \
        return rc_ ? rc_ : (call);     \
    } while (0)
#define ASYNC(stream, call)                  \
    do {                                     \
        GATE_BRACKET;                        \
        CUresult rc_ = async_begin(stream);  \
        return rc_ ? rc_ : (call);           \
    } while (0)

VGPU_EXPORT CUresult cuMemcpyHtoD_v2(CUdeviceptr dst, const void *src, size_t n)
{
    SYNC(copy_htod(dst, src, n));
}
VGPU_ALIAS(cuMemcpyHtoD_v2, cuMemcpyHtoD_v2_ptds)

VGPU_EXPORT CUresult cuMemcpyDtoH_v2(void *dst, CUdeviceptr src, size_t n)
{
    SYNC(copy_dtoh(dst, src, n));
}
VGPU_ALIAS(cuMemcpyDtoH_v2, cuMemcpyDtoH_v2_ptds)

VGPU_EXPORT CUresult cuMemcpyDtoD_v2(CUdeviceptr dst, CUdeviceptr src, size_t n)
{
    SYNC(copy_dtod(dst, src, n));
}
VGPU_ALIAS(cuMemcpyDtoD_v2, cuMemcpyDtoD_v2_ptds)

VGPU_EXPORT CUresult cuMemcpy(CUdeviceptr dst, CUdeviceptr src, size_t n)
{
    SYNC(copy_any(dst, src, n));
}
VGPU_ALIAS(cuMemcpy, cuMemcpy_ptds)

VGPU_EXPORT CUresult cuMemcpyPeer(CUdeviceptr dst, CUcontext dctx, CUdeviceptr src, CUcontext sctx,
                                  size_t n)
{
    if (!cu_ctx_valid(dctx) || !cu_ctx_valid(sctx))
        return CUDA_ERROR_INVALID_CONTEXT;
    SYNC(copy_dtod(dst, src, n));
}
VGPU_ALIAS(cuMemcpyPeer, cuMemcpyPeer_ptds)

VGPU_EXPORT CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr dst, const void *src, size_t n, CUstream s)
{
    ASYNC(s, copy_htod(dst, src, n));
}
VGPU_ALIAS(cuMemcpyHtoDAsync_v2, cuMemcpyHtoDAsync_v2_ptsz)

VGPU_EXPORT CUresult cuMemcpyDtoHAsync_v2(void *dst, CUdeviceptr src, size_t n, CUstream s)
{
    ASYNC(s, copy_dtoh(dst, src, n));
}
VGPU_ALIAS(cuMemcpyDtoHAsync_v2, cuMemcpyDtoHAsync_v2_ptsz)

VGPU_EXPORT CUresult cuMemcpyDtoDAsync_v2(CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream s)
{
    ASYNC(s, copy_dtod(dst, src, n));
}
VGPU_ALIAS(cuMemcpyDtoDAsync_v2, cuMemcpyDtoDAsync_v2_ptsz)

VGPU_EXPORT CUresult cuMemcpyAsync(CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream s)
{
    ASYNC(s, copy_any(dst, src, n));
}
VGPU_ALIAS(cuMemcpyAsync, cuMemcpyAsync_ptsz)

VGPU_EXPORT CUresult cuMemcpyPeerAsync(CUdeviceptr dst, CUcontext dctx, CUdeviceptr src,
                                       CUcontext sctx, size_t n, CUstream s)
{
    if (!cu_ctx_valid(dctx) || !cu_ctx_valid(sctx))
        return CUDA_ERROR_INVALID_CONTEXT;
    ASYNC(s, copy_dtod(dst, src, n));
}
VGPU_ALIAS(cuMemcpyPeerAsync, cuMemcpyPeerAsync_ptsz)

/* ---- arrays ---- */

static CUresult array_range(CUarray a, size_t off, size_t n, uintptr_t *p)
{
    uintptr_t base;
    size_t row, rows;
    if (cu_array_span(a, &base, &row, &rows) < 0)
        return CUDA_ERROR_INVALID_HANDLE;
    if (off > row * rows || n > row * rows - off)
        return CUDA_ERROR_INVALID_VALUE;
    *p = base + off;
    return CUDA_SUCCESS;
}

static CUresult copy_htoa(CUarray dst, size_t off, const void *src, size_t n)
{
    uintptr_t p;
    CUresult rc = array_range(dst, off, n, &p);
    if (rc == CUDA_SUCCESS && n)
        memmove((void *)p, src, n);
    return rc;
}

static CUresult copy_atoh(void *dst, CUarray src, size_t off, size_t n)
{
    uintptr_t p;
    CUresult rc = array_range(src, off, n, &p);
    if (rc == CUDA_SUCCESS && n)
        memmove(dst, (const void *)p, n);
    return rc;
}

VGPU_EXPORT CUresult cuMemcpyHtoA_v2(CUarray dst, size_t off, const void *src, size_t n)
{
    SYNC(copy_htoa(dst, off, src, n));
}
VGPU_ALIAS(cuMemcpyHtoA_v2, cuMemcpyHtoA_v2_ptds)

VGPU_EXPORT CUresult cuMemcpyAtoH_v2(void *dst, CUarray src, size_t off, size_t n)
{
    SYNC(copy_atoh(dst, src, off, n));
}
VGPU_ALIAS(cuMemcpyAtoH_v2, cuMemcpyAtoH_v2_ptds)

VGPU_EXPORT CUresult cuMemcpyHtoAAsync_v2(CUarray dst, size_t off, const void *src, size_t n,
                                          CUstream s)
{
    ASYNC(s, copy_htoa(dst, off, src, n));
}
VGPU_ALIAS(cuMemcpyHtoAAsync_v2, cuMemcpyHtoAAsync_v2_ptsz)

VGPU_EXPORT CUresult cuMemcpyAtoHAsync_v2(void *dst, CUarray src, size_t off, size_t n, CUstream s)
{
    ASYNC(s, copy_atoh(dst, src, off, n));
}
VGPU_ALIAS(cuMemcpyAtoHAsync_v2, cuMemcpyAtoHAsync_v2_ptsz)

/* ---- 2D and 3D ---- */

struct side {
    uintptr_t base;
    size_t pitch;
    int device;
};

static CUresult side_of(CUmemorytype type, const void *host, CUdeviceptr dev, CUarray arr,
                        size_t pitch, struct side *out)
{
    uintptr_t base;
    size_t row, rows;
    switch (type) {
    case CU_MEMORYTYPE_HOST:
        *out = (struct side){(uintptr_t)host, pitch, 0};
        break;
    case CU_MEMORYTYPE_DEVICE:
        *out = (struct side){dev, pitch, 1};
        break;
    case CU_MEMORYTYPE_UNIFIED:
        *out = (struct side){dev, pitch, mem_find(dev, 1, NULL)};
        break;
    case CU_MEMORYTYPE_ARRAY:
        if (cu_array_span(arr, &base, &row, &rows) < 0)
            return CUDA_ERROR_INVALID_HANDLE;
        *out = (struct side){base, row, 1};
        break;
    default:
        return CUDA_ERROR_INVALID_VALUE;
    }
    if (!out->base)
        return CUDA_ERROR_INVALID_VALUE;
    return CUDA_SUCCESS;
}

/* Copy `depth` slices of `height` rows of `width` bytes. */
static CUresult copy_3d(struct side src, size_t sx, size_t sy, size_t sz, size_t sh,
                        struct side dst, size_t dx, size_t dy, size_t dz, size_t dh,
                        size_t width, size_t height, size_t depth)
{
    if (!width || !height || !depth)
        return CUDA_SUCCESS;
    if (width > src.pitch || width > dst.pitch)
        return CUDA_ERROR_INVALID_VALUE;
    size_t soff = (sz * sh + sy) * src.pitch + sx, doff = (dz * dh + dy) * dst.pitch + dx;
    size_t sspan = ((depth - 1) * sh + height - 1) * src.pitch + width;
    size_t dspan = ((depth - 1) * dh + height - 1) * dst.pitch + width;
    if ((src.device && !dev_ok(src.base + soff, sspan)) ||
        (dst.device && !dev_ok(dst.base + doff, dspan)))
        return CUDA_ERROR_INVALID_VALUE;
    for (size_t z = 0; z < depth; z++)
        for (size_t y = 0; y < height; y++)
            memmove((void *)(dst.base + doff + (z * dh + y) * dst.pitch),
                    (const void *)(src.base + soff + (z * sh + y) * src.pitch), width);
    return CUDA_SUCCESS;
}

static CUresult copy3d(const CUDA_MEMCPY3D *c)
{
    if (!c)
        return CUDA_ERROR_INVALID_VALUE;
    struct side s, d;
    CUresult rc = side_of(c->srcMemoryType, c->srcHost, c->srcDevice, c->srcArray, c->srcPitch, &s);
    if (!rc)
        rc = side_of(c->dstMemoryType, c->dstHost, c->dstDevice, c->dstArray, c->dstPitch, &d);
    if (rc)
        return rc;
    size_t sh = c->srcMemoryType == CU_MEMORYTYPE_ARRAY ? c->Height : c->srcHeight;
    size_t dh = c->dstMemoryType == CU_MEMORYTYPE_ARRAY ? c->Height : c->dstHeight;
    if (c->Depth > 1 && (sh < c->Height || dh < c->Height))
        return CUDA_ERROR_INVALID_VALUE;
    return copy_3d(s, c->srcXInBytes, c->srcY, c->srcZ, sh, d, c->dstXInBytes, c->dstY, c->dstZ,
                   dh, c->WidthInBytes, c->Height, c->Depth ? c->Depth : 1);
}

/* A 2D copy: the 3D copy of one slice, from the same fields. */
static CUresult copy2d(const CUDA_MEMCPY2D *c)
{
    if (!c)
        return CUDA_ERROR_INVALID_VALUE;
    const CUDA_MEMCPY3D slice = {
        .srcXInBytes = c->srcXInBytes, .srcY = c->srcY, .srcMemoryType = c->srcMemoryType,
        .srcHost = c->srcHost, .srcDevice = c->srcDevice, .srcArray = c->srcArray,
        .srcPitch = c->srcPitch,
        .dstXInBytes = c->dstXInBytes, .dstY = c->dstY, .dstMemoryType = c->dstMemoryType,
        .dstHost = c->dstHost, .dstDevice = c->dstDevice, .dstArray = c->dstArray,
        .dstPitch = c->dstPitch,
        .WidthInBytes = c->WidthInBytes, .Height = c->Height, .Depth = 1,
    };
    return copy3d(&slice);
}

VGPU_EXPORT CUresult cuMemcpy2D_v2(const CUDA_MEMCPY2D *c) { SYNC(copy2d(c)); }
VGPU_ALIAS(cuMemcpy2D_v2, cuMemcpy2D_v2_ptds)
VGPU_ALIAS(cuMemcpy2D_v2, cuMemcpy2DUnaligned_v2)
VGPU_ALIAS(cuMemcpy2D_v2, cuMemcpy2DUnaligned_v2_ptds)

VGPU_EXPORT CUresult cuMemcpy2DAsync_v2(const CUDA_MEMCPY2D *c, CUstream s) { ASYNC(s, copy2d(c)); }
VGPU_ALIAS(cuMemcpy2DAsync_v2, cuMemcpy2DAsync_v2_ptsz)

VGPU_EXPORT CUresult cuMemcpy3D_v2(const CUDA_MEMCPY3D *c) { SYNC(copy3d(c)); }
VGPU_ALIAS(cuMemcpy3D_v2, cuMemcpy3D_v2_ptds)

VGPU_EXPORT CUresult cuMemcpy3DAsync_v2(const CUDA_MEMCPY3D *c, CUstream s) { ASYNC(s, copy3d(c)); }
VGPU_ALIAS(cuMemcpy3DAsync_v2, cuMemcpy3DAsync_v2_ptsz)

/* A copy between contexts: CUDA_MEMCPY3D_PEER is CUDA_MEMCPY3D with the
 * source's and destination's contexts where the latter has reserved
 * fields; the contexts don't matter here (one address space). */
VGPU_EXPORT CUresult cuMemcpy3DPeer(const CUDA_MEMCPY3D *c) { SYNC(copy3d(c)); }
VGPU_ALIAS(cuMemcpy3DPeer, cuMemcpy3DPeer_ptds)

VGPU_EXPORT CUresult cuMemcpy3DPeerAsync(const CUDA_MEMCPY3D *c, CUstream s) { ASYNC(s, copy3d(c)); }
VGPU_ALIAS(cuMemcpy3DPeerAsync, cuMemcpy3DPeerAsync_ptsz)

/* ---- batches of copies (CUDA 12.8) ----
 * Each copy as cuMemcpyAsync would do it; the attributes (access order,
 * location hints) change nothing here, but each copy must be covered by one:
 * attrsIdxs start at 0 and grow. CUDA 12.8's form also names the copy that
 * failed (failIdx); 13.0's does not. */

struct memcpy_attrs {
    int src_access_order;
    CUmemLocation src_hint, dst_hint;
    unsigned int flags;
};

static CUresult batch(CUdeviceptr *dsts, CUdeviceptr *srcs, size_t *sizes, size_t count,
                      const struct memcpy_attrs *attrs, size_t *idx, size_t nattrs,
                      size_t *fail, CUstream h)
{
    if (fail)
        *fail = SIZE_MAX;
    CUresult rc = async_begin(h);
    if (rc)
        return rc;
    if (!count || !dsts || !srcs || !sizes || !attrs || !idx || !nattrs || nattrs > count ||
        idx[0] != 0)
        return CUDA_ERROR_INVALID_VALUE;
    for (size_t i = 0; i < nattrs; i++) {
        if ((i && idx[i] <= idx[i - 1]) || idx[i] >= count || attrs[i].src_access_order < 0 ||
            attrs[i].src_access_order > 3)
            return CUDA_ERROR_INVALID_VALUE;
    }
    for (size_t i = 0; i < count; i++) {
        rc = copy_any(dsts[i], srcs[i], sizes[i]);
        if (rc) {
            if (fail)
                *fail = i;
            return rc;
        }
    }
    return CUDA_SUCCESS;
}

VGPU_EXPORT CUresult cuMemcpyBatchAsync(CUdeviceptr *dsts, CUdeviceptr *srcs, size_t *sizes,
                                        size_t count, struct memcpy_attrs *attrs, size_t *idx,
                                        size_t nattrs, size_t *fail, CUstream h)
{
    return batch(dsts, srcs, sizes, count, attrs, idx, nattrs, fail, h);
}
VGPU_ALIAS(cuMemcpyBatchAsync, cuMemcpyBatchAsync_ptsz)

VGPU_EXPORT CUresult cuMemcpyBatchAsync_v2(CUdeviceptr *dsts, CUdeviceptr *srcs, size_t *sizes,
                                           size_t count, struct memcpy_attrs *attrs,
                                           size_t *idx, size_t nattrs, CUstream h)
{
    return batch(dsts, srcs, sizes, count, attrs, idx, nattrs, NULL, h);
}
VGPU_ALIAS(cuMemcpyBatchAsync_v2, cuMemcpyBatchAsync_v2_ptsz)

/* Used by graph memcpy nodes. */
CUresult cu_copy3d(const void *params)
{
    return copy3d(params);
}

/* ---- memset ---- */

static CUresult set2d(CUdeviceptr dst, size_t pitch, unsigned int value, unsigned int elem,
                      size_t width, size_t height)
{
    if (!width || !height)
        return CUDA_SUCCESS;
    size_t row = width * elem;
    if (dst % elem || (height > 1 && pitch < row) ||
        !dev_ok(dst, (height - 1) * pitch + row))
        return CUDA_ERROR_INVALID_VALUE;
    for (size_t y = 0; y < height; y++) {
        unsigned char *p = (unsigned char *)(uintptr_t)(dst + y * pitch);
        if (elem == 1) {
            memset(p, (int)(value & 0xff), width);
        } else if (elem == 2) {
            uint16_t v = (uint16_t)value;
            for (size_t i = 0; i < width; i++)
                memcpy(p + 2 * i, &v, 2);
        } else {
            uint32_t v = value;
            for (size_t i = 0; i < width; i++)
                memcpy(p + 4 * i, &v, 4);
        }
    }
    return CUDA_SUCCESS;
}

/* Used by graph memset nodes. */
CUresult cu_memset2d(CUdeviceptr dst, size_t pitch, unsigned int value, unsigned int elem,
                     size_t width, size_t height)
{
    if (elem != 1 && elem != 2 && elem != 4)
        return CUDA_ERROR_INVALID_VALUE;
    return set2d(dst, pitch, value, elem, width, height);
}

VGPU_EXPORT CUresult cuMemsetD8_v2(CUdeviceptr d, unsigned char v, size_t n) { SYNC(set2d(d, n, v, 1, n, 1)); }
VGPU_EXPORT CUresult cuMemsetD16_v2(CUdeviceptr d, unsigned short v, size_t n) { SYNC(set2d(d, 2 * n, v, 2, n, 1)); }
VGPU_EXPORT CUresult cuMemsetD32_v2(CUdeviceptr d, unsigned int v, size_t n) { SYNC(set2d(d, 4 * n, v, 4, n, 1)); }
VGPU_ALIAS(cuMemsetD8_v2, cuMemsetD8_v2_ptds)
VGPU_ALIAS(cuMemsetD16_v2, cuMemsetD16_v2_ptds)
VGPU_ALIAS(cuMemsetD32_v2, cuMemsetD32_v2_ptds)

VGPU_EXPORT CUresult cuMemsetD2D8_v2(CUdeviceptr d, size_t pitch, unsigned char v, size_t w, size_t h)
{
    SYNC(set2d(d, pitch, v, 1, w, h));
}
VGPU_EXPORT CUresult cuMemsetD2D16_v2(CUdeviceptr d, size_t pitch, unsigned short v, size_t w, size_t h)
{
    SYNC(set2d(d, pitch, v, 2, w, h));
}
VGPU_EXPORT CUresult cuMemsetD2D32_v2(CUdeviceptr d, size_t pitch, unsigned int v, size_t w, size_t h)
{
    SYNC(set2d(d, pitch, v, 4, w, h));
}
VGPU_ALIAS(cuMemsetD2D8_v2, cuMemsetD2D8_v2_ptds)
VGPU_ALIAS(cuMemsetD2D16_v2, cuMemsetD2D16_v2_ptds)
VGPU_ALIAS(cuMemsetD2D32_v2, cuMemsetD2D32_v2_ptds)

VGPU_EXPORT CUresult cuMemsetD8Async(CUdeviceptr d, unsigned char v, size_t n, CUstream s)
{
    ASYNC(s, set2d(d, n, v, 1, n, 1));
}
VGPU_EXPORT CUresult cuMemsetD16Async(CUdeviceptr d, unsigned short v, size_t n, CUstream s)
{
    ASYNC(s, set2d(d, 2 * n, v, 2, n, 1));
}
VGPU_EXPORT CUresult cuMemsetD32Async(CUdeviceptr d, unsigned int v, size_t n, CUstream s)
{
    ASYNC(s, set2d(d, 4 * n, v, 4, n, 1));
}
VGPU_EXPORT CUresult cuMemsetD2D8Async(CUdeviceptr d, size_t pitch, unsigned char v, size_t w,
                                       size_t h, CUstream s)
{
    ASYNC(s, set2d(d, pitch, v, 1, w, h));
}
VGPU_EXPORT CUresult cuMemsetD2D16Async(CUdeviceptr d, size_t pitch, unsigned short v, size_t w,
                                        size_t h, CUstream s)
{
    ASYNC(s, set2d(d, pitch, v, 2, w, h));
}
VGPU_EXPORT CUresult cuMemsetD2D32Async(CUdeviceptr d, size_t pitch, unsigned int v, size_t w,
                                        size_t h, CUstream s)
{
    ASYNC(s, set2d(d, pitch, v, 4, w, h));
}
VGPU_ALIAS(cuMemsetD8Async, cuMemsetD8Async_ptsz)
VGPU_ALIAS(cuMemsetD16Async, cuMemsetD16Async_ptsz)
VGPU_ALIAS(cuMemsetD32Async, cuMemsetD32Async_ptsz)
VGPU_ALIAS(cuMemsetD2D8Async, cuMemsetD2D8Async_ptsz)
VGPU_ALIAS(cuMemsetD2D16Async, cuMemsetD2D16Async_ptsz)
VGPU_ALIAS(cuMemsetD2D32Async, cuMemsetD2D32Async_ptsz)
