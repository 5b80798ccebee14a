"""The summary of a real-GPU proof run: summary.json beside the steps' JSON.

    python3 bench/gpu/summary.py --out DIR --init [--build HOW]
    python3 bench/gpu/summary.py --out DIR --record STEP RC [--note TEXT]
    python3 bench/gpu/summary.py --out DIR            (print the table)

--init records the machine (GPU and driver from NVML, nvidia-smi, torch and
its CUDA, Python, gcc, how vgpuctl was built) and starts an empty summary.
--record takes STEP's `<step>.json` (or, when the step left none because it
was killed or crashed, an error with its exit code) into the summary and
prints the table of all checks so far. run_all.sh calls both.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common as C

TORCH_INFO = """
import json, torch
d = {"version": torch.__version__, "cuda": torch.version.cuda,
     "cuda_available": torch.cuda.is_available()}
if d["cuda_available"]:
    p = torch.cuda.get_device_properties(0)
    d.update(device=p.name, sms=p.multi_processor_count, memory=p.total_memory,
             capability=list(torch.cuda.get_device_capability(0)))
print(json.dumps(d))
"""


def _cmd(argv: list[str], timeout: float = 60) -> str | None:
    try:
        r = subprocess.run(argv, check=False, capture_output=True, text=True,
                           timeout=timeout, env=C.base_env())
    except (OSError, subprocess.TimeoutExpired):
        return None
    out = (r.stdout or "").strip()
    return out if r.returncode == 0 and out else None


def machine(build: str | None) -> dict[str, Any]:
    info: dict[str, Any] = {"device": C.device_brief(), "build": build,
                            "python": sys.version.split()[0], "executable": sys.executable,
                            "platform": platform.platform()}
    smi = shutil.which("nvidia-smi")
    if smi and not C.simulated():
        info["nvidia_smi_L"] = _cmd([smi, "-L"])
        query = "--query-gpu=name,driver_version,memory.total,compute_mode,mig.mode.current"
        info["nvidia_smi_query"] = _cmd([smi, query, "--format=csv"])
    if C.torch_installed():
        out = _cmd([sys.executable, "-c", TORCH_INFO], 120)
        info["torch"] = C.last_json(out or "") or {"error": "could not read torch's view"}
    else:
        info["torch"] = None
    gcc = _cmd(["gcc", "--version"])
    info["gcc"] = gcc.splitlines()[0] if gcc else None
    info["packages"] = {}
    for dist in ("cffi", "pycparser", "nvidia-ml-py", "click", "rich", "psutil",
                 "cuda-bindings", "torch", "setuptools"):
        try:
            info["packages"][dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            info["packages"][dist] = None
    git = _cmd(["git", "-C", str(C.ROOT), "rev-parse", "HEAD"])
    info["commit"] = git
    return info


def load(path: Path) -> dict[str, Any]:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def save(path: Path, data: dict[str, Any]) -> None:
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(data, indent=1, default=str) + "\n")
    os.replace(tmp, path)


def record(out: Path, summary: dict[str, Any], step: str, rc: int, note: str | None) -> None:
    data = load(out / f"{step}.json")
    if data.get("step") == step:
        entry = {"status": data.get("status"), "rc": rc, "elapsed_s": data.get("elapsed_s"),
                 "checks": [{k: c.get(k) for k in ("name", "status", "measured", "detail")}
                            for c in data.get("checks", [])]}
    else:
        entry = {"status": "error", "rc": rc, "checks": [],
                 "detail": note or f"the step left no {step}.json (exit {rc}: killed by its "
                                   "time limit, or crashed; see run.log)"}
    if note and data:
        entry["note"] = note
    summary.setdefault("steps", {})[step] = entry
    statuses = [s["status"] for s in summary["steps"].values()]
    summary["all_pass"] = bool(statuses) and all(s == "pass" for s in statuses)
    summary["updated"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")


def table(summary: dict[str, Any]) -> str:
    dev = (summary.get("machine") or {}).get("device") or {}
    kind = "SIMULATED" if dev.get("simulated") else "real"
    lines = [f"device: {dev.get('name')} (driver {dev.get('driver')}, {kind})",
             "| step | check | status | measured |", "| --- | --- | --- | --- |"]
    for step, e in (summary.get("steps") or {}).items():
        if not e.get("checks"):
            lines.append(f"| {step} | - | {e.get('status')} | {e.get('detail', '')} |")
        for c in e.get("checks", []):
            m = c.get("measured")
            text = json.dumps(m) if m is not None else c.get("detail", "")
            if len(text) > 160:
                text = text[:157] + "..."
            lines.append(f"| {step} | {c['name']} | {c['status']} | {text} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=str(C.DEFAULT_OUT))
    ap.add_argument("--init", action="store_true")
    ap.add_argument("--build", help="how vgpuctl was built (--init)")
    ap.add_argument("--record", nargs=2, metavar=("STEP", "RC"))
    ap.add_argument("--note")
    args = ap.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / "summary.json"
    if args.init:
        summary = {"benchmark": "gpu-proof (issue 7)",
                   "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                   "machine": machine(args.build), "steps": {}, "all_pass": False}
        save(path, summary)
        print(json.dumps(summary["machine"], indent=1, default=str))
        return 0
    summary = load(path)
    if args.record:
        step, rc = args.record[0], int(args.record[1])
        record(out, summary, step, rc, args.note)
        save(path, summary)
    print(table(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
