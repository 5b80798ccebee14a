/*
 * nvml.c - NVML as the job sees it: memory info shows the job's limit and use
 * on its GPUs (v1 and v2), and the process lists and the per-process
 * utilization show only the job's own processes. Reached by programs linked against libnvidia-ml.so.1 and by
 * dlsym (nvidia-ml-py). Also the hook's own measure of a context's memory.
 */
#define _GNU_SOURCE
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "hook.h"

/* ---- memory info -------------------------------------------------------- */
static int job_view(nvmlDevice_t device, unsigned long long *total, unsigned long long *free,
                    unsigned long long *used)
{
    uint64_t t, f = *free, u;
    if (!vgpu_job_mem_view(vgpu_dev_of_nvml(device), &f, &t, &u))
        return 0;
    *total = t;
    *free = f;
    *used = u;
    return 1;
}

nvmlReturn_t hook_nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *memory)
{
    NVML_PROLOGUE(nvmlDeviceGetMemoryInfo, (device, memory));
    nvmlReturn_t r = REAL(nvmlDeviceGetMemoryInfo)(device, memory);
    if (r == NVML_SUCCESS)
        job_view(device, &memory->total, &memory->free, &memory->used);
    return r;
}

nvmlReturn_t hook_nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device, nvmlMemory_v2_t *memory)
{
    NVML_PROLOGUE(nvmlDeviceGetMemoryInfo_v2, (device, memory));
    nvmlReturn_t r = REAL(nvmlDeviceGetMemoryInfo_v2)(device, memory);
    if (r == NVML_SUCCESS && job_view(device, &memory->total, &memory->free, &memory->used))
        memory->reserved = 0;   /* the driver's own share is not the job's */
    return r;
}

/* ---- process lists ---------------------------------------------------------- */
typedef nvmlReturn_t (*procs_fn)(nvmlDevice_t, unsigned int *, void *);

/* The real list, in a buffer of our own (malloc'd; *n entries of `size`). */
static nvmlReturn_t real_procs(procs_fn fn, nvmlDevice_t device, size_t size, void **out,
                               unsigned *n)
{
    unsigned cap = 64;
    for (int tries = 0; tries < 8; tries++) {
        void *buf = calloc(cap, size);
        if (buf == NULL)
            return NVML_ERROR_MEMORY;
        unsigned cnt = cap;
        nvmlReturn_t r = fn(device, &cnt, buf);
        if (r == NVML_SUCCESS) {
            *out = buf;
            *n = cnt;
            return r;
        }
        free(buf);
        if (r != NVML_ERROR_INSUFFICIENT_SIZE)
            return r;
        cap = cnt > cap ? cnt + 16 : cap * 2;
    }
    return NVML_ERROR_INSUFFICIENT_SIZE;
}

/* Keep the entries (n of `size` bytes, the pid at `pid_at`) of the job's
 * processes, in place; their number. */
static unsigned keep_job_entries(void *all, unsigned n, size_t size, size_t pid_at)
{
    int32_t pids[VGPU_MAX_PROCS];
    int np = vgpu_job_pids(pids, VGPU_MAX_PROCS);
    unsigned kept = 0;
    for (unsigned i = 0; i < n; i++) {
        char *e = (char *)all + i * size;
        unsigned int pid;
        memcpy(&pid, e + pid_at, sizeof(pid));
        for (int k = 0; k < np; k++) {
            if ((unsigned int)pids[k] == pid) {
                memmove((char *)all + kept * size, e, size);
                kept++;
                break;
            }
        }
    }
    return kept;
}

static nvmlReturn_t job_procs(procs_fn fn, nvmlDevice_t device, unsigned int *infoCount,
                              void *infos, size_t size)
{
    if (infoCount == NULL)
        return fn(device, infoCount, infos);
    void *all;
    unsigned n;
    nvmlReturn_t r = real_procs(fn, device, size, &all, &n);
    if (r != NVML_SUCCESS)
        return r;
    unsigned kept = keep_job_entries(all, n, size, 0);  /* pid first, in every version */
    if (*infoCount < kept || (kept > 0 && infos == NULL)) {
        *infoCount = kept;
        free(all);
        return NVML_ERROR_INSUFFICIENT_SIZE;
    }
    if (kept > 0)
        memcpy(infos, all, kept * size);
    *infoCount = kept;
    free(all);
    return NVML_SUCCESS;
}

/* Each version of the running-processes query: the job's own processes, in
 * entries of `entry` (the version's struct). */
#define JOB_PROCS_HOOK(sym, entry)                                                      \
    nvmlReturn_t hook_##sym(nvmlDevice_t device, unsigned int *infoCount, entry *infos) \
    {                                                                                   \
        NVML_PROLOGUE(sym, (device, infoCount, infos));                                 \
        return job_procs((procs_fn)REAL(sym), device, infoCount, infos, sizeof(entry)); \
    }

JOB_PROCS_HOOK(nvmlDeviceGetComputeRunningProcesses, nvmlProcessInfo_v1_t)
JOB_PROCS_HOOK(nvmlDeviceGetComputeRunningProcesses_v2, nvmlProcessInfo_t)
JOB_PROCS_HOOK(nvmlDeviceGetComputeRunningProcesses_v3, nvmlProcessInfo_t)

/* ---- per-process utilization: the job's own processes only ------------------ */

nvmlReturn_t hook_nvmlDeviceGetProcessUtilization(nvmlDevice_t device,
                                                  nvmlProcessUtilizationSample_t *utilization,
                                                  unsigned int *processSamplesCount,
                                                  unsigned long long lastSeenTimeStamp)
{
    NVML_PROLOGUE(nvmlDeviceGetProcessUtilization,
                  (device, utilization, processSamplesCount, lastSeenTimeStamp));
    if (processSamplesCount == NULL)      /* the driver's own answer to a bad call */
        return REAL(nvmlDeviceGetProcessUtilization)(device, utilization,
                                                     processSamplesCount, lastSeenTimeStamp);
    const size_t size = sizeof(nvmlProcessUtilizationSample_t);
    unsigned cap = 64;
    for (int tries = 0; tries < 8; tries++) {
        nvmlProcessUtilizationSample_t *all = calloc(cap, size);
        if (all == NULL)
            return NVML_ERROR_MEMORY;
        unsigned int cnt = cap;
        nvmlReturn_t r = REAL(nvmlDeviceGetProcessUtilization)(device, all, &cnt,
                                                               lastSeenTimeStamp);
        if (r == NVML_ERROR_INSUFFICIENT_SIZE) {
            free(all);
            cap = cnt > cap ? cnt + 16 : cap * 2;
            continue;
        }
        if (r != NVML_SUCCESS) {
            free(all);
            return r;
        }
        unsigned kept = keep_job_entries(all, cnt, size,
                                         __builtin_offsetof(nvmlProcessUtilizationSample_t, pid));
        if (kept == 0) {                  /* none of the job's: no sample, as NVML says it */
            free(all);
            return NVML_ERROR_NOT_FOUND;
        }
        if (utilization == NULL || *processSamplesCount < kept) {
            *processSamplesCount = kept;
            free(all);
            return NVML_ERROR_INSUFFICIENT_SIZE;
        }
        memcpy(utilization, all, kept * size);
        *processSamplesCount = kept;
        free(all);
        return NVML_SUCCESS;
    }
    return NVML_ERROR_INSUFFICIENT_SIZE;
}

nvmlReturn_t hook_nvmlDeviceGetProcessesUtilizationInfo(
    nvmlDevice_t device, nvmlProcessesUtilizationInfo_t *procesesUtilInfo)
{
    NVML_PROLOGUE(nvmlDeviceGetProcessesUtilizationInfo, (device, procesesUtilInfo));
    nvmlProcessesUtilizationInfo_t *in = procesesUtilInfo;
    if (in == NULL || in->version != nvmlProcessesUtilizationInfo_v1)
        return REAL(nvmlDeviceGetProcessesUtilizationInfo)(device, in);
    const size_t size = sizeof(nvmlProcessUtilizationInfo_v1_t);
    unsigned cap = 64;
    for (int tries = 0; tries < 8; tries++) {
        nvmlProcessUtilizationInfo_v1_t *all = calloc(cap, size);
        if (all == NULL)
            return NVML_ERROR_MEMORY;
        nvmlProcessesUtilizationInfo_t q = *in;
        q.processSamplesCount = cap;
        q.procUtilArray = all;
        nvmlReturn_t r = REAL(nvmlDeviceGetProcessesUtilizationInfo)(device, &q);
        if (r == NVML_ERROR_INSUFFICIENT_SIZE) {
            free(all);
            cap = q.processSamplesCount > cap ? q.processSamplesCount + 16 : cap * 2;
            continue;
        }
        if (r != NVML_SUCCESS) {
            free(all);
            return r;
        }
        unsigned kept = keep_job_entries(all, q.processSamplesCount, size,
                                         __builtin_offsetof(nvmlProcessUtilizationInfo_v1_t,
                                                            pid));
        if (kept == 0) {
            free(all);
            return NVML_ERROR_NOT_FOUND;
        }
        if (in->procUtilArray == NULL || in->processSamplesCount < kept) {
            in->processSamplesCount = kept;
            free(all);
            return NVML_ERROR_INSUFFICIENT_SIZE;
        }
        memcpy(in->procUtilArray, all, kept * size);
        in->processSamplesCount = kept;
        free(all);
        return NVML_SUCCESS;
    }
    return NVML_ERROR_INSUFFICIENT_SIZE;
}

/* ---- the hook's own measure --------------------------------------------------- */

/* This process's usedGpuMemory on the GPU with this UUID, from the real
 * NVML; 0 when NVML can't tell (no NVML, pid namespaces, no entry). */
uint64_t vgpu_nvml_process_used(const char *uuid)
{
    static int inited;
    if (vgpu_nvml_state() != VGPU_ACTIVE)
        return 0;
    if (!__atomic_load_n(&inited, __ATOMIC_ACQUIRE)) {
        if (REAL(nvmlInit_v2)() != NVML_SUCCESS)
            return 0;
        __atomic_store_n(&inited, 1, __ATOMIC_RELEASE);
    }
    nvmlDevice_t h;
    if (REAL(nvmlDeviceGetHandleByUUID)(uuid, &h) != NVML_SUCCESS)
        return 0;
    procs_fn fn;
    size_t size = sizeof(nvmlProcessInfo_t);
    if (vgpu_real_present(VGPU_H_nvmlDeviceGetComputeRunningProcesses_v3)) {
        fn = (procs_fn)REAL(nvmlDeviceGetComputeRunningProcesses_v3);
    } else if (vgpu_real_present(VGPU_H_nvmlDeviceGetComputeRunningProcesses_v2)) {
        fn = (procs_fn)REAL(nvmlDeviceGetComputeRunningProcesses_v2);
    } else {
        fn = (procs_fn)REAL(nvmlDeviceGetComputeRunningProcesses);
        size = sizeof(nvmlProcessInfo_v1_t);
    }
    void *all;
    unsigned n;
    if (real_procs(fn, h, size, &all, &n) != NVML_SUCCESS)
        return 0;
    uint64_t used = 0;
    unsigned int me = (unsigned int)getpid();
    for (unsigned i = 0; i < n; i++) {
        const char *e = (const char *)all + i * size;
        unsigned int pid;
        unsigned long long mem;
        memcpy(&pid, e, sizeof(pid));
        memcpy(&mem, e + __builtin_offsetof(nvmlProcessInfo_v1_t, usedGpuMemory), sizeof(mem));
        if (pid == me && mem != NVML_VALUE_NOT_AVAILABLE)
            used += mem;
    }
    free(all);
    return used;
}
