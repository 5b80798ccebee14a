"""``vgpuctl set``: change the limits of one or more running jobs."""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import Any

import click

from vgpuctl.cli import args as _args
from vgpuctl.cli import messages
from vgpuctl.core import nodeview


def select_jobs(cl: Any, specs: Sequence[str]) -> list[tuple[str, list[str]]]:
    """Each JOB argument's job ids (vgpuctl.core.nodeview.resolve_jobs): a
    name matches the running jobs the caller may act on, their own (every
    job for root, and for the user a daemon runs as)."""
    from vgpuctl.core import nodeview

    if all(nodeview.is_job_id(s.strip()) for s in specs):
        return nodeview.resolve_jobs([], specs, lambda j: True)
    data = cl.call("ps")
    me = os.geteuid()
    boss = me == 0 or (data.get("daemon") or {}).get("uid") == me
    return nodeview.resolve_jobs(data.get("jobs", []), specs,
                                 lambda j: boss or j.get("uid") == me)


def each_job(ids: Sequence[str], act: Callable[[str], None]) -> int | None:
    """act on each id (each once, in order); a job that fails gets its own
    error line and the others are still done. Returns the first failure's
    exit status."""
    from vgpuctl.errors import VgpuError

    status = None
    for jid in dict.fromkeys(ids):
        try:
            act(jid)
        except VgpuError as e:
            if len(ids) == 1:
                raise
            messages.error(f"job {jid}: {e}")
            status = status or e.exit_code
    return status


@click.command(name="set")
@click.argument("jobs", nargs=-1, required=True, metavar="JOB")
@click.option("--mem", metavar="SIZE", help="New memory limit.")
@click.option("--core", metavar="PCT", help="New compute share (1-100).")
@click.option("--policy", metavar="hard|soft", help="New compute policy.")
@click.option("--priority", metavar="low|normal|high", help="New priority class (a user may "
              "lower it; only root may raise it).")
@click.option("--all", "all_named", is_flag=True,
              help="Change every job a name matches (without it, a name must match one job).")
@click.option("--socket", "socket_path", metavar="PATH", help="The daemon's socket.")
def set_(jobs: tuple[str, ...], mem: str | None, core: str | None, policy: str | None,
         priority: str | None, all_named: bool, socket_path: str | None) -> int | None:
    """Change the limits of each JOB while it runs.

    A JOB is an id, or the name of a running job of yours; a name that
    matches several jobs is refused unless --all says every one is meant.
    A memory limit below what a job holds is accepted: the job keeps what
    it holds, and its allocations fail until it is back under the limit.
    """
    from vgpuctl.client.connection import connect
    from vgpuctl.core.sizes import format_size
    from vgpuctl.errors import UsageError

    fields = {"mem": _args.mem(mem), "core": _args.core(core), "policy": _args.policy(policy)}
    if priority is not None:
        fields["priority"] = _args.priority(priority)
    if all(v is None for v in fields.values()):
        raise UsageError("nothing to change: give --mem, --core, --policy or --priority")
    nodeview.check_job_args(jobs)
    with connect(socket_path) as cl:
        selected = select_jobs(cl, jobs)
        for spec, ids in selected:
            if len(ids) > 1 and not all_named:
                raise UsageError(f"{spec!r} names {len(ids)} jobs ({', '.join(ids)}): give "
                                 "their ids, or --all to change every one")

        def one(jid: str) -> None:
            reply = cl.call("set", job=jid, **fields)
            j = reply["job"]
            for w in reply.get("warnings", []):
                messages.warn(w)
            click.echo(f"job {j['id']}: mem {format_size(j['mem_limit'])}, core {j['core']}%, "
                       f"policy {j['policy']}, priority {j.get('priority', 'normal')}")

        return each_job([i for _, ids in selected for i in ids], one)
