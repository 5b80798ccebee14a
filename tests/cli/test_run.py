"""`vgpuctl run` end to end on the simulated GPU: the job sees its limit, is
refused past it, shows in `ps --json` and disappears when it exits; exit
codes, signals, stdin and the terminal pass through like exec."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from support.daemon import CUDA_CK, kill_and_reap, read_line, vgpuctl_argv, wait_for

G = 1 << 30
M = 1 << 20

# Reports what the driver API shows, then holds HOLD bytes until stdin closes.
PROBE = "import os, sys" + CUDA_CK + textwrap.dedent("""\
    ck(cu.cuInit(0))
    dev, = ck(cu.cuDeviceGet(0))
    ctx, = ck(cu.cuDevicePrimaryCtxRetain(dev))
    ck(cu.cuCtxSetCurrent(ctx))
    free, total = ck(cu.cuMemGetInfo())
    err, _ = cu.cuMemAlloc(total + 1)
    print("total", total, "over", err.name, flush=True)
    hold = int(sys.argv[1]) if len(sys.argv) > 1 else 0
    if hold:
        ptr, = ck(cu.cuMemAlloc(hold))
        print("holding", hold, flush=True)
        sys.stdin.read()
        ck(cu.cuMemFree(ptr))
""")


@pytest.fixture
def probe(tmp_path):
    p = tmp_path / "probe.py"
    p.write_text(PROBE)
    return str(p)


def test_job_sees_its_limit_and_is_refused_past_it(daemon, probe):
    r = daemon.cli("run", "--mem", "1G", "--", sys.executable, probe)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["total", str(G), "over", "CUDA_ERROR_OUT_OF_MEMORY"]


def test_running_job_shows_in_ps_json_and_disappears_when_it_exits(daemon, probe):
    p = daemon.popen("run", "--mem", "1G", "--core", "50", "--name", "probe", "--",
                     sys.executable, probe, str(256 * M), stdin=subprocess.PIPE)
    try:
        assert read_line(p.stdout).startswith("total")
        assert read_line(p.stdout).strip() == f"holding {256 * M}"

        def listed():
            r = daemon.cli("ps", "--json")
            assert r.returncode == 0, r.stderr
            jobs = json.loads(r.stdout)["jobs"]
            return jobs[0] if jobs and jobs[0]["pids"] and jobs[0]["mem_used"] else None
        job = wait_for(listed, what="the job in ps --json")
        assert job["name"] == "probe" and job["state"] == "running"
        assert job["mem_limit"] == G and job["core"] == 50
        assert job["mem_used"] >= 256 * M
        assert job["pids"] and all(isinstance(x, int) for x in job["pids"])
        assert job["command"][-1] == str(256 * M)
        assert job["user"] and job["gpu"] in (0, 1) and job["gpu_uuid"].startswith("GPU-")
        p.stdin.close()
        assert p.wait(30) == 0
        assert wait_for(lambda: json.loads(daemon.cli("ps", "--json").stdout)["jobs"] == [],
                        what="the job to leave ps")
        ended = daemon.jobs(all_jobs=True)[-1]
        assert ended["state"] == "ended" and ended["exit_code"] == 0
        assert not os.path.exists(os.path.join(daemon.runtime, "jobs", job["id"]))
    finally:
        kill_and_reap(p)


def test_exit_codes_pass_through(daemon):
    assert daemon.cli("run", "--mem", "64M", "--", "sh", "-c", "exit 7").returncode == 7
    assert daemon.cli("run", "--mem", "64M", "--", "true").returncode == 0


def test_a_signal_death_is_128_plus_n(daemon):
    r = daemon.cli("run", "--mem", "64M", "--", "sh", "-c", "kill -TERM $$")
    assert r.returncode == 128 + signal.SIGTERM
    ended = daemon.jobs(all_jobs=True)[-1]
    assert ended["exit_signal"] == signal.SIGTERM


def test_command_not_found_is_127_and_one_line(daemon):
    r = daemon.cli("run", "-q", "--mem", "1G", "--", "no-such-command-xyz")
    assert r.returncode == 127
    assert r.stderr.strip().splitlines() == [
        "vgpuctl: error: cannot run no-such-command-xyz: No such file or directory"]


def test_a_command_that_is_not_executable_is_126_and_one_line(daemon, tmp_path):
    script = tmp_path / "not-executable"
    script.write_text("#!/bin/sh\n")
    r = daemon.cli("run", "-q", "--mem", "1G", "--", str(script))
    assert r.returncode == 126
    assert r.stderr.strip().splitlines() == [
        f"vgpuctl: error: cannot run {script}: Permission denied"]


def test_run_waits_for_what_the_command_left_and_passes_it_signals(daemon, tmp_path):
    """As a subreaper, run waits for a child the command left in the
    background (it is the job's until it ends), sends it the signals run
    gets, and exits with the command's own code."""
    shell, got = tmp_path / "shell", tmp_path / "got"
    p = daemon.popen("run", "-q", "--mem", "1G", "--", "sh", "-c",
                     f"echo $$ > {shell}; (trap 'echo TERM > {got}; exit 5' TERM; echo ready; "
                     "while :; do sleep 0.1; done) & exit 3")
    try:
        assert read_line(p.stdout).strip() == "ready"
        pid = int(wait_for(lambda: shell.read_text().strip(), what="the command's pid"))

        def reaped() -> bool:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                return True
            return False
        wait_for(reaped, what="the command's end")
        assert p.poll() is None                 # the child it left runs on
        p.send_signal(signal.SIGTERM)
        assert p.wait(20) == 3
        assert got.read_text() == "TERM\n"
    finally:
        kill_and_reap(p)


def test_a_daemon_gone_before_the_command_ends_is_warned_with_verbose(daemon):
    p = daemon.popen("run", "-v", "--mem", "1G", "--", "sh", "-c", "echo ready; read x; exit 4",
                     stdin=subprocess.PIPE)
    try:
        assert read_line(p.stdout).strip() == "ready"
        daemon.stop(signal.SIGKILL)
        out, err = p.communicate("go\n", timeout=30)
        assert p.returncode == 4
        assert err.splitlines()[1:] == ["vgpuctl: warning: the daemon did not get `exited`"]
    finally:
        kill_and_reap(p)


def test_stdin_and_stdout_are_the_commands(daemon):
    r = daemon.cli("run", "--mem", "64M", "--", "cat", input="hello job\n")
    assert r.returncode == 0 and r.stdout == "hello job\n"


def test_the_job_sees_its_id_region_and_one_gpu(daemon):
    r = daemon.cli("run", "--mem", "64M", "--gpu", "1", "--", "sh", "-c",
                   "echo $VGPU_JOB $CUDA_VISIBLE_DEVICES $VGPU_REGION; echo $LD_PRELOAD",
                   env={"LD_PRELOAD": "libother.so"})
    assert r.returncode == 0, r.stderr
    line1, line2 = r.stdout.splitlines()
    jid, uuid, region = line1.split()
    gpus = daemon.call("ps")["gpus"]
    assert uuid == gpus[1]["uuid"]
    assert region.endswith(f"/jobs/{jid}")
    hook, other = line2.split(":")
    assert hook.endswith("libvgpu.so") and other == "libother.so"


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP, signal.SIGINT])
def test_signals_sent_to_vgpuctl_reach_the_command(daemon, tmp_path, sig):
    script = tmp_path / "trap.py"
    script.write_text(textwrap.dedent("""
        import signal, sys, time
        def on(s, f):
            print("got", s, flush=True)
            sys.exit(42)
        for s in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
            signal.signal(s, on)
        print("ready", flush=True)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            time.sleep(0.05)
        sys.exit(1)
    """))
    p = daemon.popen("run", "--mem", "64M", "--", sys.executable, str(script))
    try:
        assert read_line(p.stdout).strip() == "ready"
        p.send_signal(sig)
        assert p.wait(20) == 42
        # Sent once, not twice (the handler would print twice before exiting otherwise).
        assert p.stdout.read().split() == ["got", str(int(sig))]
    finally:
        kill_and_reap(p)


def test_kill_signals_every_process_of_the_job(daemon):
    p = daemon.popen("run", "--mem", "64M", "--name", "tree", "--", "sh", "-c",
                     "sleep 60 & sleep 60 & wait")
    try:
        job = wait_for(lambda: next((j for j in daemon.jobs() if len(j["pids"]) == 3), None),
                       what="the job's three processes")
        r = daemon.cli("kill", job["id"])
        assert r.returncode == 0, r.stderr
        assert r.stdout.startswith(f"job {job['id']}: SIGTERM sent to ")
        assert p.wait(20) == 128 + signal.SIGTERM
        wait_for(lambda: daemon.jobs() == [], what="the job to end")
    finally:
        kill_and_reap(p)


def test_admission_refuses_what_does_not_fit_and_places_what_does(daemon):
    holders = []
    try:
        for _ in range(2):
            holders.append(daemon.popen("run", "--mem", "15G", "--", "sleep", "60"))
        wait_for(lambda: len([j for j in daemon.jobs() if j["pids"]]) == 2,
                 what="two jobs")
        gpus = sorted(j["gpu"] for j in daemon.jobs())
        assert gpus == [0, 1]                        # spread, one per GPU
        r = daemon.cli("run", "--mem", "1G", "--", "true")
        assert r.returncode == 6
        msg = r.stderr.strip()
        assert msg.count("\n") == 0 and "GPU 0" in msg and "GPU 1" in msg, msg
        assert "512M left" in msg
        r = daemon.cli("run", "--mem", "512M", "--gpu", "1", "--", "sh", "-c",
                       "echo $CUDA_VISIBLE_DEVICES")
        assert r.returncode == 0, r.stderr
        assert r.stdout.strip() == daemon.call("ps")["gpus"][1]["uuid"]
    finally:
        for h in holders:
            h.kill()
            h.wait()


def test_a_gpu_that_does_not_exist_is_refused_naming_those_that_do(daemon_factory):
    d = daemon_factory(gpus="1x16G")
    uuid = d.call("ps")["gpus"][0]["uuid"]
    r = d.cli("run", "--gpu", "3", "--mem", "1G", "--", "true")
    assert r.returncode == 4, r.stderr
    assert r.stderr == f"vgpuctl: error: no GPU 3: the one GPU here is 0 ({uuid})\n"
    d2 = daemon_factory(gpus="2x16G")
    uuids = [g["uuid"] for g in d2.call("ps")["gpus"]]
    absent = next(str(n) for n in range(2, 100)   # neither an index nor a UUID's prefix
                  if not any(u.removeprefix("GPU-").startswith(str(n)) for u in uuids))
    r = d2.cli("run", "--gpu", absent, "--mem", "1G", "--", "true")
    assert r.returncode == 4, r.stderr
    assert r.stderr == (f"vgpuctl: error: no GPU {absent}: the 2 GPUs here are "
                        f"0 ({uuids[0]}), 1 ({uuids[1]})\n")


def test_set_changes_a_running_job(daemon):
    p = daemon.popen("run", "--mem", "2G", "--", "sleep", "60")
    try:
        job = daemon.running_job(what="the job")
        r = daemon.cli("set", job["id"], "--mem", "1G", "--core", "25", "--policy", "soft")
        assert r.returncode == 0, r.stderr
        assert r.stdout.strip() == (f"job {job['id']}: mem 1G, core 25%, policy soft, "
                                    "priority normal")
        j = daemon.job(job["id"])
        assert (j["mem_limit"], j["core"], j["policy"]) == (G, 25, "soft")
        r = daemon.cli("set", job["id"], "--mem", "40G")
        assert r.returncode == 6 and "left" in r.stderr
        r = daemon.cli("set", "999", "--core", "10")
        assert r.returncode == 4 and r.stderr.strip() == "vgpuctl: error: no job 999"
    finally:
        p.kill()
        p.wait()


def test_status_shows_gpus_then_jobs(daemon):
    p = daemon.popen("run", "--mem", "1G", "--name", "visible-job", "--", "sleep", "60")
    try:
        wait_for(lambda: daemon.jobs() and daemon.jobs()[0]["pids"], what="the job")
        for args in ((), ("status",)):
            r = daemon.cli(*args, env={"COLUMNS": "200"})
            assert r.returncode == 0, r.stderr
            out = r.stdout
            assert out.index("GPU") < out.index("visible-job")
            assert "16G" in out and "sleep 60" in out
        r = daemon.cli("ps", env={"COLUMNS": "200"})
        assert r.returncode == 0 and "visible-job" in r.stdout
        r = daemon.cli("top", "-n", "2", "-i", "0.1", env={"COLUMNS": "200"})
        assert r.returncode == 0 and "visible-job" in r.stdout
    finally:
        p.kill()
        p.wait()


def test_status_without_a_daemon_shows_the_gpus(daemon_factory):
    d = daemon_factory(start=False)
    r = d.cli("status")
    assert r.returncode == 0, r.stderr
    assert "no daemon running" in r.stdout and "16G" in r.stdout


def test_run_starts_a_user_daemon_when_none_answers(daemon_factory):
    d = daemon_factory(start=False)
    env = {"VGPU_SOCKET": str(d.base / "user" / "vgpud.sock")}
    env["VGPU_RUNTIME_DIR"] = str(d.base / "user")
    r = d.cli("run", "--mem", "64M", "--", "true", env=env)
    try:
        assert r.returncode == 0, r.stderr
        assert r.stderr.startswith("vgpuctl: started a user daemon on "), r.stderr
        assert r.stderr.splitlines()[1].startswith("vgpuctl: job 1 on GPU 0 ")
        r2 = d.cli("run", "-q", "--mem", "64M", "--", "true", env=env)
        assert r2.returncode == 0 and "daemon" not in r2.stderr   # the same one, silently
    finally:
        stop_user_daemon(d.base / "user" / "vgpud.sock")


def user_env(d) -> dict[str, str]:
    """An environment where no daemon answers and `run` starts one: socket
    and runtime dir under d's base, d's state dir."""
    return {"VGPU_SOCKET": str(d.base / "user" / "vgpud.sock"),
            "VGPU_RUNTIME_DIR": str(d.base / "user")}


def ps_all(d, env) -> list[dict]:
    r = d.cli("ps", "--all", "--json", env=env)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)["jobs"]


def parent_of(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[1])


def test_the_first_job_of_a_started_daemon_is_only_its_command(daemon_factory):
    """The daemon `run` starts is no process of the job that started it:
    the job ends with its command, `kill` never signals the daemon, and
    the memory it held is free again for the next job."""
    d = daemon_factory(gpus="1x16G", start=False)
    env = user_env(d)
    sock = d.base / "user" / "vgpud.sock"
    p = d.popen("run", "-q", "--mem", "8G", "--", "sleep", "60", env=env)
    try:
        first = wait_for(lambda: next((j for j in ps_all(d, env) if j["pids"]), None)
                         if sock.exists() else None, timeout=30, what="the first job's command")
        from vgpuctl.client.connection import Client
        with Client.connect(sock) as c:
            daemon_pid = c.call("ping")["daemon"]["pid"]
        assert daemon_pid not in first["pids"]
        assert parent_of(daemon_pid) != p.pid
        r = d.cli("kill", first["id"], env=env)
        assert r.returncode == 0, r.stderr
        assert str(daemon_pid) not in r.stdout.split()
        assert p.wait(20) == 128 + signal.SIGTERM
        wait_for(lambda: [j["state"] for j in ps_all(d, env)] == ["ended"],
                 what="the first job to end with its command")
        with Client.connect(sock) as c:
            assert c.call("ping")["daemon"]["pid"] == daemon_pid     # untouched
        again = d.cli("run", "-q", "--mem", "8G", "--", "true", env=env)
        assert again.returncode == 0, again.stderr      # the first one's 8G are free
        assert all(daemon_pid not in j["pids"] for j in ps_all(d, env))
    finally:
        kill_and_reap(p)
        stop_user_daemon(sock, kill_jobs=True)


def stop_user_daemon(sock: Path, kill_jobs: bool = False) -> None:
    """Stop the daemon on sock (and with kill_jobs, what its jobs run)."""
    from vgpuctl.client.connection import Client
    from vgpuctl.errors import VgpuError
    try:
        with Client.connect(sock) as c:
            pid = c.call("ping")["daemon"]["pid"]
            jobs = c.call("ps")["jobs"] if kill_jobs else []
        for p in {p for j in jobs for p in j["pids"]} - {pid}:
            try:
                os.kill(p, signal.SIGKILL)
            except OSError:
                pass
        os.kill(pid, signal.SIGTERM)
        wait_for(lambda: not sock.exists(), what="the user daemon to stop")
    except (OSError, VgpuError):
        pass


def one_error_line(r: subprocess.CompletedProcess[str]) -> str:
    lines = r.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("vgpuctl: error: "), r.stderr
    assert lines[0].count("error:") == 1 and "Traceback" not in r.stderr, r.stderr
    return lines[0]


def test_a_daemon_that_cannot_start_is_its_own_error_once(daemon_factory):
    """What stopped the user daemon's start is the error `run` reports:
    its one line, once, with its exit status (9: no NVML; 78: a bad
    configuration file)."""
    d = daemon_factory(start=False)
    env = user_env(d)
    no_gpu = {**env, "VGPU_SIM_STATE": str(d.base / "no" / "such" / "dir")}
    r = d.cli("run", "--mem", "1G", "--", "true", env=no_gpu)
    line = one_error_line(r)
    assert r.returncode == 9, r.stderr
    assert line.startswith("vgpuctl: error: cannot start a user daemon: NVML unavailable")
    d.config.write_text("tick_ms = 1\n")
    r = d.cli("run", "--mem", "1G", "--", "true", env=env)
    assert r.returncode == 78, r.stderr
    assert one_error_line(r).endswith(f"{d.config}: tick_ms: must be 10 to 10000, got 1")
    assert not (d.base / "user" / "vgpud.sock").exists()


def test_a_daemon_killed_before_it_is_ready_is_one_line_naming_its_log(daemon_factory,
                                                                        tmp_path):
    d = daemon_factory(start=False)
    site = tmp_path / "site"
    site.mkdir()
    # The daemon's interpreter dies at once, as the OOM killer or a
    # `kill -9` would leave it.
    (site / "sitecustomize.py").write_text(
        "import os, signal, sys\n"
        "if 'daemon' in sys.argv:\n"
        "    os.kill(os.getpid(), signal.SIGKILL)\n")
    env = {**user_env(d), "PYTHONPATH": str(site)}
    try:
        r = d.cli("run", "--mem", "1G", "--", "true", env=env)
        assert r.returncode == 3, r.stderr
        line = one_error_line(r)
        assert "exited before it was ready" in line and str(d.state / "vgpud.log") in line
    finally:
        stop_user_daemon(d.base / "user" / "vgpud.sock")


def test_runs_that_start_a_daemon_together_share_the_one_started(daemon_factory):
    """Each of several `run`s may start a daemon at once: one of them holds
    the lock, and every run is a job of that one."""
    d = daemon_factory(start=False)
    env = user_env(d)
    runs = [d.popen("run", "--mem", "1G", "--", "true", env=env) for _ in range(3)]
    try:
        outs = [p.communicate(timeout=60) for p in runs]
        assert [p.returncode for p in runs] == [0, 0, 0], outs
        assert sum("started a user daemon" in err for _, err in outs) == 1, outs
        assert len(ps_all(d, env)) == 3
    finally:
        for p in runs:
            kill_and_reap(p)
        stop_user_daemon(d.base / "user" / "vgpud.sock")


def test_a_relative_socket_is_the_one_in_the_current_directory(daemon_factory):
    """The user daemon starts in /: a relative --socket must not become a
    path under / (it used to create directories there and time out)."""
    d = daemon_factory(start=False)
    env = {"VGPU_RUNTIME_DIR": str(d.base / "user")}
    env.pop("VGPU_SOCKET", None)
    try:
        r = d.cli("run", "-q", "--socket", "rel/vgpud.sock", "--mem", "1G", "--", "true",
                  env=env, cwd=d.base, timeout=30)
        assert r.returncode == 0, r.stderr
        assert (d.base / "rel" / "vgpud.sock").is_socket()
        ps = d.cli("ps", "--json", "--socket", "rel/vgpud.sock", cwd=d.base)
        assert ps.returncode == 0, ps.stderr
    finally:
        stop_user_daemon(d.base / "rel" / "vgpud.sock")


def in_deleted_dir(gone: Path, argv: list[str], env: dict[str, str]):
    """Run argv with its current directory deleted under it, as a shell
    left in a removed directory runs it."""
    gone.mkdir()
    return subprocess.run(["sh", "-c", 'cd "$0" && rmdir "$0" && exec "$@"', str(gone), *argv],
                          env=env, capture_output=True, text=True, timeout=60)


def test_run_from_a_deleted_directory_runs_the_command_there(daemon, tmp_path):
    r = in_deleted_dir(tmp_path / "gone", [*vgpuctl_argv(), "run", "-q", "--mem", "1G", "--",
                                           "echo", "ran"], daemon.env)
    assert (r.returncode, r.stdout, r.stderr) == (0, "ran\n", "")
    job = daemon.jobs(all_jobs=True)[-1]
    assert job["cwd"] == f"{tmp_path / 'gone'} (deleted)"
    # A relative path can't be found from there: one line, a usage error.
    r = in_deleted_dir(tmp_path / "gone2", [*vgpuctl_argv(), "ps", "--socket", "rel.sock"],
                       daemon.env)
    assert r.returncode == 2, r.stderr
    assert r.stderr == ("vgpuctl: error: rel.sock: a relative path, but the current "
                        "directory was deleted: give an absolute one\n")


def test_vgpuctl_alone_is_status(daemon):
    a = daemon.cli(env={"COLUMNS": "200"})
    b = daemon.cli("status", env={"COLUMNS": "200"})
    assert a.returncode == b.returncode == 0
    assert a.stdout.splitlines()[0] == b.stdout.splitlines()[0]


def test_run_says_its_job_id_and_gpu_on_stderr_unless_quiet(daemon):
    r = daemon.cli("run", "--mem", "1G", "--", sys.executable, "-c",
                   "import os; print(os.environ['VGPU_JOB'])")
    assert r.returncode == 0, r.stderr
    uuid = daemon.call("ps")["gpus"][0]["uuid"]
    assert r.stderr == f"vgpuctl: job {r.stdout.strip()} on GPU 0 ({uuid[:12]})\n"
    q = daemon.cli("run", "-q", "--mem", "1G", "--", "true")
    assert (q.returncode, q.stderr) == (0, "")


def test_a_limit_no_larger_than_a_context_is_warned(daemon):
    """The simulator's context takes 300M of the job's limit (as a real
    GPU's takes 300-500M): a 256M job can't even create one."""
    r = daemon.cli("run", "-q", "--mem", "256M", "--", "true")
    assert r.returncode == 0
    assert r.stderr.startswith("vgpuctl: warning: --mem 256M is not more than a CUDA context "
                               "takes on this GPU (about 300M"), r.stderr
    assert len(r.stderr.splitlines()) == 1


def test_run_with_verbose_names_the_daemon(daemon):
    r = daemon.cli("run", "-v", "--mem", "64M", "--", "true")
    assert r.returncode == 0
    assert str(daemon.socket) in r.stderr and "GPU" in r.stderr


def test_argv_is_passed_verbatim(daemon):
    r = daemon.cli("run", "--mem", "64M", "printf", "%s|", "--mem", "a b", "-v")
    assert r.returncode == 0 and r.stdout == "--mem|a b|-v|"


def test_options_after_the_commands_first_word_are_the_commands(daemon):
    r = daemon.cli("run", "--mem", "64M", "--", sys.executable, "-c",
                   "import sys; print(sys.argv[1:])", "--cores", "3", "--mem", "1G")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "['--cores', '3', '--mem', '1G']"


@pytest.mark.parametrize("args", [["ps"], ["ps", "--json"], ["status"]])
def test_a_view_into_a_closed_pipe_exits_0_quietly(daemon, args):
    # `vgpuctl ps | head` once head has read what it wanted.
    p = daemon.popen("run", "--mem", "64M", "--", "sleep", "60")
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        wait_for(lambda: daemon.jobs() and daemon.jobs()[0]["pids"], what="the job")
        r = subprocess.run([*vgpuctl_argv(), *args], env=daemon.env, stdout=write_end,
                           stderr=subprocess.PIPE, text=True, timeout=60)
        assert (r.returncode, r.stderr) == (0, "")
    finally:
        os.close(write_end)
        p.kill()
        p.wait()


def test_run_loads_only_what_it_needs(daemon):
    # Every job's start pays for what `vgpuctl run` imports (bench/run_overhead.py).
    script = ("import atexit, sys\n"
              "atexit.register(lambda: print(*sorted(sys.modules), file=sys.stderr))\n"
              "from vgpuctl.cli import main\n"
              "main()\n")
    r = subprocess.run([sys.executable, "-c", script, "run", "--mem", "64M", "--", "true"],
                       env=daemon.env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    loaded = set(r.stderr.split())
    assert "vgpuctl.cli.commands.run" in loaded
    heavy = {"rich", "pynvml", "asyncio", "psutil", "cffi", "_cffi_backend", "sqlite3"}
    assert not loaded & heavy
    assert {m for m in loaded if m.startswith("vgpuctl.cli.commands")} == {
        "vgpuctl.cli.commands", "vgpuctl.cli.commands.run"}
    assert not {m for m in loaded if m.startswith(("vgpuctl.daemon", "vgpuctl.system.busy"))}
