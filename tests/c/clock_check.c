/*
 * clock_check.c - the hook's clock (libvgpu/hook/clock.c) against
 * CLOCK_MONOTONIC: reads both, interleaved, for a while, on two threads, and
 * prints one JSON line: whether it counts the time-stamp counter, the
 * largest difference from clock_gettime read just before and just after
 * it (ns: the reading must lie between them, within the error allowed),
 * whether a thread's readings ever went back, and what each read costs.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "hook.h"

static uint64_t mono(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

struct result {
    uint64_t worst;     /* the farthest a reading fell outside [before, after] */
    int back;           /* a reading below the thread's one before */
    uint64_t reads;
};

static uint64_t g_run_ns;

static void *check(void *arg)
{
    struct result *r = arg;
    uint64_t end = mono() + g_run_ns, last = 0;
    for (;;) {
        uint64_t before = mono();
        uint64_t now = vgpu_now_ns();
        uint64_t after = mono();
        uint64_t off = now < before ? before - now : now > after ? now - after : 0;
        if (off > r->worst)
            r->worst = off;
        if (now < last)
            r->back = 1;
        last = now;
        r->reads++;
        if (after > end)
            break;
        /* a little work between reads, as between launches */
        for (volatile int i = 0; i < (int)(r->reads % 4000); i++) {
        }
    }
    return NULL;
}

static double cost(uint64_t (*read)(void))
{
    enum { N = 2000000 };
    uint64_t t0 = mono(), sum = 0;
    for (int i = 0; i < N; i++)
        sum += read();
    uint64_t t1 = mono();
    return sum == 1 ? 0.0 : (double)(t1 - t0) / N;
}

int main(int argc, char **argv)
{
    g_run_ns = (argc > 1 ? strtoull(argv[1], NULL, 10) : 300) * 1000000ull;
    vgpu_clock_init();
    struct result r[2] = {{0}};
    pthread_t t;
    pthread_create(&t, NULL, check, &r[1]);
    check(&r[0]);
    pthread_join(t, NULL);
    printf("{\"counts\": %d, \"worst_ns\": %llu, \"back\": %d, \"reads\": %llu, "
           "\"hook_ns\": %.1f, \"gettime_ns\": %.1f}\n",
           vgpu_clock_counts(), (unsigned long long)(r[0].worst > r[1].worst ? r[0].worst
                                                                             : r[1].worst),
           r[0].back || r[1].back, (unsigned long long)(r[0].reads + r[1].reads),
           cost(vgpu_now_ns), cost(mono));
    return 0;
}
