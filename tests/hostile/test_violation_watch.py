"""The daemon's violation watch (issue 11, part B), attacked: processes that
walk past the hook (`env -u LD_PRELOAD`, which stands for every bypass of a
preload library: dlmopen, static links, a rewritten usage file) are caught
from NVML's per-process figures every tick, unasked, recorded in the job
(`violations` in `ps --json`), the log and the metrics, and killed with
on_violation = "kill"."""

from __future__ import annotations

import json
import re
import signal
import socket
import subprocess
import sys
import urllib.request

import pytest
from support.daemon import kill_and_reap, needs_native, read_line, wait_for
from support.sim import HOLD_1G_ON_GPU1, holding

from vgpuctl.system import native, sim
from vgpuctl.system.region import Region

pytestmark = needs_native

G = 1 << 30
CTX = 300 << 20     # the simulated context's own memory (SIM_DEFAULT_CTX_MEM)
# Seconds the watch has, from a process's overrun to its record: the
# acceptance's 2 s, with room for a loaded test machine (the figure itself is
# bench/violation_latency.py's).
CAUGHT_S = 10.0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _burn(*args: str) -> list[str]:
    """vgpu-burn with the hook taken out of its environment."""
    return ["env", "-u", "LD_PRELOAD", str(native.burn_program()), *args]


def _metric(port: int, name: str, **labels: str) -> float | None:
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        text = r.read().decode()
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                return float(s.value)
    return None


def _violations(daemon, job_id: str, kind: str) -> list[dict]:
    return [v for v in daemon.job(job_id)["violations"] if v["kind"] == kind]


def _job_of(daemon, p: subprocess.Popen) -> dict:
    return wait_for(lambda: next((j for j in daemon.jobs() if j["state"] == "running"), None),
                    timeout=20, what="the job to run") if p.poll() is None else {}


def test_unhooked_process_over_its_jobs_limit_is_recorded_logged_and_counted(daemon_factory):
    port = _free_port()
    d = daemon_factory(config=f'metrics_address = "127.0.0.1:{port}"\n'
                              'on_violation = "report"\n')
    p = d.popen("run", "--mem", "1G", "--core", "100", "--",
                *_burn("--alloc", "2G", "--kernel-us", "100", "--seconds", "120"))
    try:
        job = _job_of(d, p)
        found = wait_for(lambda: _violations(d, job["id"], "memory"), timeout=CAUGHT_S,
                         what="a memory violation in ps --json")
        v = found[0]
        assert v["job"] == job["id"] and v["action"] == "reported"
        assert v["value"] > G and v["limit"] == G
        assert v["pid"] in d.job(job["id"])["pids"]
        assert d.job(job["id"])["over_limit"] is True
        # `vgpuctl ps --json` shows it as the daemon records it.
        shown = json.loads(d.cli("ps", "--json").stdout)
        assert shown["jobs"][0]["violations"][0]["pid"] == v["pid"]
        csv = d.cli("ps", "--format", "csv", "--fields", "id,violations").stdout
        assert f"{job['id']},memory:{v['pid']}" in csv
        wait_for(lambda: "violation (memory)" in d.log.read_text(), what="the log line")
        wait_for(lambda: (_metric(port, "vgpu_violations_total", kind="memory") or 0) >= 1,
                 what="vgpu_violations_total{kind=memory}")
        assert _metric(port, "vgpu_job_violations_total", job=job["id"]) >= 1
        # Reported, not killed.
        assert p.poll() is None
    finally:
        p.send_signal(signal.SIGTERM)
        p.wait(30)


def _killed(daemon_factory, mem: str, core: str, *burn: str):
    """A daemon with on_violation = "kill", where `vgpuctl run --mem MEM
    --core CORE` of vgpu-burn with burn's options ends killed in time."""
    d = daemon_factory(config='on_violation = "kill"\n')
    p = d.popen("run", "--mem", mem, "--core", core, "--", *_burn(*burn))
    try:
        assert p.wait(CAUGHT_S + 20) == 128 + signal.SIGKILL
    finally:
        kill_and_reap(p)
    return d


def test_with_kill_the_unhooked_process_over_its_limit_is_killed(daemon_factory):
    d = _killed(daemon_factory, "1G", "100", "--alloc", "2G", "--kernel-us", "100",
                "--seconds", "120")
    job = d.call("ps", all=True)["jobs"][-1]
    assert job["exit_signal"] == signal.SIGKILL
    # The ended job's record keeps what was caught and done: the job
    # ended (every process of it), not one process.
    assert [(v["kind"], v["action"]) for v in job["violations"]] == [("memory", "ended")]
    text = d.log.read_text()
    assert re.search(rf"violation \(memory\): job {job['id']}: pid \d+ ", text), text
    assert re.search(rf"job {job['id']} \(.*\) of \S+ ended for a memory violation", text)


def test_double_forked_unhooked_process_stays_in_its_job_and_is_charged(daemon_factory):
    daemon = daemon_factory(config='on_violation = "report"\n')
    # The command backgrounds a detached (setsid) holder and exits at once.
    p = daemon.popen("run", "--mem", "1G", "--core", "100", "--", "sh", "-c",
                     " ".join(["setsid", *_burn("--alloc", "2G", "--kernel-us", "100",
                                                 "--seconds", "120")])
                     + " >/dev/null 2>&1 </dev/null &")
    try:
        job = _job_of(daemon, p)
        found = wait_for(lambda: _violations(daemon, job["id"], "memory"), timeout=CAUGHT_S,
                         what="the escaped holder's violation")
        pid = found[0]["pid"]
        # Charged to its job: in its pids, its memory in the job's NVML figure.
        now = wait_for(lambda: (lambda j: j if pid in j["pids"] else None)(
            daemon.job(job["id"])), what="the holder among the job's pids")
        assert now["state"] == "running"
        assert now["mem_nvml"] > G
        # `vgpuctl run` waits for it (a subreaper): the job and its region stay.
        assert p.poll() is None
        assert (daemon.runtime / "jobs" / job["id"]).is_dir()
        # Nothing was taken for a process in no job.
        assert daemon.call("ps")["violations"] == []
        # Stopping the job stops it; then run ends with its command's status.
        assert daemon.cli("kill", job["id"]).returncode == 0
        assert p.wait(30) == 0
        wait_for(lambda: daemon.jobs() == [], what="the job to end")
    finally:
        kill_and_reap(p)


def test_compute_overrun_with_the_gate_bypassed_is_caught(daemon):
    # GPU 0: a job at 10 % whose process launches with no gate (no hook).
    # GPU 1: a hooked job at 10 % burning as fast as it may: gated, no violation.
    hooked = daemon.popen("run", "--mem", "2G", "--core", "10", "--gpu", "1", "--name",
                          "gated", "--", str(native.burn_program()), "--kernel-us", "1000",
                          "--seconds", "60")
    rogue = daemon.popen("run", "--mem", "2G", "--core", "10", "--gpu", "0", "--name",
                         "rogue", "--", *_burn("--kernel-us", "1000", "--seconds", "60"))
    try:
        def running() -> dict | None:
            jobs = {j["name"]: j for j in daemon.jobs() if j["state"] == "running" and j["pids"]}
            return jobs if set(jobs) == {"gated", "rogue"} else None
        jobs = wait_for(running, timeout=20, what="both jobs")
        found = wait_for(lambda: _violations(daemon, jobs["rogue"]["id"], "compute"),
                         timeout=CAUGHT_S, what="a compute violation")
        v = found[0]
        assert v["value"] > 0.2 and v["limit"] == pytest.approx(0.1, abs=0.05)
        assert v["pid"] in daemon.job(jobs["rogue"]["id"])["pids"]
        assert "violation (compute)" in daemon.log.read_text()
        assert _violations(daemon, jobs["gated"]["id"], "compute") == []
    finally:
        for p in (hooked, rogue):
            p.send_signal(signal.SIGTERM)
            p.wait(30)


def test_with_kill_the_process_past_its_compute_share_is_killed(daemon_factory):
    d = _killed(daemon_factory, "2G", "10", "--kernel-us", "1000", "--seconds", "60")
    assert "violation (compute)" in d.log.read_text()


@pytest.mark.parametrize("action", ["report", "kill"])
def test_gpu_process_in_no_job_is_reported_and_killed_with_kill(daemon_factory, action):
    d = daemon_factory(config=f'on_violation = "{action}"\n')
    env = sim.child_env(dict(d.env))
    with holding(env, HOLD_1G_ON_GPU1) as h:
        found = wait_for(lambda: [v for v in d.call("ps")["violations"]
                                  if v["pid"] == h.pid], timeout=CAUGHT_S,
                         what="the stranger's violation")
        assert found[0]["kind"] == "no_job" and found[0]["job"] is None
        # What it held when it was found: its context alone if the watch's
        # tick came between the context and the allocation, else both.
        assert found[0]["value"] in (CTX, CTX + G)
        shown = json.loads(d.cli("ps", "--json").stdout)
        assert [v["pid"] for v in shown["violations"]] == [h.pid]
        assert "violation (no_job)" in d.log.read_text()
        if action == "kill":
            assert h.proc.wait(CAUGHT_S) == -signal.SIGKILL
            assert found[0]["action"] == "killed"
        else:
            assert h.proc.poll() is None and found[0]["action"] == "reported"


def test_sim_reset_under_a_running_daemon_is_refused_and_it_still_sees(daemon_factory):
    daemon = daemon_factory(config='on_violation = "report"\n')
    env = sim.child_env(dict(daemon.env))
    for args in (["sim", "reset"], ["sim", "reset", "--force"]):
        r = daemon.cli(*args)
        assert r.returncode == 2, r.stderr
        assert r.stderr.startswith("vgpuctl: error: a vgpuctl daemon uses")
        assert "Traceback" not in r.stderr
    # Still the daemon's state: a process on it is seen (here, in no job).
    with holding(env, HOLD_1G_ON_GPU1) as h:
        wait_for(lambda: any(v["pid"] == h.pid for v in daemon.call("ps")["violations"]),
                 timeout=CAUGHT_S, what="the daemon to see a new process")
    # Once the daemon is gone, reset works.
    daemon.stop()
    assert daemon.cli("sim", "reset").returncode == 0


# A launcher that is admitted and never says `started`: it runs the job's
# work itself, or from a child, with the job's environment (issue 19).
NEVER_STARTS = r"""
import os, subprocess, sys, time
from vgpuctl.client.connection import Client
from pathlib import Path
cl = Client.connect(Path(sys.argv[1]))
reply = cl.call("run", command=["burn"], cwd="/", mem=2 << 30, core=5)
env = dict(os.environ, **reply["env"])
if sys.argv[2] == "hooked":
    env["LD_PRELOAD"] = reply["prepend"]["LD_PRELOAD"]
print(reply["job"]["id"], flush=True)
burn = subprocess.Popen([sys.argv[3], "--kernel-us", "1000", "--seconds", "60"], env=env)
burn.wait()
print(burn.returncode, flush=True)
time.sleep(60)
"""


def _never_starts(d, mode: str) -> subprocess.Popen:
    env = sim.child_env(dict(d.env))
    return subprocess.Popen([sys.executable, "-c", NEVER_STARTS, str(d.socket), mode,
                             str(native.burn_program())], env=env, stdout=subprocess.PIPE,
                            text=True)


def test_a_job_that_never_starts_is_gated_from_its_admission(daemon_factory):
    d = daemon_factory(gpus="1x16G")
    p = _never_starts(d, "hooked")
    try:
        jid = read_line(p.stdout).strip()
        # Its launcher's child is its process, and is measured.
        wait_for(lambda: (lambda j: j["state"] == "starting" and j["pids"]
                          and (j["core_measured"] or 0) > 0)(d.job(jid)),
                 timeout=CAUGHT_S, what="the starting job to be measured")
        limits = Region.open(d.runtime / "jobs" / jid)
        wait_for(lambda: limits.device(0).throttle, timeout=CAUGHT_S,
                 what="the starting job's gate to be set")
        # Held to its share: a few seconds at 5 %, not the whole GPU.
        wait_for(lambda: (d.job(jid)["core_measured"] or 1.0) < 0.15, timeout=20,
                 what="the starting job to be held near its 5 %")
    finally:
        p.kill()
        p.wait()


def test_a_job_that_never_starts_is_watched_like_any_other(daemon_factory):
    d = daemon_factory(gpus="1x16G", config='on_violation = "kill"\n')
    p = _never_starts(d, "unhooked")
    try:
        jid = read_line(p.stdout).strip()
        # Its burner walks past the hook at 5 %: a compute violation, killed.
        assert read_line(p.stdout, timeout=CAUGHT_S + 20).strip() == str(-signal.SIGKILL)
        assert [v["kind"] for v in d.job(jid)["violations"]] == ["compute"]
    finally:
        p.kill()
        p.wait()
