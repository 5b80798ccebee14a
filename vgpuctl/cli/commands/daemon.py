"""``vgpuctl daemon``: the supervisor daemon, in the foreground; ``vgpuctl
daemon reload``: make a running daemon re-read its config file; ``vgpuctl
daemon stop``: stop it, its jobs running on."""

from __future__ import annotations

import os

import click


@click.group(invoke_without_command=True)
@click.option("--socket", "socket_path", metavar="PATH", help="Listen here.")
@click.option("--config", metavar="FILE", help="Config file (default: /etc/vgpu/vgpu.toml "
              "for root, ~/.config/vgpu/vgpu.toml otherwise, read when it exists; "
              "`vgpuctl help config`).")
@click.option("--runtime-dir", metavar="DIR", help="Where the jobs' regions live.")
@click.option("--state-dir", metavar="DIR", help="Where the job database lives.")
@click.option("--user", is_flag=True, help="Use a user daemon's paths even as root.")
@click.option("--ready-fd", type=click.IntRange(0), metavar="N",
              help="Write one JSON line to file descriptor N (a pipe) when the daemon "
              "listens, or the error that stopped its start, then close it; `vgpuctl run` "
              "starts a user daemon so.")
@click.pass_context
def daemon(ctx: click.Context, socket_path: str | None, config: str | None,
           runtime_dir: str | None, state_dir: str | None, user: bool,
           ready_fd: int | None) -> int | None:
    """Run the supervisor daemon in the foreground (for systemd).

    SIGTERM stops it and leaves the jobs running; a later start re-adopts
    them. SIGHUP, or `vgpuctl daemon reload`, re-reads the config file (the
    default one too when it was created after the start); a bad file keeps
    the previous configuration.
    """
    if ctx.invoked_subcommand is not None:
        if any((socket_path, config, runtime_dir, state_dir, user, ready_fd is not None)):
            from vgpuctl.errors import UsageError

            raise UsageError(f"the daemon's options go with `vgpuctl daemon` alone, not "
                             f"with `{ctx.invoked_subcommand}`")
        return None
    from vgpuctl.daemon import Options, run
    from vgpuctl.system import notify

    if ready_fd is not None:
        notify.set_ready_fd(ready_fd)
    try:
        return run(Options(socket=socket_path, runtime_dir=runtime_dir, state_dir=state_dir,
                           config=config, user=user))
    except BaseException as e:
        notify.start_failed(e)      # told to the starter unless the daemon was ready
        raise


@daemon.command()
@click.option("--socket", "socket_path", metavar="PATH", help="The daemon's socket.")
def reload(socket_path: str | None) -> None:
    """Make the running daemon re-read its config file (systemd's ExecReload).

    Exits 0 once the new configuration is in use. A bad file is refused
    with its file, key and reason (exit 78) and the daemon keeps its
    previous configuration; no daemon answering is exit 3.
    """
    from vgpuctl.cli import messages
    from vgpuctl.client.connection import connect
    from vgpuctl.errors import ConfigError

    with connect(socket_path) as cl:
        try:
            reply = cl.call("reload")
        except ConfigError as e:
            raise ConfigError(f"{e}; the daemon keeps its previous configuration") from None
    messages.note(f"the daemon on {cl.path} reloaded its configuration "
                  f"({reply.get('config', '<defaults>')})")


STOP_WAIT_S = 30.0      # a daemon writes its last records and closes its socket


@daemon.command()
@click.option("--socket", "socket_path", metavar="PATH", help="The daemon's socket.")
def stop(socket_path: str | None) -> None:
    """Stop the daemon that answers (yours: the one `vgpuctl run` started),
    as SIGTERM does: its jobs run on, and the next daemon adopts them; a
    daemon started then reads VGPU_SIM and the config anew. The system
    daemon is systemd's: `systemctl stop vgpud` (root).
    """
    import signal
    import time

    from vgpuctl.cli import messages
    from vgpuctl.client.connection import connect
    from vgpuctl.errors import PermissionDenied, VgpuError
    from vgpuctl.system import paths
    from vgpuctl.system.procfs import start_time

    with connect(socket_path) as cl:
        pid = cl.peer_pid()
        info = cl.call("ping").get("daemon") or {}
    if info.get("system") and paths.system_unit() is not None:
        raise PermissionDenied(f"the daemon on {cl.path} is the system's, under systemd: "
                               "`systemctl stop vgpud` (root) stops it")
    try:
        os.kill(pid, signal.SIGTERM)
    except PermissionError:
        raise PermissionDenied(f"the daemon on {cl.path} (pid {pid}) is not yours to stop"
                               ) from None
    except ProcessLookupError:
        return
    deadline = time.monotonic() + STOP_WAIT_S
    while start_time(pid) is not None:      # (a zombie, our own child in tests, is gone)
        if time.monotonic() > deadline:
            raise VgpuError(f"the daemon on {cl.path} (pid {pid}) still runs {STOP_WAIT_S:.0f} "
                            "s after SIGTERM; its log says why")
        time.sleep(0.05)
    messages.note(f"stopped the daemon on {cl.path} (pid {pid}); its jobs run on and the "
                  "next daemon adopts them")
