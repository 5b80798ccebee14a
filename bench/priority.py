"""Priority classes on the simulated GPU: a latency-sensitive client next to
a saturating trainer, and a share that is a promise.

A private daemon on a simulated GPU that time-slices between processes
(``--timeslice-us``, 2000, and ``--switch-us``, 25: the simulator's
defaults). Every figure of the GPU's time comes from the simulator's own
timeline (busy time per ``VGPU_SIM_TAG``), never from vgpuctl's.

  client   ``vgpu-burn --request 4 --kernel-us 1000 --think-ms 16``: requests
           of 4 kernels of 1 ms, a random think time (exponential, 16 ms
           mean) between them: about 20 % of the GPU. Its latency is the
           device's time from the request's first launch to the end of its
           last kernel (events: exact on the simulator; ``host`` adds the
           waking of a loaded machine's threads).
  trainer  ``vgpu-burn`` with kernels of 100 us, 1 ms or 5 ms, about 16 ms
           of them queued, or CUDA graphs of 50 kernels of 100 us (5 ms a
           graph, 4 queued).

For each trainer: the client alone, the trainer alone, both under plain
sharing (no share, same class), soft shares (trainer --core 70, client
--core 30, both soft), and classes (client --priority high, trainer
--priority low). Figures: the client's p50/p99, the trainer's GPU time as
a part of what the client leaves idle.

  arrival  jobs of class high started one after another on a GPU full of a
           low trainer's work (1 ms and 5 ms kernels): the device time from
           a job's first launch to the start of its first kernel.
  promise  a hard --core 20 job next to a neighbour that asks for
           everything it may have (no --core: what the promises leave; or
           --core 80 soft; --core 100 is refused).
  torch    a PyTorch pair (when torch is installed): torchvision's
           ResNet-18 served at batch 1 (random weights, a random think time
           of 16 ms mean between requests) next to a ResNet-18 training loop
           at batch 16; the server's latency per request (host: the
           simulated GPU runs no arithmetic, and a kernel's time is its
           waves of blocks, VGPU_SIM_NS_PER_BLOCK), the trainer's steps/s.

Targets (issue 21): high next to low, trainer kernels <= 1 ms, client p50
and p99 within 1.5 ms of alone; longer kernels and graphs within one time
slice; the low trainer keeps >= 80 % of the GPU time the client leaves idle;
an arriving high job's first kernel runs within 2 ms; the --core 20 job
gets 20 +- 2 %.

Writes bench/results/priority.json (priority_<N>us.json with another
--timeslice-us). About 5 minutes. Timings are not pass/fail for the test
suite.

    python bench/priority.py [--seconds 10] [--only plain,1ms,arrival,promise]
                             [--timeslice-us 2000] [--switch-us 25]
                             [--budget-us 1000] [--holdoff-ms 100] [--arrivals 40]
                             [--util-procs last|busiest|each|none]
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

from share_accuracy import DaemonHarness

from vgpuctl.system import native, sim

VGPUCTL = [sys.executable, "-c", "from vgpuctl.cli import main; main()"]
CLIENT = ["--request", "4", "--kernel-us", "1000", "--think-ms", "16", "--seed", "7"]
CLIENT_KERNEL_MS = 1.0


@dataclass(frozen=True)
class Trainer:
    name: str
    kernel_us: int
    inflight: int
    graph: int = 0

    def args(self) -> list[str]:
        a = ["--kernel-us", str(self.kernel_us), "--inflight", str(self.inflight)]
        return a + (["--graph", str(self.graph)] if self.graph else [])


TRAINERS = [Trainer("100us", 100, 160), Trainer("1ms", 1000, 16), Trainer("5ms", 5000, 4),
            Trainer("graph", 100, 4, graph=50)]


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    v = sorted(values)
    k = min(len(v) - 1, max(0, int(round(q / 100 * (len(v) - 1)))))
    return v[k]


class Record:
    """Busy ns per tag on GPU 0, from the simulator's control function."""

    def __init__(self) -> None:
        lib = ctypes.CDLL(str(native.sim_libdir() / "libnvidia-ml.so.1"))
        self._fn = lib.vgpu_sim_ctl_stats
        self._fn.argtypes = [ctypes.c_char_p, ctypes.c_size_t]
        self._fn.restype = ctypes.c_int
        self._buf = ctypes.create_string_buffer(1 << 21)

    def stats(self) -> dict[str, Any]:
        n = self._fn(self._buf, len(self._buf))
        if n < 0:
            return {}
        return json.loads(self._buf.value.decode())

    def busy(self) -> tuple[float, dict[str, int]]:
        t = time.monotonic()
        d = self.stats()
        return t, {tg["name"]: int(tg["devices"][0]["busy_ns"]) for tg in d.get("tags", [])}


class Daemon(DaemonHarness):
    """The private daemon, its priority section's budget and holdoff as given."""

    def __init__(self, tmp: Path, env: dict[str, str], budget_us: int, holdoff_ms: int) -> None:
        super().__init__(tmp, env, f"tick_ms = 100\n[priority]\nbudget_us = {budget_us}\n"
                         f"holdoff_ms = {holdoff_ms}\n", stop_s=15)

    def run(self, tag: str, burn: list[str], *opts: str) -> subprocess.Popen:
        env = dict(self.env, VGPU_SIM_TAG=tag)
        cmd = [*VGPUCTL, "run", "-q", "--mem", "1G", "--name", tag, *opts, "--",
               str(native.burn_program()), *burn]
        return subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True)

    def vgpuctl(self, *args: str) -> subprocess.CompletedProcess:
        return subprocess.run([*VGPUCTL, *args], env=self.env, capture_output=True, text=True,
                              timeout=60, check=False)


def result(p: subprocess.Popen, timeout: float = 120) -> dict[str, Any]:
    out, err = p.communicate(timeout=timeout)
    lines = [ln for ln in out.splitlines() if ln.strip().startswith("{")]
    if p.returncode != 0 or not lines:
        raise RuntimeError(f"job failed ({p.returncode}): {err.strip()[-800:]}")
    return json.loads(lines[-1])


def stop(p: subprocess.Popen | None) -> None:
    if p is not None and p.poll() is None:
        p.send_signal(signal.SIGTERM)
        try:
            p.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            p.kill()


def wait_running(rec: Record, tag: str, deadline_s: float = 20.0) -> None:
    """Until the job of tag has run some kernel time (it started)."""
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        if rec.busy()[1].get(tag, 0) > 0:
            return
        time.sleep(0.05)
    raise RuntimeError(f"{tag} never ran")


@dataclass
class Pair:
    mode: str
    trainer: str
    client: dict[str, float] = field(default_factory=dict)
    trainer_busy: float = 0.0          # part of the window
    client_busy: float = 0.0
    idle_kept: float | None = None     # trainer busy / what the client left idle


def latency(c: dict[str, Any]) -> dict[str, float]:
    dev, host, first = c["device_ms"], c["latency_ms"], c["first_ms"]
    return {"requests": len(dev), "p50": pct(dev, 50), "p99": pct(dev, 99),
            "max": max(dev) if dev else float("nan"),
            "host_p50": pct(host, 50), "host_p99": pct(host, 99),
            "first_wait_p50": pct(first, 50) - CLIENT_KERNEL_MS,
            "first_wait_p99": pct(first, 99) - CLIENT_KERNEL_MS}


def pair(d: Daemon, rec: Record, n: int, mode: str, tr: Trainer | None, seconds: float,
         with_client: bool = True) -> Pair:
    """One measurement: the trainer (if any) saturating, the client (if
    asked) for `seconds`; busy time over the client's window."""
    client_opts: list[str] = []
    trainer_opts: list[str] = []
    if mode == "soft":
        client_opts = ["--core", "30", "--policy", "soft"]
        trainer_opts = ["--core", "70", "--policy", "soft"]
    elif mode == "classes":
        client_opts = ["--priority", "high"]
        trainer_opts = ["--priority", "low"]
    elif mode == "low-alone":
        trainer_opts = ["--priority", "low"]
    ttag, ctag = f"t{n}", f"c{n}"
    tp = None
    try:
        if tr is not None:
            tp = d.run(ttag, [*tr.args(), "--seconds", f"{seconds + 30:g}"], *trainer_opts)
            wait_running(rec, ttag)
            time.sleep(1.5)        # its queue full, its cost learnt
        t0, b0 = rec.busy()
        cres = None
        if with_client:
            cp = d.run(ctag, [*CLIENT, "--seconds", f"{seconds:g}"], *client_opts)
            cres = result(cp, timeout=seconds + 60)
        else:
            time.sleep(seconds)
        t1, b1 = rec.busy()
    finally:
        stop(tp)
    span = (t1 - t0) * 1e9
    out = Pair(mode, tr.name if tr else "-")
    out.trainer_busy = (b1.get(ttag, 0) - b0.get(ttag, 0)) / span
    out.client_busy = (b1.get(ctag, 0) - b0.get(ctag, 0)) / span
    if cres is not None:
        out.client = latency(cres)
    if tr is not None:
        idle = 1.0 - out.client_busy
        out.idle_kept = out.trainer_busy / idle if idle > 0 else None
    return out


def arrival(d: Daemon, rec: Record, n: int, tr: Trainer, count: int) -> dict[str, Any]:
    """High jobs of one request of one 100 us kernel, each started anew on a
    GPU a low trainer fills: the wait of each one's first kernel."""
    ttag = f"t{n}"
    tp = d.run(ttag, [*tr.args(), "--seconds", "600"], "--priority", "low")
    waits = []
    try:
        wait_running(rec, ttag)
        time.sleep(1.5)
        for i in range(count):
            p = d.run(f"a{n}-{i}", ["--request", "1", "--kernel-us", "100", "--count", "1"],
                      "--priority", "high")
            c = result(p)
            waits.append(c["first_ms"][0] - 0.1)
            time.sleep(0.2)
    finally:
        stop(tp)
    return {"trainer": tr.name, "arrivals": len(waits), "p50": pct(waits, 50),
            "p99": pct(waits, 99), "max": max(waits), "waits_ms": [round(w, 3) for w in waits]}


def promise(d: Daemon, rec: Record, n: int, seconds: float, neighbour: list[str],
            what: str) -> dict[str, Any]:
    atag, btag = f"p{n}a", f"p{n}b"
    burn = ["--kernel-us", "1000", "--inflight", "16", "--seconds", f"{seconds + 30:g}"]
    a = d.run(atag, burn, "--core", "20", "--policy", "hard")
    b = None
    try:
        wait_running(rec, atag)
        b = d.run(btag, burn, *neighbour)
        wait_running(rec, btag)
        time.sleep(3.0)            # both gated, their costs learnt
        t0, b0 = rec.busy()
        time.sleep(seconds)
        t1, b1 = rec.busy()
    finally:
        stop(b)
        stop(a)
    span = (t1 - t0) * 1e9
    return {"neighbour": what, "share": 100 * (b1.get(atag, 0) - b0.get(atag, 0)) / span,
            "neighbour_share": 100 * (b1.get(btag, 0) - b0.get(btag, 0)) / span}


SERVE = r"""
import json, math, random, sys, time
import torch, torchvision
seconds, think = float(sys.argv[1]), float(sys.argv[2])
m = torchvision.models.resnet18().cuda().eval()
x = torch.randn(1, 3, 224, 224, device="cuda")
rnd = random.Random(7)
with torch.no_grad():
    for _ in range(5):
        m(x)
    torch.cuda.synchronize()
    lat, end = [], time.monotonic() + seconds
    while time.monotonic() < end:
        t0 = time.perf_counter()
        m(x).sum().item()
        lat.append((time.perf_counter() - t0) * 1e3)
        time.sleep(-think / 1e3 * math.log(1.0 - rnd.random()))
print(json.dumps({"latency_ms": lat}))
"""

TRAIN = r"""
import json, signal, sys, time
import torch, torchvision
seconds = float(sys.argv[1])
stop = []
signal.signal(signal.SIGTERM, lambda *a: stop.append(1))
m = torchvision.models.resnet18().cuda().train()
opt = torch.optim.SGD(m.parameters(), lr=0.01)
x = torch.randn(16, 3, 224, 224, device="cuda")
y = torch.randint(0, 1000, (16,), device="cuda")
def step():
    opt.zero_grad(set_to_none=True)
    torch.nn.functional.cross_entropy(m(x), y).backward()
    opt.step()
for _ in range(3):
    step()
torch.cuda.synchronize()
n, t0 = 0, time.monotonic()
while time.monotonic() - t0 < seconds and not stop:
    step()
    n += 1
    if n % 8 == 0:
        torch.cuda.synchronize()
torch.cuda.synchronize()
print(json.dumps({"steps": n, "steps_per_s": n / (time.monotonic() - t0)}))
"""


def torch_installed() -> bool:
    r = subprocess.run([sys.executable, "-c", "import torch, torchvision"],
                       capture_output=True, timeout=300, check=False)
    return r.returncode == 0


def torch_pair(d: Daemon, rec: Record, seconds: float) -> dict[str, Any]:
    """ResNet-18 served at batch 1 next to a ResNet-18 training loop, plain
    and as high/low."""
    def job(tag: str, code: str, argv: list[str], *opts: str) -> subprocess.Popen:
        env = dict(d.env, VGPU_SIM_TAG=tag)
        cmd = [*VGPUCTL, "run", "-q", "--mem", "6G", "--name", tag, *opts, "--",
               sys.executable, "-c", code, *argv]
        return subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True)

    out: dict[str, Any] = {}
    s = job("serve-alone", SERVE, [f"{seconds:g}", "16"])
    lat = result(s, timeout=seconds + 600)["latency_ms"]
    out["serve_alone"] = {"requests": len(lat), "p50": pct(lat, 50), "p99": pct(lat, 99)}
    t = job("train-alone", TRAIN, [f"{seconds:g}"])
    out["train_alone_steps_per_s"] = result(t, timeout=seconds + 600)["steps_per_s"]
    print(f"torch: serve alone p50 {out['serve_alone']['p50']:.2f} p99 "
          f"{out['serve_alone']['p99']:.2f} ms; train alone "
          f"{out['train_alone_steps_per_s']:.2f} steps/s", flush=True)
    for mode, sopts, topts in (("plain", (), ()),
                               ("classes", ("--priority", "high"), ("--priority", "low"))):
        t = job(f"train-{mode}", TRAIN, [f"{seconds + 40:g}"], *topts)
        try:
            wait_running(rec, f"train-{mode}", 120)
            time.sleep(3.0)
            s = job(f"serve-{mode}", SERVE, [f"{seconds:g}", "16"], *sopts)
            lat = result(s, timeout=seconds + 600)["latency_ms"]
        finally:
            t.send_signal(signal.SIGTERM)
        tr = result(t, timeout=seconds + 120)
        out[mode] = {"requests": len(lat), "p50": pct(lat, 50), "p99": pct(lat, 99),
                     "train_steps_per_s": tr.get("steps_per_s")}
        print(f"torch {mode}: serve p50 {out[mode]['p50']:.2f} p99 {out[mode]['p99']:.2f} ms, "
              f"train {tr.get('steps_per_s', 0):.2f} steps/s", flush=True)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--only", default="", help="comma-separated: trainer names (100us, 1ms, "
                    "5ms, graph), arrival, promise")
    ap.add_argument("--timeslice-us", type=int, default=2000)
    ap.add_argument("--switch-us", type=int, default=25)
    ap.add_argument("--budget-us", type=int, default=1000)
    ap.add_argument("--holdoff-ms", type=int, default=100)
    ap.add_argument("--arrivals", type=int, default=40, help="high jobs started per trainer")
    ap.add_argument("--util-procs", choices=("last", "busiest", "each", "none"), default="last",
                    help="which processes the simulated NVML names in a sample period "
                         "(bench/share_accuracy.py; the classes read none of it)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    if args.out is None:
        suffix = "" if args.timeslice_us == 2000 else f"_{args.timeslice_us}us"
        suffix += "" if args.util_procs == "last" else f"_{args.util_procs}"
        args.out = str(HERE / "results" / f"priority{suffix}.json")
    only = {x.strip() for x in args.only.split(",") if x.strip()}

    tmp = Path(tempfile.mkdtemp(prefix="vgpu-prio-"))
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("VGPU_") and k not in ("LD_PRELOAD", "CUDA_VISIBLE_DEVICES")}
    env.update(VGPU_SIM="1x16G", VGPU_SIM_STATE=str(tmp / "sim-state"),
               VGPU_SIM_TIMESLICE_US=str(args.timeslice_us),
               VGPU_SIM_SWITCH_US=str(args.switch_us), VGPU_SIM_UTIL_PROCS=args.util_procs)
    os.environ.update({k: env[k] for k in ("VGPU_SIM", "VGPU_SIM_STATE",
                                           "VGPU_SIM_TIMESLICE_US", "VGPU_SIM_SWITCH_US",
                                           "VGPU_SIM_UTIL_PROCS")})
    sim.use_in_process()
    env["LD_LIBRARY_PATH"] = ":".join(
        [str(native.sim_libdir()), *[p for p in env.get("LD_LIBRARY_PATH", "").split(":") if p]])
    started = time.time()
    load0 = os.getloadavg()
    d = Daemon(tmp, env, args.budget_us, args.holdoff_ms)
    rec = Record()
    out: dict[str, Any] = {
        "benchmark": "priority", "device": "simulated GPU (1x16G)",
        "timeslice_us": args.timeslice_us, "switch_us": args.switch_us,
        "util_procs": args.util_procs,
        "budget_us": args.budget_us, "holdoff_ms": args.holdoff_ms,
        "seconds": args.seconds, "client": " ".join(CLIENT), "cpus": os.cpu_count(),
        "machine": platform.machine(), "date": time.strftime("%Y-%m-%d"),
        "loadavg_before": [round(x, 2) for x in load0],
        "pairs": [], "arrival": [], "promise": [], "torch": None}
    n = 0
    try:
        alone = pair(d, rec, n, "alone", None, args.seconds)
        out["client_alone"] = alone.client
        out["client_alone_busy"] = alone.client_busy
        print(f"client alone: p50 {alone.client['p50']:.2f} ms, p99 "
              f"{alone.client['p99']:.2f} ms, busy {100 * alone.client_busy:.1f} %", flush=True)
        for tr in TRAINERS:
            if only and tr.name not in only:
                continue
            for mode in ("trainer-alone", "low-alone", "plain", "soft", "classes"):
                n += 1
                p = pair(d, rec, n, mode, tr, args.seconds,
                         with_client=mode not in ("trainer-alone", "low-alone"))
                row = {"trainer": tr.name, "mode": mode, **{k: round(v, 3) for k, v in
                                                            p.client.items()},
                       "trainer_busy": round(p.trainer_busy, 4),
                       "client_busy": round(p.client_busy, 4),
                       "idle_kept": None if p.idle_kept is None else round(p.idle_kept, 4)}
                out["pairs"].append(row)
                lat = (f"client p50 {p.client['p50']:.2f} p99 {p.client['p99']:.2f} ms, "
                       if p.client else "")
                print(f"{tr.name:>6} {mode:<13} {lat}trainer {100 * p.trainer_busy:.1f} % "
                      f"of the GPU" + (f", {100 * p.idle_kept:.1f} % of what the client left"
                                       if p.client and p.idle_kept is not None else ""),
                      flush=True)
        if not only or "arrival" in only:
            for tr in (TRAINERS[1], TRAINERS[2]):
                n += 1
                a = arrival(d, rec, n, tr, args.arrivals)
                out["arrival"].append(a)
                print(f"arrival next to low {tr.name}: first kernel after p50 {a['p50']:.2f} "
                      f"p99 {a['p99']:.2f} max {a['max']:.2f} ms", flush=True)
        if not only or "promise" in only:
            for neighbour, what in (([], "no --core"), (["--core", "80", "--policy", "soft"],
                                                        "--core 80 soft")):
                n += 1
                pr = promise(d, rec, n, args.seconds, neighbour, what)
                out["promise"].append(pr)
                print(f"--core 20 hard next to {what}: {pr['share']:.2f} % "
                      f"(neighbour {pr['neighbour_share']:.2f} %)", flush=True)
            n += 1
            a = d.run(f"p{n}a", ["--kernel-us", "1000", "--seconds", "30"], "--core", "20")
            try:
                wait_running(rec, f"p{n}a")
                r = d.vgpuctl("run", "--mem", "1G", "--core", "100", "--", "true")
                out["promise_refused"] = {"rc": r.returncode, "stderr": r.stderr.strip()}
                print(f"--core 100 next to it: exit {r.returncode}: {r.stderr.strip()}",
                      flush=True)
            finally:
                stop(a)
        if (not only or "torch" in only) and torch_installed():
            out["torch"] = torch_pair(d, rec, args.seconds)
    finally:
        d.close()
        out["elapsed_s"] = round(time.time() - started, 1)
        out["loadavg_after"] = [round(x, 2) for x in os.getloadavg()]
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
