"""One module per command; COMMANDS is what vgpuctl.cli registers."""

from __future__ import annotations

import click

from .sim import sim

COMMANDS: list[click.Command] = [sim]
