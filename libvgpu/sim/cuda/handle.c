/*
 * handle.c - handle objects: destroyed handles are never given back to
 * malloc, so checking a stale handle's magic is always safe; their memory is
 * reused for new objects of the same size.
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "handle.h"

struct freed {
    uint32_t magic;
    struct freed *next;
};
static struct {
    size_t size;
    struct freed *head;
} g_free[16];
static pthread_mutex_t g_obj_lock = PTHREAD_MUTEX_INITIALIZER;

void *cu_obj_new(size_t size, uint32_t magic)
{
    void *p = NULL;
    pthread_mutex_lock(&g_obj_lock);
    for (int i = 0; i < 16; i++) {
        if (g_free[i].size == size && g_free[i].head) {
            p = g_free[i].head;
            g_free[i].head = g_free[i].head->next;
            break;
        }
    }
    pthread_mutex_unlock(&g_obj_lock);
    if (!p)
        p = malloc(size);
    if (p) {
        memset(p, 0, size);
        __atomic_store_n((uint32_t *)p, magic, __ATOMIC_RELEASE);
    }
    return p;
}

void cu_obj_del(void *p, size_t size)
{
    struct freed *f = p;
    __atomic_store_n(&f->magic, DEAD, __ATOMIC_RELEASE);
    pthread_mutex_lock(&g_obj_lock);
    for (int i = 0; i < 16; i++) {
        if (g_free[i].size == size || g_free[i].size == 0) {
            g_free[i].size = size;
            f->next = g_free[i].head;
            g_free[i].head = f;
            break;
        }
    }
    pthread_mutex_unlock(&g_obj_lock);
}

int cu_obj_is(const void *p, uint32_t magic)
{
    return p && __atomic_load_n((const uint32_t *)p, __ATOMIC_ACQUIRE) == magic;
}

void (*volatile cu_on_sync)(void);
pthread_mutex_t cu_capture_lock = PTHREAD_MUTEX_INITIALIZER;
struct capture *cu_captures;
