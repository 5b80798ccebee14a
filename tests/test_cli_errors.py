"""Every error a user can cause: one line on stderr, the right exit code, no
traceback. None of these needs a daemon."""

from __future__ import annotations

import subprocess

import pytest
from daemon_fixture import vgpuctl_argv


def vgpuctl(*args, env=None, tmp_path=None):
    import os
    e = {k: v for k, v in os.environ.items() if not k.startswith("VGPU_")}
    if tmp_path is not None:
        e["VGPU_SOCKET"] = str(tmp_path / "nobody-here.sock")
    e.update(env or {})
    return subprocess.run([*vgpuctl_argv(), *args], capture_output=True, text=True, env=e,
                          timeout=60)


@pytest.mark.parametrize("args,code,needle", [
    (["run", "--mem", "4X", "--", "true"], 2, "--mem: '4X': unknown unit"),
    (["run", "--mem", "lots", "--", "true"], 2, "not a size"),
    (["run", "--mem", "1G", "--core", "0", "--", "true"], 2, "1 to 100"),
    (["run", "--mem", "1G", "--core", "101", "--", "true"], 2, "1 to 100"),
    (["run", "--mem", "1G", "--core", "half", "--", "true"], 2, "1 to 100"),
    (["run", "--mem", "1G", "--policy", "fair", "--", "true"], 2, "hard or soft"),
    (["run", "--mem", "1G"], 2, "no command given"),
    (["run", "--mem", "1G", "--cores", "3", "--", "true"], 2, "no such option: --cores"),
    (["run", "--mem"], 2, "--mem needs a value"),
    (["run", "--mem", "1G", "--"], 2, "no command given"),
    (["kill", "abc"], 2, "not a job id"),
    (["kill", "1", "--signal", "NOPE"], 2, "not a signal"),
    (["set", "1"], 2, "nothing to change"),
    (["set", "1", "--core", "200"], 2, "1 to 100"),
    (["set", "x", "--core", "20"], 2, "not a job id"),
])
def test_usage_errors(args, code, needle, tmp_path):
    r = vgpuctl(*args, tmp_path=tmp_path)
    assert r.returncode == code, r.stderr
    lines = r.stderr.splitlines()
    assert len(lines) == 1, r.stderr
    assert lines[0].startswith("vgpuctl: error: ") and needle in lines[0], lines[0]
    assert r.stdout == ""


@pytest.mark.parametrize("args", [["ps", "--json"], ["ps"], ["kill", "3"],
                                  ["set", "3", "--core", "10"], ["top", "-n", "1"]])
def test_no_daemon_is_one_clear_line(args, tmp_path):
    r = vgpuctl(*args, tmp_path=tmp_path)
    assert r.returncode == 3
    lines = r.stderr.splitlines()
    assert len(lines) == 1 and "no vgpuctl daemon answers" in lines[0], r.stderr
    assert "Traceback" not in r.stderr and r.stdout == ""


def test_daemon_with_a_bad_config_names_file_key_and_reason(tmp_path):
    cfg = tmp_path / "vgpu.toml"
    cfg.write_text("tick_ms = 1\n")
    r = vgpuctl("daemon", "--config", str(cfg), "--socket", str(tmp_path / "s.sock"),
                "--runtime-dir", str(tmp_path / "run"), "--state-dir", str(tmp_path / "st"))
    assert r.returncode == 78
    assert r.stderr.strip() == f"vgpuctl: error: {cfg}: tick_ms: must be 10 to 10000, got 1"


def test_run_parses_its_options_like_click_would():
    from vgpuctl.client.launch import parse_argv

    opts, cmd = parse_argv(["--mem=1G", "--core", "30", "-v", "python", "-c", "x", "--mem", "2"])
    assert (opts["mem"], opts["core"], opts["verbose"]) == ("1G", "30", True)
    assert cmd == ["python", "-c", "x", "--mem", "2"]
    opts, cmd = parse_argv(["--gpu", "1", "--", "--odd-name", "-v"])
    assert opts["gpu"] == "1" and cmd == ["--odd-name", "-v"]
    assert parse_argv(["--mem", "1G", "--help"]) is None       # click prints the help


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
    import os
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
    assert in_process("kill", "abc", capsys=capsys) == (
        2, "", "vgpuctl: error: 'abc' is not a job id (a number, as `vgpuctl ps` shows)\n")
    code, out, err = in_process("kill", capsys=capsys)
    assert (code, out) == (2, "")
    assert err == "vgpuctl: error: missing argument 'JOB' (see vgpuctl kill --help)\n"


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
