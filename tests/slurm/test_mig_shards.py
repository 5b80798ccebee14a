"""Slurm's --gres=shard jobs on MIG devices, on the real single-node cluster:
two simulated 80 GiB GPUs, GPU 0 in MIG mode with a 1g.10gb (slice 0) and a
3g.40gb (slice 4), GPU 1 whole; gres.conf from `vgpuctl slurm gres-conf
--type h100` with a mig-minors file written here, as the driver writes it.
Slurm's GPUs are then the 1g.10gb, the 3g.40gb and GPU 1, of 10, 40 and 80
shards of 1 GiB, and a typed request (`--gres=shard:h100_3g.40gb:4`) picks
the device."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from slurm.cluster import Cluster
from slurm.node import slurm_node
from slurm.steps import BURN, G, burn_args, running, sbatch, vgpu_job
from support.daemon import Daemon, wait_for

CONFIG = """\
reserve = 0
[slurm]
gpus = "all"
shard_size = "1G"
reconcile_s = 1
"""
MIG = {"VGPU_SIM_MIG": "0=1g.10gb@0,3g.40gb@4"}


def mig_minors(base: Path, daemon: Daemon) -> list[str]:
    """The driver's mig-minors for the daemon's MIG devices (GPU 0's minor
    is 0 on the simulator), minors 100 and up as a driver numbers them."""
    lines = []
    for g in daemon.call("ps")["gpus"]:
        if g["parent"] is not None:
            at = f"gpu{g['minor']}/gi{g['gi']}"
            lines += [f"{at}/access {100 + 10 * g['gi']}",
                      f"{at}/ci{g['ci']}/access {101 + 10 * g['gi'] + g['ci']}"]
    path = base / "mig-minors"
    path.write_text("config 1\nmonitor 2\n" + "\n".join(lines) + "\n")
    return ["--type", "h100", "--mig-minors", str(path)]


@pytest.fixture(scope="module")
def mig_node() -> Iterator[tuple[Cluster, Daemon]]:
    with slurm_node("2x80G", CONFIG, MIG, mig_minors) as n:
        yield n


def devices(daemon: Daemon) -> dict[str, dict[str, Any]]:
    """The daemon's GPUs by profile ("whole" for GPU 1)."""
    return {g["mig"] or "whole": g for g in daemon.call("ps")["gpus"]}


def test_slurm_takes_a_gpu_and_a_shard_line_per_mig_device(mig_node):
    cluster, daemon = mig_node
    r = cluster.run("scontrol", "show", "node", cluster.node)
    gres = re.search(r"\bGres=(\S+)", r.stdout)
    # each device's shards, typed as its gpu line (slurm.conf says shard:130)
    assert gres is not None and gres.group(1) == (
        "gpu:h100_1g.10gb:1,gpu:h100_3g.40gb:1,gpu:h100:1,"
        "shard:h100_1g.10gb:10,shard:h100_3g.40gb:40,shard:h100:80"), r.stdout
    assert cluster.node_state() == "idle"
    conf = (cluster.base / "etc" / "gres.conf").read_text()
    assert "Name=shard Count=40 File=" in conf and "nvidia-caps/nvidia-cap" in conf, conf


def batch(cluster: Cluster, tmp_path: Path, gres: str, command: str
          ) -> tuple[int, str, str, dict[str, Any]]:
    """A batch job of shards ``gres`` (typed: Slurm 22.05 makes no srun step
    of a typed shard request, see docs/slurm.md) that prints what its GPU
    is and runs ``command``, waited for: (its exit status, Slurm job id,
    what it saw as CUDA_VISIBLE_DEVICES, burn's JSON line)."""
    out = tmp_path / "batch.out"
    r = cluster.run("sbatch", "--parsable", "--wait", f"--gres=shard:{gres}", "-o", str(out),
                    "--wrap", f'echo "visible=$CUDA_VISIBLE_DEVICES"; exec {command}')
    text = out.read_text()
    visible = re.search(r"^visible=(\S*)$", text, re.M)
    js = [ln for ln in text.splitlines() if ln.startswith("{")]
    return (r.returncode, r.stdout.strip().split(";")[0], visible.group(1) if visible else "",
            json.loads(js[-1]) if js else {})


def test_a_shard_job_on_a_mig_device_is_fenced_there(mig_node, tmp_path):
    """4 of the 3g.40gb's 40 shards: that MIG device alone, 4G and 10 %,
    shown by `vgpuctl ps --json` on it while it runs; 5G is refused."""
    cluster, daemon = mig_node
    big = devices(daemon)["3g.40gb"]
    sid = sbatch(cluster, tmp_path, "h100_3g.40gb:4",
                 'echo "visible=$CUDA_VISIBLE_DEVICES"; '
                 f"exec {BURN} --kernel-us 1000 --seconds 60 --alloc 3G")
    try:
        job = wait_for(lambda: running(daemon, sid), 30, "the job to run on the MIG device")
        ps = daemon.cli("ps", "--json")
        assert ps.returncode == 0, ps.stderr
        (shown,) = [j for j in json.loads(ps.stdout)["jobs"] if j["slurm_job"] == sid]
        assert (shown["gpu"], shown["gpu_uuids"], shown["mem_limit"], shown["core"],
                shown["slurm_shards"]) == (big["index"], [big["uuid"]], 4 * G, 10, 4), shown
        assert 3 * G < shown["mem_used"] <= 4 * G, shown
        assert job["id"] == shown["id"]
        out = (tmp_path / f"slurm-{sid}.out").read_text()
        assert f"visible={big['uuid']}" in out, out
    finally:
        cluster.run("scancel", sid)
    wait_for(lambda: vgpu_job(daemon, sid)["state"] == "ended", 30, "the Epilog's release")

    # past the limit: the allocation fails, on the MIG device
    rc, sid, visible, out = batch(cluster, tmp_path, "h100_3g.40gb:4",
                                  " ".join(burn_args("--alloc", "5G")))
    assert (rc, visible, out.get("error")) == (2, big["uuid"], "CUDA_ERROR_OUT_OF_MEMORY"), out
    assert vgpu_job(daemon, sid)["gpu_uuids"] == [big["uuid"]]


def test_each_of_slurms_gpus_is_the_device_gres_conf_names(mig_node, tmp_path):
    """Slurm's GPU 0, 1 and 2 (the 1g.10gb, the 3g.40gb, GPU 1): a job's
    shards become that device's limit and its share of that device."""
    cluster, daemon = mig_node
    dev = devices(daemon)
    for gres, where, limit, core in (("h100_1g.10gb:5", "1g.10gb", 5 * G, 50),
                                      ("h100_3g.40gb:20", "3g.40gb", 20 * G, 50),
                                      ("h100:8", "whole", 8 * G, 10)):
        rc, sid, visible, out = batch(cluster, tmp_path, gres, " ".join(
            burn_args("--alloc", f"{limit // G - 1}G")))
        assert (rc, visible) == (0, dev[where]["uuid"]) and "error" not in out, (gres, out)
        job = vgpu_job(daemon, sid)
        assert (job["gpu_uuids"], job["mem_limit"], job["core"]) == (
            [dev[where]["uuid"]], limit, core), (gres, job)
