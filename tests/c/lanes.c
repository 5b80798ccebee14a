/*
 * lanes.c - a process's count kept in lanes (region.h): waves of threads,
 * more at once than the slot has lanes, each freeing pointers another
 * thread allocated in the wave before and allocating its own; a wave's
 * threads end before the next starts, so their lanes pass on, with what
 * they hold. Then the process says what it holds and waits.
 *
 *   lanes WAVES THREADS PER
 *
 * Prints: lanes held=BYTES errors=N, then waits for a line on stdin (the
 * test reads the process's slot meanwhile), then prints "lanes freed" once
 * it has freed everything, and waits for stdin to close.
 * Sizes are whole 2 MiB units, what the driver reserves: the job holds
 * exactly what was allocated, besides the context.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

#include "cu_api.h"

#define UNIT (2ull << 20)
#define MAXT 64
#define MAXP 64

static CUcontext g_ctx;
static int g_threads, g_per, g_wave;
static CUdeviceptr g_prev[MAXT][MAXP], g_next[MAXT][MAXP];
static unsigned long long g_size_prev[MAXT][MAXP], g_size_next[MAXT][MAXP];
static unsigned long long g_errors, g_ready;

static unsigned long long size_of(int wave, int t, int k)
{
    return UNIT * (unsigned long long)(1 + (wave + 3 * t + 5 * k) % 7);
}

static void *worker(void *arg)
{
    int t = (int)(long)arg;
    if (cuCtxSetCurrent(g_ctx) != CUDA_SUCCESS)
        __atomic_fetch_add(&g_errors, 1, __ATOMIC_RELAXED);
    /* all of the wave at once: more threads than lanes ask together */
    __atomic_fetch_add(&g_ready, 1, __ATOMIC_ACQ_REL);
    while (__atomic_load_n(&g_ready, __ATOMIC_ACQUIRE) < (unsigned long long)g_threads)
        ;
    int other = (t + 1) % g_threads;
    for (int k = 0; k < g_per; k++) {
        if (g_prev[other][k] != 0 && cuMemFree_v2(g_prev[other][k]) != CUDA_SUCCESS)
            __atomic_fetch_add(&g_errors, 1, __ATOMIC_RELAXED);
        CUdeviceptr p = 0;
        unsigned long long n = size_of(g_wave, t, k);
        if (cuMemAlloc_v2(&p, n) != CUDA_SUCCESS)
            __atomic_fetch_add(&g_errors, 1, __ATOMIC_RELAXED);
        g_next[t][k] = p;
        g_size_next[t][k] = p ? n : 0;
    }
    return NULL;
}

int main(int argc, char **argv)
{
    if (argc != 4) {
        fprintf(stderr, "usage: lanes WAVES THREADS PER\n");
        return 2;
    }
    int waves = atoi(argv[1]);
    g_threads = atoi(argv[2]);
    g_per = atoi(argv[3]);
    if (waves < 1 || g_threads < 2 || g_threads > MAXT || g_per < 1 || g_per > MAXP)
        return 2;
    CUdevice dev;
    if (cuInit(0) || cuDeviceGet(&dev, 0) || cuDevicePrimaryCtxRetain(&g_ctx, dev) ||
        cuCtxSetCurrent(g_ctx)) {
        fprintf(stderr, "lanes: no context\n");
        return 1;
    }
    for (g_wave = 0; g_wave < waves; g_wave++) {
        pthread_t th[MAXT];
        g_ready = 0;
        for (int t = 0; t < g_threads; t++)
            if (pthread_create(&th[t], NULL, worker, (void *)(long)t) != 0)
                return 1;
        for (int t = 0; t < g_threads; t++)
            pthread_join(th[t], NULL);
        for (int t = 0; t < g_threads; t++)
            for (int k = 0; k < g_per; k++) {
                g_prev[t][k] = g_next[t][k];
                g_size_prev[t][k] = g_size_next[t][k];
            }
    }
    unsigned long long held = 0;
    for (int t = 0; t < g_threads; t++)
        for (int k = 0; k < g_per; k++)
            held += g_size_prev[t][k];
    printf("lanes held=%llu errors=%llu\n", held, g_errors);
    fflush(stdout);
    char line[16];
    if (fgets(line, sizeof(line), stdin) == NULL)
        return 0;
    /* the main thread frees it all: what other threads' lanes counted
     * comes off this thread's */
    for (int t = 0; t < g_threads; t++)
        for (int k = 0; k < g_per; k++)
            if (g_prev[t][k] != 0 && cuMemFree_v2(g_prev[t][k]) != CUDA_SUCCESS)
                g_errors++;
    printf("lanes freed errors=%llu\n", g_errors);
    fflush(stdout);
    while (fgets(line, sizeof(line), stdin) != NULL)
        ;
    return 0;
}
