/*
 * procs.c - what NVML tells about work on a device: the compute
 * processes (with their memory, contexts included), utilization rates and
 * per-process utilization.
 *
 * Utilization is sampled as the driver does: the device timeline is cut into
 * fixed periods (VGPU_SIM_SAMPLE_MS, default 1/6 s, the fastest period NVML
 * documents), and each period records the busy time of every process that ran
 * a kernel in it. A period is published SIM_SAMPLE_LAG_NS after it ends,
 * stamped with its end in microseconds of the real-time clock.
 *
 * nvmlDeviceGetProcessUtilization and nvmlDeviceGetProcessesUtilizationInfo
 * answer as NVIDIA documents them: one entry per process that ran in the
 * published periods newer than lastSeenTimeStamp (about the last
 * VGPU_SIM_PERIODS / 2 periods at most: the driver's sample buffer), its
 * timeStamp the newest period it ran in, its smUtil its busy time averaged
 * over the window. Whether a period of the window in which it ran nothing
 * counts as a zero (average, the default) or not at all (skip) is
 * VGPU_SIM_UTIL_IDLE (docs/simulator.md says why average). Which processes a
 * period names is VGPU_SIM_UTIL_PROCS: by default one, with the device's
 * whole utilization, as an H100 does (collect_util); none: neither call is
 * supported (per_process_supported).
 */
#include <string.h>

#include "mig.h"
#include "procs.h"

/* Distinct processes one window can hold: exited ones stay in the periods
 * they ran in, as on a real GPU. */
#define MAX_UTIL_PIDS (4 * VGPU_SIM_MAX_PROCS)

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
    sim_timeline_catch_up(dev);
    const struct vgpu_sim_period *per = last_period(s, dev);
    for (uint32_t i = 0; per && i < per->n; i++)
        busy += per->e[i].busy_ns;
    sim_unlock();
    return percent(busy, s->sample_ns);
}

VGPU_EXPORT nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t d, nvmlUtilization_t *u)
{
    NVML_DEVICE_NO_MIG(d, i);
    if (!u)
        return NVML_ERROR_INVALID_ARGUMENT;
    u->gpu = nvml_recent_util(i);
    u->memory = 0; /* simulated kernels do not touch memory */
    return NVML_SUCCESS;
}

/* ---- per-process utilization ---- */

/* One process's entry: what both calls return. */
struct util_entry {
    unsigned int pid;
    unsigned int sm;
    unsigned long long ts;
};

/* A process's busy time in the window being read. */
struct util_acc {
    int32_t pid;
    uint32_t periods; /* periods it ran in */
    uint64_t busy_ns;
    uint64_t newest;  /* index of the newest period it ran in */
};

static unsigned long long period_end_us(const struct vgpu_sim_state *s, uint64_t idx)
{
    return (unsigned long long)(((int64_t)((idx + 1) * s->sample_ns) + s->realtime_offset_ns) /
                                1000);
}

/* Add a period's busy time to pid's account in acc[0..*n); ran: it ran in
 * the period (a period of the window it is only named in, with nothing run,
 * is one `skip` leaves out). hint: where pid was last time (processes tend
 * to keep their place from period to period). */
static void add_busy(struct util_acc *acc, unsigned int *n, unsigned int hint, int32_t pid,
                     uint64_t busy, uint64_t idx, int ran)
{
    unsigned int j = hint < *n && acc[hint].pid == pid ? hint : 0;
    while (j < *n && acc[j].pid != pid)
        j++;
    if (j == *n) {
        if (*n == MAX_UTIL_PIDS)
            return;
        acc[(*n)++] = (struct util_acc){.pid = pid};
    }
    acc[j].periods += (uint32_t)(ran != 0);
    acc[j].busy_ns += busy;
    acc[j].newest = idx;
}

/* Needs the lock. The process a period names in the one-process modes: the
 * one whose kernel ran last in it, or (busiest) the one that ran most. */
static int32_t named_process(const struct vgpu_sim_state *s, const struct vgpu_sim_period *per)
{
    uint32_t k = per->last < per->n ? per->last : 0;
    if (s->util_procs == VGPU_SIM_UTIL_PROCS_BUSIEST)
        for (uint32_t i = 0; i < per->n; i++)
            if (per->e[i].busy_ns > per->e[k].busy_ns)
                k = i;
    return per->e[k].pid;
}

/* VGPU_SIM_UTIL_PROCS=none: a device without per-process utilization, as a
 * MIG instance (or some drivers) answers: both calls NVML_ERROR_NOT_SUPPORTED,
 * after the checks of the library, the handle and the arguments, so that a
 * caller's own mistakes read as they would anywhere. The device's own
 * utilization (rates, samples) is still there. */
static int per_process_supported(void)
{
    return sim_state()->util_procs != VGPU_SIM_UTIL_PROCS_NONE;
}

/* The entries newer than last_seen on dev, into out (MAX_UTIL_PIDS); returns
 * how many.
 *
 * VGPU_SIM_UTIL_PROCS=each: every process that ran in a period of the window
 * has its own busy time there. last or busiest (one process per period, as
 * an H100 answers): a period names one process, with the busy time of every
 * process that ran in it, the device's; a period in which nothing ran names
 * the process named before, with nothing, while it still has a context on
 * the device (an H100 lists an idle process at 0). */
static unsigned int collect_util(int dev, unsigned long long last_seen, struct util_entry *out)
{
    static __thread struct util_acc acc[MAX_UTIL_PIDS];
    struct vgpu_sim_state *s = sim_state();
    uint64_t P = s->sample_ns;
    unsigned int n = 0;
    uint64_t window = 0; /* published periods newer than last_seen */
    int one = s->util_procs != VGPU_SIM_UTIL_PROCS_EACH;
    int32_t carry = 0;   /* one: the process the latest period named */
    sim_lock(0);
    sim_timeline_catch_up(dev);
    uint64_t now = sim_now_ns();
    uint64_t pub_idx = now > SIM_SAMPLE_LAG_NS ? (now - SIM_SAMPLE_LAG_NS) / P : 0;
    uint64_t first = pub_idx > VGPU_SIM_PERIODS / 2 ? pub_idx - VGPU_SIM_PERIODS / 2 : 0;
    for (uint64_t idx = first; idx < pub_idx; idx++) {
        int in = period_end_us(s, idx) > last_seen;
        window += (uint64_t)in;
        const struct vgpu_sim_period *per = &s->dev[dev].periods[idx % VGPU_SIM_PERIODS];
        int ran = per->index == idx && per->n > 0;
        if (!one) {
            for (uint32_t i = 0; in && ran && i < per->n; i++)
                add_busy(acc, &n, i, per->e[i].pid, per->e[i].busy_ns, idx, 1);
            continue;
        }
        uint64_t busy = 0;
        if (ran) {
            carry = named_process(s, per);
            for (uint32_t i = 0; i < per->n; i++)
                busy += per->e[i].busy_ns;
            if (busy > P)
                busy = P;
        } else if (carry && !sim_proc_on_device(dev, carry)) {
            carry = 0;
        }
        if (in && carry)
            add_busy(acc, &n, 0, carry, busy, idx, ran);
    }
    int skip = s->util_idle == VGPU_SIM_UTIL_IDLE_SKIP;
    for (unsigned int j = 0; j < n; j++)
        out[j] = (struct util_entry){
            .pid = (unsigned int)acc[j].pid,
            .sm = skip && acc[j].periods == 0
                      ? 0
                      : percent(acc[j].busy_ns, (skip ? acc[j].periods : window) * P),
            .ts = period_end_us(s, acc[j].newest),
        };
    sim_unlock();
    return n;
}

VGPU_EXPORT nvmlReturn_t nvmlDeviceGetProcessUtilization(nvmlDevice_t d,
                                                         nvmlProcessUtilizationSample_t *out,
                                                         unsigned int *count,
                                                         unsigned long long last_seen)
{
    NVML_DEVICE_NO_MIG(d, dev);
    if (!count)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (!per_process_supported())
        return NVML_ERROR_NOT_SUPPORTED;
    static __thread struct util_entry e[MAX_UTIL_PIDS];
    unsigned int n = collect_util(dev, last_seen, e);
    if (n == 0)
        return NVML_ERROR_NOT_FOUND;
    if (!out || *count < n) {
        *count = n; /* the size query: how many entries are needed */
        return NVML_ERROR_INSUFFICIENT_SIZE;
    }
    for (unsigned int i = 0; i < n; i++)
        out[i] = (nvmlProcessUtilizationSample_t){
            .pid = e[i].pid, .timeStamp = e[i].ts, .smUtil = e[i].sm};
    *count = n;
    return NVML_SUCCESS;
}

VGPU_EXPORT nvmlReturn_t nvmlDeviceGetProcessesUtilizationInfo(nvmlDevice_t d,
                                                               nvmlProcessesUtilizationInfo_t *info)
{
    NVML_DEVICE_NO_MIG(d, dev);
    if (!info)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (info->version != nvmlProcessesUtilizationInfo_v1)
        return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    if (!per_process_supported())
        return NVML_ERROR_NOT_SUPPORTED;
    static __thread struct util_entry e[MAX_UTIL_PIDS];
    unsigned int n = collect_util(dev, info->lastSeenTimeStamp, e);
    if (n == 0)
        return NVML_ERROR_NOT_FOUND;
    if (!info->procUtilArray || info->processSamplesCount < n) {
        info->processSamplesCount = n;
        return NVML_ERROR_INSUFFICIENT_SIZE;
    }
    for (unsigned int i = 0; i < n; i++)
        info->procUtilArray[i] = (nvmlProcessUtilizationInfo_v1_t){
            .timeStamp = e[i].ts, .pid = e[i].pid, .smUtil = e[i].sm};
    info->processSamplesCount = n;
    return NVML_SUCCESS;
}

/* ---- the device's own samples ---- */

/*
 * nvmlDeviceGetSamples: the device's utilization per sample period, idle
 * periods included (a real H100 answers an idle GPU with its whole buffer of
 * zeros, one sample per period), for the published periods newer than
 * lastSeenTimeStamp, oldest first, each stamped with its period's end: the
 * grid the per-process entries are stamped on. GPU utilization is the
 * period's busy time (all processes together, at most 100); memory, decoder,
 * JPEG and optical-flow utilization are 0 (simulated kernels touch no
 * memory; the engines idle). What the simulator does not sample per period
 * (power, clocks, the encoder an H100 lacks) is NVML_ERROR_NOT_SUPPORTED.
 * samples NULL: *count is set to how many there are. A buffer smaller than
 * that gets the oldest that fit.
 */
VGPU_EXPORT nvmlReturn_t nvmlDeviceGetSamples(nvmlDevice_t d, nvmlSamplingType_t type,
                                              unsigned long long last_seen,
                                              nvmlValueType_t *val_type, unsigned int *count,
                                              nvmlSample_t *samples)
{
    NVML_DEVICE_NO_MIG(d, dev);
    if (!count || !val_type || (samples && *count == 0))
        return NVML_ERROR_INVALID_ARGUMENT;
    int util;
    switch (type) {
    case NVML_GPU_UTILIZATION_SAMPLES:
        util = 1;
        break;
    case NVML_MEMORY_UTILIZATION_SAMPLES:
    case NVML_DEC_UTILIZATION_SAMPLES:
    case NVML_JPG_UTILIZATION_SAMPLES:
    case NVML_OFA_UTILIZATION_SAMPLES:
        util = 0;
        break;
    default:
        return NVML_ERROR_NOT_SUPPORTED;
    }
    struct vgpu_sim_state *s = sim_state();
    uint64_t P = s->sample_ns;
    unsigned int n = 0, cap = samples ? *count : 0;
    sim_lock(0);
    uint64_t now = sim_now_ns();
    uint64_t pub_idx = now > SIM_SAMPLE_LAG_NS ? (now - SIM_SAMPLE_LAG_NS) / P : 0;
    uint64_t first = pub_idx > VGPU_SIM_PERIODS / 2 ? pub_idx - VGPU_SIM_PERIODS / 2 : 0;
    for (uint64_t idx = first; idx < pub_idx; idx++) {
        unsigned long long ts = period_end_us(s, idx);
        if (ts <= last_seen)
            continue;
        if (samples && n < cap) {
            uint64_t busy = 0;
            const struct vgpu_sim_period *per = &s->dev[dev].periods[idx % VGPU_SIM_PERIODS];
            for (uint32_t i = 0; util && per->index == idx && i < per->n; i++)
                busy += per->e[i].busy_ns;
            samples[n] = (nvmlSample_t){.timeStamp = ts};
            samples[n].sampleValue.uiVal = percent(busy, P);
        }
        n++;
    }
    sim_unlock();
    if (n == 0)
        return NVML_ERROR_NOT_FOUND;
    *val_type = NVML_VALUE_TYPE_UNSIGNED_INT;
    *count = samples && n > cap ? cap : n;
    return NVML_SUCCESS;
}

/* ---- running processes ---- */

struct proc_row {
    unsigned int pid;
    unsigned long long used;
    unsigned int gi, ci; /* its MIG device's instances; 0xffffffff: none */
};

/* Live processes holding memory or a context on dev: a GPU's own, then, on
 * a GPU in MIG mode, each of its MIG devices'. */
static unsigned int running(int dev, struct proc_row *rows)
{
    struct vgpu_sim_state *s = sim_state();
    unsigned int n = 0;
    sim_lock(1);
    for (int d = 0; d < VGPU_SIM_MAX_DEVICES; d++) {
        int gpu = -1, gi = -1;
        if (d != dev && !(sim_slot_gi(d, &gpu, &gi) && gpu == dev))
            continue;
        if (d == dev)
            sim_slot_gi(d, &gpu, &gi);
        for (int i = 0; i < VGPU_SIM_MAX_PROCS && n < 2 * VGPU_SIM_MAX_PROCS; i++) {
            const struct vgpu_sim_proc *p = &s->procs[i];
            if (p->pid && (p->used[d] || p->contexts[d]))
                rows[n++] = (struct proc_row){(unsigned int)p->pid, p->used[d],
                                              gi < 0 ? 0xffffffffu : (unsigned int)gi,
                                              gi < 0 ? 0xffffffffu : 0};
        }
    }
    sim_unlock();
    return n;
}

/* The three generations differ only in their row layout. */
static nvmlReturn_t compute_processes(nvmlDevice_t d, unsigned int *count, void *infos,
                                      int with_ids)
{
    NVML_ANY_DEVICE(d, dev);
    if (!count)
        return NVML_ERROR_INVALID_ARGUMENT;
    struct proc_row rows[2 * VGPU_SIM_MAX_PROCS];
    unsigned int n = running(dev, rows);
    if (n > *count || (n && !infos)) {
        *count = n;
        return NVML_ERROR_INSUFFICIENT_SIZE;
    }
    for (unsigned int i = 0; i < n; i++) {
        if (with_ids)
            ((nvmlProcessInfo_t *)infos)[i] = (nvmlProcessInfo_t){
                rows[i].pid, rows[i].used, rows[i].gi, rows[i].ci};
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
    NVML_DEVICE(d, i);
    (void)i;
    if (!count)
        return NVML_ERROR_INVALID_ARGUMENT;
    *count = 0;
    return NVML_SUCCESS;
}
VGPU_ALIAS(nvmlDeviceGetGraphicsRunningProcesses_v3, nvmlDeviceGetGraphicsRunningProcesses_v2)
VGPU_ALIAS(nvmlDeviceGetGraphicsRunningProcesses_v3, nvmlDeviceGetGraphicsRunningProcesses)
VGPU_ALIAS(nvmlDeviceGetGraphicsRunningProcesses_v3, nvmlDeviceGetMPSComputeRunningProcesses_v3)
VGPU_ALIAS(nvmlDeviceGetGraphicsRunningProcesses_v3, nvmlDeviceGetMPSComputeRunningProcesses_v2)
