"""The violation watch's split of the device's busy time (vgpuctl.daemon.
violations, Watch): a gated job's GPU time is what its hooks claim; what the
device ran beyond the claims is billed only where it stays beyond them.
Driven with a fake NVML list and fake busy windows; the job's process is
this test's own (a live pid the watch can verify)."""

from __future__ import annotations

import os

import pytest

from vgpuctl.core.violations import JobLimits
from vgpuctl.daemon.busysplit import CLAIM_BEHIND_S
from vgpuctl.daemon.watch import GpuStats, JobProcs, Known, Watch
from vgpuctl.system.busy import BusyWindow

G = 1 << 30
GPU = "GPU-test"
TICK = 0.1


def _lone_gated_job(claims_ns: int) -> Known:
    """Job 1 alone on the GPU, its one process this one, in its slots."""
    me = os.getpid()
    start = _start_of(me)
    return Known([JobLimits("1", GPU, G, 0.2, os.getuid(), turn=0.2)], {me: "1"}, {me: start},
                 {}, jobs={"1": JobProcs(os.getuid(), {me: start}, None)},
                 hooked={me: start}, claims={("1", GPU): claims_ns})


def _start_of(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[19])


def _bills(busy_per_tick: list[float], claims_per_tick: list[float]) -> tuple[float, float]:
    """(claims, beyond) billed to the job over the ticks."""
    state = {"i": -1}

    def busy(uuid: str) -> BusyWindow:
        i = state["i"]
        return BusyWindow(uuid, i * TICK, (i + 1) * TICK, busy_per_tick[i] if i >= 0 else 0.0)

    w = Watch(lambda: [GpuStats(0, GPU, "test", 16 * G, processes={os.getpid(): G})], busy)
    total_ns, beyond = 0, 0.0
    w.check(_lone_gated_job(1), "report", 0.0)       # the counter's first reading
    for i, c in enumerate(claims_per_tick):
        state["i"] = i
        total_ns += int(c * 1e9)
        res = w.check(_lone_gated_job(1 + total_ns), "report", (i + 1) * TICK)
        beyond += res.beyond.get(("1", GPU), 0.0)
    return total_ns / 1e9, beyond


def test_a_lone_gated_jobs_claims_that_lag_the_device_are_not_billed_twice():
    """Its hook claims a span when it next launches: a window with the
    device busy and nothing claimed, then a window claiming both. Before,
    the first window's busy time was billed again as beyond its claims."""
    busy = [0.02, 0.02] * 20
    claims = [0.0, 0.04] * 20
    claimed, beyond = _bills(busy, claims)
    assert claimed == pytest.approx(sum(busy))
    assert beyond == 0.0


def test_what_stays_beyond_a_lone_gated_jobs_claims_is_billed():
    """A process that passes for hooked and launches past its hook: the
    device runs 8 % beyond the claims, tick after tick; all but the noise
    carried is billed."""
    n = 40
    claimed, beyond = _bills([0.1] * n, [0.02] * n)
    assert claimed == pytest.approx(0.02 * n)
    assert beyond == pytest.approx(0.08 * n - CLAIM_BEHIND_S)


def test_busy_time_of_a_job_that_left_is_not_the_lone_job_lefts():
    """Two jobs; one exits. Its last spans were never claimed (it ended
    between two reads of its counter) and NVML's busy time comes a sample
    period late: the device's busy time beyond the claims in the windows
    after it left is no one's, not the job still there."""
    import subprocess
    other = subprocess.Popen(["sleep", "30"])
    try:
        me, them = os.getpid(), other.pid
        starts = {me: _start_of(me), them: _start_of(them)}
        procs = {me: G, them: G}
        state = {"i": -1, "busy": 0.0}

        def busy(uuid: str) -> BusyWindow:
            i = state["i"]
            return BusyWindow(uuid, i * TICK, (i + 1) * TICK, state["busy"])

        w = Watch(lambda: [GpuStats(0, GPU, "test", 16 * G, processes=dict(procs))], busy)

        def known(claims: dict[str, int]) -> Known:
            lims = [JobLimits(j, GPU, G, 0.5, os.getuid(), turn=0.5) for j in claims]
            pids = {p: j for p, j in ((me, "1"), (them, "2")) if j in claims}
            return Known(lims, pids, {p: starts[p] for p in pids}, {},
                         jobs={j: JobProcs(os.getuid(), {p: starts[p] for p, jj in pids.items()
                                                          if jj == j}, None) for j in claims},
                         hooked={p: starts[p] for p in pids}, claims={(j, GPU): c for j, c in
                                                                       claims.items()})

        c1 = c2 = 1
        w.check(known({"1": c1, "2": c2}), "report", 0.0)
        for i in range(10):                    # both busy, each claims half
            state["i"], state["busy"] = i, 0.1
            c1, c2 = c1 + 50_000_000, c2 + 50_000_000
            w.check(known({"1": c1, "2": c2}), "report", (i + 1) * TICK)
        del procs[them]                        # job 2 ends; its last 0.15 s unclaimed
        beyond = 0.0
        for i in range(10, 14):
            state["i"], state["busy"] = i, 0.05 + (0.05 if i < 13 else 0.0)
            c1 += 50_000_000
            res = w.check(known({"1": c1}), "report", (i + 1) * TICK)
            beyond += res.beyond.get(("1", GPU), 0.0)
        assert beyond == 0.0
    finally:
        other.kill()
        other.wait()
