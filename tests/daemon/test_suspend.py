"""Suspend, resume, move and drain through the daemon (docs/suspend.md), on
two simulated GPUs: a job holding 1 GiB of known contents is suspended (its
device memory back on the GPU, its CUDA calls held), resumed on the other
GPU with every byte intact and nothing left behind, and drained back; what
the job is shown as, billed for and counted on; and the jobs that can't be
suspended are refused and keep running."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from typing import Any

import pytest
from support.daemon import wait_for
from support.talk import Talker

G = 1 << 30
M = 1 << 20

# A job: holds SIZE bytes of known contents on its device (cuda-bindings),
# reports its pid, then answers "check" lines: whether every byte is still
# what it wrote, and which GPU it is on (its device 0's UUID).
JOB = r"""
import ctypes, json, os, sys, zlib
from cuda.bindings import driver as cu
def ck(r):
    if r[0] != cu.CUresult.CUDA_SUCCESS:
        raise SystemExit(f"driver call failed: {r[0]!r}")
    return r[1] if len(r) == 2 else None
SIZE = int(sys.argv[1])
MANAGED = "managed" in sys.argv[2:]       # a managed allocation too
IPC = "ipc" in sys.argv[2:]               # its memory exported for CUDA IPC
HOLD = "hold" in sys.argv[2:]             # hold and sleep (stdin is not ours)
SPIN = next((int(a[5:]) for a in sys.argv[2:] if a.startswith("spin=")), 0)
ck(cu.cuInit(0))
ctx = ck(cu.cuDevicePrimaryCtxRetain(0)); ck(cu.cuCtxSetCurrent(ctx))
data = os.urandom(1 << 20) * (SIZE >> 20)
want = zlib.crc32(data)
p = ck(cu.cuMemAlloc(SIZE))
ck(cu.cuMemcpyHtoD(p, data, SIZE))
del data
if MANAGED:
    ck(cu.cuMemAllocManaged(1 << 20, 1))
if IPC:
    ck(cu.cuIpcGetMemHandle(p))
if SPIN:    # work queued for SPIN ns (a kernel the simulator runs that long)
    ptx = b".version 7.0\n.target sm_50\n.address_size 64\n" \
          b".visible .entry vgpu_spin(.param .u64 ns)\n{\n ret;\n}\n"
    fn = ck(cu.cuModuleGetFunction(ck(cu.cuModuleLoadData(ptx)), b"vgpu_spin"))
    ck(cu.cuLaunchKernel(fn, 1, 1, 1, 1, 1, 1, 0, 0, ((SPIN,), (ctypes.c_uint64,)), 0))
print(json.dumps({"pid": os.getpid(), "size": SIZE}), flush=True)
if HOLD:
    __import__("time").sleep(3600)
back = bytearray(SIZE)
for line in sys.stdin:
    if line.strip() == "nvml":     # what NVML shows it of each GPU (through the hook)
        import pynvml
        pynvml.nvmlInit()
        seen = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            seen.append({"total": pynvml.nvmlDeviceGetMemoryInfo(h).total,
                         "pids": [q.pid for q in pynvml.nvmlDeviceGetComputeRunningProcesses(h)]})
        print(json.dumps(seen), flush=True)
        continue
    ck(cu.cuMemcpyDtoH(back, p, SIZE))
    uuid = "GPU-" + str(__import__("uuid").UUID(bytes=bytes(ck(cu.cuDeviceGetUuid(0)).bytes)))
    print(json.dumps({"same": zlib.crc32(back) == want, "uuid": uuid}), flush=True)
"""


class Job(Talker):
    """A JOB under `vgpuctl run`, talked to through its stdin and stdout."""

    what = "the job"

    def __init__(self, daemon, *run_args: str, size: int = G, managed: bool = False,
                 ipc: bool = False):
        args = [str(size)] + (["managed"] if managed else []) + (["ipc"] if ipc else [])
        self.listen(daemon.popen("run", *run_args, "--", sys.executable, "-c", JOB, *args,
                                 stdin=subprocess.PIPE))
        self.pid = self.reply(120)["pid"]
        self.id = wait_for(lambda: next((j["id"] for j in daemon.jobs()
                                         if self.pid in j["pids"]), None),
                           30, "the job in ps")

    def ask(self) -> None:
        self.send("check")

    def nvml(self) -> Any:
        return self.talk("nvml")

    def check(self, timeout: float = 60) -> Any:
        self.ask()
        return self.reply(timeout)

    def close(self) -> None:
        try:
            os.kill(self.pid, 9)          # its command; `vgpuctl run` reports the end
        except ProcessLookupError:
            pass
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=30)


@pytest.fixture
def jobs():
    made: list[Job] = []

    def start(daemon, *args: str, **kw: Any) -> Job:
        j = Job(daemon, *args, **kw)
        made.append(j)
        return j
    yield start
    for j in made:
        j.close()


def sim(daemon) -> dict[str, Any]:
    res = daemon.cli("sim", "stats", "--json")
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout)


def used(daemon) -> list[int]:
    return [d["used"] for d in sim(daemon)["devices"]]


def uuids(daemon) -> list[str]:
    return [d["uuid"] for d in sim(daemon)["devices"]]


def ok(res: subprocess.CompletedProcess[str]) -> str:
    assert res.returncode == 0, (res.returncode, res.stdout, res.stderr)
    return res.stdout


# ---- acceptance: suspend, move, drain ----------------------------------------------

def test_suspend_resume_on_another_gpu_and_drain_back(daemon, jobs):
    j = jobs(daemon, "--mem", "2G", "--gpu", "0")
    held = used(daemon)[0]
    assert held >= G and used(daemon)[1] == 0
    assert j.check() == {"same": True, "uuid": uuids(daemon)[0]}

    out = ok(daemon.cli("suspend", j.id))
    assert f"job {j.id}: suspended" in out
    view = daemon.job(j.id)
    assert view["state"] == "suspended" and view["suspend_reason"] == "asked"
    assert used(daemon) == [0, 0]                          # its memory is back on the GPU
    proc = next(p for p in sim(daemon)["processes"] if p["pid"] == j.pid)
    assert proc["checkpoint"] == "checkpointed"
    assert sum(d["held"] for d in proc["devices"]) == held
    gpus = {g["index"]: g for g in daemon.call("ps")["gpus"]}
    assert gpus[0]["committed"] == 0 and gpus[0]["jobs"] == 0
    # its CUDA calls are held: a copy asked for now is answered after resume
    j.ask()
    ok(daemon.cli("ps"))                                  # (the daemon answers meanwhile)
    assert not j.pending()

    out = ok(daemon.cli("resume", j.id, "--gpu", "1", timeout=120))
    assert f"job {j.id}: moved to GPU 1" in out
    assert j.reply() == {"same": True, "uuid": uuids(daemon)[1]}   # every byte, on GPU 1
    assert used(daemon) == [0, held]                       # nothing left on GPU 0
    view = daemon.job(j.id)
    assert (view["state"], view["gpu"], view["gpu_uuid"]) == ("running", 1, uuids(daemon)[1])
    assert view["suspended_s"] > 0
    gpus = {g["index"]: g for g in daemon.call("ps")["gpus"]}
    assert gpus[1]["committed"] == 2 * G and gpus[0]["committed"] == 0

    out = ok(daemon.cli("drain", "1", timeout=120))
    assert "GPU 1: drained" in out and f"job {j.id}: moved to GPU 0" in out
    assert j.check() == {"same": True, "uuid": uuids(daemon)[0]}
    assert used(daemon) == [held, 0]
    assert daemon.job(j.id)["gpu"] == 0
    assert {g["index"]: g["drained"] for g in daemon.call("ps")["gpus"]} == {0: False, 1: True}
    # a drained GPU is marked where a person looks: gpus, status, their CSV
    assert ok(daemon.cli("gpus")).splitlines()[1].endswith("[drained]")
    assert "(drained)" in ok(daemon.cli("status"))
    assert ok(daemon.cli("gpus", "--format", "csv")).splitlines()[1:] == [
        f"0,{g['name']},{g['uuid']},false" if g["index"] == 0 else f"1,{g['name']},{g['uuid']},true"
        for g in daemon.call("ps")["gpus"]]
    # a GPU number that doesn't exist is an error, never read as a UUID prefix
    res = daemon.cli("drain", "7")
    assert res.returncode != 0 and "no GPU 7:" in res.stderr, res


# ---- what can't be suspended, and all or none --------------------------------------

def test_a_job_with_managed_memory_is_refused_and_keeps_running(daemon, jobs):
    j = jobs(daemon, "--mem", "2G", managed=True, size=64 * M)
    before = used(daemon)
    res = daemon.cli("suspend", j.id)
    assert res.returncode == 1, res
    assert res.stderr.startswith(f"vgpuctl: error: job {j.id} can't be suspended: process ")
    assert "managed memory" in res.stderr and "keeps running" in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1
    assert daemon.job(j.id)["state"] == "running" and used(daemon) == before
    assert j.check()["same"] is True
    # the driver was never asked: the process is as it was
    proc = next(p for p in sim(daemon)["processes"] if p["pid"] == j.pid)
    assert proc["checkpoint"] == "running"


def test_a_job_that_shares_memory_through_cuda_ipc_is_refused(daemon, jobs):
    j = jobs(daemon, "--mem", "2G", ipc=True, size=64 * M)
    res = daemon.cli("suspend", j.id)
    assert res.returncode == 1 and len(res.stderr.strip().splitlines()) == 1, res
    assert f"process {j.pid} shares memory through CUDA IPC" in res.stderr
    assert "keeps running" in res.stderr
    assert daemon.job(j.id)["state"] == "running" and j.check()["same"] is True


def _two_process_job(daemon, second: str) -> tuple[str, list[int]]:
    """A job of two processes (started in that order): the first hooked,
    holding 256 MiB; the second as `second` says (its arguments)."""
    py = sys.executable
    cmd = (f"{py} -c \"$JOB\" {256 * M} hold & sleep 0.2; {second} & wait")
    proc = daemon.popen("run", "--mem", "4G", "--gpu", "0", "--", "sh", "-c", cmd,
                        env={"JOB": JOB}, stdin=subprocess.DEVNULL)
    said: dict[int, int] = {}      # size -> pid (they may say it in any order)
    assert proc.stdout is not None
    while len(said) < 2:
        line = proc.stdout.readline()
        assert line, proc.stderr.read() if proc.stderr else ""
        said[json.loads(line)["size"]] = json.loads(line)["pid"]
    pids = [said[256 * M], next(p for s, p in said.items() if s != 256 * M)]
    jid = wait_for(lambda: next((j["id"] for j in daemon.jobs() if set(pids) <= set(j["pids"])),
                                None), 30, "the job's processes in ps")
    return jid, pids


@pytest.mark.parametrize("refused", ["locked", "failed"])
def test_a_failure_part_way_undoes_what_was_done(daemon_factory, refused):
    """The second process's managed memory is hidden from the hook (it runs
    without it): the driver refuses it at checkpoint, after the first was
    checkpointed. The first is restored and unlocked; the job runs on."""
    d = daemon_factory(start=False)
    d.env["VGPU_SIM_CKPT_REFUSED"] = refused
    d.start()
    jid, (a, b) = _two_process_job(
        d, f"env -u LD_PRELOAD {sys.executable} -c \"$JOB\" {64 * M} managed hold")
    before = used(d)
    res = d.cli("suspend", jid)
    assert res.returncode == 1 and len(res.stderr.strip().splitlines()) == 1, res
    assert f"job {jid} could not be suspended: process {b}: checkpoint failed " \
           "(CUDA_ERROR_NOT_SUPPORTED)" in res.stderr
    states = {p["pid"]: p["checkpoint"] for p in sim(d)["processes"]}
    assert states[a] == "running"
    if refused == "locked":
        assert "it keeps running" in res.stderr and states[b] == "running"
    else:
        assert f"process {b} is left failed by the driver" in res.stderr
        assert states[b] == "failed"
    assert used(d) == before                       # the first is back on its GPU
    assert d.job(jid)["state"] == "running"


def test_a_lock_that_times_out_undoes_the_other_locks(daemon_factory):
    d = daemon_factory(config="suspend_lock_timeout_s = 1\n")
    jid, (a, b) = _two_process_job(
        d, f"{sys.executable} -c \"$JOB\" {64 * M} spin=60000000000 hold")
    res = d.cli("suspend", jid)
    assert res.returncode == 1, res
    assert f"process {b}: lock failed (CUDA_ERROR_NOT_READY): its work did not finish " \
           "within 1 s (suspend_lock_timeout_s)" in res.stderr
    assert "it keeps running" in res.stderr
    states = {p["pid"]: p["checkpoint"] for p in sim(d)["processes"]}
    assert (states[a], states[b]) == ("running", "running")
    assert d.job(jid)["state"] == "running"


# ---- drivers ------------------------------------------------------------------------

def test_a_driver_before_r570_is_one_clear_line(daemon_factory, jobs):
    d = daemon_factory(start=False)
    d.env["VGPU_SIM_DRIVER"] = "550.54.15"
    d.start()
    j = jobs(d, "--mem", "1G", size=16 * M)
    res = d.cli("suspend", j.id)
    assert res.returncode == 9
    assert res.stderr == ("vgpuctl: error: suspend needs NVIDIA driver R570 or newer "
                          "(CUDA 12.8); this driver supports CUDA 12.4\n")
    assert d.job(j.id)["state"] == "running" and j.check()["same"] is True


def test_a_driver_before_r580_suspends_but_does_not_move(daemon_factory, jobs):
    d = daemon_factory(start=False)
    d.env["VGPU_SIM_DRIVER"] = "570.86.10"
    d.start()
    j = jobs(d, "--mem", "1G", "--gpu", "0", size=16 * M)
    ok(d.cli("suspend", j.id))
    res = d.cli("resume", j.id, "--gpu", "1")
    assert res.returncode == 9
    assert res.stderr == ("vgpuctl: error: moving a job to another GPU needs NVIDIA driver "
                          "R580 or newer (CUDA 13.0); this driver supports CUDA 12.8\n")
    assert d.job(j.id)["state"] == "suspended"
    ok(d.cli("resume", j.id))
    assert j.check() == {"same": True, "uuid": uuids(d)[0]}


# ---- records --------------------------------------------------------------------------

def test_time_suspended_is_recorded_and_not_billed(daemon, jobs):
    import sqlite3

    j = jobs(daemon, "--mem", "2G", size=256 * M)
    wait_for(lambda: daemon.job(j.id)["mem_used"], 30, "a reading of its memory")
    ok(daemon.cli("suspend", j.id))
    gap0 = time.time()
    wait_for(lambda: daemon.job(j.id)["suspended_s"] >= 1.5, 30, "1.5 s suspended")
    gap1 = time.time()
    ok(daemon.cli("resume", j.id))
    view = daemon.job(j.id)
    assert view["suspended_s"] >= gap1 - gap0
    wait_for(lambda: daemon.job(j.id)["suspended_s"] == view["suspended_s"], 5,
             "the suspended time to stop growing once resumed")
    j.close()
    wait_for(lambda: not daemon.jobs(), 30, "the job to end")
    ended = daemon.call("ps", job=j.id)["jobs"][0]
    assert ended["suspended_s"] == view["suspended_s"]
    db = sqlite3.connect(daemon.state / "vgpu.db")
    rows = db.execute("SELECT t0, t1, mem_gib_hours FROM usage WHERE job_id = ?",
                      (j.id,)).fetchall()
    db.close()
    assert rows and sum(r[2] for r in rows) > 0          # it was billed while it ran
    overlap = [r for r in rows if r[0] < gap1 and r[1] > gap0]
    assert overlap == [], f"rows cover the time it was suspended: {overlap}"


def test_a_suspended_job_outlives_a_daemon_restart(daemon, jobs):
    j = jobs(daemon, "--mem", "2G", size=64 * M)
    ok(daemon.cli("suspend", j.id))
    daemon.stop(9)
    daemon.start()
    view = daemon.job(j.id)
    assert view["state"] == "suspended"
    assert {g["index"]: g["committed"] for g in daemon.call("ps")["gpus"]}[view["gpu"]] == 0
    ok(daemon.cli("resume", j.id))
    assert j.check()["same"] is True
    assert daemon.job(j.id)["state"] == "running"


def test_ps_and_the_fields_say_suspended(daemon, jobs):
    j = jobs(daemon, "--mem", "2G", size=16 * M)
    ok(daemon.cli("suspend", j.id))
    table = ok(daemon.cli("ps"))
    row = next(line for line in table.splitlines() if line.split()[:1] == [j.id])
    assert "suspended" in row
    csv = ok(daemon.cli("ps", "--fields", "id,state,suspend_reason", "--format", "csv"))
    assert f"{j.id},suspended,asked" in csv
    ok(daemon.cli("resume", j.id))
    assert "suspended" not in next(line for line in ok(daemon.cli("ps")).splitlines()
                                   if line.split()[:1] == [j.id])


# ---- drains ----------------------------------------------------------------------------

def test_a_drain_leaves_a_suspended_job_suspended_and_it_resumes_elsewhere(daemon, jobs):
    j = jobs(daemon, "--mem", "2G", "--gpu", "1", size=64 * M)
    ok(daemon.cli("suspend", j.id))
    out = ok(daemon.cli("drain", "1"))
    assert f"job {j.id}" not in out
    view = daemon.job(j.id)
    assert (view["state"], view["suspend_reason"]) == ("suspended", "asked")
    res = daemon.cli("run", "--mem", "1G", "--gpu", "1", "--", "true")
    assert res.returncode == 6 and "GPU 1 is drained" in res.stderr, res
    assert "moved to GPU 0" in ok(daemon.cli("resume", j.id))     # not on the drained GPU
    assert j.check() == {"same": True, "uuid": uuids(daemon)[0]}
    assert "GPU 1: takes jobs again" in ok(daemon.cli("drain", "--undo", "1"))
    assert "GPU 1: was not drained; nothing to undo" in ok(daemon.cli("drain", "--undo", "1"))
    assert {g["index"]: g["drained"] for g in daemon.call("ps")["gpus"]} == {0: False, 1: False}


def test_a_job_no_gpu_has_room_for_waits_and_resumes_by_itself(daemon_factory, jobs):
    d = daemon_factory("2x4G")
    a = jobs(d, "--mem", "3G", "--gpu", "0", size=512 * M)
    b = jobs(d, "--mem", "3G", "--gpu", "1", size=16 * M)
    out = ok(d.cli("drain", "0"))
    assert f"job {a.id}: suspended" in out and "has no room to resume" in out
    view = d.job(a.id)
    assert (view["state"], view["suspend_reason"]) == ("suspended", "drained")
    b.close()                                       # room returns on GPU 1
    wait_for(lambda: d.job(a.id)["state"] == "running", 30, "the job to resume by itself")
    assert d.job(a.id)["gpu"] == 1
    assert a.check() == {"same": True, "uuid": uuids(d)[1]}


def test_the_jobs_limits_counters_and_nvml_view_follow_a_move(daemon, jobs):
    j = jobs(daemon, "--mem", "2G", "--gpu", "0", size=64 * M)
    # its context (300 MiB on the simulator) and its 64 MiB
    used_before = wait_for(lambda: (lambda u: u if u and u >= 364 * M else None)(
        daemon.job(j.id)["mem_used"]), 30, "a reading of its memory")
    seen = j.nvml()
    assert [g["total"] for g in seen] == [2 * G, 16 * G]    # its limit, on its GPU
    assert j.pid in seen[0]["pids"] and seen[1]["pids"] == []
    ok(daemon.cli("suspend", j.id))
    ok(daemon.cli("resume", j.id, "--gpu", "1"))
    seen = j.nvml()
    assert [g["total"] for g in seen] == [16 * G, 2 * G]    # the limit moved with it
    assert seen[0]["pids"] == [] and j.pid in seen[1]["pids"]
    # its counters go on where they were, and its limit holds on the new GPU
    wait_for(lambda: daemon.job(j.id)["gpu"] == 1, 10, "the record on GPU 1")
    assert daemon.job(j.id)["mem_used"] == used_before
    region = next(p for p in (daemon.runtime / "jobs").iterdir() if p.name == j.id)
    from vgpuctl.system.region import Region
    reg = Region.open(region)
    try:
        assert reg.devices()[0].uuid == uuids(daemon)[1]
    finally:
        reg.close()


def test_a_long_suspension_resumes_without_a_violation(daemon_factory, jobs):
    """A suspended job is held to no memory by the watch; its restore puts
    its memory back while its record still says suspended, and that is no
    violation (it once ended the job it was resuming). A slow copy (1G/s)
    makes the watch look while the memory comes back."""
    from vgpuctl.daemon.watch import SUSPENDED_GRACE_S

    d = daemon_factory("1x16G", start=False)
    d.env["VGPU_SIM_CKPT_RATE"] = "1G"
    d.start()
    j = jobs(d, "--mem", "4G", size=1536 * M)
    ok(d.cli("suspend", j.id, timeout=120))
    t0 = time.monotonic()
    wait_for(lambda: time.monotonic() - t0 > SUSPENDED_GRACE_S + 0.5, 10,
             "the suspension to outlast the watch's grace")
    ok(d.cli("resume", j.id, timeout=120))
    assert j.check() == {"same": True, "uuid": uuids(d)[0]}
    view = d.job(j.id)
    assert view["state"] == "running" and view["violations"] == [], view


def test_suspend_or_resume_of_an_ended_job_is_exit_4(daemon):
    """As docs/cli.md gives it (and as kill and set answer): a job that has
    ended is no job to act on, exit 4, one line."""
    with daemon.client() as c:
        job = c.call("run", command=["true"], cwd="/", mem=G)["job"]
        c.call("exited", job=job["id"], code=0)
    for verb in ("suspend", "resume"):
        res = daemon.cli(verb, job["id"])
        assert res.returncode == 4 and f"job {job['id']} has ended" in res.stderr, res
        assert len(res.stderr.strip().splitlines()) == 1


def test_a_plain_job_never_resumes_on_a_gpu_slurm_hands_out(daemon_factory, jobs):
    d = daemon_factory(config="[slurm]\ngpus = [1]\n")
    j = jobs(d, "--mem", "2G", size=16 * M)
    assert d.job(j.id)["gpu"] == 0
    ok(d.cli("suspend", j.id))
    res = d.cli("resume", j.id, "--gpu", "1")
    assert res.returncode == 6 and "GPU 1 is Slurm's" in res.stderr, res
    out = ok(d.cli("drain", "--undo", "0"))           # (nothing drained: a no-op)
    assert "GPU 0: was not drained; nothing to undo" in out
    ok(d.cli("resume", j.id))
    assert d.job(j.id)["gpu"] == 0 and j.check()["same"] is True


def test_a_job_on_two_gpus_is_suspended_whole_and_resumes_on_them(daemon, jobs):
    """A job of two GPUs (its process holds memory on its first): both GPUs'
    memory back while suspended, and it resumes on the same two."""
    j = jobs(daemon, "--gpus", "2", "--mem", "2G", size=64 * M)
    assert daemon.job(j.id)["gpus"] == [0, 1]
    before = used(daemon)
    ok(daemon.cli("suspend", j.id))
    assert used(daemon) == [0, 0]
    assert all(g["committed"] == 0 for g in daemon.call("ps")["gpus"])
    res = daemon.cli("resume", j.id, "--gpu", "1")
    assert res.returncode == 2 and "it resumes on them" in res.stderr, res
    ok(daemon.cli("resume", j.id))
    assert used(daemon) == before and daemon.job(j.id)["gpus"] == [0, 1]
    assert j.check()["same"] is True


# ---- memory preemption (docs/suspend.md, "Memory preemption") -------------------------

def _burn(*args: str) -> list[str]:
    from vgpuctl.system import native
    return [str(native.burn_program()), *args]


def test_a_high_job_takes_a_low_jobs_memory_and_the_low_job_comes_back(daemon_factory, jobs):
    daemon = daemon_factory("1x16G")
    low = jobs(daemon, "--priority", "low", "--mem", "10G", "--gpu", "0", size=G)
    held = used(daemon)[0]
    # 10G more does not fit beside it (16G less the 512M reserve): only by its memory
    res = daemon.cli("run", "--priority", "high", "--mem", "10G", "--gpu", "0", "--",
                     *_burn("--alloc", "9G", "--kernel-us", "100", "--count", "10"),
                     timeout=120)
    assert res.returncode == 0, res.stderr                  # admitted, and it ran
    assert json.loads(res.stdout.strip().splitlines()[-1])["kernels"] == 10
    assert f"job(s) {low.id} of class low on GPU 0 were suspended" in res.stderr
    # the high job has ended: the low one resumes by itself, every byte intact
    wait_for(lambda: daemon.job(low.id)["state"] == "running", 30, "the low job to resume")
    view = daemon.job(low.id)
    assert view["suspended_s"] > 0 and view["gpu"] == 0
    assert low.check() == {"same": True, "uuid": uuids(daemon)[0]}
    assert used(daemon)[0] == held
    # its owner's terminal was told, both times (not only the preempting job's)
    told = _stderr_until(low.proc, f"job {low.id} resumed on GPU 0")
    assert (f"vgpuctl: warning: job {low.id} suspended: a job of a higher class needed its "
            "memory on GPU 0; it resumes by itself when room returns") in told


def _stderr_until(proc: subprocess.Popen[str], needle: str, timeout: float = 30) -> str:
    """What proc wrote on stderr until needle shows; fails at the deadline."""
    import selectors

    assert proc.stderr is not None
    fd = proc.stderr.fileno()
    sel = selectors.DefaultSelector()
    sel.register(fd, selectors.EVENT_READ)
    got = b""
    deadline = time.monotonic() + timeout
    while needle.encode() not in got:
        left = deadline - time.monotonic()
        if left <= 0 or not sel.select(left):
            raise AssertionError(f"no {needle!r} on stderr within {timeout} s: {got!r}")
        chunk = os.read(fd, 65536)
        if not chunk:
            raise AssertionError(f"stderr closed before {needle!r}: {got!r}")
        got += chunk
    return got.decode()


def test_a_low_job_runs_a_while_between_preemptions(daemon_factory, jobs):
    """A loop of short jobs that each preempt a low job kept it suspended
    nearly all the time (1.4 % of the GPU, the GPU idle): a low job runs
    `preempt_min_run_s` after it resumes before it is preempted again; a
    job that needs its room meanwhile is refused, told when."""
    d = daemon_factory("1x16G", config="[priority]\npreempt_min_run_s = 600\n")
    low = jobs(d, "--priority", "low", "--mem", "10G", "--gpu", "0", size=G)
    short = ["run", "--mem", "10G", "--gpu", "0", "--", *_burn("--kernel-us", "100",
                                                                  "--count", "10")]
    res = d.cli(*short, timeout=120)
    assert res.returncode == 0 and f"job(s) {low.id} of class low" in res.stderr, res
    wait_for(lambda: d.job(low.id)["state"] == "running", 30, "the low job to resume")
    res = d.cli(*short, timeout=120)
    assert res.returncode == 6, res
    assert "may be preempted again" in res.stderr and f"{low.id} in " in res.stderr, res
    assert len(res.stderr.strip().splitlines()) == 1
    assert d.job(low.id)["state"] == "running" and low.check()["same"] is True


def test_a_preempted_job_resumes_at_once_where_another_gpu_has_room(daemon, jobs):
    low = jobs(daemon, "--priority", "low", "--mem", "10G", "--gpu", "0", size=G)
    p = daemon.popen("run", "--priority", "high", "--mem", "10G", "--gpu", "0", "--",
                     "sleep", "600", stdin=subprocess.DEVNULL)
    try:
        # GPU 1 has room: the low job goes on there while the high one runs
        wait_for(lambda: daemon.job(low.id)["gpu"] == 1 and
                 daemon.job(low.id)["state"] == "running", 30, "the low job on GPU 1")
        assert low.check() == {"same": True, "uuid": uuids(daemon)[1]}
        assert daemon.job(low.id)["suspended_s"] > 0
    finally:
        p.kill()
        p.wait(30)
        daemon.cleanup_jobs()


def test_the_fewest_low_jobs_are_suspended(daemon, jobs):
    a = jobs(daemon, "--priority", "low", "--mem", "6G", "--gpu", "0", size=16 * M)
    b = jobs(daemon, "--priority", "low", "--mem", "6G", "--gpu", "0", size=16 * M)
    p = daemon.popen("run", "--priority", "normal", "--mem", "8G", "--gpu", "0", "--",
                     "sleep", "600", stdin=subprocess.DEVNULL)
    try:
        wait_for(lambda: any(j["name"] == "sleep" and j["state"] == "running"
                             for j in daemon.jobs()), 60, "the normal job running")
        states = {daemon.job(a.id)["state"], daemon.job(b.id)["state"]}
        assert states == {"running", "suspended"}     # one of the two was enough
        victim = a if daemon.job(a.id)["state"] == "suspended" else b
        assert victim is b                           # the newest of equals
        assert daemon.job(b.id)["suspend_reason"] == "preempted"
    finally:
        p.kill()
        p.wait(30)
        daemon.cleanup_jobs()


def test_preemption_switched_off_refuses_as_before(daemon_factory, jobs):
    d = daemon_factory(config="[priority]\npreempt = false\n")
    low = jobs(d, "--priority", "low", "--mem", "10G", "--gpu", "0", size=16 * M)
    res = d.cli("run", "--priority", "high", "--mem", "10G", "--gpu", "0", "--", "true")
    assert res.returncode == 6 and "no room for 10G" in res.stderr, res
    assert d.job(low.id)["state"] == "running"


def test_a_job_low_jobs_cant_make_room_for_is_refused_and_suspends_none(daemon, jobs):
    low = jobs(daemon, "--priority", "low", "--mem", "2G", "--gpu", "0", size=16 * M)
    normal = daemon.popen("run", "--mem", "9G", "--gpu", "0", "--", "sleep", "600",
                          stdin=subprocess.DEVNULL)
    try:
        wait_for(lambda: any(j["name"] == "sleep" for j in daemon.jobs()), 60, "the job")
        res = daemon.cli("run", "--priority", "high", "--mem", "8G", "--gpu", "0", "--",
                         "true")
        assert res.returncode == 6 and "no room for 8G" in res.stderr, res
        assert daemon.job(low.id)["state"] == "running"
        # a low job never preempts
        res = daemon.cli("run", "--priority", "low", "--mem", "8G", "--gpu", "0", "--", "true")
        assert res.returncode == 6
        assert daemon.job(low.id)["state"] == "running"
    finally:
        normal.kill()
        normal.wait(30)
        daemon.cleanup_jobs()
