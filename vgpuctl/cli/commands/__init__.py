"""One module per command; COMMANDS is what vgpuctl.cli registers."""

from __future__ import annotations

import click

from vgpuctl.cli.commands.sim import sim

COMMANDS: list[click.Command] = [sim]

# The daemon and the command line (issue 4). Each module imports click only:
# the heavy parts (rich, pynvml, asyncio) load inside the command that needs them.
from vgpuctl.cli.commands.daemon import daemon  # noqa: E402
from vgpuctl.cli.commands.kill import kill  # noqa: E402
from vgpuctl.cli.commands.ps import ps  # noqa: E402
from vgpuctl.cli.commands.run import run  # noqa: E402
from vgpuctl.cli.commands.set import set_  # noqa: E402
from vgpuctl.cli.commands.status import status  # noqa: E402
from vgpuctl.cli.commands.top import top  # noqa: E402

COMMANDS += [run, status, ps, set_, kill, top, daemon]

# Operations (issue 6).
from vgpuctl.cli.commands.demo import demo  # noqa: E402
from vgpuctl.cli.commands.doctor import doctor  # noqa: E402
from vgpuctl.cli.commands.report import report  # noqa: E402

COMMANDS += [report, doctor, demo]
