"""``vgpuctl set``: change a running job's limits."""

from __future__ import annotations

import click

from vgpuctl.cli import args as _args
from vgpuctl.cli import messages


@click.command(name="set")
@click.argument("job")
@click.option("--mem", metavar="SIZE", help="New memory limit.")
@click.option("--core", metavar="PCT", help="New compute share (1-100).")
@click.option("--policy", metavar="hard|soft", help="New compute policy.")
@click.option("--socket", "socket_path", metavar="PATH", help="The daemon's socket.")
def set_(job: str, mem: str | None, core: str | None, policy: str | None,
         socket_path: str | None) -> None:
    """Change JOB's limits while it runs.

    A memory limit below what the job holds is accepted: the job keeps what
    it holds, and its allocations fail until it is back under the limit.
    """
    from vgpuctl.client.connection import connect
    from vgpuctl.core.sizes import format_size
    from vgpuctl.errors import UsageError

    jid = _args.job_id(job)
    fields = {"mem": _args.mem(mem), "core": _args.core(core), "policy": _args.policy(policy)}
    if all(v is None for v in fields.values()):
        raise UsageError("nothing to change: give --mem, --core or --policy")
    with connect(socket_path) as cl:
        reply = cl.call("set", job=jid, **fields)
    j = reply["job"]
    for w in reply.get("warnings", []):
        messages.warn(w)
    print(f"job {j['id']}: mem {format_size(j['mem_limit'])}, core {j['core']}%, "
          f"policy {j['policy']}")
