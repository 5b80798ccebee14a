"""Slurm's --gres=shard jobs fenced and accounted by vgpuctl, on a real
single-node cluster: 16 shards of 1 GiB on each of two simulated 16 GiB GPUs,
`vgpuctl slurm prolog|task-prolog|epilog` as the node's hooks."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
from slurm.cluster import usable_by
from slurm.steps import BURN, WITH_ID, G, burn_args, running, sbatch, step, vgpu_job
from support.daemon import wait_for
from support.sim import busy_by_tag


def report(daemon: Any, *args: str) -> list[dict[str, Any]]:
    r = daemon.cli("report", "--format", "json", "--since", "1h", "--state-dir",
                   str(daemon.state), *args)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def test_a_4_shard_step_may_allocate_3g_and_is_refused_5g(node):
    cluster, daemon = node
    r, sid, out = step(cluster, "--gres=shard:4", *WITH_ID, *burn_args("--alloc", "3G"))
    assert r.returncode == 0, (r.stdout, r.stderr)
    assert out["alloc"] == 3 * G and "error" not in out, out
    job = vgpu_job(daemon, sid)
    assert (job["mem_limit"], job["core"], job["slurm_shards"]) == (4 * G, 25, 4)
    # Released by the Epilog (which runs after srun has returned).
    wait_for(lambda: vgpu_job(daemon, sid)["state"] == "ended", 30, "the Epilog's release")

    r, sid, out = step(cluster, "--gres=shard:4", *WITH_ID, *burn_args("--alloc", "5G"))
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert out["error"] == "CUDA_ERROR_OUT_OF_MEMORY", out


def test_a_whole_gpu_of_shards_runs_twice_back_to_back(node):
    cluster, daemon = node
    for _ in range(2):
        r, sid, out = step(cluster, "--gres=shard:16", *WITH_ID,
                           *burn_args("--alloc", "15G"))
        assert r.returncode == 0, (r.stdout, r.stderr)
        assert "error" not in out, out
        assert vgpu_job(daemon, sid)["mem_limit"] == 16 * G


def test_a_batch_job_and_its_steps_are_one_vgpu_job(node, tmp_path):
    cluster, daemon = node
    burn = " ".join(burn_args("--alloc", "1G"))
    script = tmp_path / "job.sh"
    script.write_text(f"#!/bin/sh\n#SBATCH --gres=shard:2\n"
                      f"echo \"region=$VGPU_REGION\"\nsrun {burn}\nsrun {burn}\n{burn}\n")
    r = cluster.run("sbatch", "--parsable", "--wait", "-o", str(tmp_path / "out"), str(script))
    assert r.returncode == 0, r.stderr
    sid = r.stdout.strip().split(";")[0]
    out = (tmp_path / "out").read_text()
    assert out.count('"kernels": 20') == 3, out      # two steps and the batch step ran
    assert "region=/" in out, out                    # the batch step is fenced too
    job = vgpu_job(daemon, sid)
    assert job["slurm_partition"] == "debug" and job["mem_limit"] == 2 * G

    rows = [row for row in report(daemon) if row["slurm_job"] == sid]
    assert len(rows) == 1, rows
    assert rows[0]["job_id"] == job["id"] and rows[0]["partition"] == "debug"
    (row,) = [row for row in report(daemon, "--by", "slurm-job") if row["slurm_job"] == sid]
    assert row["jobs"] == 1


def test_8_and_4_shards_on_one_gpu_get_50_and_25_percent(node, tmp_path):
    cluster, daemon = node
    ids = {}
    try:
        # A job holding one whole GPU's shards puts the other two on the other GPU.
        ids["hold"] = sbatch(cluster, tmp_path, 16, "sleep 120")
        wait_for(lambda: cluster.job_state(ids["hold"]) == "RUNNING", 30, "the holder")
        for n in (8, 4):
            ids[n] = sbatch(cluster, tmp_path, n, 'echo "slurm_gpus=$SLURM_JOB_GPUS"; '
                            f"exec {BURN} --kernel-us 1000 --seconds 40",
                            env={"VGPU_SIM_TAG": f"shards{n}"})
        jobs = {n: wait_for(lambda n=n: running(daemon, ids[n]), 30, f"job {n} to run")
                for n in (8, 4)}
        assert jobs[8]["gpu"] == jobs[4]["gpu"] != vgpu_job(daemon, ids["hold"])["gpu"]
        # The GPU Slurm gave them (gres.conf's order) is the one they are fenced on.
        out = (tmp_path / f"slurm-{ids[8]}.out").read_text()
        assert f"slurm_gpus={jobs[8]['gpu']}" in out, out
        for n, want in ((8, 0.50), (4, 0.25)):
            wait_for(lambda n=n, want=want: abs(
                (daemon.job(jobs[n]["id"])["core_measured"] or 0) - want) < 0.03,
                30, f"the {n}-shard job to settle at its share")
        # Measured on the simulator's own timeline, not the daemon's figures.
        t0, busy0 = time.monotonic(), busy_by_tag(daemon.env)
        time.sleep(5.0)                      # the measurement window
        t1, busy1 = time.monotonic(), busy_by_tag(daemon.env)
    finally:
        for sid in ids.values():
            cluster.run("scancel", sid)
    shares = {n: 100 * (busy1[f"shards{n}"] - busy0[f"shards{n}"]) / (t1 - t0) for n in (8, 4)}
    print(f"shares on the simulator's timeline: {shares}")
    assert abs(shares[8] - 50) <= 3, shares
    assert abs(shares[4] - 25) <= 3, shares


def test_a_step_with_shards_on_both_gpus_gets_each_gpus_limit_and_share(node, tmp_path):
    """8 shards on GPU 0 and 4 on GPU 1 (as Slurm 23.11.2 reports them: see
    SCONTROL_SHIM in conftest.py): 8G and 50 % on GPU 0, 4G and 25 % on GPU
    1, one vgpu job with both GPUs and one report row. Each GPU's process
    keeps to that GPU's turn (docs/compute.md, jobs on several GPUs): 50 %
    on GPU 0 and 25 % on GPU 1, measured on the simulator's own timeline."""
    cluster, daemon = node
    ranks = (f"VGPU_SIM_TAG=spread0 {BURN} --device 0 --kernel-us 1000 --seconds 40 "
             "--alloc 7G & "
             f"VGPU_SIM_TAG=spread1 {BURN} --device 1 --kernel-us 1000 --seconds 40 "
             "--alloc 3G & wait")
    sid = sbatch(cluster, tmp_path, 12, ranks, name="spread-8-4")
    try:
        def both() -> dict[str, Any] | None:
            job = running(daemon, sid)
            return job if job and all(g["gated_launches"] for g in job["per_gpu"]) else None
        job = wait_for(both, 30, "the job to run on both GPUs")
        uuids = [g["uuid"] for g in daemon.call("ps")["gpus"]]
        assert job["gpu_uuids"] == uuids and job["slurm_shards"] == 12
        assert [(g["mem_limit"], g["core"]) for g in job["per_gpu"]] == [(8 * G, 50),
                                                                          (4 * G, 25)]
        wait_for(lambda: all(abs((g["core_measured"] or 0) - want) < 0.03
                             for g, want in zip(daemon.job(job["id"])["per_gpu"],
                                                (0.50, 0.25), strict=True)),
                 30, "each GPU to settle at its share")
        t0, busy0 = time.monotonic(), busy_by_tag(daemon.env)
        time.sleep(5.0)                      # the measurement window
        t1, busy1 = time.monotonic(), busy_by_tag(daemon.env)
        held = daemon.job(job["id"])["per_gpu"]
    finally:
        cluster.run("scancel", sid)
    shares = {i: 100 * (busy1[f"spread{i}"] - busy0[f"spread{i}"]) / (t1 - t0) for i in (0, 1)}
    print(f"shares on the simulator's timeline: {shares}")
    assert abs(shares[1] - 25) <= 3, shares
    assert abs(shares[0] - 50) <= 3, shares
    # each holds what it allocated, within its GPU's limit (context included)
    assert 7 * G < held[0]["mem_used"] <= 8 * G and 3 * G < held[1]["mem_used"] <= 4 * G, held
    wait_for(lambda: vgpu_job(daemon, sid)["state"] == "ended", 30, "the Epilog's release")
    rows = [r for r in report(daemon, "--by", "job") if r["slurm_job"] == sid]
    assert len(rows) == 1 and rows[0]["gpus"] == uuids, rows
    assert rows[0]["gpu_seconds"] > 0


def test_a_step_without_shards_is_untouched(node):
    cluster, daemon = node
    show = ["sh", "-c", 'echo "region=$VGPU_REGION preload=$LD_PRELOAD"']
    r = cluster.run("srun", *show, env={"LD_PRELOAD": ""})
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "region= preload=", r.stdout
    r = cluster.run("srun", "--gres=shard:1", *show, env={"LD_PRELOAD": ""})
    assert r.returncode == 0, r.stderr
    assert "region=/" in r.stdout and "libvgpu.so" in r.stdout, r.stdout


def test_a_misconfigured_shard_count_fails_the_step_not_the_node(node):
    cluster, daemon = node
    config = daemon.config.read_text()
    daemon.config.write_text(config.replace("reserve = 0", 'reserve = "1G"'))   # 15 shards
    try:
        daemon.call("reload")
        r = cluster.run("srun", "--gres=shard:16", "true")
    finally:
        daemon.config.write_text(config)
        daemon.call("reload")
    assert r.returncode == 6, r.stderr             # vgpuctl's "admission refused"
    # The TaskProlog's one line, on the step's output (where Slurm puts it).
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith("vgpuctl: error:")]
    assert len(lines) == 1, (r.stdout, r.stderr)
    assert "refused Slurm job" in lines[0] and "16 shards of 1G do not fit" in lines[0]
    # Not drained: the node takes the next job.
    wait_for(lambda: cluster.node_state() == "idle", 30, "the node to be idle, not drained")
    r, _, out = step(cluster, "--gres=shard:16", *WITH_ID, *burn_args())
    assert r.returncode == 0 and "error" not in out, (r.stdout, r.stderr)


def test_a_job_whose_epilog_never_came_is_released_when_slurm_no_longer_runs_it(node):
    cluster, daemon = node
    reply = daemon.call("slurm_register", slurm_job="4000000", uid=0, gpus=[1], shards=1)
    assert reply["job"]["slurm_job"] == "4000000"
    wait_for(lambda: not any(j["slurm_job"] == "4000000" for j in daemon.jobs()), 15,
             "reconciliation to release a Slurm job squeue does not know")


def test_a_users_job_is_registered_for_that_user(node):
    cluster, daemon = node
    why = usable_by("nobody")
    if why is not None:
        pytest.skip(why)
    r = cluster.run("runuser", "-u", "nobody", "--", "srun", "--gres=shard:2", *WITH_ID,
                    *burn_args("--alloc", "1G"), cwd="/")
    assert r.returncode == 0, (r.stdout, r.stderr)
    sid = next(ln.split("=", 1)[1] for ln in r.stdout.splitlines()
               if ln.startswith("slurm_job="))
    job = vgpu_job(daemon, sid)
    assert (job["user"], job["uid"], job["mem_limit"]) == ("nobody", 65534, 2 * G)


def test_a_restarted_daemon_keeps_a_running_slurm_job_and_its_release(node, tmp_path):
    cluster, daemon = node
    sid = sbatch(cluster, tmp_path, 3, "sleep 120")
    try:
        # restart once the batch step's TaskProlog has attached: one that
        # finds no daemon fails its step (fail closed), and the job with it
        wait_for(lambda: any(j["slurm_job"] == sid and j["pids"] for j in daemon.jobs()), 30,
                 "the batch step's attach")
        daemon.stop()
        daemon.start()
        job = vgpu_job(daemon, sid)
        assert (job["state"], job["mem_limit"]) == ("running", 3 * G)
    finally:
        cluster.run("scancel", sid)
    wait_for(lambda: vgpu_job(daemon, sid)["state"] == "ended", 30, "the Epilog's release")


def needs_spank(cluster: Any) -> None:
    if cluster.spank is None:
        pytest.skip("no SPANK plugin: slurm/spank.h missing (Debian: libslurm-dev)")


def test_vgpu_core_lowers_a_jobs_share_but_never_raises_it(node):
    cluster, daemon = node
    needs_spank(cluster)
    r, sid, _ = step(cluster, "--gres=shard:8", "--vgpu-core=20", "--vgpu-policy=soft",
                     *WITH_ID, "true")
    assert r.returncode == 0, r.stderr
    job = vgpu_job(daemon, sid)
    assert (job["core"], job["policy"], job["mem_limit"]) == (20, "soft", 8 * G)
    r, sid, _ = step(cluster, "--gres=shard:4", "--vgpu-core=80", *WITH_ID, "true")
    assert r.returncode == 0, r.stderr
    assert vgpu_job(daemon, sid)["core"] == 25            # its 4 shards' share at most


def test_a_batch_jobs_vgpu_core_holds_for_its_steps(node, tmp_path):
    cluster, daemon = node
    needs_spank(cluster)
    r = cluster.run("sbatch", "--parsable", "--wait", "--gres=shard:4", "--vgpu-core=10",
                    "-o", str(tmp_path / "out"), "--wrap", "srun true")
    assert r.returncode == 0, r.stderr
    assert vgpu_job(daemon, r.stdout.strip().split(";")[0])["core"] == 10


def test_bad_vgpu_options_are_refused_at_submission(node):
    cluster, daemon = node
    needs_spank(cluster)
    help_text = cluster.run("srun", "--help").stdout
    assert "--vgpu-core=PCT" in help_text and "--vgpu-policy=hard|soft" in help_text
    r = cluster.run("srun", "--gres=shard:1", "--vgpu-core=0", "true")
    assert r.returncode != 0 and "--vgpu-core must be 1 to 100" in r.stderr, r.stderr
    r = cluster.run("sbatch", "--vgpu-policy=fair", "--wrap", "true")
    assert r.returncode != 0 and "--vgpu-policy must be hard or soft" in r.stderr, r.stderr
    assert "--vgpu-priority=low|normal|high" in help_text
    r = cluster.run("srun", "--gres=shard:1", "--vgpu-priority=urgent", "true")
    assert r.returncode != 0 and "--vgpu-priority must be low, normal or high" in r.stderr


def test_vgpu_priority_sets_a_jobs_class(node):
    """A job's --vgpu-priority is its class; one of class low has no promise
    (its shards' share is a cap only)."""
    cluster, daemon = node
    needs_spank(cluster)
    r, sid, _ = step(cluster, "--gres=shard:4", "--vgpu-priority=low", *WITH_ID, "true")
    assert r.returncode == 0, r.stderr
    job = vgpu_job(daemon, sid)
    assert (job["priority"], job["promised"], job["core"]) == ("low", False, 25)
    r, sid, _ = step(cluster, "--gres=shard:4", *WITH_ID, "true")
    assert r.returncode == 0, r.stderr
    job = vgpu_job(daemon, sid)
    assert (job["priority"], job["promised"]) == ("normal", True)
