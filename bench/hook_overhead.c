/*
 * hook_overhead.c - time per driver call, for bench/hook_overhead.py, which
 * runs this same program with and without libvgpu.so preloaded.
 *
 *   hook_overhead OP CALLS BATCH
 *
 * OP: launch   cuLaunchKernel of a 1 ns kernel, default stream;
 *              each batch is followed by an untimed cuCtxSynchronize, so
 *              the simulator's queue (1024 deep) never makes a launch wait
 *     gated    the same launches, for a job whose limits gate them by turns
 *              (bench/hook_overhead.py writes a turn of the whole cycle with
 *              ample credit): the hook's slow path, meant never to wait; here
 *              no different from launch, the job's region makes it so
 *     alloc    a cuMemAlloc_v2 (2 MiB) + cuMemFree_v2 pair
 *     info     cuMemGetInfo_v2
 *
 * Calls are timed in batches of BATCH with clock_gettime(CLOCK_MONOTONIC);
 * prints one JSON line: the median, 10th and 90th percentile of the batch
 * means, in ns per call (per pair for alloc), and the events the driver
 * created (only the do-nothing driver counts them; -1 elsewhere).
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "vgpu/cuda_types.h"

extern CUresult cuInit(unsigned int);
extern CUresult cuDeviceGet(CUdevice *, int);
extern CUresult cuDevicePrimaryCtxRetain(CUcontext *, CUdevice);
extern CUresult cuCtxSetCurrent(CUcontext);
extern CUresult cuCtxSynchronize(void);
extern CUresult cuModuleLoadData(CUmodule *, const void *);
extern CUresult cuModuleGetFunction(CUfunction *, CUmodule, const char *);
extern CUresult cuLaunchKernel(CUfunction, unsigned int, unsigned int, unsigned int,
                               unsigned int, unsigned int, unsigned int, unsigned int, CUstream,
                               void **, void **);
extern CUresult cuMemAlloc_v2(CUdeviceptr *, size_t);
extern CUresult cuMemFree_v2(CUdeviceptr);
extern CUresult cuMemGetInfo_v2(size_t *, size_t *);

/* bench/hook_overhead_null.c's count of events made; absent elsewhere. */
extern unsigned long vgpu_null_events_created __attribute__((weak));

static const char PTX[] =
    ".version 8.0\n.target sm_90\n.address_size 64\n"
    ".visible .entry vgpu_spin_bench(.param .u64 ns)\n{\n ret;\n}\n";

static double now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

static int cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

#define CHECK(call) \
    do { \
        CUresult rc_ = (call); \
        if (rc_ != CUDA_SUCCESS) { \
            fprintf(stderr, "%s: %d\n", #call, rc_); \
            exit(1); \
        } \
    } while (0)

int main(int argc, char **argv)
{
    if (argc != 4) {
        fprintf(stderr, "usage: hook_overhead launch|gated|alloc|info CALLS BATCH\n");
        return 2;
    }
    const char *op = argv[1];
    long calls = atol(argv[2]), batch = atol(argv[3]);
    long nb = calls / batch;
    if (nb < 1 || batch < 1)
        return 2;

    CUdevice dev;
    CUcontext ctx;
    CHECK(cuInit(0));
    CHECK(cuDeviceGet(&dev, 0));
    CHECK(cuDevicePrimaryCtxRetain(&ctx, dev));
    CHECK(cuCtxSetCurrent(ctx));
    CUmodule mod;
    CUfunction fn;
    CHECK(cuModuleLoadData(&mod, PTX));
    CHECK(cuModuleGetFunction(&fn, mod, "vgpu_spin_bench"));
    unsigned long long kernel_ns = 1;
    void *params[] = {&kernel_ns};

    double *means = malloc(sizeof(double) * (size_t)nb);
    int is_launch = !strcmp(op, "launch") || !strcmp(op, "gated");
    int is_alloc = !strcmp(op, "alloc");
    if (is_launch) {
        /* Untimed: a launch run to completion, so that a gated job's hook
         * has measured one (before, it takes a launch for 1 ms of GPU time
         * and would wait for its first marks after a few dozen). */
        for (int i = 0; i < 2; i++) {
            CHECK(cuLaunchKernel(fn, 1, 1, 1, 1, 1, 1, 0, NULL, params, NULL));
            CHECK(cuCtxSynchronize());
        }
    }
    for (long b = -nb / 10; b < nb; b++) {   /* the first tenth warms up, untimed */
        double t0 = now_ns();
        if (is_launch) {
            for (long i = 0; i < batch; i++)
                CHECK(cuLaunchKernel(fn, 1, 1, 1, 1, 1, 1, 0, NULL, params, NULL));
        } else if (is_alloc) {
            for (long i = 0; i < batch; i++) {
                CUdeviceptr p;
                CHECK(cuMemAlloc_v2(&p, 2u << 20));
                CHECK(cuMemFree_v2(p));
            }
        } else {
            for (long i = 0; i < batch; i++) {
                size_t f, t;
                CHECK(cuMemGetInfo_v2(&f, &t));
            }
        }
        double t1 = now_ns();
        if (is_launch)
            CHECK(cuCtxSynchronize());
        if (b >= 0)
            means[b] = (t1 - t0) / (double)batch;
    }
    qsort(means, (size_t)nb, sizeof(double), cmp);
    printf("{\"op\": \"%s\", \"calls\": %ld, \"batch\": %ld, \"median_ns\": %.2f, "
           "\"p10_ns\": %.2f, \"p90_ns\": %.2f, \"driver_events\": %ld}\n",
           op, nb * batch, batch, means[nb / 2], means[nb / 10], means[nb * 9 / 10],
           &vgpu_null_events_created != NULL ? (long)vgpu_null_events_created : -1L);
    free(means);
    return 0;
}
