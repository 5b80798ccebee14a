"""The command line's edge: builds the click group from vgpuctl/commands/ and
turns every VgpuError into one line on stderr and its exit code. Nothing else
here: commands are thin and live one module each under vgpuctl/commands/."""

from __future__ import annotations

import sys

import click

from vgpuctl import __version__
from vgpuctl.errors import VgpuError


@click.group(invoke_without_command=True, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="vgpuctl")
@click.pass_context
def cli(ctx: click.Context) -> None:
    """Share GPUs among jobs: each job gets a memory limit and a compute share.

    Run with no command to see the GPUs and the jobs on them.
    """
    if ctx.invoked_subcommand is None:
        status_cmd = cli.get_command(ctx, "status")
        if status_cmd is None:
            click.echo(ctx.get_help())
            return
        ctx.invoke(status_cmd)


def _register() -> None:
    from vgpuctl.cli.commands import COMMANDS

    for cmd in COMMANDS:
        cli.add_command(cmd)


_register()


def main(argv: list[str] | None = None) -> None:
    """Entry point of the ``vgpuctl`` command."""
    try:
        rc = cli.main(args=argv, prog_name="vgpuctl", standalone_mode=False)
    except VgpuError as e:
        click.echo(f"vgpuctl: error: {e}", err=True)
        sys.exit(e.exit_code)
    except click.exceptions.Abort:
        click.echo("vgpuctl: aborted", err=True)
        sys.exit(130)
    except click.ClickException as e:
        e.show()
        sys.exit(e.exit_code)
    except KeyboardInterrupt:
        sys.exit(130)
    except BrokenPipeError:
        sys.exit(141)
    if isinstance(rc, int):
        sys.exit(rc)
    sys.exit(0)
