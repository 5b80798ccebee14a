"""The region lives in System V shared memory: the layout of struct
shmid_ds that vgpuctl/system/shm.py declares for ctypes is the C
library's, and a segment is what the daemon promises (its size for good,
every page allocated, the owner and modes it sets)."""

from __future__ import annotations

import ctypes
import subprocess
from pathlib import Path

from vgpuctl.system import region as R
from vgpuctl.system import shm

PROBE = r"""
#include <stddef.h>
#include <stdio.h>
#include <sys/shm.h>
int main(void) {
    printf("%zu %zu %zu %zu %zu %zu %zu %zu\n", sizeof(struct shmid_ds),
           offsetof(struct shmid_ds, shm_perm.uid), offsetof(struct shmid_ds, shm_perm.cuid),
           offsetof(struct shmid_ds, shm_perm.mode), offsetof(struct shmid_ds, shm_segsz),
           offsetof(struct shmid_ds, shm_cpid), offsetof(struct shmid_ds, shm_nattch),
           sizeof(((struct shmid_ds *)0)->shm_perm.mode));
    return 0;
}
"""


def test_shmid_ds_is_the_c_librarys(tmp_path: Path):
    src = tmp_path / "probe.c"
    src.write_text(PROBE)
    exe = tmp_path / "probe"
    subprocess.run(["gcc", "-o", str(exe), str(src)], check=True, capture_output=True)
    got = [int(x) for x in subprocess.run([str(exe)], capture_output=True, text=True,
                                          check=True).stdout.split()]
    perm = shm.ShmidDs.perm.offset
    ours = [ctypes.sizeof(shm.ShmidDs), perm + shm.IpcPerm.uid.offset,
            perm + shm.IpcPerm.cuid.offset, perm + shm.IpcPerm.mode.offset,
            shm.ShmidDs.segsz.offset, shm.ShmidDs.cpid.offset, shm.ShmidDs.nattch.offset]
    assert got[:7] == ours
    assert got[7] in (2, 4)      # a 16-bit mode with padding, or 32 bits: little-endian alike


def test_a_segment_has_every_page_allocated_and_the_mode_asked():
    """(System V has no call that changes a segment's size.)"""
    sid = shm.shm_create(54288, None, 0o600)
    try:
        ds = shm.shm_stat(sid)
        assert ds.segsz == 54288 and ds.perm.mode & 0o777 == 0o600
        # Resident: the daemon touched every page before anyone attaches.
        line = next(ln.split() for ln in Path("/proc/sysvipc/shm").read_text().splitlines()[1:]
                    if int(ln.split()[1]) == sid)
        assert int(line[14]) >= 54288          # rss
    finally:
        shm.shm_remove(sid)


def test_no_segment_left_is_one_error_that_names_who_made_them(tmp_path: Path):
    """Any user may make System V segments up to kernel.shmmni, and the
    kernel caps no user's share: when none is left, making a region fails
    with an error that says who made them (for the operator), by creator:
    the user here gives each segment to another owner (IPC_SET, which a
    creator may), to blame them. Run in an IPC namespace of its own, with a
    limit of 8."""
    import os
    import struct

    import pytest

    if os.geteuid() != 0:
        pytest.skip("needs root for an IPC namespace")
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        msg = "?"
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            if libc.unshare(0x08000000) != 0:          # CLONE_NEWIPC
                msg = "skip: no IPC namespace"
            else:
                Path("/proc/sys/kernel/shmmni").write_text("8")
                child = os.fork()
                if child == 0:                          # nobody takes every segment
                    os.setgid(65534)
                    os.setuid(65534)
                    while (sid := shm._lib().shmget(0, 1, 0o1000 | 0o600)) >= 0:
                        ds = ctypes.create_string_buffer(256)
                        libc.shmctl(sid, 2, ds)                   # IPC_STAT
                        struct.pack_into("<I", ds, 4, 1)          # shm_perm.uid: daemon's
                        libc.shmctl(sid, 1, ds)                   # IPC_SET
                    os._exit(0)
                os.waitpid(child, 0)
                try:
                    R.Region.create(tmp_path / "job", "1", 0, [])
                    msg = "made"
                except OSError as e:
                    msg = str(e)
        except BaseException as e:
            msg = f"error: {e}"
        finally:
            os.write(w, msg.encode())
            os._exit(0)
    os.close(w)
    msg = os.read(r, 4096).decode()
    os.close(r)
    os.waitpid(pid, 0)
    if msg.startswith("skip:"):
        pytest.skip(msg)
    assert "no System V shared memory segment left" in msg, msg
    assert "kernel.shmmni is 8; nobody made 8" in msg, msg
    assert not (tmp_path / "job" / "region").exists()


def test_a_region_of_an_earlier_layout_is_discarded_with_its_segments(tmp_path: Path):
    """A daemon upgraded to a new region layout ends the jobs of the old one
    it can't open (their hooks read another layout): their segments go with
    their directories, not only the files (a layout 1 region named two)."""
    made = [shm.shm_create(3000, None, 0o644), shm.shm_create(54288, None, 0o600)]
    job = tmp_path / "7"
    job.mkdir()
    (job / "region").write_text(f"vgpu-region 1 {made[0]} {made[1]}\n")
    try:
        R.Region.discard(job)
        assert not job.exists()
        for sid in made:
            try:
                shm.shm_stat(sid)
                raise AssertionError(f"segment {sid} is still there")
            except OSError:
                pass
    finally:
        for sid in made:
            shm.shm_remove(sid)


def test_a_removed_region_leaves_nothing_and_a_failed_checkpoint_no_file(tmp_path: Path):
    """A job's directory goes with its region, a checkpoint file half
    written (a full disk, say) included; a checkpoint that fails leaves no
    temporary file behind."""
    import os

    import pytest

    job = tmp_path / "job"
    reg = R.Region.create(job, "1", os.getuid(), [])
    reg.write_checkpoint({"t": 1.0})
    (job / f".{R.CHECKPOINT_FILE}.tmp").write_text("{")          # left by a crash
    reg.remove()
    assert not job.exists()

    reg = R.Region.create(job, "2", os.getuid(), [])
    try:
        os.mkdir(job / R.CHECKPOINT_FILE)          # the rename can't replace a directory
        with pytest.raises(OSError):
            reg.write_checkpoint({"t": 2.0})
        assert not (job / f".{R.CHECKPOINT_FILE}.tmp").exists()
        os.rmdir(job / R.CHECKPOINT_FILE)
    finally:
        reg.remove()
    assert not job.exists()
