"""Proof step, probe: what a GPU does between CUDA contexts, as the contexts'
own CUDA events (and %globaltimer, read by the kernels) see it. The facts
the time-turn design of compute shares rests on: a job holds the GPU in
turns, times its own GPU time with events while it holds it, and caps what
it keeps in flight outside its turn.

    python3 bench/gpu/probe.py [--out DIR] [--seconds 1.5] [--kernel-us 100]
                               [--only solo,pair,trio,spans,copy,cupti] [--device 0]

Processes are run bare (no vgpuctl, no daemon), each in its own context,
started together behind a barrier. Driver API through cuda-bindings; the
kernel is vgpu-burn's PTX spin on %globaltimer (libvgpu/tools/vgpu_burn.c),
plus `vgpu_spin_stamp`, the same spin that also writes, per kernel, the
%globaltimer at its start and end and the largest jump between two of its
reads (where the GPU took it off), so a real GPU's timeline of several
contexts can be merged on one clock. (The simulated GPU runs any
`vgpu_spin*` kernel for its first argument's nanoseconds and writes
nothing: there the timeline comes from events alone.)

Cases:

  solo    one process, --kernel-us (100) spin kernels back to back for a
          third of --seconds, an event after each (at most --inflight, 256,
          queued): the baseline rate and the gaps a context alone sees
  pair    two such processes for --seconds: where one process's events jump
          by more than a kernel, another context held the GPU. Its runs (a
          turn: kernels back to back) give the time slice, the jumps less
          the other's turn the switch, and the merged timeline (globaltimer,
          else events placed on the host's CLOCK_MONOTONIC) the idle gaps
          between one context's last kernel and the next one's first (the
          switch: the mean of each direction's median, which cancels what
          tying the processes' clocks together gets wrong)
  trio    the same with three processes
  spans   what cuEventElapsedTime reports for a kernel of known length,
          alone and while another process saturates the GPU (1 ms
          kernels): spin 1 ms and 5 ms (%globaltimer: a preempted spin still
          ends on time), work 1 ms and 5 ms (vgpu-burn's fixed-work
          multiply-adds, calibrated alone: a preempted one still has its
          work to do), and a burst of 10 spin kernels of 100 us
  copy    one process copying --copy-mib (256) MiB host to device
          (cuMemcpyHtoDAsync from pinned memory) in a loop while another
          spins kernels: the kernel process's rate and gaps against solo,
          the copier's GB/s against alone
  cupti   CUPTI's compute-engine context-switch records
          (CUPTI_ACTIVITY_KIND_COMPUTE_ENGINE_CTX_SWITCH, CUPTI 13.1+) of a
          pair, when a libcupti that has them is found on the machine (the
          nvidia-cuda-cupti wheel, torch's, a toolkit's); else "not
          available" and why. Nothing is installed.

Its checks say what was measured (pass), what could not be (error) and
what is not available (skipped); the figures are data, not judged. Exit 0
when anything was measured, 1 when nothing could be (no driver, no
cuda-bindings). Never touches the GPU's settings. Writes probe.json (the
derived figures, each process's runs and its first --raw-kernels kernels
raw). About 40 s on a GPU (most of it processes starting), 10 s on the
simulator.
"""

from __future__ import annotations

import argparse
import ctypes
import glob
import json
import os
import random
import re
import signal
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common as C
import job_util

CASES = ("solo", "pair", "trio", "spans", "copy", "cupti")

# vgpu-burn's kernels (libvgpu/tools/vgpu_burn.c), byte for byte; the
# stamping spin in a module of its own. vgpu_spin_stamp(ns, out): spins like vgpu_spin; then takes
# slot k = atomicAdd(out[0], 1) (kernels of one stream finish in order, so
# slot k is the k-th kernel) and writes at out + 64 + 32 k: its first
# %globaltimer, its last, the largest jump between two reads, and the read
# before that jump (u64 ns each).
BURN_PTX = job_util.SPIN_PTX.decode() + """
.visible .entry vgpu_spin_work(
    .param .u64 vgpu_spin_work_ns,
    .param .u64 vgpu_spin_work_iters,
    .param .u64 vgpu_spin_work_out
)
{
    .reg .pred %p<2>;
    .reg .b64 %rd<5>;
    .reg .f32 %f<2>;

    ld.param.u64 %rd1, [vgpu_spin_work_iters];
    ld.param.u64 %rd3, [vgpu_spin_work_out];
    mov.u64 %rd2, 0;
    mov.f32 %f1, 0f3F800000;
$L_work:
    fma.rn.f32 %f1, %f1, 0f3F7FFFEF, 0f3A83126F;
    add.u64 %rd2, %rd2, 1;
    setp.lt.u64 %p1, %rd2, %rd1;
    @%p1 bra $L_work;
    st.global.f32 [%rd3], %f1;
    ret;
}
"""

STAMP_PTX = """\
.version 7.0
.target sm_50
.address_size 64

.visible .entry vgpu_spin_stamp(
    .param .u64 vgpu_spin_stamp_ns,
    .param .u64 vgpu_spin_stamp_out
)
{
    .reg .pred %p<3>;
    .reg .b32 %r<2>;
    .reg .b64 %rd<12>;

    ld.param.u64 %rd1, [vgpu_spin_stamp_ns];
    ld.param.u64 %rd2, [vgpu_spin_stamp_out];
    cvta.to.global.u64 %rd2, %rd2;
    mov.u64 %rd3, %globaltimer;
    mov.u64 %rd5, %rd3;
    mov.u64 %rd6, 0;
    mov.u64 %rd7, %rd3;
$L_stamp:
    mov.u64 %rd4, %globaltimer;
    sub.u64 %rd8, %rd4, %rd5;
    setp.gt.u64 %p1, %rd8, %rd6;
    selp.b64 %rd6, %rd8, %rd6, %p1;
    selp.b64 %rd7, %rd5, %rd7, %p1;
    mov.u64 %rd5, %rd4;
    sub.s64 %rd9, %rd4, %rd3;
    setp.lt.u64 %p2, %rd9, %rd1;
    @%p2 bra $L_stamp;
    atom.global.add.u32 %r1, [%rd2], 1;
    mul.wide.u32 %rd10, %r1, 32;
    add.s64 %rd11, %rd2, %rd10;
    st.global.u64 [%rd11+64], %rd3;
    st.global.u64 [%rd11+72], %rd4;
    st.global.u64 [%rd11+80], %rd6;
    st.global.u64 [%rd11+88], %rd7;
    ret;
}
"""

STAMP_HEADER = 64      # bytes before the first slot (the counter)
STAMP_SLOT = 32
CUPTI_CTX_SWITCH_DOC = 57   # the enum's place in CUPTI 13.1+'s documented order
CUPTI_MIN_VERSION = 130100


# ---- worker side (a process of its own: `probe.py worker KIND ...`) -----------------

class Dev:
    """One context, one stream, the module, and the checks of every call."""

    def __init__(self, device: int) -> None:
        self.cu = cu = job_util.cuda_driver()
        self.ck(cu.cuInit(0), "cuInit")
        self.dev = self.ck(cu.cuDeviceGet(device), "cuDeviceGet")
        self.ctx = self.ck(cu.cuDevicePrimaryCtxRetain(self.dev), "cuDevicePrimaryCtxRetain")
        self.ck(cu.cuCtxSetCurrent(self.ctx), "cuCtxSetCurrent")
        self.mod = self.ck(cu.cuModuleLoadData(BURN_PTX.encode() + b"\0"), "cuModuleLoadData")
        self.work = self.fn(self.mod, "vgpu_spin_work")
        # the stamping kernel is this probe's own, in a module of its own:
        # when it does not load, vgpu-burn's spin (events only)
        self.module_error = None
        res = cu.cuModuleLoadData(STAMP_PTX.encode() + b"\0")
        self.stamped = int(res[0]) == 0
        if self.stamped:
            self.spin = self.fn(res[1], "vgpu_spin_stamp")
        else:
            self.module_error = getattr(res[0], "name", str(res[0]))
            self.spin = self.fn(self.mod, "vgpu_spin")
        self.stream = self.ck(cu.cuStreamCreate(1), "cuStreamCreate")   # non-blocking
        self._keep: list[Any] = []

    def ck(self, res: Any, what: str) -> Any:
        res = res if isinstance(res, tuple) else (res,)
        if int(res[0]) != 0:
            job_util.fail(f"{what}: {getattr(res[0], 'name', res[0])}", 1)
        return res[1] if len(res) == 2 else (None if len(res) == 1 else res[1:])

    def fn(self, mod: Any, name: str) -> Any:
        return self.ck(self.cu.cuModuleGetFunction(mod, name.encode()), "cuModuleGetFunction")

    def params(self, *values: int) -> int:
        """A kernelParams array of u64 values, kept alive: its address."""
        vals = [ctypes.c_uint64(v) for v in values]
        arr = (ctypes.c_void_p * len(vals))(*[ctypes.addressof(v) for v in vals])
        self._keep += [vals, arr]
        return ctypes.addressof(arr)

    def launch(self, fn: Any, params: int) -> None:
        self.ck(self.cu.cuLaunchKernel(fn, 1, 1, 1, 1, 1, 1, 0, self.stream, params, 0),
                "cuLaunchKernel")

    def event(self) -> Any:
        return self.ck(self.cu.cuEventCreate(0), "cuEventCreate")

    def record(self, ev: Any) -> None:
        self.ck(self.cu.cuEventRecord(ev, self.stream), "cuEventRecord")

    def sync_event(self, ev: Any) -> None:
        self.ck(self.cu.cuEventSynchronize(ev), "cuEventSynchronize")

    def ms(self, a: Any, b: Any) -> float:
        return float(self.ck(self.cu.cuEventElapsedTime(a, b), "cuEventElapsedTime"))

    def sync(self) -> None:
        self.ck(self.cu.cuStreamSynchronize(self.stream), "cuStreamSynchronize")

    def alloc(self, size: int) -> int:
        p = int(self.ck(self.cu.cuMemAlloc(size), "cuMemAlloc"))
        self.ck(self.cu.cuMemsetD8(p, 0, size), "cuMemsetD8")
        return p

    def read_stamps(self, buf: int, n: int) -> list[list[int]] | None:
        """The first n slots of a stamp buffer, or None when the kernels
        wrote none (the simulated GPU) or not one a kernel."""
        if not self.stamped or n <= 0:
            return None
        words = (ctypes.c_uint64 * (STAMP_HEADER // 8 + 4 * n))()
        self.ck(self.cu.cuMemcpyDtoH(ctypes.addressof(words), buf, ctypes.sizeof(words)),
                "cuMemcpyDtoH")
        count = words[0] & 0xFFFFFFFF
        if count != n:
            return None
        base = STAMP_HEADER // 8
        out = [[words[base + 4 * i + j] for j in range(4)] for i in range(n)]
        if any(r[0] == 0 or r[1] < r[0] for r in out):
            return None
        return out


def install_stop() -> list[bool]:
    stop = [False]

    def on(signum: int, frame: Any) -> None:
        stop[0] = True

    signal.signal(signal.SIGTERM, on)
    signal.signal(signal.SIGINT, on)
    return stop


def worker_spin(a: argparse.Namespace) -> None:
    """Spin kernels back to back, an event after each; every kernel's end,
    from events (and from %globaltimer when the kernels wrote it)."""
    stop = install_stop()
    cupti, cupti_error = None, None
    if a.cupti:
        try:
            cupti = CuptiTrace(a.cupti, a.cupti_kind)
        except Exception as e:  # noqa: BLE001 - reported; the kernels still run
            cupti_error = f"{type(e).__name__}: {e}"
    d = Dev(a.device)
    L = float(a.kernel_us)
    cap = int(a.seconds * 1e6 / L) + a.inflight + 64
    buf = d.alloc(STAMP_HEADER + STAMP_SLOT * cap) if d.stamped else 0
    params = d.params(int(round(L * 1000)), buf)
    ring = [d.event() for _ in range(a.inflight)]
    base = d.event()
    for _ in range(8):                    # warm-up: JIT, first launches
        d.launch(d.spin, params)
    d.sync()
    if buf:
        d.ck(d.cu.cuMemsetD8(buf, 0, STAMP_HEADER + STAMP_SLOT * cap), "cuMemsetD8")
        d.sync()
    # The anchor: an event on an idle GPU (every process waits at the
    # barrier), stamped when recorded, tied to the host's CLOCK_MONOTONIC
    # as the time its record call returned; the tightest of five.
    best = None
    for _ in range(5):
        ev = d.event()
        t0 = time.monotonic_ns()
        d.record(ev)
        t1 = time.monotonic_ns()
        d.sync_event(ev)
        if best is None or t1 - t0 < best[2] - best[1]:
            best = (ev, t0, t1)
    anchor, t0, t1 = best
    job_util.wait_barrier(a)
    h0 = time.monotonic()
    d.record(base)
    deadline = h0 + a.seconds
    ends: list[float] = []
    k = 0
    R = a.inflight
    while not stop[0] and k < cap and time.monotonic() < deadline:
        slot = k % R
        if k >= R:
            d.sync_event(ring[slot])
            ends.append(d.ms(base, ring[slot]))
        d.launch(d.spin, params)
        d.record(ring[slot])
        k += 1
    for j in range(max(0, k - R), k):
        d.sync_event(ring[j % R])
        ends.append(d.ms(base, ring[j % R]))
    h1 = time.monotonic()
    d.sync()
    base_off = d.ms(anchor, base)
    stamps = d.read_stamps(buf, k) if buf else None
    out: dict[str, Any] = {
        "kind": "spin", "kernel_us": L, "kernels": k, "seconds": round(h1 - h0, 6),
        "rate": round(k / (h1 - h0), 3) if h1 > h0 else None, "inflight": R,
        "stamped": stamps is not None, "module_error": d.module_error,
        "anchor_host_ns": t1, "anchor_spread_ns": t1 - t0,
        "base_host_ns": t1 + int(round(base_off * 1e6)),
        "ends_us": [round(e * 1000, 2) for e in ends],
        "stamps": stamps,
    }
    if cupti is not None:
        out["cupti"] = cupti.finish(d.ctx)
    elif cupti_error:
        out["cupti"] = {"enable_rc": -1, "errors": [cupti_error], "records": []}
    job_util.emit(out)


def calibrate(d: Dev, work_params: Any, iters_box: ctypes.c_uint64) -> float:
    """vgpu-burn's calibration: multiply-adds a microsecond, alone."""
    a, b = d.event(), d.event()
    iters_box.value = 200000
    best = 0.0
    for _ in range(4):
        d.record(a)
        d.launch(d.work, work_params)
        d.record(b)
        d.sync_event(b)
        ms = d.ms(a, b)
        if ms > 0:
            best = max(best, 200000 / (ms * 1000))
    return best or 1.0


def worker_span(a: argparse.Namespace) -> None:
    """Event spans of kernels of known length, interleaved kinds, each timed
    alone: event, kernel(s), event, wait; a random pause between."""
    stop = install_stop()
    d = Dev(a.device)
    kinds = [("spin1ms", "spin", 1000.0, 1), ("spin5ms", "spin", 5000.0, 1),
             ("work1ms", "work", 1000.0, 1), ("work5ms", "work", 5000.0, 1),
             ("burst10x100us", "spin", 100.0, 10)]
    n_stamp = a.reps * sum(n for _, k, _, n in kinds if k == "spin") + 64
    buf = d.alloc(STAMP_HEADER + STAMP_SLOT * n_stamp) if d.stamped else 0
    spin_params = {us: d.params(int(us * 1000), buf) for _, k, us, _ in kinds if k == "spin"}
    work_out = d.alloc(64)
    iters = ctypes.c_uint64(0)
    ns_work = ctypes.c_uint64(0)
    outp = ctypes.c_uint64(work_out)
    warr = (ctypes.c_void_p * 3)(ctypes.addressof(ns_work), ctypes.addressof(iters),
                                 ctypes.addressof(outp))
    work_params = ctypes.addressof(warr)
    ipus = a.iters_per_us or calibrate(d, work_params, iters)
    for us in spin_params:                # warm-up
        d.launch(d.spin, spin_params[us])
    d.sync()
    if buf:
        d.ck(d.cu.cuMemsetD8(buf, 0, STAMP_HEADER + STAMP_SLOT * n_stamp), "cuMemsetD8")
        d.sync()
    ev_a, ev_b = d.event(), d.event()
    rng = random.Random(11)
    res: dict[str, dict[str, list[float]]] = {n: {"span_ms": [], "host_ms": []}
                                              for n, *_ in kinds}
    order: list[tuple[str, int]] = []     # (kind, rep) of each stamped launch, in order
    h0 = time.monotonic()
    for rep in range(a.reps):
        for name, kind, us, count in kinds:
            if stop[0]:
                break
            t0 = time.monotonic_ns()
            d.record(ev_a)
            for _ in range(count):
                if kind == "spin":
                    d.launch(d.spin, spin_params[us])
                    order.append((name, rep))
                else:
                    ns_work.value = int(us * 1000)
                    iters.value = int(ipus * us + 0.5)
                    d.launch(d.work, work_params)
            d.record(ev_b)
            d.sync_event(ev_b)
            t1 = time.monotonic_ns()
            res[name]["span_ms"].append(round(d.ms(ev_a, ev_b), 4))
            res[name]["host_ms"].append(round((t1 - t0) / 1e6, 4))
            time.sleep(rng.uniform(0, 0.002))
    d.sync()
    stamps = d.read_stamps(buf, len(order)) if buf else None
    if stamps is not None:
        for name in res:
            res[name]["gpu_ms"], res[name]["max_gap_us"] = [], []
        # a launch's kernels: first start to last end on the GPU, largest gap inside
        groups: dict[tuple[str, int], list[list[int]]] = {}
        for key, st in zip(order, stamps, strict=False):
            groups.setdefault(key, []).append(st)
        for (name, _), sts in groups.items():
            res[name]["gpu_ms"].append(round((sts[-1][1] - sts[0][0]) / 1e6, 4))
            gaps = [s[2] for s in sts] + [sts[i + 1][0] - sts[i][1] for i in range(len(sts) - 1)]
            res[name]["max_gap_us"].append(round(max(gaps) / 1e3, 2))
    job_util.emit({"kind": "span", "reps": a.reps, "iters_per_us": round(ipus, 4),
                   "stamped": stamps is not None, "module_error": d.module_error,
                   "seconds": round(time.monotonic() - h0, 3), "kinds": res})


def worker_copy(a: argparse.Namespace) -> None:
    """cuMemcpyHtoDAsync of --copy-mib from pinned memory in a loop, two in
    flight; each copy timed by events."""
    stop = install_stop()
    d = Dev(a.device)
    size = a.copy_mib << 20
    pinned = True
    res = d.cu.cuMemHostAlloc(size, 0)
    if int(res[0]) != 0:
        pinned = False
        host_buf = ctypes.create_string_buffer(size)
        hptr = ctypes.addressof(host_buf)
    else:
        hptr = int(res[1])
    dptr = d.alloc(size)
    evs = [(d.event(), d.event()) for _ in range(2)]
    d.ck(d.cu.cuMemcpyHtoDAsync(dptr, hptr, size, d.stream), "cuMemcpyHtoDAsync")
    d.sync()
    job_util.wait_barrier(a)
    h0 = time.monotonic()
    deadline = h0 + a.seconds
    copy_ms: list[float] = []
    n = 0
    while not stop[0] and time.monotonic() < deadline:
        ea, eb = evs[n % 2]
        if n >= 2:
            d.sync_event(eb)
            copy_ms.append(round(d.ms(ea, eb), 4))
        d.record(ea)
        d.ck(d.cu.cuMemcpyHtoDAsync(dptr, hptr, size, d.stream), "cuMemcpyHtoDAsync")
        d.record(eb)
        n += 1
    for j in range(max(0, n - 2), n):
        ea, eb = evs[j % 2]
        d.sync_event(eb)
        copy_ms.append(round(d.ms(ea, eb), 4))
    h1 = time.monotonic()
    secs = h1 - h0
    job_util.emit({"kind": "copy", "bytes": size, "pinned": pinned, "copies": n,
                   "seconds": round(secs, 6),
                   "gbps": round(n * size / secs / 1e9, 3) if secs > 0 else None,
                   "gbps_events": (round(size / (C.median(copy_ms) / 1e3) / 1e9, 3)
                                   if copy_ms and C.median(copy_ms) > 0 else None),
                   "copy_ms": copy_ms[:2000]})


class CuptiTrace:
    """CUPTI's activity API through ctypes, one record kind: the
    compute-engine context switches (CUpti_ActivityComputeEngineCtxSwitch:
    u32 kind, u32 contextId, u64 timestamp, u32 operationType). Enabled
    before cuInit."""

    BUF = 4 << 20

    def __init__(self, path: str, kind: int) -> None:
        self.kind = kind
        self.records: list[list[int]] = []
        self.other_kinds: dict[int, int] = {}
        self.dropped = 0
        self.errors: list[str] = []
        self._bufs: dict[int, Any] = {}
        lib = self.lib = ctypes.CDLL(path)
        lib.cuptiActivityGetNextRecord.argtypes = [ctypes.c_void_p, ctypes.c_size_t,
                                                   ctypes.POINTER(ctypes.c_void_p)]
        req_t = ctypes.CFUNCTYPE(None, ctypes.POINTER(ctypes.c_void_p),
                                 ctypes.POINTER(ctypes.c_size_t), ctypes.POINTER(ctypes.c_size_t))
        cmp_t = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_uint32, ctypes.c_void_p,
                                 ctypes.c_size_t, ctypes.c_size_t)
        self._req = req_t(self._request)
        self._cmp = cmp_t(self._complete)
        self.version = ctypes.c_uint32(0)
        lib.cuptiGetVersion(ctypes.byref(self.version))
        self.enable_rc = self._call("cuptiActivityRegisterCallbacks", self._req, self._cmp)
        if self.enable_rc == 0:
            self.enable_rc = self._call("cuptiActivityEnable", ctypes.c_int(kind))

    def _call(self, name: str, *args: Any) -> int:
        rc = int(getattr(self.lib, name)(*args))
        if rc != 0:
            s = ctypes.c_char_p()
            try:
                self.lib.cuptiGetResultString(rc, ctypes.byref(s))
            except Exception:  # noqa: BLE001 - the code alone then
                pass
            self.errors.append(f"{name}: {rc} {(s.value or b'').decode(errors='replace')}")
        return rc

    def _request(self, buf: Any, size: Any, maxrec: Any) -> None:
        b = (ctypes.c_uint64 * (self.BUF // 8))()
        addr = ctypes.addressof(b)
        self._bufs[addr] = b
        buf[0] = addr
        size[0] = self.BUF
        maxrec[0] = 0

    def _complete(self, ctx: Any, stream: int, buf: Any, size: int, valid: int) -> None:
        rec = ctypes.c_void_p()
        while self.lib.cuptiActivityGetNextRecord(buf, valid, ctypes.byref(rec)) == 0:
            p = rec.value
            if not p:
                break
            kind = ctypes.c_uint32.from_address(p).value
            if kind == self.kind and len(self.records) < 50000:
                self.records.append([ctypes.c_uint32.from_address(p + 4).value,
                                     ctypes.c_uint64.from_address(p + 8).value,
                                     ctypes.c_uint32.from_address(p + 16).value])
            else:
                self.other_kinds[kind] = self.other_kinds.get(kind, 0) + 1
        n = ctypes.c_size_t(0)
        try:
            if self.lib.cuptiActivityGetNumDroppedRecords(ctx, stream, ctypes.byref(n)) == 0:
                self.dropped += n.value
        except Exception:  # noqa: BLE001 - a count we could not read
            pass
        self._bufs.pop(buf or 0, None)

    def finish(self, ctx: Any) -> dict[str, Any]:
        own = ctypes.c_uint32(0)
        if self.enable_rc == 0:
            self._call("cuptiActivityFlushAll", ctypes.c_uint32(1))
            try:
                self.lib.cuptiGetContextId(ctypes.c_void_p(int(ctx)), ctypes.byref(own))
            except Exception:  # noqa: BLE001
                pass
        return {"version": self.version.value, "kind": self.kind, "enable_rc": self.enable_rc,
                "errors": self.errors, "records": self.records, "own_context_id": own.value,
                "other_kinds": self.other_kinds, "dropped": self.dropped}


def worker_main(argv: Sequence[str]) -> None:
    ap = argparse.ArgumentParser(prog="probe.py worker")
    ap.add_argument("kind", choices=("spin", "span", "copy"))
    ap.add_argument("--device", type=int, default=0)
    ap.add_argument("--kernel-us", type=float, default=100.0)
    ap.add_argument("--seconds", type=float, default=1.0)
    ap.add_argument("--inflight", type=int, default=256)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--iters-per-us", type=float, default=0.0)
    ap.add_argument("--copy-mib", type=int, default=256)
    ap.add_argument("--cupti", help="libcupti to trace context switches with")
    ap.add_argument("--cupti-kind", type=int, default=0)
    job_util.add_barrier_args(ap)
    a = ap.parse_args(argv)
    {"spin": worker_spin, "span": worker_span, "copy": worker_copy}[a.kind](a)
    # no teardown: a profiler's thread must not call back into a Python
    # that is shutting down; the driver frees the context at exit
    sys.stdout.flush()
    os._exit(0)


# ---- analysis (pure: tests feed it made-up timelines) -------------------------------

def pct(v: Sequence[float], q: float) -> float | None:
    if not v:
        return None
    s = sorted(v)
    return s[min(len(s) - 1, max(0, int(round(q / 100 * (len(s) - 1)))))]


def dist(v: Sequence[float], nd: int = 2) -> dict[str, Any] | None:
    if not v:
        return None
    return {"n": len(v), "p10": round(pct(v, 10), nd), "p50": round(pct(v, 50), nd),
            "p90": round(pct(v, 90), nd), "min": round(min(v), nd), "max": round(max(v), nd)}


def runs_from_events(ends_us: Sequence[float], kernel_us: float,
                     thr_us: float) -> list[list[float]]:
    """A process's turns on the GPU from its kernels' end events (us on its
    own timeline): a kernel ran in [end - L, end]; where an end comes more
    than L + thr after the one before, the process was off the GPU (put
    just before that kernel; a kernel preempted part-way puts it a part of
    L early, no more)."""
    runs: list[list[float]] = []
    prev = None
    for e in ends_us:
        start = e - kernel_us
        if prev is None or e - prev > kernel_us + thr_us:
            runs.append([start, e])
        else:
            runs[-1][1] = e
        prev = e
    return runs


def runs_from_stamps(stamps: Sequence[Sequence[int]], gap_ns: float,
                     join_ns: float) -> list[list[float]]:
    """A process's turns from %globaltimer (ns): a kernel is on the GPU from
    its first to its last read, less its largest jump when that is over
    gap_ns (it was taken off there); kernels closer than join_ns are one
    turn."""
    pieces: list[list[float]] = []
    for start, end, gap, at in stamps:
        if gap > gap_ns:
            pieces += [[start, at], [at + gap, end]]
        else:
            pieces.append([start, end])
    runs: list[list[float]] = []
    for s, e in pieces:
        if runs and s - runs[-1][1] <= join_ns:
            runs[-1][1] = max(runs[-1][1], e)
        else:
            runs.append([s, e])
    return runs


def turn_stats(runs_by_proc: Sequence[Sequence[Sequence[float]]],
               aligned: bool) -> dict[str, Any]:
    """Turns (slices), the time each process was off between two of its
    turns, and, when the processes' timelines share a clock, the idle gaps
    at hand-overs. Times in us; a process's first and last turns are cut
    by the run's start and end and left out of the slices."""
    n = len(runs_by_proc)
    slices: list[float] = []
    offs: list[float] = []
    per: list[dict[str, Any]] = []
    for runs in runs_by_proc:
        inner = [r[1] - r[0] for r in runs[1:-1]]
        off = [runs[i + 1][0] - runs[i][1] for i in range(len(runs) - 1)]
        slices += inner
        offs += off
        on = sum(r[1] - r[0] for r in runs)
        span = (runs[-1][1] - runs[0][0]) if runs else 0.0
        per.append({"turns": len(runs), "slice_us": dist(inner), "off_us": dist(off),
                    "on_fraction": round(on / span, 4) if span > 0 else None})
    out: dict[str, Any] = {"procs": n, "per_proc": per, "slice_us": dist(slices),
                           "off_us": dist(offs)}
    s50, o50 = pct(slices, 50), pct(offs, 50)
    # round robin of n processes: a process is off for the n - 1 others'
    # turns and n hand-overs
    if n >= 2 and s50 is not None and o50 is not None:
        out["switch_us_from_off"] = round((o50 - (n - 1) * s50) / n, 2)
    if aligned and n >= 2:
        allruns = sorted((r[0], r[1], p) for p, runs in enumerate(runs_by_proc) for r in runs)
        gaps, overlaps = [], 0
        # only the stretch where every process ran (not the starts and ends)
        lo = max(runs[0][0] for runs in runs_by_proc if runs) if all(runs_by_proc) else 0
        hi = min(runs[-1][1] for runs in runs_by_proc if runs) if all(runs_by_proc) else 0
        by_dir: dict[str, list[float]] = {}
        for (s0, e0, p0), (s1, e1, p1) in zip(allruns, allruns[1:], strict=False):
            if p0 == p1 or s0 < lo or e1 > hi:
                continue
            g = s1 - e0
            if g < 0:
                overlaps += 1
            gaps.append(g)
            by_dir.setdefault(f"{p0}->{p1}", []).append(g)
        out["handover_us"] = dist(gaps)
        out["overlaps"] = overlaps
        # Round the cycle of hand-overs, what one process's clock offset (or
        # a turn's end placed early, from events) adds to the gap into it,
        # it takes from the gap out of it: the mean of the directions'
        # medians is the switch, whatever the offsets.
        common = {k: v for k, v in by_dir.items() if len(v) >= 0.1 * len(gaps)}
        out["handover_by_direction_us"] = {k: [len(v), round(pct(v, 50), 2)]
                                           for k, v in sorted(by_dir.items())}
        if common:
            meds = [pct(v, 50) for v in common.values()]
            out["switch_us"] = round(sum(meds) / len(meds), 2)
    return out


def spin_timeline(results: Sequence[dict[str, Any]], raw: int) -> dict[str, Any]:
    """Turns of every spin process of one case, from %globaltimer when every
    process has stamps (with what the events alone say beside it, under
    events_view), else from events on the host's clock."""
    L = float(results[0]["kernel_us"])
    stamped = all(r.get("stamped") and r.get("stamps") for r in results)
    t_host = min(r["base_host_ns"] for r in results)
    ev_runs = []
    for r in results:
        off = (r["base_host_ns"] - t_host) / 1e3
        runs = runs_from_events(r["ends_us"], L, max(20.0, 0.2 * L))
        ev_runs.append([[s + off, e + off] for s, e in runs])
    runs_by_proc = ev_runs
    stats = turn_stats(ev_runs, aligned=True)
    stats["source"] = "events (host-aligned)"
    if stamped:
        t_ref = min(r["stamps"][0][0] for r in results)
        runs_by_proc = []
        for r in results:
            runs = runs_from_stamps(r["stamps"], 5_000, 20_000)
            runs_by_proc.append([[(s - t_ref) / 1e3, (e - t_ref) / 1e3] for s, e in runs])
        ev = stats
        stats = turn_stats(runs_by_proc, aligned=True)
        stats["source"] = "globaltimer"
        stats["events_view"] = {k: ev.get(k) for k in ("slice_us", "off_us", "switch_us_from_off",
                                                       "switch_us", "handover_us", "overlaps")}
        # how late a kernel's end event is against its last %globaltimer read
        # (relative to the first kernel's)
        lags = []
        for r in results:
            ends, st = r["ends_us"], r["stamps"]
            if len(ends) == len(st) and ends:
                lags.append(dist([(ends[i] - ends[0]) - (st[i][1] - st[0][1]) / 1e3
                                  for i in range(len(ends))]))
        stats["event_lag_us"] = lags
    stats["kernel_us"] = L
    stats["rates"] = [r.get("rate") for r in results]
    stats["kernels"] = [r.get("kernels") for r in results]
    stats["anchor_spread_us"] = [round(r["anchor_spread_ns"] / 1e3, 1) for r in results]
    stats["raw"] = [{"ends_us": r["ends_us"][:raw],
                     "stamps": (r["stamps"] or [])[:raw] if r.get("stamps") else None,
                     "base_host_ns": r["base_host_ns"], "pid": r.get("pid")}
                    for r in results]
    stats["runs_us"] = [[[round(s, 2), round(e, 2)] for s, e in runs] for runs in runs_by_proc]
    return stats


def parse_cupti_kinds(header: str) -> dict[str, int]:
    """CUpti_ActivityKind's enumerators and values, from cupti_activity.h."""
    end = header.find("} CUpti_ActivityKind;")
    if end < 0:
        return {}
    start = header.rfind("typedef enum", 0, end)
    body = header[header.find("{", start) + 1:end]
    body = re.sub(r"/\*.*?\*/", "", body, flags=re.S)
    body = re.sub(r"//[^\n]*", "", body)
    out: dict[str, int] = {}
    nxt = 0
    for item in body.split(","):
        m = re.match(r"\s*(CUPTI_ACTIVITY_KIND_\w+)\s*(?:=\s*(0x[0-9a-fA-F]+|\d+))?\s*$", item)
        if not m:
            continue
        v = int(m.group(2), 0) if m.group(2) else nxt
        out[m.group(1)] = v
        nxt = v + 1
    return out


def find_cupti() -> dict[str, Any]:
    """The libcupti candidates on this machine (wheels, torch, toolkits),
    each with its API version and whether its header (when found) has the
    compute-engine context-switch kind. Loads them; calls cuptiGetVersion
    only (no CUDA)."""
    pats: list[str] = []
    for sp in sys.path:
        if sp and os.path.isdir(sp):
            pats += [f"{sp}/nvidia/cu1*/lib/libcupti.so*",
                     f"{sp}/nvidia/cuda_cupti/lib/libcupti.so*", f"{sp}/torch/lib/libcupti*.so*"]
    for root in [os.environ.get("CUDA_HOME", ""), "/usr/local/cuda", "/usr/local/cuda-*",
                 "/opt/nvidia/*"]:
        if root:
            pats += [f"{root}/extras/CUPTI/lib64/libcupti.so*", f"{root}/lib64/libcupti.so*",
                     f"{root}/lib/libcupti.so*", f"{root}/targets/*/lib/libcupti.so*"]
    pats += ["/usr/lib/x86_64-linux-gnu/libcupti.so*", "/usr/lib64/libcupti.so*"]
    seen: dict[str, str] = {}
    for p in pats:
        for f in sorted(glob.glob(p)):
            real = os.path.realpath(f)
            if os.path.isfile(real) and real not in seen:
                seen[real] = f
    cands = []
    for real, f in seen.items():
        c: dict[str, Any] = {"library": f}
        try:
            lib = ctypes.CDLL(real)
            v = ctypes.c_uint32(0)
            c["get_version_rc"] = int(lib.cuptiGetVersion(ctypes.byref(v)))
            c["version"] = v.value
        except (OSError, AttributeError) as e:
            c["error"] = f"{type(e).__name__}: {e}"
            cands.append(c)
            continue
        d = Path(real).parent
        for h in [d.parent / "include", d.parent.parent / "include",
                  d.parent.parent / "extras" / "CUPTI" / "include"]:
            hf = h / "cupti_activity.h"
            if hf.is_file():
                kinds = parse_cupti_kinds(hf.read_text(errors="replace"))
                c["header"] = str(hf)
                c["kind_value"] = kinds.get("CUPTI_ACTIVITY_KIND_COMPUTE_ENGINE_CTX_SWITCH")
                break
        cands.append(c)
    cands.sort(key=lambda c: c.get("version") or 0, reverse=True)
    return {"candidates": cands, "searched": len(pats)}


def cupti_choice(found: dict[str, Any]) -> tuple[dict[str, Any] | None, int | None, str]:
    """The library to trace with and the kind's value, or why none."""
    cands = [c for c in found["candidates"] if c.get("version")]
    if not cands:
        tried = [c["library"] for c in found["candidates"]]
        return None, None, ("no libcupti found" + (f" that loads ({tried})" if tried else
                            " (site-packages nvidia/cu1*, nvidia/cuda_cupti, torch/lib, "
                            "/usr/local/cuda*)"))
    for c in cands:
        if c.get("kind_value") is not None:
            return c, int(c["kind_value"]), f"value {c['kind_value']} from {c['header']}"
    best = cands[0]
    if best["version"] >= CUPTI_MIN_VERSION and not best.get("header"):
        return best, CUPTI_CTX_SWITCH_DOC, (f"no header beside it: value {CUPTI_CTX_SWITCH_DOC} "
                                            "from the documented enum order (unverified)")
    why = ", ".join(f"{c['library']} API {c['version']}"
                    + (" (its header lacks the kind)" if c.get("header") else "") for c in cands)
    return None, None, (f"no CUPTI with CUPTI_ACTIVITY_KIND_COMPUTE_ENGINE_CTX_SWITCH "
                        f"(CUDA 13.1+): {why}")


def cupti_summary(tr: dict[str, Any]) -> dict[str, Any]:
    """Per context, the times between a START and the next END record and
    between an END and the next START (CUPTI's timestamps, ns)."""
    recs = sorted(tr.get("records") or [], key=lambda r: r[1])
    by_ctx: dict[int, list[list[int]]] = {}
    for ctx, ts, op in recs:
        by_ctx.setdefault(ctx, []).append([ts, op])
    per = {}
    for ctx, rs in by_ctx.items():
        steps = list(zip(rs, rs[1:], strict=False))
        se = [(b[0] - a[0]) / 1e3 for a, b in steps if a[1] == 1 and b[1] == 2]
        es = [(b[0] - a[0]) / 1e3 for a, b in steps if a[1] == 2 and b[1] == 1]
        per[str(ctx)] = {"records": len(rs), "start_to_end_us": dist(se),
                         "end_to_start_us": dist(es)}
    cross = [(b[1] - a[1]) / 1e3 for a, b in zip(recs, recs[1:], strict=False) if a[0] != b[0]]
    ops: dict[str, int] = {}
    for r in recs:              # 1 START, 2 END; anything else: the layout is not as read
        ops[str(r[2])] = ops.get(str(r[2]), 0) + 1
    return {"records": len(recs), "contexts": len(by_ctx), "per_context": per, "ops": ops,
            "own_context_id": tr.get("own_context_id"),
            "between_contexts_us": dist(cross), "dropped": tr.get("dropped"),
            "other_kinds": tr.get("other_kinds"), "errors": tr.get("errors"),
            "enable_rc": tr.get("enable_rc"), "version": tr.get("version")}


# ---- the harness -------------------------------------------------------------------

class Probe:
    def __init__(self, args: argparse.Namespace, res: C.StepResult) -> None:
        self.a = args
        self.res = res
        self.tmp = Path(tempfile.mkdtemp(prefix="vgpu-probe-"))
        self.env = C.base_env()
        self.solo_rate: float | None = None

    def argv(self, kind: str, *extra: str) -> list[str]:
        return [C.PY, str(Path(__file__).resolve()), "worker", kind,
                "--device", str(self.a.device), *extra]

    def spin_argv(self, seconds: float, kernel_us: float | None = None, *extra: str) -> list[str]:
        return self.argv("spin", "--kernel-us", f"{kernel_us or self.a.kernel_us:g}",
                         "--seconds", f"{seconds:g}", "--inflight", str(self.a.inflight), *extra)

    def together(self, jobs: list[tuple[str, list[str]]], seconds: float) -> dict[str, C.Ran]:
        """Start the jobs, wait until all are ready, let them go together;
        every one's result."""
        b = C.Barrier(self.tmp)
        procs = [(n, argv + b.args(n), C.start(argv + b.args(n), self.env)) for n, argv in jobs]
        t0 = time.monotonic()
        try:
            b.wait_ready([n for n, _ in jobs], [p for _, _, p in procs], 60)
            b.go()
        except Exception as e:
            why = []
            for n, argv, p in procs:
                C.stop(p, 2)
                r = C.finish(p, argv, 1, t0)
                self.res.logs[n] = r.log()
                if r.rc not in (0, None, -15):
                    why.append(f"{n}: {(r.json or {}).get('error') or C.tail(r.stderr, 300)}")
            raise RuntimeError("; ".join([str(e), *why])) from None
        out = {}
        for n, argv, p in procs:
            r = C.finish(p, argv, max(1.0, seconds + 30 - (time.monotonic() - t0)), t0)
            self.res.logs[n] = r.log()
            out[n] = r
        return out

    @staticmethod
    def result(r: C.Ran) -> dict[str, Any]:
        j = r.json
        if r.rc != 0 or not j or j.get("error"):
            raise RuntimeError(f"worker failed (rc={r.rc}): "
                               f"{(j or {}).get('error') or C.tail(r.stderr, 300)}")
        return j

    # -- cases --

    def solo(self) -> None:
        claim = "a context alone runs its spin kernels back to back (the baseline)"
        secs = max(0.3, self.a.seconds / 3)
        r = self.result(self.together([("solo", self.spin_argv(secs))], secs)["solo"])
        tl = spin_timeline([r], self.a.raw_kernels)
        self.res.figures["solo"] = tl
        self.solo_rate = r.get("rate")
        ends = r["ends_us"]
        deltas = [b - a for a, b in zip(ends, ends[1:], strict=False)]
        tl["delta_us"] = dist(deltas)
        self.res.add(C.judged("solo", claim, bool(ends), {
            "rate": r.get("rate"), "kernel_us": self.a.kernel_us,
            "delta_us_p50": (tl["delta_us"] or {}).get("p50"),
            "delta_us_max": (tl["delta_us"] or {}).get("max"),
            "turns": tl["per_proc"][0]["turns"], "stamped": r.get("stamped"),
            "module_error": r.get("module_error")}))

    def turns(self, name: str, n: int) -> None:
        claim = (f"{n} contexts spinning kernels take turns: the time slice (a turn's "
                 "length) and the switch (idle between two contexts' turns), from events "
                 "(and %globaltimer where the kernels write it)")
        rs = self.together([(f"{name}{i}", self.spin_argv(self.a.seconds)) for i in range(n)],
                           self.a.seconds)
        results = [self.result(rs[f"{name}{i}"]) for i in range(n)]
        tl = spin_timeline(results, self.a.raw_kernels)
        self.res.figures[name] = tl
        sl, ho = tl["slice_us"] or {}, tl.get("handover_us") or {}
        measured = {"slice_us": sl.get("p50"), "slice_p10_p90": [sl.get("p10"), sl.get("p90")],
                    "switch_us": tl.get("switch_us"),
                    "handover_p10_p50_p90": [ho.get("p10"), ho.get("p50"), ho.get("p90")],
                    "switch_us_from_off": tl.get("switch_us_from_off"),
                    "overlaps": tl.get("overlaps"), "source": tl["source"],
                    "rates": tl["rates"], "solo_rate": self.solo_rate}
        if not sl:
            self.res.add(C.errored(name, claim, "no turns seen: every process's kernels "
                                   "ran back to back (concurrent contexts: MPS?)", measured))
            return
        self.res.add(C.judged(name, claim, True, measured))

    def spans(self) -> None:
        claim = ("cuEventElapsedTime of kernels of known length, alone and next to a "
                 "saturating context")
        r_alone = self.result(self.run_one("span-alone", self.argv(
            "span", "--reps", str(self.a.reps)), 60))
        bg_argv = self.spin_argv(120, 1000.0)
        b = C.Barrier(self.tmp)
        bg = C.start(bg_argv + b.args("bg"), self.env)
        try:
            b.wait_ready(["bg"], [bg], 60)
            b.go()
            time.sleep(0.2)
            r_cont = self.result(self.run_one("span-contended", self.argv(
                "span", "--reps", str(self.a.reps),
                "--iters-per-us", f"{r_alone['iters_per_us']:g}"), 60))
        finally:
            rb = C.finish(bg, bg_argv, 0.1)
            self.res.logs["span-bg"] = rb.log()
        out: dict[str, Any] = {"iters_per_us": r_alone["iters_per_us"],
                               "stamped": r_alone.get("stamped"), "kinds": {}}
        measured = {}
        for kind, a in r_alone["kinds"].items():
            c = r_cont["kinds"].get(kind, {})
            e = {"alone": {k: dist(v, 4) for k, v in a.items()},
                 "contended": {k: dist(v, 4) for k, v in c.items()},
                 "raw_contended": c}
            out["kinds"][kind] = e
            measured[kind] = [(e["alone"].get("span_ms") or {}).get("p50"),
                              (e["contended"].get("span_ms") or {}).get("p50"),
                              (e["contended"].get("span_ms") or {}).get("max")]
        bgj = rb.json or {}
        out["background_rate"] = bgj.get("rate")
        self.res.figures["spans"] = out
        self.res.add(C.judged("spans", claim + " (ms: alone p50, contended p50, max)",
                              True, measured))

    def run_one(self, name: str, argv: list[str], timeout: float) -> C.Ran:
        r = C.run(argv, self.env, timeout)
        self.res.logs[name] = r.log()
        return r

    def copy(self) -> None:
        claim = ("a context copying host to device in a loop next to one spinning kernels: "
                 "the kernel context's rate against alone")
        secs = max(0.5, self.a.seconds)
        cp_argv = self.argv("copy", "--copy-mib", str(self.a.copy_mib), "--seconds")
        alone = self.result(self.together([("copy-alone", cp_argv + [f"{secs / 2:g}"])],
                                          secs / 2)["copy-alone"])
        rs = self.together([("copy-kern", self.spin_argv(secs)),
                            ("copy-copier", cp_argv + [f"{secs:g}"])], secs)
        k = self.result(rs["copy-kern"])
        cp = self.result(rs["copy-copier"])
        tl = spin_timeline([k], self.a.raw_kernels)
        solo = self.solo_rate
        ratio = round(k["rate"] / solo, 4) if solo and k.get("rate") else None
        self.res.figures["copy"] = {"alone": alone, "with_kernels": cp, "kernel": tl,
                                    "kernel_rate_vs_solo": ratio}
        self.res.add(C.judged("copy", claim, True, {
            "kernel_rate": k.get("rate"), "solo_rate": solo, "ratio": ratio,
            "kernel_turns": tl["per_proc"][0]["turns"],
            "kernel_off_us": (tl["off_us"] or {}).get("p50"),
            "copy_gbps": cp.get("gbps"), "copy_gbps_alone": alone.get("gbps"),
            "pinned": cp.get("pinned")}))

    def cupti(self) -> None:
        claim = ("CUPTI's compute-engine context-switch records "
                 "(CUPTI_ACTIVITY_KIND_COMPUTE_ENGINE_CTX_SWITCH) of two spinning contexts")
        found = find_cupti()
        self.res.figures["cupti"] = {"found": found}
        if C.simulated():
            self.res.add(C.skipped("cupti", claim, "not available: the simulated GPU has no "
                                   "CUPTI (it needs NVIDIA's driver)"))
            return
        lib, kind, why = cupti_choice(found)
        self.res.figures["cupti"]["choice"] = why
        if lib is None:
            self.res.add(C.skipped("cupti", claim, "not available: " + why))
            return
        secs = min(1.0, self.a.seconds)
        rs = self.together([("cupti0", self.spin_argv(secs, None, "--cupti", lib["library"],
                                                      "--cupti-kind", str(kind))),
                            ("cupti1", self.spin_argv(secs))], secs)
        r = self.result(rs["cupti0"])
        tr = r.get("cupti") or {}
        summ = cupti_summary(tr)
        self.res.figures["cupti"].update(summary=summ, raw=tr.get("records", [])[:4000])
        if tr.get("enable_rc"):
            self.res.add(C.skipped("cupti", claim, f"not available: {lib['library']} "
                                   f"(API {lib.get('version')}): {tr.get('errors')}"))
            return
        self.res.add(C.judged("cupti", claim, True, {
            "records": summ["records"], "contexts": summ["contexts"],
            "between_contexts_us": summ["between_contexts_us"], "library": lib["library"],
            "kind": kind, "how": why}))


def sim_settings() -> dict[str, Any] | None:
    if not C.simulated():
        return None
    return {"timeslice_us": float(os.environ.get("VGPU_SIM_TIMESLICE_US") or 2000),
            "switch_us": float(os.environ.get("VGPU_SIM_SWITCH_US") or 25)}


def table(res: C.StepResult) -> str:
    f = res.figures
    lines = ["| case | figure |", "| --- | --- |"]
    if "solo" in f:
        s = f["solo"]
        lines.append(f"| solo | {s['rates'][0]} kernels/s of {s['kernel_us']:g} us; gaps "
                     f"between ends p50 {(s.get('delta_us') or {}).get('p50')} us, "
                     f"max {(s.get('delta_us') or {}).get('max')} us |")
    for name in ("pair", "trio"):
        if name in f:
            t = f[name]
            sl, ho = t["slice_us"] or {}, t.get("handover_us") or {}
            lines.append(f"| {name} | slice p50 {sl.get('p50')} us ({sl.get('p10')} to "
                         f"{sl.get('p90')}), switch {t.get('switch_us')} us (hand-overs p50 "
                         f"{ho.get('p50')}; from time off {t.get('switch_us_from_off')}), "
                         f"{t['source']} |")
    if "spans" in f:
        for kind, e in f["spans"]["kinds"].items():
            a = (e["alone"].get("span_ms") or {})
            c = (e["contended"].get("span_ms") or {})
            lines.append(f"| span {kind} | alone p50 {a.get('p50')} ms, contended p50 "
                         f"{c.get('p50')} ms (max {c.get('max')}) |")
    if "copy" in f:
        c = f["copy"]
        lines.append(f"| copy | kernel rate {c['kernel_rate_vs_solo']} of solo; copier "
                     f"{c['with_kernels'].get('gbps')} GB/s (alone {c['alone'].get('gbps')}) |")
    for ch in res.checks:
        if ch.name == "cupti":
            lines.append(f"| cupti | {ch.status}: {ch.detail or json.dumps(ch.measured)} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=str(C.DEFAULT_OUT))
    ap.add_argument("--seconds", type=float, default=1.5, help="each pair/trio/copy run")
    ap.add_argument("--kernel-us", type=float, default=100.0, help="the spin kernels")
    ap.add_argument("--inflight", type=int, default=256, help="kernels queued per process")
    ap.add_argument("--reps", type=int, default=20, help="spans: launches of each kind")
    ap.add_argument("--copy-mib", type=int, default=256)
    ap.add_argument("--raw-kernels", type=int, default=2000,
                    help="kernels per process kept raw in probe.json")
    ap.add_argument("--only", default=",".join(CASES), help="comma-separated: " + ",".join(CASES))
    ap.add_argument("--device", type=int, default=0)
    args = ap.parse_args(argv)
    cases = [c.strip() for c in args.only.split(",") if c.strip()]
    bad = [c for c in cases if c not in CASES]
    if bad:
        ap.error(f"--only: unknown {bad}; choose from {', '.join(CASES)}")
    res = C.StepResult("probe", {k: v for k, v in vars(args).items() if k != "out"})
    res.figures["sim_settings"] = sim_settings()
    print(f"probe: device {C.device_brief().get('name')}, {args.kernel_us:g} us kernels, "
          f"{args.seconds:g} s a run, cases {','.join(cases)}", flush=True)
    C.exit_cleanly_on_sigterm()
    p = Probe(args, res)
    steps = {"solo": p.solo, "pair": lambda: p.turns("pair", 2),
             "trio": lambda: p.turns("trio", 3), "spans": p.spans, "copy": p.copy,
             "cupti": p.cupti}
    claims = {"solo": "a context alone runs its spin kernels back to back",
              "pair": "two contexts' time slice and switch", "trio": "three contexts' time "
              "slice and switch", "spans": "event spans alone and contended",
              "copy": "copy/compute overlap between contexts", "cupti": "CUPTI context switches"}
    if not C.cuda_bindings_installed():
        for c in cases:
            res.add(C.skipped(c, claims[c], "cuda-bindings not installed"))
        res.write(args.out)
        return 1
    try:
        for c in cases:
            try:
                steps[c]()
            except C.Terminated:
                raise
            except Exception as e:  # noqa: BLE001 - recorded; the next case runs
                res.add(C.errored(c, claims[c], f"{type(e).__name__}: {e}"))
    except C.Terminated:
        res.add(C.errored("harness", "the step ran to its end",
                          "stopped by SIGTERM (run_all.sh's time limit?)"))
        raise
    finally:
        import shutil
        shutil.rmtree(p.tmp, ignore_errors=True)
        res.write(args.out)
    print(table(res), flush=True)
    return 0 if any(c.status == "pass" for c in res.checks) else 1


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    if len(sys.argv) > 1 and sys.argv[1] == "worker":
        worker_main(sys.argv[2:])
        sys.exit(0)
    sys.exit(main())
