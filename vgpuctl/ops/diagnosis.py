"""``vgpuctl doctor``: is this node ready to share its GPUs?

Each check returns a ``Check``: a status (ok, warn, fail), what it found and,
for a problem, how to fix it. The driver and NVML are probed in a child
process with a time limit, so a driver that hangs or crashes makes a failed
check, not a hung or crashed doctor. Under ``VGPU_SIM`` the same probes run
against the simulated GPU, and the simulator itself is checked first.

Nothing here prints: ``run_checks`` returns the results, the command renders.
"""

from __future__ import annotations

import json
import os
import socket
import stat
import subprocess
import sys
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from vgpuctl.errors import VgpuError
from vgpuctl.ops import probes
from vgpuctl.ops.probes import PROBE_TIMEOUT
from vgpuctl.system import native, paths, sim

OK, WARN, FAIL = "ok", "warn", "fail"

# The CUDA driver API's codes that users meet when a node is not ready.
CUDA_ERRORS = {
    3: ("CUDA_ERROR_NOT_INITIALIZED", ""),
    35: ("CUDA_ERROR_INSUFFICIENT_DRIVER",
         "the kernel module is older than libcuda: reboot after a driver upgrade, or "
         "reinstall one driver version"),
    100: ("CUDA_ERROR_NO_DEVICE",
          "no GPU is visible: check CUDA_VISIBLE_DEVICES and `nvidia-smi`"),
    101: ("CUDA_ERROR_INVALID_DEVICE", "check CUDA_VISIBLE_DEVICES"),
    304: ("CUDA_ERROR_OPERATING_SYSTEM",
          "the driver could not open /dev/nvidia*: check their permissions"),
    804: ("CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE", ""),
    999: ("CUDA_ERROR_UNKNOWN",
          "often /dev/nvidia-uvm is missing: `modprobe nvidia-uvm` or `nvidia-modprobe -u -c 0`"),
}


@dataclass(frozen=True)
class Check:
    name: str
    status: str          # ok | warn | fail
    detail: str          # what was found
    fix: str = ""        # how to fix it (for warn and fail)

    def to_dict(self) -> dict[str, str]:
        return asdict(self)


# -- the checks -------------------------------------------------------------------
NO_DRIVER_FIX = ("install the NVIDIA driver (`nvidia-smi` must work), or try vgpuctl on the "
                 "simulated GPU: VGPU_SIM=1x16G vgpuctl demo")


def reinstall_fix(why: str = "") -> str:
    """How to reinstall vgpuctl where this one is installed (its venv, e.g.
    /opt/vgpuctl, the install the README and the unit use): vgpuctl is not
    on PyPI, and Debian's system pip refuses to install."""
    prefix = sys.prefix
    sudo = "" if os.access(prefix, os.W_OK) else "sudo "
    return (f"{why}reinstall vgpuctl where it is installed: {sudo}{prefix}/bin/pip install "
            f"--force-reinstall --no-deps <your vgpuctl clone or wheel> "
            f"(vgpuctl help operations)")


SIM_BROKEN_FIX = reinstall_fix("the simulated GPU's library is broken: ")
def _as_root(command: str) -> str:
    """A command only root may run, as the caller would type it: as is for
    root; for anyone else, as the node's administrator's to run."""
    if os.geteuid() == 0:
        return command
    return f"the node's administrator runs: {command}"


UNIT_FIX_ROOT = ("install the unit and start it: vgpuctl help unit > "
                 "/etc/systemd/system/vgpud.service && systemctl daemon-reload && "
                 "systemctl enable --now vgpud")


def unit_fix() -> str:
    """How the system daemon comes to run: root installs the unit; anyone
    else asks the node's administrator (or uses a user daemon)."""
    if os.geteuid() == 0:
        return UNIT_FIX_ROOT
    return ("the node's administrator installs the system daemon's unit (vgpuctl help "
            "unit)")


def _no_driver_fix(env: Mapping[str, str]) -> str:
    return SIM_BROKEN_FIX if sim.active(env) else NO_DRIVER_FIX


def check_simulator(env: Mapping[str, str]) -> Check:
    spec_text = env.get("VGPU_SIM", "")
    try:
        spec = sim.parse_spec(spec_text)
        libdir = native.sim_libdir()
    except VgpuError as e:
        return Check("simulator", FAIL, str(e),
                     "set VGPU_SIM to COUNTxSIZE (VGPU_SIM=1x16G), or reinstall vgpuctl")
    state = Path(env.get("VGPU_SIM_STATE") or f"/dev/shm/vgpu-sim-{os.getuid()}")
    where = state if state.exists() else state.parent
    if not os.access(where, os.R_OK | os.W_OK):
        return Check("simulator", FAIL, f"its state file {state} is not writable by you",
                     "remove it, or set VGPU_SIM_STATE to a file of your own")
    return Check("simulator", OK, f"VGPU_SIM={spec_text}: {spec.count} simulated GPU(s) of "
                 f"{spec.memory >> 20} MiB, libraries in {libdir}, state {state}")


def check_driver(env: Mapping[str, str]) -> Check:
    r = probes.run("driver", env)
    if r.get("hung"):
        return Check("driver", FAIL, f"cuInit did not return within {PROBE_TIMEOUT:.0f} s",
                     "the driver is stuck: check `dmesg` for NVRM/Xid errors; a reboot "
                     "may be needed")
    if "crashed" in r:
        return Check("driver", FAIL, f"loading libcuda.so.1 crashed: {r.get('error')}",
                     "reinstall the NVIDIA driver")
    if not r.get("loaded"):
        return Check("driver", FAIL, f"libcuda.so.1 does not load: {r.get('error')}",
                     _no_driver_fix(env))
    rc = int(r.get("cuInit", -1))
    if rc != 0:
        name, fix = CUDA_ERRORS.get(rc, (r.get("error_name") or f"error {rc}", ""))
        if sim.active(env):
            fix = SIM_BROKEN_FIX
        return Check("driver", FAIL, f"cuInit(0) failed: {r.get('error_name') or name} ({rc})",
                     fix or "check `nvidia-smi` and `dmesg`")
    count = r.get("count")
    if not count:
        return Check("driver", FAIL, "cuInit works but no device is visible",
                     "check CUDA_VISIBLE_DEVICES and `nvidia-smi`")
    v = r.get("version")
    ver = f", CUDA {v // 1000}.{v % 1000 // 10}" if isinstance(v, int) and v else ""
    return Check("driver", OK, f"libcuda.so.1 loads, cuInit ok, {count} device(s){ver}")


SUSPEND_FIX = ("upgrade the NVIDIA driver to R570 or newer for `vgpuctl suspend`, R580 or "
               "newer to move jobs between GPUs (docs/suspend.md)")


def _suspend_fix(r: dict[str, Any], env: Mapping[str, str]) -> str:
    """What brings suspend and move: a simulated driver of R580
    (VGPU_SIM_DRIVER); no driver at all is the driver check's to fix; a
    real one too old, an upgrade."""
    if sim.active(env):
        return ("the simulated driver is older than R570 (suspend) or R580 (move): unset "
                "VGPU_SIM_DRIVER, or set it to 580.65.06 (docs/simulator.md)")
    if not r.get("cuda"):
        return "install the NVIDIA driver first (see the driver check); R570 or newer suspends"
    return SUSPEND_FIX


def check_suspend(env: Mapping[str, str]) -> Check:
    """Whether the driver's checkpoint API is here: suspend (R570), move
    (R580). A node without it still shares its GPUs: a warning."""
    r = probes.run("suspend", env)
    if r.get("hung") or "crashed" in r:
        return Check("suspend", WARN, "the driver's checkpoint API could not be probed: "
                     f"{r.get('error') or 'it did not answer'}", "check `nvidia-smi`")
    if not r.get("suspend"):
        return Check("suspend", WARN, f"suspend and move are not available: {r.get('why')}",
                     _suspend_fix(r, env))
    v = r.get("cuda")
    cuda = f"CUDA {v // 1000}.{v % 1000 // 10}" if isinstance(v, int) and v else "its CUDA"
    if not r.get("move"):
        return Check("suspend", WARN, f"suspend and resume are available ({cuda}); moving "
                     f"jobs between GPUs is not: {r.get('why_move')}", _suspend_fix(r, env))
    return Check("suspend", OK, f"suspend, resume and move are available (the driver's "
                 f"checkpoint API, {cuda})")


def check_nvml(env: Mapping[str, str]) -> Check:
    r = probes.run("nvml", env)
    if r.get("hung"):
        return Check("nvml", FAIL, f"nvmlInit did not return within {PROBE_TIMEOUT:.0f} s",
                     "check `nvidia-smi` and `dmesg`")
    if "crashed" in r:
        return Check("nvml", FAIL, f"NVML crashed: {r.get('error')}", "reinstall the driver")
    if not r.get("imported"):
        return Check("nvml", FAIL, f"the pynvml module is missing: {r.get('error')}",
                     f"{sys.prefix}/bin/pip install nvidia-ml-py (a dependency of vgpuctl)")
    if not r.get("init"):
        return Check("nvml", FAIL, f"nvmlInit failed: {r.get('error')}", _no_driver_fix(env))
    if r.get("error"):
        return Check("nvml", FAIL, f"NVML answers but fails: {r['error']}",
                     "check `nvidia-smi`")
    names = r.get("names") or []
    if not names:
        return Check("nvml", FAIL, "NVML sees no GPU", "check `nvidia-smi`")
    kinds = ", ".join(sorted(set(names)))
    return Check("nvml", OK, f"driver {r.get('driver')}, {len(names)} GPU(s): {kinds}")


def check_mig(env: Mapping[str, str]) -> Check:
    """The node's MIG state, and what works on it (docs/mig.md)."""
    r = probes.run("mig", env)
    if "gpus" not in r:
        return Check("mig", WARN, f"the GPUs' MIG mode could not be read: {r.get('error')}",
                     "check `nvidia-smi mig -lgi`")
    gpus = r["gpus"]
    on = [g for g in gpus if g.get("enabled")]
    pending = [g["index"] for g in gpus if g.get("pending") != g.get("enabled")
               and g.get("supported")]
    if pending:
        return Check("mig", WARN, "MIG mode changes wait for a GPU reset on GPU "
                     + ", ".join(map(str, pending)),
                     "reset the GPU when it is idle (`nvidia-smi -r -i N`, root)")
    empty = [g["index"] for g in on if not g.get("devices")]
    if empty:
        return Check("mig", WARN, "GPU " + ", ".join(map(str, empty)) + " in MIG mode with no "
                     "MIG device: no job can use it",
                     f"`vgpuctl mig create {empty[0]} PROFILE` (root; `vgpuctl mig` lists them)")
    if not on:
        return Check("mig", OK, "no GPU is in MIG mode" + (
            "" if any(g.get("supported") for g in gpus) else " (none supports it)"))
    parts = []
    for g in on:
        kinds: dict[str, int] = {}
        for p in g["devices"]:
            kinds[p] = kinds.get(p, 0) + 1
        parts.append(f"GPU {g['index']}: " + ", ".join(
            f"{p}" + (f" x{n}" if n > 1 else "") for p, n in kinds.items()))
    return Check("mig", OK, "MIG devices are GPUs to vgpuctl, with memory limits, shares "
                 "(by turns: MIG gives no per-process utilization) and classes: "
                 + "; ".join(parts))


def check_hook(env: Mapping[str, str]) -> Check:
    try:
        hook = native.hook_library()
    except VgpuError as e:
        return Check("hook", FAIL, str(e), reinstall_fix())
    # Not inside a job's region: a plain program with the hook preloaded.
    child = {k: v for k, v in env.items() if k not in ("VGPU_REGION", "VGPU_JOB")}
    child["LD_PRELOAD"] = str(hook)
    try:
        child = dict(sim.child_env(child))
    except VgpuError:
        pass
    true = "/bin/true" if os.path.exists("/bin/true") else "true"
    try:
        r = subprocess.run([true], env=child, capture_output=True, text=True,
                           stdin=subprocess.DEVNULL, timeout=PROBE_TIMEOUT)
    except (OSError, subprocess.TimeoutExpired) as e:
        return Check("hook", FAIL, f"LD_PRELOAD={hook} true: {e}", reinstall_fix())
    said = (r.stdout + r.stderr).strip()
    if r.returncode != 0 or said:
        first = said.splitlines()[0] if said else f"exit status {r.returncode}"
        return Check("hook", FAIL, f"LD_PRELOAD={hook} true: {first}",
                     reinstall_fix("so that the hook is rebuilt for this system, "))
    return Check("hook", OK, f"{hook} loads into programs silently")


def _ping(path: Path, timeout: float = 5.0) -> dict[str, Any]:
    from vgpuctl.core import protocol as P

    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(timeout)
        s.connect(str(path))
        s.sendall(P.encode_request("ping"))
        buf = b""
        while not buf.endswith(b"\n") and len(buf) < P.MAX_LINE:
            chunk = s.recv(65536)
            if not chunk:
                break
            buf += chunk
    reply = json.loads(buf)
    exc = P.reply_exception(reply)
    if exc is not None:
        raise exc
    return dict(reply.get("daemon") or {})


def check_daemon(env: Mapping[str, str]) -> Check:
    explicit = env.get("VGPU_SOCKET")
    candidates = paths.client_sockets(env=env)
    stale: list[str] = []
    for sock in candidates:
        try:
            st = os.stat(sock)
        except FileNotFoundError:
            continue
        except PermissionError:
            return Check("daemon", FAIL, f"{sock}: you may not reach it (its folder is closed "
                         "to you)", f"ask root to make {sock.parent} searchable (mode 0755)")
        if not stat.S_ISSOCK(st.st_mode):
            return Check("daemon", FAIL, f"{sock} exists but is not a socket",
                         f"remove {sock}, then start the daemon")
        if not os.access(sock, os.R_OK | os.W_OK):
            mode = stat.S_IMODE(st.st_mode)
            return Check("daemon", FAIL,
                         f"{sock} (mode {mode:04o}, uid {st.st_uid}) does not let you connect",
                         "the system daemon's socket must be mode 0666: restart it "
                         "(systemctl restart vgpud); check no one changed its mode")
        try:
            info = _ping(sock)
        except (ConnectionRefusedError, FileNotFoundError):
            stale.append(str(sock))
            continue
        except (OSError, ValueError) as e:
            return Check("daemon", FAIL, f"{sock}: no answer to a ping ({e})",
                         "the daemon is stuck: restart it (systemctl restart vgpud)")
        except VgpuError as e:
            return Check("daemon", FAIL, f"{sock}: the daemon refused a ping: {e}",
                         "run the same vgpuctl version as the daemon, or restart it")
        kind = "system" if info.get("system") else "user"
        return Check("daemon", OK, f"{kind} daemon pid {info.get('pid')} (vgpuctl "
                     f"{info.get('version')}) answers on {sock}, {info.get('jobs', 0)} job(s)")
    sign = paths.system_daemon_sign() if paths.SYSTEM_SOCKET in candidates else None
    if sign is not None:
        # `vgpuctl run` waits for this node's system daemon, never starts its own.
        return Check("daemon", FAIL, f"the system daemon is not running ({sign} exists): "
                     "`vgpuctl run` waits for it, then fails",
                     _as_root("systemctl start vgpud") if paths.system_unit() is not None
                     else unit_fix())
    if stale:
        return Check("daemon", WARN, f"no daemon listens on {', '.join(stale)} (left by a "
                     "daemon that stopped)",
                     "`vgpuctl run ...` starts a user daemon and replaces the stale socket"
                     + ("" if paths.system_unit() is None else
                        "; the system daemon: " + _as_root("systemctl start vgpud")))
    where = explicit or " or ".join(str(c) for c in candidates)
    return Check("daemon", WARN, f"no daemon is running (no socket at {where})",
                 f"let `vgpuctl run` start a user daemon; for the whole node, {unit_fix()}")


def _answering_daemon(env: Mapping[str, str]) -> tuple[Path, dict[str, Any]] | None:
    """The socket of the daemon a client would use, and its ping's answer;
    None when none answers."""
    from vgpuctl.client.connection import connect

    try:
        with connect(env=env, timeout=2.0) as cl:
            return cl.path, dict(cl.call("ping").get("daemon") or {})
    except (OSError, ValueError, VgpuError):
        return None


def check_config(env: Mapping[str, str]) -> Check:
    """The config file of the daemon that answers (the one whose settings
    hold), else the one a daemon started now would read."""
    from vgpuctl.system.config_file import load_config

    found = _answering_daemon(env)
    if found is not None:
        sock, info = found
        if not info.get("config_file") or info.get("config") == "<defaults>":
            where = f" at {info['config_file']}" if info.get("config_file") else ""
            return Check("config", OK, f"the daemon on {sock} runs on the defaults (no "
                         f"config file{where})")
        path: Path | None = Path(info["config_file"])
        if not os.access(path, os.R_OK):
            return Check("config", OK, f"the daemon on {sock} reads {path} (not readable "
                         "by you)")
    else:
        user = os.geteuid() != 0
        path = paths.default_config(user=user, env=env)
        if path is None:
            where = paths.user_config(env) if user else paths.SYSTEM_CONFIG
            return Check("config", OK, f"no config file ({where}): the defaults apply")
    try:
        cfg = load_config(path)
    except VgpuError as e:
        return Check("config", FAIL, str(e),
                     "fix the named key (every key: vgpuctl help config), then "
                     "vgpuctl daemon reload")
    extra = ""
    if cfg.metrics_address:
        from vgpuctl.daemon import metrics

        if not metrics.available():
            return Check("config", FAIL, f"{path}: metrics_address is set but "
                         "prometheus-client is not installed", metrics.INSTALL_HINT)
        extra = f", metrics on {cfg.metrics_address}"
    return Check("config", OK, f"{path} is valid{extra}")


def run_checks(env: Mapping[str, str] | None = None,
               progress: Callable[[str], None] | None = None) -> list[Check]:
    """Every check, in order; ``progress(name)`` is called before each."""
    e = dict(os.environ if env is None else env)
    steps: list[tuple[str, Callable[[Mapping[str, str]], Check]]] = []
    if sim.active(e):
        steps.append(("simulator", check_simulator))
    steps += [("driver", check_driver), ("nvml", check_nvml), ("mig", check_mig),
              ("suspend", check_suspend), ("hook", check_hook),
              ("daemon", check_daemon), ("config", check_config)]
    out = []
    for name, fn in steps:
        if progress is not None:
            progress(name)
        try:
            out.append(fn(e))
        except Exception as ex:  # a check that breaks is a finding, not a crash
            out.append(Check(name, FAIL, f"the check itself failed: {type(ex).__name__}: {ex}",
                             "report this as a vgpuctl bug"))
        if name == "simulator" and out[-1].status == FAIL:
            break  # every other check would fail the same way
    return out


def failed(checks: list[Check]) -> bool:
    return any(c.status == FAIL for c in checks)
