"""The violation watch's kill, driven in process with NVML's answer given:
it kills only the process NVML names, only while that pid is still the
process it was (start time), never the daemon itself; and a child of a
job's process is the job's even before /proc tracking has seen it."""

from __future__ import annotations

import os
import signal
import subprocess

from support.daemon import wait_for

from vgpuctl.core.violations import JobLimits
from vgpuctl.daemon import tracking
from vgpuctl.daemon.violations import Known, Watch
from vgpuctl.system.nvml import GpuStats

G = 1 << 30
GPU = "GPU-test"


def nvml_lists(*procs: tuple[int, int]):
    """A snapshot function: one GPU whose compute processes are procs."""
    return lambda: [GpuStats(0, GPU, "test", 16 * G, processes=dict(procs))]


def job(pids: dict[int, int], launchers: dict[int, tuple[int, str]] | None = None) -> Known:
    return Known([JobLimits("1", GPU, G, 1.0, None)], dict.fromkeys(pids, "1"), pids,
                 launchers or {})


def test_a_child_no_scan_has_seen_is_its_parents_job_and_is_killed():
    child = subprocess.Popen(["sleep", "60"])
    try:
        me = os.getpid()
        w = Watch(nvml_lists((child.pid, 2 * G)))
        res = w.check(job({me: tracking.start_time(me)}), "kill", 0.0)
        assert [(v.kind, v.pid, v.job_id) for v in res.found] == [("memory", child.pid, "1")]
        assert res.killed == res.found
        assert child.wait(10) == -signal.SIGKILL
    finally:
        child.kill()
        child.wait()


def test_a_launchers_orphan_is_its_job():
    child = subprocess.Popen(["sleep", "60"])
    try:
        me = os.getpid()
        w = Watch(nvml_lists((child.pid, G // 2)))
        res = w.check(job({}, {me: (tracking.start_time(me), "1")}), "report", 0.0)
        assert res.found == []          # its job's, and under the limit: nothing
        w = Watch(nvml_lists((child.pid, G // 2)))
        res = w.check(job({}, {me: (tracking.start_time(me) + 1, "1")}), "report", 0.1)
        assert [v.kind for v in res.found] == ["no_job"]   # not that launcher: a stranger
    finally:
        child.kill()
        child.wait()


def test_a_reused_pid_is_never_killed():
    child = subprocess.Popen(["sleep", "60"])
    try:
        start = tracking.start_time(child.pid)
        w = Watch(nvml_lists((child.pid, 2 * G)))
        # The job's record has the pid with another start time: not this process.
        res = w.check(job({child.pid: start - 1}), "kill", 0.0)
        assert res.found and res.killed == []
        assert child.poll() is None
    finally:
        child.kill()
        child.wait()


def test_the_daemon_never_kills_itself_or_init():
    w = Watch(nvml_lists((os.getpid(), G), (1, G)))
    res = w.check(Known([], {}, {}, {}), "kill", 0.0)
    assert sorted(v.pid for v in res.found) == sorted([1, os.getpid()])
    assert res.killed == []


def test_report_kills_nothing():
    child = subprocess.Popen(["sleep", "60"])
    try:
        w = Watch(nvml_lists((child.pid, G)))
        res = w.check(Known([], {}, {}, {}), "report", 0.0)
        assert [v.kind for v in res.found] == ["no_job"] and res.killed == []
        assert wait_for(lambda: child.poll() is None)
    finally:
        child.kill()
        child.wait()
