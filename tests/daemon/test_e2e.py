"""The daemon as a process: garbage on its socket, SIGKILL and restart with
jobs running, SIGTERM, SIGHUP, and a second user who may look but not touch."""

from __future__ import annotations

import json
import os
import pwd
import random
import signal
import socket
import threading
import time

import pytest
from support.daemon import CUDA_CK, kill_and_reap, read_line, wait_for

from vgpuctl.system.region import Region

G = 1 << 30


def raw(path, data: bytes, read=True, timeout=10.0) -> bytes:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(timeout)
    s.connect(str(path))
    try:
        s.sendall(data)
        if not read:
            return b""
        s.shutdown(socket.SHUT_WR)
        out = b""
        while True:
            chunk = s.recv(65536)
            if not chunk:
                return out
            out += chunk
    finally:
        s.close()


def replies(data: bytes) -> list[dict]:
    return [json.loads(line) for line in data.splitlines()]


def test_garbage_gets_error_replies_and_the_daemon_keeps_serving(daemon):
    rng = random.Random(4)
    junk = bytes(rng.randrange(256) for _ in range(4096)).replace(b"\n", b" ") + b"\n"
    cases = [junk, b"{\n", b"[]\n", b'{"v":1,"op":"nope"}\n', b'{"v":9,"op":"ping"}\n',
             b'{"v":1,"op":"run","command":"ls","cwd":"/","mem":1}\n',
             b'{"v":1,"op":"kill","job":{"a":1}}\n', b'{"v":1,"op":"set","job":"1","core":1e9}\n',
             b'"\xff\xfe"\n']
    for c in cases:
        out = replies(raw(daemon.socket, c))
        assert len(out) == 1 and out[0]["ok"] is False, (c, out)
        assert out[0]["error"]["code"] in ("protocol",), out
    # Several requests on one connection, a bad one in the middle.
    out = replies(raw(daemon.socket, b'{"v":1,"op":"ping"}\nxx\n{"v":1,"op":"ps"}\n'))
    assert [r["ok"] for r in out] == [True, False, True]
    assert daemon.call("ping")["ok"] is True


def test_a_100_mb_line_is_refused_without_disturbing_other_clients(daemon):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(20)
    s.connect(str(daemon.socket))
    sent = 0
    reply = b""
    stop = threading.Event()
    pings: list[bool] = []

    def other_client():
        while not stop.is_set():
            pings.append(daemon.call("ping")["ok"])
            time.sleep(0.01)
    t = threading.Thread(target=other_client)
    t.start()
    try:
        chunk = b"x" * (1 << 20)
        try:
            while sent < 100 << 20:
                s.sendall(chunk)
                sent += len(chunk)
        except (BrokenPipeError, ConnectionResetError):
            pass
        try:
            while True:
                data = s.recv(65536)
                if not data:
                    break
                reply += data
        except (TimeoutError, ConnectionResetError):
            pass
    finally:
        stop.set()
        t.join(20)
        s.close()
    if reply:
        out = replies(reply)
        assert out[0]["ok"] is False and "longer than" in out[0]["error"]["message"]
    assert sent < 100 << 20 or reply          # cut off, or answered
    assert pings and all(pings)
    assert daemon.call("ping")["ok"] is True
    rss = int(open(f"/proc/{daemon.proc.pid}/status").read().split("VmRSS:")[1].split()[0])
    assert rss < 200 * 1024, f"daemon RSS {rss} kB after a 100 MB line"


def test_sigkill_and_restart_readopts_running_jobs(daemon):
    p = daemon.popen("run", "--mem", "3G", "--core", "40", "--name", "survivor", "--",
                     "sh", "-c", "sleep 60 & wait")
    try:
        job = wait_for(lambda: next((j for j in daemon.jobs() if len(j["pids"]) == 2), None),
                       what="the job")
        region = daemon.runtime / "jobs" / job["id"]
        daemon.stop(signal.SIGKILL)
        # While the daemon is down the job runs on under its limits.
        assert p.poll() is None
        d = Region.open(region).device(0)
        assert (d.mem_limit, d.core_share) == (3 * G, 40)
        daemon.start()
        again = daemon.job(job["id"])
        assert again["state"] == "running" and again["name"] == "survivor"
        assert again["pids"] == job["pids"] and again["mem_limit"] == 3 * G
        assert again["core"] == 40 and again["gpu_uuid"] == job["gpu_uuid"]
        # Its memory still counts: admission sees it.
        r = daemon.cli("run", "--mem", "13G", "--gpu", str(job["gpu"]), "--", "true")
        assert r.returncode == 6
        # A new job gets a new id; the old one can still be stopped.
        assert daemon.cli("kill", job["id"]).returncode == 0
        assert p.wait(20) == 128 + signal.SIGTERM
        wait_for(lambda: daemon.jobs() == [], what="the job to end")
        assert not region.exists()
        r = daemon.cli("run", "--mem", "64M", "--", "sh", "-c", "echo $VGPU_JOB")
        assert int(r.stdout) == int(job["id"]) + 1
    finally:
        kill_and_reap(p)


def test_jobs_that_end_while_the_daemon_is_down_are_marked_ended(daemon):
    p = daemon.popen("run", "--mem", "1G", "--", "sleep", "60")
    job = daemon.running_job(what="job")
    daemon.stop(signal.SIGKILL)
    p.kill()          # the launcher and its command both go
    os.kill(job["pids"][0], signal.SIGKILL)
    p.wait()
    wait_for(lambda: not os.path.exists(f"/proc/{job['pids'][0]}"), what="the command to go")
    daemon.start()
    assert daemon.jobs() == []
    assert daemon.job(job["id"])["state"] == "ended"
    assert not (daemon.runtime / "jobs" / job["id"]).exists()


def test_sigterm_stops_cleanly_and_leaves_jobs_running(daemon):
    p = daemon.popen("run", "--mem", "1G", "--", "sleep", "60")
    try:
        job = daemon.running_job(what="the job")
        assert daemon.stop(signal.SIGTERM) == 0
        assert not daemon.socket.exists()
        assert p.poll() is None
        assert (daemon.runtime / "jobs" / job["id"] / "region").exists()
        daemon.start()
        assert [j["id"] for j in daemon.jobs()] == [job["id"]]
    finally:
        p.kill()
        p.wait()


def test_sighup_reloads_and_a_bad_file_keeps_the_old_config(daemon):
    assert daemon.cli("run", "--", "true").returncode == 2    # --mem required
    daemon.config.write_text('default_mem = "256M"\n')
    daemon.proc.send_signal(signal.SIGHUP)
    wait_for(lambda: daemon.cli("run", "--", "true").returncode == 0, what="the reload")
    daemon.config.write_text("default_mem = \"12G\"\nbogus = 1\n")
    daemon.proc.send_signal(signal.SIGHUP)
    wait_for(lambda: "reload failed" in daemon.log.read_text(), what="the reload error")
    assert "bogus" in daemon.log.read_text()
    assert daemon.cli("run", "--", "true").returncode == 0       # still the old config


def test_daemon_reload_exits_non_zero_saying_why_and_keeps_the_old_config(daemon):
    daemon.config.write_text('default_mem = "256M"\n')
    r = daemon.cli("daemon", "reload")
    assert r.returncode == 0 and "reloaded" in r.stderr, r.stderr
    assert daemon.cli("run", "--", "true").returncode == 0
    daemon.config.write_text("default_mem = 12\n")
    bad = daemon.cli("daemon", "reload")
    assert bad.returncode == 78
    assert bad.stderr.splitlines() == [
        f"vgpuctl: error: {daemon.config}: default_mem: expected a size with a unit such as "
        f"\"12G\" or \"12M\", got the bare number 12; the daemon keeps its previous "
        f"configuration"]
    assert daemon.cli("run", "--", "true").returncode == 0       # still the old config
    log = daemon.log.read_text().splitlines()
    assert sum("reloaded" in line for line in log) == 1, log   # never for the failure
    assert any("ERROR reload failed" in line for line in log)


def test_a_config_file_created_after_the_start_is_read_at_reload(daemon_factory):
    d = daemon_factory(start=False)
    del d.env["VGPU_CONFIG"]
    d.env["XDG_CONFIG_HOME"] = str(d.base / "xdg")     # the user daemon's default file
    d.env["HOME"] = str(d.base)
    d.start("--user")
    assert d.call("ping")["daemon"]["config"] == "<defaults>"
    assert d.cli("run", "--", "true").returncode == 2               # --mem required
    cfg = d.base / "xdg" / "vgpu" / "vgpu.toml"
    cfg.parent.mkdir(parents=True)
    cfg.write_text('default_mem = "256M"\n')
    d.proc.send_signal(signal.SIGHUP)
    wait_for(lambda: d.call("ping")["daemon"]["config"] == str(cfg), what="the reload")
    assert d.cli("run", "--", "true").returncode == 0
    assert f"configuration reloaded from {cfg}" in d.log.read_text()


def test_second_instance_on_the_same_state_is_refused(daemon):
    r = daemon.cli("daemon", "--socket", str(daemon.base / "other.sock"))
    assert r.returncode == 10 and "another daemon" in r.stderr


def as_user(pw, argv, env):
    """Run vgpuctl's CLI in a forked child of this process that has become
    another user (the interpreter's files may not be readable by that user,
    so nothing is exec'd: the modules are already loaded). Returns (exit
    code, stdout, stderr)."""
    import importlib
    import tempfile

    from vgpuctl import __main__ as entry
    from vgpuctl import cli
    from vgpuctl.client import launch  # noqa: F401  (loaded before the fork)

    for target in cli.COMMANDS.values():    # commands load when invoked: load them now
        importlib.import_module(target.partition(":")[0])

    out, err = tempfile.TemporaryFile(), tempfile.TemporaryFile()
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            import sys
            os.dup2(out.fileno(), 1)
            os.dup2(err.fileno(), 2)
            sys.stdout = open(1, "w", closefd=False)     # not pytest's capture
            sys.stderr = open(2, "w", closefd=False)
            os.setgroups([])
            os.setgid(pw.pw_gid)
            os.setuid(pw.pw_uid)
            os.chdir("/")
            os.environ.clear()
            os.environ.update(env)
            sys.argv = ["vgpuctl", *argv]
            try:
                entry.main()
                code = 0
            except SystemExit as e:
                code = e.code if isinstance(e.code, int) else 1
        finally:
            import sys
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    out.seek(0)
    err.seek(0)
    return os.waitstatus_to_exitcode(status), out.read().decode(), err.read().decode()


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to run a client as another uid")
def test_another_user_can_look_but_not_change_or_kill(daemon):
    nobody = pwd.getpwnam("nobody")
    env = {**daemon.env, "HOME": "/nonexistent"}
    p = daemon.popen("run", "--mem", "1G", "--", "sleep", "60")
    try:
        job = daemon.running_job(what="the job")
        code, out, err = as_user(nobody, ["ps", "--json"], env)
        assert code == 0, err
        assert [j["id"] for j in json.loads(out)["jobs"]] == [job["id"]]
        code, out, err = as_user(nobody, ["set", job["id"], "--core", "10"], env)
        assert code == 5, err
        assert "only its owner or root" in err and len(err.splitlines()) == 1
        code, out, err = as_user(nobody, ["kill", job["id"], "--signal", "KILL"], env)
        assert code == 5, err
        assert daemon.job(job["id"])["core"] == 100 and p.poll() is None
        # Their own jobs they may run (and so change and stop).
        code, out, err = as_user(nobody, ["run", "--mem", "64M", "--", "sh", "-c", "exit 3"],
                                 env)
        assert code == 3, err
        theirs = [j for j in daemon.jobs(all_jobs=True) if j["id"] != job["id"]]
        assert [(j["user"], j["uid"], j["exit_code"]) for j in theirs] == [
            ("nobody", nobody.pw_uid, 3)]
    finally:
        p.kill()
        p.wait()


HOLDER = "import sys" + CUDA_CK + """\
ck(cu.cuInit(0))
ctx, = ck(cu.cuDevicePrimaryCtxRetain(ck(cu.cuDeviceGet(0))[0]))
ck(cu.cuCtxSetCurrent(ctx))
print("ready", ck(cu.cuMemGetInfo())[1], flush=True)
held = []
for line in sys.stdin:
    err, ptr = cu.cuMemAlloc(int(line))
    if err == cu.CUresult.CUDA_SUCCESS:
        held.append(ptr)
    print(err.name, flush=True)
"""


def test_limits_hold_while_the_daemon_is_down_and_use_survives_it(daemon, tmp_path):
    import subprocess
    import sys

    script = tmp_path / "holder.py"
    script.write_text(HOLDER)
    p = daemon.popen("run", "--mem", "1G", "--", sys.executable, str(script),
                     stdin=subprocess.PIPE)
    try:
        assert read_line(p.stdout).split() == ["ready", str(G)]
        job = daemon.running_job(what="the job")
        daemon.stop(signal.SIGKILL)

        def alloc(n):
            p.stdin.write(f"{n}\n")
            p.stdin.flush()
            return read_line(p.stdout).strip()
        assert alloc(G + 1) == "CUDA_ERROR_OUT_OF_MEMORY"   # no daemon, same limit
        assert alloc(256 << 20) == "CUDA_SUCCESS"
        daemon.start()
        again = wait_for(lambda: daemon.job(job["id"]) if daemon.job(job["id"])["mem_used"]
                         else None, what="the job's use")
        assert again["mem_used"] >= 256 << 20 and again["pids"] == job["pids"]
        assert daemon.cli("set", job["id"], "--mem", "512M").returncode == 0
        assert alloc(300 << 20) == "CUDA_ERROR_OUT_OF_MEMORY"  # the new limit, live
        p.stdin.close()
        assert p.wait(20) == 0
        wait_for(lambda: daemon.jobs() == [], what="the job to end")
    finally:
        kill_and_reap(p)


def test_top_refreshes_and_ctrl_c_ends_it_cleanly(daemon, tmp_path):
    out = open(tmp_path / "top.out", "w+")
    p = daemon.popen("top", "-i", "0.1", env={"COLUMNS": "150"}, stdout=out)
    try:
        # Off a terminal each refresh is printed: wait for a few.
        wait_for(lambda: (tmp_path / "top.out").read_text().count("Limits/capacity") >= 3,
                 what="three refreshes")
        p.send_signal(signal.SIGINT)
        assert p.wait(10) == 0
        assert "Traceback" not in p.stderr.read()
    finally:
        out.close()
        kill_and_reap(p)


def test_a_daemon_keeps_its_vgpu_sim_says_so_and_daemon_stop_ends_it(daemon):
    """A user daemon keeps the VGPU_SIM it started with: a run asking for
    another is told so (and how to stop the daemon) beside the refusal it
    meets, and `vgpuctl daemon stop` stops it, as SIGTERM does."""
    other = {"VGPU_SIM": "4x16G"}
    res = daemon.cli("run", "--gpus", "3", "--mem", "1G", "--", "true", env=other)
    assert res.returncode == 6, res
    assert "there are 2 GPUs here" in res.stderr
    assert "runs with VGPU_SIM=2x16G, not your VGPU_SIM=4x16G" in res.stderr
    assert "`vgpuctl daemon stop`" in res.stderr and len(res.stderr.splitlines()) == 1
    res = daemon.cli("run", "--mem", "1G", "--", "true", env=other)
    assert res.returncode == 0 and "not your VGPU_SIM=4x16G" in res.stderr, res
    assert "not your VGPU_SIM" not in daemon.cli("run", "--mem", "1G", "--", "true").stderr
    res = daemon.cli("daemon", "stop")
    assert res.returncode == 0 and "stopped the daemon on" in res.stderr, res
    assert daemon.proc.wait(10) == 0
    res = daemon.cli("daemon", "stop")
    assert res.returncode == 3 and "no vgpuctl daemon answers" in res.stderr


def test_a_sigkilled_process_memory_leaves_the_jobs_figures(daemon):
    """A process of a job killed without a word (SIGKILL) leaves its slot
    counting what it held until a hook of the job sweeps it, which one that
    allocates nothing more never does: `ps` shows what the GPU holds for
    the job (NVML: what the live one holds), not that."""
    import json

    from vgpuctl.system import native

    burn = native.burn_program()
    p = daemon.popen("run", "--mem", "2G", "--name", "k", "--", "sh", "-c",
                     f"{burn} --alloc 512M --kernel-us 1000 --seconds 120 & "
                     f"{burn} --kernel-us 1000 --seconds 120 & wait")

    def held() -> dict[int, int]:
        r = json.loads(daemon.cli("sim", "stats", "--json").stdout)
        return {q["pid"]: sum(d["used"] for d in q["devices"]) for q in r["processes"]}
    try:
        def holding() -> dict | None:
            j = next((j for j in daemon.jobs() if j["name"] == "k"), None)
            if not j or (j["mem_used"] or 0) < 512 << 20:
                return None
            big = [q for q, b in held().items() if q in j["pids"] and b >= 512 << 20]
            return {**j, "victim": big[0]} if big and len(j["pids"]) >= 3 else None
        job = wait_for(holding, 30, "the job's two processes on the GPU")
        os.kill(job["victim"], signal.SIGKILL)
        rest = wait_for(lambda: sum(held().values()) or None, 30, "the other's memory")
        wait_for(lambda: (daemon.job(job["id"])["mem_used"] or 0) < rest + (64 << 20), 30,
                 "the job's figures to let the killed process's memory go")
    finally:
        daemon.cleanup_jobs()
        p.wait(30)
