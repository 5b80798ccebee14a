"""The job's own user points the hook elsewhere: a forged region (a copy of
its own with a bigger limit), VGPU_MEM_LIMIT with VGPU_REGION unset, a
malformed VGPU_MEM_LIMIT. Where a daemon manages the GPUs the hook obeys
only it: each attempt is refused (CUDA calls fail, one line says why),
never a bigger limit."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from support.daemon import needs_native

from vgpuctl.system import native, paths
from vgpuctl.system.region import Region, read_ids
from vgpuctl.system.shm import shm_remove

pytestmark = needs_native

G = 1 << 30


def job_process(daemon, extra: dict[str, str], drop: tuple[str, ...] = (),
                hook: Path | None = None, alloc: str = "2G") -> subprocess.CompletedProcess[str]:
    """vgpu-burn allocating `alloc` on the daemon's simulated GPU with the
    hook preloaded, in the environment a job's user would give it."""
    env = {**daemon.env, "LD_PRELOAD": str(hook or native.hook_library()),
           "LD_LIBRARY_PATH": str(native.sim_libdir()), **extra}
    for k in drop:
        env.pop(k, None)
    return subprocess.run([str(native.burn_program()), "--kernel-us", "10", "--count", "1",
                           "--alloc", alloc], env=env, capture_output=True, text=True,
                          timeout=60)


def _as_nobody(fn) -> None:
    """Run fn in a child process as nobody (uid 65534); fail if it fails."""
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            os.setgroups([])
            os.setgid(65534)
            os.setuid(65534)
            fn()
            code = 0
        finally:
            os._exit(code)
    assert os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 0


@pytest.fixture
def forged(daemon):
    """A job of 1 GiB, and a forgery of its region with a 16 GiB limit made
    by the job's user (nobody): its own segments, its own region file, in a
    directory of its own."""
    if os.geteuid() != 0:
        pytest.skip("needs root to act as another user")
    p = daemon.popen("run", "--mem", "1G", "--", "sleep", "60")
    job = daemon.running_job(what="the job")
    real = Region.open(daemon.runtime / "jobs" / job["id"])
    devices = real.devices()
    real.close()
    top = Path(tempfile.mkdtemp(prefix="vgpu-forge-"))
    os.chmod(top, 0o755)
    os.chown(top, 65534, 65534)
    copy = top / "region"
    devices[0].mem_limit = 16 * G
    _as_nobody(lambda: Region.create(copy, job["id"], 65534, devices).close())
    yield job, copy
    daemon.cleanup_jobs()
    p.wait(30)
    for sid in read_ids(copy):
        shm_remove(sid)
    shutil.rmtree(top, ignore_errors=True)


def test_the_job_itself_is_held_to_its_limit(daemon, forged):
    job, _ = forged
    region = str(daemon.runtime / "jobs" / job["id"])
    assert job_process(daemon, {"VGPU_REGION": region, "VGPU_JOB": job["id"]}).returncode != 0
    assert job_process(daemon, {"VGPU_REGION": region, "VGPU_JOB": job["id"]},
                       alloc="512M").returncode == 0


def test_a_forged_region_is_refused(daemon, forged):
    job, copy = forged
    r = job_process(daemon, {"VGPU_REGION": str(copy), "VGPU_JOB": job["id"]})
    assert r.returncode != 0                           # 2 GiB in a "16 GiB" region: no
    assert "not a region of the daemon" in r.stderr, r.stderr


def test_segments_the_daemon_did_not_make_are_refused_in_its_place(daemon, forged):
    """Even a region file in the daemon's own jobs directory (which no job's
    user can write: here root plants it, as a stale id naming another's
    segments would) is refused when its segments are not the daemon's."""
    job, copy = forged
    planted = daemon.runtime / "jobs" / "999"
    planted.mkdir()
    shutil.copy(copy / "region", planted / "region")
    os.chown(planted / "region", 0, 0)
    r = job_process(daemon, {"VGPU_REGION": str(planted), "VGPU_JOB": job["id"]})
    assert r.returncode != 0
    assert "was not made by the daemon" in r.stderr, r.stderr
    shutil.rmtree(planted)


def test_a_forged_region_is_refused_without_the_environment_too(daemon, forged, tmp_path):
    """The system daemon's directory is compiled in: unsetting
    VGPU_RUNTIME_DIR takes nothing away. (A hook built with the test
    daemon's directory as the system one.)"""
    job, copy = forged
    out = tmp_path / "native"
    env = {**os.environ,
           "VGPU_CFLAGS": f'-DVGPU_SYSTEM_RUNTIME_DIR=\\"{daemon.runtime}\\"'}
    build = Path(native.__file__).resolve().parents[2] / "libvgpu" / "build.py"
    subprocess.run([sys.executable, str(build), str(out), "hook"], env=env, check=True,
                   capture_output=True, timeout=120)
    r = job_process(daemon, {"VGPU_REGION": str(copy), "VGPU_JOB": job["id"]},
                    drop=("VGPU_RUNTIME_DIR",), hook=out / "libvgpu.so")
    assert r.returncode != 0
    assert "not a region of the daemon" in r.stderr, r.stderr
    r = job_process(daemon, {"VGPU_MEM_LIMIT": "16G"}, drop=("VGPU_RUNTIME_DIR",),
                    hook=out / "libvgpu.so")
    assert r.returncode != 0 and "VGPU_MEM_LIMIT=16G is refused" in r.stderr, r.stderr


def test_vgpu_mem_limit_is_refused_where_a_daemon_manages_the_gpus(daemon):
    r = job_process(daemon, {"VGPU_MEM_LIMIT": "16G"})
    assert r.returncode != 0
    assert "VGPU_MEM_LIMIT=16G is refused" in r.stderr, r.stderr
    assert r.stderr.count("vgpu:") == 1                # said once


@pytest.mark.parametrize("value", ["nan", "-1G", "inf", "1e30G", "99999999999999999999G",
                                   "0x10G", "16 G G"])
@pytest.mark.skipif((paths.SYSTEM_RUNTIME_DIR / "jobs").exists(),
                    reason="a system daemon manages this node: VGPU_MEM_LIMIT is refused")
def test_a_malformed_vgpu_mem_limit_is_an_error_never_a_bigger_limit(daemon, value):
    """Without a daemon (VGPU_RUNTIME_DIR unset, no system daemon here)."""
    r = job_process(daemon, {"VGPU_MEM_LIMIT": value}, drop=("VGPU_RUNTIME_DIR",))
    assert r.returncode != 0
    assert "is not a size" in r.stderr, r.stderr


def test_the_hooks_system_daemon_is_the_cli_s():
    """The directory compiled into the hook is where the system daemon puts
    its regions: were they to drift, the hook would obey no daemon."""
    import re

    src = (Path(native.__file__).resolve().parents[2] / "libvgpu" / "hook" / "state.c").read_text()
    m = re.search(r'#define VGPU_SYSTEM_RUNTIME_DIR "([^"]+)"', src)
    assert m and m.group(1) == str(paths.SYSTEM_RUNTIME_DIR)
