"""Priority classes end to end: a real daemon on the simulated GPU, jobs
through `vgpuctl run`. What a job keeps in flight is the simulator's own
record (`vgpuctl sim stats`: each process's kernel time queued on its
device); no timing is asserted."""

from __future__ import annotations

import json
import pwd
import threading
import time
from pathlib import Path

import pytest
from support.daemon import needs_native, wait_for

from vgpuctl.core import classes
from vgpuctl.system import native
from vgpuctl.system.class_fields import read_class, read_signal
from vgpuctl.system.region import Region

from .test_e2e import as_user

pytestmark = needs_native

BURN = [str(native.burn_program()), "--kernel-us", "1000", "--inflight", "16"]


def queued_ms(daemon, pids) -> float:
    r = daemon.cli("sim", "stats", "--json")
    assert r.returncode == 0, r.stderr
    return sum(p["devices"][0].get("queued_ns", 0) for p in json.loads(r.stdout)["processes"]
               if p["pid"] in pids) / 1e6


def job_named(daemon, name: str) -> dict:
    return wait_for(lambda: next((j for j in daemon.jobs() if j["name"] == name and j["pids"]),
                                 None), what=f"job {name}")


def in_region(daemon, job: dict, read):
    """read(region) of the job's region, open for the call."""
    reg = Region.open(Path(daemon.runtime) / "jobs" / job["id"])
    try:
        return read(reg)
    finally:
        reg.close()


def fields_of(daemon, job: dict):
    return in_region(daemon, job, lambda reg: read_class(reg, 0))


def signal(daemon, job: dict):
    return in_region(daemon, job, lambda reg: read_signal(reg, 1))


def test_set_priority_takes_effect_on_a_running_job(daemon):
    """Two saturating trainers of one class each keep 16 ms queued; lowered
    to low, one keeps at most its budget in flight (nothing new while the
    other's work runs), and raised back by root it fills its queue again."""
    a = daemon.popen("run", "--gpu", "0", "--mem", "1G", "--name", "a", "--", *BURN,
                     "--seconds", "120")
    b = daemon.popen("run", "--gpu", "0", "--mem", "1G", "--name", "b", "--", *BURN,
                     "--seconds", "120")
    try:
        ja, jb = job_named(daemon, "a"), job_named(daemon, "b")
        wait_for(lambda: queued_ms(daemon, ja["pids"]) >= 8, 30, "a's queue to fill")
        assert fields_of(daemon, ja).hold == 0          # one class: the launch fast path
        r = daemon.cli("set", "a", "--priority", "low")
        assert r.returncode == 0, r.stderr
        assert r.stdout.strip().endswith("priority low")
        assert daemon.job(ja["id"])["priority"] == "low"
        c = fields_of(daemon, ja)
        assert (c.priority, c.hold) == (classes.RANK["low"], classes.HELD)
        assert [h[0] for h in c.holders] == [jb["id"]]
        assert fields_of(daemon, jb).hold == classes.SIGNAL
        wait_for(lambda: queued_ms(daemon, ja["pids"]) <= 1.0, 30, "a to be held")
        assert max(queued_ms(daemon, ja["pids"]) for _ in range(5)) <= 1.0
        assert queued_ms(daemon, jb["pids"]) >= 8
        r = daemon.cli("set", "a", "--priority", "normal")     # root may raise it
        assert r.returncode == 0, r.stderr
        assert fields_of(daemon, ja).hold == 0
        wait_for(lambda: queued_ms(daemon, ja["pids"]) >= 8, 30, "a's queue to fill again")
    finally:
        for p in (a, b):
            p.kill()
            p.wait()


def test_classes_and_promises_show_in_ps_status_and_refusals(daemon):
    p = daemon.popen("run", "--gpu", "0", "--mem", "1G", "--core", "60", "--priority", "high",
                     "--name", "h", "--", "sleep", "60")
    try:
        j = job_named(daemon, "h")
        assert (j["priority"], j["promised"], j["core"]) == ("high", True, 60)
        gpu0 = daemon.call("ps")["gpus"][0]
        assert (gpu0["core_promised"], gpu0["core_capacity"]) == (60, 100)
        r = daemon.cli("run", "--gpu", "0", "--mem", "1G", "--core", "50", "--", "true")
        assert r.returncode == 6 and len(r.stderr.splitlines()) == 1, r.stderr
        assert "40% of its compute unpromised" in r.stderr
        # a low job's share is a cap, no promise: it fits
        r = daemon.cli("run", "--gpu", "0", "--mem", "1G", "--core", "50", "--priority", "low",
                       "--", "true")
        assert r.returncode == 0, r.stderr
        r = daemon.cli("status")
        assert r.returncode == 0 and "60%" in r.stdout, r.stdout
        r = daemon.cli("ps", "--fields", "id,priority,promised", "--format", "csv")
        assert f"{j['id']},high,true" in r.stdout.replace(" ", ""), r.stdout
        # a share changed live is a promise too
        q = daemon.popen("run", "--gpu", "0", "--mem", "1G", "--core", "30", "--name", "n",
                         "--", "sleep", "60")
        jn = job_named(daemon, "n")
        r = daemon.cli("set", jn["id"], "--core", "50")
        assert r.returncode == 6 and len(r.stderr.splitlines()) == 1, r.stderr
        assert "60% of its 100% is promised to other jobs" in r.stderr
        assert daemon.job(jn["id"])["core"] == 30
        # lowered to low, the high job's share is a cap, no promise: room is made
        r = daemon.cli("set", j["id"], "--priority", "low")
        assert r.returncode == 0, r.stderr
        assert daemon.job(j["id"])["promised"] is False
        assert daemon.call("ps")["gpus"][0]["core_promised"] == 30
        r = daemon.cli("set", jn["id"], "--core", "50")
        assert r.returncode == 0, r.stderr
        q.kill()
        q.wait()
    finally:
        p.kill()
        p.wait()


def test_a_user_may_not_take_high_nor_raise_a_class(daemon):
    nobody = pwd.getpwnam("nobody")
    env = {**daemon.env, "HOME": "/nonexistent"}
    code, _, err = as_user(nobody, ["run", "--mem", "64M", "--priority", "high", "--", "true"],
                           env)
    assert code == 5 and len(err.splitlines()) == 1, err
    assert "may not run jobs of priority high" in err
    got: dict = {}
    t = threading.Thread(target=lambda: got.update(r=as_user(
        nobody, ["run", "--mem", "64M", "--priority", "low", "--name", "mine", "--",
                 "sleep", "30"], env)))
    t.start()
    try:
        j = job_named(daemon, "mine")
        code, _, err = as_user(nobody, ["set", j["id"], "--priority", "normal"], env)
        assert code == 5 and "only root may raise it" in err, err
        code, _, err = as_user(nobody, ["set", j["id"], "--priority", "low"], env)
        assert code == 0, err
        assert daemon.job(j["id"])["priority"] == "low"
    finally:
        daemon.cleanup_jobs()
        t.join(60)


# What a job of class low runs as another user before its work (the system
# Python, ctypes only): it tries to attach its limits (where its class is)
# for writing, to write, re-mode or remove the signal of the job that holds
# it back (its holder: saying it is idle would free it), and writes its own
# signal, claiming it launched just now and has work for an hour.
ATTACK = r"""
import ctypes, os, struct, sys, time
libc = ctypes.CDLL(None, use_errno=True)
libc.shmat.restype = ctypes.c_void_p
libc.shmat.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_int]
libc.shmctl.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_void_p]
FAILED = ctypes.c_void_p(-1).value

def ids(d):
    tag, version, *rest = open(d + "/region").read().split()
    return dict(zip(("limits", "usage", "signal"), map(int, rest)))

def attach(sid, writable):
    p = libc.shmat(sid, None, 0 if writable else 0o10000)
    return None if p in (None, FAILED) else p

mine, theirs = ids(os.environ["VGPU_REGION"]), ids(sys.argv[1])
print("limits:", "writable" if attach(mine["limits"], True) else "refused", flush=True)
print("their signal:", "writable" if attach(theirs["signal"], True) else "refused", flush=True)
ds = ctypes.create_string_buffer(256)
assert libc.shmctl(theirs["signal"], 2, ds) == 0          # IPC_STAT: anyone may
struct.pack_into("<I", ds, 20, 0o666)                    # shm_perm.mode
print("their mode:", "changed" if libc.shmctl(theirs["signal"], 1, ds) == 0 else "refused",
      flush=True)
print("their removal:", "done" if libc.shmctl(theirs["signal"], 0, None) == 0 else "refused",
      flush=True)
p = attach(mine["signal"], True)
now = time.monotonic_ns()
ctypes.memmove(p + 16, struct.pack("<QQ", now, now + 3600 * 10**9), 16)
print("signal: written", flush=True)
"""


def test_a_job_cannot_raise_its_class_by_writing_its_region(daemon):
    """A low job of another user that writes what it may write (its own
    signal) and tries its limits and its holder's signal holds back no one
    and frees itself of nothing: it may not write its limits nor its
    holder's signal (nor re-mode or remove it), the normal job beside it
    keeps its queue full and is held by nobody, and the low job is still
    held."""
    nobody = pwd.getpwnam("nobody")
    env = {**daemon.env, "HOME": "/nonexistent"}
    attack = Path(daemon.base) / "attack.py"       # where nobody may read it
    attack.write_text(ATTACK)
    attack.chmod(0o644)
    n = daemon.popen("run", "--gpu", "0", "--mem", "1G", "--name", "n", "--", *BURN,
                     "--seconds", "120")
    got: dict = {}
    t = None
    try:
        jn = job_named(daemon, "n")
        ndir = Path(daemon.runtime) / "jobs" / jn["id"]
        script = f"python3 {attack} {ndir} && exec {' '.join(BURN)} --seconds 30"
        t = threading.Thread(target=lambda: got.update(r=as_user(
            nobody, ["run", "--gpu", "0", "--mem", "1G", "--priority", "low", "--name", "l",
                     "--", "sh", "-c", script], env)))
        t.start()
        jl = job_named(daemon, "l")

        def forged() -> bool:
            sig = signal(daemon, jl)
            return sig is not None and sig[0].busy_until_ns > sig[0].last_launch_ns + 10**12
        wait_for(lambda: forged() or not t.is_alive(), 30, "the low job to write its signal")
        assert t.is_alive(), got

        def has_context() -> bool:
            r = json.loads(daemon.cli("sim", "stats", "--json").stdout)
            pids = set(daemon.job(jl["id"])["pids"])
            return any(p["pid"] in pids and p["devices"][0]["contexts"] for p in r["processes"])
        wait_for(has_context, 30, "the low job's context")
        cn, cl = fields_of(daemon, jn), fields_of(daemon, jl)
        assert (cl.priority, cl.hold) == (classes.RANK["low"], classes.HELD)
        assert [h[0] for h in cl.holders] == [jn["id"]]
        assert (cn.hold, cn.holders) == (classes.SIGNAL, ())     # heeds no one
        seen_n = [queued_ms(daemon, jn["pids"]) for _ in range(5)]
        seen_l = [queued_ms(daemon, daemon.job(jl["id"])["pids"]) for _ in range(5)]
        assert min(seen_n) >= 8, seen_n
        assert max(seen_l) <= 1.0, seen_l
        assert daemon.job(jl["id"])["priority"] == "low"
        assert daemon.job(jl["id"])["region_error"] is None
    finally:
        daemon.cleanup_jobs()
        n.kill()
        n.wait()
        if t is not None:
            t.join(60)
    code, out, err = got["r"]
    for line in ("limits: refused", "their signal: refused", "their mode: refused",
                 "their removal: refused", "signal: written"):
        assert line in out, (code, out, err)


# A normal job of another user that launches nothing and writes into its own
# signal every 10 ms that its work keeps the GPU busy for 50 ms more.
LIAR = r"""
import ctypes, os, struct, sys, time
libc = ctypes.CDLL(None, use_errno=True)
libc.shmat.restype = ctypes.c_void_p
libc.shmat.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_int]
tag, version, lid, uid, sid = open(os.environ["VGPU_REGION"] + "/region").read().split()
p = libc.shmat(int(sid), None, 0)
end = time.monotonic() + float(sys.argv[1])
while time.monotonic() < end:
    now = time.monotonic_ns()
    ctypes.memmove(p + 16, struct.pack("<QQ", now, now + 50_000_000), 16)
    time.sleep(0.01)
"""


@pytest.mark.slow
def test_a_signal_that_claims_work_the_gpu_does_not_run_is_not_believed(daemon_factory):
    """nobody's normal job runs nothing but says in its signal, every 10 ms,
    that its work keeps the GPU busy: root's low job beside it (which it
    took to 0 % for as long as it liked) is freed of it within seconds, and
    then has the idle GPU. An honest holder is believed: the low job stays
    held while root's normal burner runs (test_a_job_cannot_raise...)."""
    from support.sim import busy_by_tag

    d = daemon_factory(gpus="1x16G")
    nobody = pwd.getpwnam("nobody")
    liar = Path(d.base) / "liar.py"
    liar.write_text(LIAR)
    liar.chmod(0o644)
    low = d.popen("run", "--mem", "1G", "--priority", "low", "--name", "low", "--", *BURN,
                  "--seconds", "120", env={"VGPU_SIM_TAG": "low"})
    got: dict = {}
    t = threading.Thread(target=lambda: got.update(r=as_user(
        nobody, ["run", "--mem", "256M", "--name", "liar", "--", "python3", str(liar), "60"],
        {**d.env, "HOME": "/nonexistent"})))
    try:
        jl = job_named(d, "low")
        t.start()
        jliar = job_named(d, "liar")
        wait_for(lambda: [h[0] for h in fields_of(d, jl).holders] == [jliar["id"]], 30,
                 "the low job to heed the liar")
        wait_for(lambda: fields_of(d, jl).holders == (), 30,
                 "the daemon to stop believing the liar's signal")
        a, t0 = busy_by_tag(d.env).get("low", 0.0), time.monotonic()
        wait_for(lambda: time.monotonic() - t0 >= 2.0, 10, "a 2 s window")
        share = (busy_by_tag(d.env)["low"] - a) / (time.monotonic() - t0)
        assert share >= 0.8, share
        assert "its signal claims the GPU busy far more than the GPU is" in d.log.read_text()
    finally:
        d.cleanup_jobs()
        low.kill()
        low.wait()
        t.join(60)


@pytest.mark.slow
@pytest.mark.parametrize("duty", [100, 30])
def test_an_honest_holder_stays_believed_under_cpu_load(daemon_factory, duty):
    """The other side of the rule above: a normal job that runs what its
    signal says (busy all the time, or 30 % of it in bursts), beside a low
    job, with 4 CPU-burning processes on the host, is believed throughout."""
    import subprocess
    import sys

    d = daemon_factory(gpus="1x16G")
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(4)]
    low = d.popen("run", "--mem", "1G", "--priority", "low", "--name", "low", "--", *BURN,
                  "--seconds", "120")
    normal = d.popen("run", "--mem", "1G", "--name", "normal", "--", *BURN, "--seconds", "120",
                     "--duty", str(duty), "--period-ms", "37")
    try:
        jl, jn = job_named(d, "low"), job_named(d, "normal")
        wait_for(lambda: [h[0] for h in fields_of(d, jl).holders] == [jn["id"]], 30,
                 "the low job to heed the normal one")
        t0 = time.monotonic()
        seen = []
        while time.monotonic() - t0 < 4.0:     # (the daemon judges a holder within 1 s)
            seen.append([h[0] for h in fields_of(d, jl).holders])
            time.sleep(0.1)
        assert all(s == [jn["id"]] for s in seen), seen
        assert "its signal claims" not in d.log.read_text()
    finally:
        for h in hogs:
            h.kill()
        d.cleanup_jobs()
        for p in (low, normal):
            p.kill()
            p.wait()
