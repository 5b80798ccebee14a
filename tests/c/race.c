/*
 * race.c - one process of the race test: THREADS threads allocate and free
 * random sizes with cuMemAlloc_v2 / cuMemFree_v2 under libvgpu.so, against
 * the job's limit, and check every refusal.
 *
 *   race SHARED_FILE NPROCS THREADS OPS LIMIT SEED
 *
 * SHARED_FILE (zeroed, at least 4 KiB) is shared by the NPROCS processes:
 *   [0] upper:  bytes the job may hold at most: a thread adds a request's
 *               rounded size before calling cuMemAlloc_v2 and takes it off
 *               after a refusal or after cuMemFree_v2 returned;
 *   [1] added:  the sum of everything ever added to [0] (never decreases);
 *   [2], [3]:   barriers (processes arrived).
 * The hook never holds more than upper + contexts. A refusal of s bytes is
 * legitimate only if, at some moment during the call, the job held more
 * than limit - s; the most the job can have held during the call is
 * upper(at the start) + everything the others added meanwhile + contexts.
 * A refusal below that bound is an allocation that fit and was refused.
 *
 * Prints: race ok=N refused=N illegit=N errors=N ctx=BYTES
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <fcntl.h>
#include <time.h>
#include <unistd.h>

#include "cu_api.h"

#define GRAN (2ull << 20)

static volatile unsigned long long *shared;
static CUcontext g_ctx;
static int g_ops;
static unsigned long long g_limit, g_ctx_total;
static unsigned g_seed;
static unsigned long long n_ok, n_refused, n_illegit, n_errors;

static unsigned long long round_gran(unsigned long long n)
{
    return (n + GRAN - 1) / GRAN * GRAN;
}

static void *worker(void *arg)
{
    unsigned seed = g_seed * 7919u + (unsigned)(uintptr_t)arg;
    if (cuCtxSetCurrent(g_ctx) != CUDA_SUCCESS) {
        __atomic_fetch_add(&n_errors, 1, __ATOMIC_RELAXED);
        return NULL;
    }
    CUdeviceptr held[2];
    unsigned long long held_size[2];
    int nheld = 0;
    for (int op = 0; op < g_ops; op++) {
        int do_alloc = nheld == 0 || (nheld < 2 && rand_r(&seed) % 100 < 60);
        if (do_alloc) {
            size_t size = (size_t)(1 + rand_r(&seed) % 48) << 20;   /* 1..48 MiB */
            size -= rand_r(&seed) % 4096;                            /* not granular */
            unsigned long long s = round_gran(size);
            unsigned long long a0 = __atomic_load_n(&shared[1], __ATOMIC_SEQ_CST);
            unsigned long long u0 = __atomic_load_n(&shared[0], __ATOMIC_SEQ_CST);
            __atomic_fetch_add(&shared[0], s, __ATOMIC_SEQ_CST);
            __atomic_fetch_add(&shared[1], s, __ATOMIC_SEQ_CST);
            CUdeviceptr p;
            CUresult rc = cuMemAlloc_v2(&p, size);
            if (rc == CUDA_SUCCESS) {
                held[nheld] = p;
                held_size[nheld++] = s;
                __atomic_fetch_add(&n_ok, 1, __ATOMIC_RELAXED);
                continue;
            }
            unsigned long long a1 = __atomic_load_n(&shared[1], __ATOMIC_SEQ_CST);
            __atomic_fetch_sub(&shared[0], s, __ATOMIC_SEQ_CST);
            if (rc != CUDA_ERROR_OUT_OF_MEMORY) {
                __atomic_fetch_add(&n_errors, 1, __ATOMIC_RELAXED);
                continue;
            }
            __atomic_fetch_add(&n_refused, 1, __ATOMIC_RELAXED);
            /* others' additions during the call: a1 - a0 less our own s */
            unsigned long long most = u0 + (a1 - a0 - s) + g_ctx_total;
            if (most + s <= g_limit) {
                __atomic_fetch_add(&n_illegit, 1, __ATOMIC_RELAXED);
                fprintf(stderr, "refused %llu with at most %llu held of %llu\n", s, most,
                        g_limit);
            }
        } else {
            int k = rand_r(&seed) % nheld;
            if (cuMemFree_v2(held[k]) != CUDA_SUCCESS)
                __atomic_fetch_add(&n_errors, 1, __ATOMIC_RELAXED);
            __atomic_fetch_sub(&shared[0], held_size[k], __ATOMIC_SEQ_CST);
            held[k] = held[--nheld];
            held_size[k] = held_size[nheld];
        }
    }
    while (nheld > 0) {
        nheld--;
        if (cuMemFree_v2(held[nheld]) != CUDA_SUCCESS)
            __atomic_fetch_add(&n_errors, 1, __ATOMIC_RELAXED);
        __atomic_fetch_sub(&shared[0], held_size[nheld], __ATOMIC_SEQ_CST);
    }
    return NULL;
}

static int barrier(int slot, unsigned long long nprocs)
{
    __atomic_fetch_add(&shared[slot], 1, __ATOMIC_SEQ_CST);
    for (int i = 0; i < 30000; i++) {   /* 30 s at most */
        if (__atomic_load_n(&shared[slot], __ATOMIC_SEQ_CST) >= nprocs)
            return 0;
        struct timespec ts = {0, 1000000};
        nanosleep(&ts, NULL);
    }
    fprintf(stderr, "barrier timed out\n");
    return -1;
}

int main(int argc, char **argv)
{
    if (argc != 7) {
        fprintf(stderr, "usage: race SHARED_FILE NPROCS THREADS OPS LIMIT SEED\n");
        return 2;
    }
    int fd = open(argv[1], O_RDWR);
    if (fd < 0) {
        perror(argv[1]);
        return 2;
    }
    shared = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (shared == MAP_FAILED) {
        perror("mmap");
        return 2;
    }
    unsigned long long nprocs = strtoull(argv[2], NULL, 10);
    int threads = atoi(argv[3]);
    g_ops = atoi(argv[4]);
    g_limit = strtoull(argv[5], NULL, 10);
    g_seed = (unsigned)atoi(argv[6]);

    CUdevice dev;
    if (cuInit(0) || cuDeviceGet(&dev, 0) || cuDevicePrimaryCtxRetain(&g_ctx, dev) ||
        cuCtxSetCurrent(g_ctx)) {
        fprintf(stderr, "no context\n");
        return 1;
    }
    /* Every process has its context, then every process reads the job's use
     * (the contexts alone), then the race starts. */
    if (barrier(2, nprocs) < 0)
        return 1;
    size_t free_b, total_b;
    if (cuMemGetInfo_v2(&free_b, &total_b)) {
        fprintf(stderr, "cuMemGetInfo failed\n");
        return 1;
    }
    g_ctx_total = total_b - free_b;
    if (barrier(3, nprocs) < 0)
        return 1;

    pthread_t t[64];
    if (threads > 64)
        threads = 64;
    for (int i = 0; i < threads; i++)
        pthread_create(&t[i], NULL, worker, (void *)(uintptr_t)i);
    for (int i = 0; i < threads; i++)
        pthread_join(t[i], NULL);
    printf("race ok=%llu refused=%llu illegit=%llu errors=%llu ctx=%llu\n", n_ok, n_refused,
           n_illegit, n_errors, g_ctx_total);
    return 0;
}
