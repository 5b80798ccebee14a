"""`vgpuctl doctor`'s probes: each runs in a child process (``run``), with
a time limit, so that a driver that hangs or crashes makes a failed check
in ops.diagnosis, not a hung or crashed doctor. A probe returns what it
found as a JSON object.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable, Mapping
from typing import Any

from vgpuctl.system import sim
from vgpuctl.system.nvml import nvml_text

PROBE_TIMEOUT = 30.0


def _probe_driver() -> dict[str, Any]:
    import ctypes

    sim.use_in_process()
    try:
        lib = ctypes.CDLL("libcuda.so.1")
    except OSError as e:
        return {"loaded": False, "error": str(e)}
    out: dict[str, Any] = {"loaded": True}
    rc = lib.cuInit(0)
    out["cuInit"] = rc
    if rc != 0:
        name = ctypes.c_char_p()
        try:
            if lib.cuGetErrorName(rc, ctypes.byref(name)) == 0 and name.value:
                out["error_name"] = name.value.decode()
        except AttributeError:
            pass
        return out
    version = ctypes.c_int()
    if lib.cuDriverGetVersion(ctypes.byref(version)) == 0:
        out["version"] = version.value
    count = ctypes.c_int()
    rc = lib.cuDeviceGetCount(ctypes.byref(count))
    out["cuDeviceGetCount"] = rc
    out["count"] = count.value if rc == 0 else None
    return out


def _probe_nvml() -> dict[str, Any]:
    sim.use_in_process()
    try:
        import pynvml
    except ImportError as e:
        return {"imported": False, "error": str(e)}
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as e:
        return {"imported": True, "init": False, "error": str(e)}
    out: dict[str, Any] = {"imported": True, "init": True}
    try:
        v = pynvml.nvmlSystemGetDriverVersion()
        out["driver"] = nvml_text(v)
        n = pynvml.nvmlDeviceGetCount()
        out["count"] = n
        names = []
        for i in range(n):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            nm = pynvml.nvmlDeviceGetName(h)
            names.append(nvml_text(nm))
        out["names"] = names
    except pynvml.NVMLError as e:
        out["error"] = str(e)
    finally:
        try:
            pynvml.nvmlShutdown()
        except pynvml.NVMLError:
            pass
    return out


def _probe_suspend() -> dict[str, Any]:
    from vgpuctl.system import checkpoint

    sim.use_in_process()
    a = checkpoint.availability()
    return {"cuda": a.cuda, "suspend": a.suspend, "move": a.move, "why": a.why,
            "why_move": a.why_move}


def _probe_mig() -> dict[str, Any]:
    from vgpuctl.system import mig
    from vgpuctl.system.nvml import Nvml

    sim.use_in_process()
    nvml = Nvml()
    try:
        return {"gpus": [{"index": s.index, "supported": s.supported, "enabled": s.enabled,
                          "pending": s.pending,
                          "devices": [i.profile for i in s.instances for _ in i.devices],
                          "instances": len(s.instances)}
                         for s in mig.layout(nvml.module)]}
    finally:
        nvml.close()


_PROBES: dict[str, Callable[[], dict[str, Any]]] = {
    "driver": _probe_driver, "nvml": _probe_nvml, "suspend": _probe_suspend,
    "mig": _probe_mig,
}


def probe_main(name: str) -> None:
    """Entry point of the child process: print the probe's result as JSON."""
    print(json.dumps(_PROBES[name]()))


def run(name: str, env: Mapping[str, str]) -> dict[str, Any]:
    """Probe ``name`` in a child process of env: its result, or what went
    wrong ({"hung": True}, {"crashed": code, "error": ...})."""
    code = f"from vgpuctl.ops.probes import probe_main; probe_main({name!r})"
    try:
        r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                           env=dict(env), stdin=subprocess.DEVNULL, timeout=PROBE_TIMEOUT)
    except subprocess.TimeoutExpired:
        return {"hung": True}
    if r.returncode != 0:
        last = (r.stderr.strip().splitlines() or [""])[-1]
        return {"crashed": r.returncode, "error": last}
    try:
        return json.loads(r.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return {"crashed": 0, "error": f"unexpected output: {r.stdout[:200]!r}"}
