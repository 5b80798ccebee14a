/*
 * procs.c - what NVML tells about work on a device: the compute
 * processes (with their memory, contexts included), utilization rates and
 * per-process utilization samples.
 *
 * Utilization is sampled as the driver does: the device timeline is cut into
 * fixed periods (VGPU_SIM_SAMPLE_MS, default 1/6 s, the fastest period NVML
 * documents); each complete period gives one sample per process that ran a
 * kernel in it, stamped with the period's end in microseconds of the real-time
 * clock. nvmlDeviceGetProcessUtilization returns the samples newer than
 * lastSeenTimeStamp, about the last VGPU_SIM_PERIODS / 2 periods at most.
 */
#include <string.h>

#include "init.h"
#include "procs.h"

#define MAX_SAMPLES (VGPU_SIM_PERIODS / 2 * VGPU_SIM_PERIOD_PIDS)

static unsigned int percent(uint64_t busy, uint64_t period)
{
    uint64_t p = (busy * 100 + period / 2) / period;
    return p > 100 ? 100 : (unsigned int)p;
}

/* Needs the lock. The last complete period's record, or NULL if idle. */
static const struct vgpu_sim_period *last_period(struct vgpu_sim_state *s, int dev)
{
    uint64_t now_idx = sim_now_ns() / s->sample_ns;
    if (now_idx == 0)
        return NULL;
    const struct vgpu_sim_period *per = &s->dev[dev].periods[(now_idx - 1) % VGPU_SIM_PERIODS];
    return per->index == now_idx - 1 ? per : NULL;
}

unsigned int nvml_recent_util(int dev)
{
    struct vgpu_sim_state *s = sim_state();
    uint64_t busy = 0;
    sim_lock(0);
    const struct vgpu_sim_period *per = last_period(s, dev);
    for (uint32_t i = 0; per && i < per->n; i++)
        busy += per->e[i].busy_ns;
    sim_unlock();
    return percent(busy, s->sample_ns);
}

VGPU_EXPORT nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t d, nvmlUtilization_t *u)
{
    nvmlReturn_t rc = nvml_enter();
    if (rc)
        return rc;
    int i = nvml_index(d);
    if (i < 0 || !u)
        return NVML_ERROR_INVALID_ARGUMENT;
    u->gpu = nvml_recent_util(i);
    u->memory = 0; /* simulated kernels do not touch memory */
    return NVML_SUCCESS;
}

VGPU_EXPORT nvmlReturn_t nvmlDeviceGetProcessUtilization(nvmlDevice_t d,
                                                         nvmlProcessUtilizationSample_t *out,
                                                         unsigned int *count,
                                                         unsigned long long last_seen)
{
    nvmlReturn_t rc = nvml_enter();
    if (rc)
        return rc;
    int dev = nvml_index(d);
    if (dev < 0 || !count)
        return NVML_ERROR_INVALID_ARGUMENT;
    static __thread nvmlProcessUtilizationSample_t buf[MAX_SAMPLES];
    struct vgpu_sim_state *s = sim_state();
    uint64_t P = s->sample_ns;
    unsigned int n = 0;
    sim_lock(0);
    uint64_t now_idx = sim_now_ns() / P;
    uint64_t first = now_idx > VGPU_SIM_PERIODS / 2 ? now_idx - VGPU_SIM_PERIODS / 2 : 0;
    for (uint64_t idx = first; idx < now_idx; idx++) {
        const struct vgpu_sim_period *per = &s->dev[dev].periods[idx % VGPU_SIM_PERIODS];
        if (per->index != idx)
            continue;
        unsigned long long ts =
            (unsigned long long)(((int64_t)((idx + 1) * P) + s->realtime_offset_ns) / 1000);
        if (ts <= last_seen)
            continue;
        for (uint32_t i = 0; i < per->n && n < MAX_SAMPLES; i++) {
            buf[n++] = (nvmlProcessUtilizationSample_t){
                .pid = (unsigned int)per->e[i].pid,
                .timeStamp = ts,
                .smUtil = percent(per->e[i].busy_ns, P),
            };
        }
    }
    sim_unlock();
    if (n == 0)
        return NVML_ERROR_NOT_FOUND;
    if (!out || *count < n) {
        *count = n;
        return NVML_ERROR_INSUFFICIENT_SIZE;
    }
    memcpy(out, buf, n * sizeof *buf);
    *count = n;
    return NVML_SUCCESS;
}

/* ---- running processes ---- */

struct proc_row {
    unsigned int pid;
    unsigned long long used;
};

/* Live processes holding memory or a context on dev. */
static unsigned int running(int dev, struct proc_row *rows)
{
    struct vgpu_sim_state *s = sim_state();
    unsigned int n = 0;
    sim_lock(1);
    for (int i = 0; i < VGPU_SIM_MAX_PROCS; i++) {
        const struct vgpu_sim_proc *p = &s->procs[i];
        if (p->pid && (p->used[dev] || p->contexts[dev]))
            rows[n++] = (struct proc_row){(unsigned int)p->pid, p->used[dev]};
    }
    sim_unlock();
    return n;
}

/* The three generations differ only in their row layout. */
static nvmlReturn_t compute_processes(nvmlDevice_t d, unsigned int *count, void *infos,
                                      int with_ids)
{
    nvmlReturn_t rc = nvml_enter();
    if (rc)
        return rc;
    int dev = nvml_index(d);
    if (dev < 0 || !count)
        return NVML_ERROR_INVALID_ARGUMENT;
    struct proc_row rows[VGPU_SIM_MAX_PROCS];
    unsigned int n = running(dev, rows);
    if (n > *count || (n && !infos)) {
        *count = n;
        return NVML_ERROR_INSUFFICIENT_SIZE;
    }
    for (unsigned int i = 0; i < n; i++) {
        if (with_ids)
            ((nvmlProcessInfo_t *)infos)[i] = (nvmlProcessInfo_t){
                rows[i].pid, rows[i].used, 0xffffffffu, 0xffffffffu};
        else
            ((nvmlProcessInfo_v1_t *)infos)[i] = (nvmlProcessInfo_v1_t){rows[i].pid, rows[i].used};
    }
    *count = n;
    return NVML_SUCCESS;
}

VGPU_EXPORT nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t d, unsigned int *count,
                                                                 nvmlProcessInfo_t *infos)
{
    return compute_processes(d, count, infos, 1);
}
VGPU_ALIAS(nvmlDeviceGetComputeRunningProcesses_v3, nvmlDeviceGetComputeRunningProcesses_v2)

VGPU_EXPORT nvmlReturn_t nvmlDeviceGetComputeRunningProcesses(nvmlDevice_t d, unsigned int *count,
                                                              nvmlProcessInfo_v1_t *infos)
{
    return compute_processes(d, count, infos, 0);
}

/* No graphics or MPS clients on a simulated GPU. */
VGPU_EXPORT nvmlReturn_t nvmlDeviceGetGraphicsRunningProcesses_v3(nvmlDevice_t d,
                                                                  unsigned int *count,
                                                                  nvmlProcessInfo_t *infos)
{
    (void)infos;
    nvmlReturn_t rc = nvml_enter();
    if (rc)
        return rc;
    if (nvml_index(d) < 0 || !count)
        return NVML_ERROR_INVALID_ARGUMENT;
    *count = 0;
    return NVML_SUCCESS;
}
VGPU_ALIAS(nvmlDeviceGetGraphicsRunningProcesses_v3, nvmlDeviceGetGraphicsRunningProcesses_v2)
VGPU_ALIAS(nvmlDeviceGetGraphicsRunningProcesses_v3, nvmlDeviceGetGraphicsRunningProcesses)
VGPU_ALIAS(nvmlDeviceGetGraphicsRunningProcesses_v3, nvmlDeviceGetMPSComputeRunningProcesses_v3)
VGPU_ALIAS(nvmlDeviceGetGraphicsRunningProcesses_v3, nvmlDeviceGetMPSComputeRunningProcesses_v2)
