"""The systemd unit (checked by systemd-analyze where present) and the
sd_notify protocol against a fake NOTIFY_SOCKET."""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from support import REPO
from support.daemon import needs_native

from vgpuctl.system import notify

ROOT = REPO
UNIT = ROOT / "etc" / "systemd" / "vgpud.service"


def unit_settings() -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for line in UNIT.read_text().splitlines():
        line = line.strip()
        if not line or line.startswith(("#", ";", "[")):
            continue
        k, _, v = line.partition("=")
        out.setdefault(k.strip(), []).append(v.strip())
    return out


def install_prefix() -> str:
    """Where the README's server install puts vgpuctl: the venv it makes."""
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## Run it on a server", 1)[1].split("\n## ", 1)[0]
    venvs = re.findall(r"python3 -m venv (/\S+)", section)
    assert len(venvs) == 1, "the README's server install makes one venv"
    assert f"{venvs[0]}/bin/pip install" in section
    return venvs[0]


def test_the_unit_runs_vgpuctl_where_the_readme_installs_it():
    s = unit_settings()
    exe = f"{install_prefix()}/bin/vgpuctl"
    assert s["ExecStart"][0].split()[0] == exe
    assert s["ExecReload"][0].split()[0] == exe
    # ...and doctor's advice reinstalls into that venv when run from it.
    from vgpuctl.ops import diagnosis

    fix = diagnosis.reinstall_fix()
    assert f"{sys.prefix}/bin/pip install --force-reinstall" in fix
    assert "pip install vgpuctl" not in fix


def vgpuctl_exe() -> str:
    exe = Path(sys.executable).parent / "vgpuctl"
    return str(exe) if exe.exists() else shutil.which("vgpuctl") or ""


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="no systemd-analyze")
def test_unit_verifies(tmp_path):
    exe = vgpuctl_exe()
    if not exe:
        pytest.skip("vgpuctl is not installed as a command")
    text = UNIT.read_text().replace(f"{install_prefix()}/bin/vgpuctl", exe)
    unit = tmp_path / "vgpud.service"
    unit.write_text(text)
    r = subprocess.run(["systemd-analyze", "verify", "--man=no", str(unit)],
                       capture_output=True, text=True, timeout=60)
    # systemd-analyze exits 0 on settings it ignores: every line that names
    # our unit is a problem.
    problems = [line for line in (r.stdout + r.stderr).splitlines()
                if "vgpud" in line or str(tmp_path) in line]
    assert r.returncode == 0 and not problems, r.stdout + r.stderr


def test_unit_contract():
    s = unit_settings()
    assert s["Type"] == ["notify"]
    assert s["ExecStart"] == [f"{install_prefix()}/bin/vgpuctl daemon"]
    assert s["ExecReload"] == [f"{install_prefix()}/bin/vgpuctl daemon reload"]
    # SIGTERM to the daemon only; jobs are not its children and keep running.
    assert s["KillMode"] == ["mixed"]
    assert s["Restart"] == ["on-failure"]
    for d in ("RuntimeDirectory", "StateDirectory", "ConfigurationDirectory"):
        assert s[d] == ["vgpu"]
    # Job regions in /run/vgpu survive a stop, so a restart re-adopts jobs.
    assert s["RuntimeDirectoryPreserve"] == ["yes"]
    # Hardened, but /dev/nvidia* and every /proc/<pid> stay reachable.
    assert s["NoNewPrivileges"] == ["yes"] and s["ProtectSystem"] == ["strict"]
    assert "char-nvidia* rw" in s["DeviceAllow"]
    for closes_gpus in ("PrivateDevices", "ProtectClock", "ProtectProc", "ProcSubset"):
        assert s.get(closes_gpus, ["no"]) in (["no"], ["false"], ["default"]), closes_gpus


def test_cron_entry_is_valid_and_escapes_percent():
    cron = (ROOT / "etc" / "cron.d" / "vgpu-report").read_text()
    jobs = [line for line in cron.splitlines()
            if line.strip() and not line.startswith("#") and "=" not in line.split()[0]]
    assert jobs
    for line in jobs:
        fields = line.split(None, 6)
        assert len(fields) == 7 and fields[5] == "root"
        assert fields[6].startswith("vgpuctl report ")
        assert not re.search(r"(?<!\\)%", fields[6]), "cron needs \\% in commands"


# -- sd_notify -------------------------------------------------------------------
@pytest.fixture
def notify_socket(tmp_path):
    path = tmp_path / "notify.sock"
    s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    s.bind(str(path))
    s.settimeout(10)
    yield str(path), s
    s.close()


def recv(s: socket.socket) -> dict[str, str]:
    data = s.recv(4096).decode()
    return dict(line.split("=", 1) for line in data.split("\n") if line)


def test_ready_status_stopping(notify_socket):
    path, s = notify_socket
    env = {"NOTIFY_SOCKET": path}
    assert notify.ready("serving 0 jobs", env=env)
    assert recv(s) == {"READY": "1", "STATUS": "serving 0 jobs"}
    assert notify.ready("two\nlines", env=env)
    assert recv(s) == {"READY": "1", "STATUS": "two lines"}
    assert notify.stopping(env=env)
    assert recv(s) == {"STOPPING": "1"}


def test_reloading_carries_monotonic_usec(notify_socket):
    path, s = notify_socket
    before = time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000
    assert notify.reloading(env={"NOTIFY_SOCKET": path})
    msg = recv(s)
    after = time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000
    assert msg["RELOADING"] == "1"
    assert before <= int(msg["MONOTONIC_USEC"]) <= after


def test_abstract_socket():
    name = f"vgpu-test-notify-{os.getpid()}"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
        s.bind("\0" + name)
        s.settimeout(10)
        assert notify.ready(env={"NOTIFY_SOCKET": "@" + name})
        assert recv(s) == {"READY": "1"}


def test_unset_is_a_noop(tmp_path):
    assert notify.ready(env={}) is False
    assert notify.stopping(env={"NOTIFY_SOCKET": ""}) is False
    # A socket that is gone: the daemon carries on.
    assert notify.ready(env={"NOTIFY_SOCKET": str(tmp_path / "gone.sock")}) is False


def test_from_the_environment_in_a_child(notify_socket):
    path, s = notify_socket
    r = subprocess.run([sys.executable, "-c", "from vgpuctl.system import notify; "
                        "raise SystemExit(0 if notify.ready() else 1)"],
                       env={**os.environ, "NOTIFY_SOCKET": path}, timeout=60)
    assert r.returncode == 0
    assert recv(s) == {"READY": "1"}


# -- the daemon's side of the handshake ---------------------------------------------
@needs_native
def test_daemon_notify_handshake_and_jobs_survive_sigterm(notify_socket):
    import signal
    import threading

    import psutil

    from vgpuctl.ops.showcase import Demo, DemoJob

    path, s = notify_socket
    with Demo(seconds=60, jobs=(DemoJob("survivor", "1G", 50, "hard", 1000),)) as d:
        seen: dict[str, object] = {}

        def first_message() -> None:
            # The moment READY=1 arrives, clients must be able to connect.
            seen["msg"] = recv(s)
            probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                probe.connect(str(d.socket))
                seen["connect"] = True
            except OSError as e:
                seen["connect"] = e
            finally:
                probe.close()

        t = threading.Thread(target=first_message, daemon=True)
        t.start()
        d.start_daemon(extra_env={"NOTIFY_SOCKET": path})
        t.join(15)
        assert seen["msg"]["READY"] == "1" and "STATUS" in seen["msg"]
        assert seen["connect"] is True

        d.start_jobs()
        job = psutil.Process(d.procs["survivor"].pid)
        os.kill(d.daemon.pid, signal.SIGHUP)
        msg = recv(s)
        assert msg["RELOADING"] == "1" and int(msg["MONOTONIC_USEC"]) > 0
        assert recv(s)["READY"] == "1"
        assert d.ps()["daemon"]["pid"] == d.daemon.pid      # still serving

        os.kill(d.daemon.pid, signal.SIGTERM)
        assert recv(s)["STOPPING"] == "1"
        assert d.daemon.wait(15) == 0
        # The job is not the daemon's child: it runs on.
        assert job.is_running() and job.status() != psutil.STATUS_ZOMBIE
        assert all(c.is_running() for c in job.children())


# -- the journal ----------------------------------------------------------------------
def journal_stream(path: Path) -> str:
    """JOURNAL_STREAM as systemd sets it for a service whose stderr is path."""
    st = path.stat()
    return f"{st.st_dev}:{st.st_ino}"


@needs_native
def test_under_journald_lines_carry_priorities_and_no_timestamp(daemon_factory):
    """With stderr a journal stream (JOURNAL_STREAM names it), each line
    starts with its syslog priority, so `journalctl -p err` finds errors, and
    has no timestamp of its own: the journal keeps one."""
    import signal

    from support.daemon import wait_for

    d = daemon_factory(start=False)
    d.log.touch()
    d.env["JOURNAL_STREAM"] = journal_stream(d.log)
    d.start()
    d.config.write_text("tick_ms = 1\n")
    d.proc.send_signal(signal.SIGHUP)
    wait_for(lambda: "reload failed" in d.log.read_text(), what="the reload error")
    lines = d.log.read_text().splitlines()
    assert lines[0].startswith(f"<6>vgpud {d.proc.pid} listening on "), lines[0]
    assert [line for line in lines if "reload failed" in line] == [
        f"<3>reload failed, keeping the previous configuration: {d.config}: tick_ms: "
        f"must be 10 to 10000, got 1"]
    assert all(re.match(r"<[0-7]>", line) for line in lines), lines


def test_elsewhere_lines_carry_time_pid_and_level(tmp_path):
    import logging

    from vgpuctl.daemon import logs
    from vgpuctl.system import journal

    out = open(tmp_path / "log", "w")
    ours = journal_stream(tmp_path / "log")
    other = ours + "1"      # the journal is another stream
    assert not journal.is_journal(out, {"JOURNAL_STREAM": other})
    assert journal.is_journal(out, {"JOURNAL_STREAM": ours})
    rec = logging.LogRecord("vgpuctl.daemon", logging.WARNING, __file__, 1, "two\nlines",
                            None, None)
    # A message is one line (its newline escaped); a traceback's lines each
    # get the prefix (tests/daemon/test_logs.py).
    assert logs.JournalFormatter("%(message)s").format(rec) == "<4>two\\nlines"
    out.close()


def test_a_bad_config_at_start_is_an_error_in_the_journal(tmp_path):
    """The unit's most common failure, a bad config file, is found by
    `journalctl -p err` too: the CLI edge's line carries <3> there."""
    from support.daemon import vgpuctl_argv

    cfg = tmp_path / "vgpu.toml"
    cfg.write_text("tick_ms = 1\n")
    log = tmp_path / "journal"
    with open(log, "w") as out:
        env = {k: v for k, v in os.environ.items() if not k.startswith("VGPU_")}
        env["JOURNAL_STREAM"] = journal_stream(log)
        r = subprocess.run([*vgpuctl_argv(), "daemon", "--config", str(cfg), "--socket",
                            str(tmp_path / "s.sock"), "--state-dir", str(tmp_path / "st")],
                           stderr=out, env=env, timeout=60)
    assert r.returncode == 78
    assert log.read_text() == (f"<3>vgpuctl: error: {cfg}: tick_ms: must be 10 to 10000, "
                               f"got 1\n")
