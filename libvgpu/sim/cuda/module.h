/*
 * module.h - loading images into modules (module.c), for the runtime's
 * loaders in darkapi.c, and reading a file and the JIT's log options, for
 * the JIT linker (link.c).
 */
#ifndef VGPU_SIM_CUDA_MODULE_H
#define VGPU_SIM_CUDA_MODULE_H

#include "handle.h"

/* A module in the current context from a fatbin, or from the runtime's
 * __fatBinC_Wrapper_t around one. */
CUresult cu_module_from_fatbin(CUmodule *mod, const void *image);

/* Call fn(arg, f) for each function a module's image defines; the number of
 * them (an open module's are not known: 0), or -1 for a bad handle. */
int cu_module_functions(CUmodule mod, void (*fn)(void *, CUfunction), void *arg);

/* A file's bytes (malloc'ed, a NUL after them), for the loaders and the JIT
 * linker (link.c); NULL with *rc the error. */
void *cu_module_read_file(const char *path, CUresult *rc);
/* Answer the JIT's log options: nothing was logged. */
void cu_module_empty_logs(unsigned int n, CUjit_option *opts, void **values);

#endif /* VGPU_SIM_CUDA_MODULE_H */
