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
