/*
 * absent.c - entry points of features the simulated GPU does not offer.
 * Each exists (programs look them up, and a lookup that fails leaves an
 * error behind in the runtime) and answers as the driver does where the
 * feature is unavailable: CUDA_ERROR_NOT_SUPPORTED.
 *
 *   multicast objects: need NVLink multicast (NVSwitch systems), which
 *     CU_DEVICE_ATTRIBUTE_MULTICAST_SUPPORTED reports absent;
 *   green contexts and device resources: SM partitions are not simulated.
 */
#include "init.h"

/* The parameters document each entry point's signature; none is read. */
#pragma GCC diagnostic ignored "-Wunused-parameter"

#define ABSENT(name, ...)                                                      \
    VGPU_EXPORT CUresult name(__VA_ARGS__)                                     \
    {                                                                          \
        return cu_initialized ? CUDA_ERROR_NOT_SUPPORTED : CUDA_ERROR_NOT_INITIALIZED; \
    }

ABSENT(cuMulticastCreate, void *handle, const void *prop)
ABSENT(cuMulticastAddDevice, unsigned long long handle, CUdevice dev)
ABSENT(cuMulticastBindMem, unsigned long long handle, size_t mc_offset, unsigned long long mem,
       size_t mem_offset, size_t size, unsigned long long flags)
ABSENT(cuMulticastBindAddr, unsigned long long handle, size_t mc_offset, CUdeviceptr ptr,
       size_t size, unsigned long long flags)
ABSENT(cuMulticastUnbind, unsigned long long handle, CUdevice dev, size_t mc_offset, size_t size)
ABSENT(cuMulticastGetGranularity, size_t *gran, const void *prop, int option)

ABSENT(cuGreenCtxCreate, void *phctx, void *desc, CUdevice dev, unsigned int flags)
ABSENT(cuGreenCtxDestroy, void *hctx)
ABSENT(cuCtxFromGreenCtx, CUcontext *pctx, void *hctx)
ABSENT(cuGreenCtxStreamCreate, CUstream *phstream, void *hctx, unsigned int flags, int priority)
ABSENT(cuDeviceGetDevResource, CUdevice dev, void *resource, int type)
ABSENT(cuDevSmResourceSplitByCount, void *result, unsigned int *nb_groups, const void *input,
       void *remaining, unsigned int flags, unsigned int min_count)
ABSENT(cuDevResourceGenerateDesc, void *desc, void *resources, unsigned int n)

/* Interop with graphics APIs (OpenGL, EGL, VDPAU): there is no display
 * driver here, so no graphics resource exists to register or map. External
 * memory and semaphores (and their graph nodes), mipmapped and sparse
 * arrays, graph memory and conditional nodes, asynchronous notifications,
 * NvSciSync, the export of stream-ordered pools, texture and surface
 * references (removed in CUDA 12), unified functions and batched 3D copies
 * are not simulated. Each answers as the driver does for a feature the
 * device does not offer. */
ABSENT(cuArrayGetMemoryRequirements, void)
ABSENT(cuArrayGetPlane, void)
ABSENT(cuArrayGetSparseProperties, void)
ABSENT(cuDestroyExternalMemory, void)
ABSENT(cuDestroyExternalSemaphore, void)
ABSENT(cuDeviceGetNvSciSyncAttributes, void)
ABSENT(cuDeviceRegisterAsyncNotification, void)
ABSENT(cuDeviceUnregisterAsyncNotification, void)
ABSENT(cuEGLStreamConsumerAcquireFrame, void)
ABSENT(cuEGLStreamConsumerConnect, void)
ABSENT(cuEGLStreamConsumerConnectWithFlags, void)
ABSENT(cuEGLStreamConsumerDisconnect, void)
ABSENT(cuEGLStreamConsumerReleaseFrame, void)
ABSENT(cuEGLStreamProducerConnect, void)
ABSENT(cuEGLStreamProducerDisconnect, void)
ABSENT(cuEGLStreamProducerPresentFrame, void)
ABSENT(cuEGLStreamProducerReturnFrame, void)
ABSENT(cuExternalMemoryGetMappedBuffer, void)
ABSENT(cuExternalMemoryGetMappedMipmappedArray, void)
ABSENT(cuGLCtxCreate, void)
ABSENT(cuGLCtxCreate_v2, void)
ABSENT(cuGLGetDevices, void)
ABSENT(cuGLGetDevices_v2, void)
ABSENT(cuGLInit, void)
ABSENT(cuGLMapBufferObject, void)
ABSENT(cuGLMapBufferObject_v2, void)
ABSENT(cuGLMapBufferObject_v2_ptds, void)
ABSENT(cuGLMapBufferObjectAsync, void)
ABSENT(cuGLMapBufferObjectAsync_v2, void)
ABSENT(cuGLMapBufferObjectAsync_v2_ptsz, void)
ABSENT(cuGLRegisterBufferObject, void)
ABSENT(cuGLSetBufferObjectMapFlags, void)
ABSENT(cuGLUnmapBufferObject, void)
ABSENT(cuGLUnmapBufferObjectAsync, void)
ABSENT(cuGLUnregisterBufferObject, void)
ABSENT(cuGraphAddExternalSemaphoresSignalNode, void)
ABSENT(cuGraphAddExternalSemaphoresWaitNode, void)
ABSENT(cuGraphAddMemAllocNode, void)
ABSENT(cuGraphAddMemFreeNode, void)
ABSENT(cuGraphConditionalHandleCreate, void)
ABSENT(cuGraphExecExternalSemaphoresSignalNodeSetParams, void)
ABSENT(cuGraphExecExternalSemaphoresWaitNodeSetParams, void)
ABSENT(cuGraphExternalSemaphoresSignalNodeGetParams, void)
ABSENT(cuGraphExternalSemaphoresSignalNodeSetParams, void)
ABSENT(cuGraphExternalSemaphoresWaitNodeGetParams, void)
ABSENT(cuGraphExternalSemaphoresWaitNodeSetParams, void)
ABSENT(cuGraphMemAllocNodeGetParams, void)
ABSENT(cuGraphMemFreeNodeGetParams, void)
ABSENT(cuGraphicsEGLRegisterImage, void)
ABSENT(cuGraphicsGLRegisterBuffer, void)
ABSENT(cuGraphicsGLRegisterImage, void)
ABSENT(cuGraphicsMapResources, void)
ABSENT(cuGraphicsMapResources_ptsz, void)
ABSENT(cuGraphicsResourceGetMappedEglFrame, void)
ABSENT(cuGraphicsResourceGetMappedMipmappedArray, void)
ABSENT(cuGraphicsResourceGetMappedPointer, void)
ABSENT(cuGraphicsResourceGetMappedPointer_v2, void)
ABSENT(cuGraphicsResourceSetMapFlags, void)
ABSENT(cuGraphicsResourceSetMapFlags_v2, void)
ABSENT(cuGraphicsSubResourceGetMappedArray, void)
ABSENT(cuGraphicsUnmapResources, void)
ABSENT(cuGraphicsUnmapResources_ptsz, void)
ABSENT(cuGraphicsUnregisterResource, void)
ABSENT(cuGraphicsVDPAURegisterOutputSurface, void)
ABSENT(cuGraphicsVDPAURegisterVideoSurface, void)
ABSENT(cuImportExternalMemory, void)
ABSENT(cuImportExternalSemaphore, void)
ABSENT(cuLibraryGetUnifiedFunction, void)
ABSENT(cuMemPoolExportPointer, void)
ABSENT(cuMemPoolExportToShareableHandle, void)
ABSENT(cuMemPoolImportFromShareableHandle, void)
ABSENT(cuMemPoolImportPointer, void)
ABSENT(cuMemcpy3DBatchAsync, void)
ABSENT(cuMemcpy3DBatchAsync_v2, void)
ABSENT(cuMemcpy3DBatchAsync_ptsz, void)
ABSENT(cuMemcpy3DBatchAsync_v2_ptsz, void)
ABSENT(cuMipmappedArrayCreate, void)
ABSENT(cuMipmappedArrayDestroy, void)
ABSENT(cuMipmappedArrayGetLevel, void)
ABSENT(cuMipmappedArrayGetMemoryRequirements, void)
ABSENT(cuMipmappedArrayGetSparseProperties, void)
ABSENT(cuModuleGetSurfRef, void)
ABSENT(cuModuleGetTexRef, void)
ABSENT(cuSignalExternalSemaphoresAsync, void)
ABSENT(cuSignalExternalSemaphoresAsync_ptsz, void)
ABSENT(cuVDPAUCtxCreate, void)
ABSENT(cuVDPAUCtxCreate_v2, void)
ABSENT(cuVDPAUGetDevice, void)
ABSENT(cuWaitExternalSemaphoresAsync, void)
ABSENT(cuWaitExternalSemaphoresAsync_ptsz, void)
/* Deprecated since CUDA 11.3 (cudart 12.x still looks it up); launches on
 * several devices at once are not simulated. */
ABSENT(cuLaunchCooperativeKernelMultiDevice, void)
