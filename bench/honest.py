"""An honest workload must never be taken for an attack (issue 20): the
violation watch's rules against real PyTorch jobs on a loaded machine.

    python bench/honest.py [--seconds 600] [--cpu-burners N] [--output FILE]
                           [--suspend-every S] [--preempt-every S]
    python bench/honest.py --role train|client ...   # a job's own program

A private daemon in its default configuration (on_violation = "protect")
over one simulated 32 GiB GPU whose kernels take 50 us per wave of blocks
(GPU-bound, as the frameworks benchmark sets it), for --seconds:

  gpt2      a GPT-2 (transformers, built from its config, random weights)
            training loop, --core 40 hard, AdamW, batch 8 x 128 tokens
  resnet    a torchvision ResNet-18 training loop, --core 30 soft (it borrows
            what the others leave idle), SGD, batch 32 at 64 x 64
  client    a bursty inference client: torchvision ResNet-18 in eval at batch
            1, bursts of 1 to 8 requests after 0 to 400 ms of think time,
            --core 20 hard
  low       a ResNet-18 training loop as resnet, --priority low, 8 GiB
  set       every 15 s, `vgpuctl set` moves gpt2 among 40/20/60 and resnet
            among 30/50/10 (and its policy between soft and hard every
            other time)
  suspend   every --suspend-every s (45), `vgpuctl suspend gpt2`, and
            `vgpuctl resume gpt2` 3 s later (its memory leaves the GPU and
            comes back through the driver's checkpoints)
  preempt   every --preempt-every s (60), a high-class client for 8 s whose
            8 GiB fit only once the low job is suspended (preempted); the
            low job resumes by itself when it ends

beside --cpu-burners processes spinning on the CPU (default: one per core),
so that the daemon and the jobs are late as a loaded node makes them.

Figures: every violation recorded (target 0), and each job's highest
compute debt (vgpuctl.core.violations: a violation at 0.5 GPU-seconds),
from the daemon's log; each job's steps or requests done.

Writes bench/results/honest.json. Needs torch, torchvision and transformers.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

from run_overhead import remove_regions, vgpuctl_argv  # noqa: E402

NS_PER_BLOCK = "50000"
SETS = {"gpt2": [("40", None), ("20", None), ("60", None)],
        "resnet": [("30", "soft"), ("50", "hard"), ("10", "soft"), ("30", "hard")]}


# ---- the jobs' programs ------------------------------------------------------------------
def train(model_name: str, seconds: float) -> dict[str, Any]:
    import torch

    if model_name == "gpt2":
        from transformers import GPT2Config, GPT2LMHeadModel

        cfg = GPT2Config(n_layer=4, n_head=8, n_embd=256, vocab_size=8192, n_positions=256)
        model = GPT2LMHeadModel(cfg).cuda()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
        x = torch.randint(0, cfg.vocab_size, (8, 128), device="cuda")

        def step() -> None:
            loss = model(input_ids=x, labels=x).loss
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
    else:
        import torchvision

        model = torchvision.models.resnet18(num_classes=100).cuda()
        opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
        x = torch.randn(32, 3, 64, 64, device="cuda")
        y = torch.randint(0, 100, (32,), device="cuda")
        loss_fn = torch.nn.CrossEntropyLoss()

        def step() -> None:
            loss = loss_fn(model(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
    end = time.monotonic() + seconds
    steps = 0
    while time.monotonic() < end:
        step()
        steps += 1
        if steps % 10 == 0:
            torch.cuda.synchronize()
    torch.cuda.synchronize()
    return {"steps": steps}


def client(seconds: float) -> dict[str, Any]:
    import torch
    import torchvision

    model = torchvision.models.resnet18().cuda().eval()
    x = torch.randn(1, 3, 224, 224, device="cuda")
    rng = random.Random(1)
    end = time.monotonic() + seconds
    requests = 0
    with torch.no_grad():
        while time.monotonic() < end:
            time.sleep(rng.uniform(0.0, 0.4))
            for _ in range(rng.randint(1, 8)):
                model(x)
                torch.cuda.synchronize()
                requests += 1
    return {"requests": requests}


# ---- the run ---------------------------------------------------------------------------------
def spin() -> None:
    while True:
        pass


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=600.0)
    ap.add_argument("--cpu-burners", type=int, default=os.cpu_count() or 2)
    ap.add_argument("--set-every", type=float, default=15.0)
    ap.add_argument("--suspend-every", type=float, default=45.0)
    ap.add_argument("--preempt-every", type=float, default=60.0)
    ap.add_argument("--ns-per-block", default=NS_PER_BLOCK)
    ap.add_argument("--role", choices=["train", "client"])
    ap.add_argument("--model", default="resnet")
    ap.add_argument("--output", default=str(HERE / "results" / "honest.json"))
    args = ap.parse_args()
    if args.role == "train":
        print(json.dumps(train(args.model, args.seconds)), flush=True)
        return
    if args.role == "client":
        print(json.dumps(client(args.seconds)), flush=True)
        return

    base = Path(tempfile.mkdtemp(prefix="vgpu-honest-"))
    env = {k: v for k, v in os.environ.items() if not k.startswith("VGPU_")}
    env.pop("LD_PRELOAD", None)
    env.update({"VGPU_SIM": "1x32G", "VGPU_SIM_STATE": str(base / "sim-state"),
                "VGPU_SIM_NS_PER_BLOCK": args.ns_per_block,
                "VGPU_SOCKET": str(base / "vgpud.sock"), "VGPU_RUNTIME_DIR": str(base / "run"),
                "VGPU_STATE_DIR": str(base / "state"), "VGPU_CONFIG": str(base / "vgpu.toml")})
    (base / "vgpu.toml").write_text('log_level = "debug"\n')   # the jobs' peak debts
    log = open(base / "daemon.log", "wb")   # noqa: SIM115 - the daemon's for its life
    daemon = subprocess.Popen([*vgpuctl_argv(), "daemon"], env=env, stdout=log, stderr=log,
                              stdin=subprocess.DEVNULL)
    burners = [subprocess.Popen([sys.executable, "-c", "while True: pass"])
               for _ in range(args.cpu_burners)]
    procs: dict[str, subprocess.Popen] = {}
    t0 = time.monotonic()
    load0 = os.getloadavg()
    sets = 0
    try:
        deadline = time.monotonic() + 30
        while not (base / "vgpud.sock").exists():
            if time.monotonic() > deadline or daemon.poll() is not None:
                raise SystemExit("the daemon did not start")
            time.sleep(0.05)
        me = [sys.executable, str(Path(__file__).resolve())]
        specs = {
            "gpt2": ["--mem", "8G", "--core", "40", "--", *me, "--role", "train", "--model",
                     "gpt2", "--seconds", str(args.seconds)],
            "resnet": ["--mem", "8G", "--core", "30", "--policy", "soft", "--", *me, "--role",
                       "train", "--model", "resnet", "--seconds", str(args.seconds)],
            "client": ["--mem", "4G", "--core", "20", "--", *me, "--role", "client",
                       "--seconds", str(args.seconds)],
            "low": ["--mem", "8G", "--priority", "low", "--", *me, "--role", "train",
                    "--model", "resnet", "--seconds", str(args.seconds)],
        }
        for name, a in specs.items():
            procs[name] = subprocess.Popen([*vgpuctl_argv(), "run", "--name", name, *a],
                                           env={**env, "VGPU_SIM_TAG": name},
                                           stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                           text=True)
        end = time.monotonic() + args.seconds
        k = 0
        next_suspend = time.monotonic() + args.suspend_every
        next_preempt = time.monotonic() + args.preempt_every
        events = {"suspended": 0, "resumed": 0, "preempting_jobs": 0, "failed": []}
        highs: list[subprocess.Popen] = []
        suspended = False
        while time.monotonic() < end - args.set_every and all(
                p.poll() is None for p in procs.values()):
            time.sleep(args.set_every)
            k += 1
            now = time.monotonic()
            # (one event at a time: a high job running takes the room a
            # suspended job left, and its resume would wait for it)
            busy = any(h.poll() is None for h in highs)
            if suspended or (now >= next_suspend and now < end - 10 and not busy):
                next_suspend = max(next_suspend + args.suspend_every, now)
                for verb in ("resume",) if suspended else ("suspend", "resume"):
                    r = subprocess.run([*vgpuctl_argv(), verb, "gpt2"], env=env,
                                       capture_output=True, text=True, timeout=120)
                    if r.returncode == 0:
                        events["suspended" if verb == "suspend" else "resumed"] += 1
                        suspended = verb == "suspend"
                    else:
                        events["failed"].append(f"{verb}: {r.stderr.strip()}")
                        break
                    if verb == "suspend":
                        time.sleep(3)
                busy = True
            if now >= next_preempt and now < end - 20 and not busy and not suspended:
                next_preempt += args.preempt_every
                highs.append(subprocess.Popen(
                    [*vgpuctl_argv(), "run", "--name", "high", "--mem", "8G", "--priority",
                     "high", "--", *me, "--role", "client", "--seconds", "8"],
                    env={**env, "VGPU_SIM_TAG": "high"}, stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE, text=True))
                events["preempting_jobs"] += 1
            for name, steps in SETS.items():
                core, policy = steps[k % len(steps)]
                cmd = [*vgpuctl_argv(), "set", name, "--core", core]
                if policy:
                    cmd += ["--policy", policy]
                r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=60)
                if r.returncode == 0:
                    sets += 1
                else:
                    print(f"set {name} failed: {r.stderr.strip()}", file=sys.stderr)
        outs = {}
        for h in highs:
            _, err = h.communicate(timeout=300)
            if h.returncode:
                events["failed"].append(f"high: exit {h.returncode}: {err[-300:]}")
        for name, p in procs.items():
            out, err = p.communicate(timeout=args.seconds + 300)
            lines = [ln for ln in out.splitlines() if ln.startswith("{")]
            outs[name] = {"exit": p.returncode, **(json.loads(lines[-1]) if lines else {}),
                          **({"stderr": err[-2000:]} if p.returncode else {})}
        ps = json.loads(subprocess.run([*vgpuctl_argv(), "ps", "--all", "--json"], env=env,
                                       capture_output=True, text=True, check=True).stdout)
        stats = json.loads(subprocess.run([*vgpuctl_argv(), "sim", "stats", "--json"], env=env,
                                          capture_output=True, text=True, check=True).stdout)
        busy = {t["name"]: sum(d["busy_ns"] for d in t["devices"]) / 1e9
                for t in stats["tags"]}
    finally:
        for b in burners:
            b.kill()
            b.wait()
        for p in procs.values():
            if p.poll() is None:
                p.kill()
                p.wait()
        daemon.send_signal(signal.SIGTERM)
        daemon.wait(30)
        log.close()
    text = (base / "daemon.log").read_text(errors="replace")
    ids = {j["id"]: j["name"] for j in ps["jobs"]}
    debts = {ids.get(m.group(1), m.group(1)): float(m.group(2)) for m in re.finditer(
        r"job (\d+): peak compute debt ([0-9.]+) GPU-seconds", text)}
    violations = [v for j in ps["jobs"] for v in j["violations"]] + ps.get("violations", [])
    warnings = [ln for ln in text.splitlines() if "violation (" in ln or "tampered" in ln]
    remove_regions(base / "run")
    shutil.rmtree(base, ignore_errors=True)
    result = {
        "benchmark": "honest", "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "device": f"simulated GPU (VGPU_SIM=1x32G, VGPU_SIM_NS_PER_BLOCK={args.ns_per_block})",
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                    "platform": platform.platform()},
        "seconds": args.seconds, "cpu_burners": args.cpu_burners,
        "elapsed_s": round(time.monotonic() - t0, 1),
        "loadavg_before": [round(x, 2) for x in load0],
        "loadavg_after": [round(x, 2) for x in os.getloadavg()],
        "set_changes": sets, "events": events,
        "violations": len(violations), "violation_records": violations[:20],
        "log_lines": warnings[:20],
        "peak_debt_gpu_s": debts, "burst_gpu_s": 0.5,
        "gpu_share_pct": {name: round(100 * b / args.seconds, 1) for name, b in busy.items()},
        "jobs": outs,
    }
    out = Path(args.output)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: result[k] for k in ("seconds", "set_changes", "events", "violations",
                                              "peak_debt_gpu_s", "gpu_share_pct", "jobs")}))
    print(f"written to {out}")


if __name__ == "__main__":
    main()
