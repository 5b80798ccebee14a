"""The launch gate of libvgpu.so, hook side: every launch path is counted;
a GPU whose gate is open takes the fast path; a GPU gated by turns
(docs/compute.md, "Turns") launches only in the job's turn of the cycle,
up to its credit of GPU time a cycle, on every launch path, and only the
launching thread waits; a closed gate fails the launch.

The shares are measured by the simulator's own timeline (each process's
kernel time, under its VGPU_SIM_TAG), never by the hook: over whole cycles
of the turns while vgpu-burn saturates the GPU (the only waits on the clock
here are the ends of that window); the hook's own measure of its GPU time
(busy_ns) is checked against the same timeline over a fixed run."""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from typing import Any

import pytest
from support.hook import (
    CUDA_ERROR_NOT_PERMITTED,
    Client,
    GiB,
    Sim,
    slot_of,
    wait_for,
)

from vgpuctl.core.turns import CLOSED, OPEN_TURN, TURNS, Turn
from vgpuctl.system import native
from vgpuctl.system.class_fields import read_signal
from vgpuctl.system.region import Region
from vgpuctl.system.turn_fields import write_turn

# cuLaunchKernel, cuLaunchKernelEx, cuLaunchCooperativeKernel, cuGraphLaunch (each
# also _ptsz), and the launches before cuLaunchKernel: cuLaunch, cuLaunchGrid,
# cuLaunchGridAsync (deprecated, still exported, found by cuGetProcAddress).
PATHS = ["kernel", "kernel_ptsz", "ex", "ex_ptsz", "coop", "coop_ptsz", "graph", "graph_ptsz",
         "legacy", "grid", "gridasync"]

MS = 1_000_000
CYCLE_NS = 50 * MS
TOLERANCE = 3.0          # percentage points of the device


def turn(start_ms: float, len_ms: float, epoch_ns: int, cycle_ns: int = CYCLE_NS) -> Turn:
    """A hard job's turn: [start, start + len) of each cycle from epoch_ns, its
    credit the turn's length."""
    return Turn(gate=TURNS, epoch_ns=epoch_ns, cycle_ns=cycle_ns, start_ns=int(start_ms * MS),
                len_ns=int(len_ms * MS), credit_ns=int(len_ms * MS))


def far_turn() -> Turn:
    """A turn that does not come while a test runs: 1 s of a 10 minute
    cycle, 5 minutes from now."""
    return Turn(gate=TURNS, epoch_ns=time.monotonic_ns(), cycle_ns=600_000 * MS,
                start_ns=300_000 * MS, len_ns=1000 * MS, credit_ns=1000 * MS)


def whole_cycle() -> Turn:
    """A turn of the whole cycle: the job may use all of the GPU."""
    return turn(0, 50, time.monotonic_ns())


def launches_printed(c: Client) -> int:
    c.printed("launch")     # (reads what is there)
    return sum(1 for fields in c.lines if fields[:1] == ["launch"])


def waited(region: Region) -> bool:
    return region.read_usage().devices[0].throttled_ns > 0


# ---- the fast path ------------------------------------------------------------------

@pytest.mark.parametrize("path", PATHS)
def test_unthrottled_launches_are_counted(path, sim, clients, client_factory):
    region = sim.region([GiB, GiB])
    c = client_factory(clients["gpa_v2"], ["ctx", "0", "launch", path, "5", "hold"],
                       sim.job_env(region.path))
    assert c.until("launch") == ["0"]
    c.until("hold")
    assert slot_of(region, c.pid).launches[0] == 5
    dev = region.read_usage().devices[0]
    # the fast path: nothing gated, nothing waited for, nothing measured
    assert dev.launches == 0 and dev.throttled_ns == 0 and dev.busy_ns == 0


# ---- every launch path keeps to the gate ---------------------------------------------

@pytest.mark.parametrize("path", PATHS)
def test_every_launch_path_waits_for_its_turn(path, sim, clients, client_factory):
    """Out of its turn no launch goes, whatever the path; once the daemon
    gives the job a turn that has come (live), every launch goes through
    the gate."""
    region = sim.region([GiB, GiB], turn={0: far_turn()})
    c = client_factory(clients["direct"], ["ctx", "0", "launch", path, "3", "hold"],
                       sim.job_env(region.path))
    c.until("ctx")
    wait_for(lambda: waited(region) or c.printed("launch"), what="the launch to wait")
    assert not c.printed("launch"), "a launch returned out of its turn"
    assert region.read_usage().devices[0].launches == 0
    write_turn(region, 0, whole_cycle())
    assert c.until("launch") == ["0"]
    c.until("hold")
    assert region.read_usage().devices[0].launches == 3       # all through the gate
    assert slot_of(region, c.pid).launches[0] == 3


@pytest.mark.parametrize("path", PATHS)
def test_a_closed_gate_fails_every_launch_path(path, sim, clients, client_factory):
    """A job whose gate the daemon closed (its region was tampered with)
    gets CUDA_ERROR_NOT_PERMITTED from every launch, nothing runs on the
    GPU, and the hook says why."""
    region = sim.region([GiB, GiB], throttle=CLOSED)
    c = client_factory(clients["gpa_v2"], ["ctx", "0", "launch", path, "3", "hold"],
                       sim.job_env(region.path))
    assert c.until("launch") == [str(CUDA_ERROR_NOT_PERMITTED)]
    c.until("hold")
    proc = next(p for p in sim.stats()["processes"] if p["pid"] == c.pid)
    assert proc["devices"][0]["busy_ns"] == 0          # the simulator ran nothing
    assert region.read_usage().devices[0].launches == 0
    c.go()
    rc, _, err = c.finish()
    assert rc == 0
    assert "compute gate" in err


def test_lifting_the_gate_releases_a_waiting_launch(sim, clients, client_factory):
    region = sim.region([GiB, GiB], turn={0: far_turn()})
    c = client_factory(clients["direct"], ["ctx", "0", "launch", "kernel", "2", "hold"],
                       sim.job_env(region.path))
    c.until("ctx")
    wait_for(lambda: waited(region) or c.printed("launch"), what="the launch to wait")
    assert not c.printed("launch"), "a launch returned out of its turn"
    write_turn(region, 0, OPEN_TURN)
    assert c.until("launch") == ["0"]
    c.until("hold")
    assert slot_of(region, c.pid).launches[0] == 2
    # the launch that waited went through the gate; the next, the fast path
    assert region.read_usage().devices[0].launches == 1


def test_a_turn_rewritten_between_launches_is_kept_at_the_next(sim, clients, client_factory):
    """The hook keeps the schedule it read until the daemon writes a new one:
    a job that launched in its turn, then had it moved away, waits at its
    next launch, and goes once it is given the cycle again."""
    region = sim.region([GiB, GiB], turn={0: whole_cycle()})
    c = client_factory(clients["direct"], ["ctx", "0", "launch", "kernel", "1", "hold",
                                           "launch", "kernel", "1", "hold"],
                       sim.job_env(region.path))
    assert c.until("launch") == ["0"]
    c.until("hold")
    assert not waited(region)
    write_turn(region, 0, far_turn())
    c.go()
    wait_for(lambda: waited(region) or launches_printed(c) > 1, what="the launch to wait")
    assert launches_printed(c) == 1, "a launch returned out of its turn: the old schedule was kept"
    write_turn(region, 0, whole_cycle())
    assert c.until("launch") == ["0"]
    c.until("hold")
    assert region.read_usage().devices[0].launches == 2


def test_only_the_launching_thread_waits(sim, clients, client_factory):
    """A thread's launch waits for its turn while the other threads go on:
    the main thread's calls return, and its join waits for the launching
    thread."""
    region = sim.region([GiB, GiB], turn={0: far_turn()})
    c = client_factory(clients["direct"], ["ctx", "0", "bglaunch", "kernel", "2", "info",
                                           "alloc", "1M", "launch", "graph", "0", "join"],
                       sim.job_env(region.path))
    assert c.until("bglaunch") == ["0"]
    assert c.until("info")[0] == "0"        # the process goes on meanwhile
    assert c.until("alloc")[0] == "0"
    assert c.until("launch") == ["0"]
    wait_for(lambda: waited(region) or c.printed("join"), what="the launch to wait")
    assert not c.printed("join"), "the launching thread finished out of its turn"
    write_turn(region, 0, whole_cycle())
    assert c.until("join") == ["0"]
    assert region.read_usage().devices[0].launches == 2


# ---- the shares, by the simulator's timeline -----------------------------------------

def start_burn(sim: Sim, region: Region, tag: str, kernel_us: int,
               seconds: float | None, *more: str, **env: str) -> subprocess.Popen[str]:
    """vgpu-burn saturating GPU 0 (4 kernels queued) in the job of region
    (`more`: its other options; seconds None: they say how long; `env`: more
    of its environment)."""
    how = ["--seconds", str(seconds)] if seconds is not None else []
    return subprocess.Popen([str(native.burn_program()), "--device", "0", "--kernel-us",
                             str(kernel_us), *how, *more],
                            env=sim.job_env(region.path, VGPU_SIM_TAG=tag, **env),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def burn_result(p: subprocess.Popen[str], timeout: float = 60) -> dict[str, Any]:
    out, err = p.communicate(timeout=timeout)
    assert p.returncode == 0, (out, err)
    return json.loads(out.strip().splitlines()[-1])


@contextmanager
def burning(sim: Sim, jobs: dict[str, tuple[Region, int]],
            more: dict[str, list[str]] | None = None) -> Iterator[None]:
    """vgpu-burn saturating GPU 0 in each job (tag -> its region and kernel
    length in us; `more`: tag -> its other options) for the block; each run
    must still be going at its end."""
    procs = [start_burn(sim, region, tag, kernel_us, 60, *(more or {}).get(tag, []))
             for tag, (region, kernel_us) in jobs.items()]
    try:
        yield
        for p in procs:
            assert p.poll() is None, burn_result(p)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.communicate(timeout=30)


def sleep_until(t_ns: int) -> None:
    time.sleep(max(0.0, (t_ns - time.monotonic_ns()) / 1e9))


def shares(sim: Sim, epoch_ns: int, tags: list[str], cycles: int,
           phase_ns: int = 47 * MS + MS // 2,
           hooks: dict[str, Region] | None = None,
           measured: dict[str, float] | None = None) -> dict[str, float]:
    """Each tag's percent of GPU 0 by the simulator's timeline, over `cycles`
    whole cycles of the turns from epoch_ns, once every tag's job runs: from
    a reading at phase_ns of a cycle to one at the same phase `cycles` later
    (a phase where no turn of the tests' runs, so neither reading cuts a
    turn's kernels; the run's start and end, where a job waits for its
    first turn or for its last, are left out). `hooks`: tag -> its job's
    region, whose percent as the job's hook measured it (busy_ns) over the
    same cycles goes into `measured`."""
    with sim.probe() as probe:
        wait_for(lambda: all(probe.busy_ns(tags)[1].values()), what="every job to run kernels")
        # two cycles more: each hook has measured its launches' cost
        after = time.monotonic_ns() + 2 * CYCLE_NS - epoch_ns - phase_ns
        start = epoch_ns + phase_ns + -(-after // CYCLE_NS) * CYCLE_NS
        sleep_until(start)
        t0, b0 = probe.busy_ns(tags)
        h0 = {tag: r.read_usage().devices[0].busy_ns for tag, r in (hooks or {}).items()}
        sleep_until(start + cycles * CYCLE_NS)
        t1, b1 = probe.busy_ns(tags)
        h1 = {tag: r.read_usage().devices[0].busy_ns for tag, r in (hooks or {}).items()}
    if measured is not None:
        measured.update({tag: 100.0 * (h1[tag] - h0[tag]) / (t1 - t0) for tag in h0})
    return {tag: 100.0 * (b1[tag] - b0[tag]) / (t1 - t0) for tag in tags}


def test_a_turn_of_30_percent_gets_30_percent_of_the_device(sim):
    """A saturating job whose turn is 15 ms of each 50 ms cycle gets 30 %
    of the device, 1 ms kernels and all (40 cycles: 2 s)."""
    epoch = time.monotonic_ns()
    region = sim.region([GiB], turn=turn(0, 15, epoch))
    with burning(sim, {"job-30": (region, 1000)}):
        got = shares(sim, epoch, ["job-30"], 40)["job-30"]
    assert abs(got - 30.0) <= TOLERANCE, f"{got:.2f} % of the device"


def test_the_hook_measures_the_gpu_time_the_simulator_ran(sim):
    """The job's GPU time as its hook measured it (usage busy_ns, from its
    events) is what the simulator's timeline ran for it, within 3 % of the
    run (a run of 2 s)."""
    region = sim.region([GiB], turn=turn(0, 15, time.monotonic_ns()))
    res = burn_result(start_burn(sim, region, "job-m", 1000, 2))
    truth = ran_ns(sim, "job-m")
    dev = region.read_usage().devices[0]
    elapsed_ns = res["seconds"] * 1e9
    assert truth > 0 and dev.launches >= res["kernels"]
    assert abs(dev.busy_ns - truth) <= 0.03 * elapsed_ns, \
        f"hook {dev.busy_ns / 1e6:.1f} ms, simulator {truth / 1e6:.1f} ms of " \
        f"{elapsed_ns / 1e6:.0f} ms"
    assert dev.borrowed_ns == 0                # a hard job borrows nothing
    assert 900_000 <= dev.cost_ns <= 1_100_000  # one launch: a 1 ms kernel


def test_work_that_completed_is_measured_at_the_synchronisation(sim):
    """A burst of 6 x 5 ms kernels queued at once, then the stream
    synchronised and the process gone: the job's GPU time holds the whole
    burst (measured at the synchronisation, not at a next launch that never
    comes)."""
    region = sim.region([GiB], turn=turn(0, 45, time.monotonic_ns()))
    p = start_burn(sim, region, "job-sync", 5000, None, "--count", "6", "--inflight", "6")
    burn_result(p)
    dev = region.read_usage().devices[0]
    assert_measured(sim, "job-sync", dev.busy_ns, at_least_ns=29_000_000, within_ns=1_000_000)


def ran_ns(sim: Sim, tag: str) -> int:
    """The GPU time the simulator's timeline ran for a tag on GPU 0."""
    return next(int(t["devices"][0]["busy_ns"]) for t in sim.stats()["tags"] if t["name"] == tag)


def assert_measured(sim: Sim, tag: str, busy_ns: int, at_least_ns: int, within_ns: int) -> None:
    """The job's GPU time as its hooks measured it is the simulator's."""
    truth = ran_ns(sim, tag)
    assert truth >= at_least_ns
    assert abs(busy_ns - truth) <= within_ns, \
        f"hook {busy_ns / 1e6:.1f} ms, simulator {truth / 1e6:.1f} ms"


def test_a_mark_recorded_late_does_not_charge_the_wait(sim):
    """Every fourth launch, the launching thread loses its CPU inside the
    driver's call for 5 ms (VGPU_SIM_LAUNCH_STALL, as on a loaded host): its
    500 us kernel runs meanwhile, and the event that marks its end is
    recorded 4.5 ms after the end. The job's GPU time is still the
    simulator's, not the 45 ms its thread waited: an honest job loses none
    of its turns to what the host's load did to its timing."""
    region = sim.region([GiB], turn=turn(0, 45, time.monotonic_ns()))
    p = start_burn(sim, region, "job-stall", 500, None, "--count", "40", "--inflight", "1",
                   VGPU_SIM_LAUNCH_STALL="5000/4")
    burn_result(p)
    dev = region.read_usage().devices[0]
    assert_measured(sim, "job-stall", dev.busy_ns, at_least_ns=19_000_000, within_ns=2_000_000)
    assert 450_000 <= dev.cost_ns <= 550_000    # learnt from the marks on time


def test_what_was_launched_before_the_first_measure_is_estimated_again(sim):
    """Eight 10 ms kernels queued at once by a job whose turn is the whole
    cycle, each estimated at the default of 1 ms (nothing measured yet).
    Once one is measured, the job's signal says its work runs as long as
    what it has queued does (60 ms and more), not 6 ms: the next turn's job
    waits for it by that, and the job's turn lets no more in until it fits
    (a 5 ms job's first turn set every turn after it 10 ms late for
    seconds)."""
    region = sim.region([GiB], turn=whole_cycle())
    p = start_burn(sim, region, "job-first", 10_000, None, "--count", "10", "--inflight", "8")
    try:
        wait_for(lambda: region.read_usage().devices[0].cost_ns > 0, what="a launch measured")
        launches = region.read_usage().devices[0].launches
        sig = read_signal(region, 1)
        now = time.monotonic_ns()
        ran = ran_ns(sim, "job-first")
    finally:
        burn_result(p)
    assert sig is not None
    said_ms, left_ms = (sig[0].busy_until_ns - now) / 1e6, (launches * 10_000_000 - ran) / 1e6
    assert said_ms >= left_ms - 15, f"its signal says {said_ms:.1f} ms more, {left_ms:.1f} queued"


def test_two_jobs_get_their_turns(sim):
    """Two saturating jobs, turns 0-15 ms and 15-45 ms of the same cycle:
    30 % and 60 % of the device (40 cycles: 2 s). Each turn waits for the
    work in flight of the turn before it (its signal), as the daemon's plan
    has it."""
    epoch = time.monotonic_ns()
    a = sim.region([GiB], name="a")
    b = sim.region([GiB], name="b")
    write_turn(a, 0, replace(turn(0, 15, epoch), prev_signal_id=b.signal_id))
    write_turn(b, 0, replace(turn(15, 30, epoch), prev_signal_id=a.signal_id))
    with burning(sim, {"job-a": (a, 1000), "job-b": (b, 1000)}):
        got = shares(sim, epoch, ["job-a", "job-b"], 40)
    assert abs(got["job-a"] - 30.0) <= TOLERANCE and abs(got["job-b"] - 60.0) <= TOLERANCE, \
        f"a {got['job-a']:.2f} %, b {got['job-b']:.2f} %"


def test_a_step_of_unlike_kernels_keeps_to_its_turn(sim):
    """Job a launches, of every 64 kernels, 48 of 50 us and then 16 of 2 ms
    on another grid (a training step's many small kernels and its few big
    ones; 16 queued), beside job b's 1 ms kernels, turns 0-15 and 15-45 ms:
    30 % and 60 % of the device, and each hook measures what the simulator
    ran for its job (40 cycles: 2 s). On one cost for all of a's launches
    (about 540 us), its 2 ms kernels went into its turn on a quarter of
    their cost and ran into b's turn, and each job's spans counted the
    other's time slices."""
    epoch = time.monotonic_ns()
    a = sim.region([GiB], name="a")
    b = sim.region([GiB], name="b")
    write_turn(a, 0, replace(turn(0, 15, epoch), prev_signal_id=b.signal_id))
    write_turn(b, 0, replace(turn(15, 30, epoch), prev_signal_id=a.signal_id))
    hook: dict[str, float] = {}
    with burning(sim, {"job-a": (a, 50), "job-b": (b, 1000)},
                 {"job-a": ["--long-every", "64", "--long-run", "16", "--long-us", "2000",
                            "--inflight", "16"]}):
        got = shares(sim, epoch, ["job-a", "job-b"], 40, hooks={"job-a": a, "job-b": b},
                     measured=hook)
    seen = {tag: f"{got[tag]:.2f} % (its hook: {hook[tag]:.2f})" for tag in got}
    for tag, want in (("job-a", 30.0), ("job-b", 60.0)):
        assert abs(got[tag] - want) <= TOLERANCE, seen
        assert abs(hook[tag] - got[tag]) <= TOLERANCE, seen


def test_a_kernel_longer_than_the_turn_runs_and_later_turns_pay(sim):
    """5 ms kernels, a turn of 2.5 ms of each 50 ms cycle (5 %): each kernel
    still runs (alone, with credit left), and the turns after it pay for
    it: 5 % of the device on average (60 cycles: 3 s)."""
    epoch = time.monotonic_ns()
    region = sim.region([GiB], turn=turn(0, 2.5, epoch))
    with burning(sim, {"job-5": (region, 5000)}):
        got = shares(sim, epoch, ["job-5"], 60)["job-5"]
    assert abs(got - 5.0) <= 1.5, f"{got:.2f} % of the device"
