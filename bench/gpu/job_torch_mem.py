"""Job program: what PyTorch sees of the GPU's memory, and where it stops.

    python3 job_torch_mem.py [--chunk-mib 256] [--max-gib 200]

1. `torch.cuda.mem_get_info()` (free, total): under `vgpuctl run --mem 4G`
   total must be 4 GiB.
2. Allocates chunks until an allocation fails; reports how much fitted and
   the exception's type (must be torch.OutOfMemoryError).
3. Frees them, then asks for one block larger than the total (must fail the
   same way), then checks the process still computes correctly.

Set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True for the cuMemCreate
path. Prints one JSON line.
"""

from __future__ import annotations

import argparse
import os

import job_util

GiB = 1 << 30
MiB = 1 << 20


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--chunk-mib", type=int, default=256)
    ap.add_argument("--max-gib", type=float, default=200.0,
                    help="stop allocating here even without a failure")
    args = ap.parse_args()
    torch = job_util.torch_cuda()
    oom_cls = getattr(torch, "OutOfMemoryError", None) or torch.cuda.OutOfMemoryError

    free0, total = torch.cuda.mem_get_info()
    chunk = args.chunk_mib * MiB
    chunks = []
    allocated = 0
    exc: BaseException | None = None
    try:
        while allocated + chunk <= args.max_gib * GiB:
            chunks.append(torch.empty(chunk, dtype=torch.uint8, device="cuda"))
            allocated += chunk
    except Exception as e:  # noqa: BLE001 - its type is the finding
        exc = e
    free_full, _ = torch.cuda.mem_get_info()
    reserved_full = torch.cuda.memory_reserved()
    chunks.clear()
    torch.cuda.empty_cache()
    free_after, _ = torch.cuda.mem_get_info()

    big = int(total) + GiB
    big_exc: BaseException | None = None
    try:
        t = torch.empty(big, dtype=torch.uint8, device="cuda")
        del t
    except Exception as e:  # noqa: BLE001
        big_exc = e
    torch.cuda.empty_cache()

    x = torch.ones(1 << 24, device="cuda")
    still_works = float(x.sum().item()) == float(1 << 24)

    def kind(e: BaseException | None) -> str | None:
        return None if e is None else f"{type(e).__module__}.{type(e).__qualname__}"

    job_util.emit({
        "torch": torch.__version__,
        "alloc_conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF", ""),
        "total": int(total),
        "free_before": int(free0),
        "chunk": chunk,
        "allocated_before_failure": allocated,
        "failure": kind(exc),
        "failure_is_torch_oom": isinstance(exc, oom_cls),
        "failure_message": None if exc is None else str(exc)[:400],
        "free_when_full": int(free_full),
        "reserved_when_full": int(reserved_full),
        "free_after_release": int(free_after),
        "big_request": big,
        "big_failure": kind(big_exc),
        "big_failure_is_torch_oom": isinstance(big_exc, oom_cls),
        "still_works": still_works,
        "vgpu_region": os.environ.get("VGPU_REGION"),
    })


if __name__ == "__main__":
    main()
