"""vgpuctl(1), generated from the click commands: each command's usage,
help text and options, so the page can't drift from the parser.

The page is shipped in the package (vgpuctl/cli/vgpuctl.1, installed to
share/man/man1 too). After changing a command, regenerate it:

    python -m vgpuctl.cli.manpage > vgpuctl/cli/vgpuctl.1

(tests/cli/test_help.py fails until the shipped page matches.)
"""

from __future__ import annotations

import re
from collections.abc import Iterator

import click

from vgpuctl import __version__
from vgpuctl.system import topics

SHIPPED = "vgpuctl.1"


def _esc(text: str) -> str:
    """Text as roff reads it literally: backslashes, and a leading . or '."""
    text = text.replace("\\", "\\e").replace("-", "\\-")
    return re.sub(r"^([.'])", r"\\&\1", text, flags=re.M)


def _paragraphs(text: str) -> list[str]:
    """click's help text as paragraphs (click's \\b blocks kept as lines)."""
    out = []
    for block in re.split(r"\n\s*\n", click.unstyle(text or "").strip()):
        lines = [ln.strip() for ln in block.splitlines() if ln.strip()]
        if not lines:
            continue
        if lines[0] == "\b":
            out.append("\n.br\n".join(_esc(ln) for ln in lines[1:]))
        else:
            out.append(_esc(" ".join(lines)))
    return out


def context(cmd: click.Command, name: str, parent: click.Context | None = None) -> click.Context:
    """A context for cmd as the command line makes one (its context_settings,
    such as -h for help, included)."""
    return click.Context(cmd, info_name=name, parent=parent, **cmd.context_settings)


def walk(cmd: click.Command, ctx: click.Context,
         path: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], click.Command,
                                                       click.Context]]:
    """Every command under cmd (cmd's own path first), depth first, by name."""
    yield path, cmd, ctx
    if isinstance(cmd, click.Group):
        for name in cmd.list_commands(ctx):
            sub = cmd.get_command(ctx, name)
            if sub is None or sub.hidden:
                continue
            yield from walk(sub, context(sub, name, ctx), (*path, name))


def _options(cmd: click.Command, ctx: click.Context, with_help: bool = False) -> list[str]:
    lines = []
    help_option = cmd.get_help_option(ctx)
    for p in cmd.get_params(ctx):
        if p is help_option and not with_help:   # every command has -h, --help
            continue
        rec = p.get_help_record(ctx)
        if rec is None:
            continue
        names, help_text = rec
        lines += [".TP", f"\\fB{_esc(names)}\\fR", _esc(" ".join(help_text.split()))]
    return lines


def _exit_table() -> list[str]:
    from vgpuctl import errors

    doc = errors.__doc__ or ""
    lines = []
    for m in re.finditer(r"^(\d+)\s+\w+\s+(.+)$", doc, flags=re.M):
        lines += [".TP", f"\\fB{m.group(1)}\\fR", _esc(m.group(2).strip())]
    return lines


def generate() -> str:
    """The page, in roff (man(7)). No date: it changes only with the commands."""
    from vgpuctl.cli import cli

    root = context(cli, "vgpuctl")
    out = [f'.TH VGPUCTL 1 "" "vgpuctl {__version__}" "vgpuctl manual"',
           ".SH NAME", "vgpuctl \\- share GPUs among jobs: a memory limit and a compute "
           "share per job",
           ".SH SYNOPSIS"]
    cmds = list(walk(cli, root))
    for path, cmd, ctx in cmds[1:]:
        if isinstance(cmd, click.Group) and not cmd.invoke_without_command:
            continue
        usage = " ".join(cmd.collect_usage_pieces(ctx))
        out += [".br", f"\\fBvgpuctl {' '.join(path)}\\fR {_esc(usage)}"]
    out += [".SH DESCRIPTION", *sum(([p, ".PP"] for p in _paragraphs(cli.help or "")), [])]
    out += [".SH OPTIONS", *_options(cli, root, with_help=True),
            ".PP", "Every command takes \\fB\\-h\\fR, \\fB\\-\\-help\\fR."]
    out += [".SH COMMANDS"]
    for path, cmd, ctx in cmds[1:]:
        usage = " ".join(cmd.collect_usage_pieces(ctx))
        out += [f".SS vgpuctl {' '.join(path)}", f"\\fBvgpuctl {' '.join(path)}\\fR "
                f"{_esc(usage)}", ".PP"]
        for p in _paragraphs(cmd.help or ""):
            out += [p, ".PP"]
        opts = _options(cmd, ctx)
        if opts:
            out += [".RS", *opts, ".RE"]
    out += [".SH EXIT STATUS",
            "Every error is one line on standard error, \\fBvgpuctl: error: ...\\fR, "
            "and one of these statuses. \\fBvgpuctl run\\fR returns its command's "
            "status once the command has started (128+N when signal N ended it).",
            *_exit_table(),
            ".TP", "\\fB130\\fR", "interrupted (Ctrl\\-C)"]
    out += [".SH FILES", ".TP", "\\fI/etc/vgpu/vgpu.toml\\fR",
            "the system daemon's config file (\\fBvgpuctl help config\\fR)",
            ".TP", "\\fI/run/vgpu/vgpud.sock\\fR", "the system daemon's socket",
            ".TP", "\\fI/var/lib/vgpu/vgpu.db\\fR", "jobs and usage accounting"]
    out += [".SH MORE HELP", "\\fBvgpuctl help\\fR \\fITOPIC\\fR prints one of these texts, "
            "shipped with vgpuctl:"]
    for name, (_, about) in topics.TOPICS.items():
        out += [".TP", f"\\fB{_esc(name)}\\fR", _esc(about)]
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    import sys

    sys.stdout.write(generate())
