/*
 * vgpu-burn - launch kernels of a given duration and report how many ran.
 *
 *   vgpu-burn [--device N] --kernel-us US (--seconds S | --count K)
 *             [--alloc SIZE] [--inflight K] [--graph N] [--work [--iters-per-us X]]
 *             [--duty PCT [--period-ms MS]] [--on-ms MS --off-ms MS]
 *             [--request K --think-ms MS [--seed S]]
 *             [--long-every K --long-us US [--long-run R]] [--flip-us US --flip-s S]
 *
 * Driver API only, reached as the CUDA runtime reaches it: dlopen
 * ("libcuda.so.1"), then every entry point through cuGetProcAddress. The
 * kernel is embedded PTX that spins on %globaltimer for its u64 argument in
 * nanoseconds; a real driver JIT-compiles it (no toolkit needed), and the
 * simulated GPU runs it for that long by its duration rule. So the same
 * program measures compute shares on the simulator and on a real GPU.
 *
 * --long-every K --long-us US [--long-run R]: of every K kernels, the last R
 * (1 by default) run US microseconds each, on a grid of two blocks (another
 * kind of launch: a training step's few big kernels among its many small
 * ones); plain launches only.
 *
 * --flip-us US --flip-s S: every S seconds the kernels' length flips between
 * --kernel-us and US, the same kernel on the same grid (one kind of launch
 * whose length its arguments set: what a co-tenant does to a cost learnt
 * per kind); plain launches only.
 *
 * --graph N: each launch is a CUDA graph of N such kernels (cuGraphLaunch),
 * and --inflight counts graphs.
 *
 * --request K: a latency client instead of a saturating one. A request is K
 * kernels launched back to back and waited for; between requests the
 * program sleeps a random time, exponentially distributed with mean
 * --think-ms (seeded by --seed). Per request it records the latency the host
 * saw (first launch to the wait's return), the device's (events before and
 * after, on the device's clock) and the device time to the end of its first
 * kernel. --count counts requests.
 *
 * --work: the kernel does a fixed amount of work (a chain of dependent
 * multiply-adds, as many as --kernel-us takes on this GPU alone, measured at
 * start, or --iters-per-us given) rather than spinning until the GPU's clock
 * says --kernel-us passed: a spinning kernel that the GPU preempts and
 * resumes ends as soon as its time has passed, a working one still has its
 * work to do. The simulated GPU runs either for --kernel-us of its timeline.
 *
 * --duty keeps the device busy about PCT % of the time: at the start of each
 * period of MS milliseconds (100 by default) it launches kernels adding up to
 * PCT % of the period, waits for them, and sleeps to the period's end.
 * --on-ms/--off-ms alternate in wall time: launch for ON ms, wait for the
 * kernels, sleep OFF ms (on a shared GPU it gets less than ON/(ON+OFF)).
 *
 * Prints one line of JSON: kernels (completed), seconds (wall time from the
 * first launch to the last completion), rate (kernels per second),
 * kernel_us, device, pid; with "error" and "call" when a driver call failed;
 * a client adds requests, latency_ms, device_ms and first_ms (lists).
 * Exit status: 0 done, 1 a driver call failed, 2 bad arguments or --alloc
 * failed. SIGINT or SIGTERM stops the launches and reports what ran.
 */
#include <dlfcn.h>
#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "vgpu/cuda_types.h"
#include "vgpu/size.h"

static const char k_ptx[] =
    ".version 7.0\n"
    ".target sm_50\n"
    ".address_size 64\n"
    "\n"
    ".visible .entry vgpu_spin(\n"
    "    .param .u64 vgpu_spin_ns\n"
    ")\n"
    "{\n"
    "    .reg .pred %p<2>;\n"
    "    .reg .b64 %rd<5>;\n"
    "\n"
    "    ld.param.u64 %rd1, [vgpu_spin_ns];\n"
    "    mov.u64 %rd2, %globaltimer;\n"
    "$L_spin:\n"
    "    mov.u64 %rd3, %globaltimer;\n"
    "    sub.s64 %rd4, %rd3, %rd2;\n"
    "    setp.lt.u64 %p1, %rd4, %rd1;\n"
    "    @%p1 bra $L_spin;\n"
    "    ret;\n"
    "}\n"
    "\n"
    ".visible .entry vgpu_spin_work(\n"
    "    .param .u64 vgpu_spin_work_ns,\n"
    "    .param .u64 vgpu_spin_work_iters,\n"
    "    .param .u64 vgpu_spin_work_out\n"
    ")\n"
    "{\n"
    "    .reg .pred %p<2>;\n"
    "    .reg .b64 %rd<5>;\n"
    "    .reg .f32 %f<2>;\n"
    "\n"
    "    ld.param.u64 %rd1, [vgpu_spin_work_iters];\n"
    "    ld.param.u64 %rd3, [vgpu_spin_work_out];\n"
    "    mov.u64 %rd2, 0;\n"
    "    mov.f32 %f1, 0f3F800000;\n"
    "$L_work:\n"
    "    fma.rn.f32 %f1, %f1, 0f3F7FFFEF, 0f3A83126F;\n"
    "    add.u64 %rd2, %rd2, 1;\n"
    "    setp.lt.u64 %p1, %rd2, %rd1;\n"
    "    @%p1 bra $L_work;\n"
    "    st.global.f32 [%rd3], %f1;\n"
    "    ret;\n"
    "}\n";

/* ---- the driver, through cuGetProcAddress ---- */

#define API_VERSION 12000

typedef CUresult (*proc_v2_t)(const char *, void **, int, cuuint64_t,
                              CUdriverProcAddressQueryResult *);
typedef CUresult (*proc_v1_t)(const char *, void **, int, cuuint64_t);

static struct {
    CUresult (*Init)(unsigned int);
    CUresult (*GetErrorName)(CUresult, const char **);
    CUresult (*DeviceGet)(CUdevice *, int);
    CUresult (*PrimaryCtxRetain)(CUcontext *, CUdevice);
    CUresult (*CtxSetCurrent)(CUcontext);
    CUresult (*MemAlloc)(CUdeviceptr *, size_t);
    CUresult (*ModuleLoadData)(CUmodule *, const void *);
    CUresult (*ModuleGetFunction)(CUfunction *, CUmodule, const char *);
    CUresult (*StreamCreate)(CUstream *, unsigned int);
    CUresult (*StreamSynchronize)(CUstream);
    CUresult (*EventCreate)(CUevent *, unsigned int);
    CUresult (*EventRecord)(CUevent, CUstream);
    CUresult (*EventSynchronize)(CUevent);
    CUresult (*EventElapsedTime)(float *, CUevent, CUevent);
    CUresult (*GraphCreate)(CUgraph *, unsigned int);
    CUresult (*GraphAddKernelNode)(CUgraphNode *, CUgraph, const CUgraphNode *, size_t,
                                   const CUDA_KERNEL_NODE_PARAMS_v2 *);
    CUresult (*GraphInstantiate)(CUgraphExec *, CUgraph, unsigned long long);
    CUresult (*GraphLaunch)(CUgraphExec, CUstream);
    CUresult (*LaunchKernel)(CUfunction, unsigned int, unsigned int, unsigned int, unsigned int,
                             unsigned int, unsigned int, unsigned int, CUstream, void **,
                             void **);
} cu;

static const char *g_prog = "vgpu-burn";

static int load_driver(const char **missing)
{
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        *missing = "libcuda.so.1";
        return -1;
    }
    proc_v2_t v2 = (proc_v2_t)dlsym(h, "cuGetProcAddress_v2");
    proc_v1_t v1 = (proc_v1_t)dlsym(h, "cuGetProcAddress");
    if (!v2 && !v1) {
        *missing = "cuGetProcAddress";
        return -1;
    }
    static const struct {
        const char *name;
        void **slot;
    } want[] = {
        {"cuInit", (void **)&cu.Init},
        {"cuGetErrorName", (void **)&cu.GetErrorName},
        {"cuDeviceGet", (void **)&cu.DeviceGet},
        {"cuDevicePrimaryCtxRetain", (void **)&cu.PrimaryCtxRetain},
        {"cuCtxSetCurrent", (void **)&cu.CtxSetCurrent},
        {"cuMemAlloc", (void **)&cu.MemAlloc},
        {"cuModuleLoadData", (void **)&cu.ModuleLoadData},
        {"cuModuleGetFunction", (void **)&cu.ModuleGetFunction},
        {"cuStreamCreate", (void **)&cu.StreamCreate},
        {"cuStreamSynchronize", (void **)&cu.StreamSynchronize},
        {"cuEventCreate", (void **)&cu.EventCreate},
        {"cuEventRecord", (void **)&cu.EventRecord},
        {"cuEventSynchronize", (void **)&cu.EventSynchronize},
        {"cuLaunchKernel", (void **)&cu.LaunchKernel},
        {"cuEventElapsedTime", (void **)&cu.EventElapsedTime},
        {"cuGraphCreate", (void **)&cu.GraphCreate},
        {"cuGraphAddKernelNode", (void **)&cu.GraphAddKernelNode},
        {"cuGraphInstantiate", (void **)&cu.GraphInstantiate},
        {"cuGraphLaunch", (void **)&cu.GraphLaunch},
    };
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        CUdriverProcAddressQueryResult st;
        CUresult rc = v2 ? v2(want[i].name, want[i].slot, API_VERSION, 0, &st)
                         : v1(want[i].name, want[i].slot, API_VERSION, 0);
        if (rc != CUDA_SUCCESS || !*want[i].slot) {
            *missing = want[i].name;
            return -1;
        }
    }
    return 0;
}

/* ---- arguments ---- */

struct opts {
    int device;
    double kernel_us;
    double seconds; /* 0: use count */
    long long count;
    unsigned long long alloc;
    int inflight;
    int graph;        /* kernels per graph; 0: plain launches */
    int request;      /* kernels per request; 0: not a client */
    int work;         /* fixed-work kernels */
    double iters_per_us; /* their calibration; 0: measure it */
    double think_ms;
    unsigned long long seed;
    double duty;      /* percent; 0: no pause */
    double period_ms;
    double on_ms, off_ms;  /* wall-time on/off; 0: none */
    int long_every;   /* of every K kernels, the last long_run long; 0: none */
    int long_run;
    double long_us;
    double flip_us, flip_s;   /* every flip_s seconds, kernels of flip_us; 0: none */
};

#define USAGE "usage: %s [--device N] --kernel-us US (--seconds S | --count K)" \
              " [--alloc SIZE] [--inflight K] [--graph N] [--work [--iters-per-us X]]" \
              " [--duty PCT [--period-ms MS]] [--on-ms MS --off-ms MS]" \
              " [--request K --think-ms MS [--seed S]]" \
              " [--long-every K --long-us US [--long-run R]] [--flip-us US --flip-s S]\n"

static void usage_error(const char *fmt, const char *arg)
{
    fprintf(stderr, "%s: error: ", g_prog);
    fprintf(stderr, fmt, arg);
    fprintf(stderr, "\n" USAGE, g_prog);
    exit(2);
}

static double parse_number(const char *opt, const char *s, double min)
{
    char *end;
    errno = 0;
    double v = s ? strtod(s, &end) : 0;
    if (!s || errno || end == s || *end || !(v >= min))
        usage_error(min > 0 ? "%s needs a positive number" : "%s needs a number >= 0", opt);
    return v;
}

/* A whole number from lo to hi (an option's value), or a usage error. */
static int parse_whole(const char *opt, const char *s, int lo, int hi)
{
    double k = parse_number(opt, s, lo);
    if (k != (int)k || k > hi) {
        char fmt[64];
        snprintf(fmt, sizeof fmt, "%%s needs a whole number from %d to %d", lo, hi);
        usage_error(fmt, opt);
    }
    return (int)k;
}

static unsigned long long parse_size(const char *s)
{
    uint64_t n;
    if (vgpu_parse_size(s, &n) != 0)
        usage_error("--alloc needs a size such as 512M, 1.5G or 4GiB, not '%s'", s ? s : "");
    return n;
}

static struct opts parse_args(int argc, char **argv)
{
    struct opts o = {.device = 0, .inflight = 4, .period_ms = 100};
    int have_us = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
            printf(USAGE, g_prog);
            exit(0);
        } else if (strcmp(a, "--device") == 0) {
            double d = parse_number(a, v, 0);
            if (d != (int)d)
                usage_error("%s needs a whole number", a);
            o.device = (int)d;
        } else if (strcmp(a, "--kernel-us") == 0) {
            o.kernel_us = parse_number(a, v, 1e-9);
            have_us = 1;
        } else if (strcmp(a, "--seconds") == 0) {
            o.seconds = parse_number(a, v, 1e-9);
        } else if (strcmp(a, "--count") == 0) {
            double c = parse_number(a, v, 1);
            if (c != (long long)c)
                usage_error("%s needs a whole number", a);
            o.count = (long long)c;
        } else if (strcmp(a, "--alloc") == 0) {
            o.alloc = parse_size(v);
        } else if (strcmp(a, "--duty") == 0) {
            o.duty = parse_number(a, v, 1e-9);
            if (o.duty > 100)
                usage_error("%s needs a percentage from 0 to 100", a);
        } else if (strcmp(a, "--period-ms") == 0) {
            o.period_ms = parse_number(a, v, 1e-9);
        } else if (strcmp(a, "--on-ms") == 0) {
            o.on_ms = parse_number(a, v, 1e-9);
        } else if (strcmp(a, "--off-ms") == 0) {
            o.off_ms = parse_number(a, v, 1e-9);
        } else if (strcmp(a, "--inflight") == 0) {
            o.inflight = parse_whole(a, v, 1, 1024);
        } else if (strcmp(a, "--graph") == 0 || strcmp(a, "--request") == 0) {
            *(a[2] == 'g' ? &o.graph : &o.request) = parse_whole(a, v, 1, 100000);
        } else if (strcmp(a, "--long-every") == 0) {
            o.long_every = parse_whole(a, v, 2, 100000);
        } else if (strcmp(a, "--long-run") == 0) {
            o.long_run = parse_whole(a, v, 1, 100000);
        } else if (strcmp(a, "--long-us") == 0) {
            o.long_us = parse_number(a, v, 1e-9);
        } else if (strcmp(a, "--flip-us") == 0 || strcmp(a, "--flip-s") == 0) {
            *(a[7] == 'u' ? &o.flip_us : &o.flip_s) = parse_number(a, v, 1e-9);
        } else if (strcmp(a, "--work") == 0) {
            o.work = 1;
            continue;
        } else if (strcmp(a, "--iters-per-us") == 0) {
            o.iters_per_us = parse_number(a, v, 1e-9);
        } else if (strcmp(a, "--think-ms") == 0) {
            o.think_ms = parse_number(a, v, 0);
        } else if (strcmp(a, "--seed") == 0) {
            o.seed = (unsigned long long)parse_number(a, v, 0);
        } else {
            usage_error("unknown option '%s'", a);
        }
        i++;
    }
    if (!have_us)
        usage_error("%s is required", "--kernel-us");
    if ((o.seconds > 0) == (o.count > 0))
        usage_error("give exactly one of %s", "--seconds or --count");
    if (o.request && o.graph)
        usage_error("%s: a client launches plain kernels", "--graph");
    if ((o.long_every > 0) != (o.long_us > 0))
        usage_error("give both of %s", "--long-every and --long-us");
    if (o.long_every && (o.graph || o.request))
        usage_error("%s: plain launches only", "--long-every");
    if (o.long_run && !o.long_every)
        usage_error("%s goes with --long-every", "--long-run");
    if (o.long_run >= o.long_every && o.long_every)
        usage_error("%s: fewer than --long-every", "--long-run");
    if (!o.long_run)
        o.long_run = 1;
    if ((o.flip_us > 0) != (o.flip_s > 0))
        usage_error("give both of %s", "--flip-us and --flip-s");
    if (o.flip_us > 0 && (o.graph || o.request || o.long_every))
        usage_error("%s: plain launches of one length only", "--flip-us");
    if ((o.on_ms > 0) != (o.off_ms > 0))
        usage_error("give both of %s", "--on-ms and --off-ms");
    if (o.on_ms > 0 && o.duty > 0)
        usage_error("give %s, not both", "--duty or --on-ms/--off-ms");
    return o;
}

/* ---- the run ---- */

static volatile sig_atomic_t g_stop;

static void on_signal(int sig)
{
    (void)sig;
    g_stop = 1;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static struct opts g_o;
static long long g_done;
static double g_start, g_elapsed;
/* a client's requests: host latency, device latency, device time to the end
 * of the first kernel, in ms */
static double *g_lat, *g_dev, *g_first;
static long long g_nreq, g_capreq;

static void put_list(const char *name, const double *v, long long n)
{
    printf(", \"%s\": [", name);
    for (long long i = 0; i < n; i++)
        printf("%s%.4f", i ? ", " : "", v[i]);
    printf("]");
}

static void report(const char *call, CUresult rc)
{
    if (g_start > 0 && g_elapsed == 0)
        g_elapsed = now_s() - g_start;
    double rate = g_elapsed > 0 ? (double)g_done / g_elapsed : 0;
    printf("{\"kernels\": %lld, \"seconds\": %.6f, \"rate\": %.3f, \"kernel_us\": %g, "
           "\"device\": %d, \"pid\": %d, \"inflight\": %d, \"alloc\": %llu",
           g_done, g_elapsed, rate, g_o.kernel_us, g_o.device, (int)getpid(), g_o.inflight,
           g_o.alloc);
    if (g_o.graph)
        printf(", \"graph\": %d", g_o.graph);
    if (g_o.work)
        printf(", \"iters_per_us\": %.4f", g_o.iters_per_us);
    if (g_o.request) {
        printf(", \"requests\": %lld, \"request\": %d, \"think_ms\": %g", g_nreq,
               g_o.request, g_o.think_ms);
        put_list("latency_ms", g_lat, g_nreq);
        put_list("device_ms", g_dev, g_nreq);
        put_list("first_ms", g_first, g_nreq);
    }
    if (call) {
        const char *name = NULL;
        if (!cu.GetErrorName || cu.GetErrorName(rc, &name) != CUDA_SUCCESS || !name)
            name = "CUDA_ERROR_UNKNOWN";
        printf(", \"error\": \"%s\", \"code\": %d, \"call\": \"%s\"", name, (int)rc, call);
    }
    printf("}\n");
    fflush(stdout);
}

#define CHECK(call, expr)                  \
    do {                                   \
        CUresult rc_ = (expr);             \
        if (rc_ != CUDA_SUCCESS) {         \
            report(call, rc_);             \
            return 1;                      \
        }                                  \
    } while (0)

/* xorshift64*, seeded: the same think times on every run */
static double uniform01(unsigned long long *x)
{
    *x ^= *x >> 12;
    *x ^= *x << 25;
    *x ^= *x >> 27;
    return (double)((*x * 2685821657736338717ull) >> 11) / 9007199254740992.0;
}

static void nap_ms(double ms)
{
    struct timespec ts = {.tv_sec = (time_t)(ms / 1000),
                          .tv_nsec = (long)((ms - 1000.0 * (time_t)(ms / 1000)) * 1e6)};
    while (!g_stop && nanosleep(&ts, &ts) != 0 && errno == EINTR)
        ;
}

static int push_request(double lat, double dev, double first)
{
    if (g_nreq == g_capreq) {
        long long cap = g_capreq ? 2 * g_capreq : 1024;
        double *a = realloc(g_lat, (size_t)cap * sizeof *a);
        if (a)
            g_lat = a;
        double *b = realloc(g_dev, (size_t)cap * sizeof *b);
        if (b)
            g_dev = b;
        double *c = realloc(g_first, (size_t)cap * sizeof *c);
        if (c)
            g_first = c;
        if (!a || !b || !c)
            return -1;
        g_capreq = cap;
    }
    g_lat[g_nreq] = lat;
    g_dev[g_nreq] = dev;
    g_first[g_nreq] = first;
    g_nreq++;
    return 0;
}

/* The latency client (--request). */
static int client(CUfunction fn, CUstream stream, void **args)
{
    CUevent start, first, end;
    CHECK("cuEventCreate", cu.EventCreate(&start, CU_EVENT_DEFAULT));
    CHECK("cuEventCreate", cu.EventCreate(&first, CU_EVENT_DEFAULT));
    CHECK("cuEventCreate", cu.EventCreate(&end, CU_EVENT_BLOCKING_SYNC));
    unsigned long long x = g_o.seed * 0x9e3779b97f4a7c15ull + 0x2545f4914f6cdd1dull;
    g_start = now_s();
    double deadline = g_start + g_o.seconds;
    while (!g_stop && (g_o.count ? g_nreq < g_o.count : now_s() < deadline)) {
        double t0 = now_s();
        CHECK("cuEventRecord", cu.EventRecord(start, stream));
        for (int k = 0; k < g_o.request; k++) {
            CHECK("cuLaunchKernel",
                  cu.LaunchKernel(fn, 1, 1, 1, 1, 1, 1, 0, stream, args, NULL));
            if (k == 0)
                CHECK("cuEventRecord", cu.EventRecord(first, stream));
        }
        CHECK("cuEventRecord", cu.EventRecord(end, stream));
        CHECK("cuEventSynchronize", cu.EventSynchronize(end));
        double lat = (now_s() - t0) * 1e3;
        float dev_ms = 0, first_ms = 0;
        CHECK("cuEventElapsedTime", cu.EventElapsedTime(&dev_ms, start, end));
        CHECK("cuEventElapsedTime", cu.EventElapsedTime(&first_ms, start, first));
        if (push_request(lat, dev_ms, first_ms) != 0)
            return 1;
        g_done += g_o.request;
        if (g_o.think_ms > 0)
            nap_ms(-g_o.think_ms * log(1.0 - uniform01(&x)));
    }
    g_elapsed = now_s() - g_start;
    report(NULL, CUDA_SUCCESS);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc > 0 && argv[0] && strrchr(argv[0], '/'))
        g_prog = strrchr(argv[0], '/') + 1;
    g_o = parse_args(argc, argv);

    const char *missing = NULL;
    if (load_driver(&missing) < 0) {
        printf("{\"kernels\": 0, \"seconds\": 0, \"rate\": 0, \"kernel_us\": %g, \"device\": %d, "
               "\"pid\": %d, \"error\": \"driver unavailable: %s\"}\n",
               g_o.kernel_us, g_o.device, (int)getpid(), missing);
        return 1;
    }
    struct sigaction sa = {.sa_handler = on_signal};
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);

    CUdevice dev;
    CUcontext ctx;
    CUmodule mod;
    CUfunction fn;
    CUstream stream;
    CHECK("cuInit", cu.Init(0));
    CHECK("cuDeviceGet", cu.DeviceGet(&dev, g_o.device));
    CHECK("cuDevicePrimaryCtxRetain", cu.PrimaryCtxRetain(&ctx, dev));
    CHECK("cuCtxSetCurrent", cu.CtxSetCurrent(ctx));
    if (g_o.alloc) {
        CUdeviceptr p;
        CUresult rc = cu.MemAlloc(&p, (size_t)g_o.alloc);
        if (rc != CUDA_SUCCESS) {
            report("cuMemAlloc", rc);
            return 2;
        }
    }
    CHECK("cuModuleLoadData", cu.ModuleLoadData(&mod, k_ptx));
    CHECK("cuModuleGetFunction",
          cu.ModuleGetFunction(&fn, mod, g_o.work ? "vgpu_spin_work" : "vgpu_spin"));
    CHECK("cuStreamCreate", cu.StreamCreate(&stream, CU_STREAM_NON_BLOCKING));
    CUevent *ev = calloc((size_t)g_o.inflight, sizeof *ev);
    if (!ev)
        return 1;
    for (int i = 0; i < g_o.inflight; i++)
        CHECK("cuEventCreate", cu.EventCreate(&ev[i], CU_EVENT_DISABLE_TIMING));

    unsigned long long ns = (unsigned long long)(g_o.kernel_us * 1000.0 + 0.5);
    unsigned long long iters = 0;
    CUdeviceptr out = 0;
    void *args[] = {&ns, &iters, &out};
    if (g_o.work) {
        CHECK("cuMemAlloc", cu.MemAlloc(&out, 64));
        if (g_o.iters_per_us <= 0) {
            /* as many multiply-adds a microsecond as this GPU does alone */
            CUevent a, b;
            CHECK("cuEventCreate", cu.EventCreate(&a, CU_EVENT_DEFAULT));
            CHECK("cuEventCreate", cu.EventCreate(&b, CU_EVENT_DEFAULT));
            iters = 200000;
            for (int k = 0; k < 4; k++) {
                float ms = 0;
                CHECK("cuEventRecord", cu.EventRecord(a, stream));
                CHECK("cuLaunchKernel",
                      cu.LaunchKernel(fn, 1, 1, 1, 1, 1, 1, 0, stream, args, NULL));
                CHECK("cuEventRecord", cu.EventRecord(b, stream));
                CHECK("cuEventSynchronize", cu.EventSynchronize(b));
                CHECK("cuEventElapsedTime", cu.EventElapsedTime(&ms, a, b));
                double rate = ms > 0 ? (double)iters / (ms * 1000.0) : 0;
                if (rate > g_o.iters_per_us)
                    g_o.iters_per_us = rate;
            }
            if (g_o.iters_per_us <= 0)
                g_o.iters_per_us = 1;
        }
        iters = (unsigned long long)(g_o.iters_per_us * g_o.kernel_us + 0.5);
    }
    unsigned long long long_ns = (unsigned long long)(g_o.long_us * 1000.0 + 0.5);
    unsigned long long long_iters = (unsigned long long)(g_o.iters_per_us * g_o.long_us + 0.5);
    void *long_args[] = {&long_ns, &long_iters, &out};
    unsigned long long flip_ns = (unsigned long long)(g_o.flip_us * 1000.0 + 0.5);
    unsigned long long flip_iters = (unsigned long long)(g_o.iters_per_us * g_o.flip_us + 0.5);
    void *flip_args[] = {&flip_ns, &flip_iters, &out};
    if (g_o.request)
        return client(fn, stream, args);
    CUgraphExec exec = NULL;
    if (g_o.graph) {
        CUgraph graph;
        CHECK("cuGraphCreate", cu.GraphCreate(&graph, 0));
        CUgraphNode prev = NULL;
        for (int i = 0; i < g_o.graph; i++) {
            CUDA_KERNEL_NODE_PARAMS_v2 kp = {.func = fn, .gridDimX = 1, .gridDimY = 1,
                                             .gridDimZ = 1, .blockDimX = 1, .blockDimY = 1,
                                             .blockDimZ = 1, .kernelParams = args};
            CUgraphNode node;
            CHECK("cuGraphAddKernelNode",
                  cu.GraphAddKernelNode(&node, graph, prev ? &prev : NULL, prev ? 1 : 0, &kp));
            prev = node;
        }
        CHECK("cuGraphInstantiate", cu.GraphInstantiate(&exec, graph, 0));
    }
    long long per = g_o.graph ? g_o.graph : 1;
    long long launched = 0;
    g_start = now_s();
    double deadline = g_start + g_o.seconds;
    /* --duty: kernels per period, and where the current period ends */
    long long per_period = 0, in_period = 0;
    double period_end = g_start + g_o.period_ms / 1000.0;
    if (g_o.duty > 0 && g_o.duty < 100) {
        per_period = (long long)(g_o.period_ms * 1000.0 * g_o.duty / 100.0 / g_o.kernel_us + 0.5);
        if (per_period < 1)
            per_period = 1;
    }
    double on_end = g_start + g_o.on_ms / 1000.0;
    while (!g_stop && (g_o.count ? launched < g_o.count : now_s() < deadline)) {
        if (g_o.on_ms > 0 && now_s() >= on_end) {
            CHECK("cuStreamSynchronize", cu.StreamSynchronize(stream));
            double off = g_o.off_ms / 1000.0;
            struct timespec ts = {(time_t)off, (long)((off - (double)(time_t)off) * 1e9)};
            nanosleep(&ts, NULL);
            on_end = now_s() + g_o.on_ms / 1000.0;
            continue;
        }
        if (per_period > 0 && in_period >= per_period) {
            CHECK("cuStreamSynchronize", cu.StreamSynchronize(stream));
            double left = period_end - now_s();
            if (left > 0) {
                struct timespec ts = {(time_t)left, (long)((left - (double)(time_t)left) * 1e9)};
                nanosleep(&ts, NULL);
            }
            period_end += g_o.period_ms / 1000.0;
            if (period_end < now_s())   /* the kernels took longer than a period */
                period_end = now_s();
            in_period = 0;
            continue;
        }
        in_period++;
        int slot = (int)(launched % g_o.inflight);
        if (launched >= g_o.inflight) {
            /* at most `inflight` kernels queued: wait for the oldest */
            CHECK("cuEventSynchronize", cu.EventSynchronize(ev[slot]));
            g_done += per;
        }
        int lng = g_o.long_every > 0 &&
                  launched % g_o.long_every >= g_o.long_every - g_o.long_run;
        int flip = g_o.flip_s > 0 && (long long)((now_s() - g_start) / g_o.flip_s) % 2 == 1;
        if (exec)
            CHECK("cuGraphLaunch", cu.GraphLaunch(exec, stream));
        else
            CHECK("cuLaunchKernel", cu.LaunchKernel(fn, lng ? 2 : 1, 1, 1, 1, 1, 1, 0, stream,
                                                    lng ? long_args : flip ? flip_args : args,
                                                    NULL));
        CHECK("cuEventRecord", cu.EventRecord(ev[slot], stream));
        launched++;
    }
    CHECK("cuStreamSynchronize", cu.StreamSynchronize(stream));
    g_done = launched * per;
    g_elapsed = now_s() - g_start;
    report(NULL, CUDA_SUCCESS);
    return 0;
}
