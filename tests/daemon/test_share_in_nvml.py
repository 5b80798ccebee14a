"""What NVML itself says of a job held to its share: a monitoring tool that
reads one averaged entry per process over 2 s sees about the job's --core."""

from __future__ import annotations

import os

from support.daemon import needs_native, wait_for
from support.sim import run_py

from vgpuctl.system import native


@needs_native
def test_a_core_30_job_reads_30_in_nvml_over_two_seconds(daemon_factory):
    daemon = daemon_factory(gpus="1x16G")
    p = daemon.burner(30, 1000, 30)
    try:
        job = daemon.running_job(timeout=30, what="the job to start")
        # Held at its share by its turns, by the daemon's own measure first
        # (the job's hook-measured GPU time over about a second).
        wait_for(lambda: abs((daemon.job(job["id"])["core_measured"] or 0) - 0.30) < 0.03,
                 timeout=30, what="the job to settle at its share")
        env = {**daemon.env,
               "LD_LIBRARY_PATH": ":".join(filter(None, [str(native.sim_libdir()),
                                                         os.environ.get("LD_LIBRARY_PATH")]))}
        out = run_py(env, f"PIDS = {sorted(job['pids'])}\n", """
            import pynvml
            pynvml.nvmlInit()
            h = pynvml.nvmlDeviceGetHandleByIndex(0)
            since = int(time.time() * 1e6)
            time.sleep(2.0)              # the window the one read averages over
            entries = pynvml.nvmlDeviceGetProcessUtilization(h, since)
            out([[e.pid, e.smUtil] for e in entries])
        """)
    finally:
        daemon.cleanup_jobs()
        p.wait(timeout=30)
    ours = [sm for pid, sm in out if pid in job["pids"]]
    assert len(ours) == 1, out               # one entry for the job's process
    assert 24 <= ours[0] <= 36, out          # 30 ± 6
