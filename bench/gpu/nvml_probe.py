"""Real-GPU probe (issue 15): what NVML's per-process utilization returns
under known duty cycles, recorded raw, so that the simulated GPU's model can
be fitted to a real driver.

    python3 bench/gpu/nvml_probe.py [--out DIR] [--seconds 10] [--tail 2]
                                    [--only CASE,...] [--device 0]
    python3 bench/gpu/nvml_probe.py --show nvml_probe.json   (summarise a run)

Cases, each a set of job_duty.py processes run bare (no vgpuctl, no daemon),
busy DUTY % of every CYCLE with spin kernels of 5 ms on every SM:

  idle            no workload (--idle-seconds)
  solo30          one process, 30 % of 50 ms cycles
  solo60          one process, 60 %
  solo100         one process, 100 %
  solo30-slow     one process, 30 % of 2 s cycles: whole sample periods idle
  trio30          three processes, 30 % each
  trio100         three processes, 100 % each
  solo100-1block  one process, 100 %, one block per kernel (vgpu-burn's shape)

While a case runs, from before its processes start until --tail seconds
after they end, this process (not a workload) polls NVML every 0.1 s:

  pu@W    nvmlDeviceGetProcessUtilization every W s (0.1, 0.5, 2), lastSeen
          the newest timestamp the stream's previous read returned (its
          first read: now - W); pu@0: lastSeen = 0, every 1 s
  pui@W   the same through nvmlDeviceGetProcessesUtilizationInfo, where the
          driver has it
  rates   nvmlDeviceGetUtilizationRates every 0.1 s
  samples nvmlDeviceGetSamples(GPU_UTILIZATION_SAMPLES) every 1 s

Every call is kept as made: host time, lastSeen passed, the size query's
return code and count, the read's return code (NOT_FOUND included) and count,
and every entry as returned. Which NVML pids are the case's processes is
matched by pid, or, when NVML sees other pids (a pid namespace), by the
device memory each process allocates (256 MiB times its rank).

Writes nvml_probe.json and prints a summary per case. Its checks only say
that the workloads ran (a solo process within ±5 points of its duty, by
events) and that NVML was read; what NVML returned is data, not judged. See
docs/gpu-proof.md for how to read it and fit the simulator to it.
"""

from __future__ import annotations

import argparse
import ctypes
import importlib.metadata
import itertools
import json
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common as C

WINDOWS = (0.1, 0.5, 2.0)
TICK_S = 0.1
EVERY_S_LAST_SEEN_0 = 1.0
MAX_ENTRIES = 200_000          # kept over the whole run (about 10 MB of JSON)
ALLOC_STEP_MIB = 256
API_NAMES = {"pu": "nvmlDeviceGetProcessUtilization",
             "pui": "nvmlDeviceGetProcessesUtilizationInfo", "samples": "nvmlDeviceGetSamples"}
ENTRY_FIELDS = {
    "pu": ["pid", "timeStamp", "smUtil", "memUtil", "encUtil", "decUtil"],
    "pui": ["pid", "timeStamp", "smUtil", "memUtil", "encUtil", "decUtil", "jpgUtil",
            "ofaUtil"],
}


@dataclass(frozen=True)
class Worker:
    duty: float
    cycle_ms: float = 50.0
    blocks: int = 0               # 0: one per SM


@dataclass(frozen=True)
class Case:
    name: str
    workers: tuple[Worker, ...]
    what: str


CASES = (
    Case("idle", (), "no workload"),
    Case("solo30", (Worker(30),), "one process, 30 % of 50 ms cycles"),
    Case("solo60", (Worker(60),), "one process, 60 % of 50 ms cycles"),
    Case("solo100", (Worker(100),), "one process, 100 %"),
    Case("solo30-slow", (Worker(30, 2000),), "one process, 30 % of 2 s cycles"),
    Case("trio30", (Worker(30),) * 3, "three processes, 30 % of 50 ms cycles each"),
    Case("trio100", (Worker(100),) * 3, "three processes, 100 % each"),
    Case("solo100-1block", (Worker(100, blocks=1),), "one process, 100 %, one block a kernel"),
)


# ---- NVML, called as a reader calls it --------------------------------------------


class Nvml:
    """pynvml's library, called by hand where pynvml's wrapper would hide
    what the driver said: the size query's count and return code, a
    NOT_FOUND, the count the read returns."""

    def __init__(self, device: int) -> None:
        C.sim.use_in_process()
        import pynvml

        self.nv = pynvml
        pynvml.nvmlInit()
        self.handle = pynvml.nvmlDeviceGetHandleByIndex(device)
        self.names = {int(v): k.removeprefix("NVML_ERROR_").removeprefix("NVML_")
                      for k, v in vars(pynvml).items()
                      if (k.startswith("NVML_ERROR_") or k == "NVML_SUCCESS")
                      and isinstance(v, int)}

    def close(self) -> None:
        try:
            self.nv.nvmlShutdown()
        except self.nv.NVMLError:
            pass

    def rc(self, code: int) -> str:
        return self.names.get(int(code), str(int(code)))

    def _fn(self, name: str) -> Any:
        return self.nv._nvmlGetFunctionPointer(name)   # raises NVMLError FUNCTION_NOT_FOUND

    def info(self) -> dict[str, Any]:
        nv, h = self.nv, self.handle
        out: dict[str, Any] = {}
        for key, get in (("name", lambda: nv.nvmlDeviceGetName(h)),
                         ("uuid", lambda: nv.nvmlDeviceGetUUID(h)),
                         ("driver", nv.nvmlSystemGetDriverVersion),
                         ("nvml_version", nv.nvmlSystemGetNVMLVersion),
                         ("cuda_driver", nv.nvmlSystemGetCudaDriverVersion)):
            try:
                out[key] = C._s(get())
            except nv.NVMLError as e:
                out[key] = f"error: {self.rc(e.value)}"
        try:
            out["nvidia_ml_py"] = importlib.metadata.version("nvidia-ml-py")
        except importlib.metadata.PackageNotFoundError:
            out["nvidia_ml_py"] = None
        for fn in ("nvmlDeviceGetProcessUtilization", "nvmlDeviceGetProcessesUtilizationInfo",
                   "nvmlDeviceGetSamples"):
            try:
                self._fn(fn)
                out[fn] = True
            except nv.NVMLError:
                out[fn] = False
        return out

    def process_utilization(self, last_seen: int) -> dict[str, Any]:
        """nvmlDeviceGetProcessUtilization(dev, NULL, &n, lastSeen) for the
        size, then with a buffer of n + 4 (again, larger, if the count grew
        between the two)."""
        nv = self.nv
        fn = self._fn("nvmlDeviceGetProcessUtilization")
        ts = ctypes.c_ulonglong(last_seen)
        count = ctypes.c_uint(0)
        rc0 = fn(self.handle, None, ctypes.byref(count), ts)
        rec: dict[str, Any] = {"size_rc": self.rc(rc0), "size_count": count.value}
        if rc0 != nv.NVML_ERROR_INSUFFICIENT_SIZE:
            rec.update(rc=self.rc(rc0), count=0, entries=[])
            return rec
        for _ in range(3):
            n = count.value + 4
            buf = (nv.c_nvmlProcessUtilizationSample_t * n)()
            count = ctypes.c_uint(n)
            rc = fn(self.handle, buf, ctypes.byref(count), ts)
            if rc != nv.NVML_ERROR_INSUFFICIENT_SIZE:
                break
        rec.update(rc=self.rc(rc), count=count.value)
        rec["entries"] = ([[s.pid, s.timeStamp, s.smUtil, s.memUtil, s.encUtil, s.decUtil]
                           for s in buf[:min(count.value, n)]] if rc == nv.NVML_SUCCESS else [])
        return rec

    def processes_utilization_info(self, last_seen: int) -> dict[str, Any]:
        """nvmlDeviceGetProcessesUtilizationInfo, size query then read, as
        above; `out_last_seen` is the struct's lastSeenTimeStamp after the
        read (the driver may write it)."""
        nv = self.nv
        fn = self._fn("nvmlDeviceGetProcessesUtilizationInfo")
        info = nv.c_nvmlProcessesUtilizationInfo_v1_t()
        info.version = nv.ProcessesUtilizationInfo_v1
        info.processSamplesCount = 0
        info.lastSeenTimeStamp = last_seen
        rc0 = fn(self.handle, ctypes.byref(info))
        rec: dict[str, Any] = {"size_rc": self.rc(rc0), "size_count": info.processSamplesCount}
        if rc0 != nv.NVML_ERROR_INSUFFICIENT_SIZE:
            rec.update(rc=self.rc(rc0), count=0, entries=[])
            return rec
        for _ in range(3):
            n = info.processSamplesCount + 4
            buf = (nv.c_nvmlProcessUtilizationInfo_v1_t * n)()
            info.procUtilArray = buf
            info.processSamplesCount = n
            info.lastSeenTimeStamp = last_seen
            rc = fn(self.handle, ctypes.byref(info))
            if rc != nv.NVML_ERROR_INSUFFICIENT_SIZE:
                break
        k = min(info.processSamplesCount, n)
        rec.update(rc=self.rc(rc), count=info.processSamplesCount,
                   out_last_seen=info.lastSeenTimeStamp)
        rec["entries"] = ([[s.pid, s.timeStamp, s.smUtil, s.memUtil, s.encUtil, s.decUtil,
                            s.jpgUtil, s.ofaUtil] for s in buf[:k]]
                          if rc == nv.NVML_SUCCESS else [])
        return rec

    def samples(self, last_seen: int) -> dict[str, Any]:
        """nvmlDeviceGetSamples(GPU_UTILIZATION_SAMPLES): the device's own
        sample buffer, [timeStamp, value] each."""
        nv = self.nv
        vtype, samples = nv.nvmlDeviceGetSamples(self.handle, nv.NVML_GPU_UTILIZATION_SAMPLES,
                                                 last_seen)
        field = ("dVal", "uiVal", "ulVal", "ullVal", "sllVal", "siVal", "usVal")[int(vtype)]
        return {"rc": "SUCCESS", "count": len(samples),
                "entries": [[s.timeStamp, getattr(s.sampleValue, field)] for s in samples]}

    def rates(self) -> list[Any]:
        try:
            u = self.nv.nvmlDeviceGetUtilizationRates(self.handle)
        except self.nv.NVMLError as e:
            return [self.rc(e.value), None, None]
        return ["SUCCESS", int(u.gpu), int(u.memory)]

    def running(self) -> list[list[int]]:
        """[pid, used bytes] of the compute processes NVML lists."""
        try:
            procs = self.nv.nvmlDeviceGetComputeRunningProcesses(self.handle)
        except self.nv.NVMLError:
            return []
        return [[int(p.pid), int(p.usedGpuMemory or 0)] for p in procs]


# ---- the reader ----------------------------------------------------------------------

class EntryBudget:
    """How many entries the whole run keeps: a driver that returns long
    buffers of stale entries must not make the file too large to hand back."""

    def __init__(self, limit: int = MAX_ENTRIES) -> None:
        self.left = limit

    def take(self, n: int) -> bool:
        if n > self.left:
            return False
        self.left -= n
        return True


@dataclass
class Stream:
    """One reader: an API read at one interval with its own lastSeen."""

    name: str                     # pu@0.1, pui@2, pu@0, samples, ...
    api: str                      # pu | pui | samples
    window_s: float | None        # None: lastSeen = 0 on every call
    every: int                    # ticks
    budget: EntryBudget
    last_seen: int | None = None
    available: bool = True
    calls: list[dict[str, Any]] = field(default_factory=list)

    def read(self, nvml: Nvml) -> None:
        if not self.available:
            return
        now = time.time()
        if self.window_s is None:
            last_seen = 0
        elif self.last_seen is None:
            last_seen = int((now - self.window_s) * 1e6) if self.api != "samples" else 0
            # kept until a read returns something: a stream whose reads came
            # each just before a period was published would otherwise never
            # see one (the simulator publishes every period 25 ms after it)
            self.last_seen = last_seen
        else:
            last_seen = self.last_seen
        t0 = time.perf_counter()
        try:
            if self.api == "pu":
                rec = nvml.process_utilization(last_seen)
            elif self.api == "pui":
                rec = nvml.processes_utilization_info(last_seen)
            else:
                rec = nvml.samples(last_seen)
        except nvml.nv.NVMLError as e:     # NOT_FOUND from pynvml's wrapper, or no such function
            rec = {"rc": nvml.rc(e.value), "count": 0, "entries": []}
            if e.value == nvml.nv.NVML_ERROR_FUNCTION_NOT_FOUND:
                self.available = False
        except AttributeError as e:         # an nvidia-ml-py without this struct or call
            rec = {"rc": None, "error": f"{type(e).__name__}: {e}", "entries": []}
            self.available = False
        except Exception as e:  # noqa: BLE001 - kept as what the call did
            rec = {"rc": None, "error": f"{type(e).__name__}: {e}", "entries": []}
        rec = {"t": round(now, 6), "ms": round((time.perf_counter() - t0) * 1000, 3),
               "last_seen": last_seen, **rec}
        entries = rec["entries"]
        if entries:
            newest = max(e[0] if self.api == "samples" else e[1] for e in entries)
            self.last_seen = max(newest, self.last_seen or 0)
        if not self.budget.take(len(entries)):
            rec["entries"] = []
            rec["entries_dropped"] = len(entries)
        self.calls.append(rec)

    def to_json(self) -> dict[str, Any]:
        return {"api": self.api, "window_s": self.window_s,
                "every_s": round(self.every * TICK_S, 3), "available": self.available,
                "calls": self.calls}


def streams(budget: EntryBudget) -> list[Stream]:
    out: list[Stream] = []
    every_0 = round(EVERY_S_LAST_SEEN_0 / TICK_S)
    for api in ("pu", "pui"):
        for w in WINDOWS:
            out.append(Stream(f"{api}@{w:g}", api, w, round(w / TICK_S), budget))
        out.append(Stream(f"{api}@0", api, None, every_0, budget))
    out.append(Stream("samples", "samples", EVERY_S_LAST_SEEN_0, every_0, budget))
    return out


class Reader(threading.Thread):
    """Every TICK_S: the streams due, and the utilization rates."""

    def __init__(self, nvml: Nvml, budget: EntryBudget) -> None:
        super().__init__(daemon=True)
        self.nvml = nvml
        self.streams = streams(budget)
        self.rates: list[list[Any]] = []
        self.halt = threading.Event()

    def run(self) -> None:
        t0 = time.monotonic()
        k = 0
        while not self.halt.is_set():
            for s in self.streams:
                if k % s.every == 0:
                    s.read(self.nvml)
            self.rates.append([round(time.time(), 6), *self.nvml.rates()])
            k = max(k + 1, int((time.monotonic() - t0) / TICK_S))   # behind: skip, don't bunch
            self.halt.wait(max(0.0, t0 + k * TICK_S - time.monotonic()))

    def finish(self) -> dict[str, Any]:
        self.halt.set()
        self.join(30)
        return {"streams": {s.name: s.to_json() for s in self.streams}, "rates": self.rates}


# ---- a case ----------------------------------------------------------------------------

def worker_argv(w: Worker, rank: int, args: argparse.Namespace, barrier: C.Barrier,
                name: str) -> list[str]:
    return [C.PY, C.job_program("job_duty.py"), "--duty", f"{w.duty:g}",
            "--cycle-ms", f"{w.cycle_ms:g}", "--kernel-ms", f"{args.kernel_ms:g}",
            "--blocks", str(w.blocks), "--seconds", f"{args.seconds:g}",
            "--alloc-mib", str(ALLOC_STEP_MIB * (rank + 1)), "--device", str(args.device),
            *barrier.args(name)]


def match_pids(ours: dict[int, str], before: list[list[int]], during: list[list[int]],
               alloc: dict[str, int]) -> dict[str, dict[str, Any]]:
    """NVML pid -> our worker. By pid where NVML lists ours; else, when NVML
    lists exactly as many new pids as we started, by the memory each uses
    (the workers allocate different amounts)."""
    listed = {p for p, _ in during}
    out = {str(p): {"worker": n, "how": "pid"} for p, n in ours.items() if p in listed}
    if len(out) == len(ours):
        return out
    old = {p for p, _ in before}
    new = sorted(((used, p) for p, used in during if p not in old and p not in ours))
    if len(new) == len(ours):
        names = sorted(ours.values(), key=lambda n: alloc[n])
        return {str(p): {"worker": n, "how": "memory"} for (_, p), n in zip(new, names,
                                                                             strict=True)}
    return out


def worker_record(name: str, w: Worker, r: C.Ran, pid: int) -> dict[str, Any]:
    return {"name": name, "pid": pid, "duty": w.duty, "cycle_ms": w.cycle_ms, "rc": r.rc,
            "result": r.json or {}, "stderr": C.tail(r.stderr, 1500)}


def run_case(nvml: Nvml, case: Case, args: argparse.Namespace, tmp: Path,
             budget: EntryBudget, rec: dict[str, Any]) -> None:
    """Run the case, filling rec; what was read, and what the workers
    said, is in rec even when the case fails or is stopped."""
    reader = Reader(nvml, budget)
    procs: list[tuple[str, Any, list[str]]] = []
    rec["running_before"] = nvml.running()
    reader.start()
    rec["reader_start"] = round(time.time(), 6)
    try:
        if not case.workers:
            time.sleep(args.idle_seconds)
            rec["go"] = rec["reader_start"]
            rec["end"] = round(time.time(), 6)
            return
        barrier = C.Barrier(tmp)
        env = C.base_env()
        alloc: dict[str, int] = {}
        for rank, w in enumerate(case.workers):
            name = f"{case.name}-{rank}"
            argv = worker_argv(w, rank, args, barrier, name)
            alloc[name] = ALLOC_STEP_MIB * (rank + 1)
            procs.append((name, C.start(argv, env), argv))
        barrier.wait_ready([n for n, _, _ in procs], [p for _, p, _ in procs], 180)
        rec["running_during"] = nvml.running()
        ours = {p.pid: n for n, p, _ in procs}
        rec["pid_map"] = match_pids(ours, rec["running_before"], rec["running_during"], alloc)
        barrier.go()
        rec["go"] = round(time.time(), 6)
        for (name, p, argv), w in zip(procs, case.workers, strict=True):
            rec["workers"].append(worker_record(name, w, C.finish(p, argv, args.seconds + 60),
                                                p.pid))
        rec["end"] = round(time.time(), 6)
        time.sleep(args.tail)
    finally:
        done = {w["name"] for w in rec["workers"]}
        for (name, p, argv), w in zip(procs, case.workers, strict=False):
            if name not in done:                # the case failed or was stopped
                C.stop(p)
                rec["workers"].append(worker_record(name, w, C.finish(p, argv, 10), p.pid))
        rec.update(reader.finish())
        rec["reader_end"] = round(time.time(), 6)
        rec["running_after"] = nvml.running()
        rec.setdefault("end", rec["reader_end"])


# ---- what the calls say (pure: runs again on a saved file with --show) --------------

def median(xs: Sequence[float]) -> float | None:
    return statistics.median(xs) if xs else None


def mean(xs: Sequence[float]) -> float | None:
    return statistics.fmean(xs) if xs else None


def r1(x: float | None) -> float | None:
    return None if x is None else round(x, 1)


def case_end(case: dict[str, Any]) -> float:
    """When the first of the case's workers stopped working."""
    ends = [w["result"]["go"] + w["result"]["seconds"] for w in case.get("workers", [])
            if (w.get("result") or {}).get("seconds") is not None]
    return min(ends) if ends else case["end"]


def steady(calls: list[dict[str, Any]], go: float, end: float,
           window: float | None) -> tuple[list[dict[str, Any]], bool]:
    """The calls whose whole window lies in the workers' run (a lastSeen = 0
    call: its second half); all calls of the run if none does."""
    span = end - go
    w = window if window is not None else span / 2
    start = go + min(1.0, span / 4) + w
    inside = [c for c in calls if start <= c["t"] <= end]
    if inside:
        return inside, True
    return [c for c in calls if go <= c["t"] <= end], False


def stream_summary(s: dict[str, Any], pids: Sequence[int], go: float, end: float
                   ) -> dict[str, Any]:
    calls = s["calls"]
    rcs: dict[str, int] = {}
    for c in calls:
        rcs[str(c.get("rc"))] = rcs.get(str(c.get("rc")), 0) + 1
    out: dict[str, Any] = {"calls": len(calls), "rc": rcs}
    ok = [c for c in calls if c.get("rc") == "SUCCESS"]
    out["entries_per_call"] = r1(mean([len(c["entries"]) for c in ok]))
    out["max_entries"] = max((len(c["entries"]) for c in ok), default=0)
    st, is_steady = steady(calls, go, end, s.get("window_s"))
    out["steady_calls"] = len(st) if is_steady else 0
    st = [c for c in st if c.get("rc") == "SUCCESS"]   # NOT_FOUND: nothing new, not idle
    per: dict[str, Any] = {}
    for pid in pids:
        mine = [[e for e in c["entries"] if e[0] == pid] for c in st]
        present = [m for m in mine if m]
        stamps = sorted({e[1] for c in calls for e in c["entries"] if e[0] == pid})
        gaps = [(b - a) / 1000 for a, b in itertools.pairwise(stamps)]
        seen = [c["t"] for c in calls if any(e[0] == pid for e in c["entries"])]
        lag = [c["t"] * 1000 - max(e[1] for e in m) / 1000
               for c, m in zip(st, mine, strict=True) if m]
        per[str(pid)] = {
            "present": f"{len(present)}/{len(st)}",
            "entries_per_call": r1(mean([len(m) for m in present])),
            "entry_mean": r1(mean([e[2] for m in present for e in m])),
            "call_mean": r1(mean([mean([e[2] for e in m]) or 0.0 for m in mine])),
            "call_sum": r1(mean([sum(e[2] for e in m) for m in present])),
            "ts_spacing_ms": r1(median(gaps)),
            "min_ts_spacing_ms": r1(min(gaps, default=None)),
            "lag_ms": r1(median(lag)),
            "first_seen_after_go_s": r1(seen[0] - go) if seen else None,
            "last_seen_after_end_s": r1(seen[-1] - end) if seen else None,
        }
    out["pids"] = per
    others = {e[0] for c in calls for e in c["entries"] if e[0] not in pids}
    if others:
        out["other_pids"] = sorted(others)[:20]
    return out


def complete(case: dict[str, Any]) -> bool:
    """The case got as far as its go, and its reads were kept."""
    return "go" in case and "streams" in case


def case_summary(case: dict[str, Any]) -> dict[str, Any]:
    pid_map = case.get("pid_map") or {}
    pids = sorted(int(p) for p in pid_map)
    go = case["go"]
    end = case_end(case)
    out: dict[str, Any] = {"workers": {}}
    for w in case.get("workers", []):
        res = w.get("result") or {}
        nvml_pid = next((int(p) for p, m in pid_map.items() if m["worker"] == w["name"]), None)
        out["workers"][w["name"]] = {"pid": w["pid"], "nvml_pid": nvml_pid, "duty": w["duty"],
                                     "cycle_ms": w["cycle_ms"], "busy_pct": res.get("busy_pct"),
                                     "rc": w["rc"], "error": res.get("error")}
    out["streams"] = {name: stream_summary(s, pids, go, end)
                      for name, s in case["streams"].items()
                      if s["api"] != "samples" and s["available"]}
    rates = [r[2] for r in case.get("rates", []) if r[1] == "SUCCESS" and go + 1 <= r[0] <= end]
    out["utilization_rates_gpu_mean"] = r1(mean(rates))
    out["idle_periods"] = idle_verdict(out)
    return out


def idle_verdict(summary: dict[str, Any]) -> str | None:
    """A one-process case below 100 %: do 2 s reads come out near the duty
    (idle sample periods averaged in) or well above it (skipped)? Only a
    cycle longer than the sample period has whole idle periods to tell."""
    ws = list(summary["workers"].values())
    if len(ws) != 1 or ws[0]["duty"] >= 100 or ws[0]["nvml_pid"] is None:
        return None
    duty = ws[0]["busy_pct"] or ws[0]["duty"]
    for api in ("pui", "pu"):
        s = summary["streams"].get(f"{api}@2")
        if not s or not s["steady_calls"]:
            continue
        v = s["pids"][str(ws[0]["nvml_pid"])]["call_mean"]
        if v is None:
            continue
        if abs(v - duty) <= 10:
            how = "averaged in (or no idle period in a sample)"
        elif v >= duty + 20:
            how = "skipped"
        else:
            how = "unclear"
        return f"{api}@2 reads {v:g} for a {duty:g} % duty: idle periods look {how}"
    return None


def sample_period(cases: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The sample period, inferred two ways: the spacing of the device's own
    samples (nvmlDeviceGetSamples), and of one process's timestamps in the
    0.1 s reads of the busy cases (a process busy in every period)."""
    dev: list[float] = []
    proc: list[float] = []
    for case in cases.values():
        if not complete(case):
            continue
        s = case["streams"].get("samples")
        if s:
            stamps = sorted({e[0] for c in s["calls"] for e in c["entries"]})
            dev += [(b - a) / 1000 for a, b in itertools.pairwise(stamps)]
        summ = case.get("summary") or case_summary(case)
        busy = [w for w in summ["workers"].values() if w["duty"] >= 60 and w["cycle_ms"] <= 100]
        if not busy:
            continue
        for name in ("pu@0.1", "pui@0.1"):
            for per in (summ["streams"].get(name) or {}).get("pids", {}).values():
                if per["ts_spacing_ms"] is not None:
                    proc.append(per["ts_spacing_ms"])
    return {"from_nvmlDeviceGetSamples_ms": r1(median(dev)),
            "from_process_timestamps_ms": r1(median(proc))}


def print_summary(name: str, case: dict[str, Any]) -> None:
    summ = case["summary"]
    print(f"\n-- {name}: {case['what']}")
    for wn, w in summ["workers"].items():
        print(f"   {wn}: pid {w['pid']} (NVML pid {w['nvml_pid']}), duty {w['duty']:g} % of "
              f"{w['cycle_ms']:g} ms, busy {w['busy_pct']} % by events, rc {w['rc']}"
              + (f", error {w['error']}" if w["error"] else ""))
    pids = sorted({p for s in summ["streams"].values() for p in s["pids"]}, key=int)

    def per(s: dict[str, Any], key: str) -> str:
        return "/".join("-" if s["pids"][p][key] is None else f"{s['pids'][p][key]:g}"
                        for p in pids) or "-"

    print(f"   {'stream':8} {'calls':>5} {'return codes':28} {'ent/call':>8} "
          f"{'pid ent/call':>12} {'entry mean':>10} {'call mean':>10} {'call sum':>9} "
          f"{'ts gap ms':>9} {'lag ms':>7}")
    for sn, s in summ["streams"].items():
        rcs = ",".join(f"{k}:{v}" for k, v in s["rc"].items())
        ent = "-" if s["entries_per_call"] is None else f"{s['entries_per_call']:g}"
        print(f"   {sn:8} {s['calls']:>5} {rcs[:28]:28} {ent:>8} "
              f"{per(s, 'entries_per_call'):>12} {per(s, 'entry_mean'):>10} "
              f"{per(s, 'call_mean'):>10} {per(s, 'call_sum'):>9} "
              f"{per(s, 'ts_spacing_ms'):>9} {per(s, 'lag_ms'):>7}")
        if s.get("other_pids"):
            print(f"            other pids in the entries: {s['other_pids']}")
    first = summ["streams"].get("pu@0.1", {}).get("pids", {})
    for p, v in first.items():
        print(f"   pid {p} in pu@0.1: first seen {v['first_seen_after_go_s']} s after the go, "
              f"last seen {v['last_seen_after_end_s']} s after its end")
    print(f"   utilization rates (gpu) mean: {summ['utilization_rates_gpu_mean']}")
    missing = sorted({API_NAMES[s["api"]] for s in case["streams"].values()
                      if not s["available"]})
    if missing:
        print(f"   not available (driver or nvidia-ml-py): {', '.join(missing)}")
    if summ["idle_periods"]:
        print(f"   {summ['idle_periods']}")


# ---- checks ------------------------------------------------------------------------

def judge(res: C.StepResult, name: str, case: dict[str, Any], tolerance: float) -> None:
    summ = case["summary"]
    pu = summ["streams"].get("pu@0.1") or {}
    read = any(k in ("SUCCESS", "NOT_FOUND") for k in pu.get("rc", {}))
    if name == "idle":
        res.add(C.judged(name, "NVML's per-process utilization answers with no workload "
                         "(SUCCESS or NOT_FOUND)", read, {"rc": pu.get("rc"),
                                                         "pids": pu.get("other_pids")}))
        return
    ws = list(summ["workers"].values())
    ran = all(w["rc"] == 0 for w in ws)
    on_duty = len(ws) > 1 or all(abs((w["busy_pct"] or 0) - w["duty"]) <= tolerance for w in ws)
    matched = all(w["nvml_pid"] is not None for w in ws)
    two = summ["streams"].get("pu@2", {}).get("pids", {})
    fast = summ["streams"].get("pu@0.1", {}).get("pids", {})
    measured = {
        "busy_pct": [w["busy_pct"] for w in ws],
        "pu@2_call_mean": [two.get(str(w["nvml_pid"]), {}).get("call_mean") for w in ws],
        "pu@0.1_entries_per_call": [fast.get(str(w["nvml_pid"]), {}).get("entries_per_call")
                                    for w in ws],
    }
    detail = "" if matched else "NVML's pids could not be matched with the workers'"
    claim = ("the workers ran to their end" + ("" if len(ws) > 1 else
             f", busy within ±{tolerance:g} points of the duty by events")
             + ", and NVML was read")
    res.add(C.judged(name, claim, ran and on_duty and read, measured, detail))


# ---- the run -------------------------------------------------------------------------

def tidy_json(v: Any, indent: int = 0, width: int = 160) -> str:
    """JSON with every small or flat value on one line, so a file of
    thousands of calls stays readable and a few MB."""
    flat = json.dumps(v, default=str, separators=(",", ":"))
    if not isinstance(v, dict | list) or len(flat) <= width or (
            isinstance(v, list) and not any(isinstance(x, dict | list) for x in v)):
        return flat
    pad = " " * (indent + 1)
    if isinstance(v, dict):
        body = [f"{pad}{json.dumps(str(k))}: {tidy_json(x, indent + 1, width)}"
                for k, x in v.items()]
        return "{\n" + ",\n".join(body) + "\n" + " " * indent + "}"
    body = [pad + tidy_json(x, indent + 1, width) for x in v]
    return "[\n" + ",\n".join(body) + "\n" + " " * indent + "]"


class ProbeResult(C.StepResult):
    def write(self, out_dir: Path | str) -> Path:
        """As StepResult writes, then again, tidier: its one-number-a-line
        layout would make the raw calls tens of MB."""
        path = super().write(out_dir)
        tmp = path.with_suffix(".json.tmp")
        tmp.write_text(tidy_json(json.loads(path.read_text())) + "\n")
        os.replace(tmp, path)
        return path


def probe(res: C.StepResult, args: argparse.Namespace, cases: Iterable[Case]) -> None:
    nvml = Nvml(args.device)
    out_cases: dict[str, Any] = {}
    res.figures["nvml"] = nvml.info()
    res.figures["entry_fields"] = ENTRY_FIELDS
    res.figures["cases"] = out_cases
    nv = res.figures["nvml"]
    print(f"nvml_probe: {nv.get('name')}, driver {nv.get('driver')}, NVML "
          f"{nv.get('nvml_version')}, nvidia-ml-py {nv.get('nvidia_ml_py')}; "
          f"{args.seconds:g} s per case + {args.tail:g} s tail", flush=True)
    tmp = Path(tempfile.mkdtemp(prefix="vgpu-nvml-probe-"))
    budget = EntryBudget()
    try:
        for case in cases:
            print(f"== {case.name}: {case.what}", flush=True)
            rec = out_cases[case.name] = {"what": case.what, "workers": []}
            try:
                run_case(nvml, case, args, tmp, budget, rec)
            except C.Terminated:
                rec["interrupted"] = "SIGTERM"
                raise
            except Exception as e:  # noqa: BLE001 - one case failing does not end the probe
                rec["error"] = f"{type(e).__name__}: {e}"
                res.add(C.errored(case.name, "the case ran", rec["error"]))
                continue
            rec["summary"] = case_summary(rec)
            print_summary(case.name, rec)
            judge(res, case.name, rec, args.tolerance)
        res.figures["sample_period"] = sample_period(out_cases)
        print(f"\nsample period: {res.figures['sample_period']}", flush=True)
    finally:
        nvml.close()
        shutil.rmtree(tmp, ignore_errors=True)


def show(path: Path) -> int:
    data = json.loads(path.read_text())
    dev = data.get("device") or {}
    nv = (data.get("figures") or {}).get("nvml") or {}
    print(f"{path.name}: {nv.get('name')} driver {nv.get('driver')} "
          f"({'SIMULATED' if dev.get('simulated') else 'real'}), {data.get('date')}")
    cases = (data.get("figures") or {}).get("cases") or {}
    for name, case in cases.items():
        if not complete(case):
            print(f"\n-- {name}: not complete ({case.get('error') or case.get('interrupted')})")
            continue
        case["summary"] = case_summary(case)
        print_summary(name, case)
    print(f"\nsample period: {sample_period(cases)}")
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=str(C.DEFAULT_OUT))
    ap.add_argument("--seconds", type=float, default=10.0, help="each case's workers run this long")
    ap.add_argument("--tail", type=float, default=2.0, help="reading on after they end")
    ap.add_argument("--idle-seconds", type=float, default=3.0, help="the idle case's length")
    ap.add_argument("--kernel-ms", type=float, default=5.0, help="one spin kernel's length")
    ap.add_argument("--only", help="comma-separated cases: " + ",".join(c.name for c in CASES))
    ap.add_argument("--device", type=int, default=0, help="GPU index (NVML and the driver)")
    ap.add_argument("--tolerance", type=float, default=5.0, help="solo busy %% vs duty, points")
    ap.add_argument("--show", metavar="FILE", help="print the summary of a recorded run")
    args = ap.parse_args(argv)
    if args.show:
        return show(Path(args.show))
    names = [c.name for c in CASES]
    only = [n.strip() for n in (args.only or ",".join(names)).split(",") if n.strip()]
    bad = [n for n in only if n not in names]
    if bad:
        ap.error(f"--only: unknown {bad}; choose from {', '.join(names)}")
    res = ProbeResult("nvml_probe", {k: v for k, v in vars(args).items()
                                     if k not in ("out", "show")})
    if not C.cuda_bindings_installed():
        for n in only:
            res.add(C.skipped(n, "the case ran", "cuda-bindings not installed")
                    if n != "idle" else C.skipped(n, "NVML answers", "not run without workers"))
        res.write(args.out)
        return 0
    C.exit_cleanly_on_sigterm()
    try:
        probe(res, args, [c for c in CASES if c.name in only])
    except C.Terminated:
        res.add(C.errored("harness", "the probe ran to its end",
                          "stopped by SIGTERM (run_all.sh's time limit?)"))
        raise
    except Exception as e:  # noqa: BLE001 - recorded; the probe still writes its JSON
        res.add(C.errored("harness", "the probe ran to its end", f"{type(e).__name__}: {e}"))
    finally:
        res.write(args.out)
    return res.exit_code()


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
