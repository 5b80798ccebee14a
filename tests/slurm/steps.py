"""What the Slurm tier's tests run on the cluster: srun and sbatch steps,
and the vgpu job the daemon has for a Slurm job."""

from __future__ import annotations

import json
import subprocess
from typing import Any

from vgpuctl.system import native

G = 1 << 30
BURN = str(native.burn_program())
# Prints the Slurm job id, then runs the command (the step's own process).
WITH_ID = ["sh", "-c", 'echo "slurm_job=$SLURM_JOB_ID"; exec "$@"', "sh"]


def burn_args(*extra: str) -> list[str]:
    return [BURN, "--kernel-us", "100", "--count", "20", *extra]


def step(cluster: Any, *argv: str, env: dict[str, str] | None = None
         ) -> tuple[subprocess.CompletedProcess[str], str, dict[str, Any]]:
    """srun argv; (the finished srun, the Slurm job id, burn's JSON line)."""
    r = cluster.run("srun", *argv, env=env)
    sid = next((ln.split("=", 1)[1] for ln in r.stdout.splitlines()
                if ln.startswith("slurm_job=")), "")
    js = [ln for ln in r.stdout.splitlines() if ln.startswith("{")]
    return r, sid, (json.loads(js[-1]) if js else {})


def vgpu_job(daemon: Any, slurm_job: str) -> dict[str, Any]:
    """The one vgpu job (live or ended) registered for a Slurm job."""
    jobs = [j for j in daemon.jobs(all_jobs=True) if j["slurm_job"] == slurm_job]
    assert len(jobs) == 1, jobs
    return jobs[0]


def sbatch(cluster: Any, tmp_path: Any, shards: int | str, command: str,
           env: dict[str, str] | None = None, name: str | None = None) -> str:
    r = cluster.run("sbatch", "--parsable", f"--gres=shard:{shards}", "-o",
                    str(tmp_path / "slurm-%j.out"), *(["-J", name] if name else []),
                    "--wrap", command, env=env)
    assert r.returncode == 0, r.stderr
    return r.stdout.strip().split(";")[0]


def running(daemon: Any, slurm_job: str) -> dict[str, Any] | None:
    """The live vgpu job of a Slurm job once a process of it holds the GPU."""
    return next((j for j in daemon.jobs() if j["slurm_job"] == slurm_job and j["pids"]
                 and j["gated_launches"]), None)
