"""Every error a user can cause: one line on stderr, the right exit code, no
traceback. None of these needs a daemon."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from support.daemon import vgpuctl_argv


def vgpuctl(*args, env=None, tmp_path=None, timeout=60):
    e = {k: v for k, v in os.environ.items() if not k.startswith("VGPU_")}
    if tmp_path is not None:
        e["VGPU_SOCKET"] = str(tmp_path / "nobody-here.sock")
    e.update(env or {})
    return subprocess.run([*vgpuctl_argv(), *args], capture_output=True, text=True, env=e,
                          timeout=timeout)


@pytest.mark.parametrize("args,code,needle", [
    (["run", "--mem", "4X", "--", "true"], 2, "--mem: '4X': unknown unit"),
    (["run", "--mem", "lots", "--", "true"], 2, "not a size"),
    (["run", "--mem", "4", "--", "true"], 2, "--mem: '4' has no unit: write 4G or 4M"),
    (["run", "--mem", "99999999999999999999999G", "--", "true"], 2, "too large"),
    (["set", "1", "--mem", "512"], 2, "--mem: '512' has no unit: write 512G or 512M"),
    (["run", "--mem", "1G", "--core", "0", "--", "true"], 2, "1 to 100"),
    (["run", "--mem", "1G", "--core", "101", "--", "true"], 2, "1 to 100"),
    (["run", "--mem", "1G", "--core", "half", "--", "true"], 2, "1 to 100"),
    (["run", "--mem", "1G", "--policy", "fair", "--", "true"], 2, "hard or soft"),
    (["run", "--mem", "1G"], 2, "no command given"),
    (["run", "--mem", "1G", "--cores", "3", "--", "true"], 2, ("no such option", "'--cores'")),
    (["run", "--cores", "3", "true"], 2, ("no such option", "'--cores'")),
    (["run", "--mem"], 2, ("'--mem'", "requires an argument")),
    (["run", "--mem", "1G", "-core", "30", "--", "true"], 2, "did you mean --core?"),
    (["ps", "-fields", "id"], 2, "did you mean --fields?"),
    (["list"], 2, "did you mean vgpuctl ps (jobs) or gpus (GPUs)?"),
    (["stats"], 2, "report (usage) or sim stats"),
    (["run", "--mem", "1G", "--"], 2, "no command given"),
    (["kill", ""], 2, "not a job id or name"),
    (["kill", "1", "12345678901234567890"], 2, "not a job id"),
    (["help", "nope"], 2, "no help topic or command 'nope'"),
    (["daemon", "--user", "reload"], 2, "options go with `vgpuctl daemon` alone"),
    (["kill", "1", "--signal", "NOPE"], 2, "not a signal"),
    (["set", "1"], 2, "nothing to change"),
    (["set", "1", "--core", "200"], 2, "1 to 100"),
    (["set", "x" * 65, "--core", "20"], 2, "not a job id or name"),
])
def test_usage_errors(args, code, needle, tmp_path):
    r = vgpuctl(*args, tmp_path=tmp_path)
    assert r.returncode == code, r.stderr
    lines = r.stderr.splitlines()
    assert len(lines) == 1, r.stderr
    assert lines[0].startswith("vgpuctl: error: "), lines[0]
    for n in (needle,) if isinstance(needle, str) else needle:
        assert n in lines[0], lines[0]
    assert r.stdout == ""


@pytest.mark.parametrize("args", [["ps", "--json"], ["ps"], ["kill", "3"],
                                  ["set", "3", "--core", "10"], ["top", "-n", "1"]])
def test_no_daemon_is_one_clear_line(args, tmp_path):
    r = vgpuctl(*args, tmp_path=tmp_path)
    assert r.returncode == 3
    lines = r.stderr.splitlines()
    assert len(lines) == 1 and "no vgpuctl daemon answers" in lines[0], r.stderr
    assert "Traceback" not in r.stderr and r.stdout == ""


@pytest.mark.parametrize("sim,code,needle", [
    ("1x16G", 9, "NVML unavailable"),           # the simulator's state can't be opened
    ("2xfoo", 2, "VGPU_SIM='2xfoo'"),
])
def test_status_without_a_daemon_says_why_nvml_failed(sim, code, needle, tmp_path):
    """`status` with no daemon reads NVML itself: when that fails, NVML's
    error is the line and the status, and it says no daemon answers either."""
    r = vgpuctl("status", tmp_path=tmp_path,
                env={"VGPU_SIM": sim, "VGPU_SIM_STATE": str(tmp_path / "no" / "such")})
    assert r.returncode == code, r.stderr
    line = r.stderr.splitlines()[-1]
    assert line.startswith(f"vgpuctl: error: {needle}"), r.stderr
    assert "no vgpuctl daemon answers" in line and r.stdout == ""


def test_daemon_with_a_bad_config_names_file_key_and_reason(tmp_path):
    cfg = tmp_path / "vgpu.toml"
    cfg.write_text("tick_ms = 1\n")
    r = vgpuctl("daemon", "--config", str(cfg), "--socket", str(tmp_path / "s.sock"),
                "--runtime-dir", str(tmp_path / "run"), "--state-dir", str(tmp_path / "st"))
    assert r.returncode == 78
    assert r.stderr.strip() == f"vgpuctl: error: {cfg}: tick_ms: must be 10 to 10000, got 1"


def user_daemon_dirs(tmp_path, which, make):
    """The environment of a user daemon whose runtime or state dir (which)
    exists already, made by make(path)."""
    dirs = {"runtime": tmp_path / "run", "state": tmp_path / "state"}
    dirs[which].mkdir()
    make(dirs[which])
    return dirs[which], {"VGPU_SIM": "1x16G", "VGPU_SIM_STATE": str(tmp_path / "sim"),
                         "VGPU_SOCKET": str(tmp_path / "s.sock"),
                         "VGPU_RUNTIME_DIR": str(dirs["runtime"]),
                         "VGPU_STATE_DIR": str(dirs["state"]),
                         "VGPU_CONFIG": "/dev/null"}


def stop_daemon_on(sock):
    """Stop a daemon left listening on sock (by a test that failed)."""
    import signal

    from vgpuctl.client.connection import Client
    try:
        with Client.connect(sock, timeout=5) as c:
            os.kill(c.call("ping")["daemon"]["pid"], signal.SIGTERM)
    except Exception:
        pass


def not_ours(path):
    if os.geteuid() != 0:
        pytest.skip("giving a directory to another uid takes root")
    os.chown(path, 65534, 65534)


@pytest.mark.parametrize("which", ["runtime", "state"])
@pytest.mark.parametrize("make,needle", [
    (lambda p: p.chmod(0o777), "is writable by others (mode 0777)"),
    (lambda p: p.chmod(0o730), "is writable by others (mode 0730)"),
    (not_ours, "belongs to uid 65534, not to you"),
], ids=["world-writable", "group-writable", "not-ours"])
@pytest.mark.parametrize("argv", [["daemon", "--user"], ["run", "--mem", "1G", "--", "true"]],
                         ids=["daemon", "run"])
def test_a_user_daemon_refuses_a_dir_others_could_write(tmp_path, which, make, needle, argv):
    """A user daemon's runtime and state dirs are its own: one that is not
    (made by another user in /tmp, or open to others, who could put a
    symlink where the daemon writes) is refused, one line, exit 8."""
    path, env = user_daemon_dirs(tmp_path, which, make)
    try:
        r = vgpuctl(*argv, env=env, timeout=30)
    except subprocess.TimeoutExpired:
        pytest.fail("the daemon started and ran")
    finally:
        stop_daemon_on(tmp_path / "s.sock")
    assert r.returncode == 8, r.stderr
    line = r.stderr.splitlines()[-1]
    # `run` checks the state dir (its log) itself; the daemon it starts, the runtime dir.
    started = "cannot start a user daemon: " if (argv[0], which) == ("run", "runtime") else ""
    assert line.startswith(f"vgpuctl: error: {started}{path} {needle}"), r.stderr
    assert "VGPU_RUNTIME_DIR, VGPU_STATE_DIR" in line and "Traceback" not in r.stderr
    assert not (tmp_path / "s.sock").exists()


@pytest.mark.parametrize("args,needle,help_of", [
    (["kill"], "missing argument 'JOB'", "vgpuctl kill"),
    (["frob"], "no such command 'frob'", "vgpuctl"),
    (["set", "1", "--bogus", "x"], "no such option '--bogus'", "vgpuctl set"),
    (["top", "-n", "x"], "'x' is not a valid integer", "vgpuctl top"),
])
def test_click_usage_errors_are_one_line_too(args, needle, help_of, tmp_path):
    r = vgpuctl(*args, tmp_path=tmp_path)
    assert r.returncode == 2, r.stderr
    assert r.stderr.splitlines() == [f"vgpuctl: error: {r.stderr[16:].strip()}"], r.stderr
    assert needle in r.stderr and r.stderr.rstrip().endswith(f"(see {help_of} --help)")
    assert "Usage:" not in r.stderr and r.stdout == ""


def test_output_into_a_closed_pipe_exits_0_quietly(tmp_path):
    # `vgpuctl ... | head` once head has what it wants: not an error.
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        for args in (["--help"], ["sim", "--help"]):
            r = subprocess.run([*vgpuctl_argv(), *args], stdout=write_end, stderr=subprocess.PIPE,
                               text=True, timeout=60)
            assert (r.returncode, r.stderr) == (0, ""), args
    finally:
        os.close(write_end)


def in_process(*argv, capsys):
    """`vgpuctl ARGV` through vgpuctl.cli.main in this process: (status, stdout, stderr)."""
    from vgpuctl import cli

    with pytest.raises(SystemExit) as exit_:
        cli.main(list(argv))
    out, err = capsys.readouterr()
    return exit_.value.code, out, err


def test_errors_in_process_are_the_same_line(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("VGPU_SOCKET", str(tmp_path / "nobody-here.sock"))
    assert in_process("kill", "", capsys=capsys) == (
        2, "", "vgpuctl: error: '' is not a job id or name (as `vgpuctl ps` shows)\n")
    code, out, err = in_process("kill", capsys=capsys)
    assert (code, out) == (2, "")
    assert err == "vgpuctl: error: missing argument 'JOB' (see vgpuctl kill --help)\n"


@pytest.fixture
def systemd_node(tmp_path, monkeypatch):
    """A node whose system daemon is installed as a systemd unit but not
    running, seen from the default sockets (no VGPU_SOCKET)."""
    from vgpuctl.system import paths

    if paths.SYSTEM_SOCKET.exists():
        pytest.skip("a system daemon's socket exists on this machine")
    unit = tmp_path / "vgpud.service"
    unit.write_text("[Service]\n")
    monkeypatch.setattr(paths, "SYSTEM_UNIT_FILES", (unit,))
    for k in [k for k in os.environ if k.startswith("VGPU_")]:
        monkeypatch.delenv(k)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path / "xdg"))
    monkeypatch.setenv("VGPU_DAEMON_WAIT", "0")


@pytest.mark.parametrize("root", [False, True], ids=["user", "root"])
@pytest.mark.parametrize("argv", [["ps"], ["run", "--mem", "1G", "--", "true"]])
def test_no_system_daemon_says_it_is_not_running_and_how_it_starts(systemd_node, root, argv,
                                                                    capsys, monkeypatch):
    monkeypatch.setattr(os, "geteuid", lambda: 0 if root else 1000)
    code, out, err = in_process(*argv, capsys=capsys)
    assert (code, out) == (3, ""), err
    line = err.splitlines()[-1]
    assert line.startswith("vgpuctl: error: no vgpuctl daemon answers"), err
    assert "the system daemon is not running" in line and "`systemctl start vgpud`" in line
    assert ("administrator" in line) is not root
    assert "start one with `vgpuctl daemon`" not in err


def _raise(exc):
    def f(*args, **kw):
        raise exc
    return f


def test_a_bug_is_one_line_naming_it(capsys, monkeypatch):
    monkeypatch.delenv("VGPU_DEBUG", raising=False)
    monkeypatch.setattr("vgpuctl.client.connection.connect", _raise(ZeroDivisionError("boom")))
    assert in_process("kill", "3", capsys=capsys) == (1, "", (
        "vgpuctl: internal error: ZeroDivisionError: boom "
        "(rerun with VGPU_DEBUG=1 for the traceback)\n"))


def test_a_bug_shows_its_traceback_with_vgpu_debug(capsys, monkeypatch):
    monkeypatch.setenv("VGPU_DEBUG", "1")
    monkeypatch.setattr("vgpuctl.client.connection.connect", _raise(ZeroDivisionError("boom")))
    code, out, err = in_process("kill", "3", capsys=capsys)
    assert (code, out) == (1, "")
    assert err.startswith("Traceback (most recent call last):")
    assert err.splitlines()[-1] == "vgpuctl: internal error: ZeroDivisionError: boom"


def test_ctrl_c_is_130(capsys, monkeypatch):
    monkeypatch.setattr("vgpuctl.client.connection.connect", _raise(KeyboardInterrupt()))
    code, out, err = in_process("kill", "3", capsys=capsys)
    assert (code, out, err.strip()) == (130, "", "")


INSTALLED = Path(sys.executable).parent / "vgpuctl"

# The three ways in: the installed command, `python -m vgpuctl`, and
# vgpuctl.cli.main called from Python (what the tests' fixtures use when
# nothing is installed).
ENTRY_POINTS = [
    pytest.param([str(INSTALLED)], id="installed", marks=pytest.mark.skipif(
        not INSTALLED.exists(), reason="no installed vgpuctl next to this Python")),
    pytest.param([sys.executable, "-m", "vgpuctl"], id="python-m"),
    pytest.param([sys.executable, "-c", "from vgpuctl.cli import main; main()"], id="cli.main"),
]


@pytest.mark.parametrize("argv0", ENTRY_POINTS)
def test_an_unknown_run_option_is_refused_by_every_entry_point(argv0, tmp_path):
    # Not taken for the command's first word: `--cores 3 -- true` is a typo
    # of --core, and must not start a job that runs `--cores`.
    env = {k: v for k, v in os.environ.items() if not k.startswith("VGPU_")}
    env["VGPU_SOCKET"] = str(tmp_path / "nobody-here.sock")
    r = subprocess.run([*argv0, "run", "--cores", "3", "--", "true"], capture_output=True,
                       text=True, env=env, timeout=60)
    assert r.returncode == 2, r.stderr
    assert r.stderr.splitlines() == [
        "vgpuctl: error: " + r.stderr[16:].strip()], r.stderr
    assert "no such option" in r.stderr and "'--cores'" in r.stderr
    assert r.stderr.rstrip().endswith("(see vgpuctl run --help)") and r.stdout == ""


@pytest.fixture
def run_job_calls(monkeypatch):
    """What `vgpuctl run` asks the library to run, instead of running it."""
    calls = []

    def record(**kw):
        calls.append(kw)
        return 0
    monkeypatch.setattr("vgpuctl.client.launch.run_job", record)
    return calls


def test_run_options_end_at_the_commands_first_word(run_job_calls, capsys):
    assert in_process("run", "--mem=1G", "--core", "30", "-v", "python", "-c", "x",
                      "--mem", "2", "--cores", "3", capsys=capsys) == (0, "", "")
    (kw,) = run_job_calls
    assert (kw["mem"], kw["core"], kw["verbose"]) == (1 << 30, 30, True)
    assert kw["command"] == ["python", "-c", "x", "--mem", "2", "--cores", "3"]


def test_run_options_end_at_the_double_dash(run_job_calls, capsys):
    assert in_process("run", "--gpu", "1", "--name", "n", "--", "--odd-name", "-v", "--",
                      capsys=capsys) == (0, "", "")
    (kw,) = run_job_calls
    assert (kw["gpu"], kw["name"], kw["mem"], kw["verbose"]) == ("1", "n", None, False)
    assert kw["command"] == ["--odd-name", "-v", "--"]


def test_run_refuses_an_unknown_option_before_the_command(run_job_calls, capsys):
    code, out, err = in_process("run", "--mem", "1G", "--cores", "3", "--", "true",
                                capsys=capsys)
    assert (code, out, run_job_calls) == (2, "", [])
    assert err.startswith("vgpuctl: error: no such option") and err.count("\n") == 1


def test_run_help_is_clicks(run_job_calls, capsys):
    code, out, err = in_process("run", "--mem", "1G", "--help", capsys=capsys)
    assert (code, err, run_job_calls) == (0, "", [])
    assert out.startswith("Usage: vgpuctl run [OPTIONS] [COMMAND]...")
    assert "--core PCT" in out
