/*
 * state.c - the shared device state file: where it lives, creating it
 * from VGPU_SIM, the robust lock, this process's slot and the reclaim of dead
 * processes' memory.
 *
 * A process that takes a slot also takes an open-file-description lock on
 * one byte of the state file (far past its end), through a descriptor of
 * its own that is closed on exec and in forked children. The kernel drops
 * that lock when the process dies, however it dies, or execs: a slot whose
 * lock is free belongs to no live process, and its memory is given back.
 * (Where such locks are unavailable, /proc/<pid>/stat decides instead.)
 */
#define _GNU_SOURCE
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "sim.h"
#include "slot.h"
#include "vgpu/size.h"

#define SLOT_LOCK_BASE ((off_t)1 << 40)

static struct vgpu_sim_state *g_state;
static pthread_mutex_t g_open_lock = PTHREAD_MUTEX_INITIALIZER;
static int g_slot = -1;
static pid_t g_slot_pid;
static int g_check_fd = -1; /* the state file: asks who holds slot locks */
static int g_lock_fd = -1;  /* the state file again: holds this process's slot lock */

uint64_t sim_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* ---- configuration ---- */

int sim_parse_spec(const char *text, uint32_t *count, uint64_t *memory)
{
    char *end;
    while (isspace((unsigned char)*text))
        text++;
    if (!isdigit((unsigned char)*text))
        return -1;
    long c = strtol(text, &end, 10);
    while (isspace((unsigned char)*end))
        end++;
    if ((*end != 'x' && *end != 'X') || c < 1 || c > VGPU_SIM_MAX_GPUS)
        return -1;
    uint64_t mem;
    if (vgpu_parse_size(end + 1, &mem) != 0 || mem < (256ull << 20))
        return -1;
    *count = (uint32_t)c;
    *memory = mem;
    return 0;
}

static uint64_t sample_ns_from_env(int *given)
{
    const char *s = getenv("VGPU_SIM_SAMPLE_MS");
    *given = 0;
    if (s && *s) {
        char *end;
        long ms = strtol(s, &end, 10);
        if (*end == '\0' && ms >= 1 && ms <= 60000) {
            *given = 1;
            return (uint64_t)ms * 1000000ull;
        }
    }
    return (uint64_t)SIM_DEFAULT_SAMPLE_MS * 1000000ull;
}

/* A time setting in microseconds from the environment (lo..hi), or def;
 * anything else is said once on stderr and read as the default. */
static uint64_t us_from_env(const char *name, uint64_t def, uint64_t lo, uint64_t hi, int *given)
{
    const char *s = getenv(name);
    *given = 0;
    if (!s || !*s)
        return def * 1000ull;
    char *end;
    long long v = strtoll(s, &end, 10);
    if (*end == '\0' && v >= (long long)lo && v <= (long long)hi) {
        *given = 1;
        return (uint64_t)v * 1000ull;
    }
    fprintf(stderr, "vgpu-sim: %s=%s: expected microseconds from %llu to %llu; using %llu\n",
            name, s, (unsigned long long)lo, (unsigned long long)hi, (unsigned long long)def);
    return def * 1000ull;
}

int sim_peer_access(void)
{
    const char *s = getenv("VGPU_SIM_PEER");
    return !(s && strcmp(s, "0") == 0);
}

/* VGPU_SIM_UTIL_IDLE: average (default) or skip; anything else is said once
 * on stderr and read as the default. */
static uint32_t util_idle_from_env(int *given)
{
    const char *s = getenv("VGPU_SIM_UTIL_IDLE");
    *given = 0;
    if (!s || !*s)
        return VGPU_SIM_UTIL_IDLE_AVERAGE;
    if (strcmp(s, "average") == 0 || strcmp(s, "skip") == 0) {
        *given = 1;
        return s[0] == 's' ? VGPU_SIM_UTIL_IDLE_SKIP : VGPU_SIM_UTIL_IDLE_AVERAGE;
    }
    fprintf(stderr, "vgpu-sim: VGPU_SIM_UTIL_IDLE=%s: expected average or skip; using average\n",
            s);
    return VGPU_SIM_UTIL_IDLE_AVERAGE;
}

/* VGPU_SIM_UTIL_PROCS: last (default), busiest, each or none (in the order
 * of VGPU_SIM_UTIL_PROCS_*); anything else is said once on stderr and read
 * as the default. */
static uint32_t util_procs_from_env(int *given)
{
    static const char *const names[] = {"last", "busiest", "each", "none"};
    const char *s = getenv("VGPU_SIM_UTIL_PROCS");
    *given = 0;
    if (!s || !*s)
        return VGPU_SIM_UTIL_PROCS_LAST;
    for (uint32_t i = 0; i < sizeof names / sizeof *names; i++)
        if (strcmp(s, names[i]) == 0) {
            *given = 1;
            return i;
        }
    fprintf(stderr, "vgpu-sim: VGPU_SIM_UTIL_PROCS=%s: expected last, busiest, each or none; "
                    "using last\n", s);
    return VGPU_SIM_UTIL_PROCS_LAST;
}

/* A setting of two values in the variable `var`: `flag` where it says
 * `set`, 0 where it says `unset` (the default) or nothing; a value not
 * understood is said once on stderr and read as `unset`. *given set where
 * it says either. */
static uint32_t choice_flag(const char *var, const char *unset, const char *set, uint32_t flag,
                            int *given)
{
    const char *s = getenv(var);
    if (!s || !*s)
        return 0;
    if (strcmp(s, set) == 0 || strcmp(s, unset) == 0) {
        *given = 1;
        return strcmp(s, set) == 0 ? flag : 0;
    }
    fprintf(stderr, "vgpu-sim: %s=%s: expected %s or %s; using %s\n", var, s, unset, set, unset);
    return 0;
}

/* The checkpoint settings: VGPU_SIM_CKPT_RATE (a size per second, default
 * SIM_DEFAULT_CKPT_RATE), VGPU_SIM_CKPT_PAIRS (checkpointed | all) and
 * VGPU_SIM_CKPT_REFUSED (failed | locked). A value not understood is said
 * once on stderr and read as the default. *given: any was set. */
static void ckpt_from_env(uint64_t *rate, uint32_t *flags, int *given)
{
    *rate = SIM_DEFAULT_CKPT_RATE;
    *flags = 0;
    *given = 0;
    const char *s = getenv("VGPU_SIM_CKPT_RATE");
    if (s && *s) {
        uint64_t v;
        if (vgpu_parse_size(s, &v) == 0 && v >= (1ull << 20)) {
            *rate = v;
            *given = 1;
        } else {
            fprintf(stderr, "vgpu-sim: VGPU_SIM_CKPT_RATE=%s: expected a size per second, "
                    "at least 1M; using the default\n", s);
        }
    }
    *flags |= choice_flag("VGPU_SIM_CKPT_PAIRS", "checkpointed", "all",
                          VGPU_SIM_CKPT_F_PAIRS_ALL, given);
    *flags |= choice_flag("VGPU_SIM_CKPT_REFUSED", "failed", "locked",
                          VGPU_SIM_CKPT_F_REFUSED_LOCKED, given);
}

int sim_cuda_of_driver(const char *driver)
{
    /* each branch and the CUDA version it brought */
    static const struct { int branch, cuda; } k[] = {
        {525, 12000}, {530, 12010}, {535, 12020}, {545, 12030}, {550, 12040},
        {555, 12050}, {560, 12060}, {565, 12070}, {570, 12080}, {575, 12090}, {580, 13000},
    };
    char *end;
    long branch = strtol(driver, &end, 10);
    if (end == driver || (*end != '\0' && *end != '.') || strlen(driver) >= 32)
        return 0;
    int cuda = 0;
    for (size_t i = 0; i < sizeof k / sizeof k[0]; i++)
        if (branch >= k[i].branch && branch < k[i].branch + 5)
            cuda = k[i].cuda;
    return cuda;
}

/* VGPU_SIM_DRIVER: a driver version from R525 to R580 (default
 * SIM_DRIVER_VERSION); anything else is said once and read as the default. */
static void driver_from_env(char *driver, int32_t *cuda, int *given)
{
    const char *s = getenv("VGPU_SIM_DRIVER");
    *given = 0;
    snprintf(driver, 32, "%s", SIM_DRIVER_VERSION);
    *cuda = SIM_CUDA_VERSION;
    if (!s || !*s)
        return;
    int c = sim_cuda_of_driver(s);
    if (!c) {
        fprintf(stderr, "vgpu-sim: VGPU_SIM_DRIVER=%s: expected a driver version from 525 to "
                "580, such as 570.86.10; using %s\n", s, SIM_DRIVER_VERSION);
        return;
    }
    snprintf(driver, 32, "%s", s);
    *cuda = c;
    *given = 1;
}

const char *sim_state_path(char *buf, size_t len)
{
    const char *p = getenv("VGPU_SIM_STATE");
    if (p && *p)
        return p;
    snprintf(buf, len, "/dev/shm/vgpu-sim-%u", (unsigned)getuid());
    return buf;
}

/* ---- processes ---- */

/* Read state and start time of pid from /proc; -1 if it is gone. */
static int proc_stat(pid_t pid, char *state, uint64_t *start)
{
    char path[64], buf[1024];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -1;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0)
        return -1;
    buf[n] = '\0';
    char *p = strrchr(buf, ')'); /* the command name may hold spaces */
    if (!p || p[1] != ' ')
        return -1;
    p += 2;
    *state = *p;
    /* field 3 is the state; the start time is field 22 */
    for (int field = 3; field < 22; field++) {
        p = strchr(p, ' ');
        if (!p)
            return -1;
        p++;
    }
    *start = strtoull(p, NULL, 10);
    return 0;
}

uint64_t sim_proc_start_time(int pid)
{
    char st;
    uint64_t start;
    return proc_stat((pid_t)pid, &st, &start) < 0 ? 0 : start;
}

/* 1 if slot i's lock is held, 0 if free, -1 if that cannot be told. */
static int slot_locked(int i)
{
    struct flock fl = {.l_type = F_WRLCK, .l_whence = SEEK_SET,
                       .l_start = SLOT_LOCK_BASE + i, .l_len = 1};
    if (g_check_fd < 0 || fcntl(g_check_fd, F_OFD_GETLK, &fl) < 0)
        return -1;
    return fl.l_type != F_UNLCK;
}

/* Is slot i's process alive (not gone, not a zombie, not exec'd into another
 * program, not a new process that reused its pid)? */
static int proc_alive(const struct vgpu_sim_proc *p, int i)
{
    if (p->pid <= 0)
        return 0;
    if (p->locked) {
        int held = slot_locked(i);
        if (held >= 0)
            return held;
    }
    char st;
    uint64_t start;
    if (proc_stat(p->pid, &st, &start) < 0)
        return 0;
    return st != 'Z' && st != 'X' && start == p->start_time;
}

static int is_self(int i)
{
    return i == g_slot && g_slot_pid == getpid();
}

/* Give back what a dead process held, as the driver does when it dies. */
static void release_slot(struct vgpu_sim_state *s, struct vgpu_sim_proc *p)
{
    for (uint32_t d = 0; d < VGPU_SIM_MAX_DEVICES; d++) {
        uint64_t u = p->used[d];
        s->dev[d].used = s->dev[d].used > u ? s->dev[d].used - u : 0;
        if (p->tag >= 0 && p->tag < VGPU_SIM_MAX_TAGS) {
            struct vgpu_sim_tag *t = &s->tags[p->tag];
            t->used[d] = t->used[d] > u ? t->used[d] - u : 0;
        }
    }
    memset(p, 0, sizeof *p);
}

static void reclaim_dead(struct vgpu_sim_state *s)
{
    for (int i = 0; i < VGPU_SIM_MAX_PROCS; i++) {
        struct vgpu_sim_proc *p = &s->procs[i];
        if (p->pid && !is_self(i) && !proc_alive(p, i))
            release_slot(s, p);
    }
}

int sim_proc_on_device(int dev, int32_t pid)
{
    struct vgpu_sim_state *s = sim_state();
    for (int i = 0; i < VGPU_SIM_MAX_PROCS; i++) {
        const struct vgpu_sim_proc *p = &s->procs[i];
        if (p->pid == pid)
            return (p->contexts[dev] || p->used[dev]) && (is_self(i) || proc_alive(p, i));
    }
    return 0;
}

/* Live processes using the state, this one aside. */
static int live_processes(struct vgpu_sim_state *s)
{
    int n = 0;
    for (int i = 0; i < VGPU_SIM_MAX_PROCS; i++)
        if (s->procs[i].pid && !is_self(i) && proc_alive(&s->procs[i], i))
            n++;
    return n;
}

int sim_proc_slot(int32_t pid)
{
    struct vgpu_sim_state *s = g_state;
    for (int i = 0; i < VGPU_SIM_MAX_PROCS; i++)
        if (s->procs[i].pid == pid && pid > 0 && (is_self(i) || proc_alive(&s->procs[i], i)))
            return i;
    return -1;
}

int sim_slot_alive(int i)
{
    struct vgpu_sim_state *s = g_state;
    return is_self(i) || proc_alive(&s->procs[i], i);
}

int sim_live_processes(void)
{
    return live_processes(g_state);
}


static int find_tag(struct vgpu_sim_state *s, const char *name)
{
    int free_i = -1;
    for (int i = 0; i < VGPU_SIM_MAX_TAGS; i++) {
        if (s->tags[i].name[0] == '\0') {
            if (free_i < 0)
                free_i = i;
        } else if (strncmp(s->tags[i].name, name, VGPU_SIM_TAG_LEN - 1) == 0) {
            return i;
        }
    }
    if (free_i >= 0)
        snprintf(s->tags[free_i].name, VGPU_SIM_TAG_LEN, "%s", name);
    else
        fprintf(stderr, "vgpu-sim: VGPU_SIM_TAG=%s: the state holds %d tags already; this "
                "process's use is not added up under it\n", name, VGPU_SIM_MAX_TAGS);
    return free_i;
}

/* A forked child is not its parent: it must not keep the parent's slot lock
 * (and so the parent's memory) alive, and takes a slot of its own. */
static void forget_slot_in_child(void)
{
    if (g_lock_fd >= 0)
        close(g_lock_fd);
    g_lock_fd = -1;
    g_slot = -1;
}

static void register_atfork(void)
{
    pthread_atfork(NULL, NULL, forget_slot_in_child);
}

static int take_slot_lock(int slot)
{
    if (g_lock_fd < 0 && g_check_fd >= 0) {
        /* a description of our own, on the very file we mapped */
        char path[64];
        snprintf(path, sizeof path, "/proc/self/fd/%d", g_check_fd);
        g_lock_fd = open(path, O_RDWR | O_CLOEXEC);
    }
    struct flock fl = {.l_type = F_WRLCK, .l_whence = SEEK_SET,
                       .l_start = SLOT_LOCK_BASE + slot, .l_len = 1};
    return g_lock_fd >= 0 && fcntl(g_lock_fd, F_OFD_SETLK, &fl) == 0;
}

int sim_self_slot(void)
{
    struct vgpu_sim_state *s = g_state;
    pid_t self = getpid();
    if (g_slot >= 0 && g_slot_pid == self)
        return g_slot;
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, register_atfork);
    reclaim_dead(s); /* our own slot from before an exec, among others */
    int slot = -1;
    for (int i = 0; i < VGPU_SIM_MAX_PROCS && slot < 0; i++)
        if (s->procs[i].pid == 0)
            slot = i;
    if (slot < 0)
        return -1;
    struct vgpu_sim_proc *p = &s->procs[slot];
    memset(p, 0, sizeof *p);
    char st;
    proc_stat(self, &st, &p->start_time);
    p->pid = self;
    p->locked = (uint32_t)take_slot_lock(slot);
    const char *tag = getenv("VGPU_SIM_TAG");
    p->tag = (tag && *tag) ? find_tag(s, tag) : -1;
    g_slot = slot;
    g_slot_pid = self;
    return slot;
}

struct vgpu_sim_proc *sim_self_proc(struct vgpu_sim_state *s)
{
    int slot = sim_self_slot();
    return slot < 0 ? NULL : &s->procs[slot];
}

struct vgpu_sim_tag *sim_proc_tag(struct vgpu_sim_state *s, const struct vgpu_sim_proc *p)
{
    return (p && p->tag >= 0 && p->tag < VGPU_SIM_MAX_TAGS) ? &s->tags[p->tag] : NULL;
}

/* ---- the lock ---- */

static void lock_state(struct vgpu_sim_state *s)
{
    int rc = pthread_mutex_lock(&s->lock);
    if (rc == EOWNERDEAD) {
        /* Its holder died mid-update: the counters it was changing may be
         * off by that update; the reclaim below gives back its memory. */
        pthread_mutex_consistent(&s->lock);
        reclaim_dead(s);
    }
}

void sim_lock(int reclaim)
{
    struct vgpu_sim_state *s = sim_state();
    lock_state(s);
    if (reclaim)
        reclaim_dead(s);
}

void sim_unlock(void)
{
    pthread_mutex_unlock(&g_state->lock);
}

/* ---- creating and mapping the file ---- */

static void init_state(struct vgpu_sim_state *s, uint32_t count, uint64_t memory,
                       uint64_t sample_ns, uint32_t util_idle, uint32_t util_procs,
                       uint64_t slice_ns, uint64_t switch_ns, uint64_t ckpt_rate,
                       uint32_t ckpt_flags, const char *driver, int32_t cuda,
                       const char *mig_spec, const struct sim_mig_plan *mig)
{
    memset(s, 0, offsetof(struct vgpu_sim_state, dev));
    s->magic = VGPU_SIM_MAGIC;
    s->layout = VGPU_SIM_LAYOUT;
    s->count = count;
    s->memory = memory;
    s->sample_ns = sample_ns;
    s->util_idle = util_idle;
    s->util_procs = util_procs;
    s->slice_ns = slice_ns;
    s->switch_ns = switch_ns;
    s->ckpt_rate = ckpt_rate;
    s->ckpt_flags = ckpt_flags;
    snprintf(s->driver, sizeof s->driver, "%s", driver);
    s->cuda_version = cuda;
    struct timespec rt;
    clock_gettime(CLOCK_REALTIME, &rt);
    uint64_t mono = sim_now_ns();
    s->realtime_offset_ns = (int64_t)((uint64_t)rt.tv_sec * 1000000000ull +
                                      (uint64_t)rt.tv_nsec) - (int64_t)mono;
    pthread_mutexattr_t a;
    pthread_mutexattr_init(&a);
    pthread_mutexattr_setpshared(&a, PTHREAD_PROCESS_SHARED);
    pthread_mutexattr_setrobust(&a, PTHREAD_MUTEX_ROBUST);
    pthread_mutex_init(&s->lock, &a);
    pthread_mutexattr_destroy(&a);
    for (uint32_t d = 0; d < VGPU_SIM_MAX_DEVICES; d++) {
        struct vgpu_sim_device *dev = &s->dev[d];
        dev->total = d < count ? memory : 0;
        dev->sms = d < count ? SIM_SM_COUNT : 0;
        dev->parent = -1;
        dev->used = dev->busy_ns = dev->kernels = dev->runs = 0;
        dev->fail_allocs = 0;
        memset(&dev->sched, 0, sizeof dev->sched);
        dev->sched.cur = dev->sched.next = -1;
        memset(dev->periods, 0, sizeof dev->periods);
    }
    for (int i = 0; i < VGPU_SIM_MAX_PROCS; i++)
        s->procs[i].tag = -1;
    snprintf(s->mig_spec, sizeof s->mig_spec, "%s", mig_spec);
    sim_mig_apply(s, mig);
    __atomic_store_n(&s->ready, 1, __ATOMIC_RELEASE);
}

static int valid_state(const struct vgpu_sim_state *s, off_t size)
{
    return size == (off_t)sizeof *s && s->magic == VGPU_SIM_MAGIC &&
           s->layout == VGPU_SIM_LAYOUT && s->ready &&
           s->count >= 1 && s->count <= VGPU_SIM_MAX_GPUS;
}

/* Open path locked (flock), making sure the file we hold is still the one the
 * path names (another process may have replaced it meanwhile). */
static int open_locked(const char *path, mode_t mode)
{
    for (int tries = 0; tries < 100; tries++) {
        int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, mode);
        if (fd < 0)
            return -1;
        if (flock(fd, LOCK_EX) < 0) {
            close(fd);
            return -1;
        }
        struct stat a, b;
        if (fstat(fd, &a) == 0 && stat(path, &b) == 0 &&
            a.st_ino == b.st_ino && a.st_dev == b.st_dev)
            return fd;
        close(fd);
    }
    errno = EAGAIN;
    return -1;
}

static struct vgpu_sim_state *map_fd(int fd)
{
    void *p = mmap(NULL, sizeof(struct vgpu_sim_state), PROT_READ | PROT_WRITE,
                   MAP_SHARED, fd, 0);
    return p == MAP_FAILED ? NULL : p;
}

/* as_is: map the state as it is, whatever its configuration (vgpuctl sim). */
static struct vgpu_sim_state *open_state(int as_is)
{
    char buf[PATH_MAX];
    const char *path = sim_state_path(buf, sizeof buf);
    const char *spec = getenv("VGPU_SIM");
    uint32_t count = 1;
    uint64_t memory = SIM_DEFAULT_MEMORY;
    int spec_given = spec && *spec;
    if (spec_given && sim_parse_spec(spec, &count, &memory)) {
        fprintf(stderr, "vgpu-sim: VGPU_SIM=%s: expected COUNTxSIZE, for example 2x16G\n",
                spec);
        errno = EINVAL;
        return NULL;
    }
    const char *mig_spec = getenv("VGPU_SIM_MIG");
    int mig_given = mig_spec && *mig_spec;
    static struct sim_mig_plan mig; /* under g_open_lock */
    if (!mig_given)
        mig_spec = "";
    if (sim_mig_parse(mig_spec, count, memory, &mig)) {
        errno = EINVAL;
        return NULL;
    }
    int sample_given;
    uint64_t sample_ns = sample_ns_from_env(&sample_given);
    int idle_given;
    uint32_t util_idle = util_idle_from_env(&idle_given);
    int procs_given;
    uint32_t util_procs = util_procs_from_env(&procs_given);
    int ckpt_given;
    uint64_t ckpt_rate;
    uint32_t ckpt_flags;
    ckpt_from_env(&ckpt_rate, &ckpt_flags, &ckpt_given);
    int driver_given;
    char driver[32];
    int32_t cuda;
    driver_from_env(driver, &cuda, &driver_given);
    int slice_given, switch_given;
    uint64_t slice_ns = us_from_env("VGPU_SIM_TIMESLICE_US", SIM_DEFAULT_TIMESLICE_US, 100,
                                    1000000, &slice_given);
    uint64_t switch_ns = us_from_env("VGPU_SIM_SWITCH_US", SIM_DEFAULT_SWITCH_US, 0, 10000,
                                     &switch_given);
    mode_t mode = getenv("VGPU_SIM_STATE") && *getenv("VGPU_SIM_STATE") ? 0666 : 0600;

    for (int attempt = 0; attempt < 2; attempt++) {
        int fd = open_locked(path, mode);
        if (fd < 0) {
            fprintf(stderr, "vgpu-sim: cannot open the state file %s: %s\n", path,
                    strerror(errno));
            return NULL;
        }
        struct stat st;
        fstat(fd, &st);
        if (st.st_size != 0 && st.st_size != (off_t)sizeof(struct vgpu_sim_state)) {
            /* Another layout: start over with a fresh file. */
            unlink(path);
            close(fd);
            continue;
        }
        if (st.st_size == 0 && ftruncate(fd, sizeof(struct vgpu_sim_state)) < 0) {
            close(fd);
            return NULL;
        }
        /* A file just made takes its mode whatever the umask: VGPU_SIM_STATE
         * names a GPU every user of the node may open (as /dev/nvidia* are
         * 0666); the default per-uid file stays its owner's. */
        if (st.st_size == 0 && st.st_uid == geteuid())
            (void)fchmod(fd, mode);
        struct vgpu_sim_state *s = map_fd(fd);
        if (!s) {
            close(fd);
            return NULL;
        }
        if (!valid_state(s, (off_t)sizeof *s)) {
            init_state(s, count, memory, sample_ns, util_idle, util_procs, slice_ns, switch_ns,
                       ckpt_rate, ckpt_flags, driver, cuda, mig_spec, &mig);
        } else if (!as_is && ((spec_given && (s->count != count || s->memory != memory)) ||
                              (sample_given && s->sample_ns != sample_ns) ||
                              (idle_given && s->util_idle != util_idle) ||
                              (procs_given && s->util_procs != util_procs) ||
                              (slice_given && s->slice_ns != slice_ns) ||
                              (switch_given && s->switch_ns != switch_ns) ||
                              (ckpt_given && (s->ckpt_rate != ckpt_rate ||
                                              s->ckpt_flags != ckpt_flags)) ||
                              (driver_given && strcmp(s->driver, driver) != 0) ||
                              (mig_given && strcmp(s->mig_spec, mig_spec) != 0))) {
            /* Another configuration: replace it unless someone uses it. */
            lock_state(s);
            int busy = live_processes(s);
            pthread_mutex_unlock(&s->lock);
            if (!busy) {
                unlink(path);
                munmap(s, sizeof *s);
                close(fd);
                continue;
            }
        }
        /* The mapping holds the open file, and with it the flock: drop it.
         * The descriptor stays, to ask about other processes' slot locks. */
        flock(fd, LOCK_UN);
        g_check_fd = fd;
        return s;
    }
    errno = EAGAIN;
    return NULL;
}

static struct vgpu_sim_state *get_state(int as_is)
{
    struct vgpu_sim_state *s = __atomic_load_n(&g_state, __ATOMIC_ACQUIRE);
    if (s)
        return s;
    static int failed;
    pthread_mutex_lock(&g_open_lock);
    if (!g_state && !failed) {
        s = open_state(as_is);
        if (s)
            __atomic_store_n(&g_state, s, __ATOMIC_RELEASE);
        else
            failed = 1;
    }
    pthread_mutex_unlock(&g_open_lock);
    return g_state;
}

struct vgpu_sim_state *sim_state(void)
{
    return get_state(0);
}

struct vgpu_sim_state *sim_state_as_is(void)
{
    return get_state(1);
}

/* ---- device identity ---- */

static uint64_t splitmix64(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

/* A version-4 UUID of two seeds (its halves are their mixes). */
void sim_uuid_of(uint64_t seed_hi, uint64_t seed_lo, unsigned char out[16])
{
    uint64_t hi = splitmix64(seed_hi), lo = splitmix64(seed_lo);
    for (int i = 0; i < 8; i++) {
        out[i] = (unsigned char)(hi >> (56 - 8 * i));
        out[8 + i] = (unsigned char)(lo >> (56 - 8 * i));
    }
    out[6] = (unsigned char)((out[6] & 0x0f) | 0x40);
    out[8] = (unsigned char)((out[8] & 0x3f) | 0x80);
}

void sim_uuid_text(const char *prefix, const unsigned char u[16], char *out, size_t len)
{
    snprintf(out, len,
             "%s-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x",
             prefix, u[0], u[1], u[2], u[3], u[4], u[5], u[6], u[7], u[8], u[9], u[10], u[11],
             u[12], u[13], u[14], u[15]);
}

/* A version-4 UUID derived from the index alone: stable across processes and
 * runs, and distinct in its first hex digits so short UUID prefixes work in
 * CUDA_VISIBLE_DEVICES as they do with real GPUs. */
void sim_device_uuid(int index, unsigned char out[16])
{
    sim_uuid_of(0x5e1a000000000000ull + (uint64_t)index * 2,
                0x5e1a000000000001ull + (uint64_t)index * 2, out);
}

void sim_device_uuid_string(int index, char *out, size_t len)
{
    unsigned char u[16];
    sim_device_uuid(index, u);
    sim_uuid_text("GPU", u, out, len);
}

/* Bus of GPU i is i + 1 (bus 0 holds the host bridge on real machines).
 * NVML writes an 8-digit domain, the driver API a 4-digit one. */
void sim_device_bus_id(int index, char *out, size_t len, int nvml_form)
{
    snprintf(out, len, nvml_form ? "%08X:%02X:00.0" : "%04X:%02X:00.0", 0, index + 1);
}

/* ---- the driver ---- */

const char *sim_driver_version(void)
{
    struct vgpu_sim_state *s = sim_state();
    return s && s->driver[0] ? s->driver : SIM_DRIVER_VERSION;
}

int sim_cuda_version(void)
{
    struct vgpu_sim_state *s = sim_state();
    return s && s->cuda_version ? s->cuda_version : SIM_CUDA_VERSION;
}
