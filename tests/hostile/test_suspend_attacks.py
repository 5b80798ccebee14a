"""Suspend, resume and drain as another user would abuse them
(docs/security.md, "Suspend, resume and drain"): nobody may suspend, resume
or drain what is not theirs, and a job that names another user's process in
its region's slots does not get the daemon to stop that process."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from support.daemon import needs_native, read_line, wait_for
from support.hostile import in_child_as_nobody, retried_alloc, start_job_as_nobody
from support.sim import holding

from vgpuctl.client.connection import Client
from vgpuctl.system import native

pytestmark = needs_native

G = 1 << 30

# Root's process on the simulated GPU: 256 MiB, then holds.
VICTIM = """
ck(cu.cuInit(0))
ctx = ck(cu.cuDevicePrimaryCtxRetain(0)); ck(cu.cuCtxSetCurrent(ctx))
p = ck(cu.cuMemAlloc(256 << 20))
out({"pid": os.getpid()})
"""


def _node(daemon_factory):
    d = daemon_factory(gpus="1x16G")
    return d


def _env(d) -> dict[str, str]:
    env = {k: v for k, v in d.env.items() if k != "LD_PRELOAD"}
    env["PATH"] = "/usr/bin:/bin"
    return env


def _as_nobody(d, op: str, **fields):
    def go():
        with Client.connect(Path(d.socket)) as cl:
            try:
                return cl.call(op, **fields)
            except Exception as e:
                return {"error": type(e).__name__, "message": str(e)}
    return in_child_as_nobody(go)


def _checkpoint_state(d, pid: int) -> str:
    res = subprocess.run([*_vgpuctl(), "sim", "stats", "--json"], env=d.env,
                         capture_output=True, text=True, timeout=60, check=True)
    return next(p["checkpoint"] for p in json.loads(res.stdout)["processes"]
                if p["pid"] == pid)


def _vgpuctl() -> list[str]:
    from support.daemon import vgpuctl_argv
    return vgpuctl_argv()


def test_nobody_may_not_suspend_resume_or_drain_what_is_not_theirs(daemon_factory):
    d = _node(daemon_factory)
    with d.client() as c:
        job = c.call("run", command=["sleep", "600"], cwd="/", mem=G)["job"]
    for op, fields in (("suspend", {"job": job["id"]}), ("resume", {"job": job["id"]}),
                       ("drain", {"gpu": "0"})):
        got = _as_nobody(d, op, **fields)
        assert got["error"] == "PermissionDenied", (op, got)
    assert {g["index"]: g["drained"] for g in d.call("ps")["gpus"]} == {0: False}


def test_a_pid_a_job_writes_into_its_region_is_not_suspended(daemon_factory):
    """nobody's job names root's CUDA process (its pid and start time) in a
    slot of its own region, then asks to suspend its job: root's process
    runs on, untouched."""
    d = _node(daemon_factory)
    env = {**d.env, "LD_LIBRARY_PATH": str(Path(_sim_libdir()))}
    with holding(env, VICTIM) as victim:
        pid = victim.report["pid"]
        start = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19])
        j = start_job_as_nobody(d.socket, ["sleep", "600"], _env(d), G, 100)
        region = d.runtime / "jobs" / j["job"]

        def poke():
            from vgpuctl.system.region import Region
            from vgpuctl.system.structs import ffi
            f = ffi()
            base = f.offsetof("struct vgpu_usage", "procs")
            reg = Region.open(region, writable_usage=True)
            try:
                reg.poke_usage(base, pid.to_bytes(4, "little"))
                reg.poke_usage(base + f.offsetof("struct vgpu_proc_slot", "start_time"),
                               start.to_bytes(8, "little"))
            finally:
                reg.close()
            return True
        assert in_child_as_nobody(poke)
        got = _as_nobody(d, "suspend", job=j["job"])
        # nothing of nobody's uses CUDA: nothing to suspend
        assert got.get("error") == "CheckpointError", got
        assert "no process using CUDA" in got["message"], got
        assert _checkpoint_state(d, pid) == "running"
        assert d.job(j["job"])["state"] == "running"


def _sim_libdir() -> str:
    from vgpuctl.system import native
    return str(native.sim_libdir())


def _mem_by_tag(d) -> dict[str, int]:
    res = subprocess.run([*_vgpuctl(), "sim", "stats", "--json"], env=d.env,
                         capture_output=True, text=True, timeout=60, check=True)
    return {t["name"]: sum(g.get("used", 0) for g in t["devices"])
            for t in json.loads(res.stdout)["tags"]}


def _job_with_a_second_process(d, flag: Path, alloc: str, hooked: bool, core: int | None,
                               priority: str | None = None) -> dict:
    """nobody's 8G job (tagged flag's name): a process holding 256M on the
    GPU, and once `flag` exists a second one allocating `alloc` (with the
    hook or past it); returned once the first is on the GPU."""
    os.chmod(flag.parent, 0o777)
    burn = str(native.burn_program())
    tag = flag.name
    script = (f"{burn} --alloc 256M --kernel-us 1000 --seconds 600 & "
              f"while [ ! -e {flag} ]; do sleep 0.05; done; "
              f"exec {burn} --alloc {alloc} --kernel-us 1000 --seconds 600")
    j = start_job_as_nobody(d.socket, ["sh", "-c", script], {**_env(d), "VGPU_SIM_TAG": tag},
                            8 * G, core, hooked=hooked, priority=priority)
    wait_for(lambda: _mem_by_tag(d).get(tag, 0) >= 256 << 20, 30,
             "the job's first process on the GPU")
    return j


def _ended_for_memory(d, job_id: str, state: str) -> None:
    """Wait for the watch to end the (suspended or preempted) job whose
    process took memory past its hook; it was for memory."""
    def ended() -> dict | None:
        x = next((x for x in d.jobs(all_jobs=True) if x["id"] == job_id), None)
        return x if x is not None and x["state"] == "ended" else None
    gone = wait_for(ended, 30, f"the watch to end the {state} job that took memory")
    assert any(v["kind"] == "memory" for v in gone["violations"]), gone


@pytest.mark.parametrize("hooked", [True, False], ids=["hooked", "bare"])
def test_a_suspended_job_takes_no_memory_back_hook_or_no_hook(daemon_factory, hooked):
    """nobody suspends their own 8G job, then a new process of it allocates
    6G: through the hook it is refused (a suspended job's books give it
    nothing), and past the hook the watch ends the job (the default
    `protect`), so the room the daemon gave away stays given."""
    d = _node(daemon_factory)
    flags = Path(tempfile.mkdtemp(prefix="vgpu-go-", dir="/tmp"))
    tag = f"suspended-{'hooked' if hooked else 'bare'}"
    flag = flags / tag
    try:
        j = _job_with_a_second_process(d, flag, "6G", hooked, 30)
        got = _as_nobody(d, "suspend", job=j["job"])
        assert got.get("outcome", {}).get("action") == "suspended", got
        assert _mem_by_tag(d).get(tag, 0) == 0
        flag.touch()
        if hooked:
            # the hook refuses the 6G: the new process ends, nothing taken
            wait_for(lambda: d.job(j["job"])["oom_refusals"], 30,
                     "the hook to refuse the suspended job's allocation")
            assert _mem_by_tag(d).get(tag, 0) < 1 << 30
            assert d.job(j["job"])["state"] == "suspended"
            d.call("kill", job=j["job"], signal=9)
        else:
            # past the hook: the watch sees it hold what its books don't give it
            _ended_for_memory(d, j["job"], "suspended")
        wait_for(lambda: _mem_by_tag(d).get(tag, 0) == 0, 30, "its memory back")
    finally:
        shutil.rmtree(flags, ignore_errors=True)


# Root's job that preempts: 11 GiB of its 12 GiB limit, tried until it succeeds.
PREEMPTOR = retried_alloc(11 * G)


@pytest.mark.parametrize("hooked", [True, False], ids=["hooked", "bare"])
def test_a_preempted_job_takes_no_memory_back_from_the_job_that_preempted_it(daemon_factory,
                                                                              hooked):
    """nobody's low 8G job is preempted by root's 12G job on a 16G GPU;
    then a new process of the low job allocates 5G (a preempted low job
    took 5 GiB back, and root's in-limit 11 GiB failed 11 times of 14):
    through the hook it is refused, past it the watch ends the job (the
    default `protect`), and root's 11 GiB succeeds."""
    d = _node(daemon_factory)
    flags = Path(tempfile.mkdtemp(prefix="vgpu-go-", dir="/tmp"))
    flag = flags / f"preempted-{'hooked' if hooked else 'bare'}"
    p = None
    try:
        j = _job_with_a_second_process(d, flag, "5G", hooked, None, priority="low")
        p = d.popen("run", "--mem", "12G", "--name", "preemptor", "--", sys.executable, "-c",
                    PREEMPTOR, stdin=subprocess.PIPE)
        assert read_line(p.stdout, timeout=60).strip() == "ready"
        assert d.job(j["job"])["state"] == "suspended"
        flag.touch()
        if hooked:
            wait_for(lambda: d.job(j["job"])["oom_refusals"], 30,
                     "the hook to refuse the preempted job's allocation")
        else:
            _ended_for_memory(d, j["job"], "preempted")
        assert p.stdin is not None
        p.stdin.write("\n")
        p.stdin.flush()
        assert read_line(p.stdout, timeout=60).split()[0] == "ok"
    finally:
        shutil.rmtree(flags, ignore_errors=True)
        if p is not None:
            p.kill()
            p.wait()
