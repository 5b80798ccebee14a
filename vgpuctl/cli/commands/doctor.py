"""``vgpuctl doctor``: check the driver, NVML, the hook, the daemon and the config."""

from __future__ import annotations

import json
import sys

import click

from vgpuctl.ops import diagnosis

_MARK = {diagnosis.OK: ("ok", "green"), diagnosis.WARN: ("warn", "yellow"),
         diagnosis.FAIL: ("FAIL", "red")}


def _plain(checks: list[diagnosis.Check]) -> str:
    width = max(len(c.name) for c in checks)
    lines = []
    for c in checks:
        lines.append(f"{_MARK[c.status][0]:<4}  {c.name:<{width}}  {c.detail}")
        if c.fix and c.status != diagnosis.OK:
            lines.append(f"{'':<4}  {'':<{width}}  fix: {c.fix}")
    return "\n".join(lines)


@click.command()
@click.option("--json", "as_json", is_flag=True, help="Print the checks as JSON.")
def doctor(as_json: bool) -> int | None:
    """Check that this node is ready: the driver (libcuda loads, cuInit,
    devices), NVML, that the hook library loads, the daemon socket (exists,
    permissions, answers a ping) and the config file. Each problem comes with
    how to fix it. Under VGPU_SIM the simulated GPU is checked.

    Exit status 1 when any check fails (warnings don't count).
    """
    tty = sys.stdout.isatty() and not as_json
    if tty:
        from rich.console import Console
        from rich.markup import escape

        console = Console()
        with console.status("checking...") as status:
            checks = diagnosis.run_checks(progress=lambda n: status.update(f"checking {n}..."))
        for c in checks:
            word, colour = _MARK[c.status]
            console.print(f"[bold {colour}]{word:<4}[/]  [bold]{c.name}[/]  {escape(c.detail)}",
                          highlight=False)
            if c.fix and c.status != diagnosis.OK:
                console.print(f"      [dim]fix:[/] {escape(c.fix)}", highlight=False)
    else:
        checks = diagnosis.run_checks()
        if as_json:
            click.echo(json.dumps([c.to_dict() for c in checks], indent=2))
        else:
            click.echo(_plain(checks))
    return 1 if diagnosis.failed(checks) else None
