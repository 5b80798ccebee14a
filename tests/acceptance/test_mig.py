"""Acceptance: a simulated H100 (80 GB) in MIG mode with 1g.10gb x3 and
3g.40gb x1. Jobs placed on MIG devices see exactly their device, through
CUDA and NVML; `--mem` holds inside one; two jobs at `--core 30 / 60` on the
3g.40gb device get their shares over their whole life, as the simulator's
own timeline records them; a job asking for more than a device has, or for
a MIG device beside another GPU, is refused in one line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

from support.daemon import needs_native, vgpuctl_argv, wait_for
from support.sim import busy_by_tag

from vgpuctl.system import native

pytestmark = needs_native

LAYOUT = "0=1g.10gb@0,1g.10gb@1,1g.10gb@2,3g.40gb@4"
# the MIG devices' indexes: 1 GPU, so 1 + 8 x 0 + each instance's start
SMALL, BIG = (1, 2, 3), 5

CLIENT = textwrap.dedent("""
    import json, os, sys
    from cuda.bindings import driver as cu
    import pynvml

    def ok(r):
        err, *rest = r if isinstance(r, tuple) else (r,)
        assert int(err) == 0, err
        return tuple(rest) if len(rest) > 1 else (rest[0] if rest else None)

    ok(cu.cuInit(0))
    n = ok(cu.cuDeviceGetCount())
    dev = ok(cu.cuDeviceGet(0))
    ctx = ok(cu.cuDevicePrimaryCtxRetain(dev))
    ok(cu.cuCtxSetCurrent(ctx))
    free, total = ok(cu.cuMemGetInfo())
    uuid = bytes(ok(cu.cuDeviceGetUuid(dev)).bytes)
    sms = ok(cu.cuDeviceGetAttribute(
        cu.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dev))
    got, ptrs = 0, []
    step = 256 << 20
    while got < (64 << 30):
        r = cu.cuMemAlloc(step)
        if int(r[0]) != 0:
            break
        ptrs.append(r[1]); got += step
    pynvml.nvmlInit()
    mig = os.environ["CUDA_VISIBLE_DEVICES"]
    h = pynvml.nvmlDeviceGetHandleByUUID(mig.encode())
    mem = pynvml.nvmlDeviceGetMemoryInfo(h)
    pids = [p.pid for p in pynvml.nvmlDeviceGetComputeRunningProcesses(h)]
    print(json.dumps({"count": n, "total": total, "uuid": uuid.hex(), "sms": sms,
                      "allocated": got, "nvml_total": mem.total, "nvml_pids": pids,
                      "pid": os.getpid(), "visible": mig}))
""")


def mig_daemon(daemon_factory, config: str = ""):
    d = daemon_factory(gpus="1x80G", config=config, start=False)
    d.env.update({"VGPU_SIM_MIG": LAYOUT, "VGPU_SIM_MIG_ADMIN": str(os.getuid())})
    return d.start()


def test_jobs_on_mig_devices_see_their_device_and_keep_their_limits(daemon_factory, tmp_path):
    d = mig_daemon(daemon_factory)
    gpus = json.loads(d.cli("gpus", "--format", "json").stdout)
    assert [(g["index"], g["parent"], g["mig"]) for g in gpus] == [
        (1, 0, "1g.10gb"), (2, 0, "1g.10gb"), (3, 0, "1g.10gb"), (BIG, 0, "3g.40gb")]
    assert all(g["uuid"].startswith("MIG-") for g in gpus)
    by_index = {g["index"]: g for g in gpus}

    client = tmp_path / "client.py"
    client.write_text(CLIENT)
    out = {}
    for gpu, mem in ((SMALL[1], "3G"), (BIG, "6G")):
        r = d.cli("run", "--gpu", str(gpu), "--mem", mem, "-q", "--", sys.executable,
                  str(client), timeout=120)
        assert r.returncode == 0, r.stderr
        out[gpu] = json.loads(r.stdout.strip().splitlines()[-1])
    for gpu, mem in ((SMALL[1], 3), (BIG, 6)):
        o = out[gpu]
        mig_uuid = by_index[gpu]["uuid"]
        # CUDA: the one MIG device it was given, at its limit
        assert o["count"] == 1 and o["visible"] == mig_uuid
        assert o["uuid"] == mig_uuid[4:].replace("-", "")
        assert o["total"] == mem << 30
        assert o["sms"] == (16 if gpu != BIG else 48)
        assert (mem << 30) - (512 << 20) <= o["allocated"] <= mem << 30
        # NVML: the device's view is the job's, and the job's process is on it
        assert o["nvml_total"] == mem << 30
        assert o["pid"] in o["nvml_pids"]


def test_a_job_bigger_than_a_mig_device_or_beside_another_is_refused(daemon_factory):
    d = mig_daemon(daemon_factory)
    for args, words in ((["--gpu", str(SMALL[0]), "--mem", "12G"], "no room"),
                        (["--mem", "50G"], "no room"),
                        (["--gpu", f"{SMALL[0]},{SMALL[1]}", "--mem", "1G"], "one MIG device"),
                        (["--gpus", "2", "--mem", "1G"], "MIG devices")):
        r = d.cli("run", *args, "--", "true")
        assert r.returncode != 0, args
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1 and words in lines[0] and "Traceback" not in r.stderr, r.stderr
    # the biggest request that fits goes where it fits
    r = d.cli("run", "--mem", "30G", "-q", "--", "sh", "-c", "echo $CUDA_VISIBLE_DEVICES")
    assert r.returncode == 0, r.stderr
    big = next(g for g in json.loads(d.cli("gpus", "--format", "json").stdout)
               if g["index"] == BIG)
    assert r.stdout.strip() == big["uuid"]


def test_two_jobs_on_a_mig_device_get_their_shares_over_their_life(daemon_factory):
    d = mig_daemon(daemon_factory)
    burn = native.burn_program()
    seconds = 20
    jobs = {tag: d.popen("run", "--gpu", str(BIG), "--mem", "1G", "--core", str(core),
                         "--policy", "hard", "--name", tag, "--",
                         "env", f"VGPU_SIM_TAG={tag}", str(burn), "--kernel-us", "1000",
                         "--seconds", str(seconds))
            for tag, core in (("j30", 30), ("j60", 60))}
    for j in jobs.values():
        assert j.wait(timeout=seconds + 60) == 0, j.stderr.read() if j.stderr else ""
    busy = busy_by_tag(d.env)
    shares = {t: 100 * busy[t] / seconds for t in jobs}
    print(f"whole-life shares on the 3g.40gb MIG device: {shares}", file=sys.stderr)
    assert abs(shares["j30"] - 30) <= 2 and abs(shares["j60"] - 60) <= 2, shares


def test_mig_devices_are_made_and_destroyed_and_outlive_a_daemon_restart(daemon_factory):
    config = '[mig]\nlayout = { 0 = ["1g.10gb@0", "1g.10gb@1", "1g.10gb@2", "3g.40gb@4"] }\n'
    d = mig_daemon(daemon_factory, config)
    shown = d.cli("mig")
    assert shown.returncode == 0, shown.stderr
    assert "MIG on" in shown.stdout and "3g.40gb@4" in shown.stdout

    made = d.cli("mig", "create", "0", "1g.10gb@3")
    assert made.returncode == 0, made.stderr
    assert made.stdout.startswith("GPU 4: MIG 1g.10gb@3"), made.stdout
    # the new device takes jobs at once
    job = d.popen("run", "--gpu", "4", "--mem", "1G", "--", str(native.burn_program()),
                  "--kernel-us", "1000", "--seconds", "60")
    running = d.running_job()
    assert running["gpus"] == [4]

    # no destroying it, nor turning MIG off, with a job on it
    for args in (["destroy", "4"], ["disable", "0"]):
        r = d.cli("mig", *args)
        lines = r.stderr.strip().splitlines()
        assert r.returncode != 0 and len(lines) == 1, r.stderr
        assert "job" in lines[0] or "instance" in lines[0], lines
    # a restart keeps the layout (nothing made twice) and the job on its device
    d.stop()
    d.start()
    again = json.loads(d.cli("gpus", "--format", "json").stdout)
    assert sorted(g["index"] for g in again) == [1, 2, 3, 4, BIG]
    assert d.job(running["id"])["gpus"] == [4]
    d.cli("kill", running["id"])
    job.wait(timeout=30)
    wait_for(lambda: not d.jobs(), 20, "the job to end")
    gone = d.cli("mig", "destroy", "4")
    assert gone.returncode == 0, gone.stderr
    assert sorted(g["index"] for g in json.loads(d.cli("gpus", "--format", "json").stdout)) \
        == [1, 2, 3, BIG]


def test_mig_changes_need_the_drivers_permission(daemon_factory):
    d = daemon_factory(gpus="1x80G", start=False)
    d.env.update({"VGPU_SIM_MIG": LAYOUT, "VGPU_SIM_MIG_ADMIN": str(os.getuid() + 1)})
    d.start()
    r = d.cli("mig", "create", "0", "1g.10gb@3")
    lines = r.stderr.strip().splitlines()
    assert r.returncode != 0 and len(lines) == 1 and "only root" in lines[0], r.stderr


def test_mig_works_with_no_daemon(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("VGPU_")}
    env.update({"VGPU_SIM": "1x80G", "VGPU_SIM_STATE": str(tmp_path / "sim"),
                "VGPU_SIM_MIG": "0=", "VGPU_SIM_MIG_ADMIN": str(os.getuid()),
                "VGPU_SOCKET": str(tmp_path / "none.sock")})
    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*vgpuctl_argv(), *args], env=env, capture_output=True,
                              text=True, timeout=60)
    r = cli("mig", "create", "0", "3g.40gb", "1g.10gb@6")
    assert r.returncode == 0, r.stderr
    assert [line.split(":")[0] for line in r.stdout.splitlines()] == ["GPU 1", "GPU 7"]
    listed = json.loads(cli("gpus", "--format", "json").stdout)
    assert [g["mig"] for g in listed] == ["3g.40gb", "1g.10gb"]
    assert cli("mig", "destroy", "1", "7").returncode == 0
    r = cli("mig", "disable", "0")
    assert r.returncode == 0 and "MIG off" in r.stdout, r.stderr
    assert Path(tmp_path / "sim").exists()


def test_a_job_on_a_mig_device_suspends_and_resumes_there(daemon_factory):
    """Suspend and resume keep a job on its MIG device. A move to another
    MIG device, which the driver refuses (the simulator's does: its restore
    takes the pairs of whole GPUs), leaves the job suspended where it was,
    in one line, and it resumes there after: never a record that points at
    a device its processes are not on (which the watch would end the job
    for)."""
    d = mig_daemon(daemon_factory)
    job = d.popen("run", "--gpu", str(SMALL[0]), "--mem", "1G", "--",
                  str(native.burn_program()), "--kernel-us", "1000", "--seconds", "60",
                  "--alloc", "256M")
    try:
        jid = d.running_job()["id"]
        assert d.cli("suspend", jid).returncode == 0
        moved = d.cli("resume", jid, "--gpu", str(SMALL[1]))
        lines = moved.stderr.strip().splitlines()
        assert moved.returncode != 0 and len(lines) == 1 and "stays suspended" in lines[0], \
            moved.stderr
        row = d.job(jid)
        assert row["state"] == "suspended" and row["gpus"] == [SMALL[0]]
        back = d.cli("resume", jid)
        assert back.returncode == 0, back.stderr
        row = d.job(jid)
        assert row["state"] == "running" and row["gpus"] == [SMALL[0]]
        # still alive a tick of the watch later, its memory where its record says
        wait_for(lambda: d.job(jid)["mem_used"] >= 256 << 20, 10, "its memory back")
        assert job.poll() is None
    finally:
        d.cleanup_jobs()
        job.wait(timeout=30)


def test_mig_mode_is_not_turned_on_under_a_job_nor_changed_by_a_user(daemon_factory):
    """MIG on for a whole GPU a job runs on is refused (CUDA would lose the
    GPU under it), and a user other than root may change nothing, whatever
    the driver would allow."""
    from support.hostile import in_child_as_nobody

    from vgpuctl.client.connection import Client

    d = daemon_factory(gpus="2x80G", start=False)
    d.env.update({"VGPU_SIM_MIG": "0=3g.40gb@4", "VGPU_SIM_MIG_ADMIN": str(os.getuid())})
    d.start()
    assert [g["index"] for g in json.loads(d.cli("gpus", "--format", "json").stdout)] == [1, 6]
    job = d.popen("run", "--gpu", "1", "--mem", "1G", "--", str(native.burn_program()),
                  "--kernel-us", "1000", "--seconds", "60")
    try:
        jid = d.running_job()["id"]
        r = d.cli("mig", "enable", "1")
        lines = r.stderr.strip().splitlines()
        assert r.returncode != 0 and len(lines) == 1 and f"({jid})" in lines[0], r.stderr
        assert "MIG off" in d.cli("mig").stdout.split("GPU 1:")[1].splitlines()[0]
    finally:
        d.cleanup_jobs()
        job.wait(timeout=30)

    def go():
        with Client.connect(Path(d.socket)) as cl:
            try:
                return cl.call("mig", action="destroy", gpu="6")
            except Exception as e:
                return {"error": str(e)}
    refused = in_child_as_nobody(go)
    assert "only root" in refused.get("error", ""), refused
    assert [g["index"] for g in json.loads(d.cli("gpus", "--format", "json").stdout)] == [1, 6]


def test_mig_devices_made_outside_vgpuctl_are_followed(daemon_factory, tmp_path):
    """A MIG device made or destroyed past the daemon (nvidia-smi; here
    `vgpuctl mig` straight to NVML) is taken on, or dropped, within a few
    inventories: jobs go to the new one, none to the gone one."""
    d = mig_daemon(daemon_factory)
    past = {"VGPU_SOCKET": str(tmp_path / "none.sock")}
    made = d.cli("mig", "create", "0", "1g.10gb@3", env=past)
    assert made.returncode == 0, made.stderr

    def indexes() -> list[int]:
        return [g["index"] for g in json.loads(d.cli("gpus", "--format", "json").stdout)]
    wait_for(lambda: 4 in indexes(), 30, "the daemon to take on the new MIG device")
    r = d.cli("run", "--gpu", "4", "--mem", "1G", "-q", "--", "true")
    assert r.returncode == 0, r.stderr
    wait_for(lambda: not d.jobs(), 20, "the job to end")
    gone = d.cli("mig", "destroy", "4", env=past)
    assert gone.returncode == 0, gone.stderr
    wait_for(lambda: 4 not in indexes(), 30, "the daemon to drop the destroyed MIG device")
    r = d.cli("run", "--gpu", "4", "--mem", "1G", "--", "true")
    assert r.returncode != 0 and "no GPU 4" in r.stderr, r.stderr
    assert "changed outside vgpuctl" in d.log.read_text()


def test_a_job_that_walks_past_its_hook_onto_another_mig_device_is_caught(daemon_factory):
    """NVML lists processes per MIG device: a job's process that goes past
    the hook (no LD_PRELOAD) to another MIG device than the job's is seen
    there, over the job's nothing, and the job is ended (the default
    on_violation)."""
    d = mig_daemon(daemon_factory)
    other = next(g["uuid"] for g in json.loads(d.cli("gpus", "--format", "json").stdout)
                 if g["index"] == SMALL[1])
    r = d.cli("run", "--gpu", str(SMALL[0]), "--mem", "1G", "--name", "walker", "--",
              "env", "-u", "LD_PRELOAD", f"CUDA_VISIBLE_DEVICES={other}",
              str(native.burn_program()), "--kernel-us", "1000", "--seconds", "30",
              "--alloc", "2G", timeout=60)
    assert r.returncode != 0
    ended = next(j for j in d.jobs(all_jobs=True) if j["name"] == "walker")
    assert ended["state"] == "ended" and ended["exit_signal"] == 9, ended
    assert f"on {other}, over the job's limit of 0 MiB" in d.log.read_text()
