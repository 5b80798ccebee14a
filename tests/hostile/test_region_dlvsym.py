"""A program of the job looks for the real dlsym to walk past the hook:
through dlvsym, or from libc.so.6's own handle. The hook answers with its
own dlsym, so the driver's entry points it hands out are the hook's
wrappers and the job's limit holds. (What a preload hook cannot stop -
dlmopen, static linking, direct ioctls - is in docs/security.md; the
daemon's NVML check catches those.)"""

from __future__ import annotations

import pytest
from support.hook import CUDA_ERROR_OUT_OF_MEMORY, CUDA_SUCCESS, GiB, results, run

WAYS = {"dlvsym": ["-DVIA_DLSYM", "-DVIA_DLVSYM"],
        "libc_dlsym": ["-DVIA_DLSYM", "-DVIA_LIBC_DLSYM"]}


@pytest.mark.parametrize("way", list(WAYS))
def test_the_real_dlsym_found_another_way_still_meets_the_limit(way, sim, cbuild):
    prog = cbuild(f"cuclient_{way}", "cuclient.c", *WAYS[way])
    region = sim.region([GiB, GiB])
    out = run(prog, ["ctx", "0", "alloc", "2G", "alloc", "256M"],
              sim.job_env(region.path)).stdout
    assert results(out, "alloc")[0][0] == str(CUDA_ERROR_OUT_OF_MEMORY)
    assert results(out, "alloc")[1][0] == str(CUDA_SUCCESS)
    assert region.read_usage().devices[0].peak >= 256 << 20   # counted by the hook
