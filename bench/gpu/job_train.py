"""Job program: a small transformer's training loop on random data, timed.

    python3 job_train.py [--steps 500] [--warmup 30] [--d-model 512]
                         [--layers 6] [--heads 8] [--batch 32] [--seq 256]

A torch.nn.TransformerEncoder (bf16 autocast, AdamW) on one fixed random
batch, seeded, so every run does the same work. Times `--steps` steps after
`--warmup` (synchronised at both ends). Prints one JSON line: seconds,
steps_per_s, ms_per_step, the final loss.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import job_util


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=500)
    ap.add_argument("--warmup", type=int, default=30)
    ap.add_argument("--d-model", type=int, default=512)
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    torch = job_util.torch_cuda()
    nn = torch.nn
    torch.manual_seed(args.seed)
    d = args.d_model
    layer = nn.TransformerEncoderLayer(d, args.heads, dim_feedforward=4 * d, dropout=0.0,
                                       batch_first=True)
    model = nn.TransformerEncoder(layer, args.layers, enable_nested_tensor=False).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    g = torch.Generator(device="cuda").manual_seed(args.seed)
    x = torch.randn(args.batch, args.seq, d, device="cuda", generator=g)
    y = torch.randn(args.batch, args.seq, d, device="cuda", generator=g)

    def step() -> Any:
        with torch.autocast("cuda", dtype=torch.bfloat16):
            out = model(x)
        loss = torch.nn.functional.mse_loss(out.float(), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        return loss

    for _ in range(args.warmup):
        step()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(args.steps):
        loss = step()
    torch.cuda.synchronize()
    dt = time.perf_counter() - t0
    job_util.emit({
        "torch": torch.__version__, "steps": args.steps, "seconds": dt,
        "steps_per_s": args.steps / dt, "ms_per_step": dt / args.steps * 1e3,
        "loss": float(loss.item()), "params": sum(p.numel() for p in model.parameters()),
        "shape": [args.batch, args.seq, d], "layers": args.layers,
    })


if __name__ == "__main__":
    main()
