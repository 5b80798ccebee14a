"""Asking Slurm's controller: ``scontrol show job -d`` for a Prolog (its
environment has no shard count) and ``squeue`` for the daemon's
reconciliation. The text each prints is parsed by vgpuctl.core.slurm_text."""

from __future__ import annotations

import os
import shutil
import subprocess

from vgpuctl.core.slurm_text import parse_squeue
from vgpuctl.errors import MissingComponent, StateError, VgpuError

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


def build_spank(output: str, cc: str = "gcc", include_dirs: list[str] | None = None) -> None:
    """Compile the SPANK plugin into output (written beside it, then renamed)."""
    from vgpuctl.system.native import spank_source

    src = spank_source()
    cmd = [_command(cc), "-shared", "-fPIC", "-O2", "-Wall", "-Wextra",
           *[f"-I{d}" for d in include_dirs or []]]
    tmp = f"{output}.tmp{os.getpid()}"
    try:
        r = subprocess.run([*cmd, "-o", tmp, str(src)], capture_output=True, text=True,
                           timeout=120, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        raise VgpuError(f"{cc} took over 120 s to build the SPANK plugin") from None
    if r.returncode != 0:
        if os.path.exists(tmp):
            os.unlink(tmp)
        if "spank.h" in r.stderr:
            raise MissingComponent("slurm/spank.h not found: install Slurm's headers "
                                   "(Debian: libslurm-dev) or give --include DIR")
        lines = r.stderr.strip().splitlines() or [f"exit status {r.returncode}"]
        raise VgpuError(f"building the SPANK plugin failed: {lines[0]}")
    try:
        os.replace(tmp, output)
    except OSError as e:
        os.unlink(tmp)
        raise StateError(f"can't write {output}: {e.strerror or e}") from None
