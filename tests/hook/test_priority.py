"""Priority classes in the hook (libvgpu/hook/priority.c): a held job (its
limits name a holder of a higher class on its GPU) launches nothing while
the holder's signal says its work runs, keeps at most its budget of work in
flight while the holder is active, and launches freely once it is idle; a
signalling job stamps its signal on every launch path. The holder's signal
is written here, as its hook would; what is in flight is the simulator's own
record (each process's kernel time queued on the device). No timing is
asserted: every bound here holds on any schedule."""

from __future__ import annotations

import ctypes
import os
import struct
import subprocess
import threading
import time
from pathlib import Path

import pytest
from support.hook import GiB, wait_for

from vgpuctl.system import native
from vgpuctl.system.class_fields import ClassFields, read_signal, write_class
from vgpuctl.system.region import Region
from vgpuctl.system.shm import IPC_SET, shm_attach, shm_create, shm_remove, shm_stat
from vgpuctl.system.shm import _lib as shm_lib
from vgpuctl.system.structs import const, ffi

from .test_launch import PATHS

NOBODY = 65534
BUDGET_NS = 1_000_000
HOLDOFF_NS = 2_000_000_000      # a holder stamped every 50 ms stays active


class Signal:
    """A job's signal segment, written as its hook (or its user) writes it."""

    def __init__(self, job_dir: Path) -> None:
        f = ffi()
        self.reg = Region.open(job_dir, writable_usage=True)
        self._dev = f.offsetof("struct vgpu_signal", "dev")
        self._last = f.offsetof("struct vgpu_signal_dev", "last_launch_ns")
        self._busy = f.offsetof("struct vgpu_signal_dev", "busy_until_ns")

    def stamp(self, last: int | None = None, busy: int | None = None) -> None:
        if last is not None:
            self.reg.poke_signal(self._dev + self._last, struct.pack("<Q", last))
        if busy is not None:
            self.reg.poke_signal(self._dev + self._busy, struct.pack("<Q", busy))


def classes(sim, held_name: str = "2", holder_name: str = "1"):
    """A holder's region (class high, signalling) and a held one (class low,
    held by it) on GPU 0, side by side as the daemon makes them."""
    holder = sim.region([GiB], name=holder_name)
    held = sim.region([GiB], name=held_name)
    write_class(holder, 0, ClassFields(priority=2, hold=2, budget_ns=BUDGET_NS,
                                       holdoff_ns=HOLDOFF_NS))
    write_class(held, 0, ClassFields(priority=0, hold=1,
                                     holders=((holder_name, 0, 2, holder.signal_id),),
                                     budget_ns=BUDGET_NS, holdoff_ns=HOLDOFF_NS))
    return holder, held


def queued_ms(sim, pid: int) -> float:
    for p in sim.stats()["processes"]:
        if p["pid"] == pid:
            return p["devices"][0].get("queued_ns", 0) / 1e6
    return 0.0


@pytest.mark.parametrize("path", PATHS)
def test_every_launch_path_waits_while_a_holder_is_busy(path, sim, clients, client_factory):
    holder, held = classes(sim)
    sig = Signal(holder.path)
    sig.stamp(last=time.monotonic_ns(), busy=time.monotonic_ns() + 3600 * 10**9)
    c = client_factory(clients["gpa_v2"], ["ctx", "0", "launch", path, "3", "hold"],
                       sim.job_env(held.path))
    c.until("ctx")
    wait_for(lambda: held.read_usage().devices[0].throttled_ns > 0 or c.printed("launch"),
             what="the launch to wait")
    assert not c.printed("launch"), "a launch went while a job of a higher class ran"
    sig.stamp(last=0, busy=0)              # the holder is done, and long idle
    assert c.until("launch") == ["0"]
    c.until("hold")
    # every launch of a held job went through the gate (its GPU time measured)
    assert held.read_usage().devices[0].launches == 3


@pytest.mark.parametrize("path", PATHS)
def test_every_launch_path_signals(path, sim, clients, client_factory):
    """A job with lower classes beside it stamps its signal on every launch
    path: when it launched, and until when its work should keep the GPU;
    once its work is seen completed (the client synchronises after its
    launches), that it has nothing in flight (0), not when that was seen:
    the lower classes take a time there for an estimate made at a launch,
    which the work they had queued may have delayed, and wait a budget past
    it."""
    holder, _held = classes(sim)
    t0 = time.monotonic_ns()
    c = client_factory(clients["gpa_v2"], ["ctx", "0", "launch", path, "4", "hold"],
                       sim.job_env(holder.path))
    assert c.until("launch") == ["0"]
    c.until("hold")
    s = read_signal(holder, 1)[0]
    assert s.launches == 4
    assert s.last_launch_ns >= t0
    assert s.busy_until_ns == 0


def _stamping(sig: Signal, stop: threading.Event) -> None:
    while not stop.is_set():
        sig.stamp(last=time.monotonic_ns())
        stop.wait(0.05)


def test_a_held_job_keeps_its_budget_in_flight_and_resumes_when_the_holder_is_idle(sim):
    """A saturating job of a low class keeps 16 ms of kernels queued; while a
    job of a higher class is active (it launched within the hold-off) it
    keeps at most its budget (1 ms: one kernel of 1 ms) in flight, and when
    the holder goes idle its queue fills again."""
    holder, held = classes(sim)
    sig = Signal(holder.path)
    p = subprocess.Popen([str(native.burn_program()), "--kernel-us", "1000", "--inflight", "16",
                          "--seconds", "120"], env=sim.job_env(held.path),
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    stop = threading.Event()
    stamper = threading.Thread(target=_stamping, args=(sig, stop))
    try:
        wait_for(lambda: queued_ms(sim, p.pid) >= 8, what="the trainer's queue to fill")
        stamper.start()
        wait_for(lambda: queued_ms(sim, p.pid) <= 1.0, what="the queue to drain to the budget")
        seen = [queued_ms(sim, p.pid) for _ in range(20)]
        assert max(seen) <= 1.0, seen           # one kernel of 1 ms at most, however late
        assert held.read_usage().devices[0].throttled_ns > 0
        stop.set()
        stamper.join()
        sig.stamp(last=0)                        # idle since long ago
        wait_for(lambda: queued_ms(sim, p.pid) >= 8, what="the queue to fill again")
    finally:
        stop.set()
        p.kill()
        p.wait(30)


def test_a_holder_that_is_not_in_the_limits_holds_no_one(sim):
    """Only the signals the limits name are heeded: another job's, however
    busy it claims to be, changes nothing, nor does the job's own."""
    holder, held = classes(sim)
    stranger = sim.region([GiB], name="3")
    Signal(stranger.path).stamp(last=time.monotonic_ns(),
                                busy=time.monotonic_ns() + 3600 * 10**9)
    Signal(held.path).stamp(last=time.monotonic_ns(),
                            busy=time.monotonic_ns() + 3600 * 10**9)   # its own: no matter
    p = subprocess.Popen([str(native.burn_program()), "--kernel-us", "1000", "--inflight", "16",
                          "--seconds", "120"], env=sim.job_env(held.path),
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_for(lambda: queued_ms(sim, p.pid) >= 8, what="the trainer's queue to fill")
    finally:
        p.kill()
        p.wait(30)


def _forged_signal(busy_until: int) -> int:
    """A segment of a signal's size and layout made by nobody (as any user
    may make one), claiming busy until busy_until: its id."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            os.close(r)
            os.setgroups([])
            os.setgid(NOBODY)
            os.setuid(NOBODY)
            f = ffi()
            sid = shm_create(f.sizeof("struct vgpu_signal"), None, 0o644)
            addr = shm_attach(sid, writable=True)
            sig = f.cast("struct vgpu_signal *", addr)
            sig.magic = const("VGPU_SIGNAL_MAGIC")
            sig.version = const("VGPU_REGION_VERSION")
            sig.dev[0].last_launch_ns = time.monotonic_ns()
            sig.dev[0].busy_until_ns = busy_until
            os.write(w, str(sid).encode())
            code = 0
        finally:
            os._exit(code)
    os.close(w)
    out = os.read(r, 64)
    os.close(r)
    assert os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 0
    return int(out)


def test_a_signal_the_daemon_did_not_make_holds_no_one(sim):
    """Where a daemon manages the GPUs (here: its jobs directory is root's,
    as the daemon's user), a held job heeds only the signals the daemon's
    user made: a segment another user made in a signal's layout, a segment
    of the daemon's that is no signal (a region's limits) and a signal its
    owner made writable by others, each claiming busy for an hour, hold back
    nothing; the same signal, writable by its owner only, does."""
    if os.geteuid() != 0:
        pytest.skip("needs root to make a segment as another user")
    holder = sim.region([GiB], name="run/jobs/1")
    held = sim.region([GiB], name="run/jobs/2")
    hour = time.monotonic_ns() + 3600 * 10**9
    forged = _forged_signal(hour)
    Signal(holder.path).stamp(last=time.monotonic_ns(), busy=hour)

    def heed(sid: int) -> None:
        write_class(held, 0, ClassFields(priority=0, hold=1, holders=(("1", 0, 2, sid),),
                                         budget_ns=BUDGET_NS, holdoff_ns=HOLDOFF_NS))

    def launches() -> int:
        return held.read_usage().devices[0].launches     # through the gate

    def runs_freely() -> None:
        n = launches()
        wait_for(lambda: launches() >= n + 50, what="50 more launches")
        assert queued_ms(sim, p.pid) >= 8

    heed(forged)
    env = sim.job_env(held.path, VGPU_RUNTIME_DIR=str(sim.root / "run"))
    p = subprocess.Popen([str(native.burn_program()), "--kernel-us", "1000", "--inflight", "16",
                          "--seconds", "120"], env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_for(lambda: queued_ms(sim, p.pid) >= 8, what="the trainer's queue to fill")
        runs_freely()                              # nobody's segment
        heed(holder.limits_id)
        runs_freely()                              # the daemon's, not a signal
        ds = shm_stat(holder.signal_id)
        ds.perm.mode = 0o666
        assert shm_lib().shmctl(holder.signal_id, IPC_SET, ctypes.byref(ds)) == 0
        heed(holder.signal_id)
        runs_freely()                              # a signal others may write
        ds.perm.mode = 0o644
        assert shm_lib().shmctl(holder.signal_id, IPC_SET, ctypes.byref(ds)) == 0
        heed(-1)
        heed(holder.signal_id)
        wait_for(lambda: queued_ms(sim, p.pid) == 0, what="the trainer to be held")
    finally:
        p.kill()
        p.wait(30)
        shm_remove(forged)
