"""``vgpuctl kill``: signal every process of a job."""

from __future__ import annotations

import click

from vgpuctl.cli import args as _args


@click.command()
@click.argument("job")
@click.option("-s", "--signal", "sig", metavar="SIG", default="TERM", show_default=True,
              help="Signal name or number.")
@click.option("--socket", "socket_path", metavar="PATH", help="The daemon's socket.")
def kill(job: str, sig: str, socket_path: str | None) -> None:
    """Send a signal to every process of JOB (its command and all its children)."""
    from vgpuctl.client.connection import connect

    jid = _args.job_id(job)
    num = _args.signal_number(sig)
    with connect(socket_path) as cl:
        reply = cl.call("kill", job=jid, signal=num)
    pids = reply.get("pids", [])
    if pids:
        click.echo(f"job {jid}: {reply['signal']} sent to {' '.join(map(str, pids))}")
    else:
        click.echo(f"job {jid}: no process to signal")
