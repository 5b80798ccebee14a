/*
 * share_probe.c - what a real driver and NVML say of memory two processes
 * share, and of peer access, on GPU 0 (one GPU is enough: the question is
 * who NVML charges, not where). For docs/hook.md's and docs/simulator.md's
 * claims on multi-GPU jobs; it runs on the simulator too.
 *
 *   gcc -O2 -I libvgpu/include -o share_probe bench/gpu/share_probe.c -ldl
 *   ./share_probe > share_probe.json          (one JSON object per line)
 *
 * The parent allocates (cuMemCreate exportable as a POSIX fd, and cuMemAlloc
 * with a CUDA IPC handle), a child it forked before touching CUDA imports
 * both (the fd over a Unix socket, SCM_RIGHTS); at each step each process's
 * memory as NVML's process list has it, and the GPU's used memory. Then the
 * parent lets go while the child still holds; then the child. Also: a
 * host-located cuMemCreate, and what peer access says of a GPU and itself.
 * Only the driver API and NVML, loaded with dlopen: no CUDA toolkit needed.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "vgpu/cuda_types.h"
#include "vgpu/nvml_types.h"

typedef struct {
    char reserved[64];
} ipc_handle;

#define SIZE (256ull << 20)

static void *cu, *nv;
#define SYM(lib, name) dlsym(lib, name)
#define CU(name, type) ((type)SYM(cu, name))
#define NV(name, type) ((type)SYM(nv, name))

static int rc_of(CUresult r) { return (int)r; }

static void load(void)
{
    cu = dlopen("libcuda.so.1", RTLD_NOW);
    nv = dlopen("libnvidia-ml.so.1", RTLD_NOW);
    if (!cu || !nv) {
        printf("{\"error\": \"dlopen: %s\"}\n", dlerror());
        exit(1);
    }
}

static CUcontext ctx0(void)
{
    CUcontext c = NULL;
    CU("cuInit", CUresult (*)(unsigned))(0);
    CU("cuDevicePrimaryCtxRetain", CUresult (*)(CUcontext *, CUdevice))(&c, 0);
    CU("cuCtxSetCurrent", CUresult (*)(CUcontext))(c);
    return c;
}

/* NVML's figure for pid on GPU 0 (-1: not listed), and the GPU's used. */
static long long nvml_used(int pid, unsigned long long *gpu_used)
{
    nvmlDevice_t d;
    NV("nvmlDeviceGetHandleByIndex_v2", nvmlReturn_t (*)(unsigned, nvmlDevice_t *))(0, &d);
    nvmlMemory_t m;
    if (NV("nvmlDeviceGetMemoryInfo", nvmlReturn_t (*)(nvmlDevice_t, nvmlMemory_t *))(d, &m) == 0)
        *gpu_used = m.used;
    nvmlProcessInfo_t p[64];
    unsigned n = 64;
    if (NV("nvmlDeviceGetComputeRunningProcesses_v3",
           nvmlReturn_t (*)(nvmlDevice_t, unsigned *, nvmlProcessInfo_t *))(d, &n, p) != 0)
        return -2;
    for (unsigned i = 0; i < n; i++)
        if ((int)p[i].pid == pid)
            return (long long)p[i].usedGpuMemory;
    return -1;
}

static int g_parent, g_child;

static void report(const char *step)
{
    unsigned long long gpu = 0;
    long long a = nvml_used(g_parent, &gpu), b = nvml_used(g_child, &gpu);
    printf("{\"step\": \"%s\", \"exporter\": %lld, \"importer\": %lld, \"gpu_used\": %llu}\n",
           step, a, b, gpu);
    fflush(stdout);
}

static void send_fd(int sock, int fd, const void *data, size_t len)
{
    struct msghdr msg = {0};
    struct iovec iov = {(void *)data, len};
    char buf[CMSG_SPACE(sizeof(int))];
    memset(buf, 0, sizeof buf);
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = buf;
    msg.msg_controllen = sizeof buf;
    struct cmsghdr *c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int));
    memcpy(CMSG_DATA(c), &fd, sizeof(int));
    sendmsg(sock, &msg, 0);
}

static int recv_fd(int sock, void *data, size_t len)
{
    struct msghdr msg = {0};
    struct iovec iov = {data, len};
    char buf[CMSG_SPACE(sizeof(int))];
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = buf;
    msg.msg_controllen = sizeof buf;
    if (recvmsg(sock, &msg, MSG_WAITALL) <= 0)
        return -1;
    struct cmsghdr *c = CMSG_FIRSTHDR(&msg);
    int fd = -1;
    if (c && c->cmsg_type == SCM_RIGHTS)
        memcpy(&fd, CMSG_DATA(c), sizeof(int));
    return fd;
}

static void step_wait(int sock, char *tag)
{
    char b = 0;
    ssize_t n = tag ? write(sock, tag, 1) : read(sock, &b, 1);
    (void)n;
}

static CUresult map(CUmemGenericAllocationHandle h, CUdeviceptr *va)
{
    CUresult r = CU("cuMemAddressReserve", CUresult (*)(CUdeviceptr *, size_t, size_t,
                                                         CUdeviceptr, unsigned long long))(
        va, SIZE, 0, 0, 0);
    if (!r)
        r = CU("cuMemMap", CUresult (*)(CUdeviceptr, size_t, size_t,
                                        CUmemGenericAllocationHandle, unsigned long long))(
            *va, SIZE, 0, h, 0);
    CUmemAccessDesc a = {{CU_MEM_LOCATION_TYPE_DEVICE, 0}, CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
    if (!r)
        r = CU("cuMemSetAccess", CUresult (*)(CUdeviceptr, size_t, const CUmemAccessDesc *,
                                              size_t))(*va, SIZE, &a, 1);
    return r;
}

int main(void)
{
    int sv[2];
    socketpair(AF_UNIX, SOCK_STREAM, 0, sv);
    g_parent = getpid();
    pid_t child = fork();
    if (child == 0) {
        /* the importer */
        close(sv[0]);
        load();
        ctx0();
        NV("nvmlInit_v2", nvmlReturn_t (*)(void))();
        ipc_handle ih;
        int fd = recv_fd(sv[1], &ih, sizeof ih);
        CUmemGenericAllocationHandle h = 0;
        CUresult r1 = CU("cuMemImportFromShareableHandle",
                         CUresult (*)(CUmemGenericAllocationHandle *, void *, int))(
            &h, (void *)(intptr_t)fd, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
        CUdeviceptr va = 0;
        CUresult r2 = r1 ? r1 : map(h, &va);
        CUdeviceptr ip = 0;
        CUresult (*open_ipc)(CUdeviceptr *, ipc_handle, unsigned) =
            CU("cuIpcOpenMemHandle_v2", CUresult (*)(CUdeviceptr *, ipc_handle, unsigned));
        if (!open_ipc)
            open_ipc = CU("cuIpcOpenMemHandle", CUresult (*)(CUdeviceptr *, ipc_handle, unsigned));
        CUresult r3 = open_ipc ? open_ipc(&ip, ih, 1) : CUDA_ERROR_NOT_FOUND;
        printf("{\"child\": {\"import\": %d, \"map\": %d, \"ipc_open\": %d}}\n", rc_of(r1),
               rc_of(r2), rc_of(r3));
        fflush(stdout);
        step_wait(sv[1], "i");      /* imported: the parent reports */
        step_wait(sv[1], NULL);     /* the parent let go of both */
        if (va) {
            CU("cuMemUnmap", CUresult (*)(CUdeviceptr, size_t))(va, SIZE);
            CU("cuMemRelease", CUresult (*)(CUmemGenericAllocationHandle))(h);
        }
        step_wait(sv[1], "v");      /* the VMM import gone: the parent reports */
        step_wait(sv[1], NULL);
        if (ip)
            CU("cuIpcCloseMemHandle", CUresult (*)(CUdeviceptr))(ip);
        step_wait(sv[1], "c");      /* the IPC mapping gone: the parent reports */
        step_wait(sv[1], NULL);
        _exit(0);
    }
    close(sv[1]);
    g_child = child;
    load();
    ctx0();
    NV("nvmlInit_v2", nvmlReturn_t (*)(void))();
    int can = -1;
    CU("cuDeviceCanAccessPeer", CUresult (*)(int *, CUdevice, CUdevice))(&can, 0, 0);
    nvmlDevice_t d;
    NV("nvmlDeviceGetHandleByIndex_v2", nvmlReturn_t (*)(unsigned, nvmlDevice_t *))(0, &d);
    int st = -1;
    nvmlReturn_t p2p = NV("nvmlDeviceGetP2PStatus", nvmlReturn_t (*)(nvmlDevice_t, nvmlDevice_t,
                                                                     int, int *))(d, d, 0, &st);
    printf("{\"peer\": {\"can_access_self\": %d, \"nvml_p2p_self\": %d, \"status\": %d}}\n", can,
           (int)p2p, st);
    report("contexts");
    /* a host-located allocation */
    CUmemAllocationProp hp;
    memset(&hp, 0, sizeof hp);
    hp.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    hp.location.type = CU_MEM_LOCATION_TYPE_HOST_NUMA;
    hp.location.id = 0;
    CUmemGenericAllocationHandle hh = 0;
    CUresult hr = CU("cuMemCreate", CUresult (*)(CUmemGenericAllocationHandle *, size_t,
                                                const CUmemAllocationProp *,
                                                unsigned long long))(&hh, SIZE, &hp, 0);
    printf("{\"host_numa_create\": %d}\n", rc_of(hr));
    report("host_located");
    if (!hr)
        CU("cuMemRelease", CUresult (*)(CUmemGenericAllocationHandle))(hh);
    /* exportable device memory, and a cuMemAlloc with an IPC handle */
    CUmemAllocationProp prop;
    memset(&prop, 0, sizeof prop);
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = 0;
    prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    CUmemGenericAllocationHandle h = 0;
    CUresult r = CU("cuMemCreate", CUresult (*)(CUmemGenericAllocationHandle *, size_t,
                                               const CUmemAllocationProp *,
                                               unsigned long long))(&h, SIZE, &prop, 0);
    CUdeviceptr va = 0;
    if (!r)
        r = map(h, &va);
    int fd = -1;
    if (!r)
        r = CU("cuMemExportToShareableHandle",
               CUresult (*)(void *, CUmemGenericAllocationHandle, int, unsigned long long))(
            &fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
    CUdeviceptr dp = 0;
    CUresult ra = CU("cuMemAlloc_v2", CUresult (*)(CUdeviceptr *, size_t))(&dp, SIZE);
    ipc_handle ih;
    memset(&ih, 0, sizeof ih);
    CUresult (*get_ipc)(ipc_handle *, CUdeviceptr) =
        CU("cuIpcGetMemHandle", CUresult (*)(ipc_handle *, CUdeviceptr));
    CUresult ri = (!ra && get_ipc) ? get_ipc(&ih, dp) : CUDA_ERROR_NOT_FOUND;
    printf("{\"parent\": {\"create_map_export\": %d, \"alloc\": %d, \"ipc_get\": %d}}\n",
           rc_of(r), rc_of(ra), rc_of(ri));
    report("allocated");
    send_fd(sv[0], fd, &ih, sizeof ih);
    step_wait(sv[0], NULL);
    report("imported");
    /* the exporter lets go while the importer still holds: the VMM
     * allocation, then the cuMemAlloc one */
    if (va) {
        CU("cuMemUnmap", CUresult (*)(CUdeviceptr, size_t))(va, SIZE);
        CU("cuMemRelease", CUresult (*)(CUmemGenericAllocationHandle))(h);
    }
    report("exporter_released_vmm");
    if (dp)
        CU("cuMemFree_v2", CUresult (*)(CUdeviceptr))(dp);
    report("exporter_freed_ipc");
    step_wait(sv[0], "r");
    step_wait(sv[0], NULL);
    report("importer_released_vmm");
    step_wait(sv[0], "r");
    step_wait(sv[0], NULL);
    report("importer_closed_ipc");
    step_wait(sv[0], "x");
    waitpid(child, NULL, 0);
    g_child = -1;
    report("importer_exited");
    return 0;
}
