"""PyTorch on the simulated GPU: what vgpuctl costs a training step, and how
well it holds two training loops to their shares.

  1  time per training step of a small CNN (two convolutions and a linear
     layer, SGD), bare and under ``vgpuctl run --core 100``: the CPU-side
     overhead of the hook and the simulator. Kernels take the simulator's
     default time, so the step is bound by the host, and a host's noise is
     of the order of the overhead: ``--pairs`` (20) interleaved pairs of runs
     (bare then gated, gated then bare, in turn), the median of their ratios
     and its 95 % confidence interval (distribution-free, from the order
     statistics). One unpaired run says nothing: three back-to-back ones on
     a 2-core host gave +2.4 %, -6.4 % and +2.9 %.
  2  two training loops at ``--core 30`` and ``--core 60`` (hard) on one GPU,
     each share measured from the simulator's own timeline (busy time per
     ``VGPU_SIM_TAG``) over ``--seconds`` (10) after ``--settle`` (5) seconds.
     Kernels take 50 us per wave of blocks (``VGPU_SIM_NS_PER_BLOCK``), so
     each loop alone would keep the GPU busy: the share is the turns'.
  3  the same with two different programs: the small CNN at 30 and
     torchvision's ResNet-18 (built from its configuration, random weights,
     nothing downloaded) at 60.

  4  the control: each program's loop alone, ungated, at those kernel
     lengths: how busy it keeps the GPU by itself (``--only alone``; also
     run with ``shares`` and ``programs``).

``--settle 0`` measures from the moment both loops are set up (their first
seconds included).

Prints a table and writes bench/results/frameworks.json. Not part of the test
suite's pass/fail (tests/frameworks checks the shares within 3 points).
Needs torch (``.ci/run`` installs the pinned version).

    python bench/frameworks.py [--seconds 10] [--settle 5] [--steps-s 3] [--pairs 20]
    python bench/frameworks.py --loop SECONDS [--model cnn|resnet18]   # a loop itself
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

from share_accuracy import VGPUCTL, DaemonHarness, DeviceRecord, JobSpec, Running  # noqa: E402

from vgpuctl.system import sim  # noqa: E402

SIM_SPEC = "1x16G"
SHARE_NS_PER_BLOCK = "50000"   # GPU-bound loops for the share runs
SHARES = (("t30", 30), ("t60", 60))


# ---- the training loop (the jobs' program) ------------------------------------

def train(seconds: float, which: str = "cnn") -> dict[str, Any]:
    """Train a model for `seconds` (a small CNN; or torchvision's ResNet-18
    at its defaults, random weights); the mean time per step, after 5 of
    warm-up (cuDNN/cuBLAS set-up)."""
    import torch

    if which == "resnet18":
        import torchvision

        model = torchvision.models.resnet18(num_classes=10).cuda()
        x = torch.randn(16, 3, 64, 64, device="cuda")
        y = torch.randint(0, 10, (16,), device="cuda")
    else:
        model = torch.nn.Sequential(
            torch.nn.Conv2d(3, 32, 3, padding=1), torch.nn.ReLU(),
            torch.nn.Conv2d(32, 32, 3, padding=1), torch.nn.ReLU(),
            torch.nn.Flatten(), torch.nn.Linear(32 * 32 * 32, 10)).cuda()
        x = torch.randn(64, 3, 32, 32, device="cuda")
        y = torch.randint(0, 10, (64,), device="cuda")
    opt = torch.optim.SGD(model.parameters(), lr=0.01)

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()

    for _ in range(5):
        step()
    torch.cuda.synchronize()
    print(json.dumps({"ready": True}), flush=True)
    steps, t0 = 0, time.monotonic()
    while time.monotonic() - t0 < seconds:
        step()
        steps += 1
        if steps % 10 == 0:   # as a training loop's logging would
            torch.cuda.synchronize()
    torch.cuda.synchronize()
    elapsed = time.monotonic() - t0
    return {"steps": steps, "seconds": round(elapsed, 3),
            "ms_per_step": round(elapsed / max(steps, 1) * 1e3, 3)}


def loop_cmd(seconds: float, which: str = "cnn") -> list[str]:
    return [sys.executable, str(Path(__file__).resolve()), "--loop", f"{seconds:g}",
            "--model", which]


# ---- 1: time per step -----------------------------------------------------------

def last_json(text: str) -> dict[str, Any]:
    lines = [ln for ln in text.splitlines() if ln.startswith("{")]
    return json.loads(lines[-1]) if lines else {}


def one_run(env: dict[str, str], harness: DaemonHarness, seconds: float,
            gated: bool) -> dict[str, Any]:
    cmd = loop_cmd(seconds)
    if gated:
        cmd = [*VGPUCTL, "run", "--mem", "4G", "--core", "100", "--", *cmd]
    r = subprocess.run(cmd, env=harness.env if gated else env, capture_output=True, text=True,
                       timeout=seconds + 120, check=False)
    if r.returncode != 0:
        raise RuntimeError(f"the {'gated' if gated else 'bare'} loop failed ({r.returncode}): "
                           f"{r.stderr[-2000:]}")
    return last_json(r.stdout)


def median_ci(xs: list[float]) -> tuple[float, float, float]:
    """The median and a distribution-free 95 % confidence interval for it:
    the order statistics whose ranks hold the median with 95 % probability
    (binomial, p = 1/2)."""
    from math import comb

    ys = sorted(xs)
    n = len(ys)
    mid = (ys[(n - 1) // 2] + ys[n // 2]) / 2
    # the largest rank r with P(Binomial(n, 1/2) <= r - 1) <= 2.5 %: the
    # interval [x_(r), x_(n-r+1)] then holds the median with >= 95 %
    r, acc = 0, 0.0
    while r < n:
        nxt = acc + comb(n, r) / 2 ** n
        if nxt > 0.025:
            break
        acc, r = nxt, r + 1
    if r == 0:                 # too few runs for 95 %: the whole range
        return mid, ys[0], ys[-1]
    return mid, ys[r - 1], ys[n - r]


def step_time(env: dict[str, str], harness: DaemonHarness, seconds: float,
              pairs: int) -> dict[str, Any]:
    """`pairs` pairs of runs, bare and gated, their order alternating: each
    pair's ratio of ms per step, the median of the ratios and its 95 % CI."""
    runs = []
    for i in range(pairs):
        order = (False, True) if i % 2 == 0 else (True, False)
        got = {g: one_run(env, harness, seconds, g) for g in order}
        b, g = got[False], got[True]
        runs.append({"bare_ms": b["ms_per_step"], "gated_ms": g["ms_per_step"],
                     "ratio": g["ms_per_step"] / b["ms_per_step"], "gated_first": order[0]})
        print(f"pair {i + 1}/{pairs}: bare {b['ms_per_step']} ms, gated {g['ms_per_step']} ms",
              file=sys.stderr)
    mid, lo, hi = median_ci([r["ratio"] for r in runs])
    return {"pairs": runs, "seconds_each": seconds,
            "overhead_pct": round((mid - 1) * 100, 2),
            "ci95_pct": [round((lo - 1) * 100, 2), round((hi - 1) * 100, 2)],
            "bare_ms_median": median_ci([r["bare_ms"] for r in runs])[0],
            "gated_ms_median": median_ci([r["gated_ms"] for r in runs])[0]}


# ---- 2: two loops held to 30 % and 60 % -------------------------------------------

class LoopHarness(DaemonHarness):
    """share_accuracy's daemon harness, with a training loop as the job
    (programs: tag -> the model it trains)."""

    programs: dict[str, str] = {}

    def burn_cmd(self, spec: JobSpec, seconds: float) -> list[str]:
        return loop_cmd(seconds, self.programs.get(spec.name, "cnn"))


def _window(record: DeviceRecord, loops: list[tuple[str, subprocess.Popen[str]]],
            settle: float, seconds: float) -> tuple[Any, Any]:
    """Once each loop has set up and runs, the device's record after
    `settle` seconds and `seconds` later."""
    for tag, proc in loops:
        assert proc.stdout is not None and proc.stderr is not None
        if "ready" not in proc.stdout.readline():
            raise RuntimeError(f"{tag} did not start: {proc.stderr.read()[-2000:]}")
    time.sleep(settle)
    a = record.busy_ns()
    time.sleep(seconds)
    return a, record.busy_ns()


def _busy_pct(a: Any, b: Any, tag: str) -> float:
    """A tag's GPU time between two device records, in % of the wall time."""
    return round((b[1].get(tag, 0) - a[1].get(tag, 0)) / ((b[0] - a[0]) * 1e9) * 100, 2)


def _stop(procs: list[subprocess.Popen[str]]) -> None:
    for proc in procs:
        proc.terminate()
    for proc in procs:
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()


def two_loops(env: dict[str, str], tmp: Path, settle: float, seconds: float,
              programs: dict[str, str] | None = None) -> dict[str, Any]:
    env = dict(env, VGPU_SIM_NS_PER_BLOCK=SHARE_NS_PER_BLOCK)
    programs = programs or {}
    where = tmp / ("programs" if programs else "shares")
    where.mkdir()
    harness = LoopHarness(where, env)
    harness.programs = programs
    record = DeviceRecord(env)
    jobs: list[Running] = []
    try:
        for tag, core in SHARES:
            jobs.append(harness.start(JobSpec(tag, core), tag, settle + seconds + 60))
        a, b = _window(record, [(j.tag, j.proc) for j in jobs], settle, seconds)
    finally:
        _stop([j.proc for j in jobs])
        harness.close()
    shares = {tag: _busy_pct(a, b, tag) for tag, _ in SHARES}
    return {"window_s": round(b[0] - a[0], 2), "settle_s": settle, "shares_pct": shares,
            "programs": {tag: programs.get(tag, "cnn") for tag, _ in SHARES},
            "targets_pct": dict(SHARES),
            "error_points": {tag: round(shares[tag] - core, 2) for tag, core in SHARES}}


def loops_alone(env: dict[str, str], settle: float, seconds: float) -> dict[str, float]:
    """The control: each program's loop alone, ungated (no hook), at the
    share runs' kernel lengths: how busy it keeps the GPU by itself, so
    that a share it misses is the turns', not its host's."""
    env = dict(env, VGPU_SIM_NS_PER_BLOCK=SHARE_NS_PER_BLOCK)
    busy: dict[str, float] = {}
    for program in ("cnn", "resnet18"):
        tag = f"alone-{program}"
        e = dict(env, VGPU_SIM_TAG=tag)
        record = DeviceRecord(e)
        proc = subprocess.Popen(loop_cmd(settle + seconds + 60, program), env=e,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            a, b = _window(record, [(tag, proc)], settle, seconds)
        finally:
            _stop([proc])
        busy[program] = _busy_pct(a, b, tag)
    return busy


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--loop", type=float, help="run the training loop for this many seconds")
    ap.add_argument("--model", choices=("cnn", "resnet18"), default="cnn",
                    help="the training loop's model (with --loop)")
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--settle", type=float, default=5.0)
    ap.add_argument("--steps-s", type=float, default=3.0, help="seconds of each step-time run")
    ap.add_argument("--pairs", type=int, default=20, help="interleaved pairs of step-time runs")
    ap.add_argument("--only", choices=("steps", "shares", "programs", "alone"), default=None)
    ap.add_argument("--out", default=str(HERE / "results" / "frameworks.json"))
    args = ap.parse_args(argv)
    if args.loop is not None:
        print(json.dumps(train(args.loop, args.model)), flush=True)
        return 0
    import torch

    with tempfile.TemporaryDirectory(prefix="vgpu-bench-fw-") as d:
        tmp = Path(d)
        os.environ.update(VGPU_SIM=SIM_SPEC, VGPU_SIM_STATE=str(tmp / "simstate"))
        os.environ.pop("LD_PRELOAD", None)
        env = dict(sim.child_env(dict(os.environ)))
        t0 = time.monotonic()
        load_before = [round(x, 2) for x in os.getloadavg()]
        steps: dict[str, Any] = {}
        shares: dict[str, Any] = {}
        programs: dict[str, Any] = {}
        if args.only in (None, "steps"):
            (tmp / "steps").mkdir()
            harness = DaemonHarness(tmp / "steps", env)
            try:
                steps = step_time(env, harness, args.steps_s, args.pairs)
            finally:
                harness.close()
        if args.only in (None, "shares"):
            shares = two_loops(env, tmp, args.settle, args.seconds)
        if args.only in (None, "programs"):
            programs = two_loops(env, tmp, args.settle, args.seconds,
                                 {"t30": "cnn", "t60": "resnet18"})
        alone = (loops_alone(env, args.settle, args.seconds)
                 if args.only in (None, "shares", "programs", "alone") else {})
    lines = [f"{'measure':<44} {'value':>14}"]
    if steps:
        lo, hi = steps["ci95_pct"]
        lines += [f"{'ms per step, bare (median)':<44} {steps['bare_ms_median']:>14.3f}",
                  f"{'ms per step, vgpuctl run --core 100 (median)':<44} "
                  f"{steps['gated_ms_median']:>14.3f}",
                  f"{'overhead %, median of ' + str(len(steps['pairs'])) + ' pairs':<44} "
                  f"{steps['overhead_pct']:>14}",
                  f"{'95 % confidence interval (%)':<44} {f'{lo} to {hi}':>14}"]
    if shares:
        lines += [f"{f'share of --core {core} hard (%)':<44} {shares['shares_pct'][tag]:>14}"
                  for tag, core in SHARES]
    if programs:
        for tag, core in SHARES:
            what = f"{programs['programs'][tag]} at --core {core} hard (%)"
            lines.append(f"{what:<44} {programs['shares_pct'][tag]:>14}")
    lines += [f"{f'{program} alone, ungated: GPU busy (%)':<44} {pct:>14}"
              for program, pct in alone.items()]
    table = "\n".join(lines)
    print(table)
    out = {
        "benchmark": "frameworks",
        "device": f"simulated GPU (VGPU_SIM={SIM_SPEC})",
        "torch": torch.__version__,
        "cpus": os.cpu_count(),
        "elapsed_s": round(time.monotonic() - t0, 1),
        "loadavg_before": load_before,
        "loadavg_after": [round(x, 2) for x in os.getloadavg()],
        "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "step_time": steps,
        "two_loops": shares,
        "two_programs": programs,
        "alone_busy_pct": alone,
        "table": table,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
