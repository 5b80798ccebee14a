"""A job's bills come from the driver's figures, not from the counters in its
own usage region (issue 20): memory-time and peak from the memory NVML
shows its processes hold (a process that walked past the hook was billed
0 GiB·s), and a launch counter that went back while no daemon ran (zeroed
by the job's user, to erase the outage's charge) is charged the whole
outage."""

from __future__ import annotations

import signal
import threading
import time

from support.daemon import kill_and_reap, needs_native, wait_for
from support.hook import Sim
from support.store import usage_rows

from vgpuctl.system import native
from vgpuctl.system.region import Region
from vgpuctl.system.structs import const, ffi

pytestmark = needs_native

G = 1 << 30
OUTAGE_S = 6.0


def _rows(daemon, job_id: str):
    return usage_rows(daemon.state / "vgpu.db", job_id)


def test_a_bypass_is_billed_the_memory_nvml_shows(daemon_factory):
    d = daemon_factory(gpus="1x16G", config='on_violation = "report"\n')
    burn = str(native.burn_program())
    p = d.popen("run", "--mem", "8G", "--", "env", "-u", "LD_PRELOAD", burn, "--alloc", "6G",
                "--kernel-us", "100", "--seconds", "5")
    try:
        assert p.wait(60) == 0
        job = d.call("ps", all=True)["jobs"][-1]
        wait_for(lambda: d.jobs() == [], timeout=20, what="the job to end")
    finally:
        kill_and_reap(p)
    rows = wait_for(lambda: _rows(d, job["id"]) or None, timeout=10, what="its rows")
    gib_s = sum(r.mem_gib_hours for r in rows) * 3600
    peak = max(r.peak_mem_bytes for r in rows)
    # 6 GiB (and a context) for about 5 s; before, 0 GiB·s and a peak of 0.
    assert gib_s > 6 * 3.0, gib_s
    assert peak >= 6 * G, peak


def _zero_launches(job_dir, stop: threading.Event) -> None:
    """The job's user writes its processes' launch counters back to 0, over
    and over, while no daemon runs."""
    f = ffi()
    base = f.offsetof("struct vgpu_usage", "procs")
    size = f.sizeof("struct vgpu_proc_slot")
    at = f.offsetof("struct vgpu_proc_slot", "launches")
    reg = Region.open(job_dir, writable_usage=True)
    try:
        while not stop.is_set():
            for i in range(const("VGPU_MAX_PROCS")):
                reg.poke_usage(base + i * size + at, bytes(8))
            time.sleep(0.01)
    finally:
        reg.close()


def test_counters_zeroed_during_an_outage_are_charged_the_outage(daemon_factory):
    daemon = daemon_factory(gpus="1x16G")
    p = daemon.burner(50, 2000, 16)
    stop = threading.Event()
    try:
        job = daemon.running_job(timeout=30, what="the job to start")
        wait_for(lambda: sum(r.gpu_seconds for r in _rows(daemon, job["id"])) > 1.0,
                 timeout=10, what="some use to be recorded")
        job_dir = daemon.runtime / "jobs" / job["id"]
        wait_for((job_dir / "checkpoint").exists, timeout=10, what="the daemon's checkpoint")
        daemon.stop(signal.SIGKILL)
        t = threading.Thread(target=_zero_launches, args=(job_dir, stop), daemon=True)
        t.start()
        time.sleep(OUTAGE_S)    # the outage itself: a duration, not a wait for something
        daemon.start()
        stop.set()
        t.join()
        assert "went back while no daemon ran" in daemon.log.read_text()
        assert p.wait(60) == 0
        wait_for(lambda: daemon.jobs() == [], timeout=20, what="the job to end")
    finally:
        stop.set()
        kill_and_reap(p)
    recorded = sum(r.gpu_seconds for r in _rows(daemon, job["id"]))
    env = {**daemon.env, "LD_LIBRARY_PATH": str(native.sim_libdir())}
    busy = Sim(daemon.base, env).stats()["devices"][0]["busy_ns"] / 1e9
    # Before: the outage's 3 GPU-seconds were erased (about 60 % accounted).
    # Now it is charged the whole outage: at least what it used.
    assert recorded >= 0.95 * busy, (recorded, busy)
