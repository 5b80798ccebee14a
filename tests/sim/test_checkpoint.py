"""The simulated driver's checkpoint API (cuCheckpointProcess*, CUDA 12.8,
driver R570; restore onto another GPU since R580), driven as NVIDIA's
clients drive it: a controlling process, through cuda-bindings, on another
process that uses the GPU. Each state transition and each error the driver
documents (cuda.h 13.0, the cuda-checkpoint README), the lock's wait and
timeout, the memory given back and put back (same GPU or another), at the
same addresses with the same contents, and what can't be checkpointed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

import pytest
from support.sim import SPIN_PTX, VGPUCTL, run_py, script
from support.talk import Talker

MiB = 1 << 20
GiB = 1 << 30

# A process on the simulated GPU that holds memory of known contents and
# answers commands on stdin with one JSON line each:
#   check        its memory still holds what it wrote; the UUID of its device 0
#   alloc N      cuMemAlloc(N) (then "done")           free   frees that
#   spin NS      queues a kernel of NS ns               sync   cuCtxSynchronize
TARGET = """
import hashlib
ck(cu.cuInit(0))
ctxs = {}
bufs = []          # (device, pointer, size, digest)
def on(dev):
    if dev not in ctxs:
        ctxs[dev] = ck(cu.cuDevicePrimaryCtxRetain(dev))
    ck(cu.cuCtxSetCurrent(ctxs[dev]))
for dev, size in HOLD:
    on(dev)
    p = ck(cu.cuMemAlloc(size))
    data = bytes((i * 131 + dev * 7 + size) % 251 for i in range(1 << 16)) * (size >> 16)
    ck(cu.cuMemcpyHtoD(p, data, size))
    bufs.append((dev, p, size, hashlib.sha256(data).hexdigest()))
managed = ck(cu.cuMemAllocManaged(1 << 20, 1)) if MANAGED else None
exported = ck(cu.cuIpcGetMemHandle(bufs[0][1])) if EXPORT else None
on(HOLD[0][0] if HOLD else 0)
mod = ck(cu.cuModuleLoadData(SPIN_PTX))
fn = ck(cu.cuModuleGetFunction(mod, b"vgpu_spin"))
extra = None
out({"pid": os.getpid(), "ptrs": [int(b[1]) for b in bufs],
     "ipc": ctypes.string_at(exported.getPtr(), 64).hex() if exported else None})
for line in sys.stdin:
    cmd = line.split()
    if cmd[0] == "check":
        same = []
        for dev, p, size, digest in bufs:
            on(dev)
            back = bytearray(size)
            ck(cu.cuMemcpyDtoH(back, p, size))
            same.append(hashlib.sha256(back).hexdigest() == digest)
        uuid = bytes(ck(cu.cuDeviceGetUuid(0)).bytes).hex()
        out({"same": same, "uuid": uuid})
    elif cmd[0] == "alloc":
        out({"calling": True})
        r = cu.cuMemAlloc(int(cmd[1]))
        extra = r[1] if r[0] == cu.CUresult.CUDA_SUCCESS else None
        out({"done": r[0].name})
    elif cmd[0] == "free":
        out({"done": cu.cuMemFree(extra)[0].name})
    elif cmd[0] == "spin":
        out({"done": cu.cuLaunchKernel(fn, 1, 1, 1, 1, 1, 1, 0, 0,
                                       ((int(cmd[1]),), (ctypes.c_uint64,)), 0)[0].name})
    elif cmd[0] == "open":      # another process's IPC handle
        h = cu.CUipcMemHandle()
        ctypes.memmove(h.getPtr(), bytes.fromhex(cmd[1]), 64)
        r = cu.cuIpcOpenMemHandle(h, cu.CUipcMem_flags.CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS)
        out({"done": r[0].name})
    elif cmd[0] == "sync":
        out({"done": cu.cuCtxSynchronize()[0].name})
"""

# The controller: runs `ops` on `pid` and reports [error name, value] each.
#   state | tid | lock[:ms] | checkpoint | restore | restore:A>B,C>D (device
#   indices; "X" for a UUID that names no GPU) | unlock
CONTROL = """
import uuid as uuidlib
def uuid_of(i):
    if i == "X":
        u = cu.CUuuid(); ctypes.memmove(u.getPtr(), uuidlib.uuid4().bytes, 16); return u
    return ck(cu.cuDeviceGetUuid(int(i)))
def run(op):
    name, _, arg = op.partition(":")
    if name == "state":
        r = cu.cuCheckpointProcessGetState(PID)
        return [r[0].name, r[1].name if r[0] == cu.CUresult.CUDA_SUCCESS else None]
    if name == "tid":
        r = cu.cuCheckpointProcessGetRestoreThreadId(PID)
        return [r[0].name, r[1]]
    if name == "lock":
        a = cu.CUcheckpointLockArgs()
        a.timeoutMs = int(arg or 0)
        t = time.monotonic()
        r = cu.cuCheckpointProcessLock(PID, a)
        return [r[0].name, time.monotonic() - t]
    if name == "checkpoint":
        t = time.monotonic()
        r = cu.cuCheckpointProcessCheckpoint(PID, None)
        return [r[0].name, time.monotonic() - t]
    if name == "restore":
        a = None
        if arg:
            pairs = []
            for p in arg.split(","):
                old, new = p.split(">")
                g = cu.CUcheckpointGpuPair(); g.oldUuid = uuid_of(old); g.newUuid = uuid_of(new)
                pairs.append(g)
            a = cu.CUcheckpointRestoreArgs(); a.gpuPairs = pairs; a.gpuPairsCount = len(pairs)
        r = cu.cuCheckpointProcessRestore(PID, a)
        return [r[0].name, None]
    if name == "unlock":
        return [cu.cuCheckpointProcessUnlock(PID, None)[0].name, None]
    raise SystemExit(f"unknown op {op}")
if INIT:
    ck(cu.cuInit(0))
out([run(op) for op in OPS])
"""


def control(env: dict[str, str], pid: int, *ops: str, init: bool = True) -> list[list[Any]]:
    return run_py(env, f"PID = {pid}\nOPS = {list(ops)!r}\nINIT = {init}\n", CONTROL)


def errors(results: list[list[Any]]) -> list[str]:
    return [r[0] for r in results]


class Target(Talker):
    """The TARGET program, running; talk() sends a command, reply() reads a line."""

    what = "the target"
    reply_s = 30.0

    def __init__(self, env: dict[str, str], hold: list[tuple[int, int]], managed: bool = False,
                 export: bool = False):
        code = script(f"HOLD = {hold!r}\nMANAGED = {managed}\nEXPORT = {export}\n"
                      f"SPIN_PTX = {SPIN_PTX!r}\n", TARGET)
        self.listen(subprocess.Popen([sys.executable, "-c", code], env=env,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True))
        first = self.reply(60)
        self.pid: int = first["pid"]
        self.ptrs: list[int] = first["ptrs"]
        self.ipc: str | None = first["ipc"]

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=30)


@pytest.fixture
def target(sim_env):
    made: list[Target] = []

    def start(hold: list[tuple[int, int]], managed: bool = False, env=None,
              export: bool = False) -> Target:
        t = Target(env or sim_env, hold, managed, export)
        made.append(t)
        return t

    yield start
    for t in made:
        t.close()


def stats(env: dict[str, str]) -> dict[str, Any]:
    res = subprocess.run([*VGPUCTL, "sim", "stats", "--json"], env=env, capture_output=True,
                         text=True, timeout=60, check=True)
    return json.loads(res.stdout)


def used(env: dict[str, str]) -> list[int]:
    return [d["used"] for d in stats(env)["devices"]]


def proc_of(env: dict[str, str], pid: int) -> dict[str, Any]:
    return next(p for p in stats(env)["processes"] if p["pid"] == pid)


def uuid_hex(env: dict[str, str], index: int) -> str:
    return next(d["uuid"] for d in stats(env)["devices"] if d["index"] == index) \
        .removeprefix("GPU-").replace("-", "")


# ---- the state machine ---------------------------------------------------------

def test_a_full_cycle_walks_the_documented_states(sim_env, target):
    t = target([(0, 64 * MiB)])
    r = control(sim_env, t.pid, "state", "tid", "lock:5000", "state", "checkpoint", "state",
                "restore", "state", "unlock", "state")
    assert errors(r) == ["CUDA_SUCCESS"] * 10
    states = [r[i][1] for i in (0, 3, 5, 7, 9)]
    assert states == ["CU_PROCESS_STATE_RUNNING", "CU_PROCESS_STATE_LOCKED",
                      "CU_PROCESS_STATE_CHECKPOINTED", "CU_PROCESS_STATE_LOCKED",
                      "CU_PROCESS_STATE_RUNNING"]
    # the restore thread is a thread of the process
    assert os.path.isdir(f"/proc/{t.pid}/task/{r[1][1]}")
    assert t.talk("check")["same"] == [True]


def test_each_operation_out_of_order_is_an_illegal_state(sim_env, target):
    t = target([(0, 16 * MiB)])
    r = control(sim_env, t.pid, "unlock", "checkpoint", "restore",       # running
                "lock", "lock", "restore",                                 # locked
                "checkpoint", "checkpoint", "unlock", "lock",              # checkpointed
                "restore", "unlock", "state")
    assert errors(r) == [
        "CUDA_ERROR_ILLEGAL_STATE", "CUDA_ERROR_ILLEGAL_STATE", "CUDA_ERROR_ILLEGAL_STATE",
        "CUDA_SUCCESS", "CUDA_ERROR_ILLEGAL_STATE", "CUDA_ERROR_ILLEGAL_STATE",
        "CUDA_SUCCESS", "CUDA_ERROR_ILLEGAL_STATE", "CUDA_ERROR_ILLEGAL_STATE",
        "CUDA_ERROR_ILLEGAL_STATE",
        "CUDA_SUCCESS", "CUDA_SUCCESS", "CUDA_SUCCESS"]
    assert r[-1][1] == "CU_PROCESS_STATE_RUNNING"
    assert t.talk("check")["same"] == [True]


def test_the_callers_own_mistakes(sim_env, target):
    t = target([(0, 16 * MiB)])
    # before cuInit
    assert errors(control(sim_env, t.pid, "state", "lock", init=False)) == \
        ["CUDA_ERROR_NOT_INITIALIZED"] * 2
    # a process that is no CUDA process, and one that is gone
    plain = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"],
                             stdin=subprocess.PIPE, env=sim_env)
    try:
        assert errors(control(sim_env, plain.pid, "state", "lock", "tid")) == \
            ["CUDA_ERROR_INVALID_VALUE"] * 3
    finally:
        plain.kill()
        plain.wait()
    assert errors(control(sim_env, plain.pid, "state")) == ["CUDA_ERROR_INVALID_VALUE"]
    # reserved fields must be zero
    out = run_py(sim_env, f"""
        lib = ctypes.CDLL("libcuda.so.1")
        lib.cuInit(0)
        lock = (ctypes.c_uint32 * 16)()
        lock[1] = 1                                   # reserved0
        restore = (ctypes.c_uint8 * 64)()
        restore[20] = 1                               # reserved
        state = ctypes.c_int(-1)
        out([lib.cuCheckpointProcessLock({t.pid}, lock),
             lib.cuCheckpointProcessRestore({t.pid}, restore),
             lib.cuCheckpointProcessGetState({t.pid}, ctypes.byref(state)), state.value])
    """)
    assert out == [1, 1, 0, 0]           # INVALID_VALUE twice; still RUNNING


# ---- the lock --------------------------------------------------------------------

def test_the_lock_waits_for_submitted_work_and_times_out(sim_env, target):
    t = target([(0, 16 * MiB)])
    assert t.talk("spin 3000000000") == {"done": "CUDA_SUCCESS"}   # 3 s of work queued
    r = control(sim_env, t.pid, "lock:200", "state")
    assert errors(r) == ["CUDA_ERROR_NOT_READY", "CUDA_SUCCESS"]
    assert r[0][1] >= 0.2
    assert r[1][1] == "CU_PROCESS_STATE_RUNNING"     # left running, as documented
    assert t.talk("alloc 1048576")["calling"] and t.reply()["done"] == "CUDA_SUCCESS"
    # no timeout: waits for the work, then holds
    r = control(sim_env, t.pid, "lock:0", "state", "unlock")
    assert errors(r) == ["CUDA_SUCCESS"] * 3
    assert r[1][1] == "CU_PROCESS_STATE_LOCKED"


def test_a_locked_process_calls_wait_until_it_is_unlocked(sim_env, target):
    t = target([(0, 16 * MiB)])
    before = proc_of(sim_env, t.pid)["devices"][0]["used"]
    assert errors(control(sim_env, t.pid, "lock:5000")) == ["CUDA_SUCCESS"]
    assert t.talk("alloc 67108864") == {"calling": True}
    # held through a checkpoint and a restore: it did not allocate meanwhile
    r = control(sim_env, t.pid, "checkpoint", "restore")
    assert errors(r) == ["CUDA_SUCCESS"] * 2
    assert proc_of(sim_env, t.pid)["devices"][0]["used"] == before
    assert not t.pending()
    assert errors(control(sim_env, t.pid, "unlock")) == ["CUDA_SUCCESS"]
    assert t.reply() == {"done": "CUDA_SUCCESS"}
    assert proc_of(sim_env, t.pid)["devices"][0]["used"] == before + 64 * MiB


# ---- checkpoint and restore ----------------------------------------------------------

def test_a_checkpoint_gives_the_memory_back_and_a_restore_takes_it_again(sim_env, target):
    t = target([(0, 1 * GiB)])
    held = proc_of(sim_env, t.pid)["devices"][0]["used"]
    assert held == 1 * GiB + 300 * MiB            # its allocation and its context
    assert used(sim_env) == [held, 0]
    assert errors(control(sim_env, t.pid, "lock", "checkpoint")) == ["CUDA_SUCCESS"] * 2
    p = proc_of(sim_env, t.pid)
    assert used(sim_env) == [0, 0]
    assert p["checkpoint"] == "checkpointed"
    assert [d["held"] for d in p["devices"]] == [held, 0]
    # NVML no longer sees it on the GPU
    nv = run_py(sim_env, """
        import pynvml
        pynvml.nvmlInit()
        h = pynvml.nvmlDeviceGetHandleByIndex(0)
        out([p.pid for p in pynvml.nvmlDeviceGetComputeRunningProcesses(h)])
    """)
    assert t.pid not in nv
    assert errors(control(sim_env, t.pid, "restore", "unlock")) == ["CUDA_SUCCESS"] * 2
    assert used(sim_env) == [held, 0]
    assert t.talk("check") == {"same": [True], "uuid": uuid_hex(sim_env, 0)}


def test_a_restore_onto_another_gpu_moves_everything(sim_env, target):
    t = target([(0, 256 * MiB)])
    held = used(sim_env)[0]
    r = control(sim_env, t.pid, "lock", "checkpoint", "restore:0>1", "unlock")
    assert errors(r) == ["CUDA_SUCCESS"] * 4
    assert used(sim_env) == [0, held]
    assert t.talk("check") == {"same": [True], "uuid": uuid_hex(sim_env, 1)}
    # what it allocates and frees now is on GPU 1
    assert t.talk("alloc 2097152")["calling"] and t.reply()["done"] == "CUDA_SUCCESS"
    assert used(sim_env) == [0, held + 2 * MiB]
    assert t.talk("free") == {"done": "CUDA_SUCCESS"}
    assert used(sim_env) == [0, held]


def test_restore_pairs_are_checked_as_the_driver_checks_them(sim_env, target):
    t = target([(0, 64 * MiB), (1, 64 * MiB)])      # memory on both GPUs
    r = control(sim_env, t.pid, "lock", "checkpoint",
                "restore:0>1",            # GPU 1 is checkpointed too, and not listed
                "restore:0>X,1>1",        # a UUID that names no GPU
                "restore:0>1,1>1",        # two GPUs onto one
                "restore:0>0,0>1,1>1",    # one GPU twice
                "state",
                "restore:0>1,1>0",        # a swap: fine
                "unlock")
    assert errors(r) == ["CUDA_SUCCESS", "CUDA_SUCCESS"] + ["CUDA_ERROR_INVALID_VALUE"] * 4 + \
        ["CUDA_SUCCESS"] * 3
    assert r[6][1] == "CU_PROCESS_STATE_CHECKPOINTED"
    assert t.talk("check")["same"] == [True, True]


def test_pairs_must_name_every_gpu_when_the_driver_wants_them_all(sim_env, target):
    sim_env["VGPU_SIM_CKPT_PAIRS"] = "all"
    t = target([(0, 64 * MiB)])
    r = control(sim_env, t.pid, "lock", "checkpoint", "restore:0>1", "restore:0>1,1>0",
                "unlock")
    assert errors(r) == ["CUDA_SUCCESS", "CUDA_SUCCESS", "CUDA_ERROR_INVALID_VALUE",
                         "CUDA_SUCCESS", "CUDA_SUCCESS"]
    assert t.talk("check") == {"same": [True], "uuid": uuid_hex(sim_env, 1)}


def test_a_restore_without_room_fails_and_stays_checkpointed(sim_env, target):
    sim_env["VGPU_SIM"] = "2x1G"                   # (small: the data is checked byte for byte)
    t = target([(0, 640 * MiB)])                   # and a context of 300M
    assert errors(control(sim_env, t.pid, "lock", "checkpoint")) == ["CUDA_SUCCESS"] * 2
    other = target([(1, 640 * MiB)])               # GPU 1 fills up meanwhile
    r = control(sim_env, t.pid, "restore:0>1", "state", "restore", "unlock")
    assert errors(r) == ["CUDA_ERROR_OUT_OF_MEMORY", "CUDA_SUCCESS", "CUDA_SUCCESS",
                         "CUDA_SUCCESS"]
    assert r[1][1] == "CU_PROCESS_STATE_CHECKPOINTED"
    assert t.talk("check")["same"] == [True]
    other.close()


def test_copies_take_the_time_the_copy_rate_gives_them(sim_env, target):
    sim_env["VGPU_SIM_CKPT_RATE"] = "1G"        # 1 GiB/s each way
    t = target([(0, 512 * MiB)])
    r = control(sim_env, t.pid, "lock", "checkpoint", "restore", "unlock")
    assert errors(r) == ["CUDA_SUCCESS"] * 4
    assert r[1][1] >= (512 + 300) / 1024          # memory and context, at 1 GiB/s


# ---- what can't be checkpointed -----------------------------------------------------

def test_managed_memory_is_refused_and_the_process_is_left_failed(sim_env, target):
    t = target([(0, 16 * MiB)], managed=True)
    r = control(sim_env, t.pid, "lock", "checkpoint", "state", "unlock", "lock")
    assert errors(r) == ["CUDA_SUCCESS", "CUDA_ERROR_NOT_SUPPORTED", "CUDA_SUCCESS",
                         "CUDA_ERROR_ILLEGAL_STATE", "CUDA_ERROR_ILLEGAL_STATE"]
    assert r[2][1] == "CU_PROCESS_STATE_FAILED"
    assert used(sim_env)[0] > 0                   # nothing was given back


def test_managed_memory_refused_can_leave_the_process_locked(sim_env, target):
    sim_env["VGPU_SIM_CKPT_REFUSED"] = "locked"
    t = target([(0, 16 * MiB)], managed=True)
    r = control(sim_env, t.pid, "lock", "checkpoint", "state", "unlock")
    assert errors(r) == ["CUDA_SUCCESS", "CUDA_ERROR_NOT_SUPPORTED", "CUDA_SUCCESS",
                         "CUDA_SUCCESS"]
    assert r[2][1] == "CU_PROCESS_STATE_LOCKED"
    assert t.talk("check")["same"] == [True]


def test_ipc_memory_is_refused_on_both_sides(sim_env, target):
    """R570 checkpoints no CUDA IPC memory: neither the exporter's nor the
    importer's process."""
    sim_env["VGPU_SIM_CKPT_REFUSED"] = "locked"
    exporter = target([(0, 16 * MiB)], export=True)
    importer = target([(0, 16 * MiB)])
    assert importer.talk(f"open {exporter.ipc}") == {"done": "CUDA_SUCCESS"}
    plain = target([(0, 16 * MiB)])
    for t in (exporter, importer):
        r = control(sim_env, t.pid, "lock", "checkpoint", "unlock")
        assert errors(r) == ["CUDA_SUCCESS", "CUDA_ERROR_NOT_SUPPORTED", "CUDA_SUCCESS"], t.pid
        assert t.talk("check")["same"] == [True]
    r = control(sim_env, plain.pid, "lock", "checkpoint", "restore", "unlock")
    assert errors(r) == ["CUDA_SUCCESS"] * 4


def test_controllers_take_turns(sim_env, target):
    """Two controllers at once: every request is answered, one at a time, and
    the answers add up to the state the process ends in."""
    t = target([(0, 64 * MiB)])
    snippet = f"PID = {t.pid}\nOPS = {['lock:0', 'unlock'] * 20!r}\nINIT = True\n"
    procs = [subprocess.Popen([sys.executable, "-c", script(snippet, CONTROL)], env=sim_env,
                              stdout=subprocess.PIPE, text=True) for _ in range(2)]
    answers = [r for p in procs for r in json.loads(p.communicate(timeout=120)[0].splitlines()[-1])]
    assert len(answers) == 80
    assert set(errors(answers)) <= {"CUDA_SUCCESS", "CUDA_ERROR_ILLEGAL_STATE"}
    locks = sum(1 for i, r in enumerate(answers) if i % 2 == 0 and r[0] == "CUDA_SUCCESS")
    unlocks = sum(1 for i, r in enumerate(answers) if i % 2 == 1 and r[0] == "CUDA_SUCCESS")
    state = control(sim_env, t.pid, "state")[0][1]
    assert (locks - unlocks, state) in {(0, "CU_PROCESS_STATE_RUNNING"),
                                        (1, "CU_PROCESS_STATE_LOCKED")}
    if state == "CU_PROCESS_STATE_LOCKED":
        control(sim_env, t.pid, "unlock")
    assert t.talk("check")["same"] == [True]


# ---- older drivers ------------------------------------------------------------------

def test_a_driver_before_r570_has_no_checkpoint_api(sim_env, target):
    sim_env["VGPU_SIM_DRIVER"] = "550.54.15"
    t = target([(0, 16 * MiB)])
    out = run_py(sim_env, f"""
        lib = ctypes.CDLL("libcuda.so.1")
        lib.cuInit(0)
        v = ctypes.c_int(); lib.cuDriverGetVersion(ctypes.byref(v))
        fn, st = ctypes.c_void_p(), ctypes.c_int(-1)
        rc = lib.cuGetProcAddress_v2(b"cuCheckpointProcessLock", ctypes.byref(fn), 12080,
                                     ctypes.c_uint64(0), ctypes.byref(st))
        state = ctypes.c_int(-1)
        import pynvml
        pynvml.nvmlInit()
        out([v.value, rc, st.value, lib.cuCheckpointProcessGetState({t.pid}, ctypes.byref(state)),
             pynvml.nvmlSystemGetDriverVersion(), pynvml.nvmlSystemGetCudaDriverVersion()])
    """)
    # CUDA 12.4; NOT_FOUND, SYMBOL_NOT_FOUND; dlsym'd anyway: NOT_SUPPORTED
    assert out == [12040, 500, 1, 801, "550.54.15", 12040]


def test_a_driver_before_r580_restores_only_in_place(sim_env, target):
    sim_env["VGPU_SIM_DRIVER"] = "570.86.10"
    t = target([(0, 16 * MiB)])
    r = control(sim_env, t.pid, "lock", "checkpoint", "restore:0>1", "restore", "unlock")
    assert errors(r) == ["CUDA_SUCCESS", "CUDA_SUCCESS", "CUDA_ERROR_INVALID_VALUE",
                         "CUDA_SUCCESS", "CUDA_SUCCESS"]
    assert t.talk("check") == {"same": [True], "uuid": uuid_hex(sim_env, 0)}
