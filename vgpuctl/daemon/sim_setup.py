"""What the daemon sets up for the GPUs it serves, simulated ones above all
(``VGPU_SIM``): what a CUDA context takes there, what a job needs to see the
same simulated GPUs, and the simulator's state file marked as the daemon's
(and, for a root daemon, opened to the node's users). On a real GPU only
the context's cost applies.
"""

from __future__ import annotations

import logging
import os
import stat
from typing import Any

from vgpuctl.core.placement import CONTEXT_MEM
from vgpuctl.system import native

log = logging.getLogger("vgpuctl.daemon")


def context_mem() -> int:
    """About what a CUDA context takes on this node's GPUs."""
    if not os.environ.get("VGPU_SIM"):
        return CONTEXT_MEM
    from vgpuctl.system import sim

    return sim.context_cost()


def job_env() -> tuple[dict[str, str], dict[str, str]]:
    """What a job needs to see the same (simulated) GPUs as the daemon: the
    variables to set, and the library dir to put first on LD_LIBRARY_PATH."""
    if not os.environ.get("VGPU_SIM"):
        return {}, {}
    from vgpuctl.system import sim, simstate

    sim.parse_spec(os.environ["VGPU_SIM"])
    # The daemon's state file by its path: a job of another user would
    # otherwise open a simulated GPU of its own (/dev/shm/vgpu-sim-<uid>).
    env = {"VGPU_SIM": os.environ["VGPU_SIM"], "VGPU_SIM_STATE": simstate.state_path()}
    if "VGPU_SIM_MIG" in os.environ:         # the MIG layout it was made with
        env["VGPU_SIM_MIG"] = os.environ["VGPU_SIM_MIG"]
    return env, {"LD_LIBRARY_PATH": str(native.sim_libdir())}


def mark_state() -> Any:
    """Mark the simulated GPU's state as read by a daemon, so that `vgpuctl
    sim reset` refuses to delete it under us; None on a real GPU."""
    if not os.environ.get("VGPU_SIM"):
        return None
    from vgpuctl.system import simstate

    try:
        mark = simstate.DaemonMark()
    except OSError as e:
        log.warning("cannot mark the simulated GPU's state %s (%s): `vgpuctl sim reset` "
                    "could delete it under the daemon", simstate.state_path(), e.strerror)
        return None
    if os.geteuid() == 0:
        _share_state(mark)
    return mark


def _share_state(mark: Any) -> None:
    """A root daemon's simulated GPU is the node's: every user's job opens
    its state file, as every user opens /dev/nvidia* (mode 0666)."""
    try:
        st = os.fstat(mark.fd)
        if st.st_uid == 0 and stat.S_IMODE(st.st_mode) != 0o666:
            os.chmod(mark.path, 0o666)
    except OSError as e:
        log.warning("cannot open the simulated GPU's state %s to the node's users (%s): "
                    "their jobs will see no GPU", mark.path, e.strerror)
