"""A daemon outage (SIGKILL, then a start 6 s later) while a job computes:
the GPU-seconds of the outage are credited at re-adoption from the hook's
cumulative launch counters, bounded by the wall time. Checked against the
simulated GPU's own record of the job's busy time."""

from __future__ import annotations

import signal
import time

from support.daemon import kill_and_reap, needs_native, wait_for
from support.hook import Sim
from support.store import usage_rows

from vgpuctl.system import native

pytestmark = needs_native

OUTAGE_S = 6.0


def recorded_gpu_seconds(daemon, job_id: str) -> float:
    return sum(r.gpu_seconds for r in usage_rows(daemon.state / "vgpu.db", job_id))


def sim_busy_s(daemon) -> float:
    """The simulated GPU's busy time (the job is alone on it)."""
    env = {**daemon.env, "LD_LIBRARY_PATH": str(native.sim_libdir())}
    return Sim(daemon.base, env).stats()["devices"][0]["busy_ns"] / 1e9


def test_an_outage_is_accounted_from_the_hooks_counters(daemon_factory):
    daemon = daemon_factory(gpus="1x16G")
    p = daemon.burner(50, 2000, 16)
    try:
        job = daemon.running_job(timeout=30, what="the job to start")
        wait_for(lambda: recorded_gpu_seconds(daemon, job["id"]) > 1.0, timeout=10,
                 what="some use to be recorded")
        # the checkpoint follows the flush's commit: kill only after both
        checkpoint = daemon.runtime / "jobs" / job["id"] / "checkpoint"
        wait_for(checkpoint.exists, timeout=10, what="the daemon's checkpoint")
        daemon.stop(signal.SIGKILL)
        time.sleep(OUTAGE_S)    # the outage itself: a duration, not a wait for something
        daemon.start()
        assert "while no daemon ran" in daemon.log.read_text()
        assert p.wait(60) == 0
        wait_for(lambda: daemon.jobs() == [], timeout=20, what="the job to end")
    finally:
        kill_and_reap(p)
    recorded = recorded_gpu_seconds(daemon, job["id"])
    busy = sim_busy_s(daemon)
    # Before: about 6 of ~8 GPU-seconds were lost (no row covers the outage).
    assert abs(recorded - busy) <= 0.12 * busy, (recorded, busy)
