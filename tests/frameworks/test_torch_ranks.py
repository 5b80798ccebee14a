"""A two-rank PyTorch job (torch.multiprocessing.spawn, the gloo backend over
CUDA tensors: NCCL's kernels compute nothing on a GPU whose kernels don't
run) under `vgpuctl run --gpus 2 --mem 2G`, on two simulated GPUs: each rank
sees two GPUs of 2 GiB, in CUDA and in NVML; its memory lands on its own
physical GPU, as the simulator's own record shows; the collective completes;
each rank gets torch.OutOfMemoryError at its own GPU's limit; and `ps
--json` shows one job with both GPUs and every process. And NCCL: its
communicator comes up and a collective returns (without computing) under
the hook, its buffers shared between the ranks charged once."""

from __future__ import annotations

import json
import socket
import subprocess
import sys

from support.daemon import needs_native, read_line, vgpuctl_argv, wait_for

pytestmark = needs_native

GiB = 1 << 30
MiB = 1 << 20

RANKS = r"""
import json, os, sys, time
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

def out(v):
    # one write, so that the ranks' lines on the one pipe never interleave
    os.write(1, (json.dumps(v) + "\n").encode())

def rank_main(rank, world, port, go):
    os.environ["VGPU_SIM_TAG"] = f"rank{rank}"     # the simulator's record of this rank
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
    torch.cuda.set_device(rank)
    dev = torch.device("cuda", rank)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    free, total = torch.cuda.mem_get_info(dev)
    uuid = "GPU-" + str(torch.cuda.get_device_properties(rank).uuid)
    import pynvml
    pynvml.nvmlInit()
    nvml_total = pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByUUID(uuid)).total
    held = torch.empty(512 << 20, dtype=torch.uint8, device=dev)
    out({"rank": rank, "pid": os.getpid(), "count": torch.cuda.device_count(),
         "total": total, "nvml_total": nvml_total, "uuid": uuid})
    deadline = time.monotonic() + 300
    while not os.path.exists(go) and time.monotonic() < deadline:
        time.sleep(0.05)
    # made on the host and copied: kernels compute nothing on the simulator
    t = torch.tensor([float(rank + 1)] * 1024).to(dev)
    dist.all_reduce(t)
    got = sorted(set(t.cpu().tolist()))
    blocks, oom = [], None
    try:
        while len(blocks) < 1000:
            blocks.append(torch.empty(64 << 20, dtype=torch.uint8, device=dev))
    except torch.OutOfMemoryError as e:
        oom = type(e).__name__
    free, total = torch.cuda.mem_get_info(dev)
    out({"rank": rank, "sum": got, "oom": oom,
         "reserved": torch.cuda.memory_reserved(dev), "free": free})
    del blocks, held
    dist.barrier()
    dist.destroy_process_group()

if __name__ == "__main__":
    mp.spawn(rank_main, args=(2, int(sys.argv[1]), sys.argv[2]), nprocs=2)
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def sim_stats(d) -> dict:
    r = subprocess.run([*vgpuctl_argv(), "sim", "stats", "--json"], env=d.env,
                       capture_output=True, text=True, timeout=60, check=True)
    return json.loads(r.stdout)


def test_two_ranks_on_two_gpus_under_one_job(daemon_factory, tmp_path):
    d = daemon_factory(gpus="2x16G")
    uuids = [g["uuid"] for g in d.call("ps")["gpus"]]
    script = tmp_path / "ranks.py"
    script.write_text(RANKS)
    go = tmp_path / "go"
    p = d.popen("run", "--gpus", "2", "--mem", "2G", "--", sys.executable, str(script),
                str(free_port()), str(go))
    try:
        ready = {}
        for _ in range(2):
            line = read_line(p.stdout, timeout=240)
            assert line, p.stderr.read() if p.poll() is not None else "no line"
            r = json.loads(line)
            ready[r["rank"]] = r
        for rank in (0, 1):
            r = ready[rank]
            # two GPUs of 2 GiB each; device `rank` is physical GPU `rank`
            assert (r["count"], r["total"], r["nvml_total"]) == (2, 2 * GiB, 2 * GiB), r
            assert r["uuid"] == uuids[rank]
        # Each rank's memory is on its own physical GPU, none on the other.
        procs = {p_["pid"]: p_["devices"] for p_ in sim_stats(d)["processes"]}
        for rank in (0, 1):
            used = [dev["used"] for dev in procs[ready[rank]["pid"]]]
            assert used[rank] >= 512 * MiB and used[1 - rank] == 0, (rank, used)
        # One job, both GPUs, every process: the launcher's command and its ranks.
        jobs = d.jobs()
        assert len(jobs) == 1, jobs
        job = jobs[0]
        assert job["gpus"] == [0, 1] and job["gpu_uuids"] == uuids
        wait_for(lambda: {ready[0]["pid"], ready[1]["pid"]} < set(d.jobs()[0]["pids"]),
                 what="both ranks and their launcher in the job")
        wait_for(lambda: all((g["mem_used"] or 0) >= 512 * MiB
                             for g in d.jobs()[0]["per_gpu"]), what="both GPUs' counters")
        go.touch()
        done = {}
        for _ in range(2):
            r = json.loads(read_line(p.stdout, timeout=240))
            done[r["rank"]] = r
        assert p.wait(timeout=120) == 0, p.stderr.read()
    finally:
        if p.poll() is None:
            d.cleanup_jobs()
            p.wait(timeout=30)
    for rank in (0, 1):
        r = done[rank]
        assert r["sum"] == [3.0], r                    # 1 + 2: the collective completed
        assert r["oom"] == "OutOfMemoryError", r
        # OOM at its own GPU's limit: its GPU shows less than a block free,
        # and what it reserved fits in the 2G with its context
        assert r["free"] < 64 * MiB and r["reserved"] < 2 * GiB, r
    tags = {t["name"]: t["devices"] for t in sim_stats(d)["tags"]}
    print(f"ranks at OOM: {done}; the simulator's peaks per GPU: "
          f"{ {t: [dev['peak'] for dev in devs] for t, devs in tags.items()} }")
    for rank in (0, 1):
        peaks = [dev["peak"] for dev in tags[f"rank{rank}"]]
        assert 2 * GiB - 512 * MiB < peaks[rank] <= 2 * GiB and peaks[1 - rank] == 0, peaks
    ended = d.jobs(all_jobs=True)
    assert len(ended) == 1 and ended[0]["state"] == "ended" and ended[0]["exit_code"] == 0


NCCL_RANKS = r"""
import datetime, json, os, sys, time
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

def rank_main(rank, world, port, go):
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
    dev = torch.device("cuda", rank)
    torch.cuda.set_device(dev)
    dist.init_process_group("nccl", rank=rank, world_size=world, device_id=dev,
                            timeout=datetime.timedelta(seconds=120))
    t = torch.tensor([float(rank + 1)] * 4).to(dev)
    dist.all_reduce(t)
    torch.cuda.synchronize()
    os.write(1, (json.dumps({"rank": rank, "pid": os.getpid()}) + "\n").encode())
    deadline = time.monotonic() + 300
    while not os.path.exists(go) and time.monotonic() < deadline:
        time.sleep(0.05)
    dist.destroy_process_group()

if __name__ == "__main__":
    mp.spawn(rank_main, args=(2, int(sys.argv[1]), sys.argv[2]), nprocs=2)
"""


def test_nccl_comes_up_under_the_hook_and_its_shared_buffers_count_once(daemon_factory,
                                                                        tmp_path):
    """NCCL's P2P transport over cuMem (NCCL_P2P_LEVEL=SYS: the simulated
    GPUs have no PCI topology in /sys, which makes NCCL pick shared host
    memory otherwise): each rank allocates its buffers with cuMemCreate and
    maps the other's through POSIX fd handles. What the hook counts on each
    GPU is what the simulator has there: every buffer once."""
    d = daemon_factory(gpus="2x16G")
    script = tmp_path / "nccl_ranks.py"
    script.write_text(NCCL_RANKS)
    go = tmp_path / "go"
    env = {"NCCL_P2P_LEVEL": "SYS", "NCCL_DEBUG": "WARN"}
    p = d.popen("run", "--gpus", "2", "--mem", "4G", "--", sys.executable, str(script),
                str(free_port()), str(go), env=env)
    try:
        for _ in range(2):
            line = read_line(p.stdout, timeout=240)
            assert line, p.stderr.read() if p.poll() is not None else "no line"
        wait_for(lambda: [g["mem_used"] for g in d.jobs()[0]["per_gpu"]] ==
                 [dev["used"] for dev in sim_stats(d)["devices"]], timeout=30,
                 what="the job's counters to match the simulator's")
        per_gpu = d.jobs()[0]["per_gpu"]
        devices = sim_stats(d)["devices"]
        print(f"NCCL ranks: the job's memory per GPU {[g['mem_used'] for g in per_gpu]}, "
              f"the simulator's {[dev['used'] for dev in devices]}")
        assert all(g["mem_used"] > 0 for g in per_gpu)
        go.touch()
        assert p.wait(timeout=120) == 0, p.stderr.read()
    finally:
        if p.poll() is None:
            d.cleanup_jobs()
            p.wait(timeout=30)
