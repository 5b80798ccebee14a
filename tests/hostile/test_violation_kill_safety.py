"""The violation watch's kill, driven in process with NVML's answer given:
it kills only the process NVML names, only while that pid is still the
process it was (start time), never the daemon itself; and a child of a
job's process is the job's even before /proc tracking has seen it."""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from support.daemon import wait_for

from vgpuctl.core.violations import JobLimits
from vgpuctl.daemon import tracking
from vgpuctl.daemon.watch import JobProcs, Known, Watch
from vgpuctl.system.nvml import GpuStats

G = 1 << 30
GPU = "GPU-test"


def nvml_lists(*procs: tuple[int, int]):
    """A snapshot function: one GPU whose compute processes are procs."""
    return lambda: [GpuStats(0, GPU, "test", 16 * G, processes=dict(procs))]


def job(pids: dict[int, int], launchers: dict[int, tuple[int, str]] | None = None) -> Known:
    launcher = next(((p, s) for p, (s, _) in (launchers or {}).items()), None)
    return Known([JobLimits("1", GPU, G, 1.0, os.getuid())], dict.fromkeys(pids, "1"), pids,
                 launchers or {}, jobs={"1": JobProcs(os.getuid(), pids, launcher)})


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


def test_a_reused_pid_is_never_taken_for_the_jobs():
    child = subprocess.Popen(["sleep", "60"], start_new_session=True)
    try:
        start = tracking.start_time(child.pid)
        w = Watch(nvml_lists((child.pid, 2 * G)))
        # The job's record has the pid with another start time: not this
        # process, which is a stranger (no job), not the job's overrun.
        res = w.check(job({child.pid: start - 1}), "report", 0.0)
        assert [v.kind for v in res.found] == ["no_job"]
        assert res.ended == {} and res.killed == []
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


def _cgroup_v2_root() -> Path | None:
    for line in open("/proc/self/mounts"):
        f = line.split()
        if len(f) > 2 and f[2] == "cgroup2":
            return Path(f[1])
    return None


@contextmanager
def _in_job_4242_cgroup(name: str, preexec_fn: Callable[[], None] | None = None
                        ) -> Iterator[subprocess.Popen[bytes]]:
    """A process (sleep 60) in the cgroup v2 group <root>/name/job_4242, named
    as Slurm job 4242's, for the block; then the process killed and the group
    removed. The test is skipped where no group can be made."""
    root = _cgroup_v2_root()
    group = root / name / "job_4242" if root else None
    try:
        assert group is not None
        group.mkdir(parents=True)
    except (AssertionError, OSError) as e:
        pytest.skip(f"cannot create a cgroup v2 group here: {e}")
    child = subprocess.Popen(["sleep", "60"], start_new_session=True, preexec_fn=preexec_fn)
    try:
        (group / "cgroup.procs").write_text(str(child.pid))
        yield child
    finally:
        child.kill()
        child.wait()
        wait_for(lambda: not (group / "cgroup.procs").read_text().strip(), what="empty cgroup")
        group.rmdir()
        group.parent.rmdir()


def test_a_process_in_a_slurm_jobs_cgroup_is_that_jobs_wherever_it_was_forked(tmp_path):
    with _in_job_4242_cgroup(f"vgpu-test-{os.getpid()}") as child:
        w = Watch(nvml_lists((child.pid, 2 * G)))
        # No pid of the job is known, and the process is no descendant of any:
        # its Slurm job's cgroup says whose it is.
        known = Known([JobLimits("1", GPU, G, 1.0, 0)], {}, {}, {}, {"4242": "1"})
        res = w.check(known, "report", 0.0)
        assert [(v.kind, v.job_id) for v in res.found] == [("memory", "1")]
        w = Watch(nvml_lists((child.pid, 2 * G)))
        res = w.check(Known([], {}, {}, {}, {"4243": "2"}), "report", 0.0)
        assert [v.kind for v in res.found] == ["no_job"]


def test_a_cgroup_named_after_another_users_slurm_job_frames_no_one(tmp_path):
    """A user who may make cgroups of their own (a delegated subtree) names
    one job_4242 and puts a GPU process in it: it is not charged to Slurm job
    4242's vgpu job, which is another user's, but is a process in no job."""
    if os.geteuid() != 0:
        pytest.skip("needs root to run a process as nobody")

    def nobody() -> None:
        os.setgid(65534)
        os.setuid(65534)
    with _in_job_4242_cgroup(f"vgpu-test-{os.getpid()}-frame", nobody) as child:
        w = Watch(nvml_lists((child.pid, 2 * G)))
        victim = JobProcs(1000, {}, None)
        known = Known([JobLimits("1", GPU, G, 1.0, 1000)], {}, {}, {}, {"4242": "1"},
                      jobs={"1": victim})
        res = w.check(known, "report", 0.0)
        assert [(v.kind, v.job_id) for v in res.found] == [("no_job", None)]
