/*
 * module.h - loading images into modules (module.c), for the runtime's
 * loaders in darkapi.c.
 */
#ifndef VGPU_SIM_CUDA_MODULE_H
#define VGPU_SIM_CUDA_MODULE_H

#include "handle.h"

/* A module in the current context from a fatbin, or from the runtime's
 * __fatBinC_Wrapper_t around one. */
CUresult cu_module_from_fatbin(CUmodule *mod, const void *image);

#endif /* VGPU_SIM_CUDA_MODULE_H */
