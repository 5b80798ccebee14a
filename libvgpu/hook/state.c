/*
 * state.c - what the hook enforces, and for whom.
 *
 *   VGPU_REGION=<dir>    the job's region: <dir>/region names its three System
 *                        V shared memory segments (limits attached read-only,
 *                        usage and signal read-write); this process claims a
 *                        slot.
 *   VGPU_MEM_LIMIT=4G    no region: a private, in-process region with that
 *                        limit on every GPU (per process, no daemon, no
 *                        compute limit).
 *   neither              everything passes through untouched.
 *
 * The hook obeys only the daemon. Where a daemon manages this node's GPUs
 * (its jobs directory exists: the system daemon's, compiled in as
 * VGPU_SYSTEM_RUNTIME_DIR, else the one $VGPU_RUNTIME_DIR names - the
 * environment can add a daemon to obey, never take the system one away):
 *   - a region is used only if the daemon made it: a directory right under
 *     the daemon's jobs directory, it and its region file owned by the
 *     daemon's user and writable by no one else; its segments created by
 *     the daemon's user (the kernel's shm_perm.cuid, which no one else can
 *     set), the limits segment owned by it and writable by no one else;
 *     made for this uid; so are the signals of other jobs the limits name
 *     (priority.c);
 *   - VGPU_MEM_LIMIT is refused (CUDA calls fail): limits come from the
 *     daemon, never from the job's environment.
 *
 * A process that was given a limit never runs unlimited by accident: when the
 * region can't be used the state is VGPU_BROKEN, every wrapped call fails and
 * one line on stderr says why.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ipc.h>
#include <sys/mman.h>
#include <sys/shm.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "hook.h"
#include "vgpu/size.h"

int vgpu_g_state;
int vgpu_g_cu_state;
int vgpu_g_nvml_state;
const struct vgpu_limits *vgpu_g_limits;
struct vgpu_usage *vgpu_g_usage;
struct vgpu_proc_slot *vgpu_g_slot;
struct vgpu_signal *vgpu_g_signal;
int vgpu_g_private;
uint64_t vgpu_g_private_limit;

static pthread_mutex_t state_lock = PTHREAD_MUTEX_INITIALIZER;
static int g_managed;         /* a daemon manages this node's GPUs: */
static uid_t g_daemon_uid;    /* ... as this user */
static int configured_mode;   /* VGPU_UNINIT until configure() ran */
static struct vgpu_limits priv_limits;
static struct vgpu_usage priv_usage;

/* ---- layout checks: a change to region.h must be seen here -------------- */
_Static_assert(sizeof(struct vgpu_dev_limit) == 424 + 8 * 48, "vgpu_dev_limit layout");
_Static_assert(__builtin_offsetof(struct vgpu_dev_limit, hold) == 124, "hold");
_Static_assert(__builtin_offsetof(struct vgpu_dev_limit, turn_gen) == 128, "turn_gen");
_Static_assert(__builtin_offsetof(struct vgpu_dev_limit, open) == 200, "open");
_Static_assert(sizeof(struct vgpu_span) == 24, "vgpu_span layout");
_Static_assert(__builtin_offsetof(struct vgpu_dev_limit, priority) == 392, "priority");
_Static_assert(__builtin_offsetof(struct vgpu_dev_limit, holders) == 424, "holders");
_Static_assert(sizeof(struct vgpu_holder) == 48, "vgpu_holder layout");
_Static_assert(__builtin_offsetof(struct vgpu_holder, signal_id) == 40, "holder.signal_id");
_Static_assert(sizeof(struct vgpu_signal) == 16 + 16 * 32, "vgpu_signal layout");
_Static_assert(__builtin_offsetof(struct vgpu_dev_limit, mem_limit) == 96, "mem_limit");
_Static_assert(__builtin_offsetof(struct vgpu_dev_limit, throttle) == 120, "throttle");
_Static_assert(sizeof(struct vgpu_limits) == 56 + 16 * 808, "vgpu_limits layout");
_Static_assert(__builtin_offsetof(struct vgpu_limits, generation) == 48, "generation");
_Static_assert(__builtin_offsetof(struct vgpu_limits, dev) == 56, "limits.dev");
_Static_assert(sizeof(struct vgpu_dev_usage) == 64, "vgpu_dev_usage layout");
_Static_assert(__builtin_offsetof(struct vgpu_dev_usage, busy_ns) == 16, "busy_ns");
_Static_assert(__builtin_offsetof(struct vgpu_dev_usage, oom_refusals) == 48, "oom_refusals");
_Static_assert(sizeof(struct vgpu_proc_slot) == 16 + 4 * 16 * 8 + 16 + VGPU_SLOT_LANES * 16 * 8,
               "vgpu_proc_slot layout");
_Static_assert(__builtin_offsetof(struct vgpu_proc_slot, lane_used) == 544, "slot.lane_used");
_Static_assert(VGPU_SLOT_LANES <= 32, "lanes_taken is 32 bits");
_Static_assert(__builtin_offsetof(struct vgpu_proc_slot, used) == 16, "slot.used");
_Static_assert(__builtin_offsetof(struct vgpu_proc_slot, allocs) == 528, "slot.allocs");
_Static_assert(__builtin_offsetof(struct vgpu_usage, dev) == 16, "usage.dev");
_Static_assert(__builtin_offsetof(struct vgpu_usage, procs) == 16 + 16 * 64, "usage.procs");
_Static_assert(sizeof(struct vgpu_usage) == 16 + 16 * 64 + 128 * (544 + VGPU_SLOT_LANES * 128),
               "vgpu_usage layout");
_Static_assert(VGPU_REGION_VERSION == 5, "libvgpu/hook follows region layout version 5");

/* ---- helpers -------------------------------------------------------------- */
/* /proc/<pid>/stat: start time (clock ticks since boot) and state letter.
 * Returns 0 when it can't be read. */
static uint64_t proc_stat(int pid, char *state)
{
    char path[64], buf[1024];
    snprintf(path, sizeof(path), "/proc/%d/stat", pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return 0;
    ssize_t n = read(fd, buf, sizeof(buf) - 1);
    close(fd);
    if (n <= 0)
        return 0;
    buf[n] = '\0';
    char *p = strrchr(buf, ')');   /* the command name may hold spaces */
    if (p == NULL || p[1] != ' ')
        return 0;
    p += 2;
    if (state != NULL)
        *state = *p;
    /* p is field 3 (state); starttime is field 22. */
    for (int field = 3; field < 22; field++) {
        p = strchr(p, ' ');
        if (p == NULL)
            return 0;
        p++;
    }
    return strtoull(p, NULL, 10);
}

/* A slot's process is gone: no such pid, a zombie (the driver already freed
 * its memory when it exited), or the pid now belongs to a newer process. */
static int slot_alive(int32_t pid, uint64_t start_time)
{
    if (kill(pid, 0) != 0 && errno == ESRCH)
        return 0;
    char st = '?';
    uint64_t t = proc_stat(pid, &st);
    if (t == 0)
        return 1;   /* exists but /proc tells nothing (hidepid): alive */
    if (st == 'Z' || st == 'X')
        return 0;
    if (start_time != 0 && t != start_time)
        return 0;
    return 1;
}

/* ---- the daemon ---------------------------------------------------------------- */
#ifndef VGPU_SYSTEM_RUNTIME_DIR
#define VGPU_SYSTEM_RUNTIME_DIR "/run/vgpu"
#endif

/* The jobs directory of the daemon that manages this node's GPUs, resolved,
 * in `dir` (PATH_MAX bytes), and its owner (the daemon's user); 0 when no
 * daemon does. */
static int managing_daemon(char *dir, uid_t *owner)
{
    const char *roots[2] = {VGPU_SYSTEM_RUNTIME_DIR, getenv("VGPU_RUNTIME_DIR")};
    for (int i = 0; i < 2; i++) {
        char jobs[PATH_MAX];
        struct stat st;
        if (roots[i] == NULL || roots[i][0] != '/')
            continue;
        snprintf(jobs, sizeof(jobs), "%s/jobs", roots[i]);
        if (realpath(jobs, dir) != NULL && stat(dir, &st) == 0 && S_ISDIR(st.st_mode)) {
            *owner = st.st_uid;
            return 1;
        }
    }
    return 0;
}

/* Owned by the daemon's user and writable by no one else. */
static int daemons(const struct stat *st, uid_t daemon_uid)
{
    return st->st_uid == daemon_uid && (st->st_mode & (S_IWGRP | S_IWOTH)) == 0;
}

/* ---- the region -------------------------------------------------------------
 * The limits and usage live in System V shared memory, not in files: a
 * segment has the size it was created with for good (no one can truncate
 * it, grow it, or fill the filesystem through it), and the kernel records
 * who created it. The daemon allocates and touches every page before anyone
 * attaches, so no access through an attachment can fault for want of space.
 * The job directory holds only the daemon's small `region` file naming the
 * three segments. */
#define REGION_FILE "region"
#define REGION_TAG "vgpu-region"

/* The three segment ids the daemon wrote into <dir>/region (a file owned by
 * the daemon's user and writable by no one else, when there is a daemon). */
static int region_ids(const char *dir, const uid_t *owner, int *limits_id, int *usage_id,
                      int *signal_id, char *why, size_t len)
{
    char path[PATH_MAX], buf[128];
    snprintf(path, sizeof(path), "%s/%s", dir, REGION_FILE);
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0) {
        snprintf(why, len, "%s: %s", path, strerror(errno));
        return 0;
    }
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) ||
        (owner != NULL && !daemons(&st, *owner))) {
        snprintf(why, len, "%s: not made by the daemon (owner uid %u, mode %o; the daemon "
                 "runs as uid %u)", path, (unsigned)st.st_uid, (unsigned)(st.st_mode & 07777),
                 owner != NULL ? (unsigned)*owner : 0u);
        close(fd);
        return 0;
    }
    ssize_t n = read(fd, buf, sizeof(buf) - 1);
    close(fd);
    int version = 0;
    buf[n > 0 ? n : 0] = '\0';
    if (n <= 0 ||
        sscanf(buf, REGION_TAG " %d %d %d %d", &version, limits_id, usage_id, signal_id) != 4 ||
        version != VGPU_REGION_VERSION || *limits_id < 0 || *usage_id < 0 || *signal_id < 0) {
        snprintf(why, len, "%s: not a vgpu region of layout version %d", path,
                 VGPU_REGION_VERSION);
        return 0;
    }
    return 1;
}

/* Attach segment `id` of at least `size` bytes. With a daemon (daemon_uid
 * non-NULL) the daemon's user must have created it, and with daemons_own
 * also own it and be the only one who may write it. */
static void *attach(const char *dir, const char *what, int id, size_t size, int writable,
                    const uid_t *daemon_uid, int daemons_own, char *why, size_t len)
{
    struct shmid_ds ds;
    if (shmctl(id, IPC_STAT, &ds) != 0) {
        snprintf(why, len, "%s: the %s segment %d: %s", dir, what, id, strerror(errno));
        return NULL;
    }
    if (daemon_uid != NULL &&
        (ds.shm_perm.cuid != *daemon_uid ||
         (daemons_own && (ds.shm_perm.uid != *daemon_uid || (ds.shm_perm.mode & 022) != 0)))) {
        snprintf(why, len, "%s: the %s segment %d was not made by the daemon (creator uid "
                 "%u, owner uid %u, mode %o; the daemon runs as uid %u)", dir, what, id,
                 (unsigned)ds.shm_perm.cuid, (unsigned)ds.shm_perm.uid,
                 (unsigned)(ds.shm_perm.mode & 0777), (unsigned)*daemon_uid);
        return NULL;
    }
    if ((size_t)ds.shm_segsz < size) {
        snprintf(why, len, "%s: the %s segment %d is too small for a vgpu region (%zu "
                 "bytes, need %zu)", dir, what, id, (size_t)ds.shm_segsz, size);
        return NULL;
    }
    void *p = shmat(id, NULL, writable ? 0 : SHM_RDONLY);
    if (p == (void *)-1) {
        snprintf(why, len, "%s: the %s segment %d: %s", dir, what, id, strerror(errno));
        return NULL;
    }
    return p;
}

/* With a daemon (daemon_uid non-NULL): the region must be a directory of
 * the daemon's, right under its jobs directory. */
static int daemons_region(const char *dir, const char *jobs, uid_t daemon_uid, char *why,
                          size_t len)
{
    char real[PATH_MAX];
    struct stat st;
    if (realpath(dir, real) == NULL || stat(real, &st) != 0) {
        snprintf(why, len, "%s: %s", dir, strerror(errno));
        return 0;
    }
    char *slash = strrchr(real, '/');
    size_t n = strlen(jobs);
    if (slash == NULL || (size_t)(slash - real) != n || strncmp(real, jobs, n) != 0) {
        snprintf(why, len, "%s is not a region of the daemon that manages this node's GPUs "
                 "(its regions are in %s)", dir, jobs);
        return 0;
    }
    if (!S_ISDIR(st.st_mode) || !daemons(&st, daemon_uid)) {
        snprintf(why, len, "%s: not made by the daemon (owner uid %u, mode %o)", dir,
                 (unsigned)st.st_uid, (unsigned)(st.st_mode & 07777));
        return 0;
    }
    return 1;
}

/* A segment of the region the job writes (usage, signal), attached: NULL
 * (and why says why) unless it holds `magic` and this layout version, as
 * the first two fields of each such segment do. */
static void *job_segment(const char *dir, const char *what, const char *kind, int id,
                         size_t size, uint32_t magic, const uid_t *daemon_uid, char *why,
                         size_t len)
{
    const uint32_t *head = attach(dir, what, id, size, 1, daemon_uid, 0, why, len);
    if (head == NULL)
        return NULL;
    if (head[0] != magic || head[1] != VGPU_REGION_VERSION) {
        snprintf(why, len, "%s: the %s segment is not a vgpu %s of layout version %d", dir,
                 what, kind, VGPU_REGION_VERSION);
        shmdt(head);
        return NULL;
    }
    return (void *)head;
}

static int map_region(const char *dir, const uid_t *daemon_uid, char *why, size_t len)
{
    int limits_id, usage_id, signal_id;
    if (!region_ids(dir, daemon_uid, &limits_id, &usage_id, &signal_id, why, len))
        return 0;
    const struct vgpu_limits *lim = attach(dir, "limits", limits_id,
                                           sizeof(struct vgpu_limits), 0, daemon_uid, 1,
                                           why, len);
    if (lim == NULL)
        return 0;
    struct vgpu_usage *use = NULL;
    struct vgpu_signal *sig;
    const char *job = getenv("VGPU_JOB");
    if (lim->magic != VGPU_REGION_MAGIC) {
        snprintf(why, len, "%s: the limits segment is not a vgpu region (bad magic)", dir);
        goto refused;
    }
    if (lim->version != VGPU_REGION_VERSION) {
        snprintf(why, len, "%s: region layout version %u, this libvgpu.so reads %d",
                 dir, lim->version, VGPU_REGION_VERSION);
        goto refused;
    }
    if (job != NULL && *job != '\0' &&
        strncmp(job, lim->job_id, VGPU_JOB_ID_LEN - 1) != 0) {
        snprintf(why, len, "%s is the region of job '%.*s', not of VGPU_JOB=%s", dir,
                 VGPU_JOB_ID_LEN, lim->job_id, job);
        goto refused;
    }
    if (daemon_uid != NULL && lim->owner_uid != (uint32_t)getuid() && getuid() != *daemon_uid) {
        snprintf(why, len, "%s is the region of a job of uid %u, not of this uid %u", dir,
                 lim->owner_uid, (unsigned)getuid());
        goto refused;
    }
    use = job_segment(dir, "usage", "region", usage_id, sizeof(struct vgpu_usage),
                      VGPU_REGION_MAGIC, daemon_uid, why, len);
    if (use == NULL)
        goto refused;
    sig = job_segment(dir, "signal", "signal", signal_id, sizeof(struct vgpu_signal),
                      VGPU_SIGNAL_MAGIC, daemon_uid, why, len);
    if (sig == NULL)
        goto refused;
    vgpu_g_limits = lim;
    vgpu_g_usage = use;
    vgpu_g_signal = sig;
    return 1;

refused: /* why says why; what was attached is detached, the last first */
    if (use != NULL)
        shmdt(use);
    shmdt(lim);
    return 0;
}

/* Another job's signal, segment id, attached read-only: only a segment of
 * exactly a signal's size that the daemon's user made (where a daemon
 * manages the node) and no one but its owner may write, holding a signal.
 * NULL otherwise: a stale id, or one reused for anything else. */
const struct vgpu_signal *vgpu_attach_signal(int id)
{
    struct shmid_ds ds;
    if (id < 0 || shmctl(id, IPC_STAT, &ds) != 0)
        return NULL;
    if ((g_managed && ds.shm_perm.cuid != g_daemon_uid) || (ds.shm_perm.mode & 022) != 0 ||
        (size_t)ds.shm_segsz != sizeof(struct vgpu_signal))
        return NULL;
    const struct vgpu_signal *s = shmat(id, NULL, SHM_RDONLY);
    if (s == (void *)-1)
        return NULL;
    if (s->magic != VGPU_SIGNAL_MAGIC || s->version != VGPU_REGION_VERSION) {
        shmdt(s);
        return NULL;
    }
    return s;
}

static int configure(void)
{
    char why[PATH_MAX + 256];
    const char *dir = getenv("VGPU_REGION");
    const char *mem = getenv("VGPU_MEM_LIMIT");
    char jobs[PATH_MAX];
    uid_t daemon_uid;
    int managed = managing_daemon(jobs, &daemon_uid);
    g_managed = managed;
    g_daemon_uid = managed ? daemon_uid : 0;
    if (dir != NULL && *dir != '\0') {
        if ((!managed || daemons_region(dir, jobs, daemon_uid, why, sizeof(why))) &&
            map_region(dir, managed ? &daemon_uid : NULL, why, sizeof(why)))
            return VGPU_ACTIVE;
        vgpu_log(VGPU_LOG_ERROR, "cannot use the job's region (VGPU_REGION=%s): %s; "
                 "CUDA calls fail", dir, why);
        return VGPU_BROKEN;
    }
    if (mem != NULL && *mem != '\0' && managed) {
        vgpu_log(VGPU_LOG_ERROR, "VGPU_MEM_LIMIT=%s is refused: a vgpuctl daemon manages this "
                 "node's GPUs (%s), and only it sets limits; start the work with vgpuctl run. "
                 "CUDA calls fail", mem, jobs);
        return VGPU_BROKEN;
    }
    if (mem != NULL && *mem != '\0') {
        uint64_t limit;
        if (vgpu_parse_size(mem, &limit) != 0) {
            vgpu_log(VGPU_LOG_ERROR, "VGPU_MEM_LIMIT=%s is not a size (a number and a unit: "
                     "512M, 4G; B for bytes); CUDA calls fail", mem);
            return VGPU_BROKEN;
        }
        priv_limits.magic = VGPU_REGION_MAGIC;
        priv_limits.version = VGPU_REGION_VERSION;
        priv_usage.magic = VGPU_REGION_MAGIC;
        priv_usage.version = VGPU_REGION_VERSION;
        vgpu_g_private_limit = limit;
        vgpu_g_private = 1;
        vgpu_g_limits = &priv_limits;
        vgpu_g_usage = &priv_usage;
        return VGPU_ACTIVE;
    }
    return VGPU_PASS;
}

/* Private mode: GPUs join the private region as they are first seen. */
int vgpu_private_add_device(const char *uuid)
{
    /* Called under devmap's lock. */
    uint32_t n = priv_limits.ndevices;
    if (n >= VGPU_MAX_DEVICES)
        return -1;
    struct vgpu_dev_limit *d = &priv_limits.dev[n];
    snprintf(d->uuid, sizeof(d->uuid), "%s", uuid);
    d->mem_limit = vgpu_g_private_limit;
    d->core_share = 100;
    __atomic_store_n(&priv_limits.ndevices, n + 1, __ATOMIC_RELEASE);
    return (int)n;
}

/* ---- process slots ---------------------------------------------------------- */
static void clear_slot(struct vgpu_proc_slot *s)
{
    s->start_time = 0;
    __atomic_store_n(&s->features, 0, __ATOMIC_RELAXED);
    for (int d = 0; d < VGPU_MAX_DEVICES; d++) {
        __atomic_store_n(&s->used[d], 0, __ATOMIC_RELAXED);
        __atomic_store_n(&s->ctx_bytes[d], 0, __ATOMIC_RELAXED);
        __atomic_store_n(&s->launches[d], 0, __ATOMIC_RELAXED);
        for (int l = 0; l < VGPU_SLOT_LANES; l++)
            __atomic_store_n(&s->lane_used[l][d], 0, __ATOMIC_RELAXED);
    }
    __atomic_store_n(&s->allocs, 0, __ATOMIC_RELAXED);
    __atomic_store_n(&s->get_proc_calls, 0, __ATOMIC_RELAXED);
}

/* Take a slot whose owner is gone (pid > 0 seen), give its bytes back to the
 * job and free it. The CAS makes sure only one sweeper subtracts. */
static uint64_t reap_slot(struct vgpu_proc_slot *s, int32_t pid)
{
    if (!__atomic_compare_exchange_n(&s->pid, &pid, -1, 0, __ATOMIC_ACQ_REL, __ATOMIC_RELAXED))
        return 0;
    uint64_t freed = vgpu_release_slot_memory(s);
    clear_slot(s);
    __atomic_store_n(&s->pid, 0, __ATOMIC_RELEASE);
    return freed;
}

uint64_t vgpu_sweep(void)
{
    if (vgpu_g_private || vgpu_g_usage == NULL)
        return 0;
    uint64_t freed = 0;
    for (int i = 0; i < VGPU_MAX_PROCS; i++) {
        struct vgpu_proc_slot *s = &vgpu_g_usage->procs[i];
        int32_t pid = __atomic_load_n(&s->pid, __ATOMIC_ACQUIRE);
        if (pid <= 0 || s == vgpu_g_slot)
            continue;
        if (slot_alive(pid, __atomic_load_n(&s->start_time, __ATOMIC_RELAXED)))
            continue;
        uint64_t n = reap_slot(s, pid);
        if (n != 0)
            vgpu_log(VGPU_LOG_INFO, "process %d of the job is gone; its %llu bytes were "
                     "given back", pid, (unsigned long long)n);
        freed += n;
    }
    return freed;
}

int vgpu_job_pids(int32_t *pids, int max)
{
    int n = 0;
    if (vgpu_g_private) {
        if (max > 0)
            pids[n++] = getpid();
        return n;
    }
    for (int i = 0; i < VGPU_MAX_PROCS && n < max; i++) {
        int32_t pid = __atomic_load_n(&vgpu_g_usage->procs[i].pid, __ATOMIC_ACQUIRE);
        if (pid > 0)
            pids[n++] = pid;
    }
    return n;
}

static int claim_slot(void)
{
    int32_t me = getpid();
    if (vgpu_g_private) {
        clear_slot(&priv_usage.procs[0]);
        priv_usage.procs[0].pid = me;
        vgpu_g_slot = &priv_usage.procs[0];
        return 1;
    }
    uint64_t start = proc_stat(me, NULL);
    struct vgpu_proc_slot *procs = vgpu_g_usage->procs;
    /* A slot with our own pid is from the image this process exec'd away
     * from: the driver freed its memory at exec. */
    for (int i = 0; i < VGPU_MAX_PROCS; i++)
        if (__atomic_load_n(&procs[i].pid, __ATOMIC_ACQUIRE) == me)
            reap_slot(&procs[i], me);
    for (int pass = 0; pass < 2; pass++) {
        for (int i = 0; i < VGPU_MAX_PROCS; i++) {
            int32_t expect = 0;
            if (__atomic_load_n(&procs[i].pid, __ATOMIC_RELAXED) == 0 &&
                __atomic_compare_exchange_n(&procs[i].pid, &expect, me, 0, __ATOMIC_ACQ_REL,
                                            __ATOMIC_RELAXED)) {
                clear_slot(&procs[i]);
                __atomic_store_n(&procs[i].start_time, start, __ATOMIC_RELEASE);
                vgpu_g_slot = &procs[i];
                return 1;
            }
        }
        vgpu_sweep();
    }
    return 0;
}

int vgpu_state_init_slow(void)
{
    pthread_mutex_lock(&state_lock);
    int s = __atomic_load_n(&vgpu_g_state, __ATOMIC_ACQUIRE);
    if (s == VGPU_UNINIT) {
        if (configured_mode == VGPU_UNINIT) {
            vgpu_clock_init();
            configured_mode = configure();
        }
        s = configured_mode;
        if (s == VGPU_ACTIVE && vgpu_g_slot == NULL && !claim_slot()) {
            vgpu_log(VGPU_LOG_ERROR, "no free process slot in the job's region (%d processes "
                     "at most); CUDA calls fail", VGPU_MAX_PROCS);
            s = VGPU_BROKEN;
        }
        __atomic_store_n(&vgpu_g_state, s, __ATOMIC_RELEASE);
    }
    pthread_mutex_unlock(&state_lock);
    return s;
}

/* ---- fork and exit -------------------------------------------------------------- */
static void before_fork(void)
{
    pthread_mutex_lock(&state_lock);
}

static void after_fork_parent(void)
{
    pthread_mutex_unlock(&state_lock);
}

/* The child is a new process of the job: it holds no device memory and no
 * context, and claims its own slot at its first CUDA call. */
static void after_fork_child(void)
{
    pthread_mutex_init(&state_lock, NULL);
    vgpu_interpose_atfork_child();
    vgpu_alloctab_atfork_child();
    vgpu_lanes_atfork_child();
    vgpu_context_atfork_child();
    vgpu_devmap_atfork_child();
    vgpu_flight_atfork_child();
    vgpu_turns_atfork_child();
    vgpu_priority_atfork_child();
    if (vgpu_g_private)
        memset(priv_usage.dev, 0, sizeof(priv_usage.dev));
    vgpu_g_slot = NULL;
    __atomic_store_n(&vgpu_g_state, VGPU_UNINIT, __ATOMIC_RELEASE);
    __atomic_store_n(&vgpu_g_cu_state, VGPU_UNINIT, __ATOMIC_RELEASE);
    __atomic_store_n(&vgpu_g_nvml_state, VGPU_UNINIT, __ATOMIC_RELEASE);
}

__attribute__((constructor)) static void vgpu_ctor(void)
{
    pthread_atfork(before_fork, after_fork_parent, after_fork_child);
}

/* At exit the driver frees everything the process held: give it back to the
 * job now rather than at the next sweep. */
__attribute__((destructor)) static void vgpu_dtor(void)
{
    struct vgpu_proc_slot *s = vgpu_g_slot;
    if (s == NULL || vgpu_g_private)
        return;
    static struct vgpu_proc_slot gone;   /* late calls of other threads land here */
    int32_t me = getpid();
    vgpu_g_slot = &gone;
    if (__atomic_load_n(&s->pid, __ATOMIC_ACQUIRE) == me)
        reap_slot(s, me);
}
