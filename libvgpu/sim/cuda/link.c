/*
 * link.c - the JIT linker (cuLinkCreate to cuLinkDestroy). Nothing is
 * compiled or linked here: a link's result is the first image added to it
 * (PTX or a cubin, which the loaders of module.c read as they are).
 */
#include <stdlib.h>
#include <string.h>

#include "init.h"
#include "module.h"

struct link_state {
    void *image;
    size_t size;
};

VGPU_EXPORT CUresult cuLinkCreate_v2(unsigned int n, CUjit_option *opts, void **values,
                                     void **state)
{
    if (!cu_initialized)
        return CUDA_ERROR_NOT_INITIALIZED;
    if (!state || (n && (!opts || !values)))
        return CUDA_ERROR_INVALID_VALUE;
    cu_module_empty_logs(n, opts, values);
    *state = calloc(1, sizeof(struct link_state));
    return *state ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
}
VGPU_ALIAS(cuLinkCreate_v2, cuLinkCreate)

VGPU_EXPORT CUresult cuLinkAddData_v2(void *state, int type, void *data, size_t size,
                                      const char *name, unsigned int n, CUjit_option *opts,
                                      void **values)
{
    (void)type, (void)name;
    struct link_state *l = state;
    if (!l || !data || !size)
        return CUDA_ERROR_INVALID_VALUE;
    cu_module_empty_logs(n, opts, values);
    if (l->image)
        return CUDA_SUCCESS;
    l->image = malloc(size + 1);
    if (!l->image)
        return CUDA_ERROR_OUT_OF_MEMORY;
    memcpy(l->image, data, size);
    ((char *)l->image)[size] = '\0';
    l->size = size;
    return CUDA_SUCCESS;
}
VGPU_ALIAS(cuLinkAddData_v2, cuLinkAddData)

VGPU_EXPORT CUresult cuLinkAddFile_v2(void *state, int type, const char *path, unsigned int n,
                                      CUjit_option *opts, void **values)
{
    if (!state || !path)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult rc;
    char *img = cu_module_read_file(path, &rc);
    if (!img)
        return rc;
    rc = cuLinkAddData_v2(state, type, img, strlen(img) ? strlen(img) : 1, path, n, opts,
                          values);
    free(img);
    return rc;
}
VGPU_ALIAS(cuLinkAddFile_v2, cuLinkAddFile)

VGPU_EXPORT CUresult cuLinkComplete(void *state, void **cubin, size_t *size)
{
    struct link_state *l = state;
    if (!l || !cubin || !size)
        return CUDA_ERROR_INVALID_VALUE;
    if (!l->image)
        return CUDA_ERROR_INVALID_IMAGE;
    *cubin = l->image;
    *size = l->size;
    return CUDA_SUCCESS;
}

VGPU_EXPORT CUresult cuLinkDestroy(void *state)
{
    struct link_state *l = state;
    if (!l)
        return CUDA_ERROR_INVALID_HANDLE;
    free(l->image);
    free(l);
    return CUDA_SUCCESS;
}
