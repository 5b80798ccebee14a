/*
 * array.c - CUDA arrays: device memory of a given format and shape, taken
 * from the allocation table (ALLOC_ARRAY), which copies read and write
 * (copy.c, through array.h).
 */
#include "alloctab.h"
#include "array.h"
#include "context.h"
#include "init.h"
#include "vgpu/array.h"

struct CUarray_st {
    uint32_t magic;
    CUDA_ARRAY3D_DESCRIPTOR desc;
    uintptr_t base;
    size_t row;  /* bytes per row */
    size_t rows; /* height x depth */
};

int cu_array_span(CUarray a, uintptr_t *base, size_t *row, size_t *rows)
{
    if (!cu_obj_is(a, MAGIC_ARRAY))
        return -1;
    *base = a->base;
    *row = a->row;
    *rows = a->rows;
    return 0;
}

static CUresult array_create(CUarray *pa, const CUDA_ARRAY3D_DESCRIPTOR *d)
{
    CURRENT_CONTEXT(ctx);
    size_t fb = d ? vgpu_format_bytes(d->Format) : 0;
    if (!pa || !fb || d->Width == 0 ||
        (d->NumChannels != 1 && d->NumChannels != 2 && d->NumChannels != 4))
        return CUDA_ERROR_INVALID_VALUE;
    struct CUarray_st *a = cu_obj_new(sizeof *a, MAGIC_ARRAY);
    if (!a)
        return CUDA_ERROR_OUT_OF_MEMORY;
    a->desc = *d;
    a->row = d->Width * fb * d->NumChannels;
    a->rows = (d->Height ? d->Height : 1) * (d->Depth ? d->Depth : 1);
    CUresult rc = mem_alloc(ctx, a->row * a->rows, ALLOC_ARRAY, 0, &a->base);
    if (rc) {
        cu_obj_del(a, sizeof *a);
        return rc;
    }
    *pa = a;
    return CUDA_SUCCESS;
}

VGPU_EXPORT CUresult cuArrayCreate_v2(CUarray *pa, const CUDA_ARRAY_DESCRIPTOR *d)
{
    if (!d)
        return CUDA_ERROR_INVALID_VALUE;
    CUDA_ARRAY3D_DESCRIPTOR d3 = {d->Width, d->Height, 0, d->Format, d->NumChannels, 0};
    return array_create(pa, &d3);
}

VGPU_EXPORT CUresult cuArray3DCreate_v2(CUarray *pa, const CUDA_ARRAY3D_DESCRIPTOR *d)
{
    return array_create(pa, d);
}

VGPU_EXPORT CUresult cuArrayDestroy(CUarray a)
{
    if (!cu_initialized)
        return CUDA_ERROR_NOT_INITIALIZED;
    CHECK_HANDLE(a, MAGIC_ARRAY);
    mem_free(a->base, ALLOC_ARRAY);
    cu_obj_del(a, sizeof *a);
    return CUDA_SUCCESS;
}

VGPU_EXPORT CUresult cuArrayGetDescriptor_v2(CUDA_ARRAY_DESCRIPTOR *d, CUarray a)
{
    CHECK_HANDLE(a, MAGIC_ARRAY);
    if (!d)
        return CUDA_ERROR_INVALID_VALUE;
    *d = (CUDA_ARRAY_DESCRIPTOR){a->desc.Width, a->desc.Height, a->desc.Format,
                                 a->desc.NumChannels};
    return CUDA_SUCCESS;
}

VGPU_EXPORT CUresult cuArray3DGetDescriptor_v2(CUDA_ARRAY3D_DESCRIPTOR *d, CUarray a)
{
    CHECK_HANDLE(a, MAGIC_ARRAY);
    ANSWER(d, a->desc);
}
