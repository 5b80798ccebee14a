"""Acceptance: two jobs on the same two simulated GPUs, `vgpuctl run --gpus 2
--core 30` and `--core 60` (hard), each with a vgpu-burn process on each of
its GPUs, get their shares on each GPU within 3 points, as the simulator's
own timeline records the busy time of each process (VGPU_SIM_TAG); `ps`
shows each once with both GPUs, and `report` accounts each GPU and the job's
total."""

from __future__ import annotations

import json
import sys

from support.daemon import needs_native, wait_for
from support.sim import shares_over

from vgpuctl.system import native

pytestmark = needs_native

SHARES = {"j30": 30, "j60": 60}
WINDOW_S = 10.0


def ranks(tag: str) -> str:
    """A job's command: a 1 ms kernel loop on each of its two GPUs."""
    burn = native.burn_program()
    return " & ".join(f"VGPU_SIM_TAG={tag}-{i} {burn} --device {i} --kernel-us 1000 "
                      f"--seconds 60 >/dev/null" for i in (0, 1)) + " & wait"


def test_two_jobs_on_two_gpus_get_their_shares_on_each(daemon_factory):
    d = daemon_factory(gpus="2x16G")
    jobs = [d.popen("run", "--gpus", "2", "--mem", "1G", "--core", str(core), "--policy",
                    "hard", "--name", tag, "--", "sh", "-c", ranks(tag))
            for tag, core in SHARES.items()]
    try:
        def settled() -> bool:
            rows = {j["name"]: j for j in d.jobs()}
            return len(rows) == 2 and all(
                len(rows[t]["per_gpu"]) == 2 and all(
                    abs((g["core_measured"] or 0) - c / 100) < 0.03 for g in rows[t]["per_gpu"])
                for t, c in SHARES.items())
        wait_for(settled, timeout=60, what="both jobs to settle at their shares on each GPU")
        shares = shares_over(d.env, WINDOW_S)
        rows = {j["name"]: j for j in d.jobs()}
    finally:
        d.cleanup_jobs()
        for j in jobs:
            j.wait(timeout=30)
    print(f"shares on the simulator's timeline: {shares}", file=sys.stderr)
    for tag, core in SHARES.items():
        for i in (0, 1):
            assert abs(shares[f"{tag}-{i}"] - core) <= 3, shares
        assert rows[tag]["gpus"] == [0, 1] and len(rows[tag]["pids"]) >= 3   # sh + 2 ranks
    # The report: per GPU, and each job's total across its GPUs.
    by_job = json.loads(d.cli("report", "--format", "json", "--since", "1h", "--state-dir",
                              str(d.state), "--by", "job").stdout)
    by_gpu = json.loads(d.cli("report", "--format", "json", "--since", "1h", "--state-dir",
                              str(d.state), "--by", "gpu").stdout)
    assert sorted(r["name"] for r in by_job) == sorted(SHARES)
    assert len(by_gpu) == 2 and all(r["jobs"] == 2 for r in by_gpu)
    total = sum(r["gpu_seconds"] for r in by_job)
    assert abs(total - sum(r["gpu_seconds"] for r in by_gpu)) < 1e-3
    for r in by_job:
        assert len(r["gpus"]) == 2


def test_a_job_busy_on_one_of_its_two_gpus_gets_its_share_there(daemon_factory):
    """A `--gpus 2 --core 30` job that works on GPU 0 only (rank 0 evaluating
    alone, an idle pipeline stage) gets its 30 % there, beside a neighbour
    at 60 % on both GPUs: its turn on each GPU is its own, kept and measured
    there (it was held to a fifth of its share when one pace held both)."""
    d = daemon_factory(gpus="2x16G")
    burn = native.burn_program()
    one = f"VGPU_SIM_TAG=one-0 {burn} --device 0 --kernel-us 1000 --seconds 60 >/dev/null"
    jobs = [d.popen("run", "--gpus", "2", "--mem", "1G", "--core", "30", "--policy", "hard",
                    "--name", "one", "--", "sh", "-c", one),
            d.popen("run", "--gpus", "2", "--mem", "1G", "--core", "60", "--policy", "hard",
                    "--name", "j60", "--", "sh", "-c", ranks("j60"))]
    try:
        def settled() -> bool:
            rows = {j["name"]: j for j in d.jobs()}
            return len(rows) == 2 and abs(
                (rows["one"]["per_gpu"][0]["core_measured"] or 0) - 0.30) < 0.03
        wait_for(settled, timeout=60, what="the one-GPU job to settle at its share")
        share = shares_over(d.env, WINDOW_S / 2)["one-0"]
    finally:
        d.cleanup_jobs()
        for j in jobs:
            j.wait(timeout=30)
    print(f"the one-GPU job's share of GPU 0: {share:.2f}", file=sys.stderr)
    assert abs(share - 30) <= 3
