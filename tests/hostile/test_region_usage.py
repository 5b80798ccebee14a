"""A job's user rewrites its own usage region (the segment is theirs to
write): the daemon survives, the others keep their limits and their
accounting, and the tampering job is flagged with its gate closed. (It can
no longer be truncated: it is shared memory of a fixed size, not a file;
test_region_space.py.)"""

from __future__ import annotations

import threading
import time

import pytest
from support.daemon import needs_native, wait_for
from support.store import usage_rows

from vgpuctl.system import native
from vgpuctl.system.region import Region, ffi

pytestmark = needs_native

U64_MAX = 2**64 - 1


def usage_of(daemon, job_id: str) -> Region:
    """The job's region with its usage attached read-write, as the job's
    user (here root, its creator) can."""
    return Region.open(daemon.runtime / "jobs" / job_id, writable_usage=True)


def poke(daemon, job_id: str, field: str, value: int, dev: int = 0) -> None:
    """Write one of device dev's job-wide counters, as the job's user can."""
    f = ffi()
    off = (f.offsetof("struct vgpu_usage", "dev") + dev * f.sizeof("struct vgpu_dev_usage")
           + f.offsetof("struct vgpu_dev_usage", field))
    reg = usage_of(daemon, job_id)
    try:
        reg.poke_usage(off, value.to_bytes(8, "little", signed=field == "tokens"))
    finally:
        reg.close()


def start(daemon, *args: str):
    """`vgpuctl run ARGS` in the background; (process, job view) once the job
    has a pid."""
    before = {j["id"] for j in daemon.jobs()}
    p = daemon.popen("run", *args)
    job = wait_for(lambda: next((j for j in daemon.jobs()
                                 if j["id"] not in before and j["pids"]), None),
                   timeout=30, what="the job to start")
    return p, job


def burn(seconds: int = 60) -> list[str]:
    return [str(native.burn_program()), "--kernel-us", "1000", "--seconds", str(seconds)]


def gate(daemon, job_id: str) -> tuple[int, int, int]:
    r = Region.open(daemon.runtime / "jobs" / job_id)
    try:
        d = r.device(0)
        return int(d.throttle), d.refill_rate, d.bucket_size
    finally:
        r.close()


@pytest.fixture
def one_gpu(daemon_factory):
    d = daemon_factory(gpus="1x16G")
    yield d
    d.cleanup_jobs()


def test_overwriting_its_usage_header_flags_that_job_and_the_daemon_lives(one_gpu):
    daemon = one_gpu
    pv, victim = start(daemon, "--mem", "1G", "--", "sleep", "60")
    pa, attacker = start(daemon, "--mem", "1G", "--", "sleep", "60")
    reg = usage_of(daemon, attacker["id"])
    reg.poke_usage(0, b"\xff" * 16)
    reg.close()
    t0 = time.monotonic()
    flagged = wait_for(lambda: daemon.job(attacker["id"])["region_error"], timeout=2,
                       what="the overwritten region to be flagged")
    assert time.monotonic() - t0 < 2.0
    assert "header" in flagged
    assert daemon.proc.poll() is None
    assert daemon.job(victim["id"])["region_error"] is None
    assert gate(daemon, attacker["id"]) == (1, 0, 0)       # its launches stop
    assert "tampered" in daemon.log.read_text()
    # Everything else still answers.
    assert daemon.cli("run", "--mem", "64M", "--", "true").returncode == 0


@pytest.mark.parametrize("field", ["peak", "used"])
def test_memory_counters_at_2_64_minus_1_stop_no_one_elses_accounting(one_gpu, field):
    daemon = one_gpu
    pv, victim = start(daemon, "--mem", "1G", "--core", "50", "--", *burn())
    pa, attacker = start(daemon, "--mem", "1G", "--", "sleep", "60")
    poke(daemon, attacker["id"], field, U64_MAX)
    t_poke = time.time()

    def victim_rows_after(t: float) -> bool:
        rows = usage_rows(daemon.state / "vgpu.db", victim["id"])
        return bool(rows) and max(r.t1 for r in rows) > t and sum(
            r.gpu_seconds for r in rows) > 0
    # Flushed every 2 s: the victim's rows still advance.
    wait_for(lambda: victim_rows_after(t_poke + 2.5), timeout=10,
             what="the victim's usage to be written after the poke")
    assert daemon.job(attacker["id"])["region_error"]
    assert daemon.proc.poll() is None


def test_forged_tokens_are_caught_within_two_seconds(one_gpu):
    daemon = one_gpu
    pa, attacker = start(daemon, "--mem", "1G", "--core", "10", "--", *burn())
    wait_for(lambda: gate(daemon, attacker["id"])[0] == 1, timeout=30,
             what="the attacker's gate to close")
    stop = threading.Event()

    def forge() -> None:   # a thread of the job refilling its own bucket
        while not stop.is_set():
            try:
                poke(daemon, attacker["id"], "tokens", 2**62)
            except (OSError, ValueError):
                return      # the job ended: its region is gone
    t = threading.Thread(target=forge, daemon=True)
    t0 = time.monotonic()
    t.start()
    try:
        why = wait_for(lambda: daemon.job(attacker["id"])["region_error"], timeout=5,
                       what="the forged tokens to be caught")
        caught_s = time.monotonic() - t0
        # The gate is closed: forged tokens buy no launch any more; the
        # job's next launch fails, and it ends.
        pa.wait(timeout=20)
    finally:
        stop.set()
        t.join()
    assert caught_s < 2.0, caught_s
    assert "can have let through" in why
    out, err = pa.communicate()
    assert pa.returncode != 0, (out, err)
    assert "closed this job's compute gate" in err, err
