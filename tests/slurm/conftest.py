"""Slurm's tier: a private single-node cluster (tests/slurm/cluster.py) whose
Prolog, TaskProlog and Epilog are `vgpuctl slurm ...` against a private
daemon over two simulated 16 GiB GPUs. The tests skip only where Slurm (or
root) is missing; the cluster and the daemon are shared by a module's tests."""

from __future__ import annotations

import os
import shutil
import signal
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from slurm.cluster import Cluster, available
from support.daemon import Daemon, native_built

# 16 shards of 1 GiB per 16 GiB GPU (no reserve): 8 shards are half a GPU.
DAEMON_CONFIG = """\
reserve = 0
[slurm]
gpus = "all"
shard_size = "1G"
reconcile_s = 1
"""

_why = available()

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


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = Path(__file__).resolve().parent
    if _why is not None and os.environ.get("VGPU_REQUIRE_SLURM"):    # CI: no skipping
        pytest.exit(f"VGPU_REQUIRE_SLURM is set but {_why}", returncode=1)
    for item in items:
        if here in Path(str(item.fspath)).resolve().parents:
            if _why is not None:
                item.add_marker(pytest.mark.skip(reason=_why))
            elif not native_built():
                item.add_marker(pytest.mark.skip(reason="native parts not built"))


@pytest.fixture(scope="module")
def node() -> Iterator[tuple[Cluster, Daemon]]:
    """(cluster, daemon): the daemon running, gres.conf written by `vgpuctl
    slurm gres-conf` from it, the cluster up."""
    base = Path(tempfile.mkdtemp(prefix="vgpu-slurm-", dir="/tmp"))
    os.chmod(base, 0o755)
    (base / "vgpu").mkdir(mode=0o755)
    daemon = Daemon(base / "vgpu", "2x16G", DAEMON_CONFIG)
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
        gres = daemon.cli("slurm", "gres-conf", "--dev-dir", str(base / "slurm" / "dev"))
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
