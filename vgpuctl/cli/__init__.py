"""The command line's edge: the click group of the commands (one module each
under vgpuctl/cli/commands/, thin: parse, call the library, render), and
`main`, the one place an exception becomes output:

- a VgpuError: ``vgpuctl: error: MESSAGE``, one line on stderr, and its
  exit status (vgpuctl/errors.py);
- a usage error found by click: one line in the same form, exit 2;
- Ctrl-C: exit 130;
- stdout's reader gone (``vgpuctl ps | head``): exit 0, quietly;
- anything else is a bug: ``vgpuctl: internal error: TYPE: MESSAGE``, exit
  1; the traceback too when VGPU_DEBUG=1.

Commands return an exit status (an int) or None for 0; none exits itself.
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Mapping
from typing import Any, NoReturn

import click

from vgpuctl import __version__
from vgpuctl.cli import messages
from vgpuctl.errors import VgpuError

COMPLETE_VAR = "_VGPUCTL_COMPLETE"


# Each command's module, imported only when the command runs or --help lists
# them: `vgpuctl run`, which every job's start pays for, loads click, run's
# module and what it needs, not rich, asyncio or the daemon
# (bench/run_overhead.py).
COMMANDS = {
    "daemon": "vgpuctl.cli.commands.daemon:daemon",
    "demo": "vgpuctl.cli.commands.demo:demo",
    "doctor": "vgpuctl.cli.commands.doctor:doctor",
    "drain": "vgpuctl.cli.commands.drain:drain",
    "gpus": "vgpuctl.cli.commands.gpus:gpus",
    "help": "vgpuctl.cli.commands.help:help_",
    "kill": "vgpuctl.cli.commands.kill:kill",
    "mig": "vgpuctl.cli.commands.mig:mig",
    "ps": "vgpuctl.cli.commands.ps:ps",
    "report": "vgpuctl.cli.commands.report:report",
    "resume": "vgpuctl.cli.commands.suspend:resume",
    "run": "vgpuctl.cli.commands.run:run",
    "set": "vgpuctl.cli.commands.set:set_",
    "sim": "vgpuctl.cli.commands.sim:sim",
    "slurm": "vgpuctl.cli.commands.slurm:slurm",
    "status": "vgpuctl.cli.commands.status:status",
    "suspend": "vgpuctl.cli.commands.suspend:suspend",
    "top": "vgpuctl.cli.commands.top:top",
}


class LazyGroup(click.Group):
    """A click group whose commands are "module:attribute" names, imported
    when first asked for (click's "Lazily Loading Subcommands")."""

    def __init__(self, *args: Any, lazy_commands: Mapping[str, str] | None = None,
                 **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.lazy_commands = dict(lazy_commands or {})

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*super().list_commands(ctx), *self.lazy_commands})

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name not in self.lazy_commands:
            return super().get_command(ctx, name)
        module, _, attr = self.lazy_commands[name].partition(":")
        cmd = getattr(importlib.import_module(module), attr)
        if not isinstance(cmd, click.Command):
            raise TypeError(f"{self.lazy_commands[name]} is not a click command")
        return cmd


@click.group(cls=LazyGroup, lazy_commands=COMMANDS, invoke_without_command=True,
             context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="vgpuctl")
@click.pass_context
def cli(ctx: click.Context) -> None:
    """Share GPUs among jobs: each job gets a memory limit and a compute share.

    Run with no command to see the GPUs and the jobs on them.
    """
    if ctx.invoked_subcommand is None:
        status_cmd = cli.get_command(ctx, "status")
        assert status_cmd is not None
        ctx.invoke(status_cmd)


def main(argv: list[str] | None = None) -> NoReturn:
    """Entry point of the ``vgpuctl`` command (argv: the arguments after
    ``vgpuctl``; default sys.argv[1:]). Exits with the command's status."""
    sys.exit(_run(argv))


def _run(argv: list[str] | None) -> int:
    """Run the command; the one place an exception becomes output: one line
    on stderr (vgpuctl.cli.messages) and an exit status."""
    args = sys.argv[1:] if argv is None else list(argv)
    try:
        rv = _invoke(args)
        sys.stdout.flush()   # a reader that went away shows here, not at exit
        return rv if isinstance(rv, int) else 0
    except VgpuError as e:
        messages.error(str(e))
        return e.exit_code
    except click.UsageError as e:
        messages.error(_usage_message(e, args))
        return e.exit_code
    except click.ClickException as e:
        messages.error(e.format_message())
        return e.exit_code
    except (KeyboardInterrupt, click.Abort):
        return 130
    except Exception as e:
        if isinstance(e, BrokenPipeError) and _stdout_gone():
            # `vgpuctl ps | head`: the reader has what it wanted.
            _stdout_to_devnull()
            return 0
        debug = os.environ.get("VGPU_DEBUG", "") not in ("", "0")
        if debug:
            import traceback

            traceback.print_exception(type(e), e, e.__traceback__)
        messages.write(messages.internal_error_line(e, traceback_shown=debug), priority=3)
        return 1


def _invoke(args: list[str]) -> Any:
    """Parse args and run the command: what click's Command.main does, less
    its handling of errors (which would compete with _run's: it exits 1
    silently on any broken pipe, and prints usage errors in three lines)."""
    instruction = os.environ.get(COMPLETE_VAR)
    if instruction:     # the shell asks for completions (click's shell_completion)
        from click.shell_completion import shell_complete

        return shell_complete(cli, {}, "vgpuctl", COMPLETE_VAR, instruction)
    try:
        with cli.make_context("vgpuctl", args) as ctx:
            return cli.invoke(ctx)
    except click.exceptions.Exit as e:     # --help, --version
        return e.exit_code


# What people type for another tool's command, and vgpuctl's for it.
COMMAND_HINTS = {
    "list": "ps (jobs) or gpus (GPUs)", "ls": "ps (jobs) or gpus (GPUs)",
    "jobs": "ps", "show": "ps", "info": "status", "nvidia-smi": "status",
    "stats": "report (usage) or sim stats (the simulated GPU)",
    "stat": "report (usage) or sim stats (the simulated GPU)",
    "usage": "report", "accounting": "report", "start": "run", "exec": "run",
    "stop": "kill (a job) or daemon stop (the daemon)", "rm": "kill",
    "pause": "suspend", "unpause": "resume", "cordon": "drain", "uncordon": "drain --undo",
}


def _usage_message(e: click.UsageError, args: list[str] | None = None) -> str:
    """click's message in vgpuctl's style (lower case, one line), with where
    to find the command's help, and a hint where a word from another tool
    was typed (`vgpuctl list`, `-core`)."""
    msg = messages.one_line(e.format_message())
    if len(msg) > 1 and msg[0].isupper() and msg[1].islower():
        msg = msg[0].lower() + msg[1:]
    msg = msg[:-1] if msg.endswith(".") else msg
    msg += _hint(e, args or [])
    if e.ctx is not None:
        msg += f" (see {e.ctx.command_path} --help)"
    return msg


def _hint(e: click.UsageError, args: list[str]) -> str:
    """"; did you mean ..." for a command of another tool's name, or a long
    option written with one dash (`-core 30`, which click reads as -c)."""
    if isinstance(e, click.NoSuchOption) and not e.possibilities:
        name = e.option_name
        if len(name) == 2 and name[0] == "-" and name[1] != "-":
            typed = next((a for a in args if a.startswith(name) and len(a) > 2
                          and not a.startswith("--")), None)
            if typed is not None:
                long = "-" + typed.split("=", 1)[0]
                if e.ctx is not None and any(long in p.opts for p in e.ctx.command.params):
                    return f"; did you mean {long}? (long options take two dashes)"
        return ""
    import re

    m = re.match(r"no such command '([^']*)'", messages.one_line(e.format_message()), re.I)
    if m and m.group(1) in COMMAND_HINTS:
        return f"; did you mean vgpuctl {COMMAND_HINTS[m.group(1)]}?"
    return ""


def _stdout_gone() -> bool:
    """Whether stdout is a pipe or socket whose reader has gone (and not,
    say, a pipe of our own to a child)."""
    import select

    try:
        poller = select.poll()
        poller.register(sys.stdout.fileno(), 0)   # errors and hang-ups are always reported
        return any(ev & (select.POLLERR | select.POLLHUP) for _, ev in poller.poll(0))
    except (AttributeError, OSError, ValueError):
        return False


def _stdout_to_devnull() -> None:
    """Point stdout at /dev/null, so that the interpreter's last flush of what
    is still buffered does not fail again and print a traceback (the
    recipe in Python's documentation of SIGPIPE)."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (AttributeError, OSError, ValueError):
        pass
