"""``vgpuctl daemon``: the supervisor daemon, in the foreground."""

from __future__ import annotations

import click


@click.command()
@click.option("--socket", "socket_path", metavar="PATH", help="Listen here.")
@click.option("--config", metavar="FILE", help="Config file (default: /etc/vgpu/vgpu.toml "
              "for root, ~/.config/vgpu/vgpu.toml otherwise, when it exists).")
@click.option("--runtime-dir", metavar="DIR", help="Where the jobs' regions live.")
@click.option("--state-dir", metavar="DIR", help="Where the job database lives.")
@click.option("--user", is_flag=True, help="Use a user daemon's paths even as root.")
def daemon(socket_path: str | None, config: str | None, runtime_dir: str | None,
           state_dir: str | None, user: bool) -> int:
    """Run the supervisor daemon in the foreground (for systemd).

    SIGTERM stops it and leaves the jobs running; a later start re-adopts
    them. SIGHUP re-reads the config file.
    """
    from vgpuctl.daemon import Options, run

    return run(Options(socket=socket_path, runtime_dir=runtime_dir, state_dir=state_dir,
                       config=config, user=user))
