/*
 * vgpu-burn - launch kernels of a given duration and report how many ran.
 *
 *   vgpu-burn [--device N] --kernel-us US (--seconds S | --count K)
 *             [--alloc SIZE] [--inflight K] [--duty PCT [--period-ms MS]]
 *             [--on-ms MS --off-ms MS] [--graph K]
 *
 * Driver API only, reached as the CUDA runtime reaches it: dlopen
 * ("libcuda.so.1"), then every entry point through cuGetProcAddress. The
 * kernel is embedded PTX that spins on %globaltimer for its u64 argument in
 * nanoseconds; a real driver JIT-compiles it (no toolkit needed), and the
 * simulated GPU runs it for that long by its duration rule. So the same
 * program measures compute shares on the simulator and on a real GPU.
 *
 * --duty keeps the device busy about PCT % of the time: at the start of each
 * period of MS milliseconds (100 by default) it launches kernels adding up to
 * PCT % of the period, waits for them, and sleeps to the period's end.
 * --on-ms/--off-ms alternate in wall time: launch for ON ms, wait for the
 * kernels, sleep OFF ms (on a shared GPU it gets less than ON/(ON+OFF)).
 * --graph K captures K kernels into a CUDA graph (stream capture) and
 * launches the graph instead: one cuGraphLaunch runs K kernels, as
 * frameworks replay captured steps; --inflight then counts graphs, and
 * "kernels" still counts kernels.
 *
 * Prints one line of JSON: kernels (completed), seconds (wall time from the
 * first launch to the last completion), rate (kernels per second),
 * kernel_us, device, pid; with "error" and "call" when a driver call failed.
 * Exit status: 0 done, 1 a driver call failed, 2 bad arguments or --alloc
 * failed. SIGINT or SIGTERM stops the launches and reports what ran.
 */
#include <dlfcn.h>
#include <errno.h>
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
    CUresult (*LaunchKernel)(CUfunction, unsigned int, unsigned int, unsigned int, unsigned int,
                             unsigned int, unsigned int, unsigned int, CUstream, void **,
                             void **);
    CUresult (*StreamBeginCapture)(CUstream, int);
    CUresult (*StreamEndCapture)(CUstream, CUgraph *);
    CUresult (*GraphInstantiate)(CUgraphExec *, CUgraph, unsigned long long);
    CUresult (*GraphLaunch)(CUgraphExec, CUstream);
} cu;

/* CU_STREAM_CAPTURE_MODE_THREAD_LOCAL: only this thread's calls are checked */
#define CAPTURE_MODE_THREAD_LOCAL 1

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
        {"cuStreamBeginCapture", (void **)&cu.StreamBeginCapture},
        {"cuStreamEndCapture", (void **)&cu.StreamEndCapture},
        {"cuGraphInstantiateWithFlags", (void **)&cu.GraphInstantiate},
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
    double duty;      /* percent; 0: no pause */
    double period_ms;
    double on_ms, off_ms;  /* wall-time on/off; 0: none */
    int graph;             /* kernels per graph launch; 0: plain launches */
};

static void usage_error(const char *fmt, const char *arg)
{
    fprintf(stderr, "%s: error: ", g_prog);
    fprintf(stderr, fmt, arg);
    fprintf(stderr, "\nusage: %s [--device N] --kernel-us US (--seconds S | --count K)"
                    " [--alloc SIZE] [--inflight K] [--duty PCT [--period-ms MS]]"
                    " [--on-ms MS --off-ms MS] [--graph K]\n", g_prog);
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
            printf("usage: %s [--device N] --kernel-us US (--seconds S | --count K)"
                   " [--alloc SIZE] [--inflight K] [--duty PCT [--period-ms MS]]"
                   " [--on-ms MS --off-ms MS] [--graph K]\n", g_prog);
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
        } else if (strcmp(a, "--graph") == 0) {
            double k = parse_number(a, v, 1);
            if (k != (int)k || k > 1024)
                usage_error("%s needs a whole number from 1 to 1024", a);
            o.graph = (int)k;
        } else if (strcmp(a, "--inflight") == 0) {
            double k = parse_number(a, v, 1);
            if (k != (int)k || k > 1024)
                usage_error("%s needs a whole number from 1 to 1024", a);
            o.inflight = (int)k;
        } else {
            usage_error("unknown option '%s'", a);
        }
        i++;
    }
    if (!have_us)
        usage_error("%s is required", "--kernel-us");
    if ((o.seconds > 0) == (o.count > 0))
        usage_error("give exactly one of %s", "--seconds or --count");
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

static void report(const char *call, CUresult rc)
{
    if (g_start > 0 && g_elapsed == 0)
        g_elapsed = now_s() - g_start;
    double rate = g_elapsed > 0 ? (double)g_done / g_elapsed : 0;
    printf("{\"kernels\": %lld, \"seconds\": %.6f, \"rate\": %.3f, \"kernel_us\": %g, "
           "\"device\": %d, \"pid\": %d, \"inflight\": %d, \"alloc\": %llu, \"graph\": %d",
           g_done, g_elapsed, rate, g_o.kernel_us, g_o.device, (int)getpid(), g_o.inflight,
           g_o.alloc, g_o.graph);
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
    CHECK("cuModuleGetFunction", cu.ModuleGetFunction(&fn, mod, "vgpu_spin"));
    CHECK("cuStreamCreate", cu.StreamCreate(&stream, CU_STREAM_NON_BLOCKING));
    CUevent *ev = calloc((size_t)g_o.inflight, sizeof *ev);
    if (!ev)
        return 1;
    for (int i = 0; i < g_o.inflight; i++)
        CHECK("cuEventCreate", cu.EventCreate(&ev[i], CU_EVENT_DISABLE_TIMING));

    unsigned long long ns = (unsigned long long)(g_o.kernel_us * 1000.0 + 0.5);
    void *args[] = {&ns};
    /* --graph: the K kernels captured once, launched as one graph */
    CUgraphExec exec = NULL;
    int per_launch = g_o.graph > 0 ? g_o.graph : 1;
    if (g_o.graph > 0) {
        CUgraph graph;
        CHECK("cuStreamBeginCapture",
              cu.StreamBeginCapture(stream, CAPTURE_MODE_THREAD_LOCAL));
        for (int i = 0; i < g_o.graph; i++)
            CHECK("cuLaunchKernel", cu.LaunchKernel(fn, 1, 1, 1, 1, 1, 1, 0, stream, args, NULL));
        CHECK("cuStreamEndCapture", cu.StreamEndCapture(stream, &graph));
        CHECK("cuGraphInstantiateWithFlags", cu.GraphInstantiate(&exec, graph, 0));
    }
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
        in_period += per_launch;
        int slot = (int)(launched % g_o.inflight);
        if (launched >= g_o.inflight) {
            /* at most `inflight` launches queued: wait for the oldest */
            CHECK("cuEventSynchronize", cu.EventSynchronize(ev[slot]));
            g_done += per_launch;
        }
        if (exec)
            CHECK("cuGraphLaunch", cu.GraphLaunch(exec, stream));
        else
            CHECK("cuLaunchKernel", cu.LaunchKernel(fn, 1, 1, 1, 1, 1, 1, 0, stream, args, NULL));
        CHECK("cuEventRecord", cu.EventRecord(ev[slot], stream));
        launched++;
    }
    CHECK("cuStreamSynchronize", cu.StreamSynchronize(stream));
    g_done = launched * per_launch;
    g_elapsed = now_s() - g_start;
    report(NULL, CUDA_SUCCESS);
    return 0;
}
