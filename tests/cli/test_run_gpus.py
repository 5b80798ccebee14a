"""`vgpuctl run` on several GPUs (--gpus N, --gpu A,B) and on a GPU that is
not the first, end to end on two simulated GPUs: what the job sees, where
its memory lands (the simulator's own per-GPU record), one job in `ps`
with all its GPUs and processes, and the requests that can't be placed."""

from __future__ import annotations

import json
import sys
import textwrap

import pytest
from support.daemon import CUDA_CK, needs_native, read_line, wait_for

pytestmark = needs_native

G = 1 << 30
M = 1 << 20

# How many CUDA devices the job sees, and on the one argv[1] names its
# total and UUID; holds argv[2] bytes there until the file argv[3] exists,
# then allocates past the limit there.
PROBE = "import os, sys, time" + CUDA_CK + textwrap.dedent("""\
    ck(cu.cuInit(0))
    n, = ck(cu.cuDeviceGetCount())
    dev, = ck(cu.cuDeviceGet(int(sys.argv[1])))
    uuid, = ck(cu.cuDeviceGetUuid(dev))
    ctx, = ck(cu.cuDevicePrimaryCtxRetain(dev))
    ck(cu.cuCtxSetCurrent(ctx))
    free, total = ck(cu.cuMemGetInfo())
    ptr, = ck(cu.cuMemAlloc(int(sys.argv[2])))
    def say(*words):
        # one write a line: two ranks share the pipe, and with
        # PYTHONUNBUFFERED print writes each word apart
        os.write(1, (" ".join(str(w) for w in words) + "\\n").encode())
    say("count", n, "total", total, "uuid", bytes(uuid.bytes).hex(), "pid", os.getpid())
    deadline = time.monotonic() + 120
    while not os.path.exists(sys.argv[3]) and time.monotonic() < deadline:
        time.sleep(0.05)
    err, _ = cu.cuMemAlloc(total)
    say("over", err.name)
""")


@pytest.fixture
def probe(tmp_path):
    p = tmp_path / "probe.py"
    p.write_text(PROBE)
    return str(p)


def sim_used(daemon, pid: int) -> list[int]:
    """What the simulator records of a process: bytes on each physical GPU."""
    stats = json.loads(daemon.cli("sim", "stats", "--json").stdout)
    for p in stats["processes"]:
        if p["pid"] == pid:
            return [d["used"] for d in p["devices"]]
    return []


def hexed(uuid: str) -> str:
    return uuid.removeprefix("GPU-").replace("-", "")


def test_a_job_given_gpu_1_sees_one_device_limited_on_physical_gpu_1(daemon, probe,
                                                                       tmp_path):
    uuids = [g["uuid"] for g in daemon.call("ps")["gpus"]]
    go = tmp_path / "go"
    p = daemon.popen("run", "--gpu", "1", "--mem", "1G", "--", sys.executable, probe, "0",
                     str(512 * M), str(go))
    try:
        line = read_line(p.stdout, timeout=60).split()
        assert line[:4] == ["count", "1", "total", str(G)], (line, p.stderr)
        assert line[5] == hexed(uuids[1])
        pid = int(line[7])
        used = sim_used(daemon, pid)
        # its context and its 512M are on physical GPU 1, nothing on GPU 0
        assert used[0] == 0 and used[1] >= 512 * M, used
        job = daemon.jobs()[0]
        assert (job["gpu"], job["gpus"], job["gpu_uuids"]) == (1, [1], [uuids[1]])
        wait_for(lambda: daemon.jobs()[0]["per_gpu"][0]["mem_used"] == used[1],
                 what="the job's counters")
        go.touch()
        assert read_line(p.stdout, timeout=60).split() == ["over", "CUDA_ERROR_OUT_OF_MEMORY"]
    finally:
        p.kill()
        p.wait(timeout=30)


@pytest.mark.parametrize("ask", [["--gpus", "2"], ["--gpu", "1,0"]])
def test_a_job_on_two_gpus_sees_both_is_limited_on_each_and_is_one_job(daemon, probe, ask,
                                                                         tmp_path):
    uuids = [g["uuid"] for g in daemon.call("ps")["gpus"]]
    order = [0, 1] if ask[0] == "--gpus" else [1, 0]
    # Two processes of one job, each on another of its devices: the ranks
    # of a torchrun, started by one shell.
    go = tmp_path / "go"
    script = (f"{sys.executable} {probe} 0 {256 * M} {go} & "
              f"{sys.executable} {probe} 1 {600 * M} {go}; wait")
    p = daemon.popen("run", *ask, "--mem", "1G", "--", "sh", "-c", script)
    try:
        lines = [read_line(p.stdout, timeout=60).split() for _ in range(2)]
        seen = {ln[5]: ln for ln in lines}
        for ln in lines:
            assert ln[:4] == ["count", "2", "total", str(G)], (ln, p.stderr)
        # device 0 of the job is the first GPU placed, device 1 the second
        first, second = seen[hexed(uuids[order[0]])], seen[hexed(uuids[order[1]])]
        used0, used1 = sim_used(daemon, int(first[7])), sim_used(daemon, int(second[7]))
        assert used0[order[1]] == 0 and used0[order[0]] >= 256 * M, used0
        assert used1[order[0]] == 0 and used1[order[1]] >= 600 * M, used1
        jobs = daemon.jobs()
        assert len(jobs) == 1, jobs
        job = jobs[0]
        assert job["gpus"] == order and job["gpu_uuids"] == [uuids[i] for i in order]
        assert (job["gpu"], job["gpu_uuid"]) == (order[0], uuids[order[0]])
        wait_for(lambda: {int(first[7]), int(second[7])} <= set(daemon.jobs()[0]["pids"]),
                 what="both processes in the job")
        assert job["mem_limit"] == G and job["mem_limit_total"] == 2 * G
        wait_for(lambda: (daemon.jobs()[0]["per_gpu"][1]["mem_used"] or 0) >= 600 * M,
                 what="the job's counters")
        job = daemon.jobs()[0]
        per = {g["index"]: g["mem_used"] for g in job["per_gpu"]}
        assert per == {order[0]: used0[order[0]], order[1]: used1[order[1]]}
        assert job["mem_used"] == sum(per.values())
        table = daemon.cli("ps", env={"COLUMNS": "200"}).stdout
        assert f" {order[0]},{order[1]} " in table, table
        assert "/ 2G" in table, table
        for i in order:
            mine = daemon.cli("ps", "--json", "--gpu", str(i)).stdout
            assert [j["id"] for j in json.loads(mine)["jobs"]] == [job["id"]]
        go.touch()
        out = [read_line(p.stdout, timeout=60).split() for _ in range(2)]
        assert out == [["over", "CUDA_ERROR_OUT_OF_MEMORY"]] * 2
    finally:
        p.kill()
        p.wait(timeout=30)


@pytest.mark.parametrize("args, code, text", [
    (["--gpus", "3"], 6, "--gpus 3: there are 2 GPUs here for it"),
    (["--gpus", "0"], 2, "--gpus 0: a job needs at least one GPU"),
    (["--gpus", "two"], 2, "--gpus: 'two' is not a number of GPUs"),
    (["--gpus", "2", "--gpu", "0"], 2, "--gpus and --gpu: give one"),
    (["--gpu", "0,0"], 2, "is named twice"),
    (["--gpu", "1,2"], 4, "no GPU 2"),
])
def test_requests_for_gpus_that_cannot_be_placed_are_one_line(daemon, args, code, text):
    r = daemon.cli("run", *args, "--mem", "1G", "--", "true")
    assert r.returncode == code, r.stderr
    assert r.stderr.startswith("vgpuctl: error: ") and r.stderr.count("\n") == 1, r.stderr
    assert text in r.stderr, r.stderr
    assert daemon.jobs() == []


def test_two_gpus_are_placed_all_or_none(daemon):
    holder = daemon.popen("run", "--gpu", "1", "--mem", "15G", "--", "sleep", "60")
    try:
        wait_for(lambda: daemon.jobs(), what="the holder")
        r = daemon.cli("run", "--gpus", "2", "--mem", "1G", "--", "true")
        assert r.returncode == 6 and "on each of 2 GPUs" in r.stderr, r.stderr
        assert [j["gpus"] for j in daemon.jobs()] == [[1]]       # nothing held on GPU 0
        assert daemon.call("ps")["gpus"][0]["committed"] == 0
    finally:
        holder.kill()
        holder.wait(timeout=30)


def test_run_says_each_gpu_it_got(daemon):
    r = daemon.cli("run", "--gpus", "2", "--mem", "1G", "--", "true")
    assert r.returncode == 0, r.stderr
    uuids = [g["uuid"][:12] for g in daemon.call("ps")["gpus"]]
    assert r.stderr == f"vgpuctl: job 1 on GPUs 0,1 ({uuids[0]}, {uuids[1]})\n"
