"""The ``vgpu-burn`` command: runs the compiled workload program.

Its own edge, as a program of its own: a VgpuError becomes one line on
stderr, formatted as vgpuctl's are (vgpuctl.cli.messages), and its exit
status; then the compiled program replaces this process.
"""

from __future__ import annotations

import os
import sys

from vgpuctl.cli import messages
from vgpuctl.errors import VgpuError
from vgpuctl.system import native, sim


def main() -> None:
    try:
        prog = str(native.burn_program())
        env = sim.child_env(dict(os.environ))
    except VgpuError as e:
        messages.error(str(e), prog="vgpu-burn")
        sys.exit(e.exit_code)
    os.execve(prog, [prog, *sys.argv[1:]], env)
