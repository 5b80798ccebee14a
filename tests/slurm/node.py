"""A Slurm node for a module's tests: a private daemon over simulated GPUs,
gres.conf from its `vgpuctl slurm gres-conf`, and the cluster
(tests/slurm/cluster.py) whose hooks are `vgpuctl slurm ...` against it."""

from __future__ import annotations

import os
import shutil
import signal
import sys
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from slurm.cluster import Cluster
from support.daemon import Daemon

# Debian's Slurm 22.05 can't give a job shards on two GPUs (such a job pends
# forever; 23.11 allows it with MULTIPLE_SHARING_GRES_PJ, and 23.11.2 writes
# each GPU's count in `scontrol show job -d`). The Prolog's scontrol is this
# one: Slurm's own answer, except that for a job named spread-A-B (its
# shards: A+B, on one GPU) the node's GRES reads as 23.11.2 writes A shards
# on GPU 0 and B on GPU 1. Every other job's answer is Slurm's, untouched.
SCONTROL_SHIM = """\
#!{python}
import re, subprocess, sys
r = subprocess.run(["{real}", *sys.argv[1:]], capture_output=True, text=True)
out = r.stdout
m = re.search(r"JobName=spread-(\\d+)-(\\d+)\\b", out)
if m and sys.argv[1:3] == ["show", "job"]:
    a, b = int(m[1]), int(m[2])
    out = re.sub(r"GRES=shard:\\d+\\(IDX:[^)]*\\)",
                 f"GRES=shard:{{a + b}}({{a}}/{shards},{{b}}/{shards})", out)
sys.stdout.write(out)
sys.stderr.write(r.stderr)
sys.exit(r.returncode)
"""


@contextmanager
def slurm_node(gpus: str, config: str, sim_env: dict[str, str] | None = None,
               gres_args: Callable[[Path, Daemon], list[str]] | None = None,
               ) -> Iterator[tuple[Cluster, Daemon]]:
    """(cluster, daemon): the daemon running over the simulated ``gpus``
    (with ``sim_env``: VGPU_SIM_MIG...), gres.conf written by `vgpuctl slurm
    gres-conf` from it (with the arguments gres_args(base, daemon) gives),
    the cluster up."""
    base = Path(tempfile.mkdtemp(prefix="vgpu-slurm-", dir="/tmp"))
    os.chmod(base, 0o755)
    (base / "vgpu").mkdir(mode=0o755)
    daemon = Daemon(base / "vgpu", gpus, config)
    daemon.env.update(sim_env or {})
    spank = base / "spank_vgpu.so"
    built = daemon.cli("slurm", "build-spank", "-o", str(spank))
    if built.returncode != 0 and os.environ.get("VGPU_REQUIRE_SLURM"):
        raise AssertionError(f"the SPANK plugin did not build: {built.stderr}")
    shim = base / "bin"
    shim.mkdir(mode=0o755)
    (shim / "scontrol").write_text(SCONTROL_SHIM.format(
        python=sys.executable, real=shutil.which("scontrol"), shards=16))
    (shim / "scontrol").chmod(0o755)
    cluster = Cluster(base / "slurm", {"VGPU_SOCKET": str(daemon.socket),
                                       "PATH": f"{shim}:/usr/local/bin:/usr/bin:/bin"},
                      spank=spank if built.returncode == 0 else None)
    daemon.env["SLURM_CONF"] = str(cluster.conf)    # for its squeue
    try:
        daemon.start()
        # Every user's jobs share the one simulated GPU, as they share a
        # real one (the simulator creates it 0666 less the umask).
        os.chmod(daemon.env["VGPU_SIM_STATE"], 0o666)
        gres = daemon.cli("slurm", "gres-conf", "--dev-dir", str(base / "slurm" / "dev"),
                          *(gres_args(base, daemon) if gres_args else []))
        assert gres.returncode == 0, gres.stderr
        cluster.write_config(gres.stdout)
        cluster.start()
        yield cluster, daemon
    finally:
        cluster.stop()
        if daemon.proc is not None:
            daemon.cleanup_jobs()
            daemon.stop(signal.SIGKILL)
        if os.environ.get("VGPU_KEEP_SLURM") is None:
            shutil.rmtree(base, ignore_errors=True)
