"""Shared by the job programs (job_*.py): the programs the proof steps run
inside `vgpuctl run`, or bare for a baseline. They print one JSON line on
stdout as their last line; on a failure that line has "error".

Kept free of vgpuctl imports: a job program is a user's program.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any, NoReturn

# The spin kernel vgpu-burn embeds (libvgpu/tools/vgpu_burn.c), byte for byte.
SPIN_PTX = b"""\
.version 7.0
.target sm_50
.address_size 64

.visible .entry vgpu_spin(
    .param .u64 vgpu_spin_ns
)
{
    .reg .pred %p<2>;
    .reg .b64 %rd<5>;

    ld.param.u64 %rd1, [vgpu_spin_ns];
    mov.u64 %rd2, %globaltimer;
$L_spin:
    mov.u64 %rd3, %globaltimer;
    sub.s64 %rd4, %rd3, %rd2;
    setp.lt.u64 %p1, %rd4, %rd1;
    @%p1 bra $L_spin;
    ret;
}
"""


def emit(obj: dict[str, Any]) -> None:
    obj.setdefault("pid", os.getpid())
    sys.stdout.write(json.dumps(obj, default=str) + "\n")
    sys.stdout.flush()


def fail(msg: str, code: int = 3, **extra: Any) -> NoReturn:
    emit({"error": msg, **extra})
    sys.exit(code)


def cuda_driver() -> Any:
    """NVIDIA's driver-API bindings; else one JSON error line and exit 3."""
    try:
        from cuda.bindings import driver as cu
    except ImportError:
        try:
            from cuda import cuda as cu  # cuda-python before 12.6
        except ImportError:
            fail("cuda-bindings not installed")
    return cu


def torch_cuda() -> Any:
    """torch, with a GPU it can use; else one JSON error line and exit 3."""
    try:
        import torch
    except ImportError:
        fail("torch not installed")
    if not torch.cuda.is_available():
        fail("torch sees no GPU", torch=torch.__version__)
    return torch


def add_barrier_args(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--barrier", help="folder: write ready-NAME when warmed up, "
                    "then wait for the file go")
    ap.add_argument("--name", default="job")


def wait_barrier(args: argparse.Namespace, timeout: float = 300.0) -> float:
    """Tell the harness this job is ready and wait for its go; returns the
    wall-clock time of the go (now, without a barrier)."""
    if not args.barrier:
        return time.time()
    d = Path(args.barrier)
    (d / f"ready-{args.name}").write_text(str(os.getpid()))
    deadline = time.monotonic() + timeout
    go = d / "go"
    while not go.exists():
        if time.monotonic() > deadline:
            fail(f"no go within {timeout:g} s")
        time.sleep(0.01)
    return time.time()


class Ring:
    """At most `depth` steps queued on the GPU: before a new step, wait for
    the one `depth` steps back. Keeps the host close to the device, so a
    rate over a window counts work done, not work queued."""

    def __init__(self, torch: Any, depth: int = 4) -> None:
        self.torch = torch
        self.events = [torch.cuda.Event() for _ in range(depth)]
        self.n = 0          # steps issued

    def issue(self, step: Any) -> None:
        slot = self.n % len(self.events)
        if self.n >= len(self.events):
            self.events[slot].synchronize()
        step()
        self.events[slot].record()
        self.n += 1

    def completed(self) -> int:
        """Steps known done (a lower bound, no wait)."""
        return max(0, self.n - len(self.events))
