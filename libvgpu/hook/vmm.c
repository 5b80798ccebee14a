/*
 * vmm.c - a cuMemCreate allocation is charged until the process lets go of
 * it: the driver frees it when its last handle (cuMemCreate's and each
 * cuMemRetainAllocationHandle's) is released *and* its last mapping
 * unmapped, in either order. Releasing a handle that is still mapped (or
 * still retained) gives nothing back here, or a process could keep
 * mapped memory charged to no one: create, map, release, again. NCCL's
 * ncclCuMemFree (retain, release, unmap, release) gives it back at its
 * last step, PyTorch's expandable segments (unmap, release) at theirs.
 *
 * Handles are process-local, so an imported handle
 * (cuMemImportFromShareableHandle) is not ours: its mappings and release
 * count for nothing, as its memory is its exporter's (docs/hook.md).
 */
#include "hook.h"

/* A mapping of one of our handles at ptr: remembered, so that its unmap
 * finds the handle. */
static void track_map(CUdeviceptr ptr, size_t size, CUmemGenericAllocationHandle handle)
{
    struct vgpu_alloc old;
    if (vgpu_track_aux(VGPU_K_MAP, ptr, size, -1, NULL, handle, &old) < 0)
        vgpu_log(VGPU_LOG_ERROR, "out of host memory for the allocation table; "
                 "an unmap will not give its allocation back");
}

CUresult hook_cuMemMap(CUdeviceptr ptr, size_t size, size_t offset,
                       CUmemGenericAllocationHandle handle, unsigned long long flags)
{
    ENTER(cuMemMap, (ptr, size, offset, handle, flags));
    CU_PROLOGUE(cuMemMap, (ptr, size, offset, handle, flags));
    CUresult r = REAL(cuMemMap)(ptr, size, offset, handle, flags);
    if (r == CUDA_SUCCESS && vgpu_handle_adjust(handle, 0, 1, NULL) == 0)
        track_map(ptr, size, handle);
    return r;
}

/* One of our handles lost a reference or a mapping: its charge goes when
 * it has neither left. */
static void settle(CUmemGenericAllocationHandle handle, int dr, int dm)
{
    struct vgpu_alloc e;
    if (vgpu_handle_adjust(handle, dr, dm, &e) == 1)
        vgpu_unreserve(e.dev, e.size, 0);
}

CUresult hook_cuMemUnmap(CUdeviceptr ptr, size_t size)
{
    ENTER(cuMemUnmap, (ptr, size));
    CU_PROLOGUE(cuMemUnmap, (ptr, size));
    CUresult r = REAL(cuMemUnmap)(ptr, size);
    if (r != CUDA_SUCCESS)
        return r;
    /* every mapping in the range, in address order: ours are remembered
     * with their size; elsewhere step by the driver's granularity */
    for (uint64_t p = ptr, end = (uint64_t)ptr + size; p < end;) {
        struct vgpu_alloc m;
        if (vgpu_untrack(VGPU_K_MAP, p, &m)) {
            settle(m.aux, 0, -1);
            p += m.size ? m.size : VGPU_GRANULARITY;
        } else {
            p += VGPU_GRANULARITY;
        }
    }
    return r;
}

CUresult hook_cuMemRetainAllocationHandle(CUmemGenericAllocationHandle *handle, void *addr)
{
    ENTER(cuMemRetainAllocationHandle, (handle, addr));
    CU_PROLOGUE(cuMemRetainAllocationHandle, (handle, addr));
    CUresult r = REAL(cuMemRetainAllocationHandle)(handle, addr);
    if (r == CUDA_SUCCESS && handle != NULL)
        vgpu_handle_adjust(*handle, 1, 0, NULL);
    return r;
}

CUresult hook_cuMemRelease(CUmemGenericAllocationHandle handle)
{
    ENTER(cuMemRelease, (handle));
    CU_PROLOGUE(cuMemRelease, (handle));
    /* taken out before the driver can hand the same value to another
     * cuMemCreate; put back if the driver refuses */
    struct vgpu_alloc e;
    int gone = vgpu_handle_adjust(handle, -1, 0, &e);
    CUresult r = REAL(cuMemRelease)(handle);
    if (r != CUDA_SUCCESS) {
        if (gone == 1) {
            struct vgpu_alloc old;
            if (vgpu_track(e.kind, e.key, e.size, e.dev, e.ctx, &old) == 1)
                vgpu_unreserve(old.dev, old.size, 0);
        } else if (gone == 0) {
            vgpu_handle_adjust(handle, 1, 0, NULL);
        }
        return r;
    }
    if (gone == 1)
        vgpu_unreserve(e.dev, e.size, 0);
    else if (gone < 0)
        vgpu_pool_settle_all();    /* as any free of what is not ours */
    return r;
}
