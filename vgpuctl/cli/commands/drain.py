"""``vgpuctl drain``: empty a GPU for maintenance without ending its jobs
(docs/suspend.md)."""

from __future__ import annotations

import click

REPLY_S = 3600.0    # every job of the GPU is suspended and resumed in turn


@click.command()
@click.argument("gpu", metavar="GPU")
@click.option("--undo", is_flag=True, help="Take the GPU back: jobs are placed and resumed "
              "there again.")
@click.option("--socket", "socket_path", metavar="PATH", help="The daemon's socket.")
def drain(gpu: str, undo: bool, socket_path: str | None) -> int | None:
    """Move every job off GPU (an index or a UUID) to other GPUs with room,
    suspend the ones that can't move (they resume by themselves, on any
    other GPU, when room returns), and place no job there until `vgpuctl
    drain --undo GPU`. Says what became of each job. Root only; moving
    needs NVIDIA driver R580 or newer.
    """
    from vgpuctl.cli.commands.suspend import outcome_line
    from vgpuctl.client.connection import connect

    with connect(socket_path, timeout=REPLY_S) as cl:
        reply = cl.call("drain", gpu=gpu, undo=undo or None)
    idx = reply.get("gpu")
    if undo:
        click.echo(f"GPU {idx}: takes jobs again" if reply.get("was_drained", True)
                   else f"GPU {idx}: was not drained; nothing to undo")
    else:
        click.echo(f"GPU {idx}: drained")
    failed = 0
    for out in reply.get("jobs", []):
        click.echo(outcome_line(out))
        failed += out.get("action") == "failed"
    return 1 if failed else None
