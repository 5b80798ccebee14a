"""``vgpuctl kill``: signal every process of one or more jobs."""

from __future__ import annotations

import click

from vgpuctl.cli import args as _args
from vgpuctl.core import nodeview


@click.command()
@click.argument("jobs", nargs=-1, required=True, metavar="JOB")
@click.option("-s", "--signal", "sig", metavar="SIG", default="TERM", show_default=True,
              help="Signal name or number.")
@click.option("--socket", "socket_path", metavar="PATH", help="The daemon's socket.")
def kill(jobs: tuple[str, ...], sig: str, socket_path: str | None) -> int | None:
    """Send a signal to every process of each JOB (its command and all its
    children).

    A JOB is an id, or a name (or a shell pattern such as 'train-*') that
    stands for every running job of yours with that name.
    """
    from vgpuctl.cli.commands.set import each_job, select_jobs
    from vgpuctl.client.connection import connect

    num = _args.signal_number(sig)
    nodeview.check_job_args(jobs)
    with connect(socket_path) as cl:
        ids = [i for _, found in select_jobs(cl, jobs) for i in found]

        def one(jid: str) -> None:
            reply = cl.call("kill", job=jid, signal=num)
            pids = reply.get("pids", [])
            if pids:
                click.echo(f"job {jid}: {reply['signal']} sent to {' '.join(map(str, pids))}")
            else:
                click.echo(f"job {jid}: no process to signal")

        return each_job(ids, one)
