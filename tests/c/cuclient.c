/*
 * cuclient.c - a small driver-API client the hook tests run under
 * libvgpu.so. One source, three ways of reaching the driver, chosen at
 * build time:
 *
 *   (default)      linked against libcuda.so.1 (-lcuda): direct calls
 *   -DVIA_DLSYM    dlopen("libcuda.so.1") + dlsym of each versioned name
 *                  (with -DVIA_DLVSYM: through the dlsym dlvsym gives for
 *                  "dlsym"; with -DVIA_LIBC_DLSYM: through libc.so.6's)
 *   -DVIA_GPA=2    dlsym("cuGetProcAddress_v2"), then looks up
 *                  "cuGetProcAddress" through it, then every entry point
 *                  through that (cudaVersion 12080; _ptsz forms with the
 *                  per-thread-default-stream flag)
 *   -DVIA_GPA=1    the same with cuGetProcAddress (v1, cudaVersion 11080)
 *
 * `lookup` prints which library and symbol the looked-up pointer is in
 * (dladdr), so a test can tell the hook's wrapper of a given versioned symbol
 * from the driver's own function.
 *
 * It runs the commands given as arguments and prints one line per command:
 * "<command> <CUresult> [values...]". Sizes accept K/M/G suffixes.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "vgpu/cuda_types.h"

#define LAUNCH_P (CUfunction, unsigned int, unsigned int, unsigned int, unsigned int, \
                  unsigned int, unsigned int, unsigned int, CUstream, void **, void **)
#define COOP_P (CUfunction, unsigned int, unsigned int, unsigned int, unsigned int, \
                unsigned int, unsigned int, unsigned int, CUstream, void **)
#define PTDS CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM

/* X(base name, versioned symbol, cuGetProcAddress flags, parameter types) */
#define FUNCS(X) \
    X(cuInit, cuInit, 0, (unsigned int)) \
    X(cuDeviceGet, cuDeviceGet, 0, (CUdevice *, int)) \
    X(cuDevicePrimaryCtxRetain, cuDevicePrimaryCtxRetain, 0, (CUcontext *, CUdevice)) \
    X(cuDevicePrimaryCtxRelease, cuDevicePrimaryCtxRelease_v2, 0, (CUdevice)) \
    X(cuCtxSetCurrent, cuCtxSetCurrent, 0, (CUcontext)) \
    X(cuDevicePrimaryCtxReset, cuDevicePrimaryCtxReset, 0, (CUdevice)) \
    X(cuDevicePrimaryCtxReset, cuDevicePrimaryCtxReset_v2, 0, (CUdevice)) \
    X(cuCtxCreate, cuCtxCreate_v2, 0, (CUcontext *, unsigned int, CUdevice)) \
    X(cuCtxCreate, cuCtxCreate_v3, 0, (CUcontext *, void *, int, unsigned int, CUdevice)) \
    X(cuCtxCreate, cuCtxCreate_v4, 0, (CUcontext *, void *, unsigned int, CUdevice)) \
    X(cuCtxDestroy, cuCtxDestroy_v2, 0, (CUcontext)) \
    X(cuCtxSynchronize, cuCtxSynchronize, 0, (void)) \
    X(cuMemAlloc, cuMemAlloc_v2, 0, (CUdeviceptr *, size_t)) \
    X(cuMemFree, cuMemFree_v2, 0, (CUdeviceptr)) \
    X(cuMemAllocPitch, cuMemAllocPitch_v2, 0, \
      (CUdeviceptr *, size_t *, size_t, size_t, unsigned int)) \
    X(cuMemAllocManaged, cuMemAllocManaged, 0, (CUdeviceptr *, size_t, unsigned int)) \
    X(cuMemAllocAsync, cuMemAllocAsync, 0, (CUdeviceptr *, size_t, CUstream)) \
    X(cuMemAllocAsync, cuMemAllocAsync_ptsz, PTDS, (CUdeviceptr *, size_t, CUstream)) \
    X(cuMemAllocFromPoolAsync, cuMemAllocFromPoolAsync, 0, \
      (CUdeviceptr *, size_t, CUmemoryPool, CUstream)) \
    X(cuMemAllocFromPoolAsync, cuMemAllocFromPoolAsync_ptsz, PTDS, \
      (CUdeviceptr *, size_t, CUmemoryPool, CUstream)) \
    X(cuMemFreeAsync, cuMemFreeAsync, 0, (CUdeviceptr, CUstream)) \
    X(cuMemFreeAsync, cuMemFreeAsync_ptsz, PTDS, (CUdeviceptr, CUstream)) \
    X(cuDeviceGetDefaultMemPool, cuDeviceGetDefaultMemPool, 0, (CUmemoryPool *, CUdevice)) \
    X(cuMemCreate, cuMemCreate, 0, \
      (CUmemGenericAllocationHandle *, size_t, const CUmemAllocationProp *, unsigned long long)) \
    X(cuMemRelease, cuMemRelease, 0, (CUmemGenericAllocationHandle)) \
    X(cuMemExportToShareableHandle, cuMemExportToShareableHandle, 0, \
      (void *, CUmemGenericAllocationHandle, CUmemAllocationHandleType, unsigned long long)) \
    X(cuMemImportFromShareableHandle, cuMemImportFromShareableHandle, 0, \
      (CUmemGenericAllocationHandle *, void *, CUmemAllocationHandleType)) \
    X(cuDeviceGetCount, cuDeviceGetCount, 0, (int *)) \
    X(cuMemAddressReserve, cuMemAddressReserve, 0, \
      (CUdeviceptr *, size_t, size_t, CUdeviceptr, unsigned long long)) \
    X(cuMemMap, cuMemMap, 0, \
      (CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle, unsigned long long)) \
    X(cuMemUnmap, cuMemUnmap, 0, (CUdeviceptr, size_t)) \
    X(cuMemRetainAllocationHandle, cuMemRetainAllocationHandle, 0, \
      (CUmemGenericAllocationHandle *, void *)) \
    X(cuArrayCreate, cuArrayCreate_v2, 0, (CUarray *, const CUDA_ARRAY_DESCRIPTOR *)) \
    X(cuArray3DCreate, cuArray3DCreate_v2, 0, (CUarray *, const CUDA_ARRAY3D_DESCRIPTOR *)) \
    X(cuArrayDestroy, cuArrayDestroy, 0, (CUarray)) \
    X(cuMemGetInfo, cuMemGetInfo_v2, 0, (size_t *, size_t *)) \
    X(cuDeviceTotalMem, cuDeviceTotalMem_v2, 0, (size_t *, CUdevice)) \
    X(cuModuleLoadData, cuModuleLoadData, 0, (CUmodule *, const void *)) \
    X(cuModuleGetFunction, cuModuleGetFunction, 0, (CUfunction *, CUmodule, const char *)) \
    X(cuLaunchKernel, cuLaunchKernel, 0, LAUNCH_P) \
    X(cuLaunchKernel, cuLaunchKernel_ptsz, PTDS, LAUNCH_P) \
    X(cuLaunchKernelEx, cuLaunchKernelEx, 0, \
      (const CUlaunchConfig *, CUfunction, void **, void **)) \
    X(cuLaunchKernelEx, cuLaunchKernelEx_ptsz, PTDS, \
      (const CUlaunchConfig *, CUfunction, void **, void **)) \
    X(cuLaunchCooperativeKernel, cuLaunchCooperativeKernel, 0, COOP_P) \
    X(cuLaunchCooperativeKernel, cuLaunchCooperativeKernel_ptsz, PTDS, COOP_P) \
    X(cuGraphCreate, cuGraphCreate, 0, (CUgraph *, unsigned int)) \
    X(cuGraphAddKernelNode, cuGraphAddKernelNode_v2, 0, \
      (CUgraphNode *, CUgraph, const CUgraphNode *, size_t, const CUDA_KERNEL_NODE_PARAMS_v2 *)) \
    X(cuGraphInstantiate, cuGraphInstantiateWithFlags, 0, \
      (CUgraphExec *, CUgraph, unsigned long long)) \
    X(cuGraphLaunch, cuGraphLaunch, 0, (CUgraphExec, CUstream)) \
    X(cuGraphLaunch, cuGraphLaunch_ptsz, PTDS, (CUgraphExec, CUstream)) \
    X(cuFuncSetBlockShape, cuFuncSetBlockShape, 0, (CUfunction, int, int, int)) \
    X(cuParamSetSize, cuParamSetSize, 0, (CUfunction, unsigned int)) \
    X(cuParamSetv, cuParamSetv, 0, (CUfunction, int, void *, unsigned int)) \
    X(cuLaunch, cuLaunch, 0, (CUfunction)) \
    X(cuLaunchGrid, cuLaunchGrid, 0, (CUfunction, int, int)) \
    X(cuLaunchGridAsync, cuLaunchGridAsync, 0, (CUfunction, int, int, CUstream))

#if !defined(VIA_DLSYM) && !defined(VIA_GPA)
/* Linked directly: declare the driver's functions and take their addresses. */
#define DECL(base, sym, fl, params) extern CUresult sym params;
FUNCS(DECL)
#endif

#define PTR(base, sym, fl, params) static CUresult(*p_##sym) params;
FUNCS(PTR)

typedef CUresult (*gpa2_fn)(const char *, void **, int, cuuint64_t,
                            CUdriverProcAddressQueryResult *);
typedef CUresult (*gpa1_fn)(const char *, void **, int, cuuint64_t);
static void *g_gpa;     /* the cuGetProcAddress in use (looked up through itself) */
static void *g_lib;

#if defined(VIA_GPA) && VIA_GPA == 1
#define GPA_VERSION 11080
#else
#define GPA_VERSION 12080
#endif

static CUresult lookup(const char *base, void **out, int version, cuuint64_t flags, int *status)
{
#if defined(VIA_GPA) && VIA_GPA == 1
    *status = -1;
    return ((gpa1_fn)g_gpa)(base, out, version, flags);
#else
    CUdriverProcAddressQueryResult st = CU_GET_PROC_ADDRESS_SUCCESS;
    CUresult rc = ((gpa2_fn)g_gpa)(base, out, version, flags, &st);
    *status = (int)st;
    return rc;
#endif
}

#if defined(VIA_GPA)
/* The cudaVersion to look a symbol up with: the build's, except for the
 * older versions of a name, which only an older cudaVersion resolves to. */
static int lookup_version(const char *sym)
{
    static const struct { const char *sym; int version; } older[] = {
        {"cuDevicePrimaryCtxReset", 10020},
        {"cuCtxCreate_v2", 11030},
        {"cuCtxCreate_v3", 12040},
    };
    for (size_t i = 0; i < sizeof older / sizeof older[0]; i++)
        if (!strcmp(sym, older[i].sym))
            return older[i].version < GPA_VERSION ? older[i].version : GPA_VERSION;
    return GPA_VERSION;
}
#endif

static void load(void)
{
#if defined(VIA_DLSYM) || defined(VIA_GPA)
    g_lib = dlopen("libcuda.so.1", RTLD_NOW);
    if (!g_lib) {
        fprintf(stderr, "dlopen: %s\n", dlerror());
        exit(2);
    }
#endif
#if defined(VIA_DLSYM)
    /* How the program finds dlsym: the one it links against, or the "real"
     * one a program trying to walk past the hook asks for. */
    void *(*find)(void *, const char *) = dlsym;
#if defined(VIA_DLVSYM)
    *(void **)&find = dlvsym(RTLD_DEFAULT, "dlsym", "GLIBC_2.34");
    if (!find)
        *(void **)&find = dlvsym(RTLD_DEFAULT, "dlsym", "GLIBC_2.2.5");
#elif defined(VIA_LIBC_DLSYM)
    *(void **)&find = dlsym(dlopen("libc.so.6", RTLD_NOW | RTLD_NOLOAD), "dlsym");
#endif
    if (!find) {
        fprintf(stderr, "no dlsym found\n");
        exit(2);
    }
#define LOAD(base, sym, fl, params) *(void **)&p_##sym = find(g_lib, #sym);
    FUNCS(LOAD)
#elif defined(VIA_GPA)
#if VIA_GPA == 1
    void *first = dlsym(g_lib, "cuGetProcAddress");
#else
    void *first = dlsym(g_lib, "cuGetProcAddress_v2");
#endif
    g_gpa = first;
    void *self = NULL;
    int st;
    if (!first || lookup("cuGetProcAddress", &self, GPA_VERSION, 0, &st) != CUDA_SUCCESS || !self) {
        fprintf(stderr, "cannot look up cuGetProcAddress\n");
        exit(2);
    }
    g_gpa = self;   /* every later lookup goes through what the lookup returned */
#define LOAD(base, sym, fl, params) \
    if (lookup(#base, (void **)&p_##sym, lookup_version(#sym), fl, &st) != CUDA_SUCCESS) \
        p_##sym = NULL;
    FUNCS(LOAD)
#else
    g_lib = dlopen("libcuda.so.1", RTLD_NOW);
#define LOAD(base, sym, fl, params) p_##sym = sym;
    FUNCS(LOAD)
#endif
}

static size_t parse_size(const char *s)
{
    char *end;
    double v = strtod(s, &end);
    switch (*end) {
    case 'k': case 'K': v *= 1024.0; break;
    case 'm': case 'M': v *= 1024.0 * 1024; break;
    case 'g': case 'G': v *= 1024.0 * 1024 * 1024; break;
    default: break;
    }
    return (size_t)v;
}

#define MAXH 4096
static struct {
    int kind; /* 1 ptr, 2 vmm handle, 3 array, 4 mapping */
    unsigned long long v;
} h[MAXH];
static int nh;
static size_t h_size[MAXH];    /* a mapping's size */
static int g_ordinal;
static CUcontext g_made[64];
static int n_made;

static int keep(int kind, unsigned long long v)
{
    h[nh].kind = kind;
    h[nh].v = v;
    return nh++;
}

static const char PTX[] =
    ".version 8.0\n.target sm_90\n.address_size 64\n"
    ".visible .entry vgpu_spin_test(.param .u64 ns)\n{\n ret;\n}\n";

static CUfunction g_fn;

static CUresult need_function(void)
{
    if (g_fn)
        return CUDA_SUCCESS;
    CUmodule m;
    CUresult rc = p_cuModuleLoadData(&m, PTX);
    if (rc == CUDA_SUCCESS)
        rc = p_cuModuleGetFunction(&g_fn, m, "vgpu_spin_test");
    return rc;
}

/* n launches of a 1 us kernel through one launch path: kernel, ex, coop,
 * graph (each also _ptsz), legacy (cuLaunch), grid (cuLaunchGrid),
 * gridasync (cuLaunchGridAsync). */
static CUresult launch(const char *how, int n)
{
    CUresult rc = need_function();
    if (rc)
        return rc;
    unsigned long long ns = 1000;
    void *params[] = {&ns};
    int ptsz = strstr(how, "_ptsz") != NULL;
    CUlaunchConfig cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.gridDimX = cfg.gridDimY = cfg.gridDimZ = 1;
    cfg.blockDimX = cfg.blockDimY = cfg.blockDimZ = 1;
    CUgraphExec exec = NULL;
    if (strncmp(how, "graph", 5) == 0) {
        CUgraph g;
        CUgraphNode node;
        CUDA_KERNEL_NODE_PARAMS_v2 kp;
        memset(&kp, 0, sizeof kp);
        kp.func = g_fn;
        kp.gridDimX = kp.gridDimY = kp.gridDimZ = 1;
        kp.blockDimX = kp.blockDimY = kp.blockDimZ = 1;
        kp.kernelParams = params;
        if ((rc = p_cuGraphCreate(&g, 0)) || (rc = p_cuGraphAddKernelNode_v2(&node, g, NULL, 0, &kp)) ||
            (rc = p_cuGraphInstantiateWithFlags(&exec, g, 0)))
            return rc;
    }
    if (!strcmp(how, "legacy") || !strncmp(how, "grid", 4)) {
        /* the launches before cuLaunchKernel: block shape and parameters
         * are set on the function beforehand */
        if ((rc = p_cuFuncSetBlockShape(g_fn, 1, 1, 1)) ||
            (rc = p_cuParamSetv(g_fn, 0, &ns, sizeof ns)) ||
            (rc = p_cuParamSetSize(g_fn, sizeof ns)))
            return rc;
    }
    for (int i = 0; i < n && rc == CUDA_SUCCESS; i++) {
        if (strncmp(how, "kernel", 6) == 0)
            rc = (ptsz ? p_cuLaunchKernel_ptsz : p_cuLaunchKernel)(g_fn, 1, 1, 1, 1, 1, 1, 0, NULL,
                                                                 params, NULL);
        else if (strncmp(how, "ex", 2) == 0)
            rc = (ptsz ? p_cuLaunchKernelEx_ptsz : p_cuLaunchKernelEx)(&cfg, g_fn, params, NULL);
        else if (strncmp(how, "coop", 4) == 0)
            rc = (ptsz ? p_cuLaunchCooperativeKernel_ptsz : p_cuLaunchCooperativeKernel)(
                g_fn, 1, 1, 1, 1, 1, 1, 0, NULL, params);
        else if (strncmp(how, "graph", 5) == 0)
            rc = (ptsz ? p_cuGraphLaunch_ptsz : p_cuGraphLaunch)(exec, NULL);
        else if (!strcmp(how, "legacy"))
            rc = p_cuLaunch(g_fn);
        else if (!strcmp(how, "grid"))
            rc = p_cuLaunchGrid(g_fn, 1, 1);
        else if (!strcmp(how, "gridasync"))
            rc = p_cuLaunchGridAsync(g_fn, 1, 1, NULL);
        else
            rc = CUDA_ERROR_INVALID_VALUE;
    }
    if (rc == CUDA_SUCCESS)
        rc = p_cuCtxSynchronize();
    return rc;
}

static CUcontext g_ctx;
static const char *bg_how;
static int bg_n;
static pthread_t bg_thread;

static void *bg_main(void *arg)
{
    (void)arg;
    CUresult rc = p_cuCtxSetCurrent(g_ctx);
    if (!rc)
        rc = launch(bg_how, bg_n);
    return (void *)(intptr_t)rc;
}

int main(int argc, char **argv)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    load();
    for (int i = 1; i < argc; i++) {
        const char *c = argv[i];
        const char *a1 = i + 1 < argc ? argv[i + 1] : "0";
        const char *a2 = i + 2 < argc ? argv[i + 2] : "0";
        const char *a3 = i + 3 < argc ? argv[i + 3] : "0";
        CUresult rc;
        if (!strcmp(c, "ctx")) { /* ctx ORDINAL: init, retain the primary, make it current */
            CUdevice d;
            CUcontext ctx;
            g_ordinal = atoi(a1);
            rc = p_cuInit(0);
            if (!rc)
                rc = p_cuDeviceGet(&d, g_ordinal);
            if (!rc)
                rc = p_cuDevicePrimaryCtxRetain(&ctx, d);
            if (!rc)
                rc = p_cuCtxSetCurrent(ctx);
            g_ctx = ctx;
            printf("ctx %d\n", rc);
            i += 1;
        } else if (!strcmp(c, "init")) {
            printf("init %d\n", p_cuInit(0));
        } else if (!strcmp(c, "release")) {
            printf("release %d\n", p_cuDevicePrimaryCtxRelease_v2(atoi(a1)));
            i += 1;
        } else if (!strcmp(c, "newctx") || !strcmp(c, "newctx3") || !strcmp(c, "newctx4")) {
            /* newctx[3|4] ORDINAL: cuCtxCreate_v2, _v3 (no affinity
             * parameters) or _v4 (no creation parameters) */
            CUcontext ctx = NULL;
            if (!strcmp(c, "newctx"))
                rc = p_cuCtxCreate_v2(&ctx, 0, atoi(a1));
            else if (!strcmp(c, "newctx3"))
                rc = p_cuCtxCreate_v3 ? p_cuCtxCreate_v3(&ctx, NULL, 0, 0, atoi(a1))
                                      : CUDA_ERROR_NOT_FOUND;
            else
                rc = p_cuCtxCreate_v4 ? p_cuCtxCreate_v4(&ctx, NULL, 0, atoi(a1))
                                      : CUDA_ERROR_NOT_FOUND;
            if (!rc)
                g_made[n_made++] = ctx;
            printf("%s %d\n", c, rc);
            i += 1;
        } else if (!strcmp(c, "reset") || !strcmp(c, "reset_v2")) { /* reset[_v2] ORDINAL */
            int d = atoi(a1);
            rc = !strcmp(c, "reset") ? p_cuDevicePrimaryCtxReset(d) : p_cuDevicePrimaryCtxReset_v2(d);
            printf("%s %d\n", c, rc);
            i += 1;
        } else if (!strcmp(c, "dropctx")) {
            rc = n_made ? p_cuCtxDestroy_v2(g_made[--n_made]) : CUDA_ERROR_INVALID_CONTEXT;
            printf("dropctx %d\n", rc);
        } else if (!strcmp(c, "alloc") || !strcmp(c, "managed") || !strcmp(c, "async") ||
                   !strcmp(c, "async_ptsz") || !strcmp(c, "pool") || !strcmp(c, "pool_ptsz")) {
            CUdeviceptr p = 0;
            size_t n = parse_size(a1);
            if (!strcmp(c, "alloc")) {
                rc = p_cuMemAlloc_v2(&p, n);
            } else if (!strcmp(c, "managed")) {
                rc = p_cuMemAllocManaged(&p, n, CU_MEM_ATTACH_GLOBAL);
            } else if (!strcmp(c, "async")) {
                rc = p_cuMemAllocAsync(&p, n, NULL);
            } else if (!strcmp(c, "async_ptsz")) {
                rc = p_cuMemAllocAsync_ptsz(&p, n, NULL);
            } else {
                CUmemoryPool pool;
                rc = p_cuDeviceGetDefaultMemPool(&pool, g_ordinal);
                if (!rc)
                    rc = (!strcmp(c, "pool") ? p_cuMemAllocFromPoolAsync
                                             : p_cuMemAllocFromPoolAsync_ptsz)(&p, n, pool, NULL);
            }
            printf("%s %d %d\n", c, rc, rc ? -1 : keep(1, p));
            i += 1;
        } else if (!strcmp(c, "pitch")) {
            CUdeviceptr p = 0;
            size_t pitch = 0;
            rc = p_cuMemAllocPitch_v2(&p, &pitch, parse_size(a1), parse_size(a2), 4);
            printf("pitch %d %d %zu\n", rc, rc ? -1 : keep(1, p), pitch);
            i += 2;
        } else if (!strcmp(c, "free") || !strcmp(c, "freeasync") || !strcmp(c, "freeasync_ptsz")) {
            int k = atoi(a1);
            if (!strcmp(c, "free"))
                rc = p_cuMemFree_v2(h[k].v);
            else if (!strcmp(c, "freeasync"))
                rc = p_cuMemFreeAsync(h[k].v, NULL);
            else
                rc = p_cuMemFreeAsync_ptsz(h[k].v, NULL);
            printf("%s %d\n", c, rc);
            i += 1;
        } else if (!strcmp(c, "create")) { /* cuMemCreate on the current device */
            CUmemAllocationProp prop;
            memset(&prop, 0, sizeof prop);
            prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
            prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
            prop.location.id = g_ordinal;
            CUmemGenericAllocationHandle hd = 0;
            rc = p_cuMemCreate(&hd, parse_size(a1), &prop, 0);
            printf("create %d %d\n", rc, rc ? -1 : keep(2, hd));
            i += 1;
        } else if (!strcmp(c, "createfd") || !strcmp(c, "createhost")) {
            /* createfd SIZE: cuMemCreate on the current device, exportable
             * as a POSIX fd; createhost SIZE: in host memory (NUMA node 0) */
            CUmemAllocationProp prop;
            memset(&prop, 0, sizeof prop);
            prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
            if (!strcmp(c, "createfd")) {
                prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
                prop.location.id = g_ordinal;
                prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
            } else {
                prop.location.type = CU_MEM_LOCATION_TYPE_HOST_NUMA;
                prop.location.id = 0;
            }
            CUmemGenericAllocationHandle hd = 0;
            rc = p_cuMemCreate(&hd, parse_size(a1), &prop, 0);
            printf("%s %d %d\n", c, rc, rc ? -1 : keep(2, hd));
            i += 1;
        } else if (!strcmp(c, "export")) { /* export K: its POSIX fd */
            int fd = -1;
            rc = p_cuMemExportToShareableHandle(&fd, h[atoi(a1)].v,
                                                CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
            printf("export %d %d\n", rc, rc ? -1 : fd);
            i += 1;
        } else if (!strcmp(c, "import")) { /* import PID FD: another process's fd */
            char path[64];
            snprintf(path, sizeof path, "/proc/%s/fd/%s", a1, a2);
            int fd = open(path, O_RDWR);
            CUmemGenericAllocationHandle hd = 0;
            rc = fd < 0 ? CUDA_ERROR_INVALID_VALUE
                        : p_cuMemImportFromShareableHandle(&hd, (void *)(intptr_t)fd,
                                                           CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
            printf("import %d %d\n", rc, rc ? -1 : keep(2, hd));
            i += 2;
        } else if (!strcmp(c, "map")) { /* map K SIZE: handle K at a new address */
            CUdeviceptr va = 0;
            size_t n = parse_size(a2);
            rc = p_cuMemAddressReserve(&va, n, 0, 0, 0);
            if (!rc)
                rc = p_cuMemMap(va, n, 0, h[atoi(a1)].v, 0);
            int k = rc ? -1 : keep(4, va);
            if (k >= 0)
                h_size[k] = n;
            printf("map %d %d\n", rc, k);
            i += 2;
        } else if (!strcmp(c, "unmap")) { /* unmap M: the mapping M */
            int k = atoi(a1);
            printf("unmap %d\n", p_cuMemUnmap(h[k].v, h_size[k]));
            i += 1;
        } else if (!strcmp(c, "retain")) { /* retain M: the handle mapped at M */
            CUmemGenericAllocationHandle hd = 0;
            rc = p_cuMemRetainAllocationHandle(&hd, (void *)(uintptr_t)h[atoi(a1)].v);
            printf("retain %d %d\n", rc, rc ? -1 : keep(2, hd));
            i += 1;
        } else if (!strcmp(c, "count")) {
            int n = 0;
            rc = p_cuDeviceGetCount(&n);
            printf("count %d %d\n", rc, n);
        } else if (!strcmp(c, "memrelease")) {
            printf("memrelease %d\n", p_cuMemRelease(h[atoi(a1)].v));
            i += 1;
        } else if (!strcmp(c, "array")) { /* array W H: float, 1 channel */
            CUDA_ARRAY_DESCRIPTOR d = {parse_size(a1), parse_size(a2), CU_AD_FORMAT_FLOAT, 1};
            CUarray arr = NULL;
            rc = p_cuArrayCreate_v2(&arr, &d);
            printf("array %d %d\n", rc, rc ? -1 : keep(3, (unsigned long long)(uintptr_t)arr));
            i += 2;
        } else if (!strcmp(c, "array3d")) { /* array3d W H D: float, 4 channels */
            CUDA_ARRAY3D_DESCRIPTOR d = {parse_size(a1), parse_size(a2), parse_size(a3),
                                         CU_AD_FORMAT_FLOAT, 4, 0};
            CUarray arr = NULL;
            rc = p_cuArray3DCreate_v2(&arr, &d);
            printf("array3d %d %d\n", rc, rc ? -1 : keep(3, (unsigned long long)(uintptr_t)arr));
            i += 3;
        } else if (!strcmp(c, "destroy")) {
            printf("destroy %d\n", p_cuArrayDestroy((CUarray)(uintptr_t)h[atoi(a1)].v));
            i += 1;
        } else if (!strcmp(c, "info")) {
            size_t f = 0, t = 0;
            rc = p_cuMemGetInfo_v2(&f, &t);
            printf("info %d %zu %zu\n", rc, f, t);
        } else if (!strcmp(c, "total")) {
            size_t t = 0;
            rc = p_cuDeviceTotalMem_v2(&t, atoi(a1));
            printf("total %d %zu\n", rc, t);
            i += 1;
        } else if (!strcmp(c, "launch")) { /* launch PATH N */
            printf("launch %d\n", launch(a1, atoi(a2)));
            i += 2;
        } else if (!strcmp(c, "sync")) {
            printf("sync %d\n", p_cuCtxSynchronize());
        } else if (!strcmp(c, "hold")) { /* wait for a line on stdin (or its end) */
            printf("hold 0\n");
            char ch;
            while (read(0, &ch, 1) == 1 && ch != '\n')
                ;
        } else if (!strcmp(c, "bglaunch")) { /* bglaunch PATH N: launch from another thread */
            bg_how = a1;
            bg_n = atoi(a2);
            rc = pthread_create(&bg_thread, NULL, bg_main, NULL) ? CUDA_ERROR_UNKNOWN : 0;
            printf("bglaunch %d\n", rc);
            i += 2;
        } else if (!strcmp(c, "join")) {
            void *r = NULL;
            pthread_join(bg_thread, &r);
            printf("join %d\n", (int)(intptr_t)r);
        } else if (!strcmp(c, "lookup")) { /* lookup BASE VERSION FLAGS (GPA builds) */
            void *p = NULL;
            int st = -1;
            rc = g_gpa ? lookup(a1, &p, atoi(a2), strtoull(a3, NULL, 0), &st)
                       : CUDA_ERROR_NOT_SUPPORTED;
            Dl_info info;
            const char *lib = "-", *name = "-";
            if (p && dladdr(p, &info)) {
                lib = info.dli_fname ? strrchr(info.dli_fname, '/') ? strrchr(info.dli_fname, '/') + 1
                                                                    : info.dli_fname
                                     : "-";
                name = info.dli_sname ? info.dli_sname : "-";
            }
            printf("lookup %d %p %d %s %s\n", rc, p, st, lib, name);
            i += 3;
        } else if (!strcmp(c, "sym")) { /* sym NAME: dlsym(RTLD_DEFAULT), dlsym(libcuda) */
            printf("sym 0 %p %p\n", dlsym(RTLD_DEFAULT, a1), g_lib ? dlsym(g_lib, a1) : NULL);
            i += 1;
        } else if (!strcmp(c, "ptr")) { /* ptr SYM: the pointer this build calls */
            void *p = NULL;
#define SHOW(base, sym, fl, params) if (!strcmp(a1, #sym)) p = (void *)p_##sym;
            FUNCS(SHOW)
            printf("ptr 0 %p\n", p);
            i += 1;
        } else {
            fprintf(stderr, "unknown command %s\n", c);
            return 2;
        }
    }
    return 0;
}
