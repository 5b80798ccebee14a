"""The runtime filesystem, attacked (issue 20): a job's user filled the
filesystem under the daemon's runtime directory through their own job's
`usage` file, freed a page, and asked for a job: the root daemon died of
SIGBUS at its first store into the new job's sparse `limits` map, and
another user's job admitted before the fill died of SIGBUS at its first
CUDA call. Now nothing of a region is a file a job's user can write (the
limits and usage are System V segments, every page allocated by the
daemon before anyone attaches), and running out of space is one clear
error on the one request that needed it.

Run on a small tmpfs mounted as the daemon's runtime directory (a real
node's is the /run tmpfs); skipped where this process can't mount one."""

from __future__ import annotations

import errno
import os
import signal
import subprocess
from pathlib import Path

import pytest
from support.daemon import discard_regions, needs_native, read_line
from support.hostile import NOBODY, in_child_as_nobody

from vgpuctl.client.connection import Client
from vgpuctl.system import native

pytestmark = needs_native

G = 1 << 30
SIZE = 256 << 10        # the tmpfs: room for a few dozen job directories


def _mount(path: Path) -> bool:
    path.mkdir(mode=0o755)
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={SIZE},mode=0755", "tmpfs",
                        str(path)], capture_output=True, text=True)
    return r.returncode == 0


@pytest.fixture
def small(daemon_factory):
    """A daemon whose runtime directory is a tmpfs of 256 KiB (its socket
    and state elsewhere), on one simulated 16 GiB GPU."""
    if os.geteuid() != 0:
        pytest.skip("needs root to mount a tmpfs")
    d = daemon_factory(gpus="1x16G", start=False)
    if not _mount(d.runtime):
        pytest.skip("can't mount a tmpfs here")
    try:
        d.start()
        yield d
    finally:
        if d.proc is not None and d.proc.poll() is None:
            d.cleanup_jobs()
            d.stop(signal.SIGKILL)
        discard_regions(d.runtime / "jobs")
        subprocess.run(["umount", "-l", str(d.runtime)], capture_output=True)


def _fill(path: Path) -> int:
    """Write a file at path until the filesystem is full; its size."""
    n = 0
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        while True:
            n += os.write(fd, b"\xa5" * 4096)
    except OSError as e:
        assert e.errno == errno.ENOSPC
    finally:
        os.close(fd)
    return n


def _admitted_job(d) -> tuple[subprocess.Popen[str], Path]:
    """A job of root's admitted now, and its process (started, with the
    hook), which waits for the file `go` to exist, then allocates and
    launches on the GPU: its first CUDA call comes after. (The process, go.)"""
    r = d.call("run", command=["sh"], cwd="/", mem=G, core=50)
    env = {**d.env, **r["env"], "LD_PRELOAD": r["prepend"]["LD_PRELOAD"],
           "LD_LIBRARY_PATH": r["prepend"]["LD_LIBRARY_PATH"]}
    go = d.base / "go"
    burn = str(native.burn_program())
    script = (f'while [ ! -e {go} ]; do sleep 0.05; done; echo go; '
              f'exec {burn} --kernel-us 100 --count 50 --alloc 256M')
    a = subprocess.Popen(["sh", "-c", script], env=env, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    d.call("started", job=r["job"]["id"], pid=a.pid)
    return a, go


def _b_fills_through_its_region(sock: str) -> dict:
    """User B: asks for a job, then tries to fill the filesystem through
    every file of its region and the directory itself; says what it wrote."""
    cl = Client.connect(Path(sock))
    reply = cl.call("run", command=["sleep", "60"], cwd="/", mem=G, core=10)
    region = Path(reply["env"]["VGPU_REGION"])
    wrote, denied = 0, []
    targets = [*sorted(region.iterdir()), region / "mine"]
    for p in targets:
        try:
            fd = os.open(p, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        except OSError as e:
            denied.append([p.name, e.errno])
            continue
        try:
            while True:
                wrote += os.write(fd, b"\xa5" * 65536)
        except OSError:
            pass
        finally:
            os.close(fd)
        try:           # ... and frees one page, as the attack did
            os.truncate(p, max(os.stat(p).st_size - 4096, 0))
        except OSError:
            pass
    return {"job": reply["job"]["id"], "wrote": wrote, "denied": denied}


def test_a_user_cannot_fill_the_runtime_filesystem_through_their_region(small):
    d = small
    # A's job, admitted before the attack; its first CUDA call comes after.
    a, go = _admitted_job(d)

    os.chmod(d.runtime, 0o755)
    b = in_child_as_nobody(lambda: _b_fills_through_its_region(str(d.socket)))
    # Nothing of B's region is a file B may write, nor the directory.
    assert b["wrote"] == 0, b
    assert {name for name, _ in b["denied"]} >= {"region", "mine"}
    assert all(e in (errno.EACCES, errno.EPERM) for _, e in b["denied"]), b
    assert d.job(b["job"])["user"] != "root"

    # A's admitted job runs its first CUDA calls now: no SIGBUS.
    go.touch()
    assert read_line(a.stdout).strip() == "go"
    assert a.wait(60) == 0, a.stderr.read()
    # And a new job is admitted and runs (before: the daemon died of SIGBUS).
    res = d.cli("run", "--mem", "512M", "--", str(native.burn_program()), "--kernel-us",
                "100", "--count", "10", "--alloc", "64M")
    assert res.returncode == 0, res.stderr
    assert d.proc.poll() is None


def test_out_of_space_is_one_clear_error_on_that_request_and_nothing_else(small):
    d = small
    # A job admitted before the filesystem fills, its first CUDA call after.
    a, go = _admitted_job(d)
    filler = d.runtime / "filler"
    assert _fill(filler) > 0
    try:
        res = d.cli("run", "--mem", "512M", "--", "true")
        assert res.returncode == 8, res.stderr
        lines = res.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("vgpuctl: error: could not create "
                                                       "the job's region"), res.stderr
        assert "No space left on device" in lines[0]
        assert "Traceback" not in d.log.read_text()
        # The daemon lives and the job admitted before runs its CUDA calls.
        go.touch()
        assert a.wait(60) == 0, a.stderr.read()
        assert d.call("ps")["ok"]
    finally:
        filler.unlink()
    # Space again: the next request is admitted.
    res = d.cli("run", "--mem", "512M", "--", "true")
    assert res.returncode == 0, res.stderr
    assert d.proc.poll() is None
    assert NOBODY == 65534
