"""Asking Slurm's controller: ``scontrol show job -d`` for a Prolog (its
environment has no shard count) and ``squeue`` for the daemon's
reconciliation. The text each prints is parsed by vgpuctl.core.slurm."""

from __future__ import annotations

import shutil
import subprocess

from vgpuctl.core.slurm import parse_squeue
from vgpuctl.errors import MissingComponent, VgpuError

TIMEOUT_S = 30.0
# A Prolog or daemon may run with no PATH at all.
PATH = "/usr/local/bin:/usr/bin:/bin"


def _command(name: str) -> str:
    exe = shutil.which(name) or shutil.which(name, path=PATH)
    if exe is None:
        raise MissingComponent(f"{name} not found: is Slurm installed here?")
    return exe


def show_job(job_id: str) -> str:
    """``scontrol show job -d JOB_ID``'s text; VgpuError with scontrol's
    own line when it fails."""
    try:
        r = subprocess.run([_command("scontrol"), "show", "job", "-d", job_id],
                           capture_output=True, text=True, timeout=TIMEOUT_S,
                           stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        raise VgpuError(f"scontrol show job {job_id}: no answer in {TIMEOUT_S:.0f} s") from None
    if r.returncode != 0:
        why = (r.stderr.strip().splitlines() or [f"exit status {r.returncode}"])[-1]
        raise VgpuError(f"scontrol show job {job_id}: {why}")
    return r.stdout


def job_states() -> dict[str, str] | None:
    """Every job the controller knows (ended ones too, for MinJobAge) ->
    its state; None when it can't be asked (no squeue, no answer)."""
    try:
        r = subprocess.run([_command("squeue"), "-h", "--states=all", "-o", "%A %T"],
                           capture_output=True, text=True, timeout=TIMEOUT_S,
                           stdin=subprocess.DEVNULL)
    except (MissingComponent, subprocess.TimeoutExpired, OSError):
        return None
    if r.returncode != 0:
        return None
    return parse_squeue(r.stdout)
