"""Slurm's tier: a private single-node cluster (tests/slurm/cluster.py) whose
Prolog, TaskProlog and Epilog are `vgpuctl slurm ...` against a private
daemon (tests/slurm/node.py), here over two simulated 16 GiB GPUs. The tests
skip only where Slurm (or root) is missing; the cluster and the daemon are
shared by a module's tests."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from slurm.cluster import Cluster, available
from slurm.node import slurm_node
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
    """(cluster, daemon) over two simulated 16 GiB GPUs of 16 shards each."""
    with slurm_node("2x16G", DAEMON_CONFIG) as n:
        yield n
