"""The region lives in System V shared memory: the layout of struct
shmid_ds that vgpuctl/system/region.py declares for ctypes is the C
library's, and a segment is what the daemon promises (its size for good,
every page allocated, the owner and modes it sets)."""

from __future__ import annotations

import ctypes
import subprocess
from pathlib import Path

from vgpuctl.system import region as R

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
    perm = R.ShmidDs.perm.offset
    ours = [ctypes.sizeof(R.ShmidDs), perm + R.IpcPerm.uid.offset,
            perm + R.IpcPerm.cuid.offset, perm + R.IpcPerm.mode.offset,
            R.ShmidDs.segsz.offset, R.ShmidDs.cpid.offset, R.ShmidDs.nattch.offset]
    assert got[:7] == ours
    assert got[7] in (2, 4)      # a 16-bit mode with padding, or 32 bits: little-endian alike


def test_a_segment_has_every_page_allocated_and_the_mode_asked():
    """(System V has no call that changes a segment's size.)"""
    sid = R.shm_create(54288, None, 0o600)
    try:
        ds = R.shm_stat(sid)
        assert ds.segsz == 54288 and ds.perm.mode & 0o777 == 0o600
        # Resident: the daemon touched every page before anyone attaches.
        line = next(ln.split() for ln in Path("/proc/sysvipc/shm").read_text().splitlines()[1:]
                    if int(ln.split()[1]) == sid)
        assert int(line[14]) >= 54288          # rss
    finally:
        R.shm_remove(sid)
