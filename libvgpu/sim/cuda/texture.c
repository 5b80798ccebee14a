/*
 * texture.c - texture and surface objects. A kernel would sample through
 * them; kernels don't run here, so an object keeps what it was made from,
 * checked as the driver checks it (a resource in device memory or an
 * array), and gives it back.
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "alloctab.h"
#include "context.h"
#include "init.h"

/* sizeof(CUDA_RESOURCE_DESC), sizeof(CUDA_TEXTURE_DESC),
 * sizeof(CUDA_RESOURCE_VIEW_DESC) on 64-bit */
#define RES_DESC_BYTES 144
#define TEX_DESC_BYTES 104
#define VIEW_DESC_BYTES 112

enum { RES_ARRAY = 0, RES_MIPMAPPED = 1, RES_LINEAR = 2, RES_PITCH2D = 3 };

struct view_object {
    int surface;
    unsigned char res[RES_DESC_BYTES];
    unsigned char tex[TEX_DESC_BYTES];
    unsigned char view[VIEW_DESC_BYTES];
    int has_view;
};

/* Objects by handle (a CUtexObject or CUsurfObject is a 64-bit value, 0 is
 * none): handle i + 1 is slot i. */
#define MAX_OBJECTS 65536
static struct view_object *g_objects[MAX_OBJECTS];
static pthread_mutex_t g_obj_lock = PTHREAD_MUTEX_INITIALIZER;

static CUresult check_resource(const unsigned char *res, int surface)
{
    int type;
    memcpy(&type, res, sizeof type);
    if (type == RES_ARRAY) {
        CUarray a;
        memcpy(&a, res + 8, sizeof a);
        return cu_obj_is(a, MAGIC_ARRAY) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
    }
    if (surface)
        return CUDA_ERROR_INVALID_VALUE; /* a surface is over an array */
    if (type == RES_LINEAR || type == RES_PITCH2D) {
        CUdeviceptr p;
        memcpy(&p, res + 8, sizeof p);
        return mem_find(p, 1, NULL) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
    }
    return type == RES_MIPMAPPED ? CUDA_ERROR_NOT_SUPPORTED : CUDA_ERROR_INVALID_VALUE;
}

static CUresult make(unsigned long long *out, const void *res, const void *tex, const void *view,
                     int surface)
{
    CURRENT_CONTEXT(ctx);
    if (!out || !res || (!surface && !tex))
        return CUDA_ERROR_INVALID_VALUE;
    CUresult rc = check_resource(res, surface);
    if (rc)
        return rc;
    struct view_object *o = calloc(1, sizeof *o);
    if (!o)
        return CUDA_ERROR_OUT_OF_MEMORY;
    o->surface = surface;
    memcpy(o->res, res, RES_DESC_BYTES);
    if (tex)
        memcpy(o->tex, tex, TEX_DESC_BYTES);
    if (view) {
        memcpy(o->view, view, VIEW_DESC_BYTES);
        o->has_view = 1;
    }
    pthread_mutex_lock(&g_obj_lock);
    int slot = -1;
    for (int i = 0; i < MAX_OBJECTS && slot < 0; i++)
        if (!g_objects[i])
            slot = i;
    if (slot >= 0)
        g_objects[slot] = o;
    pthread_mutex_unlock(&g_obj_lock);
    if (slot < 0) {
        free(o);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    *out = (unsigned long long)slot + 1;
    return CUDA_SUCCESS;
}

/* The object behind a handle, of that kind; NULL if none. Needs the lock. */
static struct view_object *find(unsigned long long h, int surface)
{
    if (h == 0 || h > MAX_OBJECTS)
        return NULL;
    struct view_object *o = g_objects[h - 1];
    return o && o->surface == surface ? o : NULL;
}

static CUresult destroy(unsigned long long h, int surface)
{
    if (!cu_initialized)
        return CUDA_ERROR_NOT_INITIALIZED;
    pthread_mutex_lock(&g_obj_lock);
    struct view_object *o = find(h, surface);
    if (o)
        g_objects[h - 1] = NULL;
    pthread_mutex_unlock(&g_obj_lock);
    free(o);
    return o ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

/* Copy part `what` (0 resource, 1 texture, 2 view) of an object out. */
static CUresult get(void *out, unsigned long long h, int surface, int what)
{
    if (!cu_initialized)
        return CUDA_ERROR_NOT_INITIALIZED;
    if (!out)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&g_obj_lock);
    struct view_object *o = find(h, surface);
    CUresult rc = CUDA_SUCCESS;
    if (!o)
        rc = CUDA_ERROR_INVALID_VALUE;
    else if (what == 0)
        memcpy(out, o->res, RES_DESC_BYTES);
    else if (what == 1)
        memcpy(out, o->tex, TEX_DESC_BYTES);
    else if (o->has_view)
        memcpy(out, o->view, VIEW_DESC_BYTES);
    else
        rc = CUDA_ERROR_INVALID_VALUE; /* made without a view */
    pthread_mutex_unlock(&g_obj_lock);
    return rc;
}

VGPU_EXPORT CUresult cuTexObjectCreate(unsigned long long *out, const void *res, const void *tex,
                                       const void *view)
{
    return make(out, res, tex, view, 0);
}

VGPU_EXPORT CUresult cuTexObjectDestroy(unsigned long long h)
{
    return destroy(h, 0);
}

VGPU_EXPORT CUresult cuTexObjectGetResourceDesc(void *res, unsigned long long h)
{
    return get(res, h, 0, 0);
}

VGPU_EXPORT CUresult cuTexObjectGetTextureDesc(void *tex, unsigned long long h)
{
    return get(tex, h, 0, 1);
}

VGPU_EXPORT CUresult cuTexObjectGetResourceViewDesc(void *view, unsigned long long h)
{
    return get(view, h, 0, 2);
}

VGPU_EXPORT CUresult cuSurfObjectCreate(unsigned long long *out, const void *res)
{
    return make(out, res, NULL, NULL, 1);
}

VGPU_EXPORT CUresult cuSurfObjectDestroy(unsigned long long h)
{
    return destroy(h, 1);
}

VGPU_EXPORT CUresult cuSurfObjectGetResourceDesc(void *res, unsigned long long h)
{
    return get(res, h, 1, 0);
}
