"""Priority classes in the hook (libvgpu/hook/priority.c): a held job (its
limits name a holder of a higher class on its GPU) launches nothing while
the holder's signal says its work runs, keeps at most its budget of work in
flight while the holder is active, and launches freely once it is idle; a
signalling job stamps its signal on every launch path. The holder's signal
is written here, as its hook would; what is in flight is the simulator's own
record (each process's kernel time queued on the device). No timing is
asserted: every bound here holds on any schedule."""

from __future__ import annotations

import mmap
import subprocess
import threading
import time
from pathlib import Path

import pytest
from support.hook import GiB, wait_for

from vgpuctl.system import native
from vgpuctl.system.priority import ClassFields, read_signal, write_class
from vgpuctl.system.region import ffi

from .test_launch import PATHS

BUDGET_NS = 1_000_000
HOLDOFF_NS = 2_000_000_000      # a holder stamped every 50 ms stays active


class Signal:
    """A holder's signal file, written as its hook writes it."""

    def __init__(self, job_dir: Path) -> None:
        f = ffi()
        self._fd = open(job_dir / "signal", "r+b")  # noqa: SIM115 - kept for the test
        self._map = mmap.mmap(self._fd.fileno(), f.sizeof("struct vgpu_signal"))
        self.sig = f.cast("struct vgpu_signal *", f.from_buffer(self._map))

    def stamp(self, last: int | None = None, busy: int | None = None) -> None:
        if last is not None:
            self.sig.dev[0].last_launch_ns = last
        if busy is not None:
            self.sig.dev[0].busy_until_ns = busy


def classes(sim, held_name: str = "2", holder_name: str = "1"):
    """A holder's region (class high, signalling) and a held one (class low,
    held by it) on GPU 0, side by side as the daemon makes them."""
    holder = sim.region([GiB], name=holder_name)
    held = sim.region([GiB], name=held_name)
    write_class(holder, 0, ClassFields(priority=2, hold=2, budget_ns=BUDGET_NS,
                                       holdoff_ns=HOLDOFF_NS))
    write_class(held, 0, ClassFields(priority=0, hold=1, holders=((holder_name, 0, 2),),
                                     budget_ns=BUDGET_NS, holdoff_ns=HOLDOFF_NS,
                                     launch_cost_ns=1_000_000))
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
    # every launch of a held job is counted in its signal (its cost's base)
    assert read_signal(held.path, 1)[0].launches == 3


@pytest.mark.parametrize("path", PATHS)
def test_every_launch_path_signals(path, sim, clients, client_factory):
    """A job with lower classes beside it stamps its signal on every launch
    path: when it launched, and until when its work should keep the GPU."""
    holder, _held = classes(sim)
    t0 = time.monotonic_ns()
    c = client_factory(clients["gpa_v2"], ["ctx", "0", "launch", path, "4", "hold"],
                       sim.job_env(holder.path))
    assert c.until("launch") == ["0"]
    c.until("hold")
    s = read_signal(holder.path, 1)[0]
    assert s.launches == 4
    assert s.last_launch_ns >= t0
    assert s.busy_until_ns >= s.last_launch_ns   # a cost per launch, guessed until measured


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
    """Only the jobs the limits name are heeded: a signal of another job in
    the same directory, however busy it claims to be, changes nothing."""
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
