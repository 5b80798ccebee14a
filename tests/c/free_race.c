/*
 * free_race.c - frees of one pointer at once, under libvgpu.so: the main
 * thread allocates a pointer, THREADS threads free it together (the driver
 * frees it for one of them), round after round; the pointers' sizes differ
 * from round to round, and the driver hands the same addresses out again.
 * The job must then hold exactly what is left: the context and one
 * allocation kept throughout.
 *
 *   free_race THREADS ROUNDS
 *
 * Prints: free_race rounds=N wins=N errors=N used=BYTES ctx=BYTES
 *   wins:   frees that succeeded (one a round when the driver is right)
 *   used:   the job's use after the rounds (cuMemGetInfo_v2: total - free),
 *           ctx: before the first allocation
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>

#include "cu_api.h"

static CUcontext g_ctx;
static int g_threads, g_rounds;
static volatile CUdeviceptr g_ptr;
static unsigned long long g_met, g_wins, g_errors;

/* All g_threads + 1 threads meet here for the n-th time (1, 2, ...). */
static void meet(unsigned long long n)
{
    __atomic_fetch_add(&g_met, 1, __ATOMIC_ACQ_REL);
    while (__atomic_load_n(&g_met, __ATOMIC_ACQUIRE) < n * (unsigned long long)(g_threads + 1))
        sched_yield();
}

static void *freer(void *arg)
{
    (void)arg;
    if (cuCtxSetCurrent(g_ctx) != CUDA_SUCCESS)
        __atomic_fetch_add(&g_errors, 1, __ATOMIC_RELAXED);
    for (unsigned long long r = 0; r < (unsigned long long)g_rounds; r++) {
        meet(2 * r + 1);
        CUresult rc = cuMemFree_v2(g_ptr);
        if (rc == CUDA_SUCCESS)
            __atomic_fetch_add(&g_wins, 1, __ATOMIC_RELAXED);
        else if (rc != CUDA_ERROR_INVALID_VALUE)
            __atomic_fetch_add(&g_errors, 1, __ATOMIC_RELAXED);
        meet(2 * r + 2);
    }
    return NULL;
}

static unsigned long long job_used(void)
{
    size_t f, t;
    if (cuMemGetInfo_v2(&f, &t) != CUDA_SUCCESS)
        return ~0ull;
    return (unsigned long long)(t - f);
}

int main(int argc, char **argv)
{
    if (argc != 3) {
        fprintf(stderr, "usage: free_race THREADS ROUNDS\n");
        return 2;
    }
    g_threads = atoi(argv[1]);
    g_rounds = atoi(argv[2]);
    if (g_threads < 2 || g_threads > 64 || g_rounds < 1)
        return 2;
    CUdevice dev;
    if (cuInit(0) || cuDeviceGet(&dev, 0) || cuDevicePrimaryCtxRetain(&g_ctx, dev) ||
        cuCtxSetCurrent(g_ctx)) {
        fprintf(stderr, "no context\n");
        return 1;
    }
    unsigned long long ctx = job_used();
    CUdeviceptr keep;
    if (cuMemAlloc_v2(&keep, 64u << 20) != CUDA_SUCCESS) {
        fprintf(stderr, "no memory\n");
        return 1;
    }
    pthread_t t[64];
    for (int i = 0; i < g_threads; i++)
        pthread_create(&t[i], NULL, freer, NULL);
    for (unsigned long long r = 0; r < (unsigned long long)g_rounds; r++) {
        CUdeviceptr p;
        if (cuMemAlloc_v2(&p, (size_t)(1 + r % 3) << 20) != CUDA_SUCCESS) {
            __atomic_fetch_add(&g_errors, 1, __ATOMIC_RELAXED);
            p = 0;
        }
        g_ptr = p;
        meet(2 * r + 1);
        meet(2 * r + 2);
    }
    for (int i = 0; i < g_threads; i++)
        pthread_join(t[i], NULL);
    printf("free_race rounds=%d wins=%llu errors=%llu used=%llu ctx=%llu\n", g_rounds, g_wins,
           g_errors, job_used(), ctx);
    return 0;
}
