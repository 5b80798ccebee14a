"""What every real-GPU proof step shares: a private daemon, jobs started the
way users start them (`vgpuctl run ... -- CMD`), checks and the step's JSON.

Each step (memory.py, compute.py, overhead.py, interception.py,
isolation.py) is a program of its own that writes `<step>.json` into its
`--out` folder; `run_all.sh` runs them all. A check is one claim with what
was measured and a status:

    pass     measured, and the claim holds
    fail     measured, and the claim does not hold
    error    could not be measured (a program crashed, a timeout)
    skipped  not measured here, with the reason (torch not installed, the
             simulated GPU cannot show it): never a made-up figure

The step's status: fail when any check failed or erred, pass when all
passed, skipped when none was measured, partial otherwise.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from vgpuctl.system import native, sim

GiB = 1 << 30
MiB = 1 << 20
PY = sys.executable
VGPUCTL = [PY, "-m", "vgpuctl"]
DEFAULT_OUT = ROOT / "bench" / "results" / "gpu"


# ---- checks and results ----------------------------------------------------------

@dataclass
class Check:
    name: str
    status: str                       # pass | fail | error | skipped
    claim: str                        # what must hold
    measured: Any = None              # the figure(s), as measured
    detail: str = ""                  # why skipped / what went wrong

    def line(self) -> str:
        m = "" if self.measured is None else f" measured={json.dumps(self.measured)}"
        d = f" ({self.detail})" if self.detail else ""
        return f"  {self.status.upper():7} {self.name}: {self.claim}{m}{d}"


def judged(name: str, claim: str, ok: bool, measured: Any, detail: str = "") -> Check:
    return Check(name, "pass" if ok else "fail", claim, measured, detail)


def skipped(name: str, claim: str, why: str) -> Check:
    return Check(name, "skipped", claim, None, why)


def errored(name: str, claim: str, why: str, measured: Any = None) -> Check:
    return Check(name, "error", claim, measured, why)


def step_status(checks: Sequence[Check]) -> str:
    st = [c.status for c in checks]
    if not st:
        return "skipped"
    if any(s in ("fail", "error") for s in st):
        return "fail"
    if all(s == "pass" for s in st):
        return "pass"
    if all(s == "skipped" for s in st):
        return "skipped"
    return "partial"


@dataclass
class StepResult:
    step: str
    options: dict[str, Any]
    checks: list[Check] = field(default_factory=list)
    figures: dict[str, Any] = field(default_factory=dict)
    logs: dict[str, str] = field(default_factory=dict)
    started: float = field(default_factory=time.time)

    def add(self, check: Check) -> Check:
        self.checks.append(check)
        print(check.line(), flush=True)
        return check

    def write(self, out_dir: Path | str) -> Path:
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        data = {
            "step": self.step,
            "status": step_status(self.checks),
            "device": device_brief(),
            "date": time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(self.started)),
            "elapsed_s": round(time.time() - self.started, 1),
            "options": self.options,
            "checks": [asdict(c) for c in self.checks],
            "figures": self.figures,
            "logs": {k: tail(v) for k, v in self.logs.items()},
        }
        path = out / f"{self.step}.json"
        tmp = path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(data, indent=1, default=str) + "\n")
        os.replace(tmp, path)
        print(f"{self.step}: {data['status']} ({data['elapsed_s']} s) -> {path}", flush=True)
        return path

    def exit_code(self) -> int:
        return 1 if step_status(self.checks) == "fail" else 0


def tail(text: str | None, limit: int = 4000) -> str:
    text = text or ""
    return text if len(text) <= limit else "...\n" + text[-limit:]


# ---- the machine -----------------------------------------------------------------

def simulated() -> bool:
    return sim.active()


def torch_installed() -> bool:
    return importlib.util.find_spec("torch") is not None


def cuda_bindings_installed() -> bool:
    try:
        return importlib.util.find_spec("cuda.bindings.driver") is not None
    except ModuleNotFoundError:
        return False


_brief: dict[str, Any] | None = None


def device_brief() -> dict[str, Any]:
    """GPU 0's name, UUID, memory and the driver version, from NVML (the
    simulator's when VGPU_SIM is set)."""
    global _brief
    if _brief is not None:
        return _brief
    info: dict[str, Any] = {"simulated": simulated(), "vgpu_sim": os.environ.get("VGPU_SIM")}
    try:
        sim.use_in_process()
        import pynvml

        pynvml.nvmlInit()
        try:
            h = pynvml.nvmlDeviceGetHandleByIndex(0)
            info["name"] = _s(pynvml.nvmlDeviceGetName(h))
            info["uuid"] = _s(pynvml.nvmlDeviceGetUUID(h))
            info["memory_total"] = int(pynvml.nvmlDeviceGetMemoryInfo(h).total)
            info["driver"] = _s(pynvml.nvmlSystemGetDriverVersion())
            try:
                v = int(pynvml.nvmlSystemGetCudaDriverVersion())
                info["cuda_driver"] = f"{v // 1000}.{v % 1000 // 10}"
            except pynvml.NVMLError:
                pass
            info["gpus"] = int(pynvml.nvmlDeviceGetCount())
        finally:
            pynvml.nvmlShutdown()
    except Exception as e:  # noqa: BLE001 - a figure we could not read is reported as such
        info["error"] = f"{type(e).__name__}: {e}"
    _brief = info
    return info


def _s(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


def base_env() -> dict[str, str]:
    """The environment jobs and bare runs get: this tree importable (so
    `python3 -m vgpuctl` and the job programs find vgpuctl without an
    install), unbuffered Python, nothing of an outer job, the simulator's
    libraries first when VGPU_SIM is set."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("VGPU_REGION", "VGPU_JOB", "LD_PRELOAD", "VGPU_MEM_LIMIT")}
    pp = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and p != str(ROOT)]
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *pp])
    env["PYTHONUNBUFFERED"] = "1"
    return dict(sim.child_env(env))


def burn_program() -> str:
    return str(native.burn_program())


def job_program(name: str) -> str:
    return str(HERE / name)


# ---- SIGTERM runs the clean-up -----------------------------------------------------

class Terminated(SystemExit):
    pass


def _on_term(signum: int, frame: Any) -> None:
    raise Terminated(128 + signum)


def exit_cleanly_on_sigterm() -> None:
    """`timeout` (run_all.sh) sends SIGTERM: turn it into SystemExit so that
    `finally` blocks stop the jobs and the daemon."""
    signal.signal(signal.SIGTERM, _on_term)


def run_step(res: StepResult, out: Path | str, body: Callable[[Daemon], None]) -> int:
    """Run body with a private daemon, and always write the step's JSON: a
    crash of the harness, or a SIGTERM (run_all.sh's time limit), is
    recorded as an error check, never left looking like a clean result."""
    exit_cleanly_on_sigterm()
    d: Daemon | None = None
    try:
        d = Daemon().__enter__()
        body(d)
    except Terminated:
        res.add(errored("harness", "the step ran to its end",
                        "stopped by SIGTERM (run_all.sh's time limit?)"))
        raise
    except Exception as e:  # noqa: BLE001 - recorded; the step still writes its JSON
        res.add(errored("harness", "the step ran to its end", f"{type(e).__name__}: {e}"))
    finally:
        if d is not None:
            d.close()
            res.logs["daemon"] = d.log()
        res.write(out)
    return res.exit_code()


# ---- programs ------------------------------------------------------------------------

@dataclass
class Ran:
    argv: list[str]
    rc: int | None                    # None: timed out (killed)
    stdout: str
    stderr: str
    seconds: float

    @property
    def json(self) -> dict[str, Any] | None:
        """The last line of stdout that is a JSON object."""
        return last_json(self.stdout)

    def log(self) -> str:
        return (f"$ {shlex.join(self.argv)}\nrc={self.rc} ({self.seconds:.1f} s)\n"
                f"--- stdout\n{tail(self.stdout, 2000)}\n--- stderr\n{tail(self.stderr, 2000)}")


def last_json(text: str) -> dict[str, Any] | None:
    for line in reversed((text or "").strip().splitlines()):
        line = line.strip()
        if line.startswith("{"):
            try:
                v = json.loads(line)
            except ValueError:
                continue
            if isinstance(v, dict):
                return v
    return None


def run(argv: Sequence[str], env: Mapping[str, str], timeout: float) -> Ran:
    """Run a program to its end (SIGTERM, then SIGKILL, past timeout)."""
    p = start(argv, env)
    return finish(p, argv, timeout)


def start(argv: Sequence[str], env: Mapping[str, str]) -> subprocess.Popen:
    return subprocess.Popen(list(argv), env=dict(env), stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def finish(p: subprocess.Popen, argv: Sequence[str], timeout: float,
           t0: float | None = None) -> Ran:
    t0 = time.monotonic() if t0 is None else t0
    timed_out = False
    try:
        out, err = p.communicate(timeout=max(0.1, timeout))
    except subprocess.TimeoutExpired:
        timed_out = True
        stop(p)
        out, err = p.communicate()
    return Ran(list(argv), None if timed_out else p.returncode, out or "", err or "",
               time.monotonic() - t0)


def stop(p: subprocess.Popen, grace: float = 10.0) -> None:
    if p.poll() is not None:
        return
    p.send_signal(signal.SIGTERM)
    try:
        p.wait(grace)
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait()


def wait_for(cond: Any, timeout: float, what: str, interval: float = 0.05) -> Any:
    """Poll cond() until it returns something true; raise TimeoutError."""
    deadline = time.monotonic() + timeout
    while True:
        v = cond()
        if v:
            return v
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(interval)


# ---- the daemon ----------------------------------------------------------------------

class Daemon:
    """A private vgpuctl daemon in a temporary folder: its own socket,
    runtime dir (job regions) and state dir, so no system daemon or other
    user daemon is touched. In the same process group as the step, so a
    `timeout` that kills the step reaches it too."""

    def __init__(self, tick_ms: int = 100) -> None:
        self.tmp = Path(tempfile.mkdtemp(prefix="vgpu-gpu-proof-"))
        self.socket = self.tmp / "vgpud.sock"
        self.runtime = self.tmp / "run"
        self.state = self.tmp / "state"
        self.config = self.tmp / "vgpu.toml"
        self.config.write_text(f"tick_ms = {tick_ms}\n")
        self.env = base_env()
        self.env["VGPU_SOCKET"] = str(self.socket)
        self.log_path = self.tmp / "vgpud.log"
        self.proc: subprocess.Popen | None = None

    def __enter__(self) -> Daemon:  # noqa: PYI034 - Self needs Python 3.11
        argv = [*VGPUCTL, "daemon", "--user", "--socket", str(self.socket),
                "--runtime-dir", str(self.runtime), "--state-dir", str(self.state),
                "--config", str(self.config)]
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(argv, env=self.env, stdin=subprocess.DEVNULL,
                                         stdout=log, stderr=log, cwd="/")
        from vgpuctl.client.connection import Client

        def up() -> bool:
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(f"the daemon exited ({self.proc.returncode}): "
                                   + tail(self.log(), 1500))
            try:
                Client.connect(self.socket).close()
                return True
            except OSError:
                return False

        try:
            wait_for(up, 60, "the daemon's socket")
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self.proc is not None:
            stop(self.proc)
            self._log = self.log()
            self.proc = None
            shutil.rmtree(self.tmp, ignore_errors=True)   # its log is kept in memory

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return getattr(self, "_log", "")

    def run_argv(self, command: Sequence[str], *, mem: str, core: int | None = None,
                 policy: str | None = None, name: str | None = None) -> list[str]:
        argv = [*VGPUCTL, "run", "--mem", mem]
        if core is not None:
            argv += ["--core", str(core)]
        if policy is not None:
            argv += ["--policy", policy]
        if name is not None:
            argv += ["--name", name]
        return [*argv, "--", *command]

    def job_env(self, extra: Mapping[str, str] | None = None) -> dict[str, str]:
        env = dict(self.env)
        env.update(extra or {})
        return env

    def ps(self) -> dict[str, Any] | None:
        r = run([*VGPUCTL, "ps", "--json"], self.env, 30)
        if r.rc != 0:
            return None
        try:
            return json.loads(r.stdout)
        except ValueError:
            return None

    def jobs_named(self, names: Sequence[str]) -> dict[str, dict[str, Any]]:
        data = self.ps() or {}
        return {j.get("name"): j for j in data.get("jobs", []) if j.get("name") in names}

    def region_dir(self, job_id: str) -> Path:
        return self.runtime / "jobs" / str(job_id)


# ---- barriers between job programs and the harness ----------------------------------

class Barrier:
    """Job programs started with `--barrier DIR --name N` write DIR/ready-N
    when warmed up and wait for DIR/go (job_util.wait_barrier)."""

    def __init__(self, root: Path) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="barrier-", dir=root))

    def args(self, name: str) -> list[str]:
        return ["--barrier", str(self.dir), "--name", name]

    def wait_ready(self, names: Sequence[str], procs: Sequence[subprocess.Popen],
                   timeout: float) -> None:
        def ready() -> bool:
            for p in procs:
                if p.poll() is not None:
                    raise RuntimeError(f"a job ended before it was ready (exit {p.returncode})")
            return all((self.dir / f"ready-{n}").exists() for n in names)

        wait_for(ready, timeout, "the jobs to be ready", 0.1)

    def go(self) -> None:
        tmp = self.dir / ".go"
        tmp.write_text(str(time.time()))
        os.replace(tmp, self.dir / "go")


def iter_lines(path: Path) -> Iterator[str]:
    try:
        yield from path.read_text(errors="replace").splitlines()
    except OSError:
        return


def median(xs: Sequence[float]) -> float:
    s = sorted(xs)
    n = len(s)
    if n == 0:
        return float("nan")
    return s[n // 2] if n % 2 else (s[n // 2 - 1] + s[n // 2]) / 2
