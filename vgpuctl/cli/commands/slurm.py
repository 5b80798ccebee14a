"""``vgpuctl slurm``: Slurm's Prolog, TaskProlog and Epilog, and the
gres.conf that matches the daemon (docs/slurm.md).

- ``prolog`` (root, once per job on the node): registers the job's shards
  with the daemon for the job's user. It never fails the node: a refused
  registration is recorded by the daemon, and the job's TaskProlog fails
  its steps with the reason.
- ``task-prolog`` (the user, once per task): prints the ``export`` lines
  that put the task in the job's vgpu job. A task of a job with shards that
  is not registered fails (never runs unfenced); a task without shards is
  left alone.
- ``epilog`` (root): releases the job before Slurm hands its shards out again.
- ``gres-conf``: the gres.conf lines for the daemon's capacity, GPUs and
  MIG devices.
"""

from __future__ import annotations

import os
import socket
from typing import TYPE_CHECKING, Any

import click

from vgpuctl.errors import DaemonUnavailable, NotFound, UsageError, VgpuError

if TYPE_CHECKING:
    from vgpuctl.client.connection import Client

SOCKET_HELP = "The daemon's socket (default: $VGPU_SOCKET, else the system daemon's)."


def _slurm_env(name: str) -> str:
    v = os.environ.get(name, "")
    if not v:
        raise UsageError(f"{name} is not set: run this as Slurm's Prolog, TaskProlog or Epilog")
    return v


def _label(text: str | None) -> str | None:
    """A Slurm job's name, partition or account as the daemon takes one: the
    user chose it, so its control characters are written as escapes (the
    daemon refuses them), and it is cut to 64 characters."""
    from vgpuctl.core.protocol import MAX_NAME, escape_controls

    return escape_controls(text or "")[:MAX_NAME] or None


def _node() -> str:
    return os.environ.get("SLURMD_NODENAME") or socket.gethostname().split(".")[0]


def _connect(socket_path: str | None, wait: bool = True) -> Client:
    """The node daemon; unless not wait, one that is restarting is waited
    for (up to $VGPU_DAEMON_WAIT s), so a `systemctl restart` fails no job."""
    from vgpuctl.cli import messages
    from vgpuctl.client.connection import connect, wait_connect

    if not wait:
        return connect(socket_path)
    return wait_connect(socket_path, "Slurm's hooks run where vgpuctl's daemon serves the node",
                        note=messages.note)


@click.group()
def slurm() -> None:
    """Fence and account Slurm's --gres=shard jobs (Prolog, TaskProlog, Epilog)."""


@slurm.command()
@click.option("--core", metavar="PCT", help="Compute share of every job (default: its "
              "shards / the GPU's shards).")
@click.option("--policy", metavar="hard|soft", help="Compute policy (default: the daemon's "
              "default_policy).")
@click.option("--socket", "socket_path", metavar="PATH", help=SOCKET_HELP)
def prolog(core: str | None, policy: str | None, socket_path: str | None) -> int:
    """Slurm's Prolog (root): register the job's shards for its user.

    Exits 0 even when the daemon refuses the job, so that Slurm does not
    drain the node: the job's steps then fail in the TaskProlog.
    """
    from vgpuctl.cli import args, messages
    from vgpuctl.core import slurm_text
    from vgpuctl.system import scontrol

    job_id = _slurm_env("SLURM_JOB_ID")
    uid_text = _slurm_env("SLURM_JOB_UID")
    if not uid_text.isdigit():
        raise UsageError(f"SLURM_JOB_UID={uid_text!r}: expected a number")
    share, pol = args.core(core), args.policy(policy)
    # The job's own --vgpu-core / --vgpu-policy (the SPANK plugin), checked
    # at submission; the daemon gives no job more than its shards' share.
    ask = os.environ.get("SPANK_VGPU_CORE", "")
    ask_core = int(ask) if ask.isdigit() and 1 <= int(ask) <= 100 else None
    if os.environ.get("SPANK_VGPU_POLICY") in ("hard", "soft"):
        pol = os.environ["SPANK_VGPU_POLICY"]
    # --vgpu-priority: the daemon says whether the job's user may have it
    cls = os.environ.get("SPANK_VGPU_PRIORITY")
    cls = cls if cls in ("low", "normal", "high") else None
    if not os.environ.get("SLURM_JOB_GPUS"):
        return 0                        # no GPU here (shards name theirs): don't ask slurmctld
    try:
        job = slurm_text.parse_job(scontrol.show_job(job_id), _node())
        if job.shards is None:
            return 0                    # no shards here: nothing to fence
        gpus = list(job.gpus) or [int(i) for i in
                                  os.environ["SLURM_JOB_GPUS"].split(",") if i.isdigit()]
        counts = list(job.gpu_shards) if len(job.gpu_shards) == len(gpus) else None
        with _connect(socket_path) as cl:
            cl.call("slurm_register", slurm_job=job_id, uid=int(uid_text), gpus=gpus,
                    shards=job.shards, name=_label(job.name), partition=_label(job.partition),
                    account=_label(job.account),
                    command=job.command[:4096] or None, cwd=job.work_dir[:4096] or None,
                    core=share, policy=pol, ask_core=ask_core,
                    **({"priority": cls} if cls else {}),
                    **({"gpu_shards": counts} if counts and len(counts) > 1 else {}))
    except VgpuError as e:
        # The node stays up; the job's TaskProlog fails its steps.
        messages.error(f"Slurm job {job_id} not registered: {e}")
    return 0


@slurm.command("task-prolog")
@click.option("--socket", "socket_path", metavar="PATH", help=SOCKET_HELP)
def task_prolog(socket_path: str | None) -> int:
    """Slurm's TaskProlog (the job's user): print the task's `export` lines.

    A task of a job with shards that vgpuctl has not registered fails with
    one line (exit status non-zero: Slurm then does not run it).
    """
    from vgpuctl.client.launch import job_env

    job_id = _slurm_env("SLURM_JOB_ID")
    try:
        reply = _attach(job_id, socket_path)
        if reply is None:
            return 0                    # a task without shards: untouched
        add, prepend = reply["env"], reply.get("prepend") or {}
        env = job_env(os.environ, add, prepend)
        lines = []
        for k in [*add, *prepend]:
            if "\n" in env[k] or "\r" in env[k]:
                raise VgpuError(f"{k} holds a line break: a TaskProlog can't export it")
            lines.append(f"export {k}={env[k]}")
    except VgpuError as e:
        # Slurm shows a TaskProlog's `print` lines on the task's output; what
        # it writes on stderr goes to slurmd's log only.
        from vgpuctl.cli import messages

        click.echo("print " + messages.error_line(str(e)))
        raise
    click.echo("\n".join(lines))
    return 0


def _attach(job_id: str, socket_path: str | None) -> dict[str, Any] | None:
    """The attach reply for this task; None for a task without shards of
    a job that is not registered."""
    shards = os.environ.get("SLURM_SHARDS_ON_NODE", "")
    try:
        # a task without shards waits for no daemon: it runs untouched anyway
        with _connect(socket_path, wait=bool(shards)) as cl:
            return cl.call("slurm_attach", slurm_job=job_id, pid=os.getppid())
    except (NotFound, DaemonUnavailable) as e:
        if not shards:
            return None
        if isinstance(e, DaemonUnavailable):
            raise DaemonUnavailable(f"Slurm job {job_id} has {shards} shards but {e}: "
                                    "not run unfenced") from None
        raise VgpuError(f"Slurm job {job_id} has {shards} shards but vgpuctl has not "
                        "registered it (its Prolog failed: see slurmd's log): "
                        "not run unfenced") from None


@slurm.command()
@click.option("--socket", "socket_path", metavar="PATH", help=SOCKET_HELP)
def epilog(socket_path: str | None) -> int:
    """Slurm's Epilog (root): release the job now, before Slurm reuses its shards.

    Exits 0 even when the daemon can't be reached (the daemon releases the
    job when squeue no longer runs it).
    """
    from vgpuctl.cli import messages

    job_id = _slurm_env("SLURM_JOB_ID")
    try:
        with _connect(socket_path) as cl:
            cl.call("slurm_release", slurm_job=job_id)
    except VgpuError as e:
        messages.error(f"Slurm job {job_id} not released: {e}")
    return 0


MIG_MINORS = "/proc/driver/nvidia-caps/mig-minors"


@slurm.command("gres-conf")
@click.option("--shard-size", metavar="SIZE", help="Memory per shard (default: the "
              "daemon's [slurm] shard_size, 1G unless set).")
@click.option("--dev-dir", default="/dev", show_default=True, metavar="DIR",
              help="Where the nvidiaN device files (and nvidia-caps/) are.")
@click.option("--type", "gpu_type", metavar="NAME", help="The GPUs' Type= in gres.conf (a "
              "MIG device's: NAME_PROFILE, as Slurm names them).")
@click.option("--mig-minors", default=MIG_MINORS, show_default=True, metavar="FILE",
              help="The driver's MIG capability minors (read on a node with MIG devices).")
@click.option("--socket", "socket_path", metavar="PATH", help=SOCKET_HELP)
def gres_conf(shard_size: str | None, dev_dir: str, gpu_type: str | None, mig_minors: str,
              socket_path: str | None) -> None:
    """Print gres.conf lines and the node's Gres= for the daemon's GPUs and MIG devices.

    Each carries as many shards as its capacity ((memory - reserve) x
    oversubscribe) holds, so Slurm never admits a job the daemon refuses.
    """
    from vgpuctl.cli import args, messages
    from vgpuctl.core import slurm_text
    from vgpuctl.core.sizes import format_size

    with _connect(socket_path, wait=False) as cl:
        reply = cl.call("ps")
    daemon_size = (reply["daemon"].get("slurm") or {}).get("shard_size")
    size = args.mem(shard_size, "--shard-size") or daemon_size
    if not isinstance(size, int):
        raise VgpuError("the daemon does not say its shard size: upgrade it, or give "
                        "--shard-size")
    if daemon_size is not None and size != daemon_size:
        messages.warn(f"the daemon's shard size is {format_size(daemon_size)}: set "
                      f"[slurm] shard_size = \"{format_size(size)}\" in its configuration, "
                      "or its limits won't match these counts")
    gpus = [slurm_text.GresGpu.of(g["index"], g["uuid"], g["capacity"], g.get("minor"),
                                  g.get("parent"), g.get("mig"), g.get("gi"), g.get("ci"))
            for g in reply["gpus"]]
    minors = None
    if any(g.parent is not None for g in gpus):
        try:
            with open(mig_minors) as f:
                minors = slurm_text.parse_mig_minors(f.read())
        except OSError as e:
            raise UsageError(f"{mig_minors}: {e.strerror}: this node's MIG devices' gres lines "
                             "name their nvidia-caps files by the driver's minors (give "
                             "--mig-minors FILE)") from None
    click.echo(slurm_text.gres_conf(gpus, size, node=_node(), dev_dir=dev_dir.rstrip("/"),
                                    gpu_type=gpu_type, mig_minors=minors), nl=False)


@slurm.command("build-spank")
@click.option("-o", "--output", default="spank_vgpu.so", show_default=True, metavar="FILE",
              help="Where to write the plugin.")
@click.option("--cc", default="gcc", show_default=True, metavar="CC", help="The C compiler.")
@click.option("--include", "include_dirs", multiple=True, metavar="DIR",
              help="Where slurm/spank.h is, if not in the compiler's path (repeatable).")
def build_spank(output: str, cc: str, include_dirs: tuple[str, ...]) -> None:
    """Build the SPANK plugin (--vgpu-core, --vgpu-policy, --vgpu-priority) against this
    node's Slurm: its spank.h (Debian: libslurm-dev), as SPANK has no stable
    ABI across Slurm releases. List it in plugstack.conf:
    `required /usr/lib/slurm/spank_vgpu.so`.
    """
    from vgpuctl.system import scontrol

    scontrol.build_spank(output, cc, list(include_dirs))
    click.echo(f"built {output}")
