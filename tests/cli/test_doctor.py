"""vgpuctl doctor: each problem found, named, and given a fix; exit 1 on any."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from vgpuctl.core import protocol as P
from vgpuctl.ops import diagnosis
from vgpuctl.system import native, paths


def vgpuctl(args, env=None):
    exe = Path(sys.executable).parent / "vgpuctl"
    cmd = [str(exe)] if exe.exists() else [sys.executable, "-c",
                                           "from vgpuctl.cli import main; main()"]
    e = {k: v for k, v in os.environ.items() if not k.startswith("VGPU_")}
    e.update(env or {})
    return subprocess.run(cmd + list(args), capture_output=True, text=True, env=e,
                          stdin=subprocess.DEVNULL, timeout=120)


def native_built() -> bool:
    try:
        native.hook_library()
        native.sim_libdir()
    except Exception:
        return False
    return True


# -- config ---------------------------------------------------------------------
def test_config_missing_is_fine(tmp_path):
    env = {"HOME": str(tmp_path), "XDG_CONFIG_HOME": str(tmp_path / "cfg")}
    c = diagnosis.check_config(env)
    assert c.status == diagnosis.OK and "defaults" in c.detail


def test_config_bad_key_is_named(tmp_path):
    p = tmp_path / "vgpu.toml"
    p.write_text('tick_ms = "fast"\n')
    c = diagnosis.check_config({"VGPU_CONFIG": str(p)})
    assert c.status == diagnosis.FAIL
    assert str(p) in c.detail and "tick_ms" in c.detail and c.fix


def test_config_not_toml(tmp_path):
    p = tmp_path / "vgpu.toml"
    p.write_text("this is = = not toml\n")
    c = diagnosis.check_config({"VGPU_CONFIG": str(p)})
    assert c.status == diagnosis.FAIL and "TOML" in c.detail


def test_config_good(tmp_path):
    p = tmp_path / "vgpu.toml"
    p.write_text("tick_ms = 50\n")
    assert diagnosis.check_config({"VGPU_CONFIG": str(p)}).status == diagnosis.OK


# -- daemon socket ------------------------------------------------------------------
def test_no_daemon_is_a_warning(tmp_path):
    c = diagnosis.check_daemon({"VGPU_SOCKET": str(tmp_path / "vgpud.sock")})
    assert c.status == diagnosis.WARN and "no daemon" in c.detail and "vgpuctl run" in c.fix


def test_a_system_daemon_that_is_not_running_fails(tmp_path, monkeypatch):
    """On a node set up for a system daemon, `vgpuctl run` waits for it and
    starts none of its own: that it is not running is a failed check, fixed
    by starting it, not by letting `run` start a user daemon."""
    if paths.SYSTEM_SOCKET.exists():
        pytest.skip("a system daemon's socket exists on this machine")
    unit = tmp_path / "vgpud.service"
    unit.write_text("[Service]\n")
    monkeypatch.setattr(paths, "SYSTEM_UNIT_FILES", (unit,))
    c = diagnosis.check_daemon({"XDG_RUNTIME_DIR": str(tmp_path)})
    assert c.status == diagnosis.FAIL and "the system daemon is not running" in c.detail, c
    assert c.fix == "systemctl start vgpud"                  # root needs no sudo
    monkeypatch.setattr(diagnosis.os, "geteuid", lambda: 1000)
    c = diagnosis.check_daemon({"XDG_RUNTIME_DIR": str(tmp_path)})
    assert c.fix == "the node's administrator runs: systemctl start vgpud"


def test_fixes_never_tell_a_user_to_sudo(tmp_path, monkeypatch):
    """A user on a shared node is not its administrator: no fix of theirs
    is a sudo command; where there is no driver (the simulator), none says
    to upgrade it."""
    monkeypatch.setattr(diagnosis.os, "geteuid", lambda: 1000)
    c = diagnosis.check_daemon({"VGPU_SOCKET": str(tmp_path / "vgpud.sock")})
    assert "sudo" not in c.fix and "vgpuctl run" in c.fix and "administrator" in c.fix
    sim_fix = diagnosis._suspend_fix({"cuda": 12040}, {"VGPU_SIM": "1x16G"})
    assert "upgrade" not in sim_fix and "VGPU_SIM_DRIVER" in sim_fix
    assert "upgrade" not in diagnosis._suspend_fix({"cuda": None}, {})
    assert "R570" in diagnosis._suspend_fix({"cuda": 12040}, {})


def test_config_is_the_running_daemons_file(tmp_path):
    """The daemon that answers reads its own file, not the one this shell
    would: the check names and checks the daemon's."""
    theirs = tmp_path / "daemon.toml"
    theirs.write_text("tick_ms = 50\n")
    mine = tmp_path / "mine.toml"
    mine.write_text('tick_ms = "fast"\n')
    path = tmp_path / "vgpud.sock"
    t = _serve_once(path, P.encode(P.ok(daemon={"pid": 42, "config_file": str(theirs)})))
    c = diagnosis.check_config({"VGPU_SOCKET": str(path), "VGPU_CONFIG": str(mine)})
    t.join(10)
    assert c.status == diagnosis.OK and str(theirs) in c.detail, c
    for n, info in enumerate(({"config_file": None},
                              {"config_file": "/etc/vgpu/vgpu.toml", "config": "<defaults>"})):
        path = tmp_path / f"other{n}.sock"
        t = _serve_once(path, P.encode(P.ok(daemon={"pid": 42, **info})))
        c = diagnosis.check_config({"VGPU_SOCKET": str(path), "VGPU_CONFIG": str(mine)})
        t.join(10)
        assert c.status == diagnosis.OK and "runs on the defaults" in c.detail, c


def test_stale_socket(tmp_path):
    path = tmp_path / "vgpud.sock"
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(str(path))
    s.close()                               # a socket file nobody listens on
    c = diagnosis.check_daemon({"VGPU_SOCKET": str(path)})
    assert c.status == diagnosis.WARN and "no daemon listens" in c.detail


def test_not_a_socket(tmp_path):
    path = tmp_path / "vgpud.sock"
    path.write_text("")
    c = diagnosis.check_daemon({"VGPU_SOCKET": str(path)})
    assert c.status == diagnosis.FAIL and "not a socket" in c.detail and "remove" in c.fix


def _serve_once(path: Path, reply: bytes) -> threading.Thread:
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(str(path))
    srv.listen(1)
    srv.settimeout(30)

    def run() -> None:
        try:
            conn, _ = srv.accept()
            with conn:
                conn.recv(65536)
                conn.sendall(reply)
        finally:
            srv.close()

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


def test_daemon_answers(tmp_path):
    path = tmp_path / "vgpud.sock"
    t = _serve_once(path, P.encode(P.ok(daemon={"pid": 42, "version": "9.9", "system": False,
                                                "jobs": 3})))
    c = diagnosis.check_daemon({"VGPU_SOCKET": str(path)})
    t.join(10)
    assert c.status == diagnosis.OK and "pid 42" in c.detail and "3 job(s)" in c.detail


def test_daemon_speaking_another_protocol(tmp_path):
    path = tmp_path / "vgpud.sock"
    t = _serve_once(path, P.encode(P.error("protocol", "protocol version 1 not supported")))
    c = diagnosis.check_daemon({"VGPU_SOCKET": str(path)})
    t.join(10)
    assert c.status == diagnosis.FAIL and "refused a ping" in c.detail and c.fix


def test_socket_closed_to_us():
    """A daemon socket whose mode shuts the caller out (as root: the check runs
    as nobody)."""
    import shutil
    import tempfile

    d = Path(tempfile.mkdtemp(prefix="vgpu-doctor-"))
    os.chmod(d, 0o755)
    path = d / "vgpud.sock"
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(str(path))
    s.listen(1)
    os.chmod(path, 0o600)
    try:
        if os.geteuid() != 0:
            os.chmod(path, 0)
            c = diagnosis.check_daemon({"VGPU_SOCKET": str(path)})
            status, detail = c.status, c.detail
        else:
            code = ("import json, sys; from vgpuctl.ops import diagnosis as d; "
                    f"c = d.check_daemon({{'VGPU_SOCKET': {str(path)!r}}}); "
                    "print(json.dumps(c.to_dict()))")
            try:
                r = subprocess.run([sys.executable, "-c", code], capture_output=True,
                                   text=True, user=65534, timeout=60, cwd="/")
            except PermissionError as e:
                pytest.skip(f"can't run this Python as nobody: {e}")
            if r.returncode != 0:
                pytest.skip(f"can't run Python as nobody here: {r.stderr.strip()[-200:]}")
            c = json.loads(r.stdout)
            status, detail = c["status"], c["detail"]
    finally:
        s.close()
        shutil.rmtree(d, ignore_errors=True)
    assert status == diagnosis.FAIL and "does not let you connect" in detail, detail


# -- driver, NVML, hook ----------------------------------------------------------
def test_hook_missing(tmp_path):
    r = vgpuctl(["doctor"], env={"VGPU_NATIVE_DIR": str(tmp_path), "VGPU_SOCKET":
                                 str(tmp_path / "none.sock"), "VGPU_CONFIG": "/nonexistent"})
    assert r.returncode == 1, r.stdout + r.stderr
    lines = r.stdout.splitlines()
    hook = [ln for ln in lines if ln.split()[1:2] == ["hook"]]
    assert hook and hook[0].startswith("FAIL") and "libvgpu.so" in hook[0]
    fix = lines[lines.index(hook[0]) + 1].strip()
    # Reinstall where this vgpuctl is installed (vgpuctl is not on PyPI).
    assert fix.startswith("fix: reinstall vgpuctl where it is installed: ")
    assert f"{sys.prefix}/bin/pip install --force-reinstall" in fix, fix
    assert "pip install vgpuctl" not in fix and "--force-reinstall vgpuctl" not in fix
    config = [ln for ln in lines if ln.split()[1:2] == ["config"]]
    assert config[0].startswith("FAIL") and "/nonexistent" in config[0]
    assert "Traceback" not in r.stderr


def test_bad_vgpu_sim_stops_early(tmp_path):
    r = vgpuctl(["doctor", "--json"], env={"VGPU_SIM": "lots", "VGPU_SOCKET":
                                           str(tmp_path / "none.sock")})
    assert r.returncode == 1
    checks = json.loads(r.stdout)
    assert [c["name"] for c in checks] == ["simulator"]
    assert checks[0]["status"] == "fail" and "COUNTxSIZE" in checks[0]["detail"]


def test_no_driver_points_to_the_simulator():
    env = {k: v for k, v in os.environ.items() if k != "VGPU_SIM"}
    # Asked in a child: a libcuda loaded here would stay loaded for the run.
    probe = subprocess.run([sys.executable, "-c", "import ctypes; ctypes.CDLL('libcuda.so.1')"],
                           env=env, capture_output=True, timeout=60)
    if probe.returncode == 0:
        pytest.skip("a CUDA driver is installed here")
    c = diagnosis.check_driver(env)
    assert c.status == diagnosis.FAIL and "libcuda.so.1" in c.detail and "VGPU_SIM" in c.fix


@pytest.mark.skipif(not native_built(), reason="native parts not built")
def test_simulated_node_is_healthy(tmp_path):
    env = {"VGPU_SIM": "2x8G", "VGPU_SIM_STATE": str(tmp_path / "sim"),
           "VGPU_SOCKET": str(tmp_path / "none.sock"), "HOME": str(tmp_path)}
    r = vgpuctl(["doctor", "--json"], env=env)
    checks = {c["name"]: c for c in json.loads(r.stdout)}
    assert r.returncode == 0, r.stdout
    for name in ("simulator", "driver", "nvml", "hook", "config"):
        assert checks[name]["status"] == "ok", checks[name]
    assert "2 device(s)" in checks["driver"]["detail"]
    assert "2 GPU(s)" in checks["nvml"]["detail"]
    assert checks["daemon"]["status"] == "warn"


@pytest.mark.skipif(not native_built(), reason="native parts not built")
def test_running_daemon_answers():
    from vgpuctl.ops.showcase import Demo

    with Demo(jobs=()) as d:
        d.start_daemon()
        r = vgpuctl(["doctor", "--json"], env={k: v for k, v in d.env.items()
                                               if k.startswith("VGPU_")})
        checks = {c["name"]: c for c in json.loads(r.stdout)}
    assert checks["daemon"]["status"] == "ok", checks["daemon"]
    assert "user daemon pid" in checks["daemon"]["detail"]
    assert r.returncode == 0, r.stdout
