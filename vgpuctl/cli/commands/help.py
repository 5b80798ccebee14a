"""``vgpuctl help [TOPIC|COMMAND]``: the texts shipped with vgpuctl, a
command's help, or the man page."""

from __future__ import annotations

import click


@click.command(name="help")
@click.argument("topic", required=False)
@click.option("--man", is_flag=True, help="Print the man page, vgpuctl(1), in roff: "
              "vgpuctl help --man | man -l -")
@click.pass_context
def help_(ctx: click.Context, topic: str | None, man: bool) -> None:
    """Show a topic's text, a command's help, or the list of both.

    The topics are vgpuctl's documentation and example files (the config
    file's keys, the systemd unit, the simulated GPU...), shipped with it.
    """
    from vgpuctl.errors import UsageError
    from vgpuctl.system import topics

    if man:
        if topic is not None:
            raise UsageError("--man takes no TOPIC")
        from vgpuctl.cli import manpage

        click.echo(manpage.generate(), nl=False)
        return
    root = ctx.find_root()
    group = root.command
    assert isinstance(group, click.Group)
    if topic is None:
        click.echo("vgpuctl help TOPIC prints one of these texts:\n")
        for name, (_, about) in topics.TOPICS.items():
            click.echo(f"  {name:<16}{about}")
        click.echo("\nvgpuctl help COMMAND (or vgpuctl COMMAND --help) explains a command:\n")
        click.echo("  " + " ".join(group.list_commands(root)))
        click.echo("\nThe whole manual: vgpuctl help --man | man -l -")
        return
    if topic in topics.TOPICS:
        click.echo(topics.text(topic), nl=False)
        return
    cmd = group.get_command(root, topic)
    if cmd is not None:
        from vgpuctl.cli.manpage import context

        sub = context(cmd, topic, root)
        click.echo(cmd.get_help(sub))
        return
    raise UsageError(f"no help topic or command {topic!r}: try "
                     f"{', '.join(topics.TOPICS)} (vgpuctl help lists them)")
