"""A private single-node Slurm cluster for the tests: munged, slurmctld and
slurmd started by hand (no systemd) under one temporary directory, on free
ports, with fake GPUs (the /dev/nvidiaN and /dev/nvidia-caps/nvidia-capN
character nodes its gres.conf names, made with mknod in that directory) and
vgpuctl's own commands as Prolog, TaskProlog and Epilog.

Needs root and Debian's slurm-wlm + munge; `available()` says whether this
machine has them (the tests skip otherwise).
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
from pathlib import Path
from typing import Any

from support.daemon import vgpuctl_argv, wait_for

DAEMONS = ("slurmd", "slurmctld", "munged")


def available() -> str | None:
    """None when a cluster can start here; else why not."""
    if os.geteuid() != 0:
        return "Slurm tests need root"
    for exe in ("slurmctld", "slurmd", "munged", "srun", "scontrol"):
        if shutil.which(exe) is None:
            return f"{exe} not installed (apt-get install slurm-wlm munge)"
    return None


def usable_by(user: str) -> str | None:
    """None when ``user`` can run vgpuctl (a TaskProlog runs as the job's
    user); else why not (an interpreter under a home directory of mode 0700)."""
    r = subprocess.run(["runuser", "-u", user, "--", *vgpuctl_argv(), "--version"],
                       capture_output=True, text=True, timeout=60, cwd="/")
    if r.returncode != 0:
        return f"{user} can't run {vgpuctl_argv()[0]}: {r.stderr.strip()}"
    return None


def free_ports(n: int) -> list[int]:
    """n TCP ports nobody listens on now (bound to port 0, then let go)."""
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def _alive(pid: int) -> bool:
    """Alive and not a zombie (PID 1 here may not reap what we kill)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rpartition(")")[2].split()[0] != "Z"


def _script(path: Path, text: str) -> Path:
    path.write_text(text)
    path.chmod(0o755)
    return path


# Device numbers of the fake device files: NVIDIA's for /dev/nvidiaN; one of
# the "local use" majors for the capabilities (the driver's is dynamic).
NVIDIA_MAJOR = 195
CAPS_MAJOR = 240


def device_files(gres_conf: str) -> dict[str, int]:
    """The device files gres.conf names (File=, MultipleFiles=), each with
    its major number: (path, major) by path."""
    out = {}
    for spec in re.findall(r"(?:^|\s)(?:File|MultipleFiles)=(\S+)", gres_conf, re.M):
        for path in spec.split(","):
            out[path] = CAPS_MAJOR if "/nvidia-caps/" in path else NVIDIA_MAJOR
    return out


def node_gres(gres_conf: str) -> str:
    """The node's Gres= for slurm.conf, as `vgpuctl slurm gres-conf` says it."""
    m = re.search(r"^# slurm\.conf: .* Gres=(\S+)$", gres_conf, re.M)
    assert m is not None, gres_conf
    return m.group(1)


class Cluster:
    """One node, with the GPUs and shards its gres.conf (from `vgpuctl slurm
    gres-conf`) names."""

    def __init__(self, base: Path, vgpu_env: dict[str, str],
                 spank: Path | None = None) -> None:
        self.base = base
        self.node = socket.gethostname().split(".")[0]
        self.vgpu_env = vgpu_env
        self.spank = spank          # the SPANK plugin, when built
        for d in ("etc", "run", "log", "state", "spool", "munge", "munge-sock", "dev"):
            (base / d).mkdir(parents=True, exist_ok=True)
        os.chmod(base, 0o755)
        os.chmod(base / "munge", 0o700)
        os.chmod(base / "munge-sock", 0o755)     # munged wants o+x on its socket's dir
        self.conf = base / "etc" / "slurm.conf"
        self.env = {**os.environ, "SLURM_CONF": str(self.conf)}
        for k in list(self.env):
            if k.startswith(("SLURM_", "VGPU_")) and k != "SLURM_CONF":
                del self.env[k]

    # -- set-up ------------------------------------------------------------------
    def write_config(self, gres_conf: str) -> None:
        b = self.base
        key = b / "munge" / "munge.key"
        if not key.exists():
            key.write_bytes(os.urandom(1024))
            key.chmod(0o400)
        for path, major in device_files(gres_conf).items():
            dev = Path(path)
            assert b / "dev" in dev.parents, f"gres.conf names {dev}, not a fake device"
            dev.parent.mkdir(parents=True, exist_ok=True)
            if not dev.exists():
                minor = int(re.search(r"(\d+)$", dev.name).group(1))    # type: ignore[union-attr]
                os.mknod(dev, 0o666 | 0o020000, os.makedev(major, minor))
        (b / "etc" / "gres.conf").write_text(gres_conf)
        plugstack = b / "etc" / "plugstack.conf"
        plugstack.write_text(f"required {self.spank}\n" if self.spank else "")
        hooks = self._hooks()
        ctld, slurmd = free_ports(2)
        self.conf.write_text(f"""\
ClusterName=vgputest
SlurmctldHost={self.node}(127.0.0.1)
SlurmUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={b}/munge-sock/munge.sock
SlurmctldPort={ctld}
SlurmdPort={slurmd}
StateSaveLocation={b}/state
SlurmdSpoolDir={b}/spool
SlurmctldPidFile={b}/run/slurmctld.pid
SlurmdPidFile={b}/run/slurmd.pid
SlurmctldLogFile={b}/log/slurmctld.log
SlurmdLogFile={b}/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
MpiDefault=none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerParameters=sched_interval=1,bf_interval=1
ReturnToService=2
GresTypes=gpu,shard
PrologFlags=Alloc
PlugStackConfig={plugstack}
Prolog={hooks['prolog']}
TaskProlog={hooks['task-prolog']}
Epilog={hooks['epilog']}
MailProg=/bin/true
NodeName={self.node} NodeAddr=127.0.0.1 CPUs={os.cpu_count()} RealMemory=1000 \
Gres={node_gres(gres_conf)}
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:8
""")

    def _hooks(self) -> dict[str, Path]:
        """Prolog, TaskProlog and Epilog: `vgpuctl slurm ...` with the test
        daemon's socket (Slurm passes no arguments, so a site writes the
        same kind of two-line script)."""
        exe = " ".join(vgpuctl_argv())
        env = " ".join(f"{k}={v}" for k, v in self.vgpu_env.items())
        out = {}
        for name in ("prolog", "task-prolog", "epilog"):
            out[name] = _script(self.base / "etc" / f"{name}.sh",
                                f"#!/bin/sh\nexport {env}\nexec {exe} slurm {name}\n")
        return out

    def start(self) -> Cluster:
        b = self.base
        subprocess.run(["munged", f"--key-file={b}/munge/munge.key",
                        f"--socket={b}/munge-sock/munge.sock", f"--pid-file={b}/run/munged.pid",
                        f"--log-file={b}/log/munged.log", f"--seed-file={b}/munge/seed",
                        "--force"], check=True, env=self.env, timeout=30)
        subprocess.run(["slurmctld", "-f", str(self.conf)], check=True, env=self.env,
                       timeout=30)
        subprocess.run(["slurmd", "-f", str(self.conf), "-N", self.node], check=True,
                       env=self.env, timeout=30)
        wait_for(lambda: self.node_state() == "idle", 30, "the node to be idle")
        return self

    def node_state(self) -> str:
        r = subprocess.run(["sinfo", "-h", "-o", "%T"], env=self.env, capture_output=True,
                           text=True, timeout=30)
        return r.stdout.strip()

    def stop(self) -> None:
        subprocess.run(["scancel", "--partition", "debug"], env=self.env,
                       capture_output=True, timeout=30)
        pids = []
        for name in DAEMONS:
            try:
                pids.append(int((self.base / "run" / f"{name}.pid").read_text()))
            except (OSError, ValueError):
                pass
        pids += self._stepds()
        for pid in pids:
            try:
                os.kill(pid, signal.SIGTERM)
            except OSError:
                pass
        try:
            wait_for(lambda: not any(_alive(p) for p in pids), 10, "Slurm's daemons to exit")
        except AssertionError:
            for pid in pids:
                if _alive(pid):
                    os.kill(pid, signal.SIGKILL)

    def _stepds(self) -> list[int]:
        """slurmstepd processes of this cluster (they outlive a killed slurmd)."""
        out = []
        for p in Path("/proc").iterdir():
            if not p.name.isdigit():
                continue
            try:
                if b"slurmstepd" not in (p / "cmdline").read_bytes():
                    continue
                if str(self.conf).encode() in (p / "environ").read_bytes():
                    out.append(int(p.name))
            except OSError:
                pass
        return out

    # -- use ---------------------------------------------------------------------
    def run(self, *argv: str, timeout: float = 120, env: dict[str, str] | None = None,
            **kw: Any) -> subprocess.CompletedProcess[str]:
        """A Slurm command (srun, sbatch, squeue...) against this cluster."""
        return subprocess.run(list(argv), env={**self.env, **(env or {})},
                              capture_output=True, text=True, timeout=timeout, **kw)

    def popen(self, *argv: str, env: dict[str, str] | None = None,
              **kw: Any) -> subprocess.Popen[str]:
        kw.setdefault("stdout", subprocess.PIPE)
        kw.setdefault("stderr", subprocess.PIPE)
        return subprocess.Popen(list(argv), env={**self.env, **(env or {})}, text=True, **kw)

    def job_state(self, job_id: str) -> str:
        r = self.run("scontrol", "show", "job", job_id, timeout=30)
        m = re.search(r"JobState=(\S+)", r.stdout)
        return m.group(1) if m else ""

    def log(self, name: str) -> str:
        try:
            return (self.base / "log" / f"{name}.log").read_text(errors="replace")
        except OSError:
            return ""
