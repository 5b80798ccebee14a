"""``vgpuctl gpus``: one line per GPU, as ``nvidia-smi -L``."""

from __future__ import annotations

import click

from vgpuctl.cli import view
from vgpuctl.core import nodeview, output


@click.command()
@click.option("--format", "fmt", type=click.Choice(("list", "csv", "json")), default="list",
              show_default=True, help="list (GPU 0: NAME (UUID: ...), as nvidia-smi -L), "
                                      "csv (index,name,uuid,drained) or json.")
@click.option("--no-header", is_flag=True, help="No CSV header line.")
@click.option("--socket", "socket_path", metavar="PATH", help="The daemon's socket.")
def gpus(fmt: str, no_header: bool, socket_path: str | None) -> None:
    """List the GPUs: index, name and UUID (the daemon's, else NVML's)."""
    found = view.fetch_or_nvml(socket_path).get("gpus", [])
    if fmt == "json":
        click.echo(output.json_text(nodeview.select(found, (*nodeview.LIST_FIELDS, "parent",
                                                             "mig"))), nl=False)
    elif fmt == "csv":
        click.echo(nodeview.to_csv(found, nodeview.LIST_FIELDS, nodeview.GPU_FIELDS, "mib",
                                   not no_header), nl=False)
    else:
        for g in found:
            drained = " [drained]" if g.get("drained") else ""
            parent = g.get("parent")
            on = f" [on GPU {parent}]" if isinstance(parent, int) else ""
            click.echo(f"GPU {g['index']}: {g['name']} (UUID: {g['uuid']}){on}{drained}")
