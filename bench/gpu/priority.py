"""Priority classes on a real GPU: bench/priority.py's scenario, measured by
the programs themselves (no simulator timeline to read).

    python3 bench/gpu/priority.py [--out DIR] [--seconds 15] [--arrivals 10]

  client   vgpu-burn --request 4 --kernel-us 1000 --think-ms 16: requests of
           4 kernels of 1 ms, a random think time (16 ms mean); its host
           latency per request (first launch to the wait's return: what a
           service sees)
  trainer  vgpu-burn saturating, kernels of 1 ms (16 queued) or 5 ms (4
           queued); its kernels completed

Every kernel does a fixed amount of work (`vgpu-burn --work`: as many
multiply-adds as the GPU does in that time alone, measured once at the
start): a kernel that spins on the GPU's clock would end as soon as its
time passed after the GPU preempted it, and hide what time slicing costs.

Runs: the client alone; each trainer alone; client and trainer as two jobs
of one class (plain sharing); client --priority high and trainer --priority
low. Then `--arrivals` jobs of class high, each one request of one 100 us
kernel, started one after another on a GPU a low trainer of 1 ms kernels
fills (the host's time from its launch to the end of that kernel, less 100
us: a GPU stamps an event only once the context runs); and a hard
--core 20 job next to a neighbour with no --core, both saturating (its
kernels completed against alone).

Checks (issue 21): classes, 1 ms trainer: the client's p50 and p99 within
1.5 ms of alone; 5 ms trainer: within one time slice (taken as 2 ms: NVIDIA
does not document it); the low trainer keeps >= 80 % of the GPU time the
client leaves idle; an arriving high job's first kernel within 2 ms (p99);
the --core 20 job at 20 +- 2 %. Writes priority.json. About 3 minutes.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common as C

CLIENT = ["--request", "4", "--kernel-us", "1000", "--think-ms", "16", "--seed", "7"]
TRAINERS = {"1ms": ["--kernel-us", "1000", "--inflight", "16"],
            "5ms": ["--kernel-us", "5000", "--inflight", "4"]}


def pct(v: list[float], q: float) -> float:
    if not v:
        return float("nan")
    s = sorted(v)
    return s[min(len(s) - 1, max(0, int(round(q / 100 * (len(s) - 1)))))]


WORK: list[str] = ["--work"]     # with --iters-per-us once calibrated


def job(d: C.Daemon, args: list[str], name: str, *opts: str) -> list[str]:
    return [*C.VGPUCTL, "run", "-q", "--mem", "2G", "--name", name, *opts, "--",
            C.burn_program(), *args, *WORK]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=str(C.DEFAULT_OUT))
    ap.add_argument("--seconds", type=float, default=15.0)
    ap.add_argument("--arrivals", type=int, default=10)
    ap.add_argument("--slice-ms", type=float, default=2.0,
                    help="the time slice the 5 ms target is taken as")
    args = ap.parse_args(argv)
    res = C.StepResult("priority", {k: v for k, v in vars(args).items() if k != "out"})
    S = args.seconds

    def body(d: C.Daemon) -> None:
        env = d.job_env()
        figs: dict[str, Any] = {}
        res.figures["runs"] = figs

        def client(*opts: str) -> dict[str, Any]:
            r = C.run(job(d, [*CLIENT, "--seconds", f"{S:g}"], "client", *opts), env, S + 120)
            j = r.json or {}
            if r.rc != 0 or "latency_ms" not in j:
                raise RuntimeError(f"client failed ({r.rc}): {C.tail(r.stderr, 300)}")
            lat = j["latency_ms"]
            return {"requests": len(lat), "p50": pct(lat, 50), "p99": pct(lat, 99),
                    "device_p50": pct(j["device_ms"], 50), "device_p99": pct(j["device_ms"], 99),
                    "busy": len(lat) * 4e-3 / max(j.get("seconds") or S, 1e-9)}

        def trainer_rate(kind: str, *opts: str, seconds: float) -> float:
            r = C.run(job(d, [*TRAINERS[kind], "--seconds", f"{seconds:g}"], f"t-{kind}",
                          *opts), env, seconds + 120)
            j = r.json or {}
            if r.rc != 0:
                raise RuntimeError(f"trainer failed ({r.rc}): {C.tail(r.stderr, 300)}")
            return float(j.get("rate") or 0.0)

        cal = C.run([C.burn_program(), "--kernel-us", "1000", "--work", "--count", "20"],
                     C.base_env(), 120)
        rate = (cal.json or {}).get("iters_per_us")
        if cal.rc != 0 or not rate:
            raise RuntimeError(f"calibration failed ({cal.rc}): {C.tail(cal.stderr, 300)}")
        WORK[:] = ["--work", "--iters-per-us", f"{rate:.4f}"]
        figs["iters_per_us"] = rate
        alone = figs["client_alone"] = client()
        print(f"  client alone: p50 {alone['p50']:.2f} p99 {alone['p99']:.2f} ms", flush=True)
        for kind in TRAINERS:
            solo = trainer_rate(kind, seconds=S)
            figs[f"{kind}_alone_rate"] = solo
            for mode, copts, topts in (("plain", (), ()),
                                       ("classes", ("--priority", "high"),
                                        ("--priority", "low"))):
                tp = C.start(job(d, [*TRAINERS[kind], "--seconds", f"{S + 6:g}"],
                                 f"t-{kind}-{mode}", *topts), env)
                try:
                    time.sleep(3.0)
                    c = client(*copts)
                finally:
                    tr = C.finish(tp, [], S + 60)
                rate = float((tr.json or {}).get("rate") or 0.0)
                kept = rate / solo / max(1e-9, 1.0 - c["busy"]) if solo else None
                figs[f"{kind}_{mode}"] = {**c, "trainer_rate": rate, "idle_kept": kept}
                print(f"  {kind} {mode}: client p50 {c['p50']:.2f} p99 {c['p99']:.2f} ms, "
                      f"trainer {rate:.0f}/s of {solo:.0f}/s alone", flush=True)
            cls = figs[f"{kind}_classes"]
            bound = 1.5 if kind == "1ms" else args.slice_ms
            res.add(C.judged(f"latency-{kind}", f"client p50 and p99 within {bound:g} ms of "
                             f"alone next to a low trainer of {kind} kernels",
                             cls["p50"] - alone["p50"] <= bound
                             and cls["p99"] - alone["p99"] <= bound,
                             {"alone": [alone["p50"], alone["p99"]],
                              "classes": [cls["p50"], cls["p99"]],
                              "plain": [figs[f"{kind}_plain"]["p50"],
                                        figs[f"{kind}_plain"]["p99"]]}))
            res.add(C.judged(f"idle-kept-{kind}", "the low trainer keeps >= 80 % of the GPU "
                             "time the client leaves idle",
                             cls["idle_kept"] is not None and cls["idle_kept"] >= 0.8,
                             cls["idle_kept"]))
        tp = C.start(job(d, [*TRAINERS["1ms"], "--seconds", "600"], "t-arrival",
                         "--priority", "low"), env)
        waits, device = [], []
        try:
            time.sleep(3.0)
            for i in range(args.arrivals):
                r = C.run(job(d, ["--request", "1", "--kernel-us", "100", "--count", "1"],
                              f"a{i}", "--priority", "high"), env, 120)
                j = r.json or {}
                if r.rc == 0 and j.get("latency_ms"):
                    # the host's time from the launch to the wait's return, less the
                    # kernel: a GPU stamps the request's first event only once its
                    # context runs, so events would hide the wait for a slice
                    waits.append(j["latency_ms"][0] - 0.1)
                    device.append(j["first_ms"][0] - 0.1)
                time.sleep(0.3)
        finally:
            C.stop(tp)
        figs["arrival_waits_ms"] = waits
        figs["arrival_device_waits_ms"] = device
        res.add(C.judged("arrival", "a high job's first kernel runs within 2 ms of its launch "
                         "on a GPU a low trainer fills (p99; the host's time to its end, "
                         "less the kernel)",
                         bool(waits) and pct(waits, 99) <= 2.0,
                         {"p50": pct(waits, 50), "p99": pct(waits, 99), "n": len(waits),
                          "device_p50": pct(device, 50), "device_p99": pct(device, 99)}))
        solo = figs["1ms_alone_rate"]
        b = C.start(job(d, [*TRAINERS["1ms"], "--seconds", f"{S + 10:g}"], "greedy"), env)
        try:
            time.sleep(1.0)
            rate = trainer_rate("1ms", "--core", "20", "--policy", "hard", seconds=S)
        finally:
            C.stop(b)
        share = 100 * rate / solo if solo else 0.0
        figs["promise_share_pct"] = share
        res.add(C.judged("promise", "a hard --core 20 job next to a neighbour with no --core "
                         "gets 20 +- 2 % (its kernels against alone)", abs(share - 20) <= 2,
                         round(share, 2)))

    return C.run_step(res, args.out, body)


if __name__ == "__main__":
    sys.exit(main())
