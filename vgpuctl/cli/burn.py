"""The ``vgpu-burn`` command: runs the compiled workload program."""

from __future__ import annotations

import os
import sys

from vgpuctl.errors import VgpuError
from vgpuctl.system import native, sim


def main() -> None:
    try:
        prog = str(native.burn_program())
        env = sim.child_env(dict(os.environ))
    except VgpuError as e:
        print(f"vgpu-burn: error: {e}", file=sys.stderr)
        sys.exit(e.exit_code)
    os.execve(prog, [prog, *sys.argv[1:]], env)
