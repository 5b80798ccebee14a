"""Fixtures every part of the suite may use. Keep this file small and general:
an area's own fixtures live in its own module and are imported at the end.

The simulated GPU: `sim_env` is an environment for subprocesses that puts
them on a private simulated GPU (2x16G, state file under tmp_path, the
simulator's libraries first on LD_LIBRARY_PATH). A process loads one
libcuda.so.1 for life, so anything that talks to the (simulated) driver runs
in a subprocess with that environment.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from vgpuctl.system import native

# A suite started in the background of a non-interactive shell (`cmd &`)
# inherits SIGINT and SIGQUIT ignored, and so would every command it starts:
# the tests that stand for a Ctrl-C (top, --loop, the demo) would find it
# ignored, as it should be under nohup. A handler of our own here is reset
# to the default in each child at exec.
for _sig in (signal.SIGINT, signal.SIGQUIT):
    if signal.getsignal(_sig) is signal.SIG_IGN:
        signal.signal(_sig, signal.default_int_handler)


# The tiers (README.md, "Run the tests"). `pytest -q` runs the quick one,
# the README's command: under 5 minutes on 2 cores. The others are CI steps
# of their own: `-m slow` (the attacks, the acceptance runs, the driver's
# checkpoint and NVML in depth), `-m frameworks` (PyTorch, CuPy and the
# model zoo, once torch is installed), `-m slurm` (a private Slurm cluster);
# `-m ""` runs everything. A file or directory here is marked whole.
TIERS: dict[str, tuple[str, ...]] = {
    "slow": ("acceptance/", "hostile/", "sim/test_checkpoint.py", "sim/test_nvml.py",
             "daemon/test_suspend.py", "daemon/test_one_process_nvml.py"),
    "frameworks": ("frameworks/",),
    "slurm": ("slurm/",),
}
_HERE = Path(__file__).resolve().parent


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        rel = Path(str(item.fspath)).resolve().relative_to(_HERE).as_posix()
        for tier, paths in TIERS.items():
            if any(rel == p or (p.endswith("/") and rel.startswith(p)) for p in paths):
                item.add_marker(getattr(pytest.mark, tier))


@pytest.fixture(scope="session")
def sim_libdir() -> Path:
    """The folder of the simulated libcuda.so.1 and libnvidia-ml.so.1."""
    return native.sim_libdir()


@pytest.fixture(scope="session")
def burn_program() -> Path:
    """The compiled vgpu-burn."""
    return native.burn_program()


@pytest.fixture
def sim_env(tmp_path: Path, sim_libdir: Path) -> dict[str, str]:
    """os.environ for a subprocess on its own simulated GPU: VGPU_SIM=2x16G,
    VGPU_SIM_STATE in tmp_path, the simulator first on LD_LIBRARY_PATH, and no
    VGPU_ setting or preload inherited from the caller. Change VGPU_SIM in the
    returned dict before the first process starts to get another size."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("VGPU_") and k not in ("LD_PRELOAD", "CUDA_VISIBLE_DEVICES")}
    old = [p for p in env.get("LD_LIBRARY_PATH", "").split(":") if p]
    env.update({
        "VGPU_SIM": "2x16G",
        "VGPU_SIM_STATE": str(tmp_path / "sim-state"),
        "LD_LIBRARY_PATH": ":".join([str(sim_libdir), *old]),
    })
    return env

def _own_segments() -> set[int]:
    """The System V segments this test process created (job regions it
    made; removing one that is still attached marks it, and it goes with
    its last user)."""
    me = os.getpid()
    out = set()
    try:
        with open("/proc/sysvipc/shm") as f:
            next(f)
            for line in f:
                col = line.split()
                if int(col[4]) == me:
                    out.add(int(col[1]))
    except OSError:
        pass
    return out


@pytest.fixture(autouse=True)
def _regions_removed():
    """A region's shared memory outlives every process: remove what a test
    made in this process and left behind (daemons' are removed by the
    daemon fixtures)."""
    yield
    from vgpuctl.system.shm import shm_remove

    for sid in _own_segments():
        shm_remove(sid)


# The daemon fixtures (`daemon`, `daemon_factory`): a real `vgpuctl daemon` on
# the simulated GPU in a private directory; see tests/support/daemon.py.
from support.daemon import daemon, daemon_factory  # noqa: E402,F401
