/*
 * gate.c - the process's CUDA API gate. Locking a process through the
 * driver's checkpoint API "blocks further CUDA API calls" and waits for those
 * already in progress (cuda/checkpoint.c); this is how: brackets around
 * whatever changes device state count what is in flight, and a closed gate
 * makes new brackets and entry points wait until it opens again.
 *
 * The open gate costs a bracket two atomic adds and a load: no lock, no
 * system call. A thread that finds the gate closed backs out and waits on a
 * condition variable; the closer stores `closed` before it reads `in_flight`
 * and a bracket adds to `in_flight` before it reads `closed` (both
 * sequentially consistent), so either the closer sees the bracket or the
 * bracket sees the gate closed.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <signal.h>

#include "gate.h"

static int g_closed;
static int g_in_flight;
static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t g_cond = PTHREAD_COND_INITIALIZER;
static __thread int t_depth;
static __thread int t_exempt;
static void *(*g_restore_fn)(void *);
static pthread_once_t g_start_once = PTHREAD_ONCE_INIT;

static void wait_open(void)
{
    pthread_mutex_lock(&g_lock);
    while (__atomic_load_n(&g_closed, __ATOMIC_SEQ_CST))
        pthread_cond_wait(&g_cond, &g_lock);
    pthread_mutex_unlock(&g_lock);
}

static void wake_all(void)
{
    pthread_mutex_lock(&g_lock);
    pthread_cond_broadcast(&g_cond);
    pthread_mutex_unlock(&g_lock);
}

void gate_enter(void)
{
    if (t_exempt || t_depth++ > 0)
        return;
    for (;;) {
        __atomic_add_fetch(&g_in_flight, 1, __ATOMIC_SEQ_CST);
        if (!__atomic_load_n(&g_closed, __ATOMIC_SEQ_CST))
            return;
        /* closed: not in flight after all; wait for it to open */
        __atomic_sub_fetch(&g_in_flight, 1, __ATOMIC_SEQ_CST);
        wake_all();
        wait_open();
    }
}

void gate_leave(void)
{
    if (t_exempt || --t_depth > 0)
        return;
    if (__atomic_sub_fetch(&g_in_flight, 1, __ATOMIC_SEQ_CST) == 0 &&
        __atomic_load_n(&g_closed, __ATOMIC_SEQ_CST))
        wake_all();
}

void gate_hold(void)
{
    if (t_exempt || t_depth > 0)
        return;
    if (__builtin_expect(__atomic_load_n(&g_closed, __ATOMIC_ACQUIRE), 0))
        wait_open();
}

void gate_exempt(void)
{
    t_exempt = 1;
}

void gate_close(void)
{
    __atomic_store_n(&g_closed, 1, __ATOMIC_SEQ_CST);
}

void gate_open(void)
{
    pthread_mutex_lock(&g_lock);
    __atomic_store_n(&g_closed, 0, __ATOMIC_SEQ_CST);
    pthread_cond_broadcast(&g_cond);
    pthread_mutex_unlock(&g_lock);
}

int gate_in_flight(void)
{
    return __atomic_load_n(&g_in_flight, __ATOMIC_SEQ_CST);
}

/* ---- the restore thread ---- */

void gate_set_restore_thread(void *(*fn)(void *))
{
    g_restore_fn = fn;
}

/* A forked child has neither the parent's restore thread nor its brackets
 * in flight (CUDA is not usable in it anyway). */
static void atfork_child(void)
{
    pthread_mutex_init(&g_lock, NULL);
    pthread_cond_init(&g_cond, NULL);
    g_in_flight = 0;
    g_closed = 0;
}

static void start(void)
{
    pthread_atfork(NULL, NULL, atfork_child);
    if (!g_restore_fn)
        return;
    pthread_t t;
    pthread_attr_t a;
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, &old); /* the thread starts with every signal blocked */
    pthread_attr_init(&a);
    pthread_attr_setdetachstate(&a, PTHREAD_CREATE_DETACHED);
    pthread_create(&t, &a, g_restore_fn, NULL);
    pthread_attr_destroy(&a);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
}

void gate_start_restore_thread(void)
{
    pthread_once(&g_start_once, start);
}
