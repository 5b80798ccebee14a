/*
 * clock.c - the hook's clock: CLOCK_MONOTONIC in ns (the daemon's schedule
 * and the other jobs' signals are written in it), read cheaply.
 *
 * A gated launch reads the clock twice (its decision, its mark's record:
 * flight.c). clock_gettime costs about 24 ns through the vDSO even where
 * the kernel keeps time by the CPU's time-stamp counter, rdtsc about 10.
 * Where it does (its clocksource is "tsc": the kernel found the counter
 * invariant and in step across CPUs), each thread keeps an anchor, the
 * counter and CLOCK_MONOTONIC read together, and reads the real clock
 * again ANCHOR_NS after it; in between, the time is the anchor's plus the
 * ticks since it at the counter's rate, measured between the process's
 * first anchor and a thread's latest (trusted once they are CALIBRATE_NS
 * apart; until then the real clock is read each time). The error between
 * anchors is the rate's (ppm) over at most ANCHOR_NS: tens of ns. A
 * thread's readings never go back. Another clocksource, or another CPU
 * than x86-64: clock_gettime.
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "hook.h"

#define ANCHOR_NS 1000000ull       /* a thread reads the real clock this often */
#define CALIBRATE_NS 10000000ull   /* the rate is measured over at least this */

static uint64_t mono(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

#if defined(__x86_64__)
#include <x86intrin.h>

struct anchor {
    uint64_t tsc, ns;
    uint64_t last;      /* the thread's last reading */
};

static int g_tsc;                       /* the counter is the kernel's clocksource */
static struct anchor g_first;           /* the process's first anchor */
static double g_rate;                   /* ns a tick; 0: not measured yet */
static __thread struct anchor t_anchor __attribute__((tls_model("initial-exec")));

/* The counter and the clock read together: of a few tries, the one read
 * closest together (a first call's page faults, or an interrupt between the
 * two, would set the anchor off by as long). */
#define TRIES 3
static void take(struct anchor *a)
{
    uint64_t best = UINT64_MAX;
    for (int i = 0; i < TRIES; i++) {
        uint64_t t0 = __rdtsc();
        uint64_t ns = mono();
        uint64_t t1 = __rdtsc();
        if (t1 - t0 < best) {
            best = t1 - t0;
            a->tsc = t0 + (t1 - t0) / 2;
            a->ns = ns;
        }
    }
}

void vgpu_clock_init(void)
{
    char src[32] = "";
    FILE *f = fopen("/sys/devices/system/clocksource/clocksource0/current_clocksource", "re");
    if (f != NULL) {
        if (fgets(src, sizeof(src), f) == NULL)
            src[0] = '\0';
        fclose(f);
    }
    src[strcspn(src, "\n")] = '\0';
    take(&g_first);
    g_rate = 0.0;
    __atomic_store_n(&g_tsc, strcmp(src, "tsc") == 0, __ATOMIC_RELEASE);
}

/* A new anchor for the thread; the rate measured again from it. */
static uint64_t reanchor(struct anchor *a)
{
    take(a);
    if (a->ns - g_first.ns >= CALIBRATE_NS && a->tsc > g_first.tsc) {
        double rate = (double)(a->ns - g_first.ns) / (double)(a->tsc - g_first.tsc);
        if (rate > 0.01 && rate < 100.0)    /* 10 MHz .. 100 GHz */
            __atomic_store(&g_rate, &rate, __ATOMIC_RELAXED);
    }
    return a->ns;
}

uint64_t vgpu_now_ns(void)
{
    if (!__atomic_load_n(&g_tsc, __ATOMIC_ACQUIRE))
        return mono();
    struct anchor *a = &t_anchor;
    double rate;
    __atomic_load(&g_rate, &rate, __ATOMIC_RELAXED);
    uint64_t ns;
    if (rate <= 0.0) {
        /* not measured yet: the real clock, and an anchor (which measures
         * the rate) once CALIBRATE_NS have passed */
        ns = mono();
        if (ns - g_first.ns >= CALIBRATE_NS)
            reanchor(a);
    } else {
        uint64_t t = __rdtsc();
        double since = (double)(t - a->tsc) * rate;
        if (a->ns == 0 || t < a->tsc || since >= (double)ANCHOR_NS)
            ns = reanchor(a);
        else
            ns = a->ns + (uint64_t)since;
    }
    if (ns < a->last)
        ns = a->last;
    a->last = ns;
    return ns;
}

int vgpu_clock_counts(void)
{
    return __atomic_load_n(&g_tsc, __ATOMIC_ACQUIRE);
}

#else

void vgpu_clock_init(void)
{
}

uint64_t vgpu_now_ns(void)
{
    return mono();
}

int vgpu_clock_counts(void)
{
    return 0;
}

#endif
