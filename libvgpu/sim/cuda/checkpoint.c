/*
 * checkpoint.c - the driver's checkpoint API (CUDA 12.8, driver R570; a
 * restore onto other GPUs since R580): a controlling process calls
 * cuCheckpointProcess{GetState,GetRestoreThreadId,Lock,Checkpoint,Restore,
 * Unlock} with another process's pid, and that process's restore thread
 * does the work. Both sides are here.
 *
 * As NVIDIA documents it (cuda.h 13.0, the cuda-checkpoint README):
 *   RUNNING --lock--> LOCKED --checkpoint--> CHECKPOINTED --restore--> LOCKED
 *   LOCKED --unlock--> RUNNING; any other order: CUDA_ERROR_ILLEGAL_STATE.
 *   lock: further CUDA calls of the process block (the API gate, gate.c);
 *     it waits for the calls in flight and the work already submitted, up
 *     to timeoutMs (0: for ever); past it, CUDA_ERROR_NOT_READY and the
 *     process is RUNNING again.
 *   checkpoint: the device memory's contents go to host memory and the
 *     GPUs' memory is given back (common/ckpt.c); managed memory and CUDA
 *     IPC memory (exported or opened) can't be checkpointed (R570):
 *     CUDA_ERROR_NOT_SUPPORTED, and the process is left
 *     FAILED ("does not attempt to keep the process in a good state"), or
 *     LOCKED with VGPU_SIM_CKPT_REFUSED=locked.
 *   restore: onto the same GPUs, or others through UUID pairs, which must
 *     list every checkpointed GPU (every GPU with VGPU_SIM_CKPT_PAIRS=all, as
 *     drivers were seen to require) with known UUIDs, each once, no two onto
 *     one: else CUDA_ERROR_INVALID_VALUE; a GPU without the room:
 *     CUDA_ERROR_OUT_OF_MEMORY, the process still CHECKPOINTED. The memory
 *     comes back at the same addresses; the process's devices are now the
 *     new GPUs (cuDeviceGetUuid says so).
 *   With VGPU_SIM_DRIVER older than R570 the entry points are not there
 *   (cuGetProcAddress does not know them; found with dlsym they answer
 *   CUDA_ERROR_NOT_SUPPORTED); before R580 a restore takes no UUID pairs
 *   (CUDA 12.8's restore arguments are all reserved: INVALID_VALUE).
 *   A pid that is not a live CUDA process (it never called cuInit):
 *   CUDA_ERROR_INVALID_VALUE; one the caller may not signal:
 *   CUDA_ERROR_NOT_PERMITTED; a caller that has not called cuInit:
 *   CUDA_ERROR_NOT_INITIALIZED.
 * Copies take the time VGPU_SIM_CKPT_RATE gives them (the state's
 * ckpt_rate): the memory is not copied here (it is host memory already),
 * only made inaccessible while checkpointed.
 *
 * The two processes talk through the process's slot in the shared state
 * (struct vgpu_sim_ckpt): the controller posts a request and wakes the
 * restore thread (a futex on `req`), which answers on `ans`.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <linux/futex.h>
#include <signal.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "alloctab.h"
#include "exec.h"
#include "gate.h"
#include "init.h"

enum { OP_LOCK = 1, OP_CHECKPOINT, OP_RESTORE, OP_UNLOCK };

#define POLL_NS 200000ull     /* how often a lock looks whether the process is quiet */
#define WATCH_NS 100000000ull /* how often a controller checks that its target lives */

static void sleep_ns(uint64_t ns)
{
    struct timespec ts = {.tv_sec = (time_t)(ns / 1000000000ull),
                          .tv_nsec = (long)(ns % 1000000000ull)};
    while (nanosleep(&ts, &ts) < 0 && errno == EINTR)
        ;
}

/* Wait while *addr == val (shared futex: the state file is mapped shared),
 * at most ns (0: no limit). */
static void futex_wait(uint32_t *addr, uint32_t val, uint64_t ns)
{
    struct timespec ts = {.tv_sec = (time_t)(ns / 1000000000ull),
                          .tv_nsec = (long)(ns % 1000000000ull)};
    syscall(SYS_futex, addr, FUTEX_WAIT, val, ns ? &ts : NULL, NULL, 0);
}

static void futex_wake(uint32_t *addr)
{
    syscall(SYS_futex, addr, FUTEX_WAKE, 0x7fffffff, NULL, NULL, 0);
}

static int all_zero(const void *p, size_t n)
{
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++)
        if (b[i])
            return 0;
    return 1;
}

/* ==== the process's side: its restore thread ==== */

static uint32_t get_state(struct vgpu_sim_ckpt *c)
{
    sim_lock(0);
    uint32_t st = c->state;
    sim_unlock();
    return st;
}

static void set_state(struct vgpu_sim_ckpt *c, uint32_t st)
{
    sim_lock(0);
    c->state = st;
    sim_unlock();
}

/* Copies of `bytes` take bytes / ckpt_rate: sleep what is left of that
 * since t0. */
static void copy_time(uint64_t bytes, uint64_t t0)
{
    uint64_t rate = sim_state()->ckpt_rate;
    if (!rate)
        return;
    uint64_t want = (uint64_t)((long double)bytes * 1e9L / (long double)rate);
    uint64_t spent = sim_now_ns() - t0;
    if (want > spent)
        sleep_ns(want - spent);
}

static CUresult do_lock(struct vgpu_sim_ckpt *c, uint32_t timeout_ms)
{
    if (get_state(c) != VGPU_SIM_CKPT_RUNNING)
        return CUDA_ERROR_ILLEGAL_STATE;
    gate_close();
    uint64_t deadline = timeout_ms ? sim_now_ns() + (uint64_t)timeout_ms * 1000000ull : 0;
    while (gate_in_flight() > 0 || !exec_idle()) {
        if (deadline && sim_now_ns() >= deadline) {
            gate_open();
            return CUDA_ERROR_NOT_READY;
        }
        sleep_ns(POLL_NS);
    }
    set_state(c, VGPU_SIM_CKPT_LOCKED);
    return CUDA_SUCCESS;
}

/* What R570 can't checkpoint: managed (UVM) memory, and IPC memory, the
 * exporter's (cuIpcGetMemHandle) or the importer's (cuIpcOpenMemHandle). */
static int refused(void)
{
    return mem_has_kind(ALLOC_MANAGED) || mem_has_kind(ALLOC_IPC) || mem_has_shared();
}

static CUresult do_checkpoint(int slot, struct vgpu_sim_ckpt *c)
{
    if (get_state(c) != VGPU_SIM_CKPT_LOCKED)
        return CUDA_ERROR_ILLEGAL_STATE;
    if (refused()) {
        int keep = sim_state()->ckpt_flags & VGPU_SIM_CKPT_F_REFUSED_LOCKED;
        set_state(c, keep ? VGPU_SIM_CKPT_LOCKED : VGPU_SIM_CKPT_FAILED);
        return CUDA_ERROR_NOT_SUPPORTED;
    }
    uint64_t t0 = sim_now_ns();
    exec_sync_ctx(NULL); /* submitted work, callbacks included (done by the lock) */
    mem_protect_device(1);
    uint64_t bytes = sim_ckpt_release(slot);
    copy_time(bytes, t0);
    set_state(c, VGPU_SIM_CKPT_CHECKPOINTED);
    return CUDA_SUCCESS;
}

static int gpu_of_uuid(const unsigned char uuid[16], int count)
{
    for (int i = 0; i < count; i++) {
        unsigned char u[16];
        sim_device_uuid(i, u);
        if (memcmp(u, uuid, 16) == 0)
            return i;
    }
    return -1;
}

static CUresult do_restore(int slot, struct vgpu_sim_ckpt *c)
{
    struct vgpu_sim_state *s = sim_state();
    unsigned char pairs[VGPU_SIM_MAX_DEVICES][2][16];
    uint32_t npairs;
    int used[VGPU_SIM_MAX_DEVICES];
    sim_lock(0);
    uint32_t st = c->state;
    npairs = c->npairs;
    memcpy(pairs, c->pairs, sizeof pairs);
    for (int d = 0; d < VGPU_SIM_MAX_DEVICES; d++)
        used[d] = c->held[d] || c->held_ctx[d];
    sim_unlock();
    if (st != VGPU_SIM_CKPT_CHECKPOINTED)
        return CUDA_ERROR_ILLEGAL_STATE;

    int count = (int)s->count;
    int map[VGPU_SIM_MAX_DEVICES], listed[VGPU_SIM_MAX_DEVICES] = {0};
    for (int d = 0; d < VGPU_SIM_MAX_DEVICES; d++)
        map[d] = d;
    for (uint32_t i = 0; i < npairs; i++) {
        int from = gpu_of_uuid(pairs[i][0], count), to = gpu_of_uuid(pairs[i][1], count);
        if (from < 0 || to < 0 || listed[from])
            return CUDA_ERROR_INVALID_VALUE;
        listed[from] = 1;
        map[from] = to;
    }
    if (npairs) {
        int all = s->ckpt_flags & VGPU_SIM_CKPT_F_PAIRS_ALL;
        for (int d = 0; d < count; d++)
            if ((used[d] || all) && !listed[d])
                return CUDA_ERROR_INVALID_VALUE;
        for (int a = 0; a < count; a++)
            for (int b = a + 1; b < count; b++)
                if (used[a] && used[b] && map[a] == map[b])
                    return CUDA_ERROR_INVALID_VALUE;
    }
    uint64_t t0 = sim_now_ns(), bytes;
    if (sim_ckpt_restore(slot, map, &bytes) < 0)
        return CUDA_ERROR_OUT_OF_MEMORY;
    for (int o = 0; o < cu_count; o++)
        cu_phys[o] = map[cu_phys[o]];
    mem_remap(map);
    copy_time(bytes, t0);
    mem_protect_device(0);
    set_state(c, VGPU_SIM_CKPT_LOCKED);
    return CUDA_SUCCESS;
}

static CUresult do_unlock(struct vgpu_sim_ckpt *c)
{
    if (get_state(c) != VGPU_SIM_CKPT_LOCKED)
        return CUDA_ERROR_ILLEGAL_STATE;
    set_state(c, VGPU_SIM_CKPT_RUNNING);
    gate_open();
    return CUDA_SUCCESS;
}

static void *restore_thread(void *arg)
{
    (void)arg;
    gate_exempt();
    struct vgpu_sim_state *s = sim_state();
    struct vgpu_sim_ckpt *c = NULL;
    uint32_t seen = 0;
    sim_lock(1);
    int slot = sim_self_slot();
    if (slot >= 0) {
        c = &s->procs[slot].ckpt;
        c->tid = (int32_t)syscall(SYS_gettid);
        c->state = VGPU_SIM_CKPT_RUNNING;
        seen = c->req;
    }
    sim_unlock();
    if (!c)
        return NULL; /* no slot: this process can't be checkpointed */
    for (;;) {
        uint32_t r = __atomic_load_n(&c->req, __ATOMIC_ACQUIRE);
        if (r == seen) {
            futex_wait(&c->req, seen, 0);
            continue;
        }
        seen = r;
        sim_lock(0);
        int op = c->op;
        uint32_t timeout_ms = c->timeout_ms;
        sim_unlock();
        CUresult rc;
        switch (op) {
        case OP_LOCK:
            rc = do_lock(c, timeout_ms);
            break;
        case OP_CHECKPOINT:
            rc = do_checkpoint(slot, c);
            break;
        case OP_RESTORE:
            rc = do_restore(slot, c);
            break;
        case OP_UNLOCK:
            rc = do_unlock(c);
            break;
        default:
            rc = CUDA_ERROR_INVALID_VALUE;
        }
        sim_lock(0);
        c->result = rc;
        __atomic_store_n(&c->ans, r, __ATOMIC_RELEASE);
        sim_unlock();
        futex_wake(&c->ans);
    }
    return NULL;
}

__attribute__((constructor)) static void register_restore_thread(void)
{
    gate_set_restore_thread(restore_thread);
}

/* ==== the controller's side ==== */

/* The slot of pid, a CUDA process this caller may control. */
static CUresult target(int pid, int *slot)
{
    if (!__atomic_load_n(&cu_initialized, __ATOMIC_ACQUIRE))
        return CUDA_ERROR_NOT_INITIALIZED;
    if (sim_cuda_version() < 12080)
        return CUDA_ERROR_NOT_SUPPORTED;
    if (pid <= 0)
        return CUDA_ERROR_INVALID_VALUE;
    struct vgpu_sim_state *s = sim_state();
    sim_lock(1);
    int i = sim_proc_slot(pid);
    int tid = i >= 0 ? s->procs[i].ckpt.tid : 0;
    sim_unlock();
    if (i < 0 || !tid)
        return CUDA_ERROR_INVALID_VALUE;
    if (kill(pid, 0) < 0 && errno == EPERM)
        return CUDA_ERROR_NOT_PERMITTED;
    *slot = i;
    return CUDA_SUCCESS;
}

static int gone(int32_t pid)
{
    return kill(pid, 0) < 0 && errno == ESRCH;
}

/* Post a request to pid's restore thread and wait for its answer. */
static CUresult ask(int pid, int slot, int op, uint32_t timeout_ms,
                    const CUcheckpointGpuPair *pairs, uint32_t npairs)
{
    struct vgpu_sim_state *s = sim_state();
    struct vgpu_sim_proc *p = &s->procs[slot];
    struct vgpu_sim_ckpt *c = &p->ckpt;
    int32_t me = (int32_t)getpid();
    uint32_t seq;
    for (;;) { /* one controller at a time */
        sim_lock(1);
        if (p->pid != pid || !c->tid) {
            sim_unlock();
            return CUDA_ERROR_INVALID_VALUE;
        }
        if (c->caller == 0 || gone(c->caller))
            break;
        sim_unlock();
        sleep_ns(1000000);
    }
    c->caller = me;
    c->op = op;
    c->timeout_ms = timeout_ms;
    c->npairs = npairs;
    for (uint32_t i = 0; i < npairs; i++) {
        memcpy(c->pairs[i][0], pairs[i].oldUuid.bytes, 16);
        memcpy(c->pairs[i][1], pairs[i].newUuid.bytes, 16);
    }
    seq = c->req + 1;
    __atomic_store_n(&c->req, seq, __ATOMIC_RELEASE);
    sim_unlock();
    futex_wake(&c->req);
    for (;;) {
        uint32_t a = __atomic_load_n(&c->ans, __ATOMIC_ACQUIRE);
        if (a == seq)
            break;
        futex_wait(&c->ans, a, WATCH_NS);
        sim_lock(1);
        int alive = p->pid == pid;
        sim_unlock();
        if (!alive)
            return CUDA_ERROR_INVALID_VALUE;
    }
    sim_lock(0);
    CUresult rc = (CUresult)c->result;
    c->caller = 0;
    sim_unlock();
    return rc;
}

VGPU_EXPORT CUresult cuCheckpointProcessGetState(int pid, CUprocessState *state)
{
    int slot;
    if (!state)
        return cu_initialized ? CUDA_ERROR_INVALID_VALUE : CUDA_ERROR_NOT_INITIALIZED;
    CUresult rc = target(pid, &slot);
    if (rc)
        return rc;
    *state = (CUprocessState)get_state(&sim_state()->procs[slot].ckpt);
    return CUDA_SUCCESS;
}

VGPU_EXPORT CUresult cuCheckpointProcessGetRestoreThreadId(int pid, int *tid)
{
    int slot;
    if (!tid)
        return cu_initialized ? CUDA_ERROR_INVALID_VALUE : CUDA_ERROR_NOT_INITIALIZED;
    CUresult rc = target(pid, &slot);
    if (rc)
        return rc;
    sim_lock(0);
    *tid = sim_state()->procs[slot].ckpt.tid;
    sim_unlock();
    return CUDA_SUCCESS;
}

VGPU_EXPORT CUresult cuCheckpointProcessLock(int pid, CUcheckpointLockArgs *args)
{
    int slot;
    CUresult rc = target(pid, &slot);
    if (rc)
        return rc;
    if (args && (args->reserved0 || !all_zero(args->reserved1, sizeof args->reserved1)))
        return CUDA_ERROR_INVALID_VALUE;
    return ask(pid, slot, OP_LOCK, args ? args->timeoutMs : 0, NULL, 0);
}

VGPU_EXPORT CUresult cuCheckpointProcessCheckpoint(int pid, CUcheckpointCheckpointArgs *args)
{
    int slot;
    CUresult rc = target(pid, &slot);
    if (rc)
        return rc;
    if (args && !all_zero(args, sizeof *args))
        return CUDA_ERROR_INVALID_VALUE;
    return ask(pid, slot, OP_CHECKPOINT, 0, NULL, 0);
}

VGPU_EXPORT CUresult cuCheckpointProcessRestore(int pid, CUcheckpointRestoreArgs *args)
{
    int slot;
    CUresult rc = target(pid, &slot);
    if (rc)
        return rc;
    const CUcheckpointGpuPair *pairs = NULL;
    uint32_t n = 0;
    if (args) {
        /* everything past the count is reserved: zero (CUDA 13.3's custom
         * storage pointer there is not offered by this driver) */
        const unsigned char *b = (const unsigned char *)args;
        size_t past = offsetof(CUcheckpointRestoreArgs, gpuPairsCount) + sizeof(unsigned int);
        if (!all_zero(b + past, sizeof *args - past))
            return CUDA_ERROR_INVALID_VALUE;
        n = args->gpuPairsCount;
        pairs = args->gpuPairs;
        if (n > VGPU_SIM_MAX_DEVICES || (n && !pairs) || (n && sim_cuda_version() < 13000))
            return CUDA_ERROR_INVALID_VALUE;
    }
    return ask(pid, slot, OP_RESTORE, 0, pairs, n);
}

VGPU_EXPORT CUresult cuCheckpointProcessUnlock(int pid, CUcheckpointUnlockArgs *args)
{
    int slot;
    CUresult rc = target(pid, &slot);
    if (rc)
        return rc;
    if (args && !all_zero(args, sizeof *args))
        return CUDA_ERROR_INVALID_VALUE;
    return ask(pid, slot, OP_UNLOCK, 0, NULL, 0);
}
