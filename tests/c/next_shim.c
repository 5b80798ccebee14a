/*
 * next_shim.c - another interposer, preloaded after libvgpu.so: it wraps
 * time() and finds the next definition with dlsym(RTLD_NEXT, "time"), as
 * interposers do. With libvgpu.so's dlsym in between, RTLD_NEXT must still be
 * resolved relative to this library (else it finds its own time() again).
 *
 * It also defines cuMemAlloc_v2, a name the hook wraps: next_shim_cu_next()
 * returns what dlsym(RTLD_NEXT, "cuMemAlloc_v2") gives this library, which
 * must be the driver's function (or the hook's wrapper of it), never this
 * library's own.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stddef.h>
#include <stdio.h>
#include <time.h>

#define EXPORT __attribute__((visibility("default")))

time_t time(time_t *t);
static time_t own_time(time_t *t);
EXPORT time_t time(time_t *t)
{
    return own_time(t);
}

static time_t own_time(time_t *t)
{
    time_t (*next)(time_t *) = (time_t(*)(time_t *))dlsym(RTLD_NEXT, "time");
    return next && next != time ? next(t) : (time_t)-1;
}

__attribute__((constructor)) static void check(void)
{
    void *next = dlsym(RTLD_NEXT, "time");
    void *self = dlsym(RTLD_DEFAULT, "time");
    fprintf(stderr, "next_shim: %s\n", next != NULL && next != self ? "ok" : "wrong");
}

typedef int (*alloc_fn)(unsigned long long *, size_t);

EXPORT int cuMemAlloc_v2(unsigned long long *dptr, size_t size)
{
    alloc_fn next = (alloc_fn)dlsym(RTLD_NEXT, "cuMemAlloc_v2");
    return next != NULL && next != cuMemAlloc_v2 ? next(dptr, size) : 999;
}

EXPORT void *next_shim_cu_next(void)
{
    void *volatile next = dlsym(RTLD_NEXT, "cuMemAlloc_v2");   /* no tail call */
    return next;
}
