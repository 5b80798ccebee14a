/*
 * next_shim.c - another interposer, preloaded after libvgpu.so: it wraps
 * time() and finds the next definition with dlsym(RTLD_NEXT, "time"), as
 * interposers do. With libvgpu.so's dlsym in between, RTLD_NEXT must still be
 * resolved relative to this library (else it finds its own time() again).
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <time.h>

time_t time(time_t *t);
static time_t own_time(time_t *t);
__attribute__((visibility("default"))) time_t time(time_t *t)
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
