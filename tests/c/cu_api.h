/*
 * cu_api.h - the driver calls the test programs that link libcuda.so.1
 * directly make: a context and memory (the types: vgpu/cuda_types.h).
 */
#ifndef TESTS_CU_API_H
#define TESTS_CU_API_H

#include "vgpu/cuda_types.h"

extern CUresult cuInit(unsigned int);
extern CUresult cuDeviceGet(CUdevice *, int);
extern CUresult cuDevicePrimaryCtxRetain(CUcontext *, CUdevice);
extern CUresult cuCtxSetCurrent(CUcontext);
extern CUresult cuMemAlloc_v2(CUdeviceptr *, size_t);
extern CUresult cuMemFree_v2(CUdeviceptr);
extern CUresult cuMemGetInfo_v2(size_t *, size_t *);

#endif
